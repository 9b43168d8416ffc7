# service/service.cmake: what the api library needs beyond service/*.c, included by the
# top-level CMakeLists.txt right after loom_service is defined:
#  - C code generated from service/proto/tinker_public.proto by protoc-c (docs/protocol.md §14),
#    written under the build tree (proto_gen/service/proto/tinker_public.pb-c.{c,h}) and
#    included as "service/proto/tinker_public.pb-c.h";
#  - libprotobuf-c for it, and libzstd for zstd-compressed protobuf bodies (docs/protocol.md §1.6).
# Debian: protobuf-c-compiler libprotobuf-c-dev libzstd-dev (deploy/install-deps.sh).
find_program(LOOM_PROTOC_C protoc-c REQUIRED)
pkg_check_modules(PROTOBUFC REQUIRED IMPORTED_TARGET libprotobuf-c)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)

set(LOOM_PROTO_GEN ${CMAKE_BINARY_DIR}/proto_gen)
set(LOOM_PROTO_SRC ${CMAKE_SOURCE_DIR}/service/proto/tinker_public.proto)
set(LOOM_PROTO_C ${LOOM_PROTO_GEN}/service/proto/tinker_public.pb-c.c)
set(LOOM_PROTO_H ${LOOM_PROTO_GEN}/service/proto/tinker_public.pb-c.h)
add_custom_command(
  OUTPUT ${LOOM_PROTO_C} ${LOOM_PROTO_H}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${LOOM_PROTO_GEN}
  COMMAND ${LOOM_PROTOC_C} --c_out=${LOOM_PROTO_GEN} -I${CMAKE_SOURCE_DIR}
          service/proto/tinker_public.proto
  WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
  DEPENDS ${LOOM_PROTO_SRC}
  COMMENT "protoc-c service/proto/tinker_public.proto")
# Generated code is not ours to keep warning-free.
set_source_files_properties(${LOOM_PROTO_C} PROPERTIES COMPILE_OPTIONS "-w")
target_sources(loom_service PRIVATE ${LOOM_PROTO_C} ${LOOM_PROTO_H})
target_include_directories(loom_service PUBLIC ${LOOM_PROTO_GEN})
target_link_libraries(loom_service PUBLIC PkgConfig::PROTOBUFC PkgConfig::ZSTD)
include(${CMAKE_SOURCE_DIR}/console/console.cmake)
