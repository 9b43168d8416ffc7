/* cuda_layer.c — one decoder layer (Llama / Qwen2 / Qwen3) over the packed batch, forward
 * and backward, with each segment's LoRA on the adapted projections; the structure of the
 * CPU backend's cpu_layer.c, step for step, with the kernel layer's dtypes (cuda_ops.h):
 *
 *   xn1 = rmsnorm(x) → bf16                q,k,v = xn1 W{q,k,v}ᵀ (+b) + LoRA   (fp32)
 *   [qwen3] q,k = rmsnorm_per_head(q,k)    q,k = rope(q,k) → bf16, v → bf16
 *   att = causal_gqa(q,k,v) → bf16         xmid = x + att Woᵀ (+b) + LoRA      (fp32)
 *   xn2 = rmsnorm(xmid) → bf16             g,u = xn2 W{gate,up}ᵀ + LoRA        (fp32)
 *   h = silu(g)·u → bf16                   x' = xmid + h Wdownᵀ + LoRA         (fp32)
 *
 * A sparse layer of a Qwen3-MoE model replaces the MLP by its router and experts
 * (cuda_moe.c): x' = xmid + moe(xn2).
 *
 * The attention is cuDNN's fused attention where libcudnn loads, else (or with LCU_ATTN=wmma
 * or mma) the kernel layer's own (lcu_attn_*); cl_attn_fwd/bwd choose per call, and the
 * KV-cache decode always runs the own kernels.
 *
 * The residual adds ride in the GEMMs' epilogue (beta = 1 with C = the residual). Base
 * weights are frozen: the backward produces activation gradients and LoRA gradients only,
 * the activation gradients in fp32 and rounded to bf16 where a GEMM reads them.
 */
#include "backend/cuda/cuda_layer.h"
#include "backend/cuda/cuda_adapter.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_prof.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- LoRA ---------------------------------------------------------------------------- */

int cu_lora_segs(cu_ctx *c, int l, lora_module mod, long r0, long r1, bool grad_only)
{
    return cu_lora_segs_set(c, 0, l, mod, r0, r1, grad_only);
}

int cu_lora_segs_set(cu_ctx *c, int set, int l, lora_module mod, long r0, long r1, bool grad_only)
{
    lcu_lora_seg *out = c->lsegs + (size_t)set * c->cap_segs;
    int n = 0;
    for (int s = 0; s < c->nsegs; s++) {
        const cu_segment *sg = &c->segs[s];
        const cu_lora_pair *p = l < 0 ? cu_adapter_head(sg->ad) : cu_adapter_module(sg->ad, l, mod);
        long b = sg->row_begin > r0 ? sg->row_begin : r0, e = sg->row_end < r1 ? sg->row_end : r1;
        if (!p || b >= e || (grad_only && !sg->grad)) continue;
        out[n++] = (lcu_lora_seg){b - r0, e - r0, p->rank, sg->ad->scale, p->A, p->B, p->gA, p->gB};
    }
    return n;
}

/* The decode profile's names of each module's three operations (cu_mark), by lora_module. */
static const char *const cl_gemm_op[LORA_NUM_MODULES] = {"q gemm", "k gemm", "v gemm", "o gemm", "gate gemm",
                                                         "up gemm", "down gemm"};
static const char *const cl_bias_op[LORA_NUM_MODULES] = {"q bias", "k bias", "v bias", "o bias", "gate bias",
                                                         "up bias", "down bias"};
static const char *const cl_lora_op[LORA_NUM_MODULES] = {"q lora", "k lora", "v lora", "o lora", "gate lora",
                                                         "up lora", "down lora"};
/* ... and of the backward's (LCU_TRAIN_PROFILE) */
static const char *const cl_gemm_bop[LORA_NUM_MODULES] = {"q bwd gemm", "k bwd gemm", "v bwd gemm", "o bwd gemm",
                                                          "gate bwd gemm", "up bwd gemm", "down bwd gemm"};
static const char *const cl_lora_bop[LORA_NUM_MODULES] = {"q bwd lora", "k bwd lora", "v bwd lora", "o bwd lora",
                                                          "gate bwd lora", "up bwd lora", "down bwd lora"};

