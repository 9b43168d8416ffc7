/* cuda_buffers.c — the CUDA context's workspace (see cuda_buffers.h): the activation
 * arena, the per-call rows of a packed batch, segments, RoPE tables.
 *
 * The activation arena is ONE device allocation carved into the buffers of cu_act
 * (cu_act_carve, run once to size it and once to place it). It is replaced by a larger
 * one only when a batch needs more rows, sequences or the per-layer inputs than it has,
 * by 1.5× so that a slowly growing workload does not reallocate every call.
 */
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/cuda_check.h"
#include "common/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t cb_align(size_t x) { return (x + 255) & ~(size_t)255; }

int cu_buf_reserve(cu_buf *b, size_t bytes, bool host)
{
    if (bytes <= b->cap) return 0;
    size_t cap = b->cap + b->cap / 2 > bytes ? b->cap + b->cap / 2 : bytes;
    cu_buf_free(b);
    if (cudaMalloc(&b->dev, cap) != cudaSuccess) { b->dev = NULL; return -1; }
    if (host) {
        /* page-locked where the system grants it; pageable memory still works (slower) */
        b->pinned = cudaMallocHost(&b->host, cap) == cudaSuccess;
        if (!b->pinned) {
            cudaGetLastError();
            b->host = malloc(cap);
        }
        if (!b->host) { cu_buf_free(b); return -1; }
    }
    b->cap = cap;
    return 0;
}

void cu_buf_free(cu_buf *b)
{
    if (b->dev) cudaFree(b->dev);
    if (b->pinned) cudaFreeHost(b->host);
    else free(b->host);
    memset(b, 0, sizeof *b);
}

/* Places the buffers of cu_act for T rows and nseq sequences at base (NULL: sizes only);
 * returns the bytes. */
static size_t cu_act_carve(const cu_ctx *c, char *base, long T, int nseq, bool saved, cu_act *a)
{
    const model_config *mc = &c->cfg;
    size_t H = mc->hidden_size, I = mc->intermediate_size, nq = mc->num_attention_heads,
           nkv = mc->num_key_value_heads, qd = nq * mc->head_dim, kvd = nkv * mc->head_dim, t = (size_t)T;
    size_t off = 0, f = sizeof(float), b = sizeof(lcu_bf16);
#define CU_TAKE(ptr, bytes)                                     \
    do {                                                        \
        if (base) (ptr) = (void *)(base + off);                 \
        off += cb_align(bytes);                                 \
    } while (0)
    float **f_h[] = {&a->x, &a->xmid, &a->dx, &a->dxn, &a->dxf};
    lcu_bf16 **b_h[] = {&a->xn1, &a->xn2, &a->dyb};
    float **f_q[] = {&a->q_pre, &a->qf, &a->datt, &a->dq};
    lcu_bf16 **b_q[] = {&a->q, &a->att, &a->dattb, &a->dqb};
    float **f_kv[] = {&a->k_pre, &a->kf, &a->vf, &a->dk, &a->dv};
    lcu_bf16 **b_kv[] = {&a->k, &a->v, &a->dkb, &a->dvb};
    float **f_i[] = {&a->g, &a->u, &a->dh};
    lcu_bf16 **b_i[] = {&a->h, &a->dg, &a->du};
    for (int i = 0; i < 5; i++) CU_TAKE(*f_h[i], t * H * f);
    for (int i = 0; i < 3; i++) CU_TAKE(*b_h[i], t * H * b);
    for (int i = 0; i < 4; i++) CU_TAKE(*f_q[i], t * qd * f);
    for (int i = 0; i < 4; i++) CU_TAKE(*b_q[i], t * qd * b);
    for (int i = 0; i < 5; i++) CU_TAKE(*f_kv[i], t * kvd * f);
    for (int i = 0; i < 4; i++) CU_TAKE(*b_kv[i], t * kvd * b);
    for (int i = 0; i < 3; i++) CU_TAKE(*f_i[i], t * I * f);
    for (int i = 0; i < 3; i++) CU_TAKE(*b_i[i], t * I * b);
    CU_TAKE(a->rstd1, t * f);
    CU_TAKE(a->rstd2, t * f);
    CU_TAKE(a->rstd_f, t * f);
    CU_TAKE(a->rstd_q, t * nq * f);
    CU_TAKE(a->rstd_k, t * nkv * f);
    CU_TAKE(a->lse, t * nq * f);
    CU_TAKE(a->z, t * CU_LDZ * b);
    CU_TAKE(a->dz, t * CU_LDZ * b);
    if (mc->num_experts > 0) { /* sparse layers: the router's and the experts' rows */
        size_t E = mc->num_experts, A = t * mc->num_experts_per_tok, Im = mc->moe_intermediate_size, i4 = 4;
        CU_TAKE(a->r_prob, t * E * f);
        CU_TAKE(a->r_dlogits, t * E * b);
        CU_TAKE(a->r_sel, A * i4);
        CU_TAKE(a->a_pos, A * i4);
        CU_TAKE(a->a_tok, A * i4);
        CU_TAKE(a->r_w, A * f);
        CU_TAKE(a->r_dw, A * f);
        CU_TAKE(a->ex, A * H * b);
        CU_TAKE(a->edy, A * H * b);
        CU_TAKE(a->ey, A * H * f);
        CU_TAKE(a->edx, A * H * f);
        CU_TAKE(a->eg, A * Im * f);
        CU_TAKE(a->eu, A * Im * f);
        CU_TAKE(a->edh, A * Im * f);
        CU_TAKE(a->eh, A * Im * b);
        CU_TAKE(a->edg, A * Im * b);
        CU_TAKE(a->edu, A * Im * b);
        CU_TAKE(a->ez, A * CU_LDZ * b);
        CU_TAKE(a->edz, A * CU_LDZ * b);
    }
    lcu_attn_desc d = {.nseq = nseq, .total_q = T, .nq = (int)nq, .nkv = (int)nkv, .d = mc->head_dim};
    CU_TAKE(a->attn_ws, lcu_attn_workspace_bytes(&d));
    if (saved) CU_TAKE(a->saved, (size_t)mc->num_hidden_layers * t * H * f);
    else if (base) a->saved = NULL;
#undef CU_TAKE
    return off;
}

