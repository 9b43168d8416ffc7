/* fwdbwd.c: forward / forward_backward requests: JSON decoding and validation
 * (see fwdbwd.h). Messages name the datum and field so a user can fix the call. */
#include "service/fwdbwd.h"
#include "common/xalloc.h"
#include "contract/fb_check.h"
#include "core/api_json.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIT(i) (1u << (i))

/* A shape [rows, cols] is checked before anything of its size is allocated: 1 <= cols <=
 * LIMIT_K (check_shape2), then, once the shape is known to fit its data or its CSR
 * indices, rows = the datum's input tokens and rows x cols within what is left of the
 * request's budget of 2-D values, which it then takes (take_shape2). A sparse CSR tensor
 * is the one input whose memory its shape alone decides. */
static int check_shape2(const char *where, const char *name, int64_t rows, int64_t cols,
                        char *err, size_t errlen) {
    if (rows < 0 || rows > INT32_MAX || cols < 1 || cols > LIMIT_K) {
        snprintf(err, errlen, "%s.%s.shape [%lld, %lld]: a 2-D loss input has shape [N, K] with N "
                              "the number of input tokens and 1 <= K <= %d", where, name,
                 (long long)rows, (long long)cols, LIMIT_K);
        return -1;
    }
    return 0;
}

static int take_shape2(const char *where, const char *name, int64_t rows, int64_t cols,
                       size_t n_tokens, size_t *budget, char *err, size_t errlen) {
    if ((size_t)rows != n_tokens) {
        snprintf(err, errlen, "%s.%s has shape [%lld, %lld] but the model input has %zu tokens "
                              "(shape [N, K] with N the number of input tokens)", where, name,
                 (long long)rows, (long long)cols, n_tokens);
        return -1;
    }
    size_t values = (size_t)rows * (size_t)cols;
    if (values > *budget) {
        snprintf(err, errlen, "%s.%s.shape [%lld, %lld]: the 2-D loss inputs of one request may "
                              "hold at most %d values in all; split the request", where, name,
                 (long long)rows, (long long)cols, LIMIT_2D_VALUES);
        return -1;
    }
    *budget -= values;
    return 0;
}

int fb_tensor_dense2(fb_tensor *t, const char *where, const char *name, int64_t rows, int64_t cols,
                     size_t n_tokens, size_t *budget, char *err, size_t errlen) {
    if (check_shape2(where, name, rows, cols, err, errlen) < 0) return -1;
    if ((uint64_t)rows * (uint64_t)cols != t->n) {
        snprintf(err, errlen, "%s.%s.shape [%lld, %lld] needs %llu values (row-major), data has "
                              "%zu", where, name, (long long)rows, (long long)cols,
                 (unsigned long long)((uint64_t)rows * (uint64_t)cols), t->n);
        return -1;
    }
    if (take_shape2(where, name, rows, cols, n_tokens, budget, err, errlen) < 0) return -1;
    t->n = (size_t)rows;
    t->k = (size_t)cols;
    t->dims = 2;
    return 0;
}

