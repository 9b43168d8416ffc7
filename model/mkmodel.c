/* mkmodel.c — random-initialised HF-layout models (config.json + model.safetensors). */
#include "model/mkmodel.h"
#include "common/config.h"
#include <limits.h>
#include "model/rng.h"
#include "model/safetensors.h"
#include "common/err.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int mkmodel_defaults(mkmodel_opts *o, const char *arch, const char *preset, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    if (!arch || (strcmp(arch, "llama") && strcmp(arch, "qwen2") && strcmp(arch, "qwen3") && strcmp(arch, "qwen3_moe"))) {
        err_set(err, errlen, "mkmodel: --arch must be llama, qwen2, qwen3 or qwen3_moe");
        return -1;
    }
    bool moe = !strcmp(arch, "qwen3_moe");
    snprintf(o->arch, sizeof o->arch, "%s", arch);
    bool qwen = arch[0] == 'q';
    o->seed = 1234;
    o->init_std = 0.02;
    o->norm_noise = 0.1;
    o->rms_eps = qwen ? 1e-6 : 1e-5;
    if (!preset || strcmp(preset, "tiny") == 0) {
        o->vocab = 256;
        o->hidden = 64;
        o->inter = 128;
        o->layers = 2;
        o->heads = 4;
        o->kv_heads = 2;
        /* Qwen3's head_dim is independent of hidden/heads (0.6B: 1024/16 = 64 but d = 128);
         * the tiny qwen3 keeps that property so the explicit-head_dim path is exercised. */
        o->head_dim = strcmp(arch, "qwen3") == 0 || moe ? 32 : 16;
        o->max_pos = 2048;
        o->tie = qwen; /* llama tiny untied, qwen tiny tied: both head cases get tested */
        o->rope_theta = 10000.0;
        o->bos = 1;
        o->eos = 2;
        /* 8 experts, 2 per token: enough for unbalanced routing, small enough that every
         * expert sees tokens in a test batch. */
        o->experts = 8;
        o->top_k = 2;
        o->moe_inter = 32;
        o->norm_topk = true;
        o->sparse_step = 1;
    } else if (strcmp(preset, "qwen3-30b-a3b") == 0) {
        if (!moe) { err_set(err, errlen, "mkmodel: preset qwen3-30b-a3b is a qwen3_moe model"); return -1; }
        o->vocab = 151936;
        o->hidden = 2048;
        o->inter = 6144;
        o->layers = 48;
        o->heads = 32;
        o->kv_heads = 4;
        o->head_dim = 128;
        o->max_pos = 40960;
        o->tie = false;
        o->rope_theta = 1000000.0;
        o->bos = 151643;
        o->eos = 151645;
        o->experts = 128;
        o->top_k = 8;
        o->moe_inter = 768;
        o->norm_topk = true;
        o->sparse_step = 1;
    } else if (strcmp(preset, "qwen3-0.6b") == 0) {
        o->vocab = 151936;
        o->hidden = 1024;
        o->inter = 3072;
        o->layers = 28;
        o->heads = 16;
        o->kv_heads = 8;
        o->head_dim = 128;
        o->max_pos = 40960;
        o->tie = true;
        o->rope_theta = 1000000.0;
        o->bos = 151643;
        o->eos = 151645;
    } else {
        err_set(err, errlen, "mkmodel: unknown preset '%s' (tiny, qwen3-0.6b, qwen3-30b-a3b)", preset);
        return -1;
    }
    return 0;
}

/* ---- tensor list -------------------------------------------------------------------- */

typedef enum { MK_NORMAL, MK_NORM_WEIGHT } mk_kind;

typedef struct {
    const mkmodel_opts *o;
    st_write_desc *d;
    mk_kind *kind;
    char **names;
    int n, cap;
} mk_list;

static int mk_add3(mk_list *l, const char *name, int64_t d0, int64_t d1, int64_t d2, mk_kind kind);

static int mk_add(mk_list *l, const char *name, int64_t rows, int64_t cols, mk_kind kind)
{
    return mk_add3(l, name, rows, cols, 0, kind);
}