int cu_act_reserve(cu_ctx *c, long T, int nseq, bool saved, char *err, size_t errlen)
{
    if (T <= c->cap_T && nseq <= c->cap_seqs && (!saved || c->cap_saved)) return 0;
    long cap_T = c->cap_T * 3 / 2 > T ? c->cap_T * 3 / 2 : T;
    int cap_seqs = c->cap_seqs * 3 / 2 > nseq ? c->cap_seqs * 3 / 2 : nseq;
    if (cap_T < 64) cap_T = 64;
    if (cap_seqs < 16) cap_seqs = 16;
    saved = saved || c->cap_saved;
    cu_act a;
    size_t bytes = cu_act_carve(c, NULL, cap_T, cap_seqs, saved, &a);
    if (c->act_mem) cudaFree(c->act_mem);
    c->act_mem = NULL;
    c->cap_T = 0;
    c->cap_seqs = 0;
    c->cap_saved = false;
    int rc = (int)cudaMalloc(&c->act_mem, bytes);
    if (rc && c->keep.mem) { /* the kept activations' slots give way (the next pass re-takes what fits) */
        cudaGetLastError();
        cu_keep_release(c);
        rc = (int)cudaMalloc(&c->act_mem, bytes);
    }
    if (rc) {
        c->act_mem = NULL;
        cudaGetLastError(); /* out of memory is not sticky: clear it */
        size_t fr = 0, tot = 0;
        cu_mem_info(c, &fr, &tot);
        err_set(err, errlen, "cuda:%d: out of memory for a batch of %ld tokens (%.2f GiB of workspace%s; %.2f GiB free)",
                c->device, T, bytes / 1073741824.0, saved ? " with each layer's input kept for the backward" : "",
                fr / 1073741824.0);
        return -1;
    }
    if (c->cfg.num_experts > 0) { /* the host side of the sparse layers' grouping */
        size_t A = (size_t)cap_T * c->cfg.num_experts_per_tok;
        free(c->h_sel);
        free(c->h_apos);
        free(c->h_atok);
        free(c->h_off);
        c->h_sel = malloc(A * sizeof *c->h_sel);
        c->h_apos = malloc(A * sizeof *c->h_apos);
        c->h_atok = malloc(A * sizeof *c->h_atok);
        c->h_off = malloc((2 * (size_t)c->cfg.num_experts + 1) * sizeof *c->h_off);
        if (!c->h_sel || !c->h_apos || !c->h_atok || !c->h_off) {
            cudaFree(c->act_mem);
            c->act_mem = NULL;
            err_set(err, errlen, "cuda: out of host memory for the routing of %ld tokens", T);
            return -1;
        }
    }
    cu_act_carve(c, c->act_mem, cap_T, cap_seqs, saved, &c->a);
    c->cap_T = cap_T;
    c->cap_seqs = cap_seqs;
    c->cap_saved = saved;
    return 0;
}