int fb_tensor_csr(fb_tensor *t, const char *where, const char *name, int64_t rows, int64_t cols,
                  size_t n_tokens, size_t *budget, const int64_t *crow, size_t n_crow,
                  const int64_t *col, size_t n_col, char *err, size_t errlen) {
    if (check_shape2(where, name, rows, cols, err, errlen) < 0) return -1;
    size_t nnz = t->n;
    if (n_crow != (size_t)rows + 1) {
        snprintf(err, errlen, "%s.%s (2-D sparse CSR): crow_indices has %zu entries, expected "
                              "rows + 1 = %lld", where, name, n_crow, (long long)rows + 1);
        return -1;
    }
    if (n_col != nnz) {
        snprintf(err, errlen, "%s.%s (2-D sparse CSR): col_indices has %zu entries but there are "
                              "%zu values", where, name, n_col, nnz);
        return -1;
    }
    if (crow[0] != 0 || crow[rows] != (int64_t)nnz) {
        snprintf(err, errlen, "%s.%s (2-D sparse CSR): crow_indices must start at 0 and end at "
                              "the number of values %zu (got %lld .. %lld)", where, name, nnz,
                 (long long)crow[0], (long long)crow[rows]);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++) {
        if (crow[r + 1] < crow[r]) {
            snprintf(err, errlen, "%s.%s (2-D sparse CSR): crow_indices must not decrease "
                                  "(entry %lld is %lld, entry %lld is %lld)", where, name,
                     (long long)r, (long long)crow[r], (long long)r + 1, (long long)crow[r + 1]);
            return -1;
        }
    }
    if (take_shape2(where, name, rows, cols, n_tokens, budget, err, errlen) < 0) return -1;
    size_t dense = (size_t)rows * (size_t)cols;
    int64_t *di = t->i ? xcalloc(dense, sizeof *di) : NULL;
    float *df = t->f ? xcalloc(dense, sizeof *df) : NULL;
    bool *seen = xcalloc((size_t)cols, sizeof *seen);
    int rc = 0;
    for (int64_t r = 0; r < rows && rc == 0; r++) {
        memset(seen, 0, (size_t)cols * sizeof *seen);
        for (int64_t q = crow[r]; q < crow[r + 1]; q++) {
            int64_t c = col[q];
            if (c < 0 || c >= cols) {
                snprintf(err, errlen, "%s.%s (2-D sparse CSR): col_indices[%lld] = %lld is outside "
                                      "[0, %lld)", where, name, (long long)q, (long long)c,
                         (long long)cols);
                rc = -1;
                break;
            }
            if (seen[c]) {
                snprintf(err, errlen, "%s.%s (2-D sparse CSR): column %lld appears twice in row "
                                      "%lld", where, name, (long long)c, (long long)r);
                rc = -1;
                break;
            }
            seen[c] = true;
            size_t at = (size_t)r * (size_t)cols + (size_t)c;
            if (di) di[at] = t->i[q];
            if (df) df[at] = t->f[q];
        }
    }
    free(seen);
    if (rc < 0) {
        free(di);
        free(df);
        return -1;
    }
    if (di) {
        free(t->i);
        t->i = di;
    }
    if (df) {
        free(t->f);
        t->f = df;
    }
    t->n = (size_t)rows;
    t->k = (size_t)cols;
    t->dims = 2;
    return 0;
}

#define two_d fb_err_two_d

int fb_check_float(float f, const char *where, const char *name, size_t k, char *err,
                   size_t errlen) {
    if (isfinite(f) && fabsf(f) < LIMIT_ABS) return 0;
    snprintf(err, errlen, "%s.%s.data[%zu]: %g is not a finite float32 below 1e18 in magnitude",
             where, name, k, (double)f);
    return -1;
}

int fb_set_loss(fb_request *r, const char *in_key, const char *name, char *err, size_t errlen) {
    if (!name && r->forward_only) name = "cross_entropy";
    if (!name) {
        snprintf(err, errlen, "%s.loss_fn is required (one of cross_entropy, importance_sampling, "
                              "ppo, cispo, dro)", in_key);
        return -1;
    }
    if (loss_kind_parse(name, &r->loss) < 0) {
        snprintf(err, errlen, "%s.loss_fn: unknown loss function \"%.64s\"; use one of "
                              "cross_entropy, importance_sampling, ppo, cispo, dro", in_key, name);
        return -1;
    }
    return 0;
}

int fb_add_config(fb_request *r, size_t cap, const char *in_key, const char *key, double v,
                  char *err, size_t errlen) {
    if (!(fabs(v) < LIMIT_ABS)) {
        snprintf(err, errlen, "%s.loss_fn_config.%.64s: %g is out of range (|x| < 1e18)", in_key,
                 key, v);
        return -1;
    }
    if (!r->config) r->config = xcalloc(cap, sizeof *r->config);
    r->config[r->n_config].key = xstrdup(key);
    r->config[r->n_config++].value = v;
    return 0;
}

/* A JSON list of integers as a malloc'd int64 array (for CSR indices). */
static int int_list(const json_t *v, const char *where, const char *name, const char *field,
                    int64_t **out, size_t *n, char *err, size_t errlen) {
    *out = NULL;
    *n = 0;
    if (!json_is_array(v)) {
        snprintf(err, errlen, "%s.%s.%s: expected an array of integers, got %s", where, name, field,
                 v ? jx_type_name(v) : "nothing");
        return -1;
    }
    *n = json_array_size(v);
    *out = xcalloc(*n, sizeof **out);
    for (size_t k = 0; k < *n; k++) {
        if (!jx_as_int(json_array_get(v, k), &(*out)[k])) {
            snprintf(err, errlen, "%s.%s.%s[%zu]: expected an integer, got %s", where, name, field,
                     k, jx_type_name(json_array_get(v, k)));
            return -1;
        }
    }
    return 0;
}

/* A TensorData ({"data", "dtype", "shape"}, optionally sparse CSR) or a bare list, as an
 * int or float array: 1-D [N], or with allow_2d also [N, K] (dense row-major or CSR,
 * densified). */
