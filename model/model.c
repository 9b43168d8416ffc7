/* model.c — HF config.json parsing and the stored weights of a model (model_open). */
#include "model/model.h"
#include "model/safetensors.h"
#include "common/err.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads an integer field; absent → def (or error when def < 0 means "required"). */
static int md_int(const json_t *o, const char *key, long long def, bool required, long long lo, long long hi,
                  int *out, char *err, size_t errlen)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) { err_set(err, errlen, "config.json: missing \"%s\"", key); return -1; }
        *out = (int)def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        err_set(err, errlen, "config.json: \"%s\" must be an integer in [%lld, %lld]", key, lo, hi);
        return -1;
    }
    *out = (int)json_integer_value(v);
    return 0;
}

static int md_num(const json_t *o, const char *key, double def, double *out, char *err, size_t errlen)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (!json_is_number(v)) { err_set(err, errlen, "config.json: \"%s\" must be a number", key); return -1; }
    *out = json_number_value(v);
    return 0;
}

static bool md_bool(const json_t *o, const char *key, bool def)
{
    const json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static int md_rope_scaling(const json_t *root, model_config *c, char *err, size_t errlen)
{
    const json_t *rs = json_object_get(root, "rope_scaling");
    if (!rs || json_is_null(rs)) return 0;
    if (!json_is_object(rs)) { err_set(err, errlen, "config.json: rope_scaling must be an object"); return -1; }
    const char *type = json_string_value(json_object_get(rs, "rope_type"));
    if (!type) type = json_string_value(json_object_get(rs, "type"));
    if (type && strcmp(type, "default") == 0) return 0;
    if (!type || strcmp(type, "llama3") != 0) {
        err_set(err, errlen, "config.json: unsupported rope_scaling type '%s' (only llama3)", type ? type : "?");
        return -1;
    }
    if (md_num(rs, "factor", 8.0, &c->rope_factor, err, errlen) || md_num(rs, "low_freq_factor", 1.0, &c->rope_low_freq_factor, err, errlen) ||
        md_num(rs, "high_freq_factor", 4.0, &c->rope_high_freq_factor, err, errlen) ||
        md_int(rs, "original_max_position_embeddings", 8192, false, 1, 1 << 30, &c->rope_original_max_pos, err, errlen))
        return -1;
    if (c->rope_factor <= 0 || c->rope_high_freq_factor <= c->rope_low_freq_factor || c->rope_low_freq_factor <= 0) {
        err_set(err, errlen, "config.json: bad llama3 rope_scaling factors");
        return -1;
    }
    return 0;
}

static int md_parse_root(const json_t *root, model_config *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) { err_set(err, errlen, "config.json: not a JSON object"); return -1; }
    const json_t *archs = json_object_get(root, "architectures");
    const char *arch = json_string_value(json_array_get(archs, 0));
    if (!arch) { err_set(err, errlen, "config.json: missing \"architectures\""); return -1; }
    snprintf(c->architecture, sizeof c->architecture, "%s", arch);
    if (strcmp(arch, "LlamaForCausalLM") == 0) c->arch = MODEL_ARCH_LLAMA;
    else if (strcmp(arch, "Qwen2ForCausalLM") == 0) c->arch = MODEL_ARCH_QWEN2;
    else if (strcmp(arch, "Qwen3ForCausalLM") == 0) c->arch = MODEL_ARCH_QWEN3;
    else {
        err_set(err, errlen, "config.json: unsupported architecture '%s' (supported: LlamaForCausalLM, "
               "Qwen2ForCausalLM, Qwen3ForCausalLM)", arch);
        return -1;
    }
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    snprintf(c->model_type, sizeof c->model_type, "%s", mt ? mt : "");
    const int BIG = 1 << 30;
    if (md_int(root, "vocab_size", 0, true, 1, BIG, &c->vocab_size, err, errlen) ||
        md_int(root, "hidden_size", 0, true, 1, BIG, &c->hidden_size, err, errlen) ||
        md_int(root, "intermediate_size", 0, true, 1, BIG, &c->intermediate_size, err, errlen) ||
        md_int(root, "num_hidden_layers", 0, true, 1, 100000, &c->num_hidden_layers, err, errlen) ||
        md_int(root, "num_attention_heads", 0, true, 1, 100000, &c->num_attention_heads, err, errlen) ||
        md_int(root, "num_key_value_heads", c->num_attention_heads, false, 1, 100000, &c->num_key_value_heads, err, errlen) ||
        md_int(root, "max_position_embeddings", 2048, false, 1, BIG, &c->max_position_embeddings, err, errlen) ||
        md_int(root, "bos_token_id", -1, false, 0, BIG, &c->bos_token_id, err, errlen))
        return -1;
    /* Llama configs may carry head_dim too (newer transformers); otherwise H / heads. */
    if (md_int(root, "head_dim", 0, false, 1, 100000, &c->head_dim, err, errlen)) return -1;
    if (c->head_dim == 0) {
        if (c->hidden_size % c->num_attention_heads) {
            err_set(err, errlen, "config.json: hidden_size %d not divisible by %d heads", c->hidden_size, c->num_attention_heads);
            return -1;
        }
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    if (c->head_dim % 2) { err_set(err, errlen, "config.json: head_dim %d must be even for RoPE", c->head_dim); return -1; }
    if (c->num_attention_heads % c->num_key_value_heads) {
        err_set(err, errlen, "config.json: %d heads not a multiple of %d kv heads", c->num_attention_heads, c->num_key_value_heads);
        return -1;
    }
    if (md_num(root, "rms_norm_eps", 1e-6, &c->rms_norm_eps, err, errlen) ||
        md_num(root, "rope_theta", 10000.0, &c->rope_theta, err, errlen) || md_rope_scaling(root, c, err, errlen))
        return -1;
    if (c->rope_theta <= 0 || c->rms_norm_eps < 0) { err_set(err, errlen, "config.json: bad rope_theta or rms_norm_eps"); return -1; }
    c->tie_word_embeddings = md_bool(root, "tie_word_embeddings", false);
    c->qk_norm = c->arch == MODEL_ARCH_QWEN3;
    if (c->arch == MODEL_ARCH_QWEN2) c->attention_bias = true;
    if (c->arch == MODEL_ARCH_LLAMA && md_bool(root, "attention_bias", false)) c->attention_bias = c->o_bias = true;
    if (c->arch == MODEL_ARCH_QWEN3 && md_bool(root, "attention_bias", false)) c->attention_bias = c->o_bias = true;
    if (md_bool(root, "mlp_bias", false)) { err_set(err, errlen, "config.json: mlp_bias is not supported"); return -1; }
    if (md_bool(root, "use_sliding_window", false)) { err_set(err, errlen, "config.json: sliding-window attention is not supported"); return -1; }
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    if (act && strcmp(act, "silu") != 0) { err_set(err, errlen, "config.json: hidden_act '%s' not supported (silu only)", act); return -1; }

    const json_t *eos = json_object_get(root, "eos_token_id");
    if (json_is_integer(eos)) {
        c->eos_token_ids[c->n_eos++] = (int)json_integer_value(eos);
    } else if (json_is_array(eos)) {
        size_t i;
        const json_t *v;
        json_array_foreach(eos, i, v) if (json_is_integer(v) && c->n_eos < MODEL_MAX_EOS) c->eos_token_ids[c->n_eos++] = (int)json_integer_value(v);
    }
    const char *dt = json_string_value(json_object_get(root, "torch_dtype"));
    if (!dt) dt = json_string_value(json_object_get(root, "dtype"));
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", dt ? dt : "");
    return 0;
}

int model_config_parse(const char *text, model_config *cfg, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root) { err_set(err, errlen, "config.json: %s (line %d)", je.text, je.line); return -1; }
    int rc = md_parse_root(root, cfg, err, errlen);
    json_decref(root);
    return rc;
}

