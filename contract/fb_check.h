/* fb_check.h: the one validation of a forward / forward_backward, shared by the api and
 * the executor so that both apply the same rules:
 *  - the api (service/fwdbwd.c) checks every request at submit: a client mistake is a
 *    400 that names the field (docs/protocol.md §7.3, §8);
 *  - the executor (executor/exe_train.c) checks every datum of the stored payload again
 *    before any backend sees it (backends trust their inputs): a payload that breaks a
 *    rule fails only its own operation, never the others packed with it.
 * Both describe a datum with the plain view below; the api fills it from its decoded
 * request (ids as sent, int64), the executor from the packed payload (contract/fb_payload.h:
 * int32 ids). Every function returns 0, or -1 with a
 * message in err that starts with `where` ("forward_backward_input.data[3]", "data[3]"). */
#pragma once
#include "contract/contract.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a datum is checked against: the base model. */
typedef struct {
    int64_t vocab_size;
    int64_t max_context;
} fb_check_model;

/* One loss input of a datum as sent: 1-D (cols 1) or 2-D [rows, cols], values = rows·cols. */
typedef struct {
    bool present;
    int dims;
    size_t cols;
    size_t values;
} fb_view_input;

/* The ids are one of int64 (tokens, targets) or int32 (tokens32, targets32). */
typedef struct {
    size_t n_tokens;
    const int64_t *tokens;            /* [n_tokens] model input */
    const int64_t *targets;           /* the values of in[LOSS_IN_TARGET_TOKENS], or NULL */
    const int32_t *tokens32, *targets32;
    fb_view_input in[LOSS_N_INPUTS];
} fb_view;

/* The loss_fn_config of a request: clip_low_threshold <= clip_high_threshold (they bound
 * the importance ratio of ppo and cispo), every value finite and below LIMIT_ABS. */
int fb_check_loss(const loss_spec *s, const char *where, char *err, size_t errlen);

/* The message for a 2-D input where the loss takes only 1-D ones (also the decoders'). -1. */
int fb_err_two_d(const char *where, const char *name, char *err, size_t errlen);

/* A datum: 1 <= tokens <= the context, token ids and target ids in the vocabulary, the
 * inputs the loss requires present, one value per input token (K per token for a 2-D
 * input, 1 <= K <= LIMIT_K, 2-D only where the loss takes it), target_tokens and weights
 * of one shape. */
int fb_check_datum(const fb_check_model *m, loss_kind loss, const fb_view *d, const char *where, char *err,
                   size_t errlen);