/* y[T, out] (row stride ldy) += the module's LoRA of x over its segments' rows. */
static int cl_lora_fwd(cu_ctx *c, int l, lora_module mod, const lcu_bf16 *x, int in, int out, float *y, long ldy,
                       long T)
{
    int n = cu_lora_segs(c, l, mod, 0, T, false);
    if (n) {
        CU_TRY(c, lcu_lora_fwd(c->lcu, c->lsegs, n, in, out, x, in, y, ldy, c->a.z, CU_LDZ, c->stream));
        cu_mark(c, cl_lora_op[mod]);
    }
    return 0;
}

/* LCU_DECODE_SIDE (c->side; decode passes, not under the per-operation profile, whose
 * events between operations on c->stream are what it measures): a projection's LoRA
 * shrinks (z = x Aᵀ, where version 3 takes every module: several adapters) run on c->side,
 * with c->lcu_side (its own cuBLASLt workspace and split-K scratch), beside the base GEMM
 * on c->stream; the expands follow the GEMM on c->stream once the shrinks are done. A
 * decode GEMM of 32 rows keeps a few dozen of the SMs busy, and the shrinks' launches and
 * latency were on the step's critical path (bench/cuda/NOTES.md, "Where the next speed
 * is"). The same kernels with the same arguments in the same order on each stream as
 * lcu_lora_fwd_multi after the GEMM: the same bits. The fork waits for everything queued on
 * c->stream so far, the previous projection's expands (they read z) included; a decode
 * graph captures the fork and the join as two branches. */
static bool cl_side_on(const cu_ctx *c) { return c->side && c->kv_mode == CU_KV_DECODE && !c->dops; }

static int cl_side_fork(cu_ctx *c, const lcu_lora_mod *lm, int nmod, int in, const lcu_bf16 *x, float *y, long ldy)
{
    CU_TRY(c, cudaEventRecord(c->side_fork, c->stream));
    CU_TRY(c, cudaStreamWaitEvent(c->side, c->side_fork, 0));
    CU_TRY(c, lcu_lora_fwd_multi_part(c->lcu_side, true, lm, nmod, in, x, in, y, ldy, c->a.z, CU_LDZ, c->side));
    CU_TRY(c, cudaEventRecord(c->side_join, c->side));
    return 0;
}

static int cl_side_join(cu_ctx *c, const lcu_lora_mod *lm, int nmod, int in, const lcu_bf16 *x, float *y, long ldy,
                        const char *what)
{
    CU_TRY(c, cudaStreamWaitEvent(c->stream, c->side_join, 0));
    CU_TRY(c, lcu_lora_fwd_multi_part(c->lcu, false, lm, nmod, in, x, in, y, ldy, c->a.z, CU_LDZ, c->stream));
    cu_mark(c, what);
    return 0;
}

/* y = x Wᵀ (+ bias) (+ resid) + LoRA over T rows: one adapted nn.Linear. With LCU_LORA_FIRST
 * (c->lora_first), where lcu_lora_fwd_into takes the segments (they cover every row; LoRA
 * version 1, or version 3 for the projections without a residual), the LoRA goes first
 * and writes y (= LoRA + resid), and the base GEMM adds into it in its epilogue (beta 1):
 * the output is written once by each instead of the LoRA reading and writing it again after
 * the GEMM (at 4,096 rows of Qwen3-8B's gate, 403 MB of fp32 traffic against 201). The sum's
 * order differs ((LoRA + resid) + base), so not bitwise the default's. */
