/* cpu_backend.c — the CPU executor backend (be_backend_cpu): the table's entry points:
 * the context (weights, pool), adapters (cpu_adapter.c), the packed forward/backward
 * driver and the AdamW step; sampling is cpu_sample.c.
 * Plain C with its own batch-invariant GEMM (cpu_gemm.c; OpenBLAS only in sampling's
 * KV-cache attention); the reference that the CUDA backend is compared against.
 *
 * Threads: the context's pool owns the cores. OpenBLAS is set to one thread so that its
 * own pool does not fight ours; cpu_sgemm splits big GEMMs across the pool instead.
 * A context is used by one caller at a time.
 */
#include "backend/cpu/cpu_adapter.h"
#include "backend/cpu/cpu_buffers.h"
#include "backend/cpu/cpu_head.h"
#include "backend/cpu/cpu_layer.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_sample.h"
#include "common/err.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Logits are produced for this many floats' worth of rows at a time (64 MB), never [T, V]. */
#define CPU_HEAD_FLOATS (16L << 20)

/* ---- the context ---------------------------------------------------------------------- */

static void cpu_destroy(void *ctx)
{
    cpu_ctx *c = ctx;
    if (!c) return;
    cpu_buffers_free(c);
    cpu_pool_destroy(c->pool);
    cpu_weights_free(c->m);
    free(c);
}

static void *cpu_create(const model_files *m, const be_backend_opts *o, char *err, size_t errlen)
{
    if (o->device != 0) {
        err_set(err, errlen, "no device %d (the CPU backend has one device, 0)", o->device);
        return NULL;
    }
    int threads = o->threads;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    openblas_set_num_threads(1);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) { err_set(err, errlen, "cpu: out of memory"); return NULL; }
    if (cpu_weights_load(m, &c->m, err, errlen) < 0) { free(c); return NULL; }
    c->pool = cpu_pool_create(threads);
    long V = m->cfg.vocab_size;
    c->head_rows = (int)(CPU_HEAD_FLOATS / V > 256 ? 256 : CPU_HEAD_FLOATS / V < 1 ? 1 : CPU_HEAD_FLOATS / V);
    if (!c->pool || cpu_alloc(&c->logits, (size_t)c->head_rows * V * sizeof(float))) {
        err_set(err, errlen, "cpu: out of memory");
        cpu_destroy(c);
        return NULL;
    }
    return c;
}

/* The device is the machine: its memory is what /proc/meminfo says. */
static void cpu_device_info(void *ctx, be_device_info *out)
{
    cpu_ctx *c = ctx;
    memset(out, 0, sizeof *out);
    snprintf(out->device, sizeof out->device, "cpu:%d (%d threads)", c->device, cpu_pool_size(c->pool));
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) out->memory_total = (size_t)kb << 10;
        else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) out->memory_free = (size_t)kb << 10;
    }
    if (f) fclose(f);
}

/* ---- adapters: host memory (cpu_adapter.c) ------------------------------------------- */

static be_adapter *cpu_alloc_adapter(void *ctx, const lora_config *lc, bool trainable, char *err, size_t errlen)
{
    return cpu_adapter_alloc(&((cpu_ctx *)ctx)->m->cfg, lc, trainable, err, errlen);
}

static void cpu_free_adapter(void *ctx, be_adapter *a) { cpu_adapter_free(a); }

static int cpu_upload(void *ctx, be_adapter *a, const adapter_state *src, unsigned parts, char *err, size_t errlen)
{
    return cpu_adapter_upload(a, src, parts, err, errlen);
}

static int cpu_download(void *ctx, const be_adapter *a, adapter_state *dst, unsigned parts, char *err,
                        size_t errlen)
{
    return cpu_adapter_download(a, dst, parts, err, errlen);
}

static int cpu_copy(void *ctx, be_adapter *dst, const be_adapter *src, unsigned parts, char *err, size_t errlen)
{
    return cpu_adapter_copy(dst, src, parts, err, errlen);
}

/* ---- forward / backward -------------------------------------------------------------- */

