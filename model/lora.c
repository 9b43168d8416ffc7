/* lora.c — LoRA adapter allocation, naming (PEFT keys) and initialisation. */
#include "model/lora.h"
#include "model/rng.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void lo_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static const char *const lo_module_path[LORA_NUM_MODULES] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

static bool lo_trained(const lora_config *c, int mod)
{
    return mod <= LORA_O ? c->train_attn : c->train_mlp;
}

/* in/out features of each module for a model config. */
static void lo_dims(const model_config *mc, int mod, int *in, int *out)
{
    int H = mc->hidden_size, I = mc->intermediate_size, qd = mc->num_attention_heads * mc->head_dim,
        kvd = mc->num_key_value_heads * mc->head_dim;
    switch (mod) {
    case LORA_Q: *in = H; *out = qd; break;
    case LORA_K: case LORA_V: *in = H; *out = kvd; break;
    case LORA_O: *in = qd; *out = H; break;
    case LORA_GATE: case LORA_UP: *in = H; *out = I; break;
    default: *in = I; *out = H; break;
    }
}

adapter *adapter_create(const base_model *m, const lora_config *c, char *err, size_t errlen)
{
    if (c->rank < 1 || c->rank > LORA_MAX_RANK) {
        lo_err(err, errlen, "lora: rank %d outside 1..%d", c->rank, LORA_MAX_RANK);
        return NULL;
    }
    const model_config *mc = &m->cfg;
    int L = mc->num_hidden_layers, r = c->rank;
    adapter *a = calloc(1, sizeof *a);
    if (!a) goto oom;
    a->cfg = *c;
    a->scale = LORA_ALPHA / (float)r;
    a->num_layers = L;
    a->hidden = mc->hidden_size;
    a->vocab = mc->vocab_size;
    a->mods = calloc((size_t)L * LORA_NUM_MODULES, sizeof *a->mods);
    int maxt = 2 * (L * LORA_NUM_MODULES + 1);
    a->tensors = calloc(maxt, sizeof *a->tensors);
    a->names = malloc((size_t)maxt * 96);
    if (!a->mods || !a->tensors || !a->names) goto oom;

    /* Pass 1: sizes and names; pass 2 (below) points the tensors into the allocation. */
    size_t total = 0;
    char *np = a->names;
    int nt = 0;
#define ADD_PAIR(prefix, in_, out_)                                                                 \
    do {                                                                                           \
        a->tensors[nt].rows = r;                                                                   \
        a->tensors[nt].cols = (in_);                                                               \
        a->tensors[nt].name = np;                                                                  \
        np += sprintf(np, "base_model.model.%s.lora_A.weight", prefix) + 1;                        \
        total += (size_t)r * (in_);                                                                \
        nt++;                                                                                      \
        a->tensors[nt].rows = (out_);                                                              \
        a->tensors[nt].cols = r;                                                                   \
        a->tensors[nt].name = np;                                                                  \
        np += sprintf(np, "base_model.model.%s.lora_B.weight", prefix) + 1;                        \
        total += (size_t)(out_) * r;                                                               \
        nt++;                                                                                      \
    } while (0)
    char prefix[64];
    for (int l = 0; l < L; l++)
        for (int mod = 0; mod < LORA_NUM_MODULES; mod++) {
            if (!lo_trained(c, mod)) continue;
            int in, out;
            lo_dims(mc, mod, &in, &out);
            snprintf(prefix, sizeof prefix, "model.layers.%d.%s", l, lo_module_path[mod]);
            ADD_PAIR(prefix, in, out);
        }
    if (c->train_unembed) ADD_PAIR("model.unembed_tokens", mc->hidden_size, mc->vocab_size);
#undef ADD_PAIR
    a->num_tensors = nt;
    a->num_params = total;
    if (posix_memalign((void **)&a->mem, 64, (4 * total + 16) * sizeof(float)) != 0) { a->mem = NULL; goto oom; }
    memset(a->mem, 0, (4 * total + 16) * sizeof(float));
    a->params = a->mem;
    a->grads = a->params + total;
    a->m = a->grads + total;
    a->v = a->m + total;
    size_t off = 0;
    for (int i = 0; i < nt; i++) {
        lora_tensor *t = &a->tensors[i];
        t->param = a->params + off;
        t->grad = a->grads + off;
        t->m = a->m + off;
        t->v = a->v + off;
        off += (size_t)t->rows * t->cols;
    }
    /* Wire the per-module views, in the same order as the tensor list. */
    int ti = 0;
    for (int l = 0; l < L; l++)
        for (int mod = 0; mod < LORA_NUM_MODULES; mod++) {
            if (!lo_trained(c, mod)) continue;
            lora_pair *p = &a->mods[l * LORA_NUM_MODULES + mod];
            lo_dims(mc, mod, &p->in, &p->out);
            p->rank = r;
            p->A = a->tensors[ti].param;
            p->gA = a->tensors[ti].grad;
            p->B = a->tensors[ti + 1].param;
            p->gB = a->tensors[ti + 1].grad;
            ti += 2;
        }
    if (c->train_unembed) {
        a->head.in = mc->hidden_size;
        a->head.out = mc->vocab_size;
        a->head.rank = r;
        a->head.A = a->tensors[ti].param;
        a->head.gA = a->tensors[ti].grad;
        a->head.B = a->tensors[ti + 1].param;
        a->head.gB = a->tensors[ti + 1].grad;
    }
    /* A ~ U(−1/√in, 1/√in): PEFT's kaiming_uniform_(a=√5); B stays zero. */
    for (int i = 0; i < nt; i += 2) {
        lora_tensor *t = &a->tensors[i];
        rng_state rs;
        rng_seed(&rs, c->seed ^ rng_hash_str(t->name));
        double bound = 1.0 / sqrt((double)t->cols);
        size_t n = (size_t)t->rows * t->cols;
        for (size_t k = 0; k < n; k++) t->param[k] = (float)((2.0 * rng_uniform(&rs) - 1.0) * bound);
    }
    return a;
oom:
    lo_err(err, errlen, "lora: out of memory");
    adapter_free(a);
    return NULL;
}