static int cl_linear(cu_ctx *c, int l, lora_module mod, const lcu_bf16 *x, int in, const lcu_bf16 *W,
                     const lcu_bf16 *bias, int out, const float *resid, float *y, long T)
{
    int n = c->lora_first ? cu_lora_segs(c, l, mod, 0, T, false) : 0;
    int rc = n ? lcu_lora_fwd_into(c->lcu, c->lsegs, n, T, in, out, x, in, resid, out, y, out, c->a.z, CU_LDZ,
                                   c->stream)
               : LCU_ENOTSUP;
    if (rc != LCU_ENOTSUP) { /* else these segments go after the GEMM, below */
        CU_TRY(c, rc);
        cu_mark(c, cl_lora_op[mod]);
        lcu_gemm_args g = {false, true, (int)T, out, in, 1.0f, 1.0f, x, in, W, in, NULL, 0, y, out, LCU_F32};
        CU_TRY(c, lcu_gemm(c->lcu, &g, c->stream));
        cu_mark(c, cl_gemm_op[mod]);
        if (bias) {
            CU_TRY(c, lcu_add_bias(y, bias, T, out, c->stream));
            cu_mark(c, cl_bias_op[mod]);
        }
        return 0;
    }
    lcu_lora_mod side = {c->lsegs, cl_side_on(c) ? cu_lora_segs(c, l, mod, 0, T, false) : 0, out, 0, 0};
    bool on_side = side.nseg > 0 && lcu_lora_fwd_multi_splits(&side, 1);
    if (on_side && cl_side_fork(c, &side, 1, in, x, y, out) < 0) return -1;
    lcu_gemm_args g = {false, true, (int)T, out, in, 1.0f, resid ? 1.0f : 0.0f, x, in, W, in, resid, out, y, out,
                       LCU_F32};
    CU_TRY(c, lcu_gemm(c->lcu, &g, c->stream));
    cu_mark(c, cl_gemm_op[mod]);
    if (bias) {
        CU_TRY(c, lcu_add_bias(y, bias, T, out, c->stream));
        cu_mark(c, cl_bias_op[mod]);
    }
    if (on_side) return cl_side_join(c, &side, 1, in, x, y, out, cl_lora_op[mod]);
    return cl_lora_fwd(c, l, mod, x, in, out, y, out, T);
}

/* LCU_DECODE_FUSE=2, a decode pass of a dense layer: one GEMM for [Wq; Wk; Wv] and one for
 * [Wgate; Wup], packed that way by cuda_weights.c, each module's LoRA then added into its
 * columns. Their output goes to a->g (free until the MLP, and again after the GEMM's
 * SwiGLU) when it holds the rows; biases (Qwen2) keep the separate GEMMs. A GEMM of other
 * columns may take another cuBLASLt algorithm: unlike level 1, not bitwise the separate
 * GEMMs' values (the checks hold it to the forward's within bf16 noise). */
static bool cl_qkv_one(const cu_ctx *c, const cu_layer_w *w, long T)
{
    const model_config *mc = &c->cfg;
    size_t H = mc->hidden_size, qd = (size_t)mc->num_attention_heads * mc->head_dim,
           kvd = (size_t)mc->num_key_value_heads * mc->head_dim;
    return c->kv_mode == CU_KV_DECODE && c->dfuse >= 2 && mc->num_experts == 0 && !w->bq && !w->bk && !w->bv &&
           w->wk == w->wq + qd * H && w->wv == w->wk + kvd * H &&
           (size_t)T * (qd + 2 * kvd) <= (size_t)c->cap_T * mc->intermediate_size;
}

static bool cl_gate_up_one(const cu_ctx *c, const cu_layer_w *w, long T)
{
    const model_config *mc = &c->cfg;
    size_t H = mc->hidden_size, I = mc->intermediate_size;
    return c->kv_mode == CU_KV_DECODE && c->dfuse >= 2 && !w->router && w->wgate && w->wup == w->wgate + I * H &&
           2 * T <= c->cap_T;
}

/* y[T, out0 + out1 (+ out2)] with row stride ldy = x · [W0; W1 (; W2)]ᵀ: one GEMM over the
 * packed weights, then the modules' LoRA into their columns, together (lcu_lora_fwd_multi:
 * one launch per product where version 3 runs them, not one per module; each module's z in
 * its own columns of c->a.z) when their ranks fit CU_LDZ side by side, else one by one. */
