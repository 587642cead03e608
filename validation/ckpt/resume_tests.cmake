# Checkpoint/resume through the real `amsp train` (validation/ckpt/resume_test.py,
# doc/checkpoints.md "What the tests prove"). Included from validation/CMakeLists.txt
# after AMSP_CORPUS and AMSP_TEST_WORK are set (CMAKE_CURRENT_SOURCE_DIR is validation/).
#
#   ctest -R resume_mpi     mpiexec on this machine: same plan bit-identical (4 ranks and
#                           1 rank), resharding 8 -> 4 and 4 -> 1 ranks, kill -9 during
#                           checkpoint writes, a flipped byte, another model, --keep-last
#   ctest -R resume_slurm   srun on a local Slurm cluster of 4 virtual nodes (on ports
#                           found free at start; always stopped): 8 ranks on 4 nodes
#                           -> 4 ranks on 2 nodes under another plan. Needs root, munge
#                           and slurm-wlm, skipped (77) otherwise

set(AMSP_RESUME_TEST ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/resume_test.py)
set(AMSP_RESUME_ARGS
  --amsp $<TARGET_FILE:amsp>
  --data ${AMSP_CORPUS}
  --work ${AMSP_TEST_WORK}/resume
  --mpiexec ${MPIEXEC_EXECUTABLE}
  --cluster-scripts ${PROJECT_SOURCE_DIR}/slurm/local-cluster)

# About 70 s on 2 idle cores (an 8-rank checkpoint is half of it); the script gives
# itself 840 s.
add_test(NAME resume_mpi
  COMMAND python3 ${AMSP_RESUME_TEST} mpi ${AMSP_RESUME_ARGS})
set_tests_properties(resume_mpi PROPERTIES
  FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 900 PROCESSORS ${AMSP_SHARE_8})

# About 50 s; 8 ranks on 4 virtual nodes of 2 CPUs, on ports found free at start;
# one local Slurm cluster at a time (the lock).
add_test(NAME resume_slurm
  COMMAND python3 ${AMSP_RESUME_TEST} slurm ${AMSP_RESUME_ARGS})
set_tests_properties(resume_slurm PROPERTIES
  FIXTURES_REQUIRED corpus LABELS slurm TIMEOUT 900 SKIP_RETURN_CODE 77
  PROCESSORS ${AMSP_SHARE_8} RESOURCE_LOCK local_slurm)

# Data mixtures (validation/ckpt/mixture_test.py, doc/data.md "Mixtures"): rows' sources
# and windows by doc/data.md's formula, resume on 2, 3 and 1 ranks, a changed mixture
# on resume, bad --data specs, amsp eval per source. About 5 s; 3 ranks at most.
add_test(NAME resume_mixture_mpi
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/mixture_test.py --amsp $<TARGET_FILE:amsp>
          --work ${AMSP_TEST_WORK}/mixture --mpiexec ${MPIEXEC_EXECUTABLE})
set_tests_properties(resume_mixture_mpi PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS ${AMSP_SHARE_3})
