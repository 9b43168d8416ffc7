/* cpu_weights.h — the CPU backend's base weights: every tensor of the model converted to
 * fp32 (from F32, BF16, F16 or F64 as stored) in one allocation, frozen. */
#ifndef LOOM_BACKEND_CPU_WEIGHTS_H
#define LOOM_BACKEND_CPU_WEIGHTS_H

#include <stddef.h>

#include "model/model.h"

/* One decoder layer; HF nn.Linear layout [out_features, in_features], row-major. Bias
 * pointers are NULL when the architecture has none; q_norm/k_norm NULL unless qk_norm. */
typedef struct {
    float *attn_norm;                   /* [H] input_layernorm */
    float *wq, *wk, *wv, *wo;           /* [nq*d, H], [nkv*d, H], [nkv*d, H], [H, nq*d] */
    float *bq, *bk, *bv, *bo;           /* [nq*d], [nkv*d], [nkv*d], [H] */
    float *q_norm, *k_norm;             /* [d] */
    float *mlp_norm;                    /* [H] post_attention_layernorm */
    float *wgate, *wup, *wdown;         /* [I, H], [I, H], [H, I]; NULL in a sparse layer */
    /* a sparse layer (model_layer_moe): the router [E, H], then expert by expert its gate
     * [Im, H], up [Im, H] and down [H, Im] (cpu_expert_w); NULL in a dense layer */
    float *router, *experts;
} cpu_layer_weights;

/* Expert e's projection (0 gate, 1 up, 2 down) in a sparse layer's weights. */
static inline const float *cpu_expert_w(const cpu_layer_weights *w, const model_config *c, int e, int proj)
{
    size_t m = (size_t)c->moe_intermediate_size * c->hidden_size;
    return w->experts + (size_t)e * 3 * m + (size_t)proj * m;
}

typedef struct {
    model_config cfg;
    float *embed;        /* [V, H] */
    float *final_norm;   /* [H] */
    float *lm_head;      /* [V, H]; == embed when tied */
    cpu_layer_weights *layers; /* [L] */
    float *mem;          /* the one allocation holding all of the above */
    size_t num_floats;
} cpu_weights;

/* m's tensors as fp32. 0, or -1 with err (out of memory). */
int cpu_weights_load(const model_files *m, cpu_weights **out, char *err, size_t errlen);
void cpu_weights_free(cpu_weights *w);

#endif
