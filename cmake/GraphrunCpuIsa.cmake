# Run-time instruction-set dispatch: kernel sources compiled once per level.
#
# graphrun_add_isa_objects(TARGET <static lib> SOURCES <files...>)
#
# Each source is compiled for every level (x86-64: baseline, avx2 = AVX2 +
# FMA, avx512 = AVX-512 F/BW/DQ/VL + AVX2 + FMA; elsewhere the baseline
# only) with GRAPHRUN_CPU_ISA_NS=<level>. A level's objects are then
# partially linked (ld -r, COMDAT groups dissolved) and every symbol they define, except the level's
# table (names containing kernel_table_<level>), gets the suffix
# .graphrun_<level> (objcopy --redefine-syms): Eigen's templates and the
# inline functions of the headers are instantiated in every level under
# the same names, and the final link would otherwise keep one copy of each
# from any level (AVX-512 code in the baseline table: a SIGILL on an older
# CPU). The renamed object joins TARGET's sources.
#
# GRAPHRUN_CPU_DISPATCH is true when more than the baseline is built; the
# libraries that choose the level are compiled with -DGRAPHRUN_CPU_DISPATCH.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(GRAPHRUN_CPU_ISA_LEVELS baseline avx2 avx512)
  set(GRAPHRUN_CPU_DISPATCH ON)
else()
  set(GRAPHRUN_CPU_ISA_LEVELS baseline)
  set(GRAPHRUN_CPU_DISPATCH OFF)
endif()
set(_graphrun_isa_flags_baseline "")
set(_graphrun_isa_flags_avx2 -mavx2 -mfma)
set(_graphrun_isa_flags_avx512 -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma)
set(_graphrun_isa_enum_baseline kBaseline)
set(_graphrun_isa_enum_avx2 kAvx2)
set(_graphrun_isa_enum_avx512 kAvx512)
set(_graphrun_isa_script ${CMAKE_CURRENT_LIST_DIR}/GraphrunIsolateObjects.cmake)
# GNU binutils for the isolation, whatever the compiler: lld has no
# --force-group-allocation. (Debian's g++ and clang both come with them.)
find_program(GRAPHRUN_ISA_LD NAMES ld.bfd ld REQUIRED)
find_program(GRAPHRUN_ISA_NM NAMES nm REQUIRED)
find_program(GRAPHRUN_ISA_OBJCOPY NAMES objcopy REQUIRED)
find_program(GRAPHRUN_ISA_READELF NAMES readelf REQUIRED)

function(graphrun_add_isa_objects)
  cmake_parse_arguments(ARG "" "TARGET" "SOURCES" ${ARGN})
  foreach(level IN LISTS GRAPHRUN_CPU_ISA_LEVELS)
    set(objects ${ARG_TARGET}_isa_${level})
    add_library(${objects} OBJECT ${ARG_SOURCES})
    # -fno-math-errno: nothing reads errno, and it lets sqrt loops vectorise.
    # GCC 12 reports its own _mm512_undefined_* (`__m512 __Y = __Y;`) as
    # maybe-uninitialized when Eigen's packet code inlines it.
    target_compile_options(${objects} PRIVATE ${_graphrun_isa_flags_${level}} -fno-math-errno
      $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>)
    target_compile_definitions(${objects} PRIVATE GRAPHRUN_CPU_ISA_NS=${level}
      GRAPHRUN_CPU_ISA_LEVEL=graphrun::CpuIsa::${_graphrun_isa_enum_${level}}
      EIGEN_DONT_PARALLELIZE)
    target_link_libraries(${objects} PRIVATE graphrun_api Eigen3::Eigen graphrun_warnings)
    target_include_directories(${objects} PRIVATE ${PROJECT_SOURCE_DIR})
    set_target_properties(${objects} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    set(out ${CMAKE_CURRENT_BINARY_DIR}/${objects}.o)
    add_custom_command(OUTPUT ${out}
      COMMAND ${CMAKE_COMMAND} -DLINKER=${GRAPHRUN_ISA_LD} -DNM=${GRAPHRUN_ISA_NM}
              -DOBJCOPY=${GRAPHRUN_ISA_OBJCOPY} -DREADELF=${GRAPHRUN_ISA_READELF} -DLEVEL=${level}
              -DOUTPUT=${out}
              "-DOBJECTS=$<JOIN:$<TARGET_OBJECTS:${objects}>,|>"
              -P ${_graphrun_isa_script}
      DEPENDS ${objects} $<TARGET_OBJECTS:${objects}> ${_graphrun_isa_script}
      COMMENT "Isolating the ${level} kernels (${objects}.o)"
      VERBATIM)
    target_sources(${ARG_TARGET} PRIVATE ${out})
  endforeach()
endfunction()
