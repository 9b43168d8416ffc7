/* model.h — base model: HF config.json parsing and the stored weights.
 *
 * Supported architectures (dense decoder-only, HF layout):
 *   LlamaForCausalLM  — optional llama3 rope_scaling, optional attention_bias
 *   Qwen2ForCausalLM  — q/k/v biases
 *   Qwen3ForCausalLM  — explicit head_dim, per-head q_norm/k_norm before RoPE
 *   Qwen3MoeForCausalLM — Qwen3's attention; a sparse mixture-of-experts block in the
 *                     layers model_layer_moe names (decoder_sparse_step, mlp_only_layers),
 *                     Qwen3's dense MLP in the others. Experts are read from either
 *                     checkpoint layout: one tensor per expert (mlp.experts.E.gate_proj.weight,
 *                     as the Hub stores them) or fused (mlp.experts.gate_up_proj [E, 2I, H],
 *                     mlp.experts.down_proj [E, H, I], transformers 5).
 * Weights of any float dtype (F32/BF16/F16/F64) are found and shape-checked here; the
 * backend decides what to keep (see model_files).
 */
#ifndef LOOM_MODEL_MODEL_H
#define LOOM_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"

typedef enum { MODEL_ARCH_LLAMA, MODEL_ARCH_QWEN2, MODEL_ARCH_QWEN3, MODEL_ARCH_QWEN3_MOE } model_arch;

#define MODEL_MAX_EOS 8
#define MODEL_MAX_EXPERTS 1024      /* num_experts of a MoE model */
#define MODEL_MAX_TOPK 64           /* num_experts_per_tok */
#define MODEL_MAX_MLP_ONLY 256      /* entries of mlp_only_layers */

typedef struct {
    model_arch arch;
    char architecture[64];      /* "LlamaForCausalLM", ... */
    char model_type[32];        /* "llama", "qwen2", "qwen3" */
    int vocab_size, hidden_size, intermediate_size, num_hidden_layers;
    int num_attention_heads, num_key_value_heads, head_dim;
    double rms_norm_eps, rope_theta;
    int max_position_embeddings;
    bool tie_word_embeddings;
    bool attention_bias;        /* q/k/v biases (Qwen2 always; Llama when attention_bias) */
    bool o_bias;                /* o_proj bias (Llama attention_bias only) */
    bool qk_norm;               /* Qwen3 */
    /* llama3 rope scaling (rope_scaling.rope_type == "llama3"); factor 0 = none */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
    int bos_token_id;           /* -1 if absent */
    int eos_token_ids[MODEL_MAX_EOS];
    int n_eos;                  /* eos_token_id may be an int or a list */
    char torch_dtype[16];       /* as written in config.json ("bfloat16", ...) or "" */
    /* Qwen3-MoE (transformers' Qwen3MoeConfig; num_experts 0 = a dense model). A token's
     * router probabilities are softmax(x Wrᵀ) over all experts; it goes to the
     * num_experts_per_tok most likely (ties: the lower index first), whose outputs are
     * summed weighted by those probabilities, renormalised to sum 1 when norm_topk_prob. */
    int num_experts, num_experts_per_tok, moe_intermediate_size;
    bool norm_topk_prob;
    int decoder_sparse_step;    /* layer l is sparse when (l + 1) % step == 0 ... */
    int mlp_only_layers[MODEL_MAX_MLP_ONLY]; /* ... and l is not listed here */
    int n_mlp_only;
} model_config;

/* One decoder layer's tensors as stored (any float dtype, inside the mapped files), each
 * checked against the config's shape; HF nn.Linear layout [out_features, in_features].
 * Bias tensors are NULL when the architecture has none; q_norm/k_norm NULL unless qk_norm. */
typedef struct {
    const st_tensor *attn_norm;                 /* [H] input_layernorm */
    const st_tensor *wq, *wk, *wv, *wo;         /* [nq*d, H], [nkv*d, H], [nkv*d, H], [H, nq*d] */
    const st_tensor *bq, *bk, *bv, *bo;         /* [nq*d], [nkv*d], [nkv*d], [H] */
    const st_tensor *q_norm, *k_norm;           /* [d] */
    const st_tensor *mlp_norm;                  /* [H] post_attention_layernorm */
    const st_tensor *wgate, *wup, *wdown;       /* [I, H], [I, H], [H, I]; NULL in a sparse layer */
    /* sparse layers (model_layer_moe) only, else NULL: the router and each expert's
     * SwiGLU, E = num_experts, Im = moe_intermediate_size */
    const st_tensor *router;                    /* [E, H] mlp.gate.weight */
    const st_tensor **exp_gate, **exp_up, **exp_down; /* [E] tensors each: [Im, H], [Im, H], [H, Im] */
} model_layer_tensors;

/* A model as stored: its config and its safetensors tensors, mapped, not converted. A
 * backend receives it at create and keeps the weights in whatever form it computes in
 * (the CPU backend converts to fp32; a GPU backend may upload bf16 as it is). */
typedef struct model_files {
    model_config cfg;
    st_set *set;                            /* the mapped files (sharded or not) */
    const st_tensor *embed;                 /* [V, H] */
    const st_tensor *final_norm;            /* [H] */
    const st_tensor *lm_head;               /* [V, H]; == embed when tied */
    model_layer_tensors *layers;            /* [L] */
    /* storage of the experts' tensor pointers, and of the per-expert views a fused
     * checkpoint's [E, 2I, H] / [E, H, I] tensors are cut into */
    const st_tensor **expert_ptrs;
    st_tensor *expert_views;
} model_files;

/* Parse dir/config.json only. 0 ok, -1 with err (unknown architecture, missing field, ...). */
int model_config_load(const char *dir, model_config *cfg, char *err, size_t errlen);
/* Same from a JSON text (tests). */
int model_config_parse(const char *json_text, model_config *cfg, char *err, size_t errlen);

/* Opens dir's config and weights (sharded or single file), finding every tensor the
 * config needs with its exact shape and a float dtype (F32, BF16, F16, F64). 0, or -1
 * with err naming the tensor. Nothing is converted or copied. */
int model_open(const char *dir, model_files **out, char *err, size_t errlen);
void model_close(model_files *m);

/* Every weight tensor in a fixed order (embedding, final norm, untied head, then layer by
 * layer; a sparse layer's router, then expert by expert its gate, up and down), for code
 * that treats them alike (loading, comparing). out holds MODEL_MAX_TENSORS(cfg) entries;
 * returns how many were written. */
#define MODEL_MAX_TENSORS(c) (3 + (15 + 1 + 3 * (c)->num_experts) * (c)->num_hidden_layers)
int model_tensor_list(const model_files *m, const st_tensor **out);

/* RoPE inverse frequencies for this config, d/2 values (applies llama3 scaling). */
void model_rope_inv_freq(const model_config *c, double *inv_freq);

/* Number of base parameters (tied head counted once). */
size_t model_num_params(const model_config *c);

/* Whether layer l is a sparse mixture-of-experts layer (transformers' Qwen3MoeDecoderLayer:
 * num_experts > 0, (l + 1) % decoder_sparse_step == 0, l not in mlp_only_layers). */
bool model_layer_moe(const model_config *c, int l);
/* The sparse layers: how many, and l's index among them (-1 for a dense layer). */
int model_num_moe_layers(const model_config *c);
int model_moe_index(const model_config *c, int l);

#endif
