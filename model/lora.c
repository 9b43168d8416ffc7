/* lora.c — LoRA layouts (PEFT names and shapes), host adapter states, PEFT initial values. */
#include "model/lora.h"
#include "common/err.h"
#include "model/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const lo_module_path[LORA_NUM_MODULES] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

static bool lo_trained(const lora_config *c, int mod)
{
    return mod <= LORA_O ? c->train_attn : c->train_mlp;
}

/* in/out features of each module of layer l for a model config (an expert's MLP is
 * moe_intermediate_size wide). */
static void lo_dims(const model_config *mc, int l, int mod, int *in, int *out)
{
    int H = mc->hidden_size, I = model_layer_moe(mc, l) ? mc->moe_intermediate_size : mc->intermediate_size,
        qd = mc->num_attention_heads * mc->head_dim,
        kvd = mc->num_key_value_heads * mc->head_dim;
    switch (mod) {
    case LORA_Q: *in = H; *out = qd; break;
    case LORA_K: case LORA_V: *in = H; *out = kvd; break;
    case LORA_O: *in = qd; *out = H; break;
    case LORA_GATE: case LORA_UP: *in = H; *out = I; break;
    default: *in = I; *out = H; break;
    }
}

/* Longest name: "base_model.model.model.layers.<int>.mlp.experts.<int>.gate_proj.lora_A.weight". */
#define LO_NAME_MAX 112

/* Appends the A and B tensors of one adapted linear (expert: -1, or the expert whose
 * projection it is). */
static void lo_add_pair(lora_layout *l, char **np, const char *prefix, int layer, lora_module mod, int expert, int in,
                        int out)
{
    int r = l->cfg.rank;
    for (int b = 0; b < 2; b++) {
        lora_tensor *t = &l->tensors[l->num_tensors++];
        t->layer = layer;
        t->module = mod;
        t->expert = expert;
        t->is_b = b;
        t->rows = b ? out : r;
        t->cols = b ? r : in;
        t->offset = l->num_params;
        t->name = *np;
        *np += sprintf(*np, "base_model.model.%s.lora_%c.weight", prefix, b ? 'B' : 'A') + 1;
        l->num_params += (size_t)t->rows * t->cols;
    }
}

int lora_layout_init(lora_layout *l, const model_config *mc, const lora_config *c, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    if (c->rank < 1 || c->rank > LIMIT_LORA_RANK) {
        err_set(err, errlen, "lora: rank %d outside 1..%d", c->rank, LIMIT_LORA_RANK);
        return -1;
    }
    int L = mc->num_hidden_layers, E = mc->num_experts > 0 ? mc->num_experts : 1,
        maxt = 2 * (L * (4 + 3 * E) + 1);
    l->cfg = *c;
    l->scale = LORA_ALPHA / (float)c->rank;
    l->num_layers = L;
    l->hidden = mc->hidden_size;
    l->vocab = mc->vocab_size;
    l->num_experts = mc->num_experts;
    l->tensors = calloc(maxt, sizeof *l->tensors);
    l->names = malloc((size_t)maxt * LO_NAME_MAX);
    if (!l->tensors || !l->names) {
        lora_layout_free(l);
        err_set(err, errlen, "lora: out of memory");
        return -1;
    }
    char *np = l->names, prefix[80];
    for (int layer = 0; layer < L; layer++) {
        bool moe = model_layer_moe(mc, layer);
        for (int mod = 0; mod < LORA_NUM_MODULES; mod++) {
            if (!lo_trained(c, mod) || (moe && mod > LORA_O)) continue; /* the experts' follow */
            int in, out;
            lo_dims(mc, layer, mod, &in, &out);
            snprintf(prefix, sizeof prefix, "model.layers.%d.%s", layer, lo_module_path[mod]);
            lo_add_pair(l, &np, prefix, layer, (lora_module)mod, -1, in, out);
        }
        if (!moe || !c->train_mlp) continue;
        for (int e = 0; e < mc->num_experts; e++)
            for (int mod = LORA_GATE; mod <= LORA_DOWN; mod++) {
                int in, out;
                lo_dims(mc, layer, mod, &in, &out);
                snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.experts.%d.%s", layer, e,
                         lo_module_path[mod] + strlen("mlp."));
                lo_add_pair(l, &np, prefix, layer, (lora_module)mod, e, in, out);
            }
    }
    if (c->train_unembed)
        lo_add_pair(l, &np, "model.unembed_tokens", -1, LORA_Q, -1, mc->hidden_size, mc->vocab_size);
    /* Keep only what is used: an adapter of a 128-expert model has tens of thousands of
     * tensors, and every adapter_state carries a copy of its layout. */
    l->names_len = (size_t)(np - l->names);
    char *names = malloc(l->names_len ? l->names_len : 1);
    lora_tensor *tensors = malloc((l->num_tensors ? l->num_tensors : 1) * sizeof *tensors);
    if (!names || !tensors) {
        free(names);
        free(tensors);
        lora_layout_free(l);
        err_set(err, errlen, "lora: out of memory");
        return -1;
    }
    memcpy(names, l->names, l->names_len);
    for (int i = 0; i < l->num_tensors; i++) {
        tensors[i] = l->tensors[i];
        tensors[i].name = names + (l->tensors[i].name - l->names);
    }
    free(l->names);
    free(l->tensors);
    l->names = names;
    l->tensors = tensors;
    return 0;
}

