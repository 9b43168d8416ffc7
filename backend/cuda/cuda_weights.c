/* cuda_weights.c — bf16 base weights in one device allocation (see cuda_weights.h).
 *
 * BF16 tensors are copied as they are; F32 and F16 ones go up in chunks through a small
 * device staging buffer and are rounded there (lcu_convert, round to nearest even, as
 * st_f32_to_bf16); F64 ones are narrowed to F32 on the host first. Offsets are 256-byte
 * aligned, as cuBLASLt likes its operands.
 */
#include "backend/cuda/cuda_weights.h"
#include "backend/cuda/cuda_check.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

#define CW_STAGE_ELEMS ((size_t)16 << 20) /* 64 MiB of fp32 per staging chunk */

static size_t cw_align(size_t x) { return (x + 255) & ~(size_t)255; }

/* The tensors in the order of cu_layer_w / cu_weights, paired with their slots. A packed
 * tensor follows the previous one without alignment padding: a sparse layer's experts are
 * one block (cu_expert_w), their first gate in y->experts and no slot for the others; wk
 * and wv follow wq, and wup wgate, so that [Wq; Wk; Wv] and [Wgate; Wup] are one matrix
 * each, which one GEMM can take (cuda_layer.c cl_linear_packed: a decode pass with LCU_DECODE_FUSE=2). */
typedef struct {
    const st_tensor *t;
    lcu_bf16 **slot;
    bool packed;
} cw_item;

static int cw_items(cu_ctx *c, const model_files *m, cw_item *it)
{
    int n = 0;
    it[n++] = (cw_item){m->embed, &c->w.embed, false};
    it[n++] = (cw_item){m->final_norm, &c->w.final_norm, false};
    if (m->lm_head != m->embed) it[n++] = (cw_item){m->lm_head, &c->w.lm_head, false};
    for (int l = 0; l < c->cfg.num_hidden_layers; l++) {
        const model_layer_tensors *s = &m->layers[l];
        cu_layer_w *y = &c->w.layers[l];
        const st_tensor *src[] = {s->attn_norm, s->wq, s->wk, s->wv, s->wo, s->bq, s->bk, s->bv, s->bo,
                                  s->q_norm, s->k_norm, s->mlp_norm, s->wgate, s->wup, s->wdown};
        lcu_bf16 **dst[] = {&y->attn_norm, &y->wq, &y->wk, &y->wv, &y->wo, &y->bq, &y->bk, &y->bv, &y->bo,
                            &y->q_norm, &y->k_norm, &y->mlp_norm, &y->wgate, &y->wup, &y->wdown};
        for (size_t i = 0; i < sizeof src / sizeof src[0]; i++) {
            /* wk, wv right after wq; wup right after wgate (src order: 1 wq, 2 wk, 3 wv, 12 wgate, 13 wup) */
            bool packed = ((i == 2 || i == 3) && s->wq && s->wk) || (i == 13 && s->wgate);
            if (src[i]) it[n++] = (cw_item){src[i], dst[i], packed};
        }
        if (!s->router) continue;
        it[n++] = (cw_item){s->router, &y->router, false};
        for (int e = 0; e < c->cfg.num_experts; e++) {
            it[n++] = (cw_item){s->exp_gate[e], e ? NULL : &y->experts, e > 0};
            it[n++] = (cw_item){s->exp_up[e], NULL, true};
            it[n++] = (cw_item){s->exp_down[e], NULL, true};
        }
    }
    return n;
}

/* One tensor into its bf16 slot. stage: CW_STAGE_ELEMS floats on the device; host: the same
 * on the host (F64 only). */
