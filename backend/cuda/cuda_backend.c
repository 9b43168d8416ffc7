/* cuda_backend.c — the CUDA executor backend (be_backend_cuda): the table's entry points:
 * the context (device, stream, cuBLASLt, bf16 base weights, head buffers), adapters
 * (cuda_adapter.c), the packed forward/backward driver and the AdamW step; sampling is
 * cuda_sample.c. Hopper first: the kernels are built for sm_90 (LOOM_CUDA_GENCODE), and
 * create says so on another GPU.
 *
 * Determinism: every kernel and GEMM plan gives the same bits for the same inputs and
 * shapes (cuda_ops.h), so a pass repeated gives bitwise the same log-probs, losses and
 * gradients, and save/load resumes exactly. A sequence packed with others may differ from
 * the same sequence alone in the last bits (the base GEMMs over T rows may pick another
 * cuBLASLt algorithm for another T), within the reference suites' bf16 tolerances.
 */
#include "backend/cuda/cuda_adapter.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_head.h"
#include "backend/cuda/cuda_layer.h"
#include "backend/cuda/cuda_prof.h"
#include "backend/cuda/cuda_sample.h"
#include "backend/cuda/cuda_weights.h"
#include "common/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the device and the context -------------------------------------------------------- */

/* cudaGetDeviceCount needs the driver (libcuda.so.1, loaded by the static CUDA runtime at
 * this first call): without one it fails, and that means no device. */
static int cu_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static void cu_destroy(void *ctx)
{
    cu_ctx *c = ctx;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->stream) cudaStreamSynchronize(c->stream);
    cu_train_prof_flush(c); /* the last shape's table */
    cu_buffers_free(c);
    if (c->norm_ws) cudaFree(c->norm_ws);
    cu_weights_free(&c->w);
    lcu_cudnn_destroy(c->dnn);
    lcu_ctx_destroy(c->lcu);
    if (c->side) cudaStreamSynchronize(c->side);
    if (c->lcu_side) lcu_ctx_destroy(c->lcu_side);
    if (c->side_fork) cudaEventDestroy(c->side_fork);
    if (c->side_join) cudaEventDestroy(c->side_join);
    if (c->side) cudaStreamDestroy(c->side);
    for (int i = 0; i < 4; i++)
        if (c->dprof_ev[i]) cudaEventDestroy(c->dprof_ev[i]);
    if (c->stream) cudaStreamDestroy(c->stream);
    if (c->mem_held) cudaFree(c->mem_held);
    free(c);
}

/* LCU_DEVICE_MB=N: the context behaves as on a card of N MiB (an H200 measuring what fits an
 * H100's 80 GB): it takes the device's memory beyond N MiB for itself before loading
 * anything, so every allocation fails where it would there, and every budget sized from the
 * device's total (kept activations, cuDNN's workspace) is sized from N MiB. A measuring
 * switch, not a way to share a GPU: what it holds back is taken from everyone. */
static int cu_hold_memory(cu_ctx *c, char *err, size_t errlen)
{
    const char *e = getenv("LCU_DEVICE_MB");
    if (!e || !*e) return 0;
    char *end;
    unsigned long long mb = strtoull(e, &end, 10);
    size_t fr = 0, tot = 0;
    if (*end || mb == 0 || mb > ((size_t)1 << 44) >> 20) {
        err_set(err, errlen, "cuda:%d: LCU_DEVICE_MB=%s is not a size in MiB", c->device, e);
        return -1;
    }
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        cudaGetLastError();
        err_set(err, errlen, "cuda:%d: LCU_DEVICE_MB: cannot read the device's memory", c->device);
        return -1;
    }
    size_t cap = (size_t)mb << 20;
    if (cap >= tot) return 0; /* the card is no bigger than that: nothing to hold */
    size_t used = tot - fr, hold = tot - cap;
    if (used >= cap || cudaMalloc(&c->mem_held, hold) != cudaSuccess) {
        cudaGetLastError();
        c->mem_held = NULL;
        err_set(err, errlen, "cuda:%d: LCU_DEVICE_MB=%s: cannot hold back %.1f GiB of the device (%.1f GiB in use "
                "already, %.1f GiB in all)", c->device, e, hold / 1073741824.0, used / 1073741824.0, tot / 1073741824.0);
        return -1;
    }
    c->mem_cap = cap;
    fprintf(stderr, "loom cuda:%d: LCU_DEVICE_MB: behaving as a card of %.1f GiB (%.1f GiB of %.1f held back)\n",
            c->device, cap / 1073741824.0, hold / 1073741824.0, tot / 1073741824.0);
    return 0;
}