/* Places one layer's kept activations for T rows at base (NULL: sizes only); the bytes. */
static size_t cu_keep_carve(const cu_ctx *c, char *base, long T, cu_act *k)
{
    const model_config *mc = &c->cfg;
    size_t H = mc->hidden_size, I = mc->intermediate_size, nq = mc->num_attention_heads,
           nkv = mc->num_key_value_heads, qd = nq * mc->head_dim, kvd = nkv * mc->head_dim, t = (size_t)T;
    size_t off = 0, f = sizeof(float), b = sizeof(lcu_bf16);
    memset(k, 0, sizeof *k);
#define CU_TAKE(ptr, bytes)                                     \
    do {                                                        \
        if (base) (ptr) = (void *)(base + off);                 \
        off += cb_align(bytes);                                 \
    } while (0)
    CU_TAKE(k->xn1, t * H * b);
    CU_TAKE(k->rstd1, t * f);
    if (mc->qk_norm) {
        CU_TAKE(k->q_pre, t * qd * f);
        CU_TAKE(k->k_pre, t * kvd * f);
    }
    CU_TAKE(k->rstd_q, t * nq * f);
    CU_TAKE(k->rstd_k, t * nkv * f);
    CU_TAKE(k->q, t * qd * b);
    CU_TAKE(k->k, t * kvd * b);
    CU_TAKE(k->v, t * kvd * b);
    CU_TAKE(k->att, t * qd * b);
    CU_TAKE(k->lse, t * nq * f);
    CU_TAKE(k->xmid, t * H * f);
    CU_TAKE(k->rstd2, t * f);
    CU_TAKE(k->xn2, t * H * b);
    CU_TAKE(k->g, t * I * f);
    CU_TAKE(k->u, t * I * f);
    CU_TAKE(k->h, t * I * b);
#undef CU_TAKE
    return off;
}

void cu_mem_info(const cu_ctx *c, size_t *fr, size_t *tot)
{
    *fr = *tot = 0;
    if (cudaMemGetInfo(fr, tot) != cudaSuccess) cudaGetLastError();
    if (c->mem_cap && c->mem_cap < *tot) *tot = c->mem_cap; /* free memory already lacks the held part */
}

/* What cuDNN's attention may still allocate for a batch of nseq sequences, the longest
 * max_len rows, on a device of tot bytes: its deterministic backward's dP, B·nq·S²·2 bytes
 * of the plan's bucket (backend/cuda/README.md), grown ×1.5, at most the quarter of the
 * device cuDNN may take; kept activations leave it free. */
static size_t cu_dnn_ws_estimate(const cu_ctx *c, int nseq, int max_len, size_t tot)
{
    if (!c->dnn) return 0;
    size_t B = 1, S = ((size_t)max_len + 127) / 128 * 128;
    while (B < (size_t)nseq) B <<= 1;
    size_t est = B * (size_t)c->cfg.num_attention_heads * S * S * 2 * 3 / 2;
    return est < tot / 4 ? est : tot / 4;
}

