/* api_body.h: request body Content-Encoding. SDK >= 0.22.1 zstd-compresses protobuf
 * forward_backward bodies when client/config says proto_compress_fwdbwd (docs/protocol.md §1.6);
 * the body is one zstd frame. Decoding happens on a database worker, never on a loop. */
#pragma once
#include "core/api_job.h"
#include <stdbool.h>
#include <stddef.h>

/* Whether the body comes as it is: no Content-Encoding, or identity. */
bool api_body_plain(const api_job *job);

/* Replaces job->body with its decoded bytes when Content-Encoding is zstd; identity or
 * none leaves it alone. Returns 0, or an HTTP status with err: 415 for an encoding we do
 * not speak, 400 for a corrupt frame, 413 when the decoded body exceeds max_decoded, 503
 * when the process's decode budget (jx_decode_take) is taken by other requests now. */
int api_body_decode(api_job *job, size_t max_decoded, char *err, size_t errlen);
