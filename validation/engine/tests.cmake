# The sharding engine is equivalent to one rank: every shard plan on 4 and 8 ranks, with
# one and several micro-batches, gives the losses and final parameters of one rank with
# the same global batch (doc/engine-tests.md). Included from validation/CMakeLists.txt
# after AMSP_CORPUS and AMSP_TEST_WORK are set (CMAKE_CURRENT_SOURCE_DIR is validation/).
#
#   ctest -R engine_equivalence_mpi     mpiexec on this machine (one node, N ranks)
#   ctest -R engine_equivalence_slurm   srun on a local Slurm cluster of 4 virtual nodes
#                                       that the script starts and always stops; needs
#                                       root, munge and slurm-wlm, skipped (77) otherwise

set(AMSP_EQUIVALENCE_TEST ${CMAKE_CURRENT_SOURCE_DIR}/engine/equivalence_test.py)
set(AMSP_EQUIVALENCE_ARGS
  --amsp $<TARGET_FILE:amsp>
  --data ${AMSP_CORPUS}
  --work ${AMSP_TEST_WORK}/equivalence
  --mpiexec ${MPIEXEC_EXECUTABLE}
  --cluster-scripts ${PROJECT_SOURCE_DIR}/slurm/local-cluster)

# Each case also checks the one issue order: every rank's log of issued collectives, its
# communication thread slowed at random, is the same and is the schedule's step order
# (validation/engine/issue_order.py). About 90 s on 2 cores; the script gives itself 540 s.
add_test(NAME engine_equivalence_mpi
  COMMAND python3 ${AMSP_EQUIVALENCE_TEST} mpi ${AMSP_EQUIVALENCE_ARGS})
set_tests_properties(engine_equivalence_mpi PROPERTIES
  FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 600 PROCESSORS ${AMSP_SHARE_8})

# bf16 mixed precision on 4 ranks against one rank in bf16, with tolerances argued
# from bf16's 8-bit mantissa, and the issue order as above (about 30 s).
add_test(NAME engine_equivalence_mpi_bf16
  COMMAND python3 ${AMSP_EQUIVALENCE_TEST} mpi ${AMSP_EQUIVALENCE_ARGS} --precision bf16)
set_tests_properties(engine_equivalence_mpi_bf16 PROPERTIES
  FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 600 PROCESSORS ${AMSP_SHARE_4})

# A model whose units are not multiples of the OS group (validation/engine/padded.json:
# hidden 18, intermediate 85), so every sharded plan pads them: the first micro-batch
# writes the gradients (nothing zeroes them), the slots' padding is zeroed, and a run
# ends by checking that the gradient's padding is zero. Two reduction slots for its 4
# units, so that a slot serves units of other sizes in turn and its padding would hold
# another unit's gradient if nothing zeroed it (with one slot per unit it never does).
# Three cases, about 10 s.
add_test(NAME engine_equivalence_mpi_padded
  COMMAND python3 ${AMSP_EQUIVALENCE_TEST} mpi ${AMSP_EQUIVALENCE_ARGS}
          --model ${CMAKE_CURRENT_SOURCE_DIR}/engine/padded.json --engine-arg=--reduction-slots=2
          --only "(4, 1, 'zero3', 3, 1)" --only "(4, 1, 'p=1,g=2x1,os=4x1', 3, 1)"
          --only "(4, 1, 'zero1', 2, 2)")
set_tests_properties(engine_equivalence_mpi_padded PROPERTIES
  FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 300 PROCESSORS ${AMSP_SHARE_4})

# The fewest buffers in flight the engine allows (--prefetch-units 1 --reduction-slots 1:
# every gather and every reduction waits for the one before in its buffer), on the plans
# whose chains use every kind of slot buffer; the schedule and the issue order with the
# same options (about 15 s).
add_test(NAME engine_equivalence_mpi_in_flight
  COMMAND python3 ${AMSP_EQUIVALENCE_TEST} mpi ${AMSP_EQUIVALENCE_ARGS}
          --engine-arg=--prefetch-units=1 --engine-arg=--reduction-slots=1
          --only "(4, 1, 'ddp', 1, 1)" --only "(4, 1, 'zero2', 3, 1)" --only "(4, 1, 'zero3', 3, 1)"
          --only "(4, 1, 'mics:2', 3, 1)" --only "(4, 1, 'p=1,g=2x1,os=4x1', 3, 1)")
set_tests_properties(engine_equivalence_mpi_in_flight PROPERTIES
  FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 300 PROCESSORS ${AMSP_SHARE_4})

# Its cluster runs on ports found free at start (validation/slurm/local_cluster.py);
# 8 ranks on 4 virtual nodes of 2 CPUs take every core, so it runs alone.
add_test(NAME engine_equivalence_slurm
  COMMAND python3 ${AMSP_EQUIVALENCE_TEST} slurm ${AMSP_EQUIVALENCE_ARGS})
