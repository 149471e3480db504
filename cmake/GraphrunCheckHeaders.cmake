# graphrun_check_headers: every public header must compile on its own.
#
# For each api/include/graphrun/*.h a one-line translation unit including
# only that header is generated, and all of them form the OBJECT library
# `graphrun_check_headers`, part of `all`: a header that misses an #include
# of its own breaks the build. Included by the top-level CMakeLists.txt
# after the library targets are defined.

function(graphrun_check_headers)
  cmake_parse_arguments(ARG "" "TARGET;DIRECTORY;PREFIX" "DEPS" ${ARGN})
  if(NOT ARG_TARGET)
    set(ARG_TARGET graphrun_check_headers)
  endif()
  if(NOT ARG_DIRECTORY)
    set(ARG_DIRECTORY ${PROJECT_SOURCE_DIR}/api/include/graphrun)
  endif()
  if(NOT ARG_PREFIX)
    set(ARG_PREFIX graphrun)
  endif()
  if(NOT ARG_DEPS)
    set(ARG_DEPS graphrun::graphrun)
  endif()

  file(GLOB headers CONFIGURE_DEPENDS RELATIVE ${ARG_DIRECTORY} ${ARG_DIRECTORY}/*.h)
  list(SORT headers)
  set(sources)
  foreach(header IN LISTS headers)
    string(MAKE_C_IDENTIFIER "${header}" stem)
    set(source ${CMAKE_CURRENT_BINARY_DIR}/${ARG_TARGET}/${stem}.cc)
    # file(CONFIGURE) rewrites only on change, so nothing rebuilds needlessly.
    file(CONFIGURE OUTPUT ${source}
         CONTENT "// Generated: checks that <${ARG_PREFIX}/${header}> is self-contained.\n#include <${ARG_PREFIX}/${header}>\n")
    list(APPEND sources ${source})
  endforeach()

  add_library(${ARG_TARGET} OBJECT ${sources})
  target_link_libraries(${ARG_TARGET} PRIVATE ${ARG_DEPS} $<BUILD_INTERFACE:graphrun_warnings>)
endfunction()

graphrun_check_headers()