static int decode_tensor(const json_t *v, const char *where, const char *name, bool is_int,
                         bool allow_2d, size_t n_tokens, size_t *budget, fb_tensor *out, char *err,
                         size_t errlen) {
    const json_t *arr = v;
    bool sparse = false;
    int64_t dims[2] = {0, 0};
    size_t n_dims = 0; /* 0 = no shape given */
    const json_t *crow = NULL, *col = NULL;
    if (json_is_object(v)) {
        crow = json_object_get(v, "sparse_crow_indices");
        col = json_object_get(v, "sparse_col_indices");
        if (crow && json_is_null(crow)) crow = NULL;
        if (col && json_is_null(col)) col = NULL;
        sparse = crow || col;
        if (sparse && !allow_2d) return two_d(where, name, err, errlen);
        arr = json_object_get(v, "data");
        if (!arr || !json_is_array(arr)) {
            snprintf(err, errlen, "%s.%s.data: expected an array of numbers, got %s", where, name,
                     arr ? jx_type_name(arr) : "nothing");
            return -1;
        }
        const json_t *shape = json_object_get(v, "shape");
        if (shape && !json_is_null(shape)) {
            if (!json_is_array(shape)) {
                snprintf(err, errlen, "%s.%s.shape: expected an array of integers, got %s", where,
                         name, jx_type_name(shape));
                return -1;
            }
            n_dims = json_array_size(shape);
            if (n_dims >= 2 && !allow_2d) return two_d(where, name, err, errlen);
            if (n_dims > 2) {
                snprintf(err, errlen, "%s.%s.shape: %zu dimensions; loss inputs are 1-D [N] or "
                                      "2-D [N, K]", where, name, n_dims);
                return -1;
            }
            for (size_t d = 0; d < n_dims; d++) {
                if (!jx_as_int(json_array_get(shape, d), &dims[d])) {
                    snprintf(err, errlen, "%s.%s.shape[%zu]: expected an integer, got %s", where,
                             name, d, jx_type_name(json_array_get(shape, d)));
                    return -1;
                }
            }
            if (n_dims == 0 || (n_dims == 1 && !sparse && dims[0] != (int64_t)json_array_size(arr))) {
                snprintf(err, errlen, "%s.%s.shape does not match its data (%zu values): "
                                      "expected [%zu]", where, name, json_array_size(arr),
                         json_array_size(arr));
                return -1;
            }
        }
        if (sparse && n_dims != 2) {
            snprintf(err, errlen, "%s.%s (2-D sparse CSR): shape [rows, cols] is required with "
                                  "sparse_crow_indices / sparse_col_indices", where, name);
            return -1;
        }
    } else if (!json_is_array(v)) {
        snprintf(err, errlen, "%s.%s: expected a TensorData object {\"data\": [...], \"dtype\", "
                              "\"shape\"}, got %s", where, name, jx_type_name(v));
        return -1;
    }
    size_t n = json_array_size(arr);
    fb_tensor_alloc_1d(out, n, is_int);
    for (size_t k = 0; k < n; k++) {
        const json_t *e = json_array_get(arr, k);
        if (json_is_array(e)) {
            if (!allow_2d) return two_d(where, name, err, errlen);
            snprintf(err, errlen, "%s.%s.data[%zu]: expected a number; send 2-D inputs as a flat "
                                  "row-major list with \"shape\": [N, K]", where, name, k);
            return -1;
        }
        if (is_int) {
            if (!jx_as_int(e, &out->i[k])) {
                snprintf(err, errlen, "%s.%s.data[%zu]: expected an integer token id, got %s",
                         where, name, k, jx_type_name(e));
                return -1;
            }
        } else {
            if (!json_is_number(e)) {
                snprintf(err, errlen, "%s.%s.data[%zu]: expected a number, got %s", where, name, k,
                         jx_type_name(e));
                return -1;
            }
            float f = (float)json_number_value(e);
            if (fb_check_float(f, where, name, k, err, errlen) < 0) return -1;
            out->f[k] = f;
        }
    }
    if (sparse) {
        int64_t *ci = NULL, *cc = NULL;
        size_t nci = 0, ncc = 0;
        int rc = int_list(crow, where, name, "sparse_crow_indices", &ci, &nci, err, errlen);
        if (rc == 0) rc = int_list(col, where, name, "sparse_col_indices", &cc, &ncc, err, errlen);
        if (rc == 0)
            rc = fb_tensor_csr(out, where, name, dims[0], dims[1], n_tokens, budget, ci, nci, cc,
                               ncc, err, errlen);
        free(ci);
        free(cc);
        return rc;
    }
    if (n_dims == 2)
        return fb_tensor_dense2(out, where, name, dims[0], dims[1], n_tokens, budget, err, errlen);
    return 0;
}

