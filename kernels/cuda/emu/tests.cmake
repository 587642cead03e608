# The emulated NCCL's check under MPI (check/nccl_check.cpp: a plain main, not
# gtest, since it needs 4 ranks; in a directory of its own so that globs of
# emu/*.cpp for the library do not take its main). Included from
# kernels/cuda/CMakeLists.txt after the amsp_kernels_cuda_emu library is defined.
#
#   ctest -L mpi -R emu_nccl   runs it under mpiexec on this machine

add_executable(amsp_emu_nccl_check ${CMAKE_CURRENT_LIST_DIR}/check/nccl_check.cpp)
target_compile_options(amsp_emu_nccl_check PRIVATE ${AMSP_WARNINGS})
target_link_libraries(amsp_emu_nccl_check PRIVATE amsp_kernels_cuda_emu)

# All four collectives and ncclSend/ncclRecv in four types, on the world and on
# groups of 2, plus the error paths (disagreeing members, abort, a late peer with
# a timeout, mismatched counts).
add_test(NAME emu_nccl_check
  COMMAND ${AMSP_EXPECT_OUTPUT} "4 ranks, 0 failed" --
          ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 $<TARGET_FILE:amsp_emu_nccl_check>)
set_tests_properties(emu_nccl_check PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 4)

# AMSP_EMU_NCCL_FAIL fails the call it names, at once or as an async error.
foreach(mode sync async)
  set(spec "allreduce:2")
  if(mode STREQUAL "async")
    set(spec "allreduce:2:async")
  endif()
  add_test(NAME emu_nccl_inject_${mode}
    COMMAND ${AMSP_EXPECT_OUTPUT} "4 ranks, 0 failed" --
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 $<TARGET_FILE:amsp_emu_nccl_check>)
  set_tests_properties(emu_nccl_inject_${mode} PROPERTIES LABELS mpi TIMEOUT 120 PROCESSORS 4
    ENVIRONMENT "AMSP_EMU_NCCL_FAIL=${spec}")
endforeach()
