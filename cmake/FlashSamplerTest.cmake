# flashsampler_add_test(NAME SOURCES src... [LIBS lib...] [LABELS label...] [TIMEOUT s])
#
# The one way a test enters the build: it compiles the GoogleTest binary, links
# gtest_main and registers it with ctest under NAME. Every test carries the label
# `cpu` or `gpu`; `gpu` tests are excluded by the README's test command only on a
# machine without a GPU, where they would fail loudly if started.
function(flashsampler_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_SOURCES)
    message(FATAL_ERROR "flashsampler_add_test(${name}): no SOURCES")
  endif()
  if(NOT T_LABELS)
    set(T_LABELS cpu)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT})
endfunction()
