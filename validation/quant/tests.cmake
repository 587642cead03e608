# Block quantization (doc/compression.md). Included from validation/CMakeLists.txt
# (CMAKE_CURRENT_SOURCE_DIR is validation/). The kernels' unit tests are in
# amsp_tests (Quant*) and cuda_kernels_test (CudaQuant).

# Runs a backend's quantize, dequantize and dequantize_sum on raw fp32 files.
add_executable(amsp_quant_tool ${CMAKE_CURRENT_SOURCE_DIR}/quant/quant_tool.cpp)
target_compile_options(amsp_quant_tool PRIVATE ${AMSP_WARNINGS})
target_link_libraries(amsp_quant_tool PRIVATE amsp_core)

# No fused multiply-add in the objects of kernels/cpu/quant.cpp and of the emulated
# kernels/cuda/quant.cu: dequantize_sum rounds each product and each addition.
add_test(NAME quant_cpu_no_fma
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/quant/no_fma.sh $<TARGET_OBJECTS:amsp_kernels>
          $<TARGET_OBJECTS:amsp_kernels_cuda_emu> COMMAND_EXPAND_LISTS)
set_tests_properties(quant_cpu_no_fma PROPERTIES LABELS unit TIMEOUT 60)

# Records, dequantized values and sums of the CPU backend and of the CUDA backend
# (on its emulation here) bit for bit against NumPy doing the same float32 steps
# from the document alone; 46 cases of awkward values, a few seconds.
add_test(NAME quant_numpy
  COMMAND bash -c "PY=$(\"$0\") && exec \"$PY\" \"$1\" --tool \"$2\" --workdir \"$3\""
          ${CMAKE_CURRENT_SOURCE_DIR}/setup-python.sh ${CMAKE_CURRENT_SOURCE_DIR}/quant/quant_compare.py
          $<TARGET_FILE:amsp_quant_tool> ${AMSP_TEST_WORK}/quant_numpy)
set_tests_properties(quant_numpy PROPERTIES LABELS validation TIMEOUT 300)

# kernels/cuda/quant.cu through nvcc to PTX (sm_80, sm_90): no fused multiply-add,
# which nvcc would make of plain * and + in dequantize_sum. Needs the CUDA toolkit,
# not a GPU; skipped (exit 77) without nvcc, as the bundle's tests are.
add_test(NAME quant_cuda_ptx_no_fma
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/quant/ptx_no_fma.sh ${PROJECT_SOURCE_DIR} ${AMSP_TEST_WORK}/quant_ptx)
set_tests_properties(quant_cuda_ptx_no_fma PROPERTIES LABELS cuda SKIP_RETURN_CODE 77 TIMEOUT 120)
