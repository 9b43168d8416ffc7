/* cpu_kv.c — the KV caches of sampling passes: the side of cpu_layer_forward that stores
 * each row's K/V into its streams' caches (prefill and decode) and, in decode, attends to
 * a stream's cache instead of the packed rows. Layout in cpu_ctx.h. */
#include "backend/cpu/cpu_kv.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

static float *cs_cache(cpu_ctx *c, int stream, int l, int which /* 0 K, 1 V */)
{
    const model_config *mc = &c->m->cfg;
    size_t kvd = (size_t)mc->num_key_value_heads * mc->head_dim, L = mc->num_hidden_layers;
    return c->kv_mem + (size_t)stream * 2 * L * c->kv_cap * kvd + ((size_t)which * L + l) * c->kv_cap * kvd;
}

void cpu_kv_store(cpu_ctx *c, int l, long T)
{
    const model_config *mc = &c->m->cfg;
    size_t kvd = (size_t)mc->num_key_value_heads * mc->head_dim;
    for (long t = 0; t < T; t++) {
        int g = c->row_seq[t], pos = c->pos[t];
        for (int s = c->kv_stream0[g]; s < c->kv_stream0[g] + c->kv_nstream[g]; s++) {
            memcpy(cs_cache(c, s, l, 0) + pos * kvd, c->k + t * kvd, kvd * sizeof(float));
            memcpy(cs_cache(c, s, l, 1) + pos * kvd, c->v + t * kvd, kvd * sizeof(float));
        }
    }
}

typedef struct {
    cpu_ctx *c;
    int l;
} cs_attn_job;

/* One (row, query head): softmax(q·K[0..pos]ᵀ/√d) V against the row's stream cache. */
static void cs_attn_task(void *va, int task, int thread)
{
    const cs_attn_job *j = va;
    cpu_ctx *c = j->c;
    const model_config *mc = &c->m->cfg;
    int nq = mc->num_attention_heads, nkv = mc->num_key_value_heads, d = mc->head_dim, kvd = nkv * d;
    int t = task / nq, h = task % nq, g = h / (nq / nkv), n = c->pos[t] + 1;
    int s = c->kv_stream0[c->row_seq[t]];
    const float *K = cs_cache(c, s, j->l, 0) + g * d, *V = cs_cache(c, s, j->l, 1) + g * d;
    float *S = c->attn_scratch + (long)thread * c->attn_per_thread;
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, d, (float)(1.0 / sqrt((double)d)), K, kvd, c->q + (long)t * nq * d + h * d,
                1, 0.0f, S, 1);
    float mx = S[0];
    for (int i = 1; i < n; i++) mx = S[i] > mx ? S[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) { S[i] = expf(S[i] - mx); sum += S[i]; }
    cblas_sgemv(CblasRowMajor, CblasTrans, n, d, (float)(1.0 / sum), V, kvd, S, 1, 0.0f,
                c->att + (long)t * nq * d + h * d, 1);
}

void cpu_kv_attention(cpu_ctx *c, int l, long T)
{
    cs_attn_job j = {c, l};
    cpu_pool_run(c->pool, (int)T * c->m->cfg.num_attention_heads, cs_attn_task, &j);
}

