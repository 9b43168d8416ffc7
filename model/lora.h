/* lora.h — LoRA adapters: parameters, gradient accumulators and AdamW state.
 *
 * Conventions (spec §17.2/§17.4, PEFT): for an adapted nn.Linear with weight W [out, in],
 *   y = x Wᵀ + scale · (x Aᵀ) Bᵀ,   A [r, in], B [out, r],   scale = alpha / r, alpha = 32.
 * A starts as PEFT's kaiming_uniform(a=√5), i.e. U(−1/√in, 1/√in), from a stream seeded by
 * (lora seed, tensor name); B starts at zero, so a fresh adapter leaves the model unchanged.
 * Modules: train_attn → q,k,v,o; train_mlp → gate,up,down; train_unembed → the output head
 * ("model.unembed_tokens"; with tied embeddings it adapts the head only, not the input).
 *
 * Memory (llm.c style): ONE allocation holding four equally long arrays — params, grads,
 * adam m, adam v — each carved into the same sequence of tensors. So zeroing gradients is
 * one memset and the optimizer is one flat loop.
 */
#ifndef LOOM_MODEL_LORA_H
#define LOOM_MODEL_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

#define LORA_ALPHA 32.0f
#define LORA_MAX_RANK 512

typedef struct {
    int rank;
    uint64_t seed;
    bool train_attn, train_mlp, train_unembed;
} lora_config;

typedef enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_NUM_MODULES } lora_module;

/* One adapted linear. All pointers NULL when the module is not trained. */
typedef struct {
    int in, out, rank;
    float *A, *B;    /* [r, in], [out, r] */
    float *gA, *gB;  /* gradient accumulators, same shapes */
} lora_pair;

typedef struct {
    const char *name; /* PEFT key, e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight */
    int rows, cols;
    float *param, *grad, *m, *v;
} lora_tensor;

typedef struct adapter {
    lora_config cfg;
    float scale;           /* LORA_ALPHA / rank */
    int num_layers, hidden, vocab; /* geometry of the base model it was made for */
    lora_pair *mods;       /* [num_layers * LORA_NUM_MODULES] */
    lora_pair head;
    int64_t step;          /* optimizer steps taken */
    size_t num_params;
    float *params, *grads, *m, *v; /* each num_params long, inside mem */
    float *mem;
    int num_tensors;
    lora_tensor *tensors;
    char *names;
} adapter;

adapter *adapter_create(const base_model *m, const lora_config *c, char *err, size_t errlen); /* rank 1..512 */
void adapter_free(adapter *a);
/* An inference-only copy of a's parameters (a sampler snapshot): same config, tensors and
 * names, params copied; grads, m and v are NULL (one allocation of num_params floats), so
 * it must never be given to a backward pass or an optimizer step. NULL on out of memory. */
adapter *adapter_clone_weights(const adapter *a, char *err, size_t errlen);
size_t adapter_num_params(const adapter *a);

/* Named tensors, in a fixed order: layer by layer q,k,v,o,gate,up,down (lora_A then
 * lora_B), then the head. */
int adapter_num_tensors(const adapter *a);
void adapter_tensor(const adapter *a, int i, const char **name, int *rows, int *cols, float **param, float **grad,
                    float **m, float **v);
int adapter_find_tensor(const adapter *a, const char *name); /* index or -1 */

int64_t adapter_step(const adapter *a);
void adapter_set_step(adapter *a, int64_t step);   /* when restoring optimizer state */
void adapter_zero_grad(adapter *a);
void adapter_reset_optimizer(adapter *a);           /* m = v = 0, step = 0 */
const lora_config *adapter_get_config(const adapter *a);

/* The module of a layer, or NULL when it is not trained. */
lora_pair *adapter_module(const adapter *a, int layer, lora_module mod);
/* The head adapter, or NULL when train_unembed is off. */
lora_pair *adapter_head(const adapter *a);

/* True when a was created for a model with m's geometry. */
bool adapter_matches(const adapter *a, const base_model *m);

#endif
