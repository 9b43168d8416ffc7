/* sample_req.h: an asample request (docs/protocol.md §11.1) as one plain struct: decoded
 * from JSON, validated against the sampling session's base model, and written as
 * operations.payload by the contract's codec (contract/sample_payload.h: the payload's
 * fields, its format, and the executor's reading of it). Defaults are filled in here:
 * seed (random when absent) and max_tokens (when absent, min(256, context - prompt
 * length)), so the payload is complete and reproducible. */
#pragma once
#include "contract/contract.h"
#include "contract/sample_payload.h"
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SAMPLE_DEFAULT_MAX_TOKENS 256
#define SAMPLE_MAX_STOP 256          /* entries of sampling_params.stop */
#define SAMPLE_MAX_STOP_LEN 1024     /* bytes of one stop string */

typedef struct {
    const char *sampling_session_id;  /* points into the request JSON */
    bool has_seq_id;
    int64_t seq_id;
    bool has_seed;
    sample_payload p;                 /* stop_strings point into the request JSON */
} sample_req;

/* Structural decode (types, ranges that need no model). The legacy form without a
 * sampling session (base_model / model_path given directly) is refused with a message
 * that says what to do instead. 0 or -1 with err; *out is always safe to free. */
int sample_decode_json(const json_t *body, sample_req *out, char *err, size_t errlen);
/* Checks against the base model (vocabulary, context) and fills the defaults. */
int sample_validate(sample_req *r, int64_t vocab_size, int64_t max_context, char *err,
                    size_t errlen);
/* The payload (malloc'd; sample_payload_encode). blob_digest only for source "checkpoint". */
char *sample_payload_json(const sample_req *r, const char *source, const char *blob_digest,
                          size_t *len);
/* Tokens the operation occupies: num_samples x (prompt + max_tokens). */
int64_t sample_n_tokens(const sample_req *r);
void sample_req_free(sample_req *r);