static int cpu_forward_backward(void *ctx, be_seq *seqs, int nseq, bool backward, char *err, size_t errlen)
{
    cpu_ctx *c = ctx;
    const model_config *mc = &c->m->cfg;
    if (nseq < 0 || (nseq > 0 && !seqs)) { err_set(err, errlen, "bad batch"); return -1; }
    long T = 0;
    int max_len = 0, max_rank = 0;
    bool any_grad = false, layer_grad = false;
    for (int i = 0; i < nseq; i++) {
        const be_seq *s = &seqs[i];
        T += s->n;
        if (s->n > max_len) max_len = s->n;
        if (!s->ad || s->n == 0) continue;
        const lora_config *lc = &s->ad->layout.cfg;
        if (lc->rank > max_rank) max_rank = lc->rank;
        if (backward && !s->forward_only && s->ad->trainable) {
            any_grad = true;
            /* Only the head adapted: no gradient needs to enter the layers. */
            if (lc->train_attn || lc->train_mlp) layer_grad = true;
        }
    }
    size_t ncount = (size_t)model_num_moe_layers(mc) * mc->num_experts;
    for (int i = 0; i < nseq; i++)
        if (seqs[i].expert_counts_out) memset(seqs[i].expert_counts_out, 0, ncount * sizeof(int32_t));
    if (T == 0) return 0;
    if (T > (1L << 30)) { err_set(err, errlen, "batch of %ld tokens is too large", T); return -1; }
    if (cpu_reserve(c, T, max_len, max_rank, layer_grad) != 0 || cpu_pack(c, seqs, nseq, any_grad) != 0) {
        err_set(err, errlen, "cpu: out of memory for a batch of %ld tokens", T);
        return -1;
    }
    int L = mc->num_hidden_layers, H = mc->hidden_size;
    cpu_embed(c->pool, c->x, c->m->embed, c->tokens, T, H);
    c->route_seqs = ncount ? seqs : NULL; /* the first forward counts the routing, not the recompute */
    for (int l = 0; l < L; l++) {
        if (layer_grad) memcpy(c->saved + (long)l * T * H, c->x, (size_t)T * H * sizeof(float));
        cpu_layer_forward(c, l, T, false);
    }
    c->route_seqs = NULL;
    /* xf lives in xn2 and dL/dxf in dxn: both are free until the layer backward. */
    cpu_rmsnorm_fwd(c->pool, c->xn2, c->rstd_f, c->x, c->m->final_norm, T, H, mc->rms_norm_eps);
    cpu_head(c, seqs, T, c->xn2, any_grad, layer_grad ? c->dxn : NULL);
    if (!layer_grad) return 0;
    cpu_rmsnorm_bwd(c->pool, c->dx, c->dxn, c->x, c->rstd_f, c->m->final_norm, T, H, false);
    for (int l = L - 1; l >= 0; l--) {
        memcpy(c->x, c->saved + (long)l * T * H, (size_t)T * H * sizeof(float));
        cpu_layer_forward(c, l, T, true);
        cpu_layer_backward(c, l, T, l > 0);
    }
    return 0;
}

/* ---- optimizer ----------------------------------------------------------------------- */

static int cpu_optim_step(void *ctx, be_adapter *pub, const adam_params *hp, double *grad_norm_out, char *err,
                          size_t errlen)
{
    cpu_ctx *c = ctx;
    if (!pub->trainable) { err_set(err, errlen, "cpu: optim_step on an adapter that is not trainable"); return -1; }
    return cpu_adapter_optim_step(cpu_adapter_of(pub), c->pool, hp, grad_norm_out, err, errlen);
}

static int cpu_device_count(void) { return 1; }

const be_backend be_backend_cpu = {
    .name = "cpu",
    .batch_invariant = true,
    .device_count = cpu_device_count,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .device_info = cpu_device_info,
    .adapter_alloc = cpu_alloc_adapter,
    .adapter_free = cpu_free_adapter,
    .adapter_upload = cpu_upload,
    .adapter_download = cpu_download,
    .adapter_copy = cpu_copy,
    .forward_backward = cpu_forward_backward,
    .optim_step = cpu_optim_step,
    .sample = cpu_sample,
};
