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

/* Qwen3MoeConfig's expert fields, with its defaults (128 experts, 8 per token, 768 wide,
 * no renormalisation, every layer sparse). */
static int md_moe(const json_t *root, model_config *c, char *err, size_t errlen)
{
    if (md_int(root, "num_experts", 128, false, 1, MODEL_MAX_EXPERTS, &c->num_experts, err, errlen) ||
        md_int(root, "num_experts_per_tok", 8, false, 1, MODEL_MAX_TOPK, &c->num_experts_per_tok, err, errlen) ||
        md_int(root, "moe_intermediate_size", 768, false, 1, 1 << 30, &c->moe_intermediate_size, err, errlen) ||
        md_int(root, "decoder_sparse_step", 1, false, 1, 100000, &c->decoder_sparse_step, err, errlen))
        return -1;
    if (c->num_experts_per_tok > c->num_experts) {
        err_set(err, errlen, "config.json: num_experts_per_tok %d exceeds num_experts %d", c->num_experts_per_tok,
                c->num_experts);
        return -1;
    }
    c->norm_topk_prob = md_bool(root, "norm_topk_prob", false);
    const json_t *mo = json_object_get(root, "mlp_only_layers");
    if (mo && !json_is_null(mo)) {
        if (!json_is_array(mo) || json_array_size(mo) > MODEL_MAX_MLP_ONLY) {
            err_set(err, errlen, "config.json: mlp_only_layers must be a list of at most %d layer indices",
                    MODEL_MAX_MLP_ONLY);
            return -1;
        }
        size_t i;
        const json_t *v;
        json_array_foreach(mo, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->num_hidden_layers) {
                err_set(err, errlen, "config.json: mlp_only_layers[%zu] is not a layer index below %d", i,
                        c->num_hidden_layers);
                return -1;
            }
            c->mlp_only_layers[c->n_mlp_only++] = (int)json_integer_value(v);
        }
    }
    /* output_router_logits (training adds router_aux_loss_coef × a load-balancing loss)
     * is not read: Loom's losses are the token losses of docs/protocol.md §8 only. */
    return 0;
}

bool model_layer_moe(const model_config *c, int l)
{
    if (c->num_experts <= 0 || (l + 1) % c->decoder_sparse_step) return false;
    for (int i = 0; i < c->n_mlp_only; i++)
        if (c->mlp_only_layers[i] == l) return false;
    return true;
}

int model_num_moe_layers(const model_config *c)
{
    int n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n += model_layer_moe(c, l);
    return n;
}

int model_moe_index(const model_config *c, int l)
{
    if (!model_layer_moe(c, l)) return -1;
    int n = 0;
    for (int k = 0; k < l; k++) n += model_layer_moe(c, k);
    return n;
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
    else if (strcmp(arch, "Qwen3MoeForCausalLM") == 0) c->arch = MODEL_ARCH_QWEN3_MOE;
    else {
        err_set(err, errlen, "config.json: unsupported architecture '%s' (supported: LlamaForCausalLM, "
               "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM)", arch);
        return -1;
    }
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    snprintf(c->model_type, sizeof c->model_type, "%s", mt ? mt : "");
    const int BIG = 1 << 30;
    bool moe = c->arch == MODEL_ARCH_QWEN3_MOE;
    /* Qwen3MoeConfig defaults intermediate_size (the dense layers' MLP) to 6144. */
    if (md_int(root, "vocab_size", 0, true, 1, BIG, &c->vocab_size, err, errlen) ||
        md_int(root, "hidden_size", 0, true, 1, BIG, &c->hidden_size, err, errlen) ||
        md_int(root, "intermediate_size", 6144, !moe, 1, BIG, &c->intermediate_size, err, errlen) ||
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
    c->qk_norm = c->arch == MODEL_ARCH_QWEN3 || moe;
    if (c->arch == MODEL_ARCH_QWEN2) c->attention_bias = true;
    if (c->arch == MODEL_ARCH_LLAMA && md_bool(root, "attention_bias", false)) c->attention_bias = c->o_bias = true;
    if ((c->arch == MODEL_ARCH_QWEN3 || moe) && md_bool(root, "attention_bias", false)) c->attention_bias = c->o_bias = true;
    if (moe && md_moe(root, c, err, errlen) < 0) return -1;
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
    size_t layer = 2 * H + H * nq * d * 2 + H * nkv * d * 2;
    if (c->attention_bias) layer += nq * d + 2 * nkv * d;
    if (c->o_bias) layer += H;
    if (c->qk_norm) layer += 2 * d;
    size_t total = V * H * (c->tie_word_embeddings ? 1 : 2) + H + layer * c->num_hidden_layers;
    for (int l = 0; l < c->num_hidden_layers; l++)
        total += model_layer_moe(c, l) ? (size_t)c->num_experts * H * (1 + 3 * (size_t)c->moe_intermediate_size)
                                       : 3 * H * I;
    return total;
}

/* t, or NULL with err when its dtype is not a float type. */
static const st_tensor *md_float(const st_tensor *t, char *err, size_t errlen)
{
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F64) {
        err_set(err, errlen, "model: tensor '%s' has dtype %s (a float type is needed)", t->name,
                st_dtype_name(t->dtype));
        return NULL;
    }
    return t;
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
    return md_float(t, err, errlen);
}