int model_config_load(const char *dir, model_config *cfg, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) { err_set(err, errlen, "%s: %s", path, je.text); return -1; }
    int rc = md_parse_root(root, cfg, err, errlen);
    json_decref(root);
    return rc;
}

void model_rope_inv_freq(const model_config *c, double *inv)
{
    int d = c->head_dim;
    for (int i = 0; i < d / 2; i++) inv[i] = 1.0 / pow(c->rope_theta, (2.0 * i) / d);
    if (c->rope_factor <= 0) return;
    /* HF _compute_llama3_parameters: long wavelengths are slowed by `factor`, short ones
     * kept, the band between interpolated smoothly. */
    double old = c->rope_original_max_pos, lo_wl = old / c->rope_low_freq_factor, hi_wl = old / c->rope_high_freq_factor;
    for (int i = 0; i < d / 2; i++) {
        double wl = 2.0 * 3.14159265358979323846 / inv[i];
        if (wl > lo_wl) {
            inv[i] /= c->rope_factor;
        } else if (wl >= hi_wl) {
            double s = (old / wl - c->rope_low_freq_factor) / (c->rope_high_freq_factor - c->rope_low_freq_factor);
            inv[i] = (1 - s) * inv[i] / c->rope_factor + s * inv[i];
        }
    }
}

size_t model_num_params(const model_config *c)
{
    size_t H = c->hidden_size, I = c->intermediate_size, d = c->head_dim, nq = c->num_attention_heads,
           nkv = c->num_key_value_heads, V = c->vocab_size;
    size_t layer = 2 * H + H * nq * d * 2 + H * nkv * d * 2 + 3 * H * I;
    if (c->attention_bias) layer += nq * d + 2 * nkv * d;
    if (c->o_bias) layer += H;
    if (c->qk_norm) layer += 2 * d;
    return V * H * (c->tie_word_embeddings ? 1 : 2) + H + layer * c->num_hidden_layers;
}

