# Shared build settings and helpers: warnings, sanitizers, test and bench
# targets.

add_library(graphrun_warnings INTERFACE)
target_compile_options(graphrun_warnings INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic -Wnon-virtual-dtor
    -Wno-missing-field-initializers>
  # GCC only: clang has no -Wshadow=local (the fuzz preset uses clang).
  $<$<CXX_COMPILER_ID:GNU>:-Wshadow=local>
  $<$<BOOL:${GRAPHRUN_WERROR}>:-Werror>)

if(GRAPHRUN_SANITIZER STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
elseif(GRAPHRUN_SANITIZER STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT GRAPHRUN_SANITIZER STREQUAL "")
  message(FATAL_ERROR "GRAPHRUN_SANITIZER must be '', 'address' or 'thread'")
endif()
# Fuzzing: coverage instrumentation for every library; only the targets in
# tests/fuzz link libFuzzer itself (-fsanitize=fuzzer).
if(GRAPHRUN_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang" OR NOT GRAPHRUN_SANITIZER STREQUAL "address")
    message(FATAL_ERROR "GRAPHRUN_FUZZ needs clang (libFuzzer) and GRAPHRUN_SANITIZER=address; "
                        "use the fuzz preset")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

# Test sources in sanitizer builds compile at -O0; the libraries keep the
# preset's -O1. Code generation for the test binaries was most of the
# sanitizer builds' time, and -O0 halves it (under ASan partial_run_test.cc
# took 41.5 s at -O1 and 19.1 s at -O0). What the sanitizers are there to
# check, the libraries' own code, is built as before.
if(GRAPHRUN_SANITIZER AND NOT GRAPHRUN_FUZZ)
  set(_graphrun_test_options_default "-O0")
else()
  set(_graphrun_test_options_default "")
endif()
set(GRAPHRUN_TEST_COMPILE_OPTIONS "${_graphrun_test_options_default}" CACHE STRING
    "Extra compile options for test sources only (default: -O0 in sanitizer builds)")

# graphrun_test_compile_options(<target>): GRAPHRUN_TEST_COMPILE_OPTIONS on a
# test target's own sources.
function(graphrun_test_compile_options target)
  if(GRAPHRUN_TEST_COMPILE_OPTIONS)
    target_compile_options(${target} PRIVATE ${GRAPHRUN_TEST_COMPILE_OPTIONS})
  endif()
endfunction()

# graphrun_add_test(NAME <name> SOURCES <files...> [DEPS <targets...>] [LABELS <labels...>])
# One GoogleTest binary, its tests registered one by one with ctest.
function(graphrun_add_test)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE graphrun::graphrun graphrun_testing GTest::gtest
                        GTest::gmock GTest::gtest_main graphrun_warnings ${ARG_DEPS})
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  graphrun_test_compile_options(${ARG_NAME})
  gtest_discover_tests(${ARG_NAME} TEST_PREFIX "${ARG_NAME}." DISCOVERY_TIMEOUT 60)
  # Labels and timeout are set from a script ctest includes after the
  # discovered list: gtest_discover_tests(PROPERTIES LABELS "a;b") loses all
  # but the first label (and swallows what follows) in CMake 3.25.
  set(props "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}_properties.cmake")
  file(WRITE "${props}"
       "if(DEFINED ${ARG_NAME}_TESTS)\n"
       "  set_tests_properties(\${${ARG_NAME}_TESTS} PROPERTIES LABELS \"${ARG_LABELS}\" TIMEOUT 300)\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${props}")
endfunction()

# graphrun_add_isa_runs(TARGET <test binary> [LABELS <labels...>])
# The whole binary once more per instruction-set level (GRAPHRUN_CPU_ISA_LEVELS,
# from GraphrunCpuIsa.cmake), as ctest entries <TARGET>.isa_baseline and
# <TARGET>.isa_<level>_skipped_on_a_cpu_without_it, run with
# GRAPHRUN_CPU_ISA=<level> and the label isa. A level this CPU lacks
# is skipped (tests/testing/run_at_cpu_isa.sh exits 77). Meant for fast
# binaries: each entry runs every test of TARGET in one process.
function(graphrun_add_isa_runs)
  cmake_parse_arguments(ARG "" "TARGET" "LABELS" ${ARGN})
  set(labels isa ${ARG_LABELS})
  foreach(level IN LISTS GRAPHRUN_CPU_ISA_LEVELS)
    # Above the baseline the entry is skipped on a CPU without the level:
    # its name says so.
    if(level STREQUAL "baseline")
      set(name ${ARG_TARGET}.isa_${level})
    else()
      set(name ${ARG_TARGET}.isa_${level}_skipped_on_a_cpu_without_it)
    endif()
    add_test(NAME ${name} COMMAND sh ${PROJECT_SOURCE_DIR}/tests/testing/run_at_cpu_isa.sh
             $<TARGET_FILE:${ARG_TARGET}> --gtest_brief=1)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT GRAPHRUN_CPU_ISA=${level}
                         LABELS "${labels}" SKIP_RETURN_CODE 77 TIMEOUT 300)
  endforeach()
endfunction()

# graphrun_add_bench(NAME <name> SOURCES <files...> [DEPS <targets...>])
function(graphrun_add_bench)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE graphrun::graphrun benchmark::benchmark
                        graphrun_warnings ${ARG_DEPS})
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
endfunction()
