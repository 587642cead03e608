# `amsp plan`: the planner as a user runs it. Included from validation/CMakeLists.txt
# (so CMAKE_CURRENT_SOURCE_DIR is validation/).
add_test(NAME plan_cli
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/plan/plan_test.py $<TARGET_FILE:amsp> ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(plan_cli PROPERTIES LABELS system TIMEOUT 120)
