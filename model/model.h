/* model.h — base model: HF config.json parsing and frozen fp32 weights.
 *
 * Supported architectures (dense decoder-only, HF layout):
 *   LlamaForCausalLM  — optional llama3 rope_scaling, optional attention_bias
 *   Qwen2ForCausalLM  — q/k/v biases
 *   Qwen3ForCausalLM  — explicit head_dim, per-head q_norm/k_norm before RoPE
 * Weights of any float dtype (F32/BF16/F16) are converted to fp32 at load and kept in one
 * allocation; the struct is public so backends (cpu, cuda) can read the tensors directly.
 * Everybody else should use model_get_config().
 */
#ifndef LOOM_MODEL_MODEL_H
#define LOOM_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* One decoder layer's weights; HF nn.Linear layout [out_features, in_features], row-major.
 * Bias pointers are NULL when the architecture has none; q_norm/k_norm NULL unless qk_norm. */
typedef struct {
    float *attn_norm;                   /* [H] input_layernorm */
    float *wq, *wk, *wv, *wo;           /* [nq*d, H], [nkv*d, H], [nkv*d, H], [H, nq*d] */
    float *bq, *bk, *bv, *bo;           /* [nq*d], [nkv*d], [nkv*d], [H] */
    float *q_norm, *k_norm;             /* [d] */
    float *mlp_norm;                    /* [H] post_attention_layernorm */
    float *wgate, *wup, *wdown;         /* [I, H], [I, H], [H, I] */
} model_layer;

typedef struct base_model {
    model_config cfg;
    float *embed;        /* [V, H] */
    float *final_norm;   /* [H] */
    float *lm_head;      /* [V, H]; == embed when tied */
    model_layer *layers; /* [L] */
    float *mem;          /* the one allocation holding all of the above */
    size_t num_floats;
} base_model;

/* Parse dir/config.json only. 0 ok, -1 with err (unknown architecture, missing field, ...). */
int model_config_load(const char *dir, model_config *cfg, char *err, size_t errlen);
/* Same from a JSON text (tests). */
int model_config_parse(const char *json_text, model_config *cfg, char *err, size_t errlen);

/* Load config + weights (sharded or single file). 0 ok, -1 with err. */
int model_load(const char *dir, base_model **out, char *err, size_t errlen);
void model_free(base_model *m);
const model_config *model_get_config(const base_model *m);

/* RoPE inverse frequencies for this config, d/2 values (applies llama3 scaling). */
void model_rope_inv_freq(const model_config *c, double *inv_freq);

/* Number of base parameters (tied head counted once). */
size_t model_num_params(const model_config *c);

#endif