void fb_tensor_alloc_1d(fb_tensor *t, size_t n, bool ints) {
    *t = (fb_tensor){.present = true, .n = n, .k = 1, .dims = 1};
    if (ints) t->i = xcalloc(n, sizeof *t->i);
    else t->f = xcalloc(n, sizeof *t->f);
}

int fb_check_n_data(const char *in_key, size_t n, char *err, size_t errlen) {
    if (n <= LIMIT_DATA) return 0;
    snprintf(err, errlen, "%s.data has %zu datums; one request takes at most %d (the SDK sends "
                          "at most 1024 per request)", in_key, n, LIMIT_DATA);
    return -1;
}

int fb_err_chunk_type(const char *where, size_t c, const char *type, char *err, size_t errlen) {
    snprintf(err, errlen, "%s.chunks[%zu]: only text chunks supported (type \"encoded_text\"), "
                          "got type %s", where, c, type);
    return -1;
}

int fb_decode_model_input(const json_t *mi, const char *w, int64_t **tokens, size_t *n_tokens,
                          char *err, size_t errlen) {
    json_t *chunks;
    *tokens = NULL;
    *n_tokens = 0;
    if (jx_arr(mi, w, "chunks", &chunks, err, errlen) < 0) return -1;
    if (!chunks) {
        snprintf(err, errlen, "%s.chunks is required", w);
        return -1;
    }
    size_t total = 0;
    for (size_t c = 0; c < json_array_size(chunks); c++) {
        const json_t *ch = json_array_get(chunks, c);
        if (!json_is_object(ch)) {
            snprintf(err, errlen, "%s.chunks[%zu]: expected an object, got %s", w, c,
                     jx_type_name(ch));
            return -1;
        }
        const json_t *type = json_object_get(ch, "type");
        if (type && !json_is_null(type) &&
            !(json_is_string(type) && !strcmp(json_string_value(type), "encoded_text"))) {
            char t[80];
            if (json_is_string(type)) snprintf(t, sizeof t, "\"%.64s\"", json_string_value(type));
            else snprintf(t, sizeof t, "%s", jx_type_name(type));
            return fb_err_chunk_type(w, c, t, err, errlen);
        }
        const json_t *toks = json_object_get(ch, "tokens");
        if (!toks || !json_is_array(toks)) {
            snprintf(err, errlen, "%s.chunks[%zu].tokens: expected an array of token ids, got %s",
                     w, c, toks ? jx_type_name(toks) : "nothing");
            return -1;
        }
        total += json_array_size(toks);
    }
    *tokens = xcalloc(total, sizeof **tokens);
    *n_tokens = total;
    size_t pos = 0;
    for (size_t c = 0; c < json_array_size(chunks); c++) {
        const json_t *toks = json_object_get(json_array_get(chunks, c), "tokens");
        for (size_t k = 0; k < json_array_size(toks); k++) {
            const json_t *e = json_array_get(toks, k);
            if (!jx_as_int(e, &(*tokens)[pos++])) {
                snprintf(err, errlen, "%s.chunks[%zu].tokens[%zu]: expected an integer token id, "
                                      "got %s", w, c, k, jx_type_name(e));
                return -1;
            }
        }
    }
    return 0;
}

static int decode_model_input(const json_t *d, const char *where, fb_datum *out, char *err,
                              size_t errlen) {
    json_t *mi;
    char w[160];
    if (jx_obj(d, where, "model_input", &mi, err, errlen) < 0) return -1;
    if (!mi) {
        snprintf(err, errlen, "%s.model_input is required", where);
        return -1;
    }
    snprintf(w, sizeof w, "%s.model_input", where);
    return fb_decode_model_input(mi, w, &out->tokens, &out->n_tokens, err, errlen);
}

static int decode_datum(const json_t *d, const char *where, loss_kind loss, size_t *budget,
                        fb_datum *out, char *err, size_t errlen) {
    if (!json_is_object(d)) {
        snprintf(err, errlen, "%s: expected a Datum object {\"model_input\", \"loss_fn_inputs\"}, "
                              "got %s", where, jx_type_name(d));
        return -1;
    }
    if (decode_model_input(d, where, out, err, errlen) < 0) return -1;
    json_t *lfi;
    if (jx_obj(d, where, "loss_fn_inputs", &lfi, err, errlen) < 0) return -1;
    if (!lfi) return 0;
    char w[160];
    snprintf(w, sizeof w, "%s.loss_fn_inputs", where);
    unsigned accepted = loss_inputs_accepted(loss);
    for (int k = 0; k < LOSS_N_INPUTS; k++) {
        if (!(accepted & BIT(k))) continue;  /* inputs this loss does not use are ignored */
        const json_t *v = json_object_get(lfi, loss_input_names[k]);
        if (!v || json_is_null(v)) continue;
        if (decode_tensor(v, w, loss_input_names[k], k == LOSS_IN_TARGET_TOKENS,
                          loss_input_two_d(loss, (loss_input)k), out->n_tokens, budget, &out->in[k], err,
                          errlen) < 0)
            return -1;
    }
    return 0;
}

