/* sample_payload.h: a sample operation's payload, in one codec that the api and the
 * executor use. It stays JSON in operations.payload: it is small next to a
 * forward_backward's, and SQL reads it (usage counts its prompt, the console shows its
 * stop tokens, the OpenAI stream finds the operations that ask for progress). The api's
 * routes fill a sample_payload (asample: service/sample_req.c; the OpenAI routes:
 * service/api_openai.c) and sample_payload_encode writes it:
 *   {"prompt": [int...], "num_samples": 1, "max_tokens": 16, "temperature": 1.0,
 *    "top_k": -1, "top_p": 1.0, "seed": 123, "stop_tokens": [int...] | "stop_strings":
 *    [str...] (only the one the client gave), "prompt_logprobs": false,
 *    "topk_prompt_logprobs": 0, "source": "base"|"snapshot"|"checkpoint",
 *    "blob_digest": "<sha256>" (checkpoint only)}
 * and, only when asked for (so that a request without them has exactly the payload above):
 *    "topk_sample_logprobs": k, "prompt_logprobs_last_n": n, "prompt_alt_tokens_k": k,
 *    "target_prompt_logprobs": {"shape": [len(prompt) - 1, K], "data": [id or -1, ...]}
 *    (dense, row-major) or the same with "crow": [...], "col": [...] (sparse CSR: data holds
 *    the listed cells), exactly as the client laid it out, since the result keeps its layout;
 *    the OpenAI routes' "progress": true with "top_logprobs": k (docs/protocol.md §18).
 * The executor reads it back with sample_payload_decode (exe_sample.c). */
#pragma once
#include "contract/contract.h"
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t *prompt;
    size_t n_prompt;
    int64_t num_samples;
    bool has_max_tokens;              /* the api always writes it; a payload without it gets
                                         the executor's default */
    int64_t max_tokens;
    double temperature, top_p;
    int64_t top_k;
    int64_t seed;
    int64_t *stop_tokens;             /* NULL: not given */
    size_t n_stop_tokens;
    const char **stop_strings;        /* NULL: not given; the strings are the caller's */
    size_t n_stop_strings;
    bool prompt_logprobs;
    int64_t topk_prompt_logprobs;
    /* newer SDKs (docs/protocol.md §11.1); 0 = not asked for */
    int64_t topk_sample_logprobs;
    int64_t prompt_logprobs_last_n;
    int64_t prompt_alt_tokens_k;
    /* target_prompt_logprobs: [target_rows, target_cols] token ids (-1 = none) */
    bool has_target;
    int64_t target_rows, target_cols;
    int64_t *target_ids;              /* dense: rows x cols row-major; CSR: the nnz listed cells */
    size_t n_target_ids;
    int64_t *target_crow, *target_col; /* CSR only (NULL when dense): rows + 1 and nnz entries */
    const char *source;               /* "base", "snapshot", "checkpoint"; NULL: not written */
    const char *blob_digest;          /* the checkpoint's blob (source checkpoint), or NULL */
    /* the OpenAI routes: tokens published as they come; the top_logprobs of each step */
    bool progress;
    int64_t top_logprobs;
} sample_payload;

/* The payload's JSON (malloc'd, NUL-terminated, *len bytes). */
char *sample_payload_encode(const sample_payload *p, size_t *len);

/* The executor's reading of a payload j: every field, with its default when absent (those
 * of the payload above), within its range; the prompt within the model's vocabulary and
 * context, target_prompt_logprobs well-formed for the prompt. The api wrote it checked;
 * one written past the api fails its own operation. 0, or -1 with the operation's message
 * (category user). *out's arrays are malloc'd (sample_payload_free), its strings point
 * into j. */
int sample_payload_decode(const json_t *j, int64_t vocab_size, int64_t max_context, sample_payload *out, char *err,
                          size_t errlen);
/* Frees the arrays (prompt, stop tokens, the stop string list, target), not the strings. */
void sample_payload_free(sample_payload *p);
