/* fwdbwd.h: a forward / forward_backward request from its JSON body: the decoder here and
 * the protobuf decoder (api_proto.c, docs/protocol.md §14) fill the same fb_request
 * (contract/fb_payload.h), fb_validate checks it against the model's base model, and
 * fb_payload_encode (the contract's codec, which the executor reads back) writes it.
 * 2-D cross_entropy (docs/protocol.md §8, top-k distillation): target_tokens / weights of
 * shape [N, K] arrive dense or sparse CSR and are densified here (row-major, N·K values).
 * The answer of a finished one is written from its packed result (contract/fb_result.h)
 * by api_proto.c, as JSON or protobuf. */
#pragma once
#include "contract/contract.h"
#include "contract/fb_check.h"
#include "contract/fb_payload.h"
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Decodes the JSON body of /forward_backward (forward_only false) or /forward (true).
 * Structural errors (types, shapes, chunk kinds) -> -1 with a message naming the datum
 * and field. *out is always safe to fb_request_free. */
int fb_decode_json(const json_t *body, bool forward_only, fb_request *out, char *err,
                   size_t errlen);
/* Pieces the JSON and protobuf decoders share, so that both say the same things.
 * fb_set_loss: r->loss from a name (NULL = cross_entropy for forward-only requests);
 * fb_add_config: appends a loss_fn_config entry (cap = the most entries there will be);
 * fb_check_float: a float32 input value must be finite and below 1e18 in magnitude;
 * fb_err_chunk_type: the message for non-text chunks (fb_err_two_d, contract/fb_check.h, the
 * one for 2-D inputs where only 1-D ones are accepted: loss_input_two_d says where).
 * fb_check_n_data: at most LIMIT_DATA datums.
 * fb_tensor_alloc_1d: t becomes a present 1-D input of n zero values (ints: t->i, else t->f).
 * fb_tensor_dense2: a decoded tensor of n values (t->n, flat) becomes shape [rows, cols];
 * fb_tensor_csr: a decoded tensor holding the nnz values of a sparse CSR tensor becomes
 * the dense [rows, cols] tensor (missing entries 0), after checking crow (rows+1 entries,
 * from 0, non-decreasing, ending at nnz), col (nnz entries in [0, cols), no repeats in a
 * row). Both check 1 <= cols <= LIMIT_K, rows = n_tokens (the datum's input tokens) and
 * rows x cols <= *budget (what is left of the request's LIMIT_2D_VALUES), before they
 * allocate anything, and take rows x cols from *budget.
 * All return 0 or -1 with err. `in_key`/`where` name the place in the request. */
int fb_set_loss(fb_request *r, const char *in_key, const char *name, char *err, size_t errlen);
int fb_add_config(fb_request *r, size_t cap, const char *in_key, const char *key, double v,
                  char *err, size_t errlen);
int fb_check_float(float f, const char *where, const char *name, size_t k, char *err,
                   size_t errlen);
int fb_err_chunk_type(const char *where, size_t chunk, const char *type, char *err, size_t errlen);
int fb_check_n_data(const char *in_key, size_t n, char *err, size_t errlen);
void fb_tensor_alloc_1d(fb_tensor *t, size_t n, bool ints);
int fb_tensor_dense2(fb_tensor *t, const char *where, const char *name, int64_t rows, int64_t cols,
                     size_t n_tokens, size_t *budget, char *err, size_t errlen);
int fb_tensor_csr(fb_tensor *t, const char *where, const char *name, int64_t rows, int64_t cols,
                  size_t n_tokens, size_t *budget, const int64_t *crow, size_t n_crow,
                  const int64_t *col, size_t n_col, char *err, size_t errlen);

/* A ModelInput object ({"chunks": [...]}, text chunks only) as one token array (malloc'd,
 * also on error: free *tokens). `where` names mi in messages ("prompt"). 0 or -1. */
int fb_decode_model_input(const json_t *mi, const char *where, int64_t **tokens,
                          size_t *n_tokens, char *err, size_t errlen);

/* Checks against the base model and the loss's rules, with the checker the executor uses
 * too (contract/fb_check.h): seq_id range, at least one datum, the loss_fn_config, and every
 * datum. 0 or -1 with err. */
int fb_validate(const fb_request *r, int64_t vocab_size, int64_t max_context, char *err,
                size_t errlen);
