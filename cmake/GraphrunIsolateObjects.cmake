# cmake -DLINKER= -DNM= -DOBJCOPY= -DREADELF= -DLEVEL= -DOUTPUT= -DOBJECTS=a.o|b.o -P this
# One level's kernel objects as one relocatable object whose defined
# symbols, but the level's table, carry the suffix .graphrun_<LEVEL>
# (see GraphrunCpuIsa.cmake).
string(REPLACE "|" ";" objects "${OBJECTS}")
set(partial "${OUTPUT}.partial.o")
# --force-group-allocation dissolves the COMDAT groups: a group is kept or
# dropped by its signature, and signatures are not always symbols objcopy
# can rename (GCC names a constructor's group after its C5 name, which no
# symbol carries), so the final link would keep one level's group and
# leave the other levels' renamed references pointing at nothing.
execute_process(COMMAND ${LINKER} -r --force-group-allocation -o ${partial} ${objects}
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ld -r failed for the ${LEVEL} kernels: ${err}")
endif()
execute_process(COMMAND ${NM} --defined-only --extern-only --format=posix ${partial}
                OUTPUT_VARIABLE symbols RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed for the ${LEVEL} kernels: ${err}")
endif()
string(REPLACE "\n" ";" lines "${symbols}")
set(map "")
set(kept 0)
foreach(line IN LISTS lines)
  string(REGEX MATCH "^[^ ]+" name "${line}")
  if(name STREQUAL "")
    continue()
  endif()
  if(name MATCHES "kernel_table_${LEVEL}")
    math(EXPR kept "${kept} + 1")
    continue()
  endif()
  # The sanitizers' own symbols stay shared: clang's ASan registers every
  # module's globals once, guarded by one ___asan_globals_registered flag;
  # a renamed flag registered them all twice (an odr-violation report).
  if(name MATCHES "^___?(asan|sancov|tsan|ubsan|msan)")
    continue()
  endif()
  string(APPEND map "${name} ${name}.graphrun_${LEVEL}\n")
endforeach()
if(NOT kept EQUAL 1)
  message(FATAL_ERROR "expected one kernel_table_${LEVEL} symbol in the ${LEVEL} kernels, found ${kept}")
endif()
file(WRITE "${OUTPUT}.symbols" "${map}")
execute_process(COMMAND ${OBJCOPY} --redefine-syms=${OUTPUT}.symbols ${partial} ${OUTPUT}
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "objcopy failed for the ${LEVEL} kernels: ${err}")
endif()
file(REMOVE ${partial})
execute_process(COMMAND ${READELF} --section-groups ${OUTPUT} OUTPUT_VARIABLE groups)
if(groups MATCHES "COMDAT group")
  message(FATAL_ERROR "the ${LEVEL} kernels still hold COMDAT groups:\n${groups}")
endif()