static int cl_linear_packed(cu_ctx *c, int l, const lora_module *mods, const int *outs, int nmod, const lcu_bf16 *x,
                            int in, const lcu_bf16 *W, float *y, long ldy, long T, const char *what,
                            const char *lora_what)
{
    /* the modules' segments first (host lists only: the GEMM does not depend on them), so
     * that LCU_DECODE_SIDE's shrinks can start beside the GEMM */
    lcu_lora_mod lm[CU_LSEG_SETS];
    long zcol = 0, col = 0;
    int any = 0;
    for (int m = 0; m < nmod && m < CU_LSEG_SETS; col += outs[m++]) {
        int n = cu_lora_segs_set(c, m, l, mods[m], 0, T, false), rank = 0;
        const lcu_lora_seg *sg = c->lsegs + (size_t)m * c->cap_segs;
        for (int i = 0; i < n; i++) rank = sg[i].rank > rank ? sg[i].rank : rank;
        lm[m] = (lcu_lora_mod){sg, n, outs[m], col, zcol};
        zcol += lcu_lora_ldz(rank); /* 16-byte aligned columns */
        any |= n > 0;
    }
    bool together = nmod <= CU_LSEG_SETS && zcol <= CU_LDZ;
    bool on_side = together && any && cl_side_on(c) && lcu_lora_fwd_multi_splits(lm, nmod);
    if (on_side && cl_side_fork(c, lm, nmod, in, x, y, ldy) < 0) return -1;
    lcu_gemm_args g = {false, true, (int)T, (int)ldy, in, 1.0f, 0.0f, x, in, W, in, NULL, 0, y, ldy, LCU_F32};
    CU_TRY(c, lcu_gemm(c->lcu, &g, c->stream));
    cu_mark(c, what);
    if (on_side) return cl_side_join(c, lm, nmod, in, x, y, ldy, lora_what);
    if (together) {
        if (any) {
            CU_TRY(c, lcu_lora_fwd_multi(c->lcu, lm, nmod, in, x, in, y, ldy, c->a.z, CU_LDZ, c->stream));
            cu_mark(c, lora_what);
        }
        return 0;
    }
    for (int m = 0, col2 = 0; m < nmod; col2 += outs[m++])
        if (cl_lora_fwd(c, l, mods[m], x, in, outs[m], y + col2, ldy, T) < 0) return -1;
    return 0;
}

/* dx[T, in] (= or += when acc) dy[T, out] · W[out, in], then the module's LoRA backward
 * (dx += ..., gradients of the segments that carry one). dx NULL: only the gradients. */
static int cl_linear_bwd(cu_ctx *c, int l, lora_module mod, const lcu_bf16 *x, int in, const lcu_bf16 *W, int out,
                         const lcu_bf16 *dy, float *dx, bool acc, long T)
{
    /* LCU_LORA_FIRST: the LoRA's part of dx written first (its gradients as ever), the base
     * dgrad adding into it (see cl_linear), where lcu_lora_bwd_into takes the segments
     * carrying gradients (they tile the rows: then no other segment has any). */
    int nf = c->lora_first && dx ? cu_lora_segs(c, l, mod, 0, T, true) : 0;
    int rc = nf ? lcu_lora_bwd_into(c->lcu, c->lsegs, nf, T, in, out, x, in, dy, out, dx, in, acc, c->a.z, c->a.dz,
                                    CU_LDZ, c->stream)
                : LCU_ENOTSUP;
    if (rc != LCU_ENOTSUP) {
        CU_TRY(c, rc);
        cu_mark(c, cl_lora_bop[mod]);
        lcu_gemm_args g = {false, false, (int)T, in, out, 1.0f, 1.0f, dy, out, W, in, NULL, 0, dx, in, LCU_F32};
        CU_TRY(c, lcu_gemm(c->lcu, &g, c->stream));
        cu_mark(c, cl_gemm_bop[mod]);
        return 0;
    }
    if (dx) {
        lcu_gemm_args g = {false, false, (int)T, in, out, 1.0f, acc ? 1.0f : 0.0f, dy, out, W, in, NULL, 0, dx, in,
                           LCU_F32};
        CU_TRY(c, lcu_gemm(c->lcu, &g, c->stream));
        cu_mark(c, cl_gemm_bop[mod]);
    }
    int n = cu_lora_segs(c, l, mod, 0, T, true);
    if (n) {
        CU_TRY(c, lcu_lora_bwd(c->lcu, c->lsegs, n, in, out, x, in, dy, out, dx, in, c->a.z, c->a.dz, CU_LDZ,
                               c->stream));
        cu_mark(c, cl_lora_bop[mod]);
    }
    return 0;
}

