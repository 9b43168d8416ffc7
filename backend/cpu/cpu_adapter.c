/* cpu_adapter.c — CPU adapters: allocation, views, transfers (see cpu_adapter.h). The
 * "device" is host memory, so an upload or download is a memcpy per part. */
#include "backend/cpu/cpu_adapter.h"
#include "backend/adamw.h"
#include "backend/cpu/cpu_pool.h"
#include "common/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

be_adapter *cpu_adapter_alloc(const model_config *mc, const lora_config *c, bool trainable, char *err,
                              size_t errlen)
{
    cpu_adapter *a = calloc(1, sizeof *a);
    if (!a) { err_set(err, errlen, "cpu: out of memory"); return NULL; }
    lora_layout *l = &a->pub.layout;
    if (lora_layout_init(l, mc, c, err, errlen) < 0) { free(a); return NULL; }
    size_t n = l->num_params, parts = trainable ? 4 : 1;
    a->pub.trainable = trainable;
    a->pub.device_bytes = parts * n * sizeof(float);
    a->scale = l->scale;
    a->mods = calloc((size_t)l->num_layers * LORA_NUM_MODULES, sizeof *a->mods);
    if (l->num_experts > 0) a->experts = calloc((size_t)l->num_layers * l->num_experts * 3, sizeof *a->experts);
    if (!a->mods || (l->num_experts > 0 && !a->experts) || posix_memalign((void **)&a->mem, 64, (parts * n + 16) * sizeof(float)) != 0) {
        a->mem = NULL;
        cpu_adapter_free(&a->pub);
        err_set(err, errlen, "cpu: out of memory for an adapter of %zu parameters", n);
        return NULL;
    }
    memset(a->mem, 0, (parts * n + 16) * sizeof(float));
    a->params = a->mem;
    if (trainable) {
        a->grads = a->params + n;
        a->m = a->grads + n;
        a->v = a->m + n;
    }
    /* Per-module views, A and B being consecutive tensors of the layout. */
    for (int i = 0; i + 1 < l->num_tensors; i += 2) {
        const lora_tensor *ta = &l->tensors[i], *tb = &l->tensors[i + 1];
        lora_pair *p = ta->layer < 0     ? &a->head
                       : ta->expert >= 0 ? &a->experts[((size_t)ta->layer * l->num_experts + ta->expert) * 3 +
                                                       (ta->module - LORA_GATE)]
                                         : &a->mods[ta->layer * LORA_NUM_MODULES + ta->module];
        p->in = ta->cols;
        p->out = tb->rows;
        p->rank = ta->rows;
        p->A = a->params + ta->offset;
        p->B = a->params + tb->offset;
        p->gA = trainable ? a->grads + ta->offset : NULL;
        p->gB = trainable ? a->grads + tb->offset : NULL;
    }
    return &a->pub;
}

void cpu_adapter_free(be_adapter *pub)
{
    if (!pub) return;
    cpu_adapter *a = cpu_adapter_of(pub);
    lora_layout_free(&a->pub.layout);
    free(a->mem);
    free(a->mods);
    free(a->experts);
    free(a);
}

const lora_pair *cpu_adapter_module(const cpu_adapter *a, int layer, lora_module mod)
{
    const lora_pair *p = &a->mods[layer * LORA_NUM_MODULES + mod];
    return p->A ? p : NULL;
}

const lora_pair *cpu_adapter_expert(const cpu_adapter *a, int layer, int e, lora_module mod)
{
    if (!a->experts) return NULL;
    const lora_pair *p = &a->experts[((size_t)layer * a->pub.layout.num_experts + e) * 3 + (mod - LORA_GATE)];
    return p->A ? p : NULL;
}

const lora_pair *cpu_adapter_head(const cpu_adapter *a) { return a->head.A ? &a->head : NULL; }

void cpu_adapter_zero_grad(cpu_adapter *a) { memset(a->grads, 0, a->pub.layout.num_params * sizeof(float)); }

