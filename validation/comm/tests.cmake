# The communication layer's MPI system tests. Included from
# validation/CMakeLists.txt (CMAKE_CURRENT_SOURCE_DIR is validation/).
#
#   ctest -L mpi -R comm_   runs them under mpiexec on this machine

add_executable(amsp_comm_collectives_test ${CMAKE_CURRENT_SOURCE_DIR}/comm/collectives_test.cpp)
target_compile_options(amsp_comm_collectives_test PRIVATE ${AMSP_WARNINGS})
target_link_libraries(amsp_comm_collectives_test PRIVATE amsp_core)

add_executable(amsp_comm_overlap_test ${CMAKE_CURRENT_SOURCE_DIR}/comm/overlap_test.cpp)
target_compile_options(amsp_comm_overlap_test PRIVATE ${AMSP_WARNINGS})
target_link_libraries(amsp_comm_overlap_test PRIVATE amsp_core)

# Every collective against its reference, with 4 ranks and with 3 (not a power
# of two), in the default progress mode and in the two others.
foreach(n 4 3)
  add_test(NAME comm_collectives_${n}
    COMMAND ${AMSP_EXPECT_OUTPUT} " 0 failed" --
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} $<TARGET_FILE:amsp_comm_collectives_test>)
  set_tests_properties(comm_collectives_${n} PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS ${AMSP_SHARE_${n}})
endforeach()
foreach(mode mpi-async none)
  add_test(NAME comm_collectives_4_${mode}
    COMMAND ${AMSP_EXPECT_OUTPUT} " 0 failed" --
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 $<TARGET_FILE:amsp_comm_collectives_test>)
  set_tests_properties(comm_collectives_4_${mode} PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS ${AMSP_SHARE_4}
    ENVIRONMENT AMSP_COMM_PROGRESS=${mode})
endforeach()

# Does a reduce-scatter progress while the caller computes, without the caller's
# help? Judged by counting, not by the clock: rank 0 computes blocks of arithmetic
# that never call MPI and counts the result bytes that arrive meanwhile, the other
# ranks issue only after rank 0's issue returned (doc/communication.md, "Tests").
# thread and mpi-async must move the whole result (thread: and record it complete on
# its own thread) within a budget of blocks far above what the op needs; none must
# move nothing, as MPICH progresses only inside the caller's MPI calls.
foreach(mode thread mpi-async none)
  if(mode STREQUAL "none")
    set(expect no-progress)
    set(budget 20000)  # the whole budget is always spent: keep it short
  else()
    set(expect progress)
    set(budget 1000000)
  endif()
  add_test(NAME comm_overlap_${mode}
    COMMAND ${AMSP_EXPECT_OUTPUT} " 0 failed" --
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 $<TARGET_FILE:amsp_comm_overlap_test>
            --expect ${expect} --mib 16 --budget ${budget})
  set_tests_properties(comm_overlap_${mode} PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 4
    ENVIRONMENT AMSP_COMM_PROGRESS=${mode})
endforeach()

# The benchmark end to end, small sizes: a table the planner can read.
add_test(NAME comm_bench_small
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 $<TARGET_FILE:amsp> comm-bench
          --max-bytes 1M --iters 5 --warmup 2 --ranks-per-node 2
          --json ${CMAKE_BINARY_DIR}/test-work/comm/bench.json
          --output-table ${CMAKE_BINARY_DIR}/test-work/comm/table.json)
set_tests_properties(comm_bench_small PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 4
  FAIL_REGULAR_EXPRESSION "wrong: [1-9]|FAILED" FIXTURES_SETUP comm_bench_table)
# ... and the planner reads that table: it names it as the bandwidth it priced with.
add_test(NAME comm_bench_table_planned
  COMMAND ${AMSP_EXPECT_OUTPUT} "^bandwidth: measured table .*/test-work/comm/table.json" "valid plans, [1-9]" --
          $<TARGET_FILE:amsp> plan --model tiny --nodes 2 --ranks-per-node 2 --precision fp32 --seq-len 32
          --bandwidth ${CMAKE_BINARY_DIR}/test-work/comm/table.json)
set_tests_properties(comm_bench_table_planned PROPERTIES LABELS mpi TIMEOUT 60
  FIXTURES_REQUIRED comm_bench_table)