/* The fused [E, rows, cols] tensor `name` of s, checked like md_find. */
static const st_tensor *md_find3(const st_set *s, const char *name, int64_t E, int64_t rows, int64_t cols, char *err,
                                 size_t errlen)
{
    const st_tensor *t = st_set_find(s, name);
    if (!t) { err_set(err, errlen, "model: tensor '%s' not found", name); return NULL; }
    if (t->ndim != 3 || t->shape[0] != E || t->shape[1] != rows || t->shape[2] != cols) {
        err_set(err, errlen, "model: tensor '%s' has %d dimensions [%lld, %lld, ...], expected [%lld, %lld, %lld]", name,
                t->ndim, (long long)t->shape[0], t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)E,
                (long long)rows, (long long)cols);
        return NULL;
    }
    return md_float(t, err, errlen);
}

/* A [rows, cols] view of t's elements from `first` on (one expert's matrix in a fused tensor). */
static void md_view(st_tensor *v, const st_tensor *t, int64_t first, int64_t rows, int64_t cols)
{
    size_t es = st_dtype_size(t->dtype);
    *v = *t;
    v->ndim = 2;
    v->shape[0] = rows;
    v->shape[1] = cols;
    v->numel = rows * cols;
    v->data = t->data + (size_t)first * es;
    v->nbytes = (size_t)v->numel * es;
}

/* The experts of sparse layer l: one tensor per expert and projection as the Hub stores
 * them (mlp.experts.E.{gate,up,down}_proj.weight), else transformers 5's fused
 * mlp.experts.gate_up_proj [E, 2·Im, H] (gate rows first, as its chunk(2) reads them) and
 * mlp.experts.down_proj [E, H, Im], cut into per-expert views. */
static int md_experts(model_files *m, int l, char *err, size_t errlen)
{
    const model_config *c = &m->cfg;
    int64_t E = c->num_experts, H = c->hidden_size, Im = c->moe_intermediate_size;
    int k = model_moe_index(c, l);
    model_layer_tensors *ly = &m->layers[l];
    ly->exp_gate = m->expert_ptrs + (size_t)k * 3 * E;
    ly->exp_up = ly->exp_gate + E;
    ly->exp_down = ly->exp_up + E;
    char name[256];
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.0.gate_proj.weight", l);
    if (st_set_find(m->set, name)) {
        for (int64_t e = 0; e < E; e++) {
            static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
            const st_tensor **dst[3] = {&ly->exp_gate[e], &ly->exp_up[e], &ly->exp_down[e]};
            for (int p = 0; p < 3; p++) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%lld.%s.weight", l, (long long)e, proj[p]);
                if (!(*dst[p] = md_find(m->set, name, p == 2 ? H : Im, p == 2 ? Im : H, err, errlen))) return -1;
            }
        }
        return 0;
    }
    const st_tensor *gu, *dn;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
    if (!st_set_find(m->set, name)) {
        err_set(err, errlen, "model: layer %d has neither mlp.experts.0.gate_proj.weight (one tensor per expert) nor "
                "mlp.experts.gate_up_proj (fused experts)", l);
        return -1;
    }
    if (!(gu = md_find3(m->set, name, E, 2 * Im, H, err, errlen))) return -1;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", l);
    if (!(dn = md_find3(m->set, name, E, H, Im, err, errlen))) return -1;
    st_tensor *v = m->expert_views + (size_t)k * 3 * E;
    for (int64_t e = 0; e < E; e++) {
        md_view(&v[e], gu, e * 2 * Im * H, Im, H);
        md_view(&v[E + e], gu, e * 2 * Im * H + Im * H, Im, H);
        md_view(&v[2 * E + e], dn, e * H * Im, H, Im);
        ly->exp_gate[e] = &v[e];
        ly->exp_up[e] = &v[E + e];
        ly->exp_down[e] = &v[2 * E + e];
    }
    return 0;
}

int model_open(const char *dir, model_files **out, char *err, size_t errlen)
{
    *out = NULL;
    model_files *m = calloc(1, sizeof *m);
    if (!m) { err_set(err, errlen, "model: out of memory"); return -1; }
    if (model_config_load(dir, &m->cfg, err, errlen) != 0 || st_set_open_dir(dir, &m->set, err, errlen) != 0) goto fail;
    const model_config *c = &m->cfg;
    m->layers = calloc(c->num_hidden_layers, sizeof *m->layers);
    size_t nexp = (size_t)model_num_moe_layers(c) * 3 * c->num_experts;
    m->expert_ptrs = calloc(nexp ? nexp : 1, sizeof *m->expert_ptrs);
    m->expert_views = calloc(nexp ? nexp : 1, sizeof *m->expert_views);
    if (!m->layers || !m->expert_ptrs || !m->expert_views) { err_set(err, errlen, "model: out of memory"); goto fail; }
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
        if (model_layer_moe(c, l)) {
            LFIND(ly->router, "mlp.gate.weight", c->num_experts, H);
            if (md_experts(m, l, err, errlen) < 0) goto fail;
            continue;
        }
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
    free(m->expert_ptrs);
    free(m->expert_views);
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
                                  y->q_norm, y->k_norm, y->mlp_norm, y->wgate, y->wup, y->wdown, y->router};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i]) out[n++] = all[i];
        if (!y->router) continue;
        for (int e = 0; e < m->cfg.num_experts; e++) {
            out[n++] = y->exp_gate[e];
            out[n++] = y->exp_up[e];
            out[n++] = y->exp_down[e];
        }
    }
    return n;
}