set_tests_properties(engine_equivalence_slurm PROPERTIES
  FIXTURES_REQUIRED corpus LABELS slurm TIMEOUT 600 SKIP_RETURN_CODE 77
  PROCESSORS ${AMSP_SHARE_8} RESOURCE_LOCK local_slurm)

# amsp train --trace names each collective alike on every member of its group, and
# benchmarks/plan_validation.py tells waiting for a late rank from waiting for the
# network: a trace by hand, a mixed plan's groups on 4 ranks, a rank asleep (about 3 s).
add_test(NAME engine_trace_late_ranks
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/engine/trace_test.py --amsp $<TARGET_FILE:amsp>
          --data ${AMSP_CORPUS} --work ${AMSP_TEST_WORK}/trace --mpiexec ${MPIEXEC_EXECUTABLE})
set_tests_properties(engine_trace_late_ranks PROPERTIES FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 120
  PROCESSORS 4)

# The share of a step's communication a schedule lets compute hide at most
# (plan_validation.schedule_bound, which hidden_bench prints beside the measured share):
# ddp and zero3 of the small preset on 4 ranks, worked by hand (under a second).
add_test(NAME schedule_bound
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/engine/schedule_bound_test.py $<TARGET_FILE:amsp>)
set_tests_properties(schedule_bound PROPERTIES LABELS unit TIMEOUT 60)

# benchmarks/hidden_bench.py, sampled: one plan, the same binary on both sides, a few
# steps of the tiny preset on 4 ranks; the table must come out (about 15 s). The
# benchmark itself, with the previous engine, is doc/engine.md's "Hidden communication".
add_test(NAME hidden_bench_sample
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_output.sh
          "^p=1,g=2x1,os=4x1 +\\| +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+% \\| +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+% \\| +[0-9.]+%$"
          "net of late ranks, at least [0-9.]+% hidden on every rank; the ranks waited for \\(ms per step, summed over waiters\\): (rank [0-9]|nobody)" --
          python3 ${PROJECT_SOURCE_DIR}/benchmarks/hidden_bench.py --before $<TARGET_FILE:amsp>
          --after $<TARGET_FILE:amsp> --data ${AMSP_CORPUS} --work ${AMSP_TEST_WORK}/hidden_bench
          --layouts mpi4 --plans "p=1,g=2x1,os=4x1" --model tiny --seq-len 32 --steps 5
          --warmup 2 --repeats 1)
set_tests_properties(hidden_bench_sample PROPERTIES FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 120
  PROCESSORS 4)

# benchmarks/memory_bench.py, sampled: the tiny preset on 4 ranks, three plans; the
# table of predicted beside measured peaks must come out (about 10 s). The benchmark
# itself is doc/engine.md's "Memory, predicted and measured".
add_test(NAME memory_bench_sample
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_output.sh
          "^worst error [0-9.]+% \\(goal 5%\\); ranks past the goal: [0-9]+$" --
          python3 ${PROJECT_SOURCE_DIR}/benchmarks/memory_bench.py $<TARGET_FILE:amsp> ${AMSP_CORPUS}
          --work ${AMSP_TEST_WORK}/memory_bench --mpiexec ${MPIEXEC_EXECUTABLE} --quick)
set_tests_properties(memory_bench_sample PROPERTIES FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 120
  PROCESSORS 4)

# What the engine hands to MPI, counted by MPI's profiling interface (a preloaded
# library, validation/engine/mpi_count.c) rather than by amsp's own accounting,
# against the planner's prediction and hand-written formulas (doc/engine-tests.md).
add_library(amsp_mpi_count SHARED ${CMAKE_CURRENT_SOURCE_DIR}/engine/mpi_count.c)
target_link_libraries(amsp_mpi_count PRIVATE MPI::MPI_C)
add_test(NAME engine_bytes_on_the_wire
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/engine/wire_test.py --amsp $<TARGET_FILE:amsp>
          --preload $<TARGET_FILE:amsp_mpi_count> --mpiexec ${MPIEXEC_EXECUTABLE} --data ${AMSP_CORPUS}
          --work ${AMSP_TEST_WORK}/wire)
set_tests_properties(engine_bytes_on_the_wire PROPERTIES FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 600
  PROCESSORS ${AMSP_SHARE_8})

# amsp train --kernel-profile on --device cpu and on --device cuda (the emulation), one
# rank: every op the model runs, with exactly the calls per step it implies, timed; the
# memory high-water marks in the metrics and the run record; each kernel's GB/s beside the
# device's copy bandwidth; and the same losses, bit for bit, as without the option (about
# 10 s).
add_test(NAME engine_kernel_profile
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/engine/kernel_profile_test.py $<TARGET_FILE:amsp>
          ${AMSP_CORPUS} ${AMSP_TEST_WORK}/kernel_profile)
