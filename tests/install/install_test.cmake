# Install test: installs a built graphrun tree into a staging prefix, then
# configures, builds and runs an outside consumer (this folder's
# CMakeLists.txt + main.cc) against it with find_package(graphrun).
#
#   cmake -DBUILD_DIR=<graphrun build> -DWORK_DIR=<scratch>
#         [-DGENERATOR=Ninja] [-DCXX_COMPILER=g++] [-DBUILD_TYPE=Release]
#         [-DSANITIZER=|address|thread] [-DEXTRA_PREFIX_PATH=<dir;...>]
#         [-DEXPECT=graphdef,service]  (parts the consumer must have used)
#         [-DEXPECT_PROGRAMS=graphrun,graphrun-server]  (must be in <prefix>/bin)
#         -P tests/install/install_test.cmake
#
# Registered with ctest (label `install`) from tests/CMakeLists.txt.
cmake_minimum_required(VERSION 3.24)

foreach(var BUILD_DIR WORK_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "install_test.cmake: pass -D${var}=...")
  endif()
endforeach()
set(consumer_src "${CMAKE_CURRENT_LIST_DIR}")
get_filename_component(repo_root "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
if(NOT GENERATOR)
  set(GENERATOR Ninja)
endif()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

set(stage "${WORK_DIR}/stage")
set(consumer_build "${WORK_DIR}/consumer")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run_step what)
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "install test: ${what} failed (${rc}):\n  ${cmd}\n${out}")
  endif()
  message(STATUS "install test: ${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# 1. Install the build tree into the staging prefix.
run_step("cmake --install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${stage}")

# 2. The install must hold the public headers and a package config whose
# exported targets know nothing of build-only targets.
if(NOT EXISTS "${stage}/include/graphrun/graphrun.h")
  message(FATAL_ERROR "install test: ${stage}/include/graphrun/graphrun.h is missing")
endif()
# The programs the build has are installed too.
string(REPLACE "," ";" expect_programs "${EXPECT_PROGRAMS}")
foreach(program IN LISTS expect_programs)
  if(NOT EXISTS "${stage}/bin/${program}")
    message(FATAL_ERROR "install test: the build has ${program} but ${stage}/bin/${program} "
                        "was not installed")
  endif()
endforeach()
file(GLOB_RECURSE config_files "${stage}/*/graphrunConfig.cmake")
if(NOT config_files)
  message(FATAL_ERROR "install test: no graphrunConfig.cmake under ${stage}")
endif()
file(GLOB_RECURSE export_files "${stage}/*/graphrunTargets*.cmake")
foreach(f IN LISTS export_files)
  file(READ "${f}" text)
  foreach(leak graphrun_warnings graphrun_testing "${repo_root}/api")
    string(FIND "${text}" "${leak}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "install test: ${f} mentions '${leak}'")
    endif()
  endforeach()
endforeach()

# 3. Configure, build and run the consumer against the staged install, with
# the sanitizer flags of the build it comes from.
set(san_flags "")
if(SANITIZER STREQUAL "address")
  set(san_flags "-fsanitize=address,undefined -fno-omit-frame-pointer")
elseif(SANITIZER STREQUAL "thread")
  set(san_flags "-fsanitize=thread")
endif()
set(prefix_path "${stage}")
if(EXTRA_PREFIX_PATH)
  list(APPEND prefix_path ${EXTRA_PREFIX_PATH})
endif()
string(REPLACE ";" "\\;" prefix_path_arg "${prefix_path}")
set(configure_args
  -S "${consumer_src}" -B "${consumer_build}" -G "${GENERATOR}"
  "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
  "-DCMAKE_PREFIX_PATH=${prefix_path_arg}"
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  "-DCMAKE_CXX_FLAGS=${san_flags}"
  "-DCMAKE_EXE_LINKER_FLAGS=${san_flags}")
if(CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
run_step("configure the consumer" "${CMAKE_COMMAND}" ${configure_args})

# It must have found the staged graphrun, not another one.
file(STRINGS "${consumer_build}/CMakeCache.txt" graphrun_dir REGEX "^graphrun_DIR:")
string(FIND "${graphrun_dir}" "${stage}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "install test: the consumer found another graphrun (${graphrun_dir})")
endif()

run_step("build the consumer" "${CMAKE_COMMAND}" --build "${consumer_build}")
run_step("run the consumer" "${consumer_build}/consumer")
message(STATUS "${step_output}")
# The optional libraries the build has must be installed and usable.
string(REPLACE "," ";" EXPECT "${EXPECT}")
foreach(part IN LISTS EXPECT)
  string(FIND "${step_output}" "${part} ok" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "install test: the consumer did not use graphrun::${part}")
  endif()
endforeach()
