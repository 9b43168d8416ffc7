/* fb_payload.h: a forward / forward_backward on its way from the api to the executor, in
 * one codec that both use.
 *
 * The api decodes a request into an fb_request (JSON body: service/fwdbwd.c; protobuf:
 * service/api_proto.c), checks it (fb_validate, contract/fb_check.h) and encodes it with
 * fb_payload_encode into the two columns of its operations row:
 *   operations.payload      a JSON header for SQL and people (the registry's provenance,
 *                           the console, psql): {"loss_fn": "ppo", "loss_fn_config":
 *                           {...as sent, defaults filled in}, "datums": N}
 *   operations.payload_bin  everything the executor reads, packed (below)
 * Both travel as they are: the header as text into jsonb, payload_bin as a binary libpq
 * parameter and result (no hex). The executor reads payload_bin alone (fb_payload_open,
 * fb_payload_next) into the arrays the backend takes, and checks each datum again with
 * fb_check_datum before any backend sees it: a payload written past the api fails its own
 * operation only.
 *
 * payload_bin, little-endian, every array 4-byte aligned:
 *   "LFB1"  u32 loss (loss_kind)  f64 clip_low  f64 clip_high  f64 beta  u32 datums  u32 0
 *   per datum: u32 n (input tokens)  u32 k (columns of target_tokens and weights: 1 for a
 *              1-D input, K for [N, K])  u32 inputs (bit 1 << loss_input per input given)
 *              i32 tokens[n], then those given of: i32 target_tokens[n·k]
 *              f32 weights[n·k]  f32 logprobs[n]  f32 advantages[n]
 * The loss is loss_spec: loss_fn_config over the defaults. An input the loss does not read
 * is not written; an [N, 1] input is written as its 1-D twin (k 1). The datums start at
 * FB_PAYLOAD_DATA_AT: the registry's data_digest hashes from there on, the data without
 * the loss (registry/reg_sql.h). */
#pragma once
#include "contract/contract.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FB_PAYLOAD_MAGIC "LFB1"
#define FB_PAYLOAD_DATA_AT 40   /* bytes before the first datum */
#define FB_PAYLOAD_DATA_AT_S "40"   /* the same, for SQL text */

/* ---- the api's side: a decoded request --------------------------------------------- */

typedef struct {
    bool present;
    size_t n;     /* rows (the leading dimension: one per model input token) */
    size_t k;     /* columns: 1 for a 1-D input, K for shape [N, K] */
    int dims;     /* 1 or 2, as sent */
    int64_t *i;   /* LOSS_IN_TARGET_TOKENS; n·k values, row-major */
    float *f;     /* the float inputs; n·k values, row-major */
} fb_tensor;

typedef struct {
    int64_t *tokens;        /* model input: text chunks concatenated */
    size_t n_tokens;
    fb_tensor in[LOSS_N_INPUTS];
} fb_datum;

typedef struct {
    char *key;
    double value;
} fb_kv;

typedef struct {
    char *model_id;
    bool has_seq_id;
    int64_t seq_id;
    bool forward_only;
    loss_kind loss;
    fb_kv *config;          /* loss_fn_config as sent */
    size_t n_config;
    fb_datum *data;
    size_t n_data;
} fb_request;

/* The loss with the request's loss_fn_config over the defaults. */
loss_spec fb_request_loss(const fb_request *r);
int64_t fb_total_tokens(const fb_request *r);
void fb_request_free(fb_request *r);

/* The two columns of a request (malloc'd; fb_payload_free). Only for a request that
 * passed fb_validate: token ids are in the vocabulary, hence int32. */
typedef struct {
    char *header;          /* operations.payload, NUL-terminated */
    size_t header_len;
    uint8_t *bin;          /* operations.payload_bin */
    size_t bin_len;
} fb_payload;

void fb_payload_encode(const fb_request *r, fb_payload *out);
void fb_payload_free(fb_payload *p);

/* ---- the executor's side: reading payload_bin -------------------------------------- */

typedef struct {
    const uint8_t *at, *end;
    loss_spec loss;
    size_t datums;         /* in the payload */
    size_t read;           /* handed out by fb_payload_next so far */
} fb_payload_reader;

/* One datum as the backend takes it: malloc'd arrays the caller owns (NULL for an input
 * not given), until fb_payload_datum_free or until it takes them over. */
typedef struct {
    size_t n, k;
    int32_t *tokens;                  /* [n] */
    int32_t *targets;                 /* [n·k] */
    float *f[LOSS_N_INPUTS];          /* [LOSS_IN_WEIGHTS] [n·k], [LOSS_IN_LOGPROBS] and
                                         [LOSS_IN_ADVANTAGES] [n]; [LOSS_IN_TARGET_TOKENS] NULL */
    bool has[LOSS_N_INPUTS];
} fb_payload_datum;

/* The header of payload_bin (len bytes at bin, which must outlive the reader). 0, or -1
 * with err when it is not a payload of this format. The loss is not checked here
 * (fb_check_loss does that). */
int fb_payload_open(fb_payload_reader *rd, const uint8_t *bin, size_t len, char *err, size_t errlen);
/* The next datum: 1 with *d, 0 after the last one (when the bytes end there), or -1 with
 * err (sizes that do not fit the bytes, unknown inputs, bytes left over). Memory taken is
 * bounded by the payload's size. */
int fb_payload_next(fb_payload_reader *rd, fb_payload_datum *d, char *err, size_t errlen);
void fb_payload_datum_free(fb_payload_datum *d);
