/* sample_req.h: an asample request (docs/protocol.md §11.1) as one plain struct: decoded from JSON,
 * validated against the sampling session's base model, and written as
 * operations.payload, the exact contract the executor reads:
 *   {"prompt": [int...], "num_samples": 1, "max_tokens": 16, "temperature": 1.0,
 *    "top_k": -1, "top_p": 1.0, "seed": 123, "stop_tokens": [int...] | "stop_strings":
 *    [str...] (only the one the client gave), "prompt_logprobs": false,
 *    "topk_prompt_logprobs": 0, "source": "base"|"snapshot"|"checkpoint",
 *    "blob_digest": "<sha256>" (checkpoint only)}
 * and, only when asked for (so that a request without them has exactly the payload above):
 *    "topk_sample_logprobs": k, "prompt_logprobs_last_n": n, "prompt_alt_tokens_k": k,
 *    "target_prompt_logprobs": {"shape": [len(prompt) - 1, K], "data": [id or -1, ...]}
 *    (dense, row-major) or the same with "crow": [...], "col": [...] (sparse CSR: data holds
 *    the listed cells), exactly as the client laid it out, since the result keeps its layout.
 * Defaults are filled in here: seed (random when absent) and max_tokens (when absent,
 * min(256, context - prompt length)), so the payload is complete and reproducible. */
#pragma once
#include "contract/contract.h"
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
    int64_t *prompt;
    size_t n_prompt;
    int64_t num_samples;
    bool has_max_tokens;
    int64_t max_tokens;
    double temperature, top_p;
    int64_t top_k;
    bool has_seed;
    int64_t seed;
    int64_t *stop_tokens;
    size_t n_stop_tokens;
    const char **stop_strings;        /* point into the request JSON */
    size_t n_stop_strings;
    bool prompt_logprobs;
    int64_t topk_prompt_logprobs;
    /* newer SDKs (docs/protocol.md §11.1); 0 = not asked for */
    int64_t topk_sample_logprobs;
    int64_t prompt_logprobs_last_n;   /* clamped to len(prompt) - 1 by sample_validate */
    int64_t prompt_alt_tokens_k;
    /* target_prompt_logprobs: [target_rows, target_cols] token ids (-1 = none) */
    bool has_target;
    int64_t target_rows, target_cols;
    int64_t *target_ids;              /* dense: rows x cols row-major; CSR: the nnz listed cells */
    size_t n_target_ids;
    int64_t *target_crow, *target_col; /* CSR only (NULL when dense): rows + 1 and nnz entries */
} sample_req;

/* Structural decode (types, ranges that need no model). The legacy form without a
 * sampling session (base_model / model_path given directly) is refused with a message
 * that says what to do instead. 0 or -1 with err; *out is always safe to free. */
int sample_decode_json(const json_t *body, sample_req *out, char *err, size_t errlen);
/* Checks against the base model (vocabulary, context) and fills the defaults. */
int sample_validate(sample_req *r, int64_t vocab_size, int64_t max_context, char *err,
                    size_t errlen);
/* The payload (malloc'd). blob_digest only for source "checkpoint". */
char *sample_payload_json(const sample_req *r, const char *source, const char *blob_digest,
                          size_t *len);
/* Tokens the operation occupies: num_samples x (prompt + max_tokens). */
int64_t sample_n_tokens(const sample_req *r);
void sample_req_free(sample_req *r);