/* The kernels are machine code for one GPU family: a one-element conversion shows whether
 * this device can run them before anything else is loaded. */
static int cu_probe_kernels(cu_ctx *c, char *err, size_t errlen)
{
    void *d = NULL;
    float one = 1.0f;
    int rc = (int)cudaMalloc(&d, 256);
    if (!rc) rc = (int)cudaMemcpyAsync(d, &one, sizeof one, cudaMemcpyHostToDevice, c->stream);
    if (!rc) rc = lcu_convert((char *)d + 128, LCU_BF16, d, LCU_F32, 1, c->stream);
    if (!rc) rc = (int)cudaStreamSynchronize(c->stream);
    if (d) cudaFree(d);
    if (rc) {
        struct cudaDeviceProp p;
        int pr = (int)cudaGetDeviceProperties(&p, c->device);
        err_set(err, errlen, "cuda:%d: cannot run Loom's kernels on %s (sm_%d%d): %s (this build targets sm_90, "
                "LOOM_CUDA_GENCODE)", c->device, pr ? "this device" : p.name, pr ? 0 : p.major, pr ? 0 : p.minor,
                lcu_strerror(rc));
        return -1;
    }
    return 0;
}

static void *cu_create(const model_files *m, const be_backend_opts *o, char *err, size_t errlen)
{
    const model_config *mc = &m->cfg;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        err_set(err, errlen, "cuda: no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        cudaGetLastError();
        return NULL;
    }
    if (o->device < 0 || o->device >= n) {
        err_set(err, errlen, "cuda: no device %d (%d found)", o->device, n);
        return NULL;
    }
    if (mc->num_experts_per_tok > 64) {
        err_set(err, errlen, "cuda: %d experts per token (the routing kernels take up to 64)", mc->num_experts_per_tok);
        return NULL;
    }
    int d = mc->head_dim;
    if (d != 16 && d != 32 && d != 64 && d != 128) {
        err_set(err, errlen, "cuda: head_dim %d is not supported (the attention kernels take 16, 32, 64, 128)", d);
        return NULL;
    }
    cu_ctx *c = calloc(1, sizeof *c);
    if (!c) { err_set(err, errlen, "cuda: out of host memory"); return NULL; }
    c->cfg = *mc;
    c->device = o->device;
    const char *sync = getenv("LOOM_CUDA_SYNC");
    c->sync_debug = sync && *sync && strcmp(sync, "0") != 0;
    /* kept activations and decode graphs: on unless set to 0 (the defaults since an H200
     * passed every test with them and measured them faster: bench/cuda/WINDOWS.md) */
    const char *keep = getenv("LCU_KEEP_ACT"), *keep_mb = getenv("LCU_KEEP_MB");
    c->keep.wanted = !keep || !*keep || strcmp(keep, "0") != 0;
    c->keep.cap_bytes = keep_mb && *keep_mb ? (size_t)strtoull(keep_mb, NULL, 10) << 20 : 0;
    const char *keep_l = getenv("LCU_KEEP_LAYERS");
    c->keep.cap_layers = keep_l && *keep_l && atoi(keep_l) > 0 ? atoi(keep_l) : 0;
    const char *dg = getenv("LCU_DECODE_GRAPH"), *tp = getenv("LCU_TRAIN_PROFILE");
    c->dgraph_wanted = !dg || !*dg || strcmp(dg, "0") != 0;
    c->tprof_wanted = tp && *tp && strcmp(tp, "0") != 0;
    const char *dp = getenv("LCU_DECODE_PROFILE");
    c->dprof_level = dp && *dp ? (strcmp(dp, "0") == 0 ? 0 : atoi(dp) >= 2 ? 2 : 1) : 0;
    /* fused decode layers, level 2 unless set: the fourth window (an H200) passed the checks
     * and measured every decode row faster, level 2 fastest (bench/cuda/WINDOWS.md) */
    const char *df = getenv("LCU_DECODE_FUSE");
    c->dfuse = df && *df ? atoi(df) : 2;
    c->dfuse = c->dfuse < 0 ? 0 : c->dfuse > 2 ? 2 : c->dfuse;
    /* the decode's own attention kernel and the LoRA written first, on unless set to 0: the
     * fifth window (an H200) passed their checks and measured them faster (the decode steps
     * 17.2 -> 13.5 ms on Qwen3-8B over 8 adapters; Qwen3-8B 2x2048 13,526 -> 13,828 tok/s and
     * time to first token 65.3 -> 62.9 ms; bench/cuda/WINDOWS.md) */
    const char *da = getenv("LCU_DECODE_ATTN"), *lf = getenv("LCU_LORA_FIRST");
    c->dattn = !da || !*da || strcmp(da, "0") != 0;
    c->lora_first = !lf || !*lf || strcmp(lf, "0") != 0;
    struct cudaDeviceProp p;
    int rc = (int)cudaSetDevice(c->device);
    if (!rc) rc = (int)cudaGetDeviceProperties(&p, c->device);
    if (!rc) rc = (int)cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (rc) {
        err_set(err, errlen, "cuda:%d: %s", c->device, lcu_strerror(rc));
        cu_destroy(c);
        return NULL;
    }
    snprintf(c->device_name, sizeof c->device_name, "cuda:%d %s", c->device, p.name);
    if (cu_probe_kernels(c, err, errlen) < 0 || cu_hold_memory(c, err, errlen) < 0) {
        cu_destroy(c);
        return NULL;
    }
    rc = lcu_ctx_create(&c->lcu, 0);
    /* LCU_DECODE_SIDE=1: a decode layer's LoRA shrinks beside its base GEMM (off unless set:
     * written without a GPU, for a window to measure: bench/cuda/NOTES.md) */
    const char *ds = getenv("LCU_DECODE_SIDE");
    if (!rc && ds && *ds && strcmp(ds, "0") != 0) {
        rc = (int)cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking);
        if (!rc) rc = lcu_ctx_create(&c->lcu_side, 0);
        if (!rc) rc = (int)cudaEventCreateWithFlags(&c->side_fork, cudaEventDisableTiming);
        if (!rc) rc = (int)cudaEventCreateWithFlags(&c->side_join, cudaEventDisableTiming);
    }
    if (rc) {
        err_set(err, errlen, "cuda:%d: cuBLASLt%s: %s", c->device, c->lcu ? " (LCU_DECODE_SIDE's stream and context)" : "",
                lcu_strerror(rc));
        cu_destroy(c);
        return NULL;
    }
    cu_attn_choose(c);
    if (cu_weights_load(c, m, err, errlen) < 0) { cu_destroy(c); return NULL; }
    long V = mc->vocab_size;
    c->head_rows = cu_head_rows(V);
    rc = (int)cudaMalloc((void **)&c->logits, (size_t)c->head_rows * V * sizeof(float));
    if (!rc) rc = (int)cudaMalloc((void **)&c->dlogits, (size_t)c->head_rows * V * sizeof(lcu_bf16));
    if (!rc) rc = (int)cudaMalloc(&c->norm_ws, lcu_sumsq_workspace_bytes() + 256);
    if (rc) {
        err_set(err, errlen, "cuda:%d: out of memory for the output head's buffers (%d rows × %ld): %s", c->device,
                c->head_rows, V, lcu_strerror(rc));
        cu_destroy(c);
        return NULL;
    }
    c->failed = false;
    c->errmsg[0] = 0;
    return c;
}

