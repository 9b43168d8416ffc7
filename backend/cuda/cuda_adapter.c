/* cuda_adapter.c — adapters in device memory: allocation, per-module views, transfers
 * (see cuda_adapter.h and cu_adapter in cuda_ctx.h). Transfers are one copy per part; the
 * bf16 copy of the parameters is refreshed whenever they change (upload, copy, optimizer
 * step), so the GEMMs never read stale weights. */
#include "backend/cuda/cuda_adapter.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_buffers.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

static size_t ca_align(size_t x) { return (x + 255) & ~(size_t)255; }

be_adapter *cu_adapter_alloc(cu_ctx *c, const lora_config *lc, bool trainable, char *err, size_t errlen)
{
    cu_adapter *a = calloc(1, sizeof *a);
    if (!a) { err_set(err, errlen, "cuda: out of host memory"); return NULL; }
    lora_layout *l = &a->pub.layout;
    if (lora_layout_init(l, &c->cfg, lc, err, errlen) < 0) { free(a); return NULL; }
    size_t n = l->num_params, f32 = ca_align(n * sizeof(float)), parts = trainable ? 4 : 1;
    size_t bytes = parts * f32 + ca_align(n * sizeof(lcu_bf16));
    a->pub.trainable = trainable;
    a->pub.device_bytes = bytes;
    a->scale = l->scale;
    a->mods = calloc((size_t)l->num_layers * LORA_NUM_MODULES, sizeof *a->mods);
    if (l->num_experts > 0) a->experts = calloc((size_t)l->num_layers * l->num_experts * 3, sizeof *a->experts);
    bool host_ok = a->mods && (l->num_experts == 0 || a->experts);
    int rc = host_ok ? (int)cudaMalloc(&a->mem, bytes) : (int)cudaErrorMemoryAllocation;
    if (rc && host_ok && c->keep.mem) { /* the kept activations' slots give way to an adapter
                                           (the next pass re-takes what fits) */
        cudaGetLastError();
        cu_keep_release(c);
        rc = (int)cudaMalloc(&a->mem, bytes);
    }
    if (rc) {
        a->mem = NULL;
        /* out of memory is not sticky, but the runtime keeps it as the thread's last error:
         * cleared, or the next kernel launch's check (cudaGetLastError) would report it as
         * its own failure */
        cudaGetLastError();
        cu_adapter_free(c, &a->pub);
        err_set(err, errlen, "cuda:%d: out of memory for an adapter of %zu parameters (%.1f MiB)", c->device, n,
                bytes / 1048576.0);
        return NULL;
    }
    /* every part zero, and the bf16 copy of zero is zero bits */
    rc = (int)cudaMemsetAsync(a->mem, 0, bytes, c->stream);
    if (!rc) rc = (int)cudaStreamSynchronize(c->stream);
    if (rc) {
        cu_adapter_free(c, &a->pub);
        err_set(err, errlen, "cuda:%d: clearing a new adapter: %s", c->device, lcu_strerror(rc));
        return NULL;
    }
    char *p = a->mem;
    a->params = (float *)p;
    if (trainable) {
        a->grads = (float *)(p + f32);
        a->m = (float *)(p + 2 * f32);
        a->v = (float *)(p + 3 * f32);
    }
    a->params_bf16 = (lcu_bf16 *)(p + parts * f32);
    /* Per-module views, A and B being consecutive tensors of the layout. */
    for (int i = 0; i + 1 < l->num_tensors; i += 2) {
        const lora_tensor *ta = &l->tensors[i], *tb = &l->tensors[i + 1];
        cu_lora_pair *q = ta->layer < 0     ? &a->head
                          : ta->expert >= 0 ? &a->experts[((size_t)ta->layer * l->num_experts + ta->expert) * 3 +
                                                          (ta->module - LORA_GATE)]
                                            : &a->mods[ta->layer * LORA_NUM_MODULES + ta->module];
        q->in = ta->cols;
        q->out = tb->rows;
        q->rank = ta->rows;
        q->A = a->params_bf16 + ta->offset;
        q->B = a->params_bf16 + tb->offset;
        q->gA = trainable ? a->grads + ta->offset : NULL;
        q->gB = trainable ? a->grads + tb->offset : NULL;
    }
    return &a->pub;
}

void cu_adapter_free(cu_ctx *c, be_adapter *pub)
{
    (void)c;
    if (!pub) return;
    cu_adapter *a = cu_adapter_of(pub);
    lora_layout_free(&a->pub.layout);
    if (a->mem) cudaFree(a->mem);
    free(a->mods);
    free(a->experts);
    free(a);
}

const cu_lora_pair *cu_adapter_module(const cu_adapter *a, int layer, lora_module mod)
{
    const cu_lora_pair *p = &a->mods[layer * LORA_NUM_MODULES + mod];
    return p->A ? p : NULL;
}

const cu_lora_pair *cu_adapter_expert(const cu_adapter *a, int layer, int e, lora_module mod)
{
    if (!a->experts) return NULL;
    const cu_lora_pair *p = &a->experts[((size_t)layer * a->pub.layout.num_experts + e) * 3 + (mod - LORA_GATE)];
    return p->A ? p : NULL;
}

const cu_lora_pair *cu_adapter_head(const cu_adapter *a) { return a->head.A ? &a->head : NULL; }

int cu_adapter_refresh_bf16(cu_ctx *c, cu_adapter *a)
{
    CU_TRY(c, lcu_convert(a->params_bf16, LCU_BF16, a->params, LCU_F32, a->pub.layout.num_params, c->stream));
    return 0;
}