/* A tensor [d0] (d1 = 0), [d0, d1] (d2 = 0) or [d0, d1, d2]. */
static int mk_add3(mk_list *l, const char *name, int64_t d0, int64_t d1, int64_t d2, mk_kind kind)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        st_write_desc *d = realloc(l->d, cap * sizeof *d);
        if (d) l->d = d;
        mk_kind *k = realloc(l->kind, cap * sizeof *k);
        if (k) l->kind = k;
        char **nm = realloc(l->names, cap * sizeof *nm);
        if (nm) l->names = nm;
        if (!d || !k || !nm) return -1;
        l->cap = cap;
    }
    l->names[l->n] = strdup(name);
    if (!l->names[l->n]) return -1;
    st_write_desc *d = &l->d[l->n];
    memset(d, 0, sizeof *d);
    d->name = l->names[l->n];
    d->dtype = l->o->bf16 ? ST_BF16 : ST_F32;
    d->ndim = d2 ? 3 : d1 ? 2 : 1;
    d->shape[0] = d0;
    d->shape[1] = d1;
    d->shape[2] = d2;
    l->kind[l->n] = kind;
    l->n++;
    return 0;
}

/* Qwen3MoeDecoderLayer's rule (model_layer_moe). */
static bool mk_layer_moe(const mkmodel_opts *o, int l)
{
    if ((l + 1) % o->sparse_step) return false;
    for (int i = 0; i < o->n_mlp_only; i++)
        if (o->mlp_only[i] == l) return false;
    return true;
}

static int mk_build_list(mk_list *l)
{
    const mkmodel_opts *o = l->o;
    bool moe = strcmp(o->arch, "qwen3_moe") == 0, qwen3 = strcmp(o->arch, "qwen3") == 0 || moe,
         qwen2 = strcmp(o->arch, "qwen2") == 0;
    int64_t H = o->hidden, I = o->inter, d = o->head_dim, nq = o->heads, nkv = o->kv_heads, E = o->experts,
            Im = o->moe_inter;
    char n[256];
    int rc = mk_add(l, "model.embed_tokens.weight", o->vocab, H, MK_NORMAL);
    for (int i = 0; i < o->layers && rc == 0; i++) {
#define ADD(suffix, r, c, k) (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix), rc |= mk_add(l, n, r, c, k))
        ADD("input_layernorm.weight", H, 0, MK_NORM_WEIGHT);
        ADD("self_attn.q_proj.weight", nq * d, H, MK_NORMAL);
        ADD("self_attn.k_proj.weight", nkv * d, H, MK_NORMAL);
        ADD("self_attn.v_proj.weight", nkv * d, H, MK_NORMAL);
        if (qwen2) {
            ADD("self_attn.q_proj.bias", nq * d, 0, MK_NORMAL);
            ADD("self_attn.k_proj.bias", nkv * d, 0, MK_NORMAL);
            ADD("self_attn.v_proj.bias", nkv * d, 0, MK_NORMAL);
        }
        ADD("self_attn.o_proj.weight", H, nq * d, MK_NORMAL);
        if (qwen3) {
            ADD("self_attn.q_norm.weight", d, 0, MK_NORM_WEIGHT);
            ADD("self_attn.k_norm.weight", d, 0, MK_NORM_WEIGHT);
        }
        ADD("post_attention_layernorm.weight", H, 0, MK_NORM_WEIGHT);
        if (moe && mk_layer_moe(o, i)) {
            ADD("mlp.gate.weight", E, H, MK_NORMAL);
            if (o->fused_experts) {
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", i);
                rc |= mk_add3(l, n, E, 2 * Im, H, MK_NORMAL);
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj", i);
                rc |= mk_add3(l, n, E, H, Im, MK_NORMAL);
                continue;
            }
            for (int64_t e = 0; e < E; e++) {
                char s[96];
                snprintf(s, sizeof s, "mlp.experts.%lld.gate_proj.weight", (long long)e);
                ADD(s, Im, H, MK_NORMAL);
                snprintf(s, sizeof s, "mlp.experts.%lld.up_proj.weight", (long long)e);
                ADD(s, Im, H, MK_NORMAL);
                snprintf(s, sizeof s, "mlp.experts.%lld.down_proj.weight", (long long)e);
                ADD(s, H, Im, MK_NORMAL);
            }
            continue;
        }
        ADD("mlp.gate_proj.weight", I, H, MK_NORMAL);
        ADD("mlp.up_proj.weight", I, H, MK_NORMAL);
        ADD("mlp.down_proj.weight", H, I, MK_NORMAL);
#undef ADD
    }
    rc |= mk_add(l, "model.norm.weight", H, 0, MK_NORM_WEIGHT);
    if (!o->tie) rc |= mk_add(l, "lm_head.weight", o->vocab, H, MK_NORMAL);
    return rc;
}