static int cw_upload(cu_ctx *c, const st_tensor *t, lcu_bf16 *dst, void *stage, float *host, char *err,
                     size_t errlen)
{
    size_t n = (size_t)t->numel;
    if (t->dtype == ST_BF16) {
        CU_TRY(c, cudaMemcpyAsync(dst, t->data, n * 2, cudaMemcpyHostToDevice, c->stream));
        return 0;
    }
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_F64) {
        err_set(err, errlen, "cuda: tensor %s has dtype %s (need F32, BF16, F16 or F64)", t->name, st_dtype_name(t->dtype));
        return -1;
    }
    size_t es = st_dtype_size(t->dtype);
    for (size_t b = 0; b < n; b += CW_STAGE_ELEMS) {
        size_t k = n - b < CW_STAGE_ELEMS ? n - b : CW_STAGE_ELEMS;
        const void *src = t->data + b * es;
        lcu_dtype st = t->dtype == ST_F16 ? LCU_F16 : LCU_F32;
        if (t->dtype == ST_F64) { /* narrowed on the host (st_tensor_to_f32's rounding) */
            for (size_t i = 0; i < k; i++) {
                double d;
                memcpy(&d, (const uint8_t *)src + i * 8, 8);
                host[i] = (float)d;
            }
            src = host;
        }
        CU_TRY(c, cudaMemcpyAsync(stage, src, k * (t->dtype == ST_F64 ? 4 : es), cudaMemcpyHostToDevice, c->stream));
        CU_TRY(c, lcu_convert(dst + b, LCU_BF16, stage, st, k, c->stream));
        /* the staging buffer (and host) are reused by the next chunk */
        CU_TRY(c, cudaStreamSynchronize(c->stream));
    }
    return 0;
}

int cu_weights_load(cu_ctx *c, const model_files *m, char *err, size_t errlen)
{
    int L = c->cfg.num_hidden_layers;
    c->w.layers = calloc(L, sizeof *c->w.layers);
    cw_item *it = malloc(MODEL_MAX_TENSORS(&c->cfg) * sizeof *it);
    float *host = NULL;
    void *stage = NULL;
    int rc = -1;
    if (!c->w.layers || !it) { err_set(err, errlen, "cuda: out of host memory"); goto out; }
    int n = cw_items(c, m, it);
    size_t bytes = 0;
    bool f64 = false;
    for (int i = 0; i < n; i++) {
        if (!it[i].packed) bytes = cw_align(bytes);
        bytes += (size_t)it[i].t->numel * 2;
        f64 |= it[i].t->dtype == ST_F64;
    }
    bytes = cw_align(bytes);
    int e = (int)cudaMalloc(&c->w.mem, bytes);
    if (e) {
        c->w.mem = NULL;
        err_set(err, errlen, "cuda:%d: no room for the base weights (%.2f GiB bf16): %s", c->device,
                bytes / 1073741824.0, lcu_strerror(e));
        goto out;
    }
    c->w.bytes = bytes;
    e = (int)cudaMalloc(&stage, CW_STAGE_ELEMS * 4);
    if (e || (f64 && !(host = malloc(CW_STAGE_ELEMS * 4)))) {
        stage = e ? NULL : stage;
        err_set(err, errlen, "cuda:%d: out of memory for the weight staging buffer", c->device);
        goto out;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!it[i].packed) off = cw_align(off);
        lcu_bf16 *dst = (lcu_bf16 *)((char *)c->w.mem + off);
        if (it[i].slot) *it[i].slot = dst;
        off += (size_t)it[i].t->numel * 2;
        cu_where(c, "loading %s", it[i].t->name);
        if (cw_upload(c, it[i].t, dst, stage, host, err, errlen) < 0) {
            if (c->errmsg[0]) err_set(err, errlen, "%s", c->errmsg);
            goto out;
        }
    }
    if (m->lm_head == m->embed) c->w.lm_head = c->w.embed;
    if (cu_sync(c) < 0) { err_set(err, errlen, "%s", c->errmsg); goto out; }
    rc = 0;
out:
    if (stage) cudaFree(stage);
    free(host);
    free(it);
    return rc;
}

void cu_weights_free(cu_weights *w)
{
    if (w->mem) cudaFree(w->mem);
    free(w->layers);
    memset(w, 0, sizeof *w);
}
