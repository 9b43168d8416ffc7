/* adapter_io.c: adapter ⇄ safetensors bytes, archive files and PEFT import (see
 * adapter_io.h). */
#include "model/adapter_io.h"
#include "model/safetensors.h"
#include "common/err.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPT_M ".exp_avg"
#define OPT_V ".exp_avg_sq"
#define HEAD_TINKER "base_model.model.model.unembed_tokens."
#define HEAD_PEFT "base_model.model.lm_head."

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* ---- encode ------------------------------------------------------------------------- */

int adapter_io_encode(const adapter_state *a, bool with_optimizer, uint8_t **out, size_t *outlen, char *err,
                      size_t errlen) {
    const lora_layout *l = &a->layout;
    if (!a->params || (with_optimizer && (!a->m || !a->v))) {
        err_set(err, errlen, "adapter_io: the adapter state lacks %s", a->params ? "its Adam moments" : "its weights");
        return -1;
    }
    int nt = l->num_tensors, nd = with_optimizer ? 3 * nt : nt;
    st_write_desc *d = calloc(nd ? nd : 1, sizeof *d);
    char *names = NULL;
    if (!d) { err_set(err, errlen, "adapter_io: out of memory"); return -1; }
    if (with_optimizer) {
        size_t total = 0;
        for (int i = 0; i < nt; i++) total += 2 * (strlen(l->tensors[i].name) + sizeof OPT_V);
        names = malloc(total ? total : 1);
        if (!names) { free(d); err_set(err, errlen, "adapter_io: out of memory"); return -1; }
    }
    char *np = names;
    for (int i = 0; i < nt; i++) {
        const lora_tensor *t = &l->tensors[i];
        d[i] = (st_write_desc){.name = t->name, .dtype = ST_F32, .ndim = 2, .shape = {t->rows, t->cols},
                               .data = a->params + t->offset};
        if (!with_optimizer) continue;
        /* optimizer tensors after all parameters: the first part is a plain adapter file */
        st_write_desc *dm = &d[nt + 2 * i], *dv = &d[nt + 2 * i + 1];
        *dm = d[i];
        dm->name = np;
        np += sprintf(np, "%s" OPT_M, t->name) + 1;
        dm->data = a->m + t->offset;
        *dv = d[i];
        dv->name = np;
        np += sprintf(np, "%s" OPT_V, t->name) + 1;
        dv->data = a->v + t->offset;
    }
    const lora_config *c = &l->cfg;
    char rank[16], step[24], layers[16], hidden[16], vocab[16], experts[16];
    snprintf(rank, sizeof rank, "%d", c->rank);
    snprintf(step, sizeof step, "%lld", (long long)a->step);
    snprintf(layers, sizeof layers, "%d", l->num_layers);
    snprintf(hidden, sizeof hidden, "%d", l->hidden);
    snprintf(vocab, sizeof vocab, "%d", l->vocab);
    snprintf(experts, sizeof experts, "%d", l->num_experts);
    const char *meta[] = {"loom.kind", with_optimizer ? "training" : "sampler",
                          "loom.lora_rank", rank,
                          "loom.lora_alpha", "32",
                          "loom.train_attn", c->train_attn ? "true" : "false",
                          "loom.train_mlp", c->train_mlp ? "true" : "false",
                          "loom.train_unembed", c->train_unembed ? "true" : "false",
                          "loom.step", step,
                          "loom.num_layers", layers,
                          "loom.hidden", hidden,
                          "loom.vocab", vocab,
                          /* MoE models only, so that a dense adapter's bytes (and digest)
                           * stay what they were */
                          l->num_experts > 0 ? "loom.num_experts" : NULL, experts,
                          NULL};
    int rc = st_write_mem(d, nd, meta, out, outlen, err, errlen);
    free(d);
    free(names);
    return rc;
}

/* ---- decode ------------------------------------------------------------------------- */