bool cu_keep_reserve(cu_ctx *c, long T, int nseq, int max_len)
{
    cu_keep *k = &c->keep;
    int L = c->cfg.num_hidden_layers;
    if (!k->wanted || c->cfg.num_experts > 0 || T <= 0) return false;
    if (T <= k->cap_T) return true;
    if (k->refused_T && T >= k->refused_T) return false;
    long cap_T = (T + 63) / 64 * 64;
    cu_act probe;
    size_t per = cu_keep_carve(c, NULL, cap_T, &probe), all = per * (size_t)L;
    if (k->mem) cudaFree(k->mem); /* before measuring: the old slots count as free */
    k->mem = NULL;
    k->cap_T = 0;
    k->nkept = 0;
    size_t fr = 0, tot = 0;
    cu_mem_info(c, &fr, &tot);
    size_t reserve = ((size_t)2 << 30) + tot / 20 + cu_dnn_ws_estimate(c, nseq, max_len, tot), limit = fr > reserve ? fr - reserve : 0;
    if (k->cap_bytes && k->cap_bytes < limit) limit = k->cap_bytes;
    /* as many layers as the limit holds (layers 0 .. n-1); the others recompute. Under a
     * quarter of them the gain is small and the slots would sit at the edge of the reserve
     * (what cuDNN's workspace may still take at that batch size): none then. */
    int n = per ? (int)(limit / per < (size_t)L ? limit / per : (size_t)L) : 0;
    if (n < L && n < (L + 3) / 4) n = 0;
    if (k->cap_layers && n > k->cap_layers) n = k->cap_layers;
    while (n > 0 && cudaMalloc(&k->mem, per * (size_t)n) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is not sticky */
        k->mem = NULL;
        n = n * 7 / 8; /* what cudaMemGetInfo said free was not all one allocation */
    }
    if (n > 0 && !k->slot) k->slot = calloc((size_t)L, sizeof *k->slot);
    if (n > 0 && !k->slot) {
        cudaFree(k->mem);
        k->mem = NULL;
        n = 0;
    }
    if (n == 0) {
        k->refused_T = k->refused_T && k->refused_T < T ? k->refused_T : T;
        fprintf(stderr, "loom cuda:%d: a batch of %ld tokens recomputes each layer in the backward: keeping its "
                "activations takes %.1f GiB (%.2f GiB a layer), %.1f GiB allowed (LCU_KEEP_MB, free memory less %.1f "
                "GiB), under a quarter of its layers\n", c->device, T, all / 1073741824.0, per / 1073741824.0,
                limit / 1073741824.0, reserve / 1073741824.0);
        return false;
    }
    if (n < L)
        fprintf(stderr, "loom cuda:%d: a batch of %ld tokens keeps the activations of %d of its %d layers (%.1f GiB; "
                "all would take %.1f GiB, %.1f GiB allowed: LCU_KEEP_MB, free memory less %.1f GiB%s); the other %d "
                "recompute in the backward\n", c->device, T, n, L, per * (double)n / 1073741824.0,
                all / 1073741824.0, limit / 1073741824.0, reserve / 1073741824.0,
                k->cap_layers && n == k->cap_layers ? "; LCU_KEEP_LAYERS" : "", L - n);
    for (int l = 0; l < n; l++) cu_keep_carve(c, (char *)k->mem + (size_t)l * per, cap_T, &k->slot[l]);
    k->cap_T = cap_T;
    k->nkept = n;
    return true;
}

void cu_keep_release(cu_ctx *c)
{
    cu_keep *k = &c->keep;
    if (k->mem) cudaFree(k->mem);
    k->mem = NULL;
    k->cap_T = 0;
    k->nkept = 0;
}

void cu_keep_bind(cu_ctx *c, int l)
{
    cu_keep *k = &c->keep;
    if (!k->bound) k->scratch = c->a;
    k->bound = true;
    const cu_act *s = &k->slot[l];
#define CU_BIND(f) c->a.f = s->f ? s->f : k->scratch.f;
    CU_KEPT_FIELDS(CU_BIND)
#undef CU_BIND
}

void cu_keep_unbind(cu_ctx *c)
{
    cu_keep *k = &c->keep;
    if (!k->bound) return;
#define CU_UNBIND(f) c->a.f = k->scratch.f;
    CU_KEPT_FIELDS(CU_UNBIND)
#undef CU_UNBIND
    k->bound = false;
}

