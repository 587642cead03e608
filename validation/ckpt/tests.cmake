# Checkpoint system tests. Included from validation/CMakeLists.txt
# (CMAKE_CURRENT_SOURCE_DIR is validation/).
#
#   ctest -L mpi -R ckpt_   runs them

add_executable(amsp_ckpt_test ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/ckpt_test.cpp)
target_compile_options(amsp_ckpt_test PRIVATE ${AMSP_WARNINGS})
target_link_libraries(amsp_ckpt_test PRIVATE amsp_core)

# Save under several plans, load under others (resharding), damage, pruning:
# on 4 ranks, 3 (padding, not a power of two) and 1.
foreach(n 4 3 1)
  add_test(NAME ckpt_mpi_${n}
    COMMAND ${AMSP_EXPECT_OUTPUT} " 0 failed" --
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} $<TARGET_FILE:amsp_ckpt_test>
            ${CMAKE_BINARY_DIR}/test-work/ckpt)
  # A checkpoint is first read by `amsp ckpt verify --in-process` in a child
  # process (ckpt::check_in_child): this program is not amsp, so name it.
  set_tests_properties(ckpt_mpi_${n} PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS ${AMSP_SHARE_${n}}
    ENVIRONMENT "AMSP_EXECUTABLE=$<TARGET_FILE:amsp>")
endforeach()

# amsp ckpt inspect / verify (exit 1 naming the dataset on a flipped byte), and
# the file read by h5dump and h5py with no amsp code.
add_test(NAME ckpt_cli
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/cli_test.sh $<TARGET_FILE:amsp_ckpt_test>
          $<TARGET_FILE:amsp> ${MPIEXEC_EXECUTABLE} ${CMAKE_BINARY_DIR}/test-work/ckpt-cli)
set_tests_properties(ckpt_cli PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS ${AMSP_SHARE_2} ENVIRONMENT "AMSP_EXECUTABLE=$<TARGET_FILE:amsp>")

# Damaged checkpoints: a sample of byte flips across the first 16 KiB (HDF5's
# superblock and object headers, the manifest) and the data, each followed by
# `amsp ckpt verify` and `amsp train --resume auto` under deadlines: every trial
# is rejected or provably harmless, never a crash, a hang or a wrong resume. The
# random offsets come from the script's fixed default seed (printed; --seed S
# picks others), so every run checks the same trials. The full sweep (every byte
# of the first 16 KiB) is the same script with --full (doc/checkpoints.md,
# "Damaged files").
add_test(NAME ckpt_damage
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/damage_test.py --amsp $<TARGET_FILE:amsp>
          --data ${AMSP_CORPUS} --work ${CMAKE_BINARY_DIR}/test-work/ckpt-damage --sample 64 --random 16)
set_tests_properties(ckpt_damage PROPERTIES FIXTURES_REQUIRED corpus LABELS system TIMEOUT 600)