/* ---- attention: cuDNN's fused kernels or the own ones ------------------------------------- */

/* cuDNN unless LCU_ATTN names the own kernels (wmma: version 1, mma: version 2): on the
 * first H200 run (bench/cuda/WINDOWS.md, 2026-11-26) it passed the checks of
 * backend/cuda/README.md and ran Qwen3-8B 2×2048 at 9,625 tok/s against version 1's 6,579. */
void cu_attn_choose(cu_ctx *c)
{
    const char *e = getenv("LCU_ATTN");
    if (e && *e && strcmp(e, "cudnn") != 0) return;
    char why[1024];
    if (lcu_cudnn_create(&c->dnn, why, sizeof why) != 0)
        fprintf(stderr, "loom cuda:%d: no cuDNN attention: %s; the own attention kernels run\n", c->device, why);
    else
        fprintf(stderr, "loom cuda:%d: attention through %s (the own kernels for KV-cache decoding and what it "
                "refuses)\n", c->device, lcu_cudnn_describe(c->dnn));
}

int cu_attn_max_len(const int32_t *q_start, int nseq)
{
    int m = 0;
    for (int i = 0; i < nseq; i++)
        if (q_start[i + 1] - q_start[i] > m) m = q_start[i + 1] - q_start[i];
    return m;
}

/* A cuDNN failure other than "not this shape" (an execution error, no memory for its
 * workspace): cuDNN is dropped for the rest of the context's life, with one line. */
static void cl_dnn_off(cu_ctx *c, int rc)
{
    fprintf(stderr, "loom cuda:%d: cuDNN attention failed in %s: %s; the own attention kernels run from now on\n",
            c->device, c->where, lcu_cudnn_strerror(rc));
    lcu_cudnn_destroy(c->dnn);
    c->dnn = NULL;
}

/* Self-attention over the pass's packed rows (c->attn): cuDNN when the context has it and it
 * takes the call, else the own kernels (lcu_attn_fwd: version 1, or 2 with LCU_ATTN=mma).
 * Both give the same function and the same lse convention, so a forward by one and a
 * backward by the other still match. */
static int cl_attn_fwd(cu_ctx *c)
{
    cu_act *a = &c->a;
    if (c->dnn) {
        int rc = lcu_cudnn_attn_fwd(c->dnn, &c->attn, c->attn_max_len, a->q, a->k, a->v, a->att, a->lse, c->stream);
        if (rc == 0) return 0;
        if (rc != LCU_ENOTSUP) cl_dnn_off(c, rc);
    }
    return lcu_attn_fwd(&c->attn, a->q, a->k, a->v, a->att, a->lse, a->attn_ws, c->stream);
}

static int cl_attn_bwd(cu_ctx *c)
{
    cu_act *a = &c->a;
    if (c->dnn) {
        int rc = lcu_cudnn_attn_bwd(c->dnn, &c->attn, c->attn_max_len, a->q, a->k, a->v, a->att, a->lse, a->dattb, a->dq, a->dk, a->dv,
                                    c->stream);
        if (rc == 0) return 0;
        if (rc != LCU_ENOTSUP) cl_dnn_off(c, rc);
    }
    return lcu_attn_bwd(&c->attn, a->q, a->k, a->v, a->att, a->lse, a->dattb, a->dq, a->dk, a->dv, a->attn_ws, c->stream);
}

/* ---- forward ------------------------------------------------------------------------- */

/* Sampling passes: this layer's K/V rows into the caches (prefill: each prompt row into
 * every sample of its prompt; decode: each row into its stream at its position). */