int cu_rope_reserve(cu_ctx *c, int max_pos, char *err, size_t errlen)
{
    if (max_pos <= c->cap_pos) return 0;
    int cap = c->cap_pos * 3 / 2 > max_pos ? c->cap_pos * 3 / 2 : max_pos, half = c->cfg.head_dim / 2;
    if (cap < 64) cap = 64;
    size_t n = (size_t)cap * half;
    double *inv = malloc(half * sizeof *inv);
    float *hc = malloc(n * sizeof *hc), *hs = malloc(n * sizeof *hs);
    if (c->rope_cos) cudaFree(c->rope_cos);
    if (c->rope_sin) cudaFree(c->rope_sin);
    c->rope_cos = c->rope_sin = NULL;
    c->cap_pos = 0;
    int rc = !inv || !hc || !hs ? (int)cudaErrorMemoryAllocation : 0;
    if (!rc) rc = (int)cudaMalloc((void **)&c->rope_cos, n * sizeof(float));
    if (!rc) rc = (int)cudaMalloc((void **)&c->rope_sin, n * sizeof(float));
    if (!rc) {
        /* The CPU backend's tables (cpu_buffers.c), value for value: angles in double,
         * because pos·θ reaches 10⁴–10⁵ rad where fp32 would lose ~1e-3 rad. */
        model_rope_inv_freq(&c->cfg, inv);
        for (int pos = 0; pos < cap; pos++)
            for (int i = 0; i < half; i++) {
                double a = pos * inv[i];
                hc[(long)pos * half + i] = (float)cos(a);
                hs[(long)pos * half + i] = (float)sin(a);
            }
        /* on the context's stream: the kernels that read the tables run there, and a plain
         * cudaMemcpy on the legacy stream does not order with a non-blocking stream (from
         * pageable memory it may even return before its DMA lands). The host arrays may go
         * once the call returns: pageable copies are staged first. */
        rc = (int)cudaMemcpyAsync(c->rope_cos, hc, n * sizeof(float), cudaMemcpyHostToDevice, c->stream);
        if (!rc) rc = (int)cudaMemcpyAsync(c->rope_sin, hs, n * sizeof(float), cudaMemcpyHostToDevice, c->stream);
    }
    free(inv);
    free(hc);
    free(hs);
    if (rc) {
        cudaGetLastError();
        err_set(err, errlen, "cuda:%d: RoPE tables for %d positions: %s", c->device, cap, lcu_strerror(rc));
        return -1;
    }
    c->cap_pos = cap;
    return 0;
}

int cu_segs_reserve(cu_ctx *c, int nseq, char *err, size_t errlen)
{
    if (nseq <= c->cap_segs) return 0;
    int cap = nseq > 2 * c->cap_segs ? nseq : 2 * c->cap_segs;
    free(c->segs);
    free(c->lsegs);
    free(c->seq_index);
    c->segs = malloc(cap * sizeof *c->segs);
    c->lsegs = malloc((size_t)CU_LSEG_SETS * cap * sizeof *c->lsegs);
    c->seq_index = malloc(cap * sizeof *c->seq_index);
    c->cap_segs = c->segs && c->lsegs && c->seq_index ? cap : 0;
    if (c->cap_segs && c->cfg.num_experts > 0) { /* every segment in every expert's block */
        free(c->esegs);
        free(c->gitems);
        c->esegs = malloc((size_t)cap * c->cfg.num_experts * sizeof *c->esegs);
        c->gitems = malloc((size_t)c->cfg.num_experts * sizeof *c->gitems);
        c->cap_esegs = c->esegs && c->gitems ? cap * c->cfg.num_experts : 0;
        if (!c->cap_esegs) c->cap_segs = 0;
    }
    if (!c->cap_segs) { err_set(err, errlen, "cuda: out of host memory"); return -1; }
    return 0;
}

void cu_segs_add_group(cu_ctx *c, const cu_adapter *ad, long b, long e, bool grad, int group)
{
    if (!ad || b == e) return;
    cu_segment *last = c->nsegs ? &c->segs[c->nsegs - 1] : NULL;
    if (last && last->ad == ad && last->grad == grad && last->group == group && last->row_end == b) last->row_end = e;
    else c->segs[c->nsegs++] = (cu_segment){ad, b, e, grad, group};
}

int cu_meta_reserve(cu_ctx *c, long T, int nseq, long nnz, long ntopk, char *err, size_t errlen)
{
    cu_meta_layout *m = &c->ml;
    size_t off = 0, t = (size_t)T;
#define CU_AT(field, bytes) (m->field = off, off += cb_align(bytes))
    CU_AT(tokens, t * 4);
    CU_AT(pos, t * 4);
    CU_AT(row_seq, t * 4);
    CU_AT(q_start, ((size_t)nseq + 1) * 4);
    CU_AT(tgt_start, (t + 1) * 8);
    CU_AT(topk_start, (t + 1) * 8);
    CU_AT(targets, (size_t)nnz * 4);
    CU_AT(weights, (size_t)nnz * 4);
    CU_AT(sampler_lp, t * 4);
    CU_AT(adv, t * 4);
    CU_AT(loss_seqs, (size_t)nseq * sizeof(lcu_loss_seq));
    m->in_end = off;
    CU_AT(lp, (size_t)nnz * 4);
    CU_AT(loss, t * 4);
    CU_AT(topk_ids, (size_t)ntopk * 4);
    CU_AT(topk_lp, (size_t)ntopk * 4);
    m->out_end = off;
    CU_AT(lse, t * 8);
    m->total = off;
#undef CU_AT
    if (cu_buf_reserve(&c->meta, m->total, true) < 0) {
        cudaGetLastError();
        err_set(err, errlen, "cuda:%d: out of memory for the rows of a batch of %ld tokens", c->device, T);
        return -1;
    }
    return 0;
}

