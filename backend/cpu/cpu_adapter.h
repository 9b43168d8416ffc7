/* cpu_adapter.h — a LoRA adapter of the CPU backend: the be_adapter header, then its
 * parts as flat fp32 arrays in host memory (one allocation, layout order) and per-module
 * views for the layer code. */
#ifndef LOOM_BACKEND_CPU_ADAPTER_H
#define LOOM_BACKEND_CPU_ADAPTER_H

#include "backend/backend.h"

/* One adapted linear. All pointers NULL when the module is not trained; gA, gB NULL in
 * an adapter that is not trainable. */
typedef struct {
    int in, out, rank;
    float *A, *B;    /* [r, in], [out, r] */
    float *gA, *gB;  /* gradient accumulators, same shapes */
} lora_pair;

typedef struct {
    be_adapter pub;
    float scale;                   /* LORA_ALPHA / rank */
    lora_pair *mods;               /* [num_layers * LORA_NUM_MODULES] */
    lora_pair *experts;            /* [num_layers * num_experts * 3] gate, up, down of each
                                      expert of a sparse layer (NULL for a dense model) */
    lora_pair head;
    float *params, *grads, *m, *v; /* num_params each; grads, m, v NULL unless trainable */
    float *mem;
} cpu_adapter;

static inline cpu_adapter *cpu_adapter_of(be_adapter *a) { return (cpu_adapter *)a; }

/* The module of a layer, or NULL when it is not trained. */
const lora_pair *cpu_adapter_module(const cpu_adapter *a, int layer, lora_module mod);
/* Expert e's gate, up or down (mod LORA_GATE..LORA_DOWN) in sparse layer `layer`, or
 * NULL when the experts are not trained. */
const lora_pair *cpu_adapter_expert(const cpu_adapter *a, int layer, int e, lora_module mod);
/* The head adapter, or NULL when train_unembed is off. */
const lora_pair *cpu_adapter_head(const cpu_adapter *a);

/* The table's adapter entries (see backend.h), for a model of config mc. */
be_adapter *cpu_adapter_alloc(const model_config *mc, const lora_config *c, bool trainable, char *err,
                              size_t errlen);
void cpu_adapter_free(be_adapter *a);
int cpu_adapter_upload(be_adapter *a, const adapter_state *src, unsigned parts, char *err, size_t errlen);
int cpu_adapter_download(const be_adapter *a, adapter_state *dst, unsigned parts, char *err, size_t errlen);
int cpu_adapter_copy(be_adapter *dst, const be_adapter *src, unsigned parts, char *err, size_t errlen);
void cpu_adapter_zero_grad(cpu_adapter *a);

typedef struct cpu_pool cpu_pool;
/* The AdamW step of a trainable adapter (the table's optim_step after its own checks),
 * over the pool (NULL: on the caller's thread; the same bits either way, the update is
 * per element): the clipped update, step + 1, the gradient cleared. A gradient norm that
 * is not finite skips the step (it would poison the parameters and moments for good),
 * clears the gradient and fails. *grad_norm_out (may be NULL) gets the norm. */
int cpu_adapter_optim_step(cpu_adapter *a, cpu_pool *pool, const adam_params *hp, double *grad_norm_out, char *err,
                           size_t errlen);

#endif