/* The tensor `name` of s, checked: rows (cols 0 = a vector) and a float dtype. */
static const st_tensor *md_find(const st_set *s, const char *name, int64_t rows, int64_t cols, char *err, size_t errlen)
{
    const st_tensor *t = st_set_find(s, name);
    if (!t) { err_set(err, errlen, "model: tensor '%s' not found", name); return NULL; }
    bool ok = cols ? (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols) : (t->ndim == 1 && t->shape[0] == rows);
    if (!ok) {
        err_set(err, errlen, "model: tensor '%s' has shape [%lld%s%lld], expected [%lld, %lld]", name,
                (long long)t->shape[0], t->ndim > 1 ? ", " : "", t->ndim > 1 ? (long long)t->shape[1] : 0LL,
                (long long)rows, (long long)cols);
        return NULL;
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F64) {
        err_set(err, errlen, "model: tensor '%s' has dtype %s (a float type is needed)", name, st_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

int model_open(const char *dir, model_files **out, char *err, size_t errlen)
{
    *out = NULL;
    model_files *m = calloc(1, sizeof *m);
    if (!m) { err_set(err, errlen, "model: out of memory"); return -1; }
    if (model_config_load(dir, &m->cfg, err, errlen) != 0 || st_set_open_dir(dir, &m->set, err, errlen) != 0) goto fail;
    const model_config *c = &m->cfg;
    m->layers = calloc(c->num_hidden_layers, sizeof *m->layers);
    if (!m->layers) { err_set(err, errlen, "model: out of memory"); goto fail; }
    int64_t H = c->hidden_size, I = c->intermediate_size, d = c->head_dim, nq = c->num_attention_heads,
            nkv = c->num_key_value_heads, V = c->vocab_size;
#define FIND(dst, name, r, cc)                                                        \
    do {                                                                              \
        if (!((dst) = md_find(m->set, (name), (r), (cc), err, errlen))) goto fail;   \
    } while (0)
    FIND(m->embed, "model.embed_tokens.weight", V, H);
    FIND(m->final_norm, "model.norm.weight", H, 0);
    if (c->tie_word_embeddings) m->lm_head = m->embed;
    else FIND(m->lm_head, "lm_head.weight", V, H);
    char name[256];
    for (int l = 0; l < c->num_hidden_layers; l++) {
        model_layer_tensors *ly = &m->layers[l];
#define LFIND(dst, suffix, r, cc)                                                     \
    do {                                                                              \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, (suffix));               \
        FIND(dst, name, r, cc);                                                       \
    } while (0)
        LFIND(ly->attn_norm, "input_layernorm.weight", H, 0);
        LFIND(ly->wq, "self_attn.q_proj.weight", nq * d, H);
        LFIND(ly->wk, "self_attn.k_proj.weight", nkv * d, H);
        LFIND(ly->wv, "self_attn.v_proj.weight", nkv * d, H);
        LFIND(ly->wo, "self_attn.o_proj.weight", H, nq * d);
        if (c->attention_bias) {
            LFIND(ly->bq, "self_attn.q_proj.bias", nq * d, 0);
            LFIND(ly->bk, "self_attn.k_proj.bias", nkv * d, 0);
            LFIND(ly->bv, "self_attn.v_proj.bias", nkv * d, 0);
        }
        if (c->o_bias) LFIND(ly->bo, "self_attn.o_proj.bias", H, 0);
        if (c->qk_norm) {
            LFIND(ly->q_norm, "self_attn.q_norm.weight", d, 0);
            LFIND(ly->k_norm, "self_attn.k_norm.weight", d, 0);
        }
        LFIND(ly->mlp_norm, "post_attention_layernorm.weight", H, 0);
        LFIND(ly->wgate, "mlp.gate_proj.weight", I, H);
        LFIND(ly->wup, "mlp.up_proj.weight", I, H);
        LFIND(ly->wdown, "mlp.down_proj.weight", H, I);
#undef LFIND
    }
#undef FIND
    *out = m;
    return 0;
fail:
    model_close(m);
    return -1;
}

void model_close(model_files *m)
{
    if (!m) return;
    st_set_close(m->set);
    free(m->layers);
    free(m);
}

int model_tensor_list(const model_files *m, const st_tensor **out)
{
    int n = 0;
    out[n++] = m->embed;
    out[n++] = m->final_norm;
    if (m->lm_head != m->embed) out[n++] = m->lm_head;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        const model_layer_tensors *y = &m->layers[l];
        const st_tensor *all[] = {y->attn_norm, y->wq, y->wk, y->wv, y->wo, y->bq, y->bk, y->bv, y->bo,
                                  y->q_norm, y->k_norm, y->mlp_norm, y->wgate, y->wup, y->wdown};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i]) out[n++] = all[i];
    }
    return n;
}