int fb_decode_json(const json_t *body, bool forward_only, fb_request *out, char *err,
                   size_t errlen) {
    memset(out, 0, sizeof *out);
    out->forward_only = forward_only;
    const char *in_key = forward_only ? "forward_input" : "forward_backward_input";
    const char *model_id, *loss_name;
    json_t *input, *config, *data;
    if (jx_req_str(body, "", "model_id", &model_id, err, errlen) < 0) return -1;
    out->model_id = xstrdup(model_id);
    if (jx_int(body, "", "seq_id", 0, &out->seq_id, &out->has_seq_id, err, errlen) < 0) return -1;
    if (jx_obj(body, "", in_key, &input, err, errlen) < 0) return -1;
    if (!input) {
        snprintf(err, errlen, "%s is required (an object with \"data\" and \"loss_fn\")", in_key);
        return -1;
    }
    if (jx_str(input, in_key, "loss_fn", &loss_name, err, errlen) < 0 ||
        fb_set_loss(out, in_key, loss_name, err, errlen) < 0)
        return -1;

    if (jx_obj(input, in_key, "loss_fn_config", &config, err, errlen) < 0) return -1;
    if (config) {
        const char *key;
        json_t *v;
        json_object_foreach(config, key, v) {
            if (json_is_null(v)) continue;
            if (!json_is_number(v)) {
                snprintf(err, errlen, "%s.loss_fn_config.%.64s: expected a number, got %s", in_key,
                         key, jx_type_name(v));
                return -1;
            }
            if (fb_add_config(out, json_object_size(config), in_key, key, json_number_value(v), err,
                              errlen) < 0)
                return -1;
        }
    }

    if (jx_arr(input, in_key, "data", &data, err, errlen) < 0) return -1;
    if (!data) {
        snprintf(err, errlen, "%s.data is required (a list of Datum)", in_key);
        return -1;
    }
    if (fb_check_n_data(in_key, json_array_size(data), err, errlen) < 0) return -1;
    out->data = xcalloc(json_array_size(data), sizeof *out->data);
    out->n_data = json_array_size(data);
    size_t budget = LIMIT_2D_VALUES;
    for (size_t i = 0; i < out->n_data; i++) {
        char where[96];
        snprintf(where, sizeof where, "%s.data[%zu]", in_key, i);
        if (decode_datum(json_array_get(data, i), where, out->loss, &budget, &out->data[i], err,
                         errlen) < 0)
            return -1;
    }
    return 0;
}

int fb_validate(const fb_request *r, int64_t vocab_size, int64_t max_context, char *err,
                size_t errlen) {
    const char *in_key = r->forward_only ? "forward_input" : "forward_backward_input";
    if (r->has_seq_id && (r->seq_id < 1 || r->seq_id > INT32_MAX)) {
        snprintf(err, errlen, "seq_id %lld is out of range: operations of a model are numbered "
                              "from 1 (0 is its create_model)", (long long)r->seq_id);
        return -1;
    }
    if (r->n_data == 0) {
        snprintf(err, errlen, "%s.data is empty: send at least one datum", in_key);
        return -1;
    }
    loss_spec ls = fb_request_loss(r);
    if (fb_check_loss(&ls, in_key, err, errlen) < 0) return -1;
    fb_check_model m = {.vocab_size = vocab_size, .max_context = max_context};
    for (size_t i = 0; i < r->n_data; i++) {
        const fb_datum *d = &r->data[i];
        fb_view v = {.n_tokens = d->n_tokens, .tokens = d->tokens,
                            .targets = d->in[LOSS_IN_TARGET_TOKENS].i};
        for (int k = 0; k < LOSS_N_INPUTS; k++) {
            const fb_tensor *t = &d->in[k];
            v.in[k] = (fb_view_input){.present = t->present, .dims = t->dims, .cols = t->k,
                                       .values = t->n * t->k};
        }
        char where[96];
        snprintf(where, sizeof where, "%s.data[%zu]", in_key, i);
        if (fb_check_datum(&m, r->loss, &v, where, err, errlen) < 0) return -1;
    }
    return 0;
}