adapter *adapter_clone_weights(const adapter *a, char *err, size_t errlen)
{
    int L = a->num_layers, maxt = 2 * (L * LORA_NUM_MODULES + 1);
    adapter *b = calloc(1, sizeof *b);
    if (!b) goto oom;
    *b = *a;
    b->mem = NULL; /* nothing of a's may be freed with b on the error path */
    b->mods = NULL;
    b->tensors = NULL;
    b->names = NULL;
    b->mods = calloc((size_t)L * LORA_NUM_MODULES, sizeof *b->mods);
    b->tensors = calloc(maxt, sizeof *b->tensors);
    b->names = malloc((size_t)maxt * 96);
    if (!b->mods || !b->tensors || !b->names) goto oom;
    if (posix_memalign((void **)&b->mem, 64, (a->num_params + 16) * sizeof(float)) != 0) { b->mem = NULL; goto oom; }
    memcpy(b->mem, a->params, a->num_params * sizeof(float));
    memcpy(b->names, a->names, (size_t)maxt * 96);
    b->params = b->mem;
    b->grads = b->m = b->v = NULL;
    /* Every view is re-pointed by its offset into the source's params / names. */
#define REPOINT(p) ((p) ? b->params + ((p) - a->params) : NULL)
    for (int i = 0; i < a->num_tensors; i++) {
        b->tensors[i] = a->tensors[i];
        b->tensors[i].name = b->names + (a->tensors[i].name - a->names);
        b->tensors[i].param = REPOINT(a->tensors[i].param);
        b->tensors[i].grad = b->tensors[i].m = b->tensors[i].v = NULL;
    }
    for (int i = 0; i < L * LORA_NUM_MODULES; i++) {
        b->mods[i] = a->mods[i];
        b->mods[i].A = REPOINT(a->mods[i].A);
        b->mods[i].B = REPOINT(a->mods[i].B);
        b->mods[i].gA = b->mods[i].gB = NULL;
    }
    b->head.A = REPOINT(a->head.A);
    b->head.B = REPOINT(a->head.B);
    b->head.gA = b->head.gB = NULL;
#undef REPOINT
    return b;
oom:
    lo_err(err, errlen, "lora: out of memory");
    adapter_free(b);
    return NULL;
}

void adapter_free(adapter *a)
{
    if (!a) return;
    free(a->mem);
    free(a->mods);
    free(a->tensors);
    free(a->names);
    free(a);
}

size_t adapter_num_params(const adapter *a) { return a->num_params; }
int adapter_num_tensors(const adapter *a) { return a->num_tensors; }

void adapter_tensor(const adapter *a, int i, const char **name, int *rows, int *cols, float **param, float **grad,
                    float **m, float **v)
{
    const lora_tensor *t = &a->tensors[i];
    if (name) *name = t->name;
    if (rows) *rows = t->rows;
    if (cols) *cols = t->cols;
    if (param) *param = t->param;
    if (grad) *grad = t->grad;
    if (m) *m = t->m;
    if (v) *v = t->v;
}

int adapter_find_tensor(const adapter *a, const char *name)
{
    for (int i = 0; i < a->num_tensors; i++) if (strcmp(a->tensors[i].name, name) == 0) return i;
    return -1;
}

int64_t adapter_step(const adapter *a) { return a->step; }
void adapter_set_step(adapter *a, int64_t step) { a->step = step; }
void adapter_zero_grad(adapter *a) { memset(a->grads, 0, a->num_params * sizeof(float)); }

void adapter_reset_optimizer(adapter *a)
{
    memset(a->m, 0, 2 * a->num_params * sizeof(float)); /* m and v are adjacent */
    a->step = 0;
}

const lora_config *adapter_get_config(const adapter *a) { return &a->cfg; }

lora_pair *adapter_module(const adapter *a, int layer, lora_module mod)
{
    lora_pair *p = &a->mods[layer * LORA_NUM_MODULES + mod];
    return p->A ? p : NULL;
}

lora_pair *adapter_head(const adapter *a) { return a->head.A ? (lora_pair *)&a->head : NULL; }

bool adapter_matches(const adapter *a, const base_model *m)
{
    return a->num_layers == m->cfg.num_hidden_layers && a->hidden == m->cfg.hidden_size && a->vocab == m->cfg.vocab_size;
}