int cu_adapter_zero_grad(cu_ctx *c, cu_adapter *a)
{
    CU_TRY(c, cudaMemsetAsync(a->grads, 0, a->pub.layout.num_params * sizeof(float), c->stream));
    return 0;
}

/* dst := src (n floats, host), or zeros when src is NULL. */
static int ca_put(cu_ctx *c, float *dst, const float *src, size_t n)
{
    if (src) CU_TRY(c, cudaMemcpyAsync(dst, src, n * sizeof *dst, cudaMemcpyHostToDevice, c->stream));
    else CU_TRY(c, cudaMemsetAsync(dst, 0, n * sizeof *dst, c->stream));
    return 0;
}

int cu_adapter_upload(cu_ctx *c, be_adapter *pub, const adapter_state *src, unsigned parts, char *err, size_t errlen)
{
    cu_adapter *a = cu_adapter_of(pub);
    if (be_adapter_check_parts(pub, &src->layout, parts, "cuda", err, errlen) < 0) return -1;
    size_t n = pub->layout.num_params;
    cu_where(c, "adapter upload");
    if (((parts & ADAPTER_PARAMS) && (ca_put(c, a->params, src->params, n) < 0 || cu_adapter_refresh_bf16(c, a) < 0)) ||
        ((parts & ADAPTER_GRADS) && ca_put(c, a->grads, src->grads, n) < 0) ||
        ((parts & ADAPTER_OPTIM) && (ca_put(c, a->m, src->m, n) < 0 || ca_put(c, a->v, src->v, n) < 0)) ||
        cu_sync(c) < 0)
        return cu_fail(c, err, errlen, "cuda: upload failed");
    if (parts & ADAPTER_OPTIM) pub->step = src->step;
    return 0;
}

int cu_adapter_download(cu_ctx *c, const be_adapter *pub, adapter_state *dst, unsigned parts, char *err,
                        size_t errlen)
{
    const cu_adapter *a = (const cu_adapter *)pub;
    if (be_adapter_check_parts(pub, &dst->layout, parts, "cuda", err, errlen) < 0) return -1;
    if (((parts & ADAPTER_PARAMS) && !dst->params) || ((parts & ADAPTER_GRADS) && !dst->grads) ||
        ((parts & ADAPTER_OPTIM) && (!dst->m || !dst->v))) {
        err_set(err, errlen, "cuda: the host state has no room for the parts asked for");
        return -1;
    }
    size_t bytes = pub->layout.num_params * sizeof(float);
    const float *srcs[] = {a->params, a->grads, a->m, a->v};
    float *dsts[] = {dst->params, dst->grads, dst->m, dst->v};
    const unsigned need[] = {ADAPTER_PARAMS, ADAPTER_GRADS, ADAPTER_OPTIM, ADAPTER_OPTIM};
    cu_where(c, "adapter download");
    for (int i = 0; i < 4; i++) {
        if (!(parts & need[i])) continue;
        if (cu_check(c, (int)cudaMemcpyAsync(dsts[i], srcs[i], bytes, cudaMemcpyDeviceToHost, c->stream),
                     "cudaMemcpyAsync(download)", __FILE__, __LINE__) < 0)
            return cu_fail(c, err, errlen, "cuda: download failed");
    }
    if (cu_sync(c) < 0) return cu_fail(c, err, errlen, "cuda: download failed");
    if (parts & ADAPTER_OPTIM) dst->step = pub->step;
    return 0;
}

int cu_adapter_copy(cu_ctx *c, be_adapter *dpub, const be_adapter *spub, unsigned parts, char *err, size_t errlen)
{
    cu_adapter *d = cu_adapter_of(dpub);
    const cu_adapter *s = (const cu_adapter *)spub;
    if (be_adapter_check_parts(dpub, &spub->layout, parts, "cuda", err, errlen) < 0 ||
        be_adapter_check_parts(spub, &dpub->layout, parts, "cuda", err, errlen) < 0)
        return -1;
    size_t n = dpub->layout.num_params, bytes = n * sizeof(float);
    cu_where(c, "adapter copy");
    const float *srcs[] = {s->params, s->grads, s->m, s->v};
    float *dsts[] = {d->params, d->grads, d->m, d->v};
    const unsigned need[] = {ADAPTER_PARAMS, ADAPTER_GRADS, ADAPTER_OPTIM, ADAPTER_OPTIM};
    for (int i = 0; i < 4; i++) {
        if (!(parts & need[i])) continue;
        if (cu_check(c, (int)cudaMemcpyAsync(dsts[i], srcs[i], bytes, cudaMemcpyDeviceToDevice, c->stream),
                     "cudaMemcpyAsync(copy)", __FILE__, __LINE__) < 0)
            return cu_fail(c, err, errlen, "cuda: copy failed");
    }
    /* the bf16 copy is the same conversion of the same masters */
    if ((parts & ADAPTER_PARAMS) &&
        cu_check(c, (int)cudaMemcpyAsync(d->params_bf16, s->params_bf16, n * sizeof(lcu_bf16),
                                         cudaMemcpyDeviceToDevice, c->stream), "cudaMemcpyAsync(copy bf16)", __FILE__,
                 __LINE__) < 0)
        return cu_fail(c, err, errlen, "cuda: copy failed");
    if (cu_sync(c) < 0) return cu_fail(c, err, errlen, "cuda: copy failed");
    if (parts & ADAPTER_OPTIM) dpub->step = spub->step;
    return 0;
}
