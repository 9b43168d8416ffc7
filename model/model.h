/* model.h — base model: HF config.json parsing and the stored weights.
 *
 * Supported architectures (dense decoder-only, HF layout):
 *   LlamaForCausalLM  — optional llama3 rope_scaling, optional attention_bias
 *   Qwen2ForCausalLM  — q/k/v biases
 *   Qwen3ForCausalLM  — explicit head_dim, per-head q_norm/k_norm before RoPE
 * Weights of any float dtype (F32/BF16/F16/F64) are found and shape-checked here; the
 * backend decides what to keep (see model_files).
 */
#ifndef LOOM_MODEL_MODEL_H
#define LOOM_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"

typedef enum { MODEL_ARCH_LLAMA, MODEL_ARCH_QWEN2, MODEL_ARCH_QWEN3 } model_arch;

#define MODEL_MAX_EOS 8

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
    const st_tensor *wgate, *wup, *wdown;       /* [I, H], [I, H], [H, I] */
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
 * layer), for code that treats them alike (loading, comparing). out holds
 * MODEL_MAX_TENSORS(cfg) entries; returns how many were written. */
#define MODEL_MAX_TENSORS(c) (3 + 15 * (c)->num_hidden_layers)
int model_tensor_list(const model_files *m, const st_tensor **out);

/* RoPE inverse frequencies for this config, d/2 values (applies llama3 scaling). */
void model_rope_inv_freq(const model_config *c, double *inv_freq);

/* Number of base parameters (tied head counted once). */
size_t model_num_params(const model_config *c);

#endif
