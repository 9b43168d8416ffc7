/* api_proto.c: protobuf request decoding and result encoding (see api_proto.h).
 * Arrays on this wire are raw little-endian bytes; they are read and written byte by
 * byte so the code does not depend on the host's byte order. */
#include "service/api_proto.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "common/xalloc.h"
#include "core/api_call.h"
#include "service/proto/tinker_public.pb-c.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- little-endian arrays ------------------------------------------------------------ */

static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++, v >>= 8) p[i] = (uint8_t)v;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static bool utf8_ok(const char *s) { return utf8_valid(s, strlen(s)); }

/* ---- ForwardBackwardRequest -> fb_request --------------------------------------------- */

static int decode_text_chunks(const TinkerPublic__Datum *d, const char *where, fb_datum *out,
                              char *err, size_t errlen) {
    size_t total = 0;
    for (size_t c = 0; c < d->n_model_input; c++) {
        const TinkerPublic__Chunk *ch = d->model_input[c];
        if (ch->chunk_case != TINKER_PUBLIC__CHUNK__CHUNK_ENCODED_TEXT) {
            const char *t = ch->chunk_case == TINKER_PUBLIC__CHUNK__CHUNK_IMAGE ? "\"image\""
                            : ch->chunk_case == TINKER_PUBLIC__CHUNK__CHUNK_DMEL ? "\"dmel\""
                                                                                 : "(none)";
            return fb_err_chunk_type(where, c, t, err, errlen);
        }
        size_t n = ch->encoded_text->tokens.len;
        if (n % 4) {
            snprintf(err, errlen, "%s.chunks[%zu].tokens: %zu bytes is not a whole number of int32 "
                                  "token ids", where, c, n);
            return -1;
        }
        total += n / 4;
    }
    out->tokens = xcalloc(total, sizeof *out->tokens);
    out->n_tokens = total;
    size_t pos = 0;
    for (size_t c = 0; c < d->n_model_input; c++) {
        const ProtobufCBinaryData *b = &d->model_input[c]->encoded_text->tokens;
        for (size_t k = 0; k + 4 <= b->len; k += 4)
            out->tokens[pos++] = (int32_t)(uint32_t)get_le(b->data + k, 4);
    }
    return 0;
}

static const char *dtype_name(TinkerPublic__DType t) {
    switch (t) {
    case TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32: return "float32";
    case TINKER_PUBLIC__DTYPE__DTYPE_INT64: return "int64";
    case TINKER_PUBLIC__DTYPE__DTYPE_INT32: return "int32";
    case TINKER_PUBLIC__DTYPE__DTYPE_BFLOAT16: return "bfloat16";
    default: return "unspecified";
    }
}

/* An int64 LE byte array (CSR indices) as a malloc'd array. */
static int int64_bytes(const ProtobufCBinaryData *b, const char *where, const char *name,
                       const char *field, int64_t **out, size_t *n, char *err, size_t errlen) {
    *out = NULL;
    *n = 0;
    if (b->len % 8) {
        snprintf(err, errlen, "%s.%s (2-D sparse CSR): %s has %zu bytes, not a whole number of "
                              "int64 values", where, name, field, b->len);
        return -1;
    }
    *n = b->len / 8;
    *out = xcalloc(*n, sizeof **out);
    for (size_t k = 0; k < *n; k++) (*out)[k] = (int64_t)get_le(b->data + 8 * k, 8);
    return 0;
}

/* A Tensor as an int or float array: 1-D [N], or with allow_2d also [N, K] (dense
 * row-major or sparse CSR, densified), the same as the JSON TensorData (fwdbwd.c). */