size_t lora_count_params(const model_config *mc, const lora_config *c)
{
    size_t n = 0, r = (size_t)c->rank;
    for (int l = 0; l < mc->num_hidden_layers; l++)
        for (int mod = 0; mod < LORA_NUM_MODULES; mod++) {
            if (!lo_trained(c, mod)) continue;
            int in, out;
            lo_dims(mc, l, mod, &in, &out);
            size_t copies = mod > LORA_O && model_layer_moe(mc, l) ? (size_t)mc->num_experts : 1;
            n += copies * r * ((size_t)in + (size_t)out);
        }
    if (c->train_unembed) n += r * ((size_t)mc->hidden_size + (size_t)mc->vocab_size);
    return n;
}

int lora_layout_copy(lora_layout *dst, const lora_layout *src, char *err, size_t errlen)
{
    *dst = *src;
    dst->tensors = malloc((src->num_tensors ? src->num_tensors : 1) * sizeof *dst->tensors);
    dst->names = malloc(src->names_len ? src->names_len : 1);
    if (!dst->tensors || !dst->names) {
        lora_layout_free(dst);
        err_set(err, errlen, "lora: out of memory");
        return -1;
    }
    memcpy(dst->names, src->names, src->names_len);
    for (int i = 0; i < src->num_tensors; i++) {
        dst->tensors[i] = src->tensors[i];
        dst->tensors[i].name = dst->names + (src->tensors[i].name - src->names);
    }
    return 0;
}

void lora_layout_free(lora_layout *l)
{
    free(l->tensors);
    free(l->names);
    l->tensors = NULL;
    l->names = NULL;
    l->num_tensors = 0;
}

int lora_find_tensor(const lora_layout *l, const char *name)
{
    for (int i = 0; i < l->num_tensors; i++) if (strcmp(l->tensors[i].name, name) == 0) return i;
    return -1;
}

bool lora_layout_same(const lora_layout *a, const lora_layout *b)
{
    return a->cfg.rank == b->cfg.rank && a->cfg.train_attn == b->cfg.train_attn && a->cfg.train_mlp == b->cfg.train_mlp &&
           a->cfg.train_unembed == b->cfg.train_unembed && a->num_layers == b->num_layers && a->hidden == b->hidden &&
           a->vocab == b->vocab && a->num_experts == b->num_experts && a->num_tensors == b->num_tensors &&
           a->num_params == b->num_params;
}

int adapter_state_alloc(adapter_state *s, const lora_layout *l, unsigned parts, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (lora_layout_copy(&s->layout, l, err, errlen) < 0) return -1;
    size_t n = l->num_params ? l->num_params : 1;
    bool ok = true;
    if (parts & ADAPTER_PARAMS) ok &= (s->params = calloc(n, sizeof(float))) != NULL;
    if (parts & ADAPTER_GRADS) ok &= (s->grads = calloc(n, sizeof(float))) != NULL;
    if (parts & ADAPTER_OPTIM) ok &= (s->m = calloc(n, sizeof(float))) && (s->v = calloc(n, sizeof(float)));
    if (!ok) {
        adapter_state_free(s);
        err_set(err, errlen, "lora: out of memory for an adapter of %zu parameters", l->num_params);
        return -1;
    }
    return 0;
}

void adapter_state_free(adapter_state *s)
{
    lora_layout_free(&s->layout);
    free(s->params);
    free(s->grads);
    free(s->m);
    free(s->v);
    s->params = s->grads = s->m = s->v = NULL;
}

void adapter_state_init_peft(adapter_state *s)
{
    const lora_layout *l = &s->layout;
    for (int i = 0; i < l->num_tensors; i++) {
        const lora_tensor *t = &l->tensors[i];
        float *p = s->params + t->offset;
        size_t n = (size_t)t->rows * t->cols;
        if (t->is_b) { memset(p, 0, n * sizeof *p); continue; }
        /* A ~ U(−1/√in, 1/√in): PEFT's kaiming_uniform_(a=√5). */
        rng_state rs;
        rng_seed(&rs, l->cfg.seed ^ rng_hash_str(t->name));
        double bound = 1.0 / sqrt((double)t->cols);
        for (size_t k = 0; k < n; k++) p[k] = (float)((2.0 * rng_uniform(&rs) - 1.0) * bound);
    }
}
