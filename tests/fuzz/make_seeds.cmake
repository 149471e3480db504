# Builds one fuzz target's seed corpus (run by tests/fuzz/CMakeLists.txt):
#   cmake -DMODE=encode|copy -DOUT_DIR=dir -DINPUTS="a.pbtxt|b.pbtxt"
#         [-DPROTOC=protoc -DPROTO_DIR=proto -DPROTO_FILE=graphrun/v1/graph.proto
#          -DMESSAGE=graphrun.v1.GraphDef -DSUFFIX=.pb] -P make_seeds.cmake
# encode: each text-format input through `protoc --encode=MESSAGE` into
# OUT_DIR/<name>SUFFIX; copy: the inputs as they are.
string(REPLACE "|" ";" INPUTS "${INPUTS}")  # '|'-separated: a ';' list does not survive the command line
file(REMOVE_RECURSE "${OUT_DIR}")
file(MAKE_DIRECTORY "${OUT_DIR}")
foreach(input IN LISTS INPUTS)
  get_filename_component(name "${input}" NAME_WE)
  if(MODE STREQUAL "copy")
    file(COPY "${input}" DESTINATION "${OUT_DIR}")
  elseif(MODE STREQUAL "encode")
    execute_process(
      COMMAND "${PROTOC}" "--proto_path=${PROTO_DIR}" "--encode=${MESSAGE}" "${PROTO_FILE}"
      INPUT_FILE "${input}"
      OUTPUT_FILE "${OUT_DIR}/${name}${SUFFIX}"
      ERROR_VARIABLE err
      RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "make_seeds: protoc --encode=${MESSAGE} failed on ${input}: ${err}")
    endif()
  else()
    message(FATAL_ERROR "make_seeds: MODE must be encode or copy, not '${MODE}'")
  endif()
endforeach()