static int decode_tensor(const TinkerPublic__Tensor *t, const char *where, const char *name,
                         bool is_int, bool allow_2d, size_t n_tokens, size_t *budget, fb_tensor *out,
                         char *err, size_t errlen) {
    bool sparse = t->encoding_case == TINKER_PUBLIC__TENSOR__ENCODING_SPARSE_CSR;
    if ((sparse || t->n_shape >= 2) && !allow_2d) return fb_err_two_d(where, name, err, errlen);
    if (t->n_shape > 2) {
        snprintf(err, errlen, "%s.%s.shape: %zu dimensions; loss inputs are 1-D [N] or 2-D [N, K]",
                 where, name, t->n_shape);
        return -1;
    }
    if (sparse && t->n_shape != 2) {
        snprintf(err, errlen, "%s.%s (2-D sparse CSR): shape [rows, cols] is required with "
                              "sparse_csr", where, name);
        return -1;
    }
    TinkerPublic__DType dt = t->dtype;
    if (dt == TINKER_PUBLIC__DTYPE__DTYPE_UNSPECIFIED)
        dt = is_int ? TINKER_PUBLIC__DTYPE__DTYPE_INT64 : TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32;
    int size = dt == TINKER_PUBLIC__DTYPE__DTYPE_INT64 ? 8
               : dt == TINKER_PUBLIC__DTYPE__DTYPE_INT32 || dt == TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32 ? 4
                                                                                              : 0;
    bool float_data = dt == TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32;
    if (!size || (is_int && float_data)) {
        snprintf(err, errlen, "%s.%s: dtype %s is not accepted here (send %s)", where, name,
                 dtype_name(t->dtype), is_int ? "int64 token ids" : "float32 values");
        return -1;
    }
    const ProtobufCBinaryData *b = NULL;
    if (t->encoding_case == TINKER_PUBLIC__TENSOR__ENCODING_DENSE) b = &t->dense;
    else if (sparse && t->sparse_csr) b = &t->sparse_csr->values;
    size_t bytes = b ? b->len : 0;
    if (bytes % (size_t)size) {
        snprintf(err, errlen, "%s.%s: %zu bytes is not a whole number of %s values", where, name,
                 bytes, dtype_name(dt));
        return -1;
    }
    size_t n = bytes / (size_t)size;
    if (t->n_shape == 1 && t->shape[0] != (int64_t)n) {
        snprintf(err, errlen, "%s.%s.shape does not match its data (%zu values): expected [%zu]",
                 where, name, n, n);
        return -1;
    }
    fb_tensor_alloc_1d(out, n, is_int);
    for (size_t k = 0; k < n; k++) {
        const uint8_t *p = b->data + k * (size_t)size;
        if (is_int) {
            out->i[k] = size == 8 ? (int64_t)get_le(p, 8) : (int32_t)(uint32_t)get_le(p, 4);
            continue;
        }
        float f = float_data ? f32_from_bits((uint32_t)get_le(p, 4))
                  : size == 8 ? (float)(int64_t)get_le(p, 8)
                              : (float)(int32_t)(uint32_t)get_le(p, 4);
        if (fb_check_float(f, where, name, k, err, errlen) < 0) return -1;
        out->f[k] = f;
    }
    if (sparse) {
        static const ProtobufCBinaryData none = {0, NULL};
        const TinkerPublic__SparseCsr *c = t->sparse_csr;
        int64_t *crow = NULL, *col = NULL;
        size_t n_crow = 0, n_col = 0;
        int rc = int64_bytes(c ? &c->crow_indices : &none, where, name, "crow_indices", &crow,
                             &n_crow, err, errlen);
        if (rc == 0)
            rc = int64_bytes(c ? &c->col_indices : &none, where, name, "col_indices", &col, &n_col,
                             err, errlen);
        if (rc == 0)
            rc = fb_tensor_csr(out, where, name, t->shape[0], t->shape[1], n_tokens, budget, crow,
                               n_crow, col, n_col, err, errlen);
        free(crow);
        free(col);
        return rc;
    }
    if (t->n_shape == 2)
        return fb_tensor_dense2(out, where, name, t->shape[0], t->shape[1], n_tokens, budget, err,
                                errlen);
    return 0;
}