static void cu_device_info(void *ctx, be_device_info *out)
{
    cu_ctx *c = ctx;
    memset(out, 0, sizeof *out);
    snprintf(out->device, sizeof out->device, "%s", c->device_name);
    size_t fr = 0, tot = 0;
    if (cudaSetDevice(c->device) == cudaSuccess) {
        cu_mem_info(c, &fr, &tot);
        out->memory_total = tot;
        out->memory_free = fr;
    }
    out->attn_workspace = lcu_cudnn_workspace_bytes(c->dnn);
    cudaGetLastError();
}

/* ---- adapters: device memory (cuda_adapter.c) ------------------------------------------ */

static be_adapter *cu_alloc_adapter(void *ctx, const lora_config *lc, bool trainable, char *err, size_t errlen)
{
    cu_ctx *c = ctx;
    if (cu_begin(c, err, errlen) < 0) return NULL;
    return cu_adapter_alloc(c, lc, trainable, err, errlen);
}

static void cu_free_adapter(void *ctx, be_adapter *a)
{
    cu_ctx *c = ctx;
    cudaSetDevice(c->device);
    cu_adapter_free(c, a);
}

static int cu_upload(void *ctx, be_adapter *a, const adapter_state *src, unsigned parts, char *err, size_t errlen)
{
    cu_ctx *c = ctx;
    if (cu_begin(c, err, errlen) < 0) return -1;
    return cu_adapter_upload(c, a, src, parts, err, errlen);
}

