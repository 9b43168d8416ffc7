/* api_proto.h: the protobuf side of the wire (docs/protocol.md §1.6, §14), generated from
 * service/proto/tinker_public.proto by protoc-c. A ForwardBackwardRequest body decodes
 * into the same fb_request as the JSON body (then the same fb_validate and payload);
 * the packed result of a forward/forward_backward (contract/fb_result.h) encodes as
 * ForwardBackwardOutput, and the stored JSON result of a sample as SampleResponse, for
 * clients that Accept protobuf.
 * Tensors may be 2-D ([N, K] dense or sparse_csr, for cross_entropy target_tokens and
 * weights; densified into the same fb_tensor as JSON). In a ForwardBackwardOutput each
 * BatchedTensor carries trailing_shape ([K] for 2-D logprobs, [] for 1-D outputs); datums
 * whose shapes differ go to separate ArrayRecords (num_datums set on each). */
#pragma once
#include "contract/fb_result.h"
#include "service/fwdbwd.h"
#include <stddef.h>
#include <stdint.h>

/* The most memory decoding a protobuf body of len bytes may take (the rest is a 400). */
size_t proto_decode_budget(size_t len);

/* Structural decode of a ForwardBackwardRequest (forward_only comes from the message).
 * 0 or -1 with a message naming the datum and field. *out is always safe to free. */
int proto_decode_fwdbwd(const uint8_t *buf, size_t len, fb_request *out, char *err,
                        size_t errlen);

/* A packed forward / forward_backward result as a serialized ForwardBackwardOutput in
 * malloc'd *out: its arrays are copied as they are (both little-endian float32). */
void proto_encode_fb_result(const fb_result_view *v, uint8_t **out, size_t *len);
/* A stored sample result (JSON text) as a serialized SampleResponse in malloc'd *out. -1
 * with err when the JSON does not have the expected shape (the caller then answers the
 * JSON itself). */
int proto_encode_sample_response(const char *json, uint8_t **out, size_t *len, char *err,
                                 size_t errlen);

/* The answer of retrieve_future for a finished forward / forward_backward (docs/protocol.md
 * §4.2, §14) from its packed result (operations.result_bin, len bytes): a
 * ForwardBackwardOutput when the client accepts protobuf, else the JSON the client
 * receives (fb_result_json); a 500 when the bytes cannot be read. Returns 0. */
typedef struct api_call api_call;
int proto_reply_fb_result(api_call *c, const uint8_t *bin, size_t len);

/* Whether an Accept header asks for protobuf results. */
int proto_accepted(const char *accept);