/* dst := src (n floats), or zeros when src is NULL. */
static void ca_put(float *dst, const float *src, size_t n)
{
    if (src) memcpy(dst, src, n * sizeof *dst);
    else memset(dst, 0, n * sizeof *dst);
}

int cpu_adapter_upload(be_adapter *pub, const adapter_state *src, unsigned parts, char *err, size_t errlen)
{
    cpu_adapter *a = cpu_adapter_of(pub);
    if (be_adapter_check_parts(pub, &src->layout, parts, "cpu", err, errlen) < 0) return -1;
    size_t n = pub->layout.num_params;
    if (parts & ADAPTER_PARAMS) ca_put(a->params, src->params, n);
    if (parts & ADAPTER_GRADS) ca_put(a->grads, src->grads, n);
    if (parts & ADAPTER_OPTIM) {
        ca_put(a->m, src->m, n);
        ca_put(a->v, src->v, n);
        pub->step = src->step;
    }
    return 0;
}

int cpu_adapter_download(const be_adapter *pub, adapter_state *dst, unsigned parts, char *err, size_t errlen)
{
    const cpu_adapter *a = (const cpu_adapter *)pub;
    if (be_adapter_check_parts(pub, &dst->layout, parts, "cpu", err, errlen) < 0) return -1;
    if (((parts & ADAPTER_PARAMS) && !dst->params) || ((parts & ADAPTER_GRADS) && !dst->grads) ||
        ((parts & ADAPTER_OPTIM) && (!dst->m || !dst->v))) {
        err_set(err, errlen, "cpu: the host state has no room for the parts asked for");
        return -1;
    }
    size_t bytes = pub->layout.num_params * sizeof(float);
    if (parts & ADAPTER_PARAMS) memcpy(dst->params, a->params, bytes);
    if (parts & ADAPTER_GRADS) memcpy(dst->grads, a->grads, bytes);
    if (parts & ADAPTER_OPTIM) {
        memcpy(dst->m, a->m, bytes);
        memcpy(dst->v, a->v, bytes);
        dst->step = pub->step;
    }
    return 0;
}

int cpu_adapter_copy(be_adapter *dpub, const be_adapter *spub, unsigned parts, char *err, size_t errlen)
{
    const cpu_adapter *s = (const cpu_adapter *)spub;
    if (be_adapter_check_parts(dpub, &spub->layout, parts, "cpu", err, errlen) < 0 ||
        be_adapter_check_parts(spub, &dpub->layout, parts, "cpu", err, errlen) < 0)
        return -1;
    adapter_state view = {.layout = spub->layout, .step = spub->step, .params = s->params, .grads = s->grads,
                          .m = s->m, .v = s->v};
    return cpu_adapter_upload(dpub, &view, parts, err, errlen);
}

/* ---- the AdamW step ---------------------------------------------------------------------- */

typedef struct {
    cpu_adapter *a;
    const adam_params *hp;
    double coef;
} adam_job;

static void adam_range(void *va, long b, long e, int thread)
{
    (void)thread;
    const adam_job *j = va;
    cpu_adapter *a = j->a;
    adamw_update(a->params + b, a->grads + b, a->m + b, a->v + b, (size_t)(e - b), j->hp, a->pub.step, j->coef);
}

int cpu_adapter_optim_step(cpu_adapter *a, cpu_pool *pool, const adam_params *hp, double *grad_norm_out, char *err,
                           size_t errlen)
{
    size_t n = a->pub.layout.num_params;
    if (adamw_check(hp, err, errlen) < 0) return -1;
    double norm = adamw_grad_norm(a->grads, n);
    if (grad_norm_out) *grad_norm_out = norm;
    if (!isfinite(norm)) {
        cpu_adapter_zero_grad(a);
        err_set(err, errlen, "non-finite gradient norm; optimizer step skipped and gradients cleared");
        return -1;
    }
    a->pub.step++;
    adam_job j = {a, hp, adamw_clip_coef(norm, hp->grad_clip_norm)};
    cpu_pool_for(pool, (long)n, 1 << 16, adam_range, &j);
    cpu_adapter_zero_grad(a);
    return 0;
}
