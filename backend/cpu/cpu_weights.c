/* cpu_weights.c — fp32 base weights from the stored tensors (see cpu_weights.h). */
#include "backend/cpu/cpu_weights.h"
#include "common/err.h"

#include <stdlib.h>

/* Carves t's floats off *p and converts t into them; NULL tensors stay NULL. */
static int cw_take(float **dst, float **p, const st_tensor *t, char *err, size_t errlen)
{
    if (!t) return 0;
    *dst = *p;
    *p += t->numel;
    return st_tensor_to_f32(t, *dst, (size_t)t->numel, err, errlen);
}

int cpu_weights_load(const model_files *m, cpu_weights **out, char *err, size_t errlen)
{
    *out = NULL;
    const model_config *c = &m->cfg;
    cpu_weights *w = calloc(1, sizeof *w);
    if (!w) { err_set(err, errlen, "cpu: out of memory"); return -1; }
    w->cfg = *c;
    w->num_floats = model_num_params(c);
    w->layers = calloc(c->num_hidden_layers, sizeof *w->layers);
    if (posix_memalign((void **)&w->mem, 64, w->num_floats * sizeof(float)) != 0) w->mem = NULL;
    if (!w->layers || !w->mem) {
        err_set(err, errlen, "cpu: out of memory for %zu base weights", w->num_floats);
        goto fail;
    }
    float *p = w->mem;
    if (cw_take(&w->embed, &p, m->embed, err, errlen) < 0 || cw_take(&w->final_norm, &p, m->final_norm, err, errlen) < 0)
        goto fail;
    if (m->lm_head == m->embed) w->lm_head = w->embed;
    else if (cw_take(&w->lm_head, &p, m->lm_head, err, errlen) < 0) goto fail;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const model_layer_tensors *s = &m->layers[l];
        cpu_layer_weights *y = &w->layers[l];
        float **dst[] = {&y->attn_norm, &y->wq, &y->wk, &y->wv, &y->wo, &y->bq, &y->bk, &y->bv, &y->bo,
                         &y->q_norm, &y->k_norm, &y->mlp_norm, &y->wgate, &y->wup, &y->wdown};
        const st_tensor *src[] = {s->attn_norm, s->wq, s->wk, s->wv, s->wo, s->bq, s->bk, s->bv, s->bo,
                                  s->q_norm, s->k_norm, s->mlp_norm, s->wgate, s->wup, s->wdown};
        for (size_t i = 0; i < sizeof dst / sizeof dst[0]; i++)
            if (cw_take(dst[i], &p, src[i], err, errlen) < 0) goto fail;
        if (!s->router) continue;
        if (cw_take(&y->router, &p, s->router, err, errlen) < 0) goto fail;
        y->experts = p;
        for (int e = 0; e < c->num_experts; e++) {
            float *unused;
            if (cw_take(&unused, &p, s->exp_gate[e], err, errlen) < 0 || cw_take(&unused, &p, s->exp_up[e], err, errlen) < 0 ||
                cw_take(&unused, &p, s->exp_down[e], err, errlen) < 0)
                goto fail;
        }
    }
    if ((size_t)(p - w->mem) != w->num_floats) {
        err_set(err, errlen, "cpu: internal size mismatch (%zu vs %zu floats)", (size_t)(p - w->mem), w->num_floats);
        goto fail;
    }
    *out = w;
    return 0;
fail:
    cpu_weights_free(w);
    return -1;
}

void cpu_weights_free(cpu_weights *w)
{
    if (!w) return;
    free(w->mem);
    free(w->layers);
    free(w);
}
