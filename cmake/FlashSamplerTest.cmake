# flashsampler_add_test(NAME SOURCES src... [LIBS lib...] [LABELS label...] [TIMEOUT s]
#                       [ENVIRONMENT VAR=value...])
# flashsampler_add_test(NAME COMMAND cmd args... [LABELS ...] [TIMEOUT s] [ENVIRONMENT ...])
#
# The one way a test enters the build. With SOURCES it compiles the GoogleTest
# binary, links gtest_main and registers it with ctest under NAME; with COMMAND
# (tests that are not C++, e.g. the Python client's pytest suite) it registers
# the command as is, and the command failing to start fails the test. Every test carries the label
# `cpu` or `gpu`; `gpu` tests are excluded by the README's test command only on a
# machine without a GPU, where they would fail loudly if started.
function(flashsampler_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS;COMMAND;ENVIRONMENT" ${ARGN})
  if(NOT T_SOURCES AND NOT T_COMMAND)
    message(FATAL_ERROR "flashsampler_add_test(${name}): give SOURCES or COMMAND")
  endif()
  if(NOT T_LABELS)
    set(T_LABELS cpu)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  if(T_SOURCES)
    add_executable(${name} ${T_SOURCES})
    target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
    add_test(NAME ${name} COMMAND ${name})
  else()
    add_test(NAME ${name} COMMAND ${T_COMMAND})
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT})
  if(T_ENVIRONMENT)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${T_ENVIRONMENT}")
  endif()
endfunction()