set_tests_properties(engine_kernel_profile PROPERTIES FIXTURES_REQUIRED corpus LABELS "system;cuda_emu" TIMEOUT 300)

# The rank that hangs a job, or issues the wrong collective, is named (comm/watchdog.h,
# the mismatch check): 12 runs on 8 ranks under mpiexec and 8 under srun -N 4 on the
# local Slurm cluster (skipped without Slurm), 20 in all, each injecting on a random rank
# at a random step one of SIGSTOP, a spin in compute, a skipped collective and a short
# one, cycling, under zero3 and mics:4 in turns; every run must end within
# --comm-timeout + 10 s naming that rank (about 1 minute each).
set(AMSP_FAULT_TEST ${CMAKE_CURRENT_SOURCE_DIR}/engine/fault_test.py)
add_test(NAME engine_fault_named_mpi
  COMMAND python3 ${AMSP_FAULT_TEST} $<TARGET_FILE:amsp> ${MPIEXEC_EXECUTABLE} ${AMSP_CORPUS}
          ${AMSP_TEST_WORK}/fault --runs 8)
set_tests_properties(engine_fault_named_mpi PROPERTIES
  FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 500 PROCESSORS 8)
add_test(NAME engine_fault_named_slurm
  COMMAND python3 ${AMSP_FAULT_TEST} $<TARGET_FILE:amsp> ${MPIEXEC_EXECUTABLE} ${AMSP_CORPUS}
          ${AMSP_TEST_WORK}/fault_slurm --runs 8 --slurm ${PROJECT_SOURCE_DIR}/slurm/local-cluster)
set_tests_properties(engine_fault_named_slurm PROPERTIES
  FIXTURES_REQUIRED corpus LABELS slurm TIMEOUT 400 SKIP_RETURN_CODE 77 PROCESSORS 8
  RESOURCE_LOCK local_slurm)

# The same on the CUDA backend's emulation (NCCL ops run in issue() there), all four
# kinds under both plans: the stop and the spin named after the timeout, the skipped
# and the short collective by the NCCL backend's mismatch check beside the op (the
# emulated NCCL hangs in a mismatched op, as NCCL would). About 2 minutes.
add_test(NAME engine_fault_named_cuda_emulation
  COMMAND python3 ${AMSP_FAULT_TEST} $<TARGET_FILE:amsp> ${MPIEXEC_EXECUTABLE} ${AMSP_CORPUS}
          ${AMSP_TEST_WORK}/fault_cuda --runs 8 --device cuda)
set_tests_properties(engine_fault_named_cuda_emulation PROPERTIES
  FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 300 PROCESSORS 8)

# A rank made 50% busier is named within 28 steps on 4 and 8 ranks (threshold 25%); an undisturbed run
# of 1000 steps on 4 ranks names at most one (engine/straggler.h).
add_test(NAME engine_straggler_named
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/engine/straggler_test.py $<TARGET_FILE:amsp>
          ${MPIEXEC_EXECUTABLE} ${AMSP_CORPUS} ${AMSP_TEST_WORK}/straggler)
set_tests_properties(engine_straggler_named PROPERTIES
  FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 400 PROCESSORS 8)

# benchmarks/compress_bench.py, sampled: one seed of 10 steps on 4 mpiexec ranks instead of
# 5 seeds of 1000 on the local Slurm cluster; its table and every goal must come out met
# (about 8 s). The benchmark's own figures are doc/compression.md's "Measured over many steps".
add_test(NAME compress_bench_sample
  COMMAND python3 ${PROJECT_SOURCE_DIR}/benchmarks/compress_bench.py --amsp $<TARGET_FILE:amsp>
          --data ${AMSP_CORPUS} --work ${AMSP_TEST_WORK}/compress_bench --launcher mpiexec
          --mpiexec ${MPIEXEC_EXECUTABLE} --steps 10 --seeds 1 --eval-windows 8 --guard-every 5)
set_tests_properties(compress_bench_sample PROPERTIES FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 120
  PROCESSORS 4)

# Compressed parameter all-gathers (doc/compression.md): zero3 on 4 ranks, 20 steps
# with --compress off, p=int8 and p=int4,block=chunk in fp32 and bf16: int8's losses
# follow the uncompressed run's, the coarse int4 drifts further, and the P group's
# all-gather bytes shrink to the records' (about 12 s).
add_test(NAME engine_compressed_gathers
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/engine/compress_test.py --amsp $<TARGET_FILE:amsp>
          --data ${AMSP_CORPUS} --work ${AMSP_TEST_WORK}/compress --mpiexec ${MPIEXEC_EXECUTABLE})
set_tests_properties(engine_compressed_gathers PROPERTIES FIXTURES_REQUIRED corpus LABELS mpi TIMEOUT 300
  PROCESSORS ${AMSP_SHARE_4})