static int mk_fill(void *user, int i, void *dst, size_t nbytes, char *err, size_t errlen)
{
    const mk_list *l = user;
    const mkmodel_opts *o = l->o;
    /* One stream per tensor, keyed by name: files are reproducible and independent of
     * which other tensors exist. */
    rng_state r;
    rng_seed(&r, o->seed ^ rng_hash_str(l->d[i].name));
    size_t es = l->d[i].dtype == ST_BF16 ? 2 : 4, n = nbytes / es;
    for (size_t k = 0; k < n; k++) {
        float v = l->kind[i] == MK_NORM_WEIGHT ? (float)(1.0 + o->norm_noise * rng_normal(&r))
                                               : (float)(o->init_std * rng_normal(&r));
        if (es == 2) {
            uint16_t h = st_f32_to_bf16(v);
            memcpy((uint8_t *)dst + 2 * k, &h, 2);
        } else {
            memcpy((uint8_t *)dst + 4 * k, &v, 4);
        }
    }
    (void)err;
    (void)errlen;
    return 0;
}

static int mk_write_config(const mkmodel_opts *o, const char *path, char *err, size_t errlen)
{
    bool moe = strcmp(o->arch, "qwen3_moe") == 0, qwen3 = strcmp(o->arch, "qwen3") == 0 || moe,
         qwen2 = strcmp(o->arch, "qwen2") == 0;
    const char *archname = moe ? "Qwen3MoeForCausalLM" : qwen3 ? "Qwen3ForCausalLM" : qwen2 ? "Qwen2ForCausalLM"
                                                                                      : "LlamaForCausalLM";
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", archname));
    json_object_set_new(c, "model_type", json_string(o->arch));
    json_object_set_new(c, "vocab_size", json_integer(o->vocab));
    json_object_set_new(c, "hidden_size", json_integer(o->hidden));
    json_object_set_new(c, "intermediate_size", json_integer(o->inter));
    json_object_set_new(c, "num_hidden_layers", json_integer(o->layers));
    json_object_set_new(c, "num_attention_heads", json_integer(o->heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(o->kv_heads));
    json_object_set_new(c, "head_dim", json_integer(o->head_dim));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "max_position_embeddings", json_integer(o->max_pos));
    json_object_set_new(c, "rms_norm_eps", json_real(o->rms_eps));
    json_object_set_new(c, "rope_theta", json_real(o->rope_theta));
    if (o->rope_llama3) {
        /* Original context a quarter of max_pos, so that short, medium and long
         * wavelengths all occur even in a tiny model. */
        int orig = o->max_pos / 4 > 0 ? o->max_pos / 4 : 1;
        json_object_set_new(c, "rope_scaling", json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", 8.0,
                                                         "low_freq_factor", 1.0, "high_freq_factor", 4.0,
                                                         "original_max_position_embeddings", orig));
    } else {
        json_object_set_new(c, "rope_scaling", json_null());
    }
    json_object_set_new(c, "tie_word_embeddings", json_boolean(o->tie));
    json_object_set_new(c, "attention_bias", json_boolean(qwen2));
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    if (!qwen3 && !qwen2) json_object_set_new(c, "mlp_bias", json_false());
    if (qwen2 || qwen3) json_object_set_new(c, "use_sliding_window", json_false());
    json_object_set_new(c, "bos_token_id", json_integer(o->bos));
    json_object_set_new(c, "eos_token_id", json_integer(o->eos));
    json_object_set_new(c, "torch_dtype", json_string(o->bf16 ? "bfloat16" : "float32"));
    json_object_set_new(c, "initializer_range", json_real(o->init_std));
    if (moe) {
        json_object_set_new(c, "num_experts", json_integer(o->experts));
        json_object_set_new(c, "num_experts_per_tok", json_integer(o->top_k));
        json_object_set_new(c, "moe_intermediate_size", json_integer(o->moe_inter));
        json_object_set_new(c, "norm_topk_prob", json_boolean(o->norm_topk));
        json_object_set_new(c, "decoder_sparse_step", json_integer(o->sparse_step));
        json_t *mo = json_array();
        for (int i = 0; i < o->n_mlp_only; i++) json_array_append_new(mo, json_integer(o->mlp_only[i]));
        json_object_set_new(c, "mlp_only_layers", mo);
        json_object_set_new(c, "output_router_logits", json_false());
        json_object_set_new(c, "router_aux_loss_coef", json_real(0.001));
    }
    int rc = json_dump_file(c, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    json_decref(c);
    if (rc != 0) { err_set(err, errlen, "mkmodel: cannot write %s", path); return -1; }
    return 0;
}

