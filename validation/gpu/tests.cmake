# The GPU path, as far as a machine without a GPU can take it (doc/gpu.md).

# The bundle for a bare GPU machine: amsp built with CUDA for sm_80 and sm_90, its
# sources held to no warnings (AMSP_WERROR, here only: builds in the field do not
# stop at a warning), packed with every non-CUDA library it needs. This is also the
# check that the CUDA backend keeps compiling although nothing CUDA runs here.
# It is a build product, made by the build when AMSP_GPU_BUNDLE is on (bash .ci/run
# turns it on where there is nvcc; configuring with it on fails where there is none): its CUDA compile
# for two architectures takes minutes on 2 cores and would otherwise stall the tests
# that wait for it. Remade when a source, a preset or a GPU script changes. Off by
# default, so that a developer's edit does not recompile the CUDA build each time.
# (This file is included from validation/CMakeLists.txt: its own folder is
# CMAKE_CURRENT_LIST_DIR.)
option(AMSP_GPU_BUNDLE "Build the GPU bundle (validation/gpu/bundle.sh) with the build; needs nvcc" OFF)
set(AMSP_BUNDLE ${CMAKE_BINARY_DIR}/bundle/amsp-gpu.tar.xz)
if(AMSP_GPU_BUNDLE)
  find_program(AMSP_NVCC nvcc PATHS /usr/local/cuda/bin)
  if(NOT AMSP_NVCC)
    message(FATAL_ERROR "AMSP_GPU_BUNDLE=ON: no nvcc (the CUDA toolkit) on PATH or in /usr/local/cuda/bin")
  endif()
  file(GLOB_RECURSE AMSP_BUNDLE_INPUTS CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/src/* ${PROJECT_SOURCE_DIR}/kernels/* ${PROJECT_SOURCE_DIR}/inputs/*
       ${CMAKE_CURRENT_LIST_DIR}/*.sh ${CMAKE_CURRENT_LIST_DIR}/*.py ${PROJECT_SOURCE_DIR}/benchmarks/*.py
       ${PROJECT_SOURCE_DIR}/validation/engine/*.py ${PROJECT_SOURCE_DIR}/validation/slurm/*.py)
  add_custom_command(OUTPUT ${AMSP_BUNDLE}
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/bundle.sh --werror --build ${CMAKE_BINARY_DIR}/cuda-build
            --out ${AMSP_BUNDLE}
    DEPENDS ${AMSP_BUNDLE_INPUTS} ${PROJECT_SOURCE_DIR}/CMakeLists.txt
    COMMENT "The GPU bundle: amsp with CUDA for sm_80 and sm_90, packed (validation/gpu/bundle.sh)"
    VERBATIM)
  add_custom_target(gpu_bundle ALL DEPENDS ${AMSP_BUNDLE})
  set(AMSP_BUNDLE_BUILT 1)
else()
  set(AMSP_BUNDLE_BUILT 0)
endif()

# The bundle unpacked into an empty folder with the Debian copies of what it packs
# hidden: its amsp's CPU path runs on the packed libraries alone; the archive is at
# most 48 MiB and its MANIFEST names both architectures. Skipped when the build made
# no bundle, saying why.
add_test(NAME gpu_bundle_runs
  COMMAND bash -c "[ ${AMSP_BUNDLE_BUILT} = 1 ] || { echo 'SKIP: the build made no GPU bundle: configure with -DAMSP_GPU_BUNDLE=ON (needs nvcc; bash .ci/run does)'; exit 77; }; exec \"$0\" \"$@\""
          ${CMAKE_CURRENT_LIST_DIR}/bundle_test.sh ${AMSP_BUNDLE} ${AMSP_TEST_WORK}/bundle ${AMSP_CORPUS})
set_tests_properties(gpu_bundle_runs PROPERTIES LABELS cuda TIMEOUT 300 SKIP_RETURN_CODE 77 PROCESSORS ${AMSP_SHARE_2}
  FIXTURES_REQUIRED corpus)

# check.sh end to end on the CPU emulation of CUDA, tiny sizes: preflight, kernels,
# the GPU's losses against the CPU's, training beside PyTorch (CPU torch) from the
# same weights, several emulated GPUs; its table and JSON. Proves the script, not a GPU.
add_test(NAME gpu_check_emulated
  COMMAND bash -c "PY=$(\"$0\") && AMSP_PYTHON=\"$PY\" exec \"$PY\" \"$1\" \"$2\" \"$3\""
          ${PROJECT_SOURCE_DIR}/validation/setup-python.sh ${CMAKE_CURRENT_LIST_DIR}/check_emulated_test.py
          ${CMAKE_BINARY_DIR} ${AMSP_TEST_WORK}/gpu-check)
set_tests_properties(gpu_check_emulated PROPERTIES LABELS cuda_emu TIMEOUT 600 PROCESSORS ${AMSP_SHARE_2}
  FIXTURES_REQUIRED corpus ENVIRONMENT "MPIEXEC=${MPIEXEC_EXECUTABLE}")

# The GPU check's report is rewritten after each part, so that a check killed partway
# (a device lease running out) leaves the parts it finished in --out.
add_test(NAME gpu_check_report_after_each_part
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/check_report_test.py)
set_tests_properties(gpu_check_report_after_each_part PROPERTIES LABELS unit TIMEOUT 30)

# The GPU check's part "counters": Nsight Compute's raw CSV read into a table per
# kernel, from a CSV worked by hand (ncu itself runs only on a GPU machine).
add_test(NAME gpu_ncu_table COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/ncu_table_test.py)
set_tests_properties(gpu_ncu_table PROPERTIES LABELS unit TIMEOUT 30)

# benchmarks/roofline_bench.cpp, sampled: the tiny preset's step counted twice, as a
# dry run (kernels and cuBLAS checked and counted, not run) and executed; the
# tables must be the same, since counts depend on shapes, not values, and the
# summary must come out. The benchmark's own sizes (llama-1b, llama-7b) are
# doc/gpu.md's "Counted here".
if(AMSP_BENCHMARKS)
  add_test(NAME roofline_bench_sample
    COMMAND ${AMSP_EXPECT_OUTPUT} "^  roofline step [0-9.]+ ms: [0-9]+ tokens/s, MFU at most [0-9.]+%" --
            bash -c "set -e; dry=$(\"$0\" --model tiny --seq-len 96); wet=$(\"$0\" --model tiny --seq-len 96 --execute); [ \"$dry\" = \"$wet\" ] || { echo 'a dry run counted differently:'; diff <(echo \"$dry\") <(echo \"$wet\"); exit 1; }; echo \"$dry\""
            $<TARGET_FILE:roofline_bench>)
  set_tests_properties(roofline_bench_sample PROPERTIES LABELS cuda_emu TIMEOUT 120)
endif()