static int meta_int(const st_file *f, const char *key, int64_t *out, char *err, size_t errlen) {
    const char *s = st_metadata(f, key);
    char *end;
    if (!s || !*s) { err_set(err, errlen, "not a Loom adapter: __metadata__ has no %s", key); return -1; }
    long long v = strtoll(s, &end, 10);
    if (*end) { err_set(err, errlen, "adapter metadata %s is not an integer: '%s'", key, s); return -1; }
    *out = v;
    return 0;
}

static int meta_bool(const st_file *f, const char *key, bool *out, char *err, size_t errlen) {
    const char *s = st_metadata(f, key);
    if (!s || (strcmp(s, "true") && strcmp(s, "false"))) {
        err_set(err, errlen, "not a Loom adapter: __metadata__ %s is not true/false", key);
        return -1;
    }
    *out = !strcmp(s, "true");
    return 0;
}

static int info_of(const st_file *f, adapter_io_info *info, char *err, size_t errlen) {
    memset(info, 0, sizeof *info);
    int64_t rank, step, layers, hidden, vocab;
    if (meta_int(f, "loom.lora_rank", &rank, err, errlen) < 0 || meta_int(f, "loom.step", &step, err, errlen) < 0 ||
        meta_int(f, "loom.num_layers", &layers, err, errlen) < 0 ||
        meta_int(f, "loom.hidden", &hidden, err, errlen) < 0 || meta_int(f, "loom.vocab", &vocab, err, errlen) < 0 ||
        meta_bool(f, "loom.train_attn", &info->cfg.train_attn, err, errlen) < 0 ||
        meta_bool(f, "loom.train_mlp", &info->cfg.train_mlp, err, errlen) < 0 ||
        meta_bool(f, "loom.train_unembed", &info->cfg.train_unembed, err, errlen) < 0)
        return -1;
    if (rank < 1 || rank > LIMIT_LORA_RANK) { err_set(err, errlen, "adapter rank %lld outside 1..%d", (long long)rank, LIMIT_LORA_RANK); return -1; }
    info->cfg.rank = (int)rank;
    info->step = step;
    info->num_layers = (int)layers;
    info->hidden = (int)hidden;
    info->vocab = (int)vocab;
    const char *ne = st_metadata(f, "loom.num_experts");
    info->num_experts = ne ? atoi(ne) : 0;
    const char *alpha = st_metadata(f, "loom.lora_alpha");
    info->lora_alpha = alpha ? atof(alpha) : LORA_ALPHA;
    const char *kind = st_metadata(f, "loom.kind");
    info->has_optimizer = kind && !strcmp(kind, "training");
    return 0;
}

int adapter_io_info_read(const void *buf, size_t len, adapter_io_info *info, char *err, size_t errlen) {
    st_file *f;
    char e2[256];
    if (st_open_mem(buf, len, &f, e2, sizeof e2) < 0) {
        err_set(err, errlen, "checkpoint data is not a valid safetensors file: %s", e2);
        return -1;
    }
    int rc = info_of(f, info, err, errlen);
    st_close(f);
    return rc;
}

static const char *flag_list(const lora_config *c, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s", c->train_attn ? " attn" : "", c->train_mlp ? " mlp" : "",
             c->train_unembed ? " unembed" : "");
    return buf;
}