int mkmodel_write(const mkmodel_opts *o, char *err, size_t errlen)
{
    if (!o->out_dir) { err_set(err, errlen, "mkmodel: no output directory"); return -1; }
    if (o->vocab < 1 || o->hidden < 1 || o->inter < 1 || o->layers < 1 || o->heads < 1 || o->kv_heads < 1 ||
        o->head_dim < 2 || o->head_dim % 2 || o->heads % o->kv_heads || o->max_pos < 1) {
        err_set(err, errlen, "mkmodel: bad geometry (need positive sizes, even head_dim, heads %% kv_heads == 0)");
        return -1;
    }
    if (!strcmp(o->arch, "qwen3_moe") &&
        (o->experts < 1 || o->experts > 1024 || o->top_k < 1 || o->top_k > o->experts || o->top_k > 64 ||
         o->moe_inter < 1 || o->sparse_step < 1)) {
        err_set(err, errlen, "mkmodel: bad experts (need 1 <= top-k <= experts <= 1024, top-k <= 64, moe-inter >= 1, "
                "sparse-step >= 1)");
        return -1;
    }
    for (int i = 0; i < o->n_mlp_only; i++)
        if (o->mlp_only[i] < 0 || o->mlp_only[i] >= o->layers) {
            err_set(err, errlen, "mkmodel: --mlp-only %d is not a layer (0..%d)", o->mlp_only[i], o->layers - 1);
            return -1;
        }
    /* Like mkdir -p: `--out /var/lib/loom/models/tiny-llama` on a fresh install. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", o->out_dir);
    for (char *p = dir + 1; ; p++) {
        bool last = !*p;
        if (*p != '/' && !last) continue;
        *p = 0;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            err_set(err, errlen, "mkmodel: mkdir %s: %s", dir, strerror(errno));
            return -1;
        }
        if (last) break;
        *p = '/';
    }
    size_t pl = strlen(o->out_dir) + 32;
    char *path = malloc(pl);
    mk_list l = {.o = o};
    int rc = -1;
    if (!path) { err_set(err, errlen, "mkmodel: out of memory"); return -1; }
    snprintf(path, pl, "%s/config.json", o->out_dir);
    if (mk_write_config(o, path, err, errlen) != 0) goto out;
    if (mk_build_list(&l) != 0) { err_set(err, errlen, "mkmodel: out of memory"); goto out; }
    snprintf(path, pl, "%s/model.safetensors", o->out_dir);
    rc = st_write_stream(path, l.d, l.n, NULL, mk_fill, &l, err, errlen);
    if (rc == 0) {
        char terr[256], *cpath = malloc(pl);
        snprintf(path, pl, "%s/tokenizer.json", o->out_dir);
        if (cpath) snprintf(cpath, pl, "%s/tokenizer_config.json", o->out_dir);
        int trc = cpath ? mkmodel_write_tokenizer(path, cpath, o->arch, o->vocab, o->bos, o->eos, terr, sizeof terr) : -1;
        if (!cpath) snprintf(terr, sizeof terr, "mkmodel: out of memory");
        free(cpath);
        if (trc < 0) { err_set(err, errlen, "%s", terr); rc = -1; }
    }
out:
    for (int i = 0; i < l.n; i++) free(l.names[i]);
    free(l.names);
    free(l.d);
    free(l.kind);
    free(path);
    return rc;
}

/* ---- CLI ---------------------------------------------------------------------------- */

static const opt_spec MK_OPTS[] = {
    {.name = "arch", .kind = OPT_STR, .arg = "llama|qwen2|qwen3|qwen3_moe", .required = true, .help = "architecture"},
    {.name = "out", .kind = OPT_STR, .arg = "DIR", .required = true, .help = "where to write the model"},
    {.name = "preset", .kind = OPT_STR, .arg = "tiny|qwen3-0.6b|qwen3-30b-a3b", .def = "tiny",
     .help = "geometry the rest overrides"},
    {.name = "layers", .kind = OPT_INT, .arg = "N", .lo = 1, .hi = 1 << 30, .help = "layers"},
    {.name = "hidden", .kind = OPT_INT, .arg = "H", .lo = 1, .hi = 1 << 30, .help = "hidden size"},
    {.name = "inter", .kind = OPT_INT, .arg = "I", .lo = 1, .hi = 1 << 30, .help = "MLP size"},
    {.name = "heads", .kind = OPT_INT, .arg = "N", .lo = 1, .hi = 1 << 30, .help = "attention heads"},
    {.name = "kv-heads", .kind = OPT_INT, .arg = "N", .lo = 1, .hi = 1 << 30, .help = "key/value heads"},
    {.name = "head-dim", .kind = OPT_INT, .arg = "D", .lo = 1, .hi = 1 << 30, .help = "head dimension"},
    {.name = "vocab", .kind = OPT_INT, .arg = "V", .lo = 1, .hi = 1 << 30, .help = "vocabulary size"},
    {.name = "max-pos", .kind = OPT_INT, .arg = "P", .lo = 1, .hi = 1 << 30, .help = "context length"},
    {.name = "tie", .kind = OPT_INT, .arg = "0|1", .lo = 0, .hi = 1, .help = "tie the output head to the embedding"},
    {.name = "seed", .kind = OPT_INT, .arg = "S", .lo = 0, .hi = LONG_MAX, .help = "random seed"},
    {.name = "dtype", .kind = OPT_STR, .arg = "f32|bf16", .help = "weight type"},
    {.name = "init-std", .kind = OPT_STR, .arg = "X", .help = "weights' standard deviation"},
    {.name = "norm-noise", .kind = OPT_STR, .arg = "X", .help = "noise on the norm weights"},
    {.name = "rope-theta", .kind = OPT_STR, .arg = "X", .help = "RoPE base"},
    {.name = "rope-scaling", .kind = OPT_STR, .arg = "llama3", .help = "RoPE scaling"},
    {.name = "experts", .kind = OPT_INT, .arg = "E", .lo = 1, .hi = 1024, .help = "qwen3_moe: experts per sparse layer"},
    {.name = "top-k", .kind = OPT_INT, .arg = "K", .lo = 1, .hi = 64, .help = "qwen3_moe: experts per token"},
    {.name = "moe-inter", .kind = OPT_INT, .arg = "I", .lo = 1, .hi = 1 << 30, .help = "qwen3_moe: an expert's MLP size"},
    {.name = "norm-topk", .kind = OPT_INT, .arg = "0|1", .lo = 0, .hi = 1,
     .help = "qwen3_moe: renormalise the chosen experts' weights to sum 1"},
    {.name = "sparse-step", .kind = OPT_INT, .arg = "S", .lo = 1, .hi = 1 << 20,
     .help = "qwen3_moe: layer l is sparse when (l+1) % S == 0"},
    {.name = "mlp-only", .kind = OPT_STR, .arg = "L,L,...", .help = "qwen3_moe: layers with a dense MLP"},
    {.name = "fused-experts", .kind = OPT_INT, .arg = "0|1", .lo = 0, .hi = 1,
     .help = "qwen3_moe: write transformers 5's fused expert tensors"},
    {0}};
static const cfg_cmd MK_CMD = {.cmd = "loom mkmodel", .synopsis = "--arch A --out DIR [options]",
                               .about = "Writes a model with random weights in Hugging Face layout.",
                               .tables = {MK_OPTS}};

/* A real-valued option; false (after the usage) if it is not a number. */
static bool real_opt(const cfg *c, const char *name, double *out)
{
    const char *v = cfg_str(c, name);
    if (!v) return true;
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end) { cfg_usage_error(&MK_CMD, "--%s must be a number, got '%s'", name, v); return false; }
    *out = x;
    return true;
}