# A collective that one rank never joins ends the job after the timeout with a
# message naming the rank, group and op (every progress mode), and exit code 1
# (kExitFailure, through MPI_Abort): a job that ends any other way fails the test.
add_executable(amsp_comm_timeout_test ${CMAKE_CURRENT_SOURCE_DIR}/comm/timeout_test.cpp)
target_compile_options(amsp_comm_timeout_test PRIVATE ${AMSP_WARNINGS})
target_link_libraries(amsp_comm_timeout_test PRIVATE amsp_core)
# The default mode names the rank that never joined (comm/watchdog.h), here in an
# all-to-all; `none` runs no watchdog thread (it would progress the ops) and names
# the op, here an all-reduce.
set(AMSP_TIMEOUT_OP_thread all_to_all)
set(AMSP_TIMEOUT_OP_none all_reduce)
set(AMSP_TIMEOUT_LINE_thread "rank 0 of 3 on host .*: hang: rank 1 \\([^,]+, local 1\\) never reached all_to_all #1 on the P group of ranks 0-2 \\(it waits in no collective: it computes, its last op on the group #0\\); ranks 0, 2 waited 1.5 s$")
set(AMSP_TIMEOUT_LINE_none "rank [02] of 3 on host .*: hang: all_reduce #1 on the P group of ranks 0-2 did not complete within 1.5 s \\(with AMSP_COMM_PROGRESS=none no watchdog thread runs")
foreach(mode thread none)
  add_test(NAME comm_timeout_${mode}
    COMMAND ${AMSP_EXPECT_OUTPUT} --exit 1 "${AMSP_TIMEOUT_LINE_${mode}}" --
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 $<TARGET_FILE:amsp_comm_timeout_test>
            ${AMSP_TIMEOUT_OP_${mode}})
  set_tests_properties(comm_timeout_${mode} PROPERTIES LABELS mpi TIMEOUT 60 PROCESSORS 3
    ENVIRONMENT "AMSP_COMM_TIMEOUT=1.5;AMSP_COMM_PROGRESS=${mode}")
endforeach()
# The mismatch check (progress thread): rank 1 issues an all-to-all of 5 int32
# where ranks 0 and 2 issue 4; the job ends before anything moves, naming rank 1
# and both counts.
add_test(NAME comm_mismatch_all_to_all
  COMMAND ${AMSP_EXPECT_OUTPUT} --exit 1 "rank 0 of 3 on host .*: mismatch in op #1 on the P group of ranks 0-2: rank 1 \\([^,]+, local 1\\) issued all_to_all of 5 int32 where ranks 0, 2 issued all_to_all of 4 int32; nothing was moved$" --
          ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 $<TARGET_FILE:amsp_comm_timeout_test> mismatch)
set_tests_properties(comm_mismatch_all_to_all PROPERTIES LABELS mpi TIMEOUT 60 PROCESSORS 3
  ENVIRONMENT "AMSP_COMM_PROGRESS=thread;AMSP_COMM_CHECK=1")
# The NCCL backend's check, beside the op (over the emulated NCCL, which hangs in
# a mismatched all-gather until the 30 s timeout, as NCCL would): rank 1 issues an
# all-gather of 5 int32 where ranks 0 and 2 issue 4; the job ends naming rank 1 long
# before the hang would.
add_test(NAME comm_mismatch_nccl
  COMMAND ${AMSP_EXPECT_OUTPUT} --exit 1 "rank 0 of 3 on host .*: mismatch in op #1 on the P group of ranks 0-2: rank 1 \\([^,]+, local 1\\) issued all_gather of 5 int32 where ranks 0, 2 issued all_gather of 4 int32; found beside the op: NCCL may have moved data$" --
          ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 $<TARGET_FILE:amsp_comm_timeout_test> nccl_mismatch)
set_tests_properties(comm_mismatch_nccl PROPERTIES LABELS mpi TIMEOUT 25 PROCESSORS 3
  ENVIRONMENT "AMSP_COMM_TIMEOUT=30;AMSP_COMM_CHECK=1")

# What the communicators hand to MPI, counted through PMPI (the engine tests'
# libamsp_mpi_count), per dtype: the MPI collectives each op uses and their bytes
# under the ring model equal the accounting (bf16 sums go through an all-to-all).
foreach(n 4 3)
  add_test(NAME comm_wire_dtypes_${n}
    COMMAND ${AMSP_EXPECT_OUTPUT} " 0 failed" --
            python3 ${CMAKE_CURRENT_SOURCE_DIR}/comm/wire_dtype_test.py
            --test $<TARGET_FILE:amsp_comm_collectives_test> --preload $<TARGET_FILE:amsp_mpi_count>
            --mpiexec ${MPIEXEC_EXECUTABLE} -n ${n} --work ${CMAKE_BINARY_DIR}/test-work/comm/wire-${n})
  set_tests_properties(comm_wire_dtypes_${n} PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS ${AMSP_SHARE_${n}})
endforeach()