static int decode_datum(const TinkerPublic__Datum *d, size_t i, loss_kind loss, size_t *budget,
                        fb_datum *out, char *err, size_t errlen) {
    char where[96];
    snprintf(where, sizeof where, "data[%zu].model_input", i);
    if (decode_text_chunks(d, where, out, err, errlen) < 0) return -1;
    snprintf(where, sizeof where, "data[%zu].loss_fn_inputs", i);
    unsigned accepted = loss_inputs_accepted(loss);
    for (size_t e = 0; e < d->n_loss_fn_inputs; e++) {
        const TinkerPublic__Datum__LossFnInputsEntry *in = d->loss_fn_inputs[e];
        for (int k = 0; k < LOSS_N_INPUTS; k++) {
            /* inputs this loss does not use are ignored, as on the JSON path */
            if (!(accepted & (1u << k)) || strcmp(in->key, loss_input_names[k]) != 0 || !in->value)
                continue;
            if (out->in[k].present) {
                snprintf(err, errlen, "%s.%s is given twice", where, loss_input_names[k]);
                return -1;
            }
            if (decode_tensor(in->value, where, loss_input_names[k], k == LOSS_IN_TARGET_TOKENS,
                              loss_input_two_d(loss, (loss_input)k), out->n_tokens, budget, &out->in[k],
                              err, errlen) < 0)
                return -1;
        }
    }
    return 0;
}

/* protobuf-c's unpacking allocates per message and per repeated field as it reads, so a
 * body of many tiny sub-messages (empty datums, empty chunks) would take many times its
 * size. Its allocations are counted against a budget proportional to the body. */
#define PROTO_UNPACK_FACTOR 8
#define PROTO_UNPACK_BASE (1u << 20)

typedef struct {
    size_t left;
    bool exceeded;
} unpack_budget;

static void *budget_alloc(void *data, size_t n) {
    unpack_budget *b = data;
    if (n > b->left) {
        b->exceeded = true;
        return NULL;
    }
    b->left -= n;
    return malloc(n);
}

static void budget_free(void *data, void *p) {
    (void)data;
    free(p);
}

size_t proto_decode_budget(size_t len) { return PROTO_UNPACK_BASE + PROTO_UNPACK_FACTOR * len; }

int proto_decode_fwdbwd(const uint8_t *buf, size_t len, fb_request *out, char *err,
                        size_t errlen) {
    memset(out, 0, sizeof *out);
    unpack_budget ub = {proto_decode_budget(len), false};
    ProtobufCAllocator alloc = {budget_alloc, budget_free, &ub};
    TinkerPublic__ForwardBackwardRequest *m =
        tinker_public__forward_backward_request__unpack(&alloc, len, buf);
    if (!m && ub.exceeded) {
        snprintf(err, errlen, "request body is too complex: its %zu bytes of protobuf hold so many "
                              "messages that decoding them would take more than %zu MiB (split "
                              "the request)", len, (PROTO_UNPACK_BASE + PROTO_UNPACK_FACTOR * len) >> 20);
        return -1;
    }
    if (!m) {
        snprintf(err, errlen, "request body is not a valid ForwardBackwardRequest protobuf "
                              "message (%zu bytes; Content-Type: application/x-protobuf)", len);
        return -1;
    }
    int rc = -1;
    out->forward_only = m->forward_only;
    const char *in_key = "forward_backward_request";
    if (!m->model_id || !*m->model_id) {
        snprintf(err, errlen, "model_id is required");
        goto out;
    }
    if (!utf8_ok(m->model_id) || (m->loss_fn && !utf8_ok(m->loss_fn))) {
        snprintf(err, errlen, "model_id and loss_fn must be valid UTF-8");
        goto out;
    }
    out->model_id = strdup(m->model_id);
    if (!out->model_id) abort();
    out->has_seq_id = m->seq_id != 0; /* 0 = unset (docs/protocol.md §14) */
    out->seq_id = m->seq_id;
    if (fb_set_loss(out, in_key, m->loss_fn && *m->loss_fn ? m->loss_fn : NULL, err, errlen) < 0)
        goto out;
    for (size_t i = 0; i < m->n_loss_fn_config; i++) {
        const char *key = m->loss_fn_config[i]->key;
        if (!utf8_ok(key)) {
            snprintf(err, errlen, "loss_fn_config keys must be valid UTF-8");
            goto out;
        }
        if (fb_add_config(out, m->n_loss_fn_config, in_key, key, m->loss_fn_config[i]->value, err,
                          errlen) < 0)
            goto out;
    }
    if (fb_check_n_data(in_key, m->n_data, err, errlen) < 0) goto out;
    out->data = xcalloc(m->n_data, sizeof *out->data);
    out->n_data = m->n_data;
    size_t budget = LIMIT_2D_VALUES;
    for (size_t i = 0; i < m->n_data; i++)
        if (decode_datum(m->data[i], i, out->loss, &budget, &out->data[i], err, errlen) < 0) goto out;
    rc = 0;
out:
    tinker_public__forward_backward_request__free_unpacked(m, &alloc);
    return rc;
}