/* Checks one tensor of f against the expected name/shape; NULL + err if absent or wrong. */
static const st_tensor *expect(const st_file *f, const char *name, int rows, int cols, char *err, size_t errlen) {
    const st_tensor *t = st_find(f, name);
    if (!t) { err_set(err, errlen, "checkpoint has no tensor %s", name); return NULL; }
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        err_set(err, errlen, "tensor %s has shape [%lld, %lld] in the checkpoint, the model needs [%d, %d]", name,
                t->ndim > 0 ? (long long)t->shape[0] : 0LL, t->ndim > 1 ? (long long)t->shape[1] : 0LL, rows, cols);
        return NULL;
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F64) {
        err_set(err, errlen, "tensor %s has dtype %s (a float type is needed)", name, st_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

int adapter_io_restore(adapter_state *a, const void *buf, size_t len, bool optimizer, char *err, size_t errlen) {
    const lora_layout *l = &a->layout;
    if (!a->params || (optimizer && (!a->m || !a->v))) {
        err_set(err, errlen, "adapter_io: the adapter state has no room for %s", a->params ? "Adam moments" : "weights");
        return -1;
    }
    st_file *f;
    char e2[256], fa[64], fb[64];
    if (st_open_mem(buf, len, &f, e2, sizeof e2) < 0) {
        err_set(err, errlen, "checkpoint data is not a valid safetensors file: %s", e2);
        return -1;
    }
    int rc = -1, nt = l->num_tensors;
    const st_tensor **src = calloc(3 * (size_t)(nt ? nt : 1), sizeof *src);
    adapter_io_info info;
    if (!src) { err_set(err, errlen, "adapter_io: out of memory"); goto out; }
    if (info_of(f, &info, err, errlen) < 0) goto out;
    const lora_config *c = &l->cfg;
    if (info.cfg.rank != c->rank) {
        err_set(err, errlen, "the checkpoint has LoRA rank %d, this model has rank %d", info.cfg.rank, c->rank);
        goto out;
    }
    if (info.cfg.train_attn != c->train_attn || info.cfg.train_mlp != c->train_mlp ||
        info.cfg.train_unembed != c->train_unembed) {
        err_set(err, errlen, "the checkpoint trains modules [%s ] but this model trains [%s ]",
                flag_list(&info.cfg, fa, sizeof fa), flag_list(c, fb, sizeof fb));
        goto out;
    }
    if (info.num_layers != l->num_layers || info.hidden != l->hidden || info.vocab != l->vocab ||
        info.num_experts != l->num_experts) {
        err_set(err, errlen, "the checkpoint was made for a base model with %d layers, hidden %d, vocab %d, %d experts; "
                "this one has %d, %d, %d, %d", info.num_layers, info.hidden, info.vocab, info.num_experts, l->num_layers,
                l->hidden, l->vocab, l->num_experts);
        goto out;
    }
    if (optimizer && !info.has_optimizer) {
        err_set(err, errlen, "the checkpoint has no optimizer state (it is a sampler checkpoint)");
        goto out;
    }
    int want = info.has_optimizer ? 3 * nt : nt;
    if (st_count(f) != want) {
        err_set(err, errlen, "the checkpoint holds %d tensors, %d expected for this model's adapter", st_count(f), want);
        goto out;
    }
    char name[512];
    for (int i = 0; i < nt; i++) {
        const lora_tensor *t = &l->tensors[i];
        if (!(src[3 * i] = expect(f, t->name, t->rows, t->cols, err, errlen))) goto out;
        if (!optimizer) continue;
        snprintf(name, sizeof name, "%s" OPT_M, t->name);
        if (!(src[3 * i + 1] = expect(f, name, t->rows, t->cols, err, errlen))) goto out;
        snprintf(name, sizeof name, "%s" OPT_V, t->name);
        if (!(src[3 * i + 2] = expect(f, name, t->rows, t->cols, err, errlen))) goto out;
    }
    /* Everything checked: now overwrite the state. */
    for (int i = 0; i < nt; i++) {
        const lora_tensor *t = &l->tensors[i];
        size_t cnt = (size_t)t->rows * t->cols;
        if (st_tensor_to_f32(src[3 * i], a->params + t->offset, cnt, err, errlen) < 0) goto out;
        if (optimizer && (st_tensor_to_f32(src[3 * i + 1], a->m + t->offset, cnt, err, errlen) < 0 ||
                          st_tensor_to_f32(src[3 * i + 2], a->v + t->offset, cnt, err, errlen) < 0))
            goto out;
    }
    a->step = optimizer ? info.step : 0;
    if (!optimizer && a->m) memset(a->m, 0, l->num_params * sizeof(float));
    if (!optimizer && a->v) memset(a->v, 0, l->num_params * sizeof(float));
    if (a->grads) memset(a->grads, 0, l->num_params * sizeof(float));
    rc = 0;
out:
    free(src);
    st_close(f);
    return rc;
}

int adapter_io_decode(const model_config *mc, const void *buf, size_t len, adapter_state *out, char *err,
                      size_t errlen) {
    adapter_io_info info;
    lora_layout l;
    if (adapter_io_info_read(buf, len, &info, err, errlen) < 0) return -1;
    if (info.num_layers != mc->num_hidden_layers || info.hidden != mc->hidden_size || info.vocab != mc->vocab_size ||
        info.num_experts != mc->num_experts) {
        err_set(err, errlen, "the checkpoint was made for a base model with %d layers, hidden %d, vocab %d, %d experts; "
                "this one has %d, %d, %d, %d", info.num_layers, info.hidden, info.vocab, info.num_experts,
                mc->num_hidden_layers, mc->hidden_size, mc->vocab_size, mc->num_experts);
        return -1;
    }
    if (lora_layout_init(&l, mc, &info.cfg, err, errlen) < 0) return -1;
    int rc = adapter_state_alloc(out, &l, ADAPTER_PARAMS, err, errlen);
    lora_layout_free(&l);
    if (rc < 0) return -1;
    if (adapter_io_restore(out, buf, len, false, err, errlen) < 0) {
        adapter_state_free(out);
        return -1;
    }
    return 0;
}

/* ---- archive files -------------------------------------------------------------------- */

static int add_file(adapter_export *e, const char *name, uint8_t *data, size_t len) {
    e->files[e->n++] = (adapter_export_file){name, data, len};
    return 0;
}

static int add_json(adapter_export *e, const char *name, json_t *j, char *err, size_t errlen) {
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(j);
    if (!s) { err_set(err, errlen, "adapter_io: JSON encoding failed"); return -1; }
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) { free(s); err_set(err, errlen, "adapter_io: out of memory"); return -1; }
    t[n] = '\n';
    t[n + 1] = 0;
    return add_file(e, name, (uint8_t *)t, n + 1);
}

/* Leaf module name of a PEFT key (…q_proj.lora_A.weight → q_proj). */
static void leaf_of(const char *key, char *out, size_t n) {
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", key);
    char *p = strstr(tmp, ".lora_");
    if (p) *p = 0;
    char *dot = strrchr(tmp, '.');
    snprintf(out, n, "%s", dot ? dot + 1 : tmp);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Renames the head for PEFT; NULL when the key is dropped. Result in buf. */
static const char *export_name(const char *key, adapter_export_format fmt, bool with_head, char *buf, size_t n) {
    bool head = !strncmp(key, HEAD_TINKER, strlen(HEAD_TINKER));
    if (head && !with_head) return NULL;
    if (head && fmt == ADAPTER_EXPORT_PEFT) {
        snprintf(buf, n, HEAD_PEFT "%s", key + strlen(HEAD_TINKER));
        return buf;
    }
    snprintf(buf, n, "%s", key);
    return buf;
}

int adapter_io_export(const void *blob, size_t len, adapter_export_format fmt, const char *base_model_name,
                      bool with_head, adapter_export *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    st_file *f;
    char e2[256];
    if (st_open_mem(blob, len, &f, e2, sizeof e2) < 0) {
        err_set(err, errlen, "checkpoint data is not a valid safetensors file: %s", e2);
        return -1;
    }
    adapter_io_info info;
    int n = st_count(f), rc = -1, np = 0, no = 0, nleaf = 0;
    st_write_desc *pd = calloc(n ? n : 1, sizeof *pd), *od = calloc(n ? n : 1, sizeof *od);
    char *names = malloc((size_t)(n ? n : 1) * 544), *np_ = names;
    char **leaves = calloc(n ? n : 1, sizeof *leaves);
    uint8_t *bytes = NULL;
    size_t blen = 0;
    if (!pd || !od || !names || !leaves) { err_set(err, errlen, "adapter_io: out of memory"); goto out; }
    if (info_of(f, &info, err, errlen) < 0) goto out;
    /* st_get is in data-offset order, which is the order the tensors were written in. */
    for (int i = 0; i < n; i++) {
        const st_tensor *t = st_get(f, i);
        bool is_m = ends_with(t->name, OPT_M), is_v = ends_with(t->name, OPT_V);
        char base[512], renamed[544];
        snprintf(base, sizeof base, "%s", t->name);
        if (is_v) base[strlen(base) - strlen(OPT_V)] = 0;
        else if (is_m) base[strlen(base) - strlen(OPT_M)] = 0;
        const char *nm = export_name(base, fmt, with_head, renamed, sizeof renamed);
        if (!nm) continue;
        st_write_desc d = {.name = np_, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        for (int k = 0; k < t->ndim; k++) d.shape[k] = t->shape[k];
        np_ += sprintf(np_, "%s%s", nm, is_v ? OPT_V : is_m ? OPT_M : "") + 1;
        if (is_m || is_v) { od[no++] = d; continue; }
        pd[np++] = d;
        char leaf[128];
        leaf_of(nm, leaf, sizeof leaf);
        bool seen = false;
        for (int k = 0; k < nleaf && !seen; k++) seen = !strcmp(leaves[k], leaf);
        if (!seen) leaves[nleaf++] = strdup(leaf);
    }
    qsort(leaves, nleaf, sizeof *leaves, cmp_str);

    json_t *cfg = json_object();
    json_object_set_new(cfg, "peft_type", json_string("LORA"));
    json_object_set_new(cfg, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(cfg, "base_model_name_or_path", base_model_name ? json_string(base_model_name) : json_null());
    if (fmt == ADAPTER_EXPORT_PEFT) json_object_set_new(cfg, "revision", json_null());
    json_object_set_new(cfg, "r", json_integer(info.cfg.rank));
    json_object_set_new(cfg, "lora_alpha", json_integer((json_int_t)llround(info.lora_alpha)));
    json_object_set_new(cfg, "lora_dropout", json_real(0.0));
    if (fmt == ADAPTER_EXPORT_PEFT) {
        json_t *tm = json_array();
        for (int k = 0; k < nleaf; k++) json_array_append_new(tm, json_string(leaves[k]));
        json_object_set_new(cfg, "target_modules", tm);
    } else {
        json_object_set_new(cfg, "target_modules", json_string("all-linear"));
    }
    json_object_set_new(cfg, "bias", json_string("none"));
    json_object_set_new(cfg, "fan_in_fan_out", json_false());
    json_object_set_new(cfg, "inference_mode", json_true());
    if (fmt == ADAPTER_EXPORT_PEFT) {
        json_object_set_new(cfg, "init_lora_weights", json_true());
        json_object_set_new(cfg, "modules_to_save", json_null());
        json_object_set_new(cfg, "layers_to_transform", json_null());
        json_object_set_new(cfg, "layers_pattern", json_null());
        json_object_set_new(cfg, "rank_pattern", json_object());
        json_object_set_new(cfg, "alpha_pattern", json_object());
        json_object_set_new(cfg, "use_rslora", json_false());
        json_object_set_new(cfg, "use_dora", json_false());
    } else {
        json_object_set_new(cfg, "use_rslora", json_false());
        json_object_set_new(cfg, "use_dora", json_false());
        json_object_set_new(cfg, "modules_to_save", json_null());
        json_object_set_new(cfg, "rank_pattern", json_object());
        json_object_set_new(cfg, "alpha_pattern", json_object());
    }
    if (add_json(out, "adapter_config.json", cfg, err, errlen) < 0) goto out;
    if (st_write_mem(pd, np, NULL, &bytes, &blen, err, errlen) < 0) goto out;
    add_file(out, "adapter_model.safetensors", bytes, blen);
    bytes = malloc(1);
    add_file(out, "checkpoint_complete", bytes, 0);
    bytes = NULL;
    if (info.has_optimizer) {
        if (st_write_mem(od, no, NULL, &bytes, &blen, err, errlen) < 0) goto out;
        add_file(out, "optimizer.safetensors", bytes, blen);
        bytes = NULL;
        if (add_json(out, "optimizer.json", json_pack("{s:s, s:I}", "type", "adamw", "step", (json_int_t)info.step),
                     err, errlen) < 0)
            goto out;
    }
    rc = 0;
out:
    if (rc < 0) adapter_export_free(out);
    for (int k = 0; k < nleaf; k++) free(leaves[k]);
    free(leaves);
    free(pd);
    free(od);
    free(names);
    st_close(f);
    return rc;
}

void adapter_export_free(adapter_export *e) {
    for (int i = 0; i < e->n; i++) free(e->files[i].data);
    e->n = 0;
}

/* ---- import ----------------------------------------------------------------------------- */

static const char *const attn_leaves[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
static const char *const mlp_leaves[] = {"gate_proj", "up_proj", "down_proj"};

/* Canonical module path of an imported key ("model.layers.3.self_attn.q_proj" or
 * "model.unembed_tokens") and whether it is A; -1 for a key Loom cannot use. */
static int import_key(const char *key, char *module, size_t n, bool *is_a) {
    const char *pfx = "base_model.model.";
    if (strncmp(key, pfx, strlen(pfx))) return -1;
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", key + strlen(pfx));
    char *p;
    if ((p = strstr(tmp, ".lora_A.")) || ((p = strstr(tmp, ".lora_A")) && !p[7])) *is_a = true;
    else if ((p = strstr(tmp, ".lora_B.")) || ((p = strstr(tmp, ".lora_B")) && !p[7])) *is_a = false;
    else return -1;
    const char *rest = p + 7;
    if (*rest && strcmp(rest, ".weight") && strcmp(rest, ".default.weight")) return -1;
    *p = 0;
    if (!strcmp(tmp, "lm_head") || !strcmp(tmp, "model.unembed_tokens")) {
        snprintf(module, n, "model.unembed_tokens");
        return 0;
    }
    snprintf(module, n, "%s", tmp);
    return 0;
}

/* The layout cmp_layout_name sorts by: qsort has no user argument (thread-local, so that
 * imports on several threads do not mix). */
static _Thread_local const lora_layout *g_sort_layout;

static int cmp_layout_name(const void *a, const void *b) {
    return strcmp(g_sort_layout->tensors[*(const int *)a].name, g_sort_layout->tensors[*(const int *)b].name);
}

/* The index of tensor `name` in l, by binary search over order (l's indices sorted by name). */
static int find_sorted(const lora_layout *l, const int *order, const char *name) {
    int lo = 0, hi = l->num_tensors;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(l->tensors[order[mid]].name, name);
        if (c == 0) return order[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

int adapter_io_import(const model_config *mc, const char *config_json, const void *st_bytes, size_t st_len,
                      uint8_t **out, size_t *outlen, adapter_io_info *info, char *err, size_t errlen) {
    json_error_t je;
    json_t *cfg = json_loads(config_json, 0, &je);
    if (!cfg) { err_set(err, errlen, "adapter_config.json: %s (line %d)", je.text, je.line); return -1; }
    json_t *jr = json_object_get(cfg, "r"), *ja = json_object_get(cfg, "lora_alpha");
    if (!json_is_integer(jr) || !json_is_number(ja)) {
        json_decref(cfg);
        err_set(err, errlen, "adapter_config.json needs integer \"r\" and numeric \"lora_alpha\"");
        return -1;
    }
    int r = (int)json_integer_value(jr);
    double alpha = json_number_value(ja);
    bool rslora = json_is_true(json_object_get(cfg, "use_rslora"));
    bool dora = json_is_true(json_object_get(cfg, "use_dora"));
    json_decref(cfg);
    if (dora) { err_set(err, errlen, "DoRA adapters are not supported"); return -1; }
    if (r < 1 || r > LIMIT_LORA_RANK) { err_set(err, errlen, "rank r=%d outside 1..%d", r, LIMIT_LORA_RANK); return -1; }
    double scale_in = rslora ? alpha / sqrt((double)r) : alpha / r, fold = scale_in / (LORA_ALPHA / r);

    st_file *f;
    char e2[256];
    if (st_open_mem(st_bytes, st_len, &f, e2, sizeof e2) < 0) {
        err_set(err, errlen, "adapter_model.safetensors: %s", e2);
        return -1;
    }
    lora_config lc = {.rank = r};
    char module[512];
    bool is_a;
    for (int i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_get(f, i);
        if (import_key(t->name, module, sizeof module, &is_a) < 0) {
            err_set(err, errlen, "tensor %s is not a LoRA A/B weight Loom can use "
                    "(embedding LoRA, biases and modules_to_save are not supported)", t->name);
            st_close(f);
            return -1;
        }
        if (ends_with(module, ".mlp.experts") || ends_with(module, ".mlp.experts.base_layer")) {
            /* PEFT's target_parameters on transformers 5's fused expert tensors (ParamWrapper) */
            err_set(err, errlen, "tensor %s adapts the fused expert parameters (PEFT target_parameters); Loom "
                    "imports expert LoRA in the per-expert layout (mlp.experts.E.gate_proj/up_proj/down_proj, "
                    "target_modules), the one PEFT writes with transformers 4 and transformers 5 converts on load",
                    t->name);
            st_close(f);
            return -1;
        }
        if (!strcmp(module, "model.unembed_tokens")) { lc.train_unembed = true; continue; }
        char leaf[128];
        leaf_of(module, leaf, sizeof leaf);
        bool known = false;
        for (size_t k = 0; k < 4; k++) if (!strcmp(leaf, attn_leaves[k])) { lc.train_attn = known = true; }
        for (size_t k = 0; k < 3; k++) if (!strcmp(leaf, mlp_leaves[k])) { lc.train_mlp = known = true; }
        if (!known) {
            err_set(err, errlen, "tensor %s adapts module %s, which Loom does not adapt", t->name, module);
            st_close(f);
            return -1;
        }
    }
    if (!lc.train_attn && !lc.train_mlp && !lc.train_unembed) {
        err_set(err, errlen, "adapter_model.safetensors holds no LoRA tensors");
        st_close(f);
        return -1;
    }
    lora_layout lay;
    adapter_state a = {0};
    int *order = NULL;
    if (lora_layout_init(&lay, mc, &lc, err, errlen) < 0) { st_close(f); return -1; }
    /* Modules the file leaves out stay zero (A and B), i.e. unadapted. */
    int rc = adapter_state_alloc(&a, &lay, ADAPTER_PARAMS, err, errlen);
    lora_layout_free(&lay);
    if (rc < 0) { st_close(f); return -1; }
    rc = -1;
    /* The layout's names sorted, for lookups: a 128-expert model's adapter has ~40 000. */
    int nt = a.layout.num_tensors;
    order = malloc((nt ? nt : 1) * sizeof *order);
    if (!order) { err_set(err, errlen, "adapter_io: out of memory"); goto out; }
    for (int i = 0; i < nt; i++) order[i] = i;
    g_sort_layout = &a.layout;
    qsort(order, nt, sizeof *order, cmp_layout_name);
    for (int i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_get(f, i);
        import_key(t->name, module, sizeof module, &is_a);
        char ours[600];
        snprintf(ours, sizeof ours, "base_model.model.%s.lora_%s.weight", module, is_a ? "A" : "B");
        int ti = find_sorted(&a.layout, order, ours);
        if (ti < 0) { err_set(err, errlen, "tensor %s does not fit this base model", t->name); goto out; }
        const lora_tensor *lt = &a.layout.tensors[ti];
        float *p = a.params + lt->offset;
        size_t cnt = (size_t)lt->rows * lt->cols;
        if (!expect(f, t->name, lt->rows, lt->cols, err, errlen)) goto out;
        if (st_tensor_to_f32(t, p, cnt, err, errlen) < 0) goto out;
        if (!is_a && fold != 1.0)
            for (size_t k = 0; k < cnt; k++) p[k] = (float)(p[k] * fold);
    }

    if (adapter_io_encode(&a, false, out, outlen, err, errlen) < 0) goto out;
    if (info) {
        memset(info, 0, sizeof *info);
        info->cfg = lc;
        info->num_layers = a.layout.num_layers;
        info->hidden = a.layout.hidden;
        info->vocab = a.layout.vocab;
        info->lora_alpha = LORA_ALPHA;
    }
    rc = 0;
out:
    free(order);
    adapter_state_free(&a);
    st_close(f);
    return rc;
}