static int cl_kv_store(cu_ctx *c, int l)
{
    size_t row = (size_t)c->cfg.num_key_value_heads * c->cfg.head_dim * sizeof(lcu_bf16);
    CU_TRY(c, lcu_copy_rows(cu_kv_cache(c, l, 0), c->kv_dst, c->a.k, c->kv_src, c->kv_nmap, row, c->stream));
    CU_TRY(c, lcu_copy_rows(cu_kv_cache(c, l, 1), c->kv_dst, c->a.v, c->kv_src, c->kv_nmap, row, c->stream));
    cu_mark(c, "kv store");
    return 0;
}

int cu_layer_forward(cu_ctx *c, int l, long T, const float *x_in, float *x_out, bool recompute)
{
    const model_config *mc = &c->cfg;
    const cu_layer_w *w = &c->w.layers[l];
    cu_act *a = &c->a;
    int H = mc->hidden_size, I = mc->intermediate_size, d = mc->head_dim, nq = mc->num_attention_heads,
        nkv = mc->num_key_value_heads, qd = nq * d, kvd = nkv * d;
    double eps = mc->rms_norm_eps;
    cudaStream_t s = c->stream;
    cu_where(c, "layer %d %s", l, recompute ? "recompute" : "forward");

    CU_TRY(c, lcu_rmsnorm_fwd(a->xn1, LCU_BF16, a->rstd1, x_in, w->attn_norm, T, H, eps, s));
    cu_mark(c, "attn rmsnorm");
    /* q, k, v pre-RoPE (fp32) and their row strides: one GEMM into a->g or three */
    const float *qp = a->q_pre, *kp = a->k_pre, *vp = a->vf;
    long ldq = qd, ldk = kvd, ldv = kvd;
    if (cl_qkv_one(c, w, T)) {
        static const lora_module mods[3] = {LORA_Q, LORA_K, LORA_V};
        const int outs[3] = {qd, kvd, kvd};
        if (cl_linear_packed(c, l, mods, outs, 3, a->xn1, H, w->wq, a->g, qd + 2 * kvd, T, "qkv gemm",
                              "q|k|v lora") < 0)
            return -1;
        qp = a->g, kp = a->g + qd, vp = a->g + qd + kvd;
        ldq = ldk = ldv = qd + 2 * kvd;
    } else if (cl_linear(c, l, LORA_Q, a->xn1, H, w->wq, w->bq, qd, NULL, a->q_pre, T) < 0 ||
               cl_linear(c, l, LORA_K, a->xn1, H, w->wk, w->bk, kvd, NULL, a->k_pre, T) < 0 ||
               cl_linear(c, l, LORA_V, a->xn1, H, w->wv, w->bv, kvd, NULL, a->vf, T) < 0)
        return -1;
    bool fused = c->kv_mode == CU_KV_DECODE && c->dfuse;
    if (fused) { /* the norms, RoPE, v's rounding and the cache stores in one launch (LCU_DECODE_FUSE) */
        CU_TRY(c, lcu_decode_qkv(a->q, cu_kv_cache(c, l, 0), cu_kv_cache(c, l, 1), c->kv_dst, qp, ldq, kp, ldk, vp,
                                 ldv, mc->qk_norm ? w->q_norm : NULL, mc->qk_norm ? w->k_norm : NULL, T, nq, nkv, d,
                                 eps, c->d_pos, c->rope_cos, c->rope_sin, s));
        cu_mark(c, "q/k/v to cache");
    } else {
        const float *qs = a->q_pre, *ks = a->k_pre;
        if (mc->qk_norm) {
            CU_TRY(c, lcu_rmsnorm_fwd(a->qf, LCU_F32, a->rstd_q, a->q_pre, w->q_norm, T * nq, d, eps, s));
            CU_TRY(c, lcu_rmsnorm_fwd(a->kf, LCU_F32, a->rstd_k, a->k_pre, w->k_norm, T * nkv, d, eps, s));
            qs = a->qf;
            ks = a->kf;
            cu_mark(c, "q/k norm");
        }
        CU_TRY(c, lcu_rope(a->q, LCU_BF16, qs, T, nq, d, c->d_pos, c->rope_cos, c->rope_sin, false, s));
        CU_TRY(c, lcu_rope(a->k, LCU_BF16, ks, T, nkv, d, c->d_pos, c->rope_cos, c->rope_sin, false, s));
        cu_mark(c, "rope");
        CU_TRY(c, lcu_convert(a->v, LCU_BF16, a->vf, LCU_F32, (size_t)T * kvd, s));
        cu_mark(c, "v convert");
        if (c->kv_mode != CU_KV_NONE && cl_kv_store(c, l) < 0) return -1;
    }
    if (c->kv_mode == CU_KV_DECODE) { /* one new token per stream, attending to its cache */
        if (c->dattn) /* LCU_DECODE_ATTN (unless 0): the kernel made for one row a sequence */
            CU_TRY(c, lcu_attn_decode_fwd(&c->kv_attn, a->q, cu_kv_cache(c, l, 0), cu_kv_cache(c, l, 1), a->att,
                                          a->lse, s));
        else
            CU_TRY(c, lcu_attn_fwd(&c->kv_attn, a->q, cu_kv_cache(c, l, 0), cu_kv_cache(c, l, 1), a->att, a->lse,
                                   a->attn_ws, s));
        c->kv_attn.counted = fused; /* with the switch, the later layers reuse the first's tile counts */
    } else
        CU_TRY(c, cl_attn_fwd(c));
    cu_mark(c, "attention"); /* in a decode pass: lcu_attn_fwd's tile counts and its kernel */
    if (cl_linear(c, l, LORA_O, a->att, qd, w->wo, w->bo, H, x_in, a->xmid, T) < 0) return -1;

    CU_TRY(c, lcu_rmsnorm_fwd(a->xn2, LCU_BF16, a->rstd2, a->xmid, w->mlp_norm, T, H, eps, s));
    cu_mark(c, "mlp rmsnorm");
    if (w->router) {
        int rc = cu_moe_forward(c, l, T, a->xmid, x_out, recompute);
        cu_mark(c, "moe");
        return rc;
    }
    if (cl_gate_up_one(c, w, T)) { /* [gate | up] rows in a->g, then h (LCU_DECODE_FUSE=2) */
        static const lora_module mods[2] = {LORA_GATE, LORA_UP};
        const int outs[2] = {I, I};
        if (cl_linear_packed(c, l, mods, outs, 2, a->xn2, H, w->wgate, a->g, 2L * I, T, "gate|up gemm",
                              "gate|up lora") < 0)
            return -1;
        CU_TRY(c, lcu_swiglu_rows(a->h, a->g, a->g + I, T, I, 2L * I, s));
    } else {
        if (cl_linear(c, l, LORA_GATE, a->xn2, H, w->wgate, NULL, I, NULL, a->g, T) < 0 ||
            cl_linear(c, l, LORA_UP, a->xn2, H, w->wup, NULL, I, NULL, a->u, T) < 0)
            return -1;
        CU_TRY(c, lcu_swiglu_fwd(a->h, LCU_BF16, a->g, a->u, T * I, s));
    }
    cu_mark(c, "swiglu");
    if (recompute) return 0; /* the backward needs everything up to h, not the layer output */
    return cl_linear(c, l, LORA_DOWN, a->h, I, w->wdown, NULL, H, a->xmid, x_out, T);
}