/* ---- results -------------------------------------------------------------------------- */

int proto_accepted(const char *accept) {
    return accept && strcasestr(accept, "application/x-protobuf") != NULL;
}

static int shape_err(char *err, size_t errlen, const char *what) {
    snprintf(err, errlen, "stored result cannot be encoded as protobuf: %s", what);
    return -1;
}

typedef struct {
    TinkerPublic__ArrayRecord__FieldsEntry entry;
    TinkerPublic__BatchedTensor tensor;
    int64_t trailing[1];
} batched_field;

/* One output field (logprobs or elementwise_loss) of datums [from, from + nd), their
 * float32 values concatenated as the packed result holds them, with int64 byte offsets. */
static void batch_field(const fb_result_view *v, size_t from, size_t nd, bool logprobs, batched_field *f) {
    tinker_public__batched_tensor__init(&f->tensor);
    tinker_public__array_record__fields_entry__init(&f->entry);
    size_t total = 0, k = fb_result_datum(v, from).k;
    for (size_t d = from; d < from + nd; d++) {
        fb_output_packed o = fb_result_datum(v, d);
        total += logprobs ? o.n * o.k : o.n;
    }
    f->entry.key = logprobs ? "logprobs" : "elementwise_loss";
    f->entry.value = &f->tensor;
    f->tensor.dtype = TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32;
    if (logprobs && k > 1) {   /* [N, K] logprobs of a 2-D cross_entropy */
        f->trailing[0] = (int64_t)k;
        f->tensor.trailing_shape = f->trailing;
        f->tensor.n_trailing_shape = 1;
    }
    f->tensor.data.data = xcalloc(total, 4);
    f->tensor.data.len = total * 4;
    f->tensor.offsets.data = xcalloc(nd + 1, 8);
    f->tensor.offsets.len = (nd + 1) * 8;
    size_t pos = 0;
    for (size_t d = 0; d < nd; d++) {
        fb_output_packed o = fb_result_datum(v, from + d);
        size_t n = logprobs ? o.n * o.k : o.n;
        put_le(f->tensor.offsets.data + 8 * d, (uint64_t)pos, 8);
        memcpy(f->tensor.data.data + pos, logprobs ? o.logprobs : o.loss, 4 * n);
        pos += 4 * n;
    }
    put_le(f->tensor.offsets.data + 8 * nd, (uint64_t)pos, 8);
}

static void pack(const ProtobufCMessage *m, uint8_t **out, size_t *len) {
    size_t n = protobuf_c_message_get_packed_size(m);
    *out = malloc(n ? n : 1);
    if (!*out) abort();
    *len = protobuf_c_message_pack(m, *out);
}

/* Runs of datums with the same columns K go to one ArrayRecord each (the SDK rebuilds
 * each datum's shape from its BatchedTensor's trailing_shape, so datums of another K — 2-D
 * cross_entropy logprobs [N, K] — go to a record of their own). Fields in the JSON's
 * order: logprobs, elementwise_loss; metrics in the result's (jsonb's) order. */
