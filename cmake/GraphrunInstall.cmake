# Install rules and the package config: find_package(graphrun) then link
# graphrun::graphrun (or graphrun::api / graphrun::ops / graphrun::scheduler),
# graphrun::graphdef (GraphDef import/export, needs protobuf) and
# graphrun::service (the gRPC session service, needs gRPC) and graphrun::mpi
# (the MPI component, needs MPI) when they were built.
# Included by the top-level CMakeLists.txt when GRAPHRUN_INSTALL is ON.
#
# The libraries are static, so their private dependencies (TBB, Threads) are
# exported as link-only and the config looks them up too. graphrun_warnings
# is linked as $<BUILD_INTERFACE:...> and so stays out of the export.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(GRAPHRUN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/graphrun"
    CACHE STRING "Where graphrunConfig.cmake is installed (relative to the prefix)")
mark_as_advanced(GRAPHRUN_INSTALL_CMAKEDIR)

set(GRAPHRUN_INSTALL_TARGETS graphrun graphrun_api graphrun_ops graphrun_scheduler)
if(GRAPHRUN_GRAPHDEF)
  list(APPEND GRAPHRUN_INSTALL_TARGETS graphrun_proto graphrun_graphdef)
endif()
if(GRAPHRUN_SERVICE)
  # graphrun_service links the transport-free core and the messages it
  # needs (built without gRPC); all four are exported. Without
  # GRAPHRUN_SERVICE the core is built (for the fuzzer) but not installed.
  list(APPEND GRAPHRUN_INSTALL_TARGETS graphrun_service_messages graphrun_service_proto
       graphrun_service_core graphrun_service)
endif()
if(GRAPHRUN_WITH_MPI)
  list(APPEND GRAPHRUN_INSTALL_TARGETS graphrun_mpi)
endif()
install(TARGETS ${GRAPHRUN_INSTALL_TARGETS}
  EXPORT graphrunTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT graphrun_development
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT graphrun_runtime
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT graphrun_runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(DIRECTORY ${PROJECT_SOURCE_DIR}/api/include/graphrun
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT graphrun_development
  FILES_MATCHING PATTERN "*.h")

if(GRAPHRUN_GRAPHDEF)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/graphdef/include/graphrun
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
    COMPONENT graphrun_development
    FILES_MATCHING PATTERN "*.h")
  # The generated message headers (<graphrun/v1/graph.pb.h>) and the .proto
  # sources, for clients in other languages.
  install(DIRECTORY ${PROJECT_BINARY_DIR}/proto/gen/graphrun
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
    COMPONENT graphrun_development
    FILES_MATCHING PATTERN "*.pb.h")
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/proto/graphrun
    DESTINATION ${CMAKE_INSTALL_DATADIR}/graphrun/proto
    COMPONENT graphrun_development
    FILES_MATCHING PATTERN "*.proto")
  set(GRAPHRUN_FIND_PROTOBUF "find_dependency(Protobuf)")
else()
  set(GRAPHRUN_FIND_PROTOBUF "")
endif()

if(GRAPHRUN_SERVICE)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/service/include/graphrun
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
    COMPONENT graphrun_development
    FILES_MATCHING PATTERN "*.h")
  # <graphrun/v1/session_service.pb.h> (graphrun_service_messages) and
  # .grpc.pb.h (graphrun_service_proto), both generated into gen-service/.
  install(DIRECTORY ${PROJECT_BINARY_DIR}/proto/gen-service/graphrun
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
    COMPONENT graphrun_development
    FILES_MATCHING PATTERN "*.pb.h")
  set(GRAPHRUN_FIND_GRPC "find_dependency(gRPC CONFIG)")
else()
  set(GRAPHRUN_FIND_GRPC "")
endif()

if(GRAPHRUN_WITH_MPI)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/scheduler/mpi/include/graphrun
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
    COMPONENT graphrun_development
    FILES_MATCHING PATTERN "*.h")
  set(GRAPHRUN_FIND_MPI "set(MPI_CXX_SKIP_MPICXX ON)\nfind_dependency(MPI COMPONENTS CXX)")
else()
  set(GRAPHRUN_FIND_MPI "")
endif()

install(EXPORT graphrunTargets
  NAMESPACE graphrun::
  FILE graphrunTargets.cmake
  DESTINATION ${GRAPHRUN_INSTALL_CMAKEDIR}
  COMPONENT graphrun_development)

# tbbmalloc backs tensor buffers unless the build turned it off.
if(GRAPHRUN_TBBMALLOC)
  set(GRAPHRUN_TBB_EXTRA_COMPONENTS " tbbmalloc")
else()
  set(GRAPHRUN_TBB_EXTRA_COMPONENTS "")
endif()
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/graphrunConfig.cmake.in
  ${PROJECT_BINARY_DIR}/graphrunConfig.cmake
  INSTALL_DESTINATION ${GRAPHRUN_INSTALL_CMAKEDIR})
# 0.x: only the same minor version is compatible.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/graphrunConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)

install(FILES
  ${PROJECT_BINARY_DIR}/graphrunConfig.cmake
  ${PROJECT_BINARY_DIR}/graphrunConfigVersion.cmake
  DESTINATION ${GRAPHRUN_INSTALL_CMAKEDIR}
  COMPONENT graphrun_development)