int mkmodel_main(int argc, char **argv)
{
    cfg c;
    int rc;
    if (!cfg_parse(&MK_CMD, argc, argv, &c, &rc)) return rc;
    char err[512];
    mkmodel_opts o;
    if (mkmodel_defaults(&o, cfg_str(&c, "arch"), cfg_str(&c, "preset"), err, sizeof err) != 0)
        return cfg_usage_error(&MK_CMD, "%s", err);
    static const char *const ints[] = {"layers", "hidden", "inter", "heads", "kv-heads", "head-dim", "vocab", "max-pos"};
    int *dst[] = {&o.layers, &o.hidden, &o.inter, &o.heads, &o.kv_heads, &o.head_dim, &o.vocab, &o.max_pos};
    for (int i = 0; i < 8; i++)
        if (cfg_str(&c, ints[i])) *dst[i] = (int)cfg_int(&c, ints[i]);
    if (cfg_str(&c, "tie")) o.tie = cfg_int(&c, "tie") == 1;
    bool moe = !strcmp(o.arch, "qwen3_moe");
    static const char *const moe_opts[] = {"experts", "top-k", "moe-inter", "norm-topk", "sparse-step", "mlp-only",
                                           "fused-experts"};
    for (size_t i = 0; i < sizeof moe_opts / sizeof moe_opts[0]; i++)
        if (!moe && cfg_str(&c, moe_opts[i])) return cfg_usage_error(&MK_CMD, "--%s is for --arch qwen3_moe", moe_opts[i]);
    if (cfg_str(&c, "experts")) o.experts = (int)cfg_int(&c, "experts");
    if (cfg_str(&c, "top-k")) o.top_k = (int)cfg_int(&c, "top-k");
    if (cfg_str(&c, "moe-inter")) o.moe_inter = (int)cfg_int(&c, "moe-inter");
    if (cfg_str(&c, "norm-topk")) o.norm_topk = cfg_int(&c, "norm-topk") == 1;
    if (cfg_str(&c, "sparse-step")) o.sparse_step = (int)cfg_int(&c, "sparse-step");
    if (cfg_str(&c, "fused-experts")) o.fused_experts = cfg_int(&c, "fused-experts") == 1;
    for (const char *p = cfg_str(&c, "mlp-only"); p && *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || o.n_mlp_only == 64)
            return cfg_usage_error(&MK_CMD, "--mlp-only takes up to 64 layer numbers separated by commas, got '%s'",
                                   cfg_str(&c, "mlp-only"));
        o.mlp_only[o.n_mlp_only++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (cfg_str(&c, "seed")) o.seed = (uint64_t)cfg_int(&c, "seed");
    const char *dtype = cfg_str(&c, "dtype"), *scaling = cfg_str(&c, "rope-scaling");
    if (dtype && strcmp(dtype, "f32") && strcmp(dtype, "bf16"))
        return cfg_usage_error(&MK_CMD, "--dtype is f32 or bf16, got '%s'", dtype);
    if (dtype) o.bf16 = !strcmp(dtype, "bf16");
    if (scaling && strcmp(scaling, "llama3")) return cfg_usage_error(&MK_CMD, "--rope-scaling is llama3, got '%s'", scaling);
    if (scaling) o.rope_llama3 = true;
    if (!real_opt(&c, "init-std", &o.init_std) || !real_opt(&c, "norm-noise", &o.norm_noise) ||
        !real_opt(&c, "rope-theta", &o.rope_theta))
        return 2;
    o.out_dir = cfg_str(&c, "out");
    if (mkmodel_write(&o, err, sizeof err) != 0) { fprintf(stderr, "loom mkmodel: %s\n", err); return 1; }
    printf("mkmodel: wrote %s (%s, %d layers, hidden %d, vocab %d, %s, %s", o.out_dir, o.arch, o.layers, o.hidden,
           o.vocab, o.tie ? "tied" : "untied", o.bf16 ? "bf16" : "f32");
    if (moe) printf(", %d experts, %d per token%s", o.experts, o.top_k, o.fused_experts ? ", fused" : "");
    printf(")\n");
    return 0;
}