void proto_encode_fb_result(const fb_result_view *v, uint8_t **out, size_t *len) {
    size_t nd = v->n_datums, nr = 0;
    TinkerPublic__ArrayRecord *recs = xcalloc(nd, sizeof *recs), **rp = xcalloc(nd, sizeof *rp);
    batched_field *fields = xcalloc(2 * nd, sizeof *fields);
    TinkerPublic__ArrayRecord__FieldsEntry **fp = xcalloc(2 * nd, sizeof *fp);
    for (size_t from = 0; from < nd;) {
        size_t to = from + 1, k = fb_result_datum(v, from).k;
        while (to < nd && fb_result_datum(v, to).k == k) to++;
        batched_field *f = &fields[2 * nr];
        batch_field(v, from, to - from, true, &f[0]);
        batch_field(v, from, to - from, false, &f[1]);
        fp[2 * nr] = &f[0].entry;
        fp[2 * nr + 1] = &f[1].entry;
        tinker_public__array_record__init(&recs[nr]);
        recs[nr].n_fields = 2;
        recs[nr].fields = &fp[2 * nr];
        recs[nr].num_datums = (int64_t)(to - from);
        rp[nr] = &recs[nr];
        nr++;
        from = to;
    }
    size_t nm = v->n_metrics;
    TinkerPublic__ForwardBackwardOutput__MetricsEntry *me = xcalloc(nm, sizeof *me), **mp = xcalloc(nm, sizeof *mp);
    fb_metric *keys = xcalloc(nm, sizeof *keys);
    for (size_t i = 0; i < nm; i++) {
        keys[i] = fb_result_metric(v, i);
        tinker_public__forward_backward_output__metrics_entry__init(&me[i]);
        me[i].key = keys[i].key;
        me[i].value = keys[i].value;
        mp[i] = &me[i];
    }
    TinkerPublic__ForwardBackwardOutput o = TINKER_PUBLIC__FORWARD_BACKWARD_OUTPUT__INIT;
    o.loss_fn_output_type = "ArrayRecord";
    o.n_loss_fn_outputs = nr;
    o.loss_fn_outputs = rp;
    o.n_metrics = nm;
    o.metrics = mp;
    pack(&o.base, out, len);
    for (size_t i = 0; i < 2 * nr; i++) {
        free(fields[i].tensor.data.data);
        free(fields[i].tensor.offsets.data);
    }
    free(fields);
    free(fp);
    free(recs);
    free(rp);
    free(me);
    free(mp);
    free(keys);
}

int proto_reply_fb_result(api_call *c, const uint8_t *bin, size_t len) {
    fb_result_view v;
    int rc = fb_result_open(&v, bin, len, c->err, sizeof c->err);
    if (rc < 0) {
        log_error("retrieve_future %s: %s", c->job->request_id, c->err);
        api_error(c, 500, "the stored result of %s cannot be read: %s", c->job->request_id, c->err);
    } else if (proto_accepted(c->job->accept)) {
        uint8_t *buf;
        size_t n;
        proto_encode_fb_result(&v, &buf, &n);
        api_reply_bytes(c, 200, "application/x-protobuf", buf, n);
    } else {
        size_t n;
        char *json = fb_result_json(&v, &n);
        api_reply_take(c, 200, json, n);
    }
    fb_result_close(&v);
    return 0;
}

/* A list of numbers (null -> NaN) as float32 LE bytes. */
static void f32_bytes(const json_t *list, ProtobufCBinaryData *b) {
    size_t n = json_array_size(list);
    b->data = xcalloc(n, 4);
    b->len = 4 * n;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(list, i);
        put_le(b->data + 4 * i, f32_bits(json_is_number(e) ? (float)json_number_value(e) : NAN), 4);
    }
}

/* A list of integers as int32 (width 4) or int64 (8) LE bytes. */
static void int_bytes(const json_t *list, int width, ProtobufCBinaryData *b) {
    size_t n = json_array_size(list);
    b->data = xcalloc(n, width);
    b->len = (size_t)width * n;
    for (size_t i = 0; i < n; i++)
        put_le(b->data + (size_t)width * i, (uint64_t)json_integer_value(json_array_get(list, i)), width);
}

/* Rows of [token_id, logprob] pairs (null = a row without any) as a TopkLogprobs: k = the
 * widest row, `length` rows of k slots row-major; an empty slot is (0, -99999.0), so that a
 * row whose first slot is empty reads back as null (the SDK's topk_to_lists). */