/* ---- backward ------------------------------------------------------------------------ */

int cu_layer_backward(cu_ctx *c, int l, long T, const float *x_in, bool need_dx)
{
    const model_config *mc = &c->cfg;
    const cu_layer_w *w = &c->w.layers[l];
    cu_act *a = &c->a;
    int H = mc->hidden_size, I = mc->intermediate_size, d = mc->head_dim, nq = mc->num_attention_heads,
        nkv = mc->num_key_value_heads, qd = nq * d, kvd = nkv * d;
    size_t TH = (size_t)T * H;
    cudaStream_t s = c->stream;
    cu_where(c, "layer %d backward", l);

    /* MLP: x' = xmid + down(h), h = silu(g)·u (sparse layer: x' = xmid + moe(xn2)) */
    if (w->router) {
        if (cu_moe_backward(c, l, T) < 0) return -1;
        cu_mark(c, "moe bwd");
    } else {
        CU_TRY(c, lcu_convert(a->dyb, LCU_BF16, a->dx, LCU_F32, TH, s));
        cu_mark(c, "dy convert");
        if (cl_linear_bwd(c, l, LORA_DOWN, a->h, I, w->wdown, H, a->dyb, a->dh, false, T) < 0) return -1;
        CU_TRY(c, lcu_swiglu_bwd(a->dg, a->du, LCU_BF16, a->dh, a->g, a->u, T * I, s));
        cu_mark(c, "swiglu bwd");
        if (cl_linear_bwd(c, l, LORA_GATE, a->xn2, H, w->wgate, I, a->dg, a->dxn, false, T) < 0 ||
            cl_linear_bwd(c, l, LORA_UP, a->xn2, H, w->wup, I, a->du, a->dxn, true, T) < 0)
            return -1;
    }
    CU_TRY(c, lcu_rmsnorm_bwd(a->dx, LCU_F32, a->dxn, LCU_F32, a->xmid, a->rstd2, w->mlp_norm, T, H, true, s));
    cu_mark(c, "mlp rmsnorm bwd");

    /* attention: xmid = x + o(att); dx = dL/dxmid from here */
    CU_TRY(c, lcu_convert(a->dyb, LCU_BF16, a->dx, LCU_F32, TH, s));
    cu_mark(c, "dy convert");
    if (cl_linear_bwd(c, l, LORA_O, a->att, qd, w->wo, H, a->dyb, a->datt, false, T) < 0) return -1;
    CU_TRY(c, lcu_convert(a->dattb, LCU_BF16, a->datt, LCU_F32, (size_t)T * qd, s));
    cu_mark(c, "datt convert");
    CU_TRY(c, cl_attn_bwd(c));
    cu_mark(c, "attention bwd");
    CU_TRY(c, lcu_rope(a->dq, LCU_F32, a->dq, T, nq, d, c->d_pos, c->rope_cos, c->rope_sin, true, s));
    CU_TRY(c, lcu_rope(a->dk, LCU_F32, a->dk, T, nkv, d, c->d_pos, c->rope_cos, c->rope_sin, true, s));
    cu_mark(c, "rope bwd");
    if (mc->qk_norm) {
        CU_TRY(c, lcu_rmsnorm_bwd(a->dqb, LCU_BF16, a->dq, LCU_F32, a->q_pre, a->rstd_q, w->q_norm, T * nq, d, false, s));
        CU_TRY(c, lcu_rmsnorm_bwd(a->dkb, LCU_BF16, a->dk, LCU_F32, a->k_pre, a->rstd_k, w->k_norm, T * nkv, d, false, s));
        cu_mark(c, "q/k norm bwd");
    } else {
        CU_TRY(c, lcu_convert(a->dqb, LCU_BF16, a->dq, LCU_F32, (size_t)T * qd, s));
        CU_TRY(c, lcu_convert(a->dkb, LCU_BF16, a->dk, LCU_F32, (size_t)T * kvd, s));
        cu_mark(c, "dq/dk convert");
    }
    CU_TRY(c, lcu_convert(a->dvb, LCU_BF16, a->dv, LCU_F32, (size_t)T * kvd, s));
    cu_mark(c, "dv convert");
    /* layer 0 needs no input gradient (the embedding is frozen): LoRA gradients only */
    float *dxn = need_dx ? a->dxn : NULL;
    if (cl_linear_bwd(c, l, LORA_Q, a->xn1, H, w->wq, qd, a->dqb, dxn, false, T) < 0 ||
        cl_linear_bwd(c, l, LORA_K, a->xn1, H, w->wk, kvd, a->dkb, dxn, true, T) < 0 ||
        cl_linear_bwd(c, l, LORA_V, a->xn1, H, w->wv, kvd, a->dvb, dxn, true, T) < 0)
        return -1;
    if (need_dx) {
        CU_TRY(c, lcu_rmsnorm_bwd(a->dx, LCU_F32, a->dxn, LCU_F32, x_in, a->rstd1, w->attn_norm, T, H, true, s));
        cu_mark(c, "attn rmsnorm bwd");
    }
    return 0;
}
