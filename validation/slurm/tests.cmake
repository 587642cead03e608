# Topology discovery: the probe program and its system tests.  Included from
# validation/CMakeLists.txt (so CMAKE_CURRENT_SOURCE_DIR is validation/).
#
#   ctest -L slurm   tests on a real 4-node Slurm cluster started on this machine
#                    (slurm/local-cluster/start.sh; needs root, munge and slurm-wlm;
#                    skipped otherwise); each starts its own cluster under the build
#                    directory and stops it again, on ports found free at start. A
#                    cluster has 8 CPUs (PROCESSORS 8; the sbatch tests, which mostly
#                    wait for the scheduler, AMSP_SHARE_8) and every cluster test
#                    holds the lock local_slurm, so that one runs at a time
#   ctest -L mpi     mpiexec without Slurm

add_executable(amsp_topology_probe ${CMAKE_CURRENT_SOURCE_DIR}/slurm/topology_probe.cpp)
target_compile_options(amsp_topology_probe PRIVATE ${AMSP_WARNINGS})
target_link_libraries(amsp_topology_probe PRIVATE amsp_core)

# Builds a shard plan's five groups on the live topology and prints their members.
add_executable(amsp_mesh_probe ${CMAKE_CURRENT_SOURCE_DIR}/slurm/mesh_probe.cpp)
target_compile_options(amsp_mesh_probe PRIVATE ${AMSP_WARNINGS})
target_link_libraries(amsp_mesh_probe PRIVATE amsp_core)

set(AMSP_SLURM_TEST ${CMAKE_CURRENT_SOURCE_DIR}/slurm/slurm_test.py)
set(AMSP_SLURM_TEST_ARGS
  --probe $<TARGET_FILE:amsp_topology_probe>
  --work ${CMAKE_BINARY_DIR}/test-work/slurm
  --cluster-scripts ${PROJECT_SOURCE_DIR}/slurm/local-cluster
  --mpiexec ${MPIEXEC_EXECUTABLE}
  --mesh-probe $<TARGET_FILE:amsp_mesh_probe>)

# test name -> case of slurm_test.py
set(AMSP_SLURM_CASES
  slurm_hostlist hostlist
  slurm_srun_4x2 srun-4x2
  slurm_srun_2nodes srun-2nodes
  slurm_mpiexec_in_allocation mpiexec-alloc
  slurm_mesh_groups mesh-groups)
while(AMSP_SLURM_CASES)
  list(POP_FRONT AMSP_SLURM_CASES test_name test_case)
  add_test(NAME ${test_name} COMMAND python3 ${AMSP_SLURM_TEST} ${test_case} ${AMSP_SLURM_TEST_ARGS})
  # The script gives itself 100 s and always stops its cluster. Each cluster finds free
  # ports of its own (local_cluster.py); 8 processors keep it alone for the cores.
  set_tests_properties(${test_name} PROPERTIES LABELS slurm TIMEOUT 150 SKIP_RETURN_CODE 77
    PROCESSORS 8 RESOURCE_LOCK local_slurm)
endwhile()

# Where the local clusters' ports come from (free at start, searched from a place the
# cluster directory's path hashes to), without Slurm.
add_test(NAME slurm_cluster_ports
  COMMAND ${AMSP_EXPECT_OUTPUT} " 0 failed" -- python3 ${CMAKE_CURRENT_SOURCE_DIR}/slurm/local_cluster_test.py)
set_tests_properties(slurm_cluster_ports PROPERTIES LABELS system TIMEOUT 60)

add_test(NAME mpi_topology_shared_memory
  COMMAND python3 ${AMSP_SLURM_TEST} mpiexec ${AMSP_SLURM_TEST_ARGS})
set_tests_properties(mpi_topology_shared_memory PROPERTIES LABELS mpi TIMEOUT 60 PROCESSORS 4)

# slurm/train.sbatch and slurm/scaling-study.sh through sbatch on a local Slurm cluster
# of 4 virtual nodes that each test starts on ports found free and always stops
# (validation/slurm/sbatch_test.py). Needs root, munge and slurm-wlm, skipped (77)
# otherwise. About 55 s, 100 s, (elastic) and 30 s on 2 idle cores.
set(AMSP_SBATCH_TEST ${CMAKE_CURRENT_SOURCE_DIR}/slurm/sbatch_test.py)
foreach(mode job preempt elastic scaling)
  add_test(NAME sbatch_${mode}
    COMMAND python3 ${AMSP_SBATCH_TEST} ${mode} --amsp $<TARGET_FILE:amsp> --data ${AMSP_CORPUS}
            --work ${CMAKE_BINARY_DIR}/test-work/sbatch
            --cluster-scripts ${PROJECT_SOURCE_DIR}/slurm/local-cluster)
  set_tests_properties(sbatch_${mode} PROPERTIES FIXTURES_REQUIRED corpus LABELS slurm
    TIMEOUT 600 SKIP_RETURN_CODE 77 PROCESSORS ${AMSP_SHARE_8} RESOURCE_LOCK local_slurm)
endforeach()

# The scaling study's table and plot from synthetic runs (no Slurm needed). It needs a
# python3 with matplotlib; a pyenv or conda python3 first on PATH may not see Debian's.
add_test(NAME scaling_report
  COMMAND bash -c "for py in python3 /usr/bin/python3; do \"$py\" -c 'import matplotlib' 2>/dev/null && exec \"$py\" \"$0\"; done; echo 'no python3 with matplotlib (apt-get install python3-matplotlib)'; exit 1"
          ${CMAKE_CURRENT_SOURCE_DIR}/slurm/scaling_report_test.py)
set_tests_properties(scaling_report PROPERTIES LABELS system TIMEOUT 120)