static void topk_message(const json_t *rows_j, TinkerPublic__TopkLogprobs *t) {
    tinker_public__topk_logprobs__init(t);
    size_t rows = json_array_size(rows_j), k = 1;
    for (size_t p = 0; p < rows; p++)
        if (json_array_size(json_array_get(rows_j, p)) > k) k = json_array_size(json_array_get(rows_j, p));
    t->k = (uint32_t)k;
    t->length = (uint32_t)rows;
    t->token_ids.data = xcalloc(rows * k, 4);
    t->token_ids.len = 4 * rows * k;
    t->logprobs.data = xcalloc(rows * k, 4);
    t->logprobs.len = 4 * rows * k;
    for (size_t p = 0; p < rows; p++) {
        const json_t *row = json_array_get(rows_j, p);
        for (size_t j = 0; j < k; j++) {
            const json_t *pair = json_array_get(row, j); /* NULL past the end / null row */
            size_t at = 4 * (p * k + j);
            bool have = json_is_array(pair) && json_array_size(pair) == 2;
            put_le(t->token_ids.data + at, have ? (uint32_t)json_integer_value(json_array_get(pair, 0)) : 0, 4);
            put_le(t->logprobs.data + at,
                   f32_bits(have ? (float)json_number_value(json_array_get(pair, 1)) : -99999.0f), 4);
        }
    }
}

static void topk_free(TinkerPublic__TopkLogprobs *t) {
    free(t->token_ids.data);
    free(t->logprobs.data);
}

/* A result TensorData ({"data", "dtype", "shape"}, sparse CSR when it has
 * sparse_crow_indices / sparse_col_indices) as a Tensor of dtype (FLOAT32 or INT32). */
static void tensor_message(const json_t *td, TinkerPublic__DType dtype, TinkerPublic__Tensor *t,
                           TinkerPublic__SparseCsr *csr) {
    tinker_public__tensor__init(t);
    tinker_public__sparse_csr__init(csr);
    const json_t *data = json_object_get(td, "data"), *shape = json_object_get(td, "shape");
    const json_t *crow = json_object_get(td, "sparse_crow_indices"), *col = json_object_get(td, "sparse_col_indices");
    t->dtype = dtype;
    t->n_shape = json_array_size(shape);
    t->shape = xcalloc(t->n_shape, sizeof *t->shape);
    for (size_t d = 0; d < t->n_shape; d++) t->shape[d] = json_integer_value(json_array_get(shape, d));
    ProtobufCBinaryData *values = &t->dense;
    if (json_is_array(crow) && json_is_array(col)) {
        t->encoding_case = TINKER_PUBLIC__TENSOR__ENCODING_SPARSE_CSR;
        t->sparse_csr = csr;
        int_bytes(crow, 8, &csr->crow_indices);
        int_bytes(col, 8, &csr->col_indices);
        values = &csr->values;
    } else {
        t->encoding_case = TINKER_PUBLIC__TENSOR__ENCODING_DENSE;
    }
    if (dtype == TINKER_PUBLIC__DTYPE__DTYPE_INT32) int_bytes(data, 4, values);
    else f32_bytes(data, values);
}

static void tensor_free(TinkerPublic__Tensor *t, TinkerPublic__SparseCsr *csr) {
    free(t->shape);
    free(t->dense.data);
    free(csr->values.data);
    free(csr->crow_indices.data);
    free(csr->col_indices.data);
}