static int cu_download(void *ctx, const be_adapter *a, adapter_state *dst, unsigned parts, char *err,
                       size_t errlen)
{
    cu_ctx *c = ctx;
    if (cu_begin(c, err, errlen) < 0) return -1;
    return cu_adapter_download(c, a, dst, parts, err, errlen);
}

static int cu_copy(void *ctx, be_adapter *dst, const be_adapter *src, unsigned parts, char *err, size_t errlen)
{
    cu_ctx *c = ctx;
    if (cu_begin(c, err, errlen) < 0) return -1;
    return cu_adapter_copy(c, dst, src, parts, err, errlen);
}

/* ---- forward / backward ---------------------------------------------------------------- */

/* The pass itself, on buffers already large enough; keep: the activations of each layer with
 * a slot (c->keep.nkept: all, or the first that fit) are kept there for the backward instead
 * of recomputed. 0 or -1 (recorded in c). */
static int cu_fb_run(cu_ctx *c, const be_seq *seqs, int nseq, long T, bool any_grad, bool layer_grad, bool topk,
                     bool extras, bool keep)
{
    const model_config *mc = &c->cfg;
    cu_act *a = &c->a;
    int L = mc->num_hidden_layers, H = mc->hidden_size;
    size_t TH = (size_t)T * H;
    c->grad_started = false;
    cu_where(c, "packing %d sequences", nseq);
    if (cu_pack(c, seqs, nseq, any_grad) < 0) return -1;
    c->attn_max_len = cu_attn_max_len(cu_meta_host(c, c->ml.q_start), c->nseq_packed);
    c->d_pos = cu_meta_dev(c, c->ml.pos);
    cu_where(c, "embedding");
    CU_TRY(c, lcu_embed(a->x, c->w.embed, cu_meta_dev(c, c->ml.tokens), T, H, c->stream));
    cu_mark(c, "embedding");
    c->route_seqs = mc->num_experts > 0 ? seqs : NULL; /* the first forward counts the routing */
    for (int l = 0; l < L; l++) {
        if (layer_grad) {
            CU_TRY(c, cudaMemcpyAsync(a->saved + l * TH, a->x, TH * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
            cu_mark(c, "save layer input");
        }
        if (keep && l < c->keep.nkept) cu_keep_bind(c, l);
        else cu_keep_unbind(c); /* a layer without a slot: the shared buffers, recomputed later */
        if (cu_layer_forward(c, l, T, a->x, a->x, false) < 0) {
            c->route_seqs = NULL;
            return -1;
        }
    }
    cu_keep_unbind(c); /* the final norm's xn2 and the head's buffers are the shared ones */
    c->route_seqs = NULL;
    /* xf (bf16) lives in xn2 and dL/dxf in dxf: both are free until the layer backward */
    cu_where(c, "final norm");
    CU_TRY(c, lcu_rmsnorm_fwd(a->xn2, LCU_BF16, a->rstd_f, a->x, c->w.final_norm, T, H, mc->rms_norm_eps, c->stream));
    cu_mark(c, "final norm");
    c->grad_started = any_grad; /* the head adds the first gradients (head LoRA) */
    if (cu_head(c, T, a->xn2, any_grad, topk, extras ? seqs : NULL, layer_grad ? a->dxf : NULL) < 0) return -1;
    cu_mark(c, "head");
    if (layer_grad) {
        cu_where(c, "final norm backward");
        CU_TRY(c, lcu_rmsnorm_bwd(a->dx, LCU_F32, a->dxf, LCU_F32, a->x, a->rstd_f, c->w.final_norm, T, H, false,
                                  c->stream));
        cu_mark(c, "final norm bwd");
        for (int l = L - 1; l >= 0; l--) {
            const float *x_in = a->saved + l * TH;
            if (keep && l < c->keep.nkept) cu_keep_bind(c, l);
            else {
                cu_keep_unbind(c);
                if (cu_layer_forward(c, l, T, x_in, NULL, true) < 0) return -1;
            }
            if (cu_layer_backward(c, l, T, x_in, l > 0) < 0) return -1;
        }
        cu_keep_unbind(c);
    }
    cu_train_prof_queued(c);
    cu_where(c, "downloading the outputs");
    CU_TRY(c, cudaMemcpyAsync((char *)c->meta.host + c->ml.in_end, (char *)c->meta.dev + c->ml.in_end,
                              c->ml.out_end - c->ml.in_end, cudaMemcpyDeviceToHost, c->stream));
    return cu_sync(c);
}

/* A pass that failed (without losing the device) after it began adding gradients leaves
 * them partial: they are cleared, so that no optimizer step applies part of a batch, and
 * the message says so. err = the failure (+ what was done about the gradients); -1. */
static int cu_fb_fail(cu_ctx *c, char *err, size_t errlen)
{
    if (c->failed || !c->grad_started) return cu_fail(c, err, errlen, "cuda: forward_backward failed");
    char first[sizeof c->errmsg];
    snprintf(first, sizeof first, "%s", c->errmsg[0] ? c->errmsg : "cuda: forward_backward failed");
    bool ok = true;
    cu_where(c, "clearing the gradients of a failed pass");
    for (int s = 0; s < c->nsegs && ok; s++)
        if (c->segs[s].grad) ok = cu_adapter_zero_grad(c, (cu_adapter *)c->segs[s].ad) == 0;
    ok = ok && cu_sync(c) == 0;
    if (!ok) c->failed = true; /* the gradients are in an unknown state */
    err_set(err, errlen, "%s; %s", first,
            ok ? "the gradients accumulated so far on this pass's adapters were cleared (the pass had added part of "
                 "its own)"
               : "clearing the partial gradients failed too: restart the executor");
    return -1;
}

/* The outputs of the pass (in c->meta's host mirror) into the callers' arrays. */
static void cu_fb_scatter(cu_ctx *c, be_seq *seqs)
{
    const cu_meta_layout *m = &c->ml;
    const int32_t *q_start = cu_meta_host(c, m->q_start), *ids = cu_meta_host(c, m->topk_ids);
    const int64_t *tgt_start = cu_meta_host(c, m->tgt_start), *topk_start = cu_meta_host(c, m->topk_start);
    const float *lp = cu_meta_host(c, m->lp), *loss = cu_meta_host(c, m->loss), *tlp = cu_meta_host(c, m->topk_lp);
    for (int p = 0; p < c->nseq_packed; p++) {
        be_seq *s = &seqs[c->seq_index[p]];
        long r0 = q_start[p], K = s->k > 1 ? s->k : 1;
        if (s->logprobs_out) memcpy(s->logprobs_out, lp + tgt_start[r0], (size_t)s->n * K * sizeof(float));
        if (s->loss_out) memcpy(s->loss_out, loss + r0, (size_t)s->n * sizeof(float));
        if (s->topk > 0) {
            memcpy(s->topk_ids_out, ids + topk_start[r0], (size_t)s->n * s->topk * sizeof(int32_t));
            memcpy(s->topk_lp_out, tlp + topk_start[r0], (size_t)s->n * s->topk * sizeof(float));
        }
    }
}

static int cu_forward_backward(void *ctx, be_seq *seqs, int nseq, bool backward, char *err, size_t errlen)
{
    cu_ctx *c = ctx;
    if (cu_begin(c, err, errlen) < 0) return -1;
    if (nseq < 0 || (nseq > 0 && !seqs)) { err_set(err, errlen, "bad batch"); return -1; }
    long T = 0, nnz = 0, ntopk = 0;
    int max_len = 0, np = 0;
    bool any_grad = false, layer_grad = false, extras = false;
    for (int i = 0; i < nseq; i++) {
        const be_seq *s = &seqs[i];
        T += s->n;
        extras = extras || (s->n > 0 && be_seq_has_extras(s));
        nnz += (long)s->n * (s->k > 1 ? s->k : 1);
        ntopk += s->topk > 0 ? (long)s->n * s->topk : 0;
        if (s->n > max_len) max_len = s->n;
        if (s->n == 0) continue;
        np++;
        if (!s->ad) continue;
        const lora_config *lc = &s->ad->layout.cfg;
        if (backward && !s->forward_only && s->ad->trainable) {
            any_grad = true;
            /* Only the head adapted: no gradient needs to enter the layers. */
            if (lc->train_attn || lc->train_mlp) layer_grad = true;
        }
    }
    size_t ncount = (size_t)model_num_moe_layers(&c->cfg) * c->cfg.num_experts;
    for (int i = 0; i < nseq; i++)
        if (seqs[i].expert_counts_out) memset(seqs[i].expert_counts_out, 0, ncount * sizeof(int32_t));
    if (T == 0) return 0;
    if (T > (1L << 30) || nnz > (1L << 31) || ntopk > (1L << 31)) {
        err_set(err, errlen, "batch of %ld tokens is too large", T);
        return -1;
    }
    if (T > c->keep.cap_T) cu_keep_release(c); /* slots for T are taken after the workspace grows */
    if (cu_act_reserve(c, T, np, layer_grad, err, errlen) < 0 || cu_segs_reserve(c, nseq, err, errlen) < 0 ||
        cu_meta_reserve(c, T, np, nnz, ntopk, err, errlen) < 0 || cu_rope_reserve(c, max_len, err, errlen) < 0)
        return -1;
    bool keep = layer_grad && cu_keep_reserve(c, T, np, max_len);
    cu_train_prof_begin(c, T, np, layer_grad);
    int rc = cu_fb_run(c, seqs, nseq, T, any_grad, layer_grad, ntopk > 0, extras, keep);
    cu_train_prof_end(c, rc == 0); /* the pass synchronized (cu_sync) */
    cu_keep_unbind(c); /* also after a failure between a bind and its unbind */
    if (rc < 0) return cu_fb_fail(c, err, errlen);
    cu_fb_scatter(c, seqs);
    return 0;
}

/* ---- optimizer ------------------------------------------------------------------------- */

/* torch clip_grad_norm_ + AdamW (lcu_adamw: backend/adamw.c's arithmetic, bit for bit, for
 * the same clip coefficient). The norm is a fixed-order double sum on the device. */
static int cu_optim_run(cu_ctx *c, cu_adapter *a, const adam_params *hp, double *norm)
{
    size_t n = a->pub.layout.num_params;
    double *out = (double *)((char *)c->norm_ws + lcu_sumsq_workspace_bytes());
    double ss = 0;
    cu_where(c, "optim_step: gradient norm");
    CU_TRY(c, lcu_sumsq(out, a->grads, n, c->norm_ws, c->stream));
    CU_TRY(c, cudaMemcpyAsync(&ss, out, sizeof ss, cudaMemcpyDeviceToHost, c->stream));
    if (cu_sync(c) < 0) return -1;
    *norm = sqrt(ss);
    if (!isfinite(*norm)) return cu_adapter_zero_grad(c, a) < 0 || cu_sync(c) < 0 ? -1 : 0;
    cu_where(c, "optim_step: AdamW");
    lcu_adamw_args args = {hp->learning_rate, hp->beta1, hp->beta2, hp->eps, hp->weight_decay, a->pub.step + 1,
                           adamw_clip_coef(*norm, hp->grad_clip_norm)};
    CU_TRY(c, lcu_adamw(a->params, a->grads, a->m, a->v, n, &args, c->stream));
    /* The parameters have moved: a failure now would leave their bf16 copy, the step count
     * and the gradients behind them, a state no later call could repair. */
    if (cu_adapter_refresh_bf16(c, a) < 0 || cu_adapter_zero_grad(c, a) < 0 || cu_sync(c) < 0) {
        c->failed = true;
        return -1;
    }
    a->pub.step++;
    return 0;
}

static int cu_optim_step(void *ctx, be_adapter *pub, const adam_params *hp, double *grad_norm_out, char *err,
                         size_t errlen)
{
    cu_ctx *c = ctx;
    if (cu_begin(c, err, errlen) < 0) return -1;
    if (!pub->trainable) { err_set(err, errlen, "cuda: optim_step on an adapter that is not trainable"); return -1; }
    if (adamw_check(hp, err, errlen) < 0) return -1;
    double norm = 0;
    if (cu_optim_run(c, cu_adapter_of(pub), hp, &norm) < 0) return cu_fail(c, err, errlen, "cuda: optim_step failed");
    if (grad_norm_out) *grad_norm_out = norm;
    if (!isfinite(norm)) {
        /* Stepping would poison parameters and moments for good: skipped, gradient dropped. */
        err_set(err, errlen, "non-finite gradient norm; optimizer step skipped and gradients cleared");
        return -1;
    }
    return 0;
}

static int cu_sample_entry(void *ctx, be_sample_req *reqs, int nreq, char *err, size_t errlen)
{
    cu_ctx *c = ctx;
    if (cu_begin(c, err, errlen) < 0) return -1;
    return cu_sample(c, reqs, nreq, err, errlen);
}

const be_backend be_backend_cuda = {
    .name = "cuda",
    .device_count = cu_device_count,
    .create = cu_create,
    .destroy = cu_destroy,
    .device_info = cu_device_info,
    .adapter_alloc = cu_alloc_adapter,
    .adapter_free = cu_free_adapter,
    .adapter_upload = cu_upload,
    .adapter_download = cu_download,
    .adapter_copy = cu_copy,
    .forward_backward = cu_forward_backward,
    .optim_step = cu_optim_step,
    .sample = cu_sample_entry,
};