int cu_pack(cu_ctx *c, const be_seq *seqs, int nseq, bool any_grad)
{
    const cu_meta_layout *m = &c->ml;
    int32_t *tokens = cu_meta_host(c, m->tokens), *pos = cu_meta_host(c, m->pos), *row_seq = cu_meta_host(c, m->row_seq);
    int32_t *q_start = cu_meta_host(c, m->q_start), *targets = cu_meta_host(c, m->targets);
    int64_t *tgt_start = cu_meta_host(c, m->tgt_start), *topk_start = cu_meta_host(c, m->topk_start);
    float *weights = cu_meta_host(c, m->weights), *q = cu_meta_host(c, m->sampler_lp), *adv = cu_meta_host(c, m->adv);
    lcu_loss_seq *ls = cu_meta_host(c, m->loss_seqs);
    long row = 0, tg = 0, tk = 0;
    int np = 0;
    c->nsegs = 0;
    for (int i = 0; i < nseq; i++) {
        const be_seq *s = &seqs[i];
        if (s->n == 0) continue;
        const cu_adapter *ad = s->ad ? (const cu_adapter *)s->ad : NULL;
        bool grad = any_grad && ad && ad->pub.trainable && !s->forward_only;
        int K = s->k > 1 ? s->k : 1;
        c->seq_index[np] = i;
        q_start[np] = (int32_t)row;
        ls[np] = (lcu_loss_seq){(int)s->loss.kind, grad, s->loss.clip_low, s->loss.clip_high, s->loss.beta};
        for (int t = 0; t < s->n; t++, row++) {
            tokens[row] = s->tokens[t];
            pos[row] = t;
            row_seq[row] = np;
            q[row] = s->sampler_logprobs ? s->sampler_logprobs[t] : 0.0f;
            adv[row] = s->advantages ? s->advantages[t] : 0.0f;
            tgt_start[row] = tg;
            topk_start[row] = tk;
            for (int j = 0; j < K; j++, tg++) {
                targets[tg] = s->targets[(long)t * K + j];
                weights[tg] = s->weights ? s->weights[(long)t * K + j] : 1.0f;
            }
            tk += s->topk > 0 ? s->topk : 0;
        }
        cu_segs_add_group(c, ad, q_start[np], row, grad, s->group);
        np++;
    }
    q_start[np] = (int32_t)row;
    tgt_start[row] = tg;
    topk_start[row] = tk;
    c->nseq_packed = np;
    c->attn = (lcu_attn_desc){np, cu_meta_dev(c, m->q_start), NULL, NULL, row, c->cfg.num_attention_heads,
                              c->cfg.num_key_value_heads, c->cfg.head_dim, (float)(1.0 / sqrt((double)c->cfg.head_dim)), false};
    CU_TRY(c, cudaMemcpyAsync(c->meta.dev, c->meta.host, m->in_end, cudaMemcpyHostToDevice, c->stream));
    return 0;
}

void cu_buffers_free(cu_ctx *c)
{
    if (c->act_mem) cudaFree(c->act_mem);
    if (c->keep.mem) cudaFree(c->keep.mem);
    if (c->dgraph) cudaGraphExecDestroy(c->dgraph);
    free(c->keep.slot);
    if (c->rope_cos) cudaFree(c->rope_cos);
    if (c->rope_sin) cudaFree(c->rope_sin);
    if (c->logits) cudaFree(c->logits);
    if (c->dlogits) cudaFree(c->dlogits);
    cu_buf *bufs[] = {&c->meta, &c->kv, &c->smap, &c->sstep, &c->sws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cu_buf_free(bufs[i]);
    free(c->segs);
    free(c->lsegs);
    free(c->seq_index);
    free(c->esegs);
    free(c->gitems);
    free(c->h_sel);
    free(c->h_apos);
    free(c->h_atok);
    free(c->h_off);
}