int proto_encode_sample_response(const char *json, uint8_t **out, size_t *len, char *err,
                                 size_t errlen) {
    json_t *r = json_loads(json, 0, NULL);
    const json_t *seqs = json_object_get(r, "sequences");
    if (!json_is_object(r) || !json_is_array(seqs)) {
        json_decref(r);
        return shape_err(err, errlen, "no sequences list");
    }
    size_t ns = json_array_size(seqs);
    TinkerPublic__SampledSequence *ss = xcalloc(ns, sizeof *ss), **sp = xcalloc(ns, sizeof *sp);
    TinkerPublic__TopkLogprobs *stk = xcalloc(ns, sizeof *stk);
    for (size_t i = 0; i < ns; i++) {
        const json_t *s = json_array_get(seqs, i);
        const json_t *toks = json_object_get(s, "tokens");
        const json_t *lps = json_object_get(s, "logprobs");
        const char *stop = json_string_value(json_object_get(s, "stop_reason"));
        tinker_public__sampled_sequence__init(&ss[i]);
        sp[i] = &ss[i];
        ss[i].stop_reason = stop && !strcmp(stop, "length") ? TINKER_PUBLIC__STOP_REASON__STOP_REASON_LENGTH
                                                            : TINKER_PUBLIC__STOP_REASON__STOP_REASON_STOP;
        int_bytes(toks, 4, &ss[i].tokens);
        if (json_is_array(lps)) {
            ss[i]._logprobs_case = TINKER_PUBLIC__SAMPLED_SEQUENCE___LOGPROBS_LOGPROBS;
            f32_bytes(lps, &ss[i].logprobs);
        }
        const json_t *tk = json_object_get(s, "topk_logprobs");
        if (json_is_array(tk)) {
            topk_message(tk, &stk[i]);
            ss[i].topk_sampled_logprobs = &stk[i];
        }
    }
    TinkerPublic__SampleResponse o = TINKER_PUBLIC__SAMPLE_RESPONSE__INIT;
    o.n_sequences = ns;
    o.sequences = sp;
    o.prompt_cache_hit_tokens = (int32_t)json_integer_value(json_object_get(r, "prompt_cache_hit_tokens"));
    const json_t *plp = json_object_get(r, "prompt_logprobs");
    if (json_is_array(plp)) {
        o._prompt_logprobs_case = TINKER_PUBLIC__SAMPLE_RESPONSE___PROMPT_LOGPROBS_PROMPT_LOGPROBS;
        f32_bytes(plp, &o.prompt_logprobs); /* null at position 0 (and before prompt_logprobs_last_n) -> NaN */
    }
    TinkerPublic__TopkLogprobs topk = TINKER_PUBLIC__TOPK_LOGPROBS__INIT;
    const json_t *tk = json_object_get(r, "topk_prompt_logprobs");
    if (json_is_array(tk)) {
        topk_message(tk, &topk);
        o.topk_prompt_logprobs = &topk;
    }
    TinkerPublic__Tensor target, alt_t, alt_l;
    TinkerPublic__SparseCsr target_csr, alt_t_csr, alt_l_csr;
    TinkerPublic__PromptAltTokens alt = TINKER_PUBLIC__PROMPT_ALT_TOKENS__INIT;
    const json_t *tg = json_object_get(r, "target_prompt_logprobs"), *al = json_object_get(r, "prompt_alt_tokens");
    bool has_target = json_is_object(tg), has_alt = json_is_object(al);
    if (has_target) {
        tensor_message(tg, TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32, &target, &target_csr);
        o.target_prompt_logprobs = &target;
    }
    if (has_alt) {
        tensor_message(json_object_get(al, "tokens"), TINKER_PUBLIC__DTYPE__DTYPE_INT32, &alt_t, &alt_t_csr);
        tensor_message(json_object_get(al, "logprobs"), TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32, &alt_l, &alt_l_csr);
        alt.tokens = &alt_t;
        alt.logprobs = &alt_l;
        o.prompt_alt_tokens = &alt;
    }
    pack(&o.base, out, len);
    for (size_t i = 0; i < ns; i++) {
        free(ss[i].tokens.data);
        free(ss[i].logprobs.data);
        topk_free(&stk[i]);
    }
    free(ss);
    free(sp);
    free(stk);
    free(o.prompt_logprobs.data);
    topk_free(&topk);
    if (has_target) tensor_free(&target, &target_csr);
    if (has_alt) {
        tensor_free(&alt_t, &alt_t_csr);
        tensor_free(&alt_l, &alt_l_csr);
    }
    json_decref(r);
    (void)err;
    (void)errlen;
    return 0;
}
