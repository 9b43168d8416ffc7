# service/service.cmake: the payload codec still in service/ (fwdbwd.c, sample_req.c,
# api_proto.c: the forward_backward and sample payloads and their protobuf form), as the
# library loom_payload, which the route rooms link; included by the top-level
# CMakeLists.txt after loom_core. It needs
#  - C code generated from service/proto/tinker_public.proto by protoc-c (docs/protocol.md §14),
#    written under the build tree (proto_gen/service/proto/tinker_public.pb-c.{c,h}) and
#    included as "service/proto/tinker_public.pb-c.h";
#  - libprotobuf-c for it (zstd-compressed protobuf bodies, docs/protocol.md §1.6, are
#    decoded by core/api_body.c).
# Debian: protobuf-c-compiler libprotobuf-c-dev libzstd-dev (deploy/install-deps.sh).
find_program(LOOM_PROTOC_C protoc-c REQUIRED)
pkg_check_modules(PROTOBUFC REQUIRED IMPORTED_TARGET libprotobuf-c)

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
file(GLOB PAYLOAD_SRC CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/service/*.c)
add_library(loom_payload STATIC ${PAYLOAD_SRC} ${LOOM_PROTO_C} ${LOOM_PROTO_H})
target_include_directories(loom_payload PUBLIC ${LOOM_PROTO_GEN})
target_link_libraries(loom_payload PUBLIC loom_core loom_contract loom_common PkgConfig::PROTOBUFC)
