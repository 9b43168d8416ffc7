/* cpu_layer.c — one decoder layer (Llama / Qwen2 / Qwen3) over the packed batch, forward
 * and backward, with each segment's LoRA on the adapted projections. Base weights are
 * frozen: the backward produces activation gradients and LoRA gradients only.
 *
 *   xn1 = rmsnorm(x)                       q,k,v = xn1 W{q,k,v}ᵀ (+b) + LoRA
 *   [qwen3] q,k = rmsnorm_per_head(q,k)    q,k = rope(q,k)
 *   att = causal_gqa(q,k,v)                xmid = x + att Woᵀ (+b) + LoRA
 *   xn2 = rmsnorm(xmid)                    g,u = xn2 W{gate,up}ᵀ + LoRA
 *   h = silu(g)·u                          x' = xmid + h Wdownᵀ + LoRA
 *
 * A sparse layer of a Qwen3-MoE model replaces the MLP (g, u, h, down) by the router and
 * its experts (cpu_moe.c): x' = xmid + moe(xn2).
 */
#include "backend/cpu/cpu_layer.h"
#include "backend/cpu/cpu_kv.h"
#include "backend/cpu/cpu_moe.h"
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- LoRA ---------------------------------------------------------------------------- */

/* The products of one segment's rows, on pool (NULL: on this thread) with z, dz as
 * scratch of rows × rank. Every element comes out the same bits however cpu_sgemm splits
 * the work (cpu_gemm.h), so running a segment on one thread changes nothing. */
static void lora_fwd_rows(cpu_pool *pool, float *z, const lora_pair *p, float scale, const float *x, float *y,
                          int rows)
{
    int r = p->rank;
    /* z = x Aᵀ [rows, r];  y += scale · z Bᵀ */
    cpu_sgemm(pool, false, true, rows, r, p->in, 1.0f, x, p->in, p->A, p->in, 0.0f, z, r);
    cpu_sgemm(pool, false, true, rows, p->out, r, scale, z, r, p->B, r, 1.0f, y, p->out);
}

static void lora_bwd_rows(cpu_pool *pool, float *z, float *dz, const lora_pair *p, float scale, const float *x,
                          const float *dy, float *dx, int rows)
{
    int r = p->rank;
    /* z = x Aᵀ (recomputed);  gB += scale·dyᵀ z;  dz = scale·dy B;  gA += dzᵀ x;  dx += dz A */
    cpu_sgemm(pool, false, true, rows, r, p->in, 1.0f, x, p->in, p->A, p->in, 0.0f, z, r);
    cpu_sgemm(pool, true, false, p->out, r, rows, scale, dy, p->out, z, r, 1.0f, p->gB, r);
    cpu_sgemm(pool, false, false, rows, r, p->out, scale, dy, p->out, p->B, r, 0.0f, dz, r);
    cpu_sgemm(pool, true, false, r, p->in, rows, 1.0f, dz, r, x, p->in, 1.0f, p->gA, p->in);
    if (dx) cpu_sgemm(pool, false, false, rows, p->in, r, 1.0f, dz, r, p->A, p->in, 1.0f, dx, p->in);
}

void cpu_lora_fwd_on(cpu_pool *pool, float *z, const lora_pair *p, float scale, const float *x, float *y, int rows)
{
    lora_fwd_rows(pool, z, p, scale, x, y, rows);
}

void cpu_lora_bwd_on(cpu_pool *pool, float *z, float *dz, const lora_pair *p, float scale, const float *x,
                     const float *dy, float *dx, int rows)
{
    lora_bwd_rows(pool, z, dz, p, scale, x, dy, dx, rows);
}

void cpu_lora_fwd_rows(cpu_ctx *c, const lora_pair *p, float scale, const float *x, float *y, int rows)
{
    lora_fwd_rows(c->pool, c->z, p, scale, x, y, rows);
}

void cpu_lora_bwd_rows(cpu_ctx *c, const lora_pair *p, float scale, const float *x, const float *dy, float *dx,
                       int rows)
{
    lora_bwd_rows(c->pool, c->z, c->dz, p, scale, x, dy, dx, rows);
}

/* Many adapters in one pass (tenants packed into a cycle) give many small LoRA products,
 * each too small for cpu_sgemm to split across the pool: the segments are run side by
 * side instead, one task per adapter (its segments in order, as the sequential loop
 * takes them, since they add into the same gradients), each on its own rows of z/dz. */
typedef struct {
    cpu_ctx *c;
    int l;
    lora_module mod;
    const float *x, *dy;
    float *y, *dx;
    const int *order;  /* segment indices grouped by adapter, in segment order within a group */
    const int *group;  /* group g is order[group[g] .. group[g + 1]) */
} lora_tasks;

/* Whether segment s takes part: its adapter trains this module (and, backward, has gradients). */
static bool lora_applies(const lora_tasks *t, int s)
{
    const cpu_segment *sg = &t->c->segs[s];
    return cpu_adapter_module(sg->ad, t->l, t->mod) && (!t->dy || sg->grad);
}

/* Segment s's products on pool (NULL: this thread), on its own rows of z/dz. */
static void lora_segment(const lora_tasks *t, int s, cpu_pool *pool)
{
    cpu_ctx *c = t->c;
    const cpu_segment *sg = &c->segs[s];
    const lora_pair *p = cpu_adapter_module(sg->ad, t->l, t->mod);
    long b = sg->row_begin;
    int rows = sg->row_end - sg->row_begin;
    float *z = c->z + b * c->cap_rank, *dz = c->dz + b * c->cap_rank;
    if (t->dy)
        lora_bwd_rows(pool, z, dz, p, sg->ad->scale, t->x + b * p->in, t->dy + b * p->out,
                      t->dx ? t->dx + b * p->in : NULL, rows);
    else
        lora_fwd_rows(pool, z, p, sg->ad->scale, t->x + b * p->in, t->y + b * p->out, rows);
}

static void lora_task(void *arg, int g, int thread)
{
    (void)thread;
    const lora_tasks *t = arg;
    for (int k = t->group[g]; k < t->group[g + 1]; k++) lora_segment(t, t->order[k], NULL);
}

/* Runs the segments that take part as one task per adapter when there are at least two
 * adapters and a pool; false when that does not apply. */
static bool lora_side_by_side(cpu_ctx *c, lora_tasks *t)
{
    if (!c->pool || cpu_pool_size(c->pool) < 2 || c->nsegs < 2) return false;
    int n = c->nsegs, *order = malloc((size_t)n * sizeof *order), *group = malloc((size_t)(n + 1) * sizeof *group);
    char *taken = calloc((size_t)n, 1);
    if (!order || !group || !taken) { free(order); free(group); free(taken); return false; }
    int k = 0, ng = 0;
    for (int s = 0; s < n; s++) {
        if (taken[s] || !lora_applies(t, s)) continue;
        group[ng++] = k;
        for (int u = s; u < n; u++) /* the same adapter: the same module and gradients */
            if (!taken[u] && c->segs[u].ad == c->segs[s].ad) {
                taken[u] = 1;
                order[k++] = u;
            }
    }
    group[ng] = k;
    bool ran = ng >= 2;
    if (ran) {
        t->order = order;
        t->group = group;
        cpu_pool_run(c->pool, ng, lora_task, t);
    }
    free(order);
    free(group);
    free(taken);
    return ran;
}

/* The LoRA products of every segment that takes part: side by side, else one segment
 * after another with each GEMM split over the pool. */
static void cpu_lora_run(cpu_ctx *c, lora_tasks *t)
{
    if (lora_side_by_side(c, t)) return;
    for (int s = 0; s < c->nsegs; s++)
        if (lora_applies(t, s)) lora_segment(t, s, c->pool);
}

/* y += LoRA(x) for every segment whose adapter trains this module of layer l. */
static void cpu_lora_fwd(cpu_ctx *c, int l, lora_module mod, const float *x, float *y)
{
    lora_tasks t = {.c = c, .l = l, .mod = mod, .x = x, .y = y};
    cpu_lora_run(c, &t);
}

static void cpu_lora_bwd(cpu_ctx *c, int l, lora_module mod, const float *x, const float *dy, float *dx)
{
    lora_tasks t = {.c = c, .l = l, .mod = mod, .x = x, .dy = dy, .dx = dx};
    cpu_lora_run(c, &t);
}

/* y = x Wᵀ (+ bias) + LoRA: one adapted nn.Linear over all T rows. */
static void cpu_linear(cpu_ctx *c, int l, lora_module mod, const float *x, int in, const float *W, const float *bias,
                       int out, float *y, long T)
{
    cpu_sgemm(c->pool, false, true, (int)T, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
    if (bias) cpu_add_bias(c->pool, y, bias, T, out);
    cpu_lora_fwd(c, l, mod, x, y);
}

static cpu_attn_shape cpu_shape(const cpu_ctx *c)
{
    const model_config *mc = &c->m->cfg;
    cpu_attn_shape s = {c->nseq_packed, c->seq_start, c->blk_start, mc->num_attention_heads, mc->num_key_value_heads,
                        mc->head_dim, (float)(1.0 / sqrt((double)mc->head_dim))};
    return s;
}

/* ---- forward ------------------------------------------------------------------------- */

void cpu_layer_forward(cpu_ctx *c, int l, long T, bool recompute)
{
    const model_config *mc = &c->m->cfg;
    const cpu_layer_weights *w = &c->m->layers[l];
    int H = mc->hidden_size, I = mc->intermediate_size, d = mc->head_dim, nq = mc->num_attention_heads,
        nkv = mc->num_key_value_heads, qd = nq * d, kvd = nkv * d;
    cpu_pool *p = c->pool;

    cpu_rmsnorm_fwd(p, c->xn1, c->rstd1, c->x, w->attn_norm, T, H, mc->rms_norm_eps);
    /* Without qk-norm the projections go straight to q/k (RoPE is applied in place). */
    float *qp = mc->qk_norm ? c->q_pre : c->q, *kp = mc->qk_norm ? c->k_pre : c->k;
    cpu_linear(c, l, LORA_Q, c->xn1, H, w->wq, w->bq, qd, qp, T);
    cpu_linear(c, l, LORA_K, c->xn1, H, w->wk, w->bk, kvd, kp, T);
    cpu_linear(c, l, LORA_V, c->xn1, H, w->wv, w->bv, kvd, c->v, T);
    if (mc->qk_norm) {
        cpu_rmsnorm_fwd(p, c->q, c->rstd_q, c->q_pre, w->q_norm, T * nq, d, mc->rms_norm_eps);
        cpu_rmsnorm_fwd(p, c->k, c->rstd_k, c->k_pre, w->k_norm, T * nkv, d, mc->rms_norm_eps);
    }
    cpu_rope(p, c->q, T, nq, d, c->pos, c->rope_cos, c->rope_sin, false);
    cpu_rope(p, c->k, T, nkv, d, c->pos, c->rope_cos, c->rope_sin, false);
    if (c->kv_mode != CPU_KV_NONE) cpu_kv_store(c, l, T);
    if (c->kv_mode == CPU_KV_DECODE) { /* one new token per stream, attending to its cache */
        cpu_kv_attention(c, l, T);
    } else {
        cpu_attn_shape sh = cpu_shape(c);
        cpu_attention_fwd(p, &sh, c->q, c->k, c->v, c->att, c->lse, c->attn_scratch, c->attn_per_thread);
    }
    cpu_linear(c, l, LORA_O, c->att, qd, w->wo, w->bo, H, c->tmp, T);
    for (long i = 0; i < T * H; i++) c->xmid[i] = c->x[i] + c->tmp[i];

    cpu_rmsnorm_fwd(p, c->xn2, c->rstd2, c->xmid, w->mlp_norm, T, H, mc->rms_norm_eps);
    if (w->router) {
        cpu_moe_forward(c, l, T, recompute);
        if (recompute) return;
        for (long i = 0; i < T * H; i++) c->x[i] = c->xmid[i] + c->tmp[i];
        return;
    }
    cpu_linear(c, l, LORA_GATE, c->xn2, H, w->wgate, NULL, I, c->g, T);
    cpu_linear(c, l, LORA_UP, c->xn2, H, w->wup, NULL, I, c->u, T);
    cpu_swiglu_fwd(p, c->h, c->g, c->u, T * I);
    if (recompute) return; /* the backward needs everything up to h, not the layer output */
    cpu_linear(c, l, LORA_DOWN, c->h, I, w->wdown, NULL, H, c->tmp, T);
    for (long i = 0; i < T * H; i++) c->x[i] = c->xmid[i] + c->tmp[i];
}

/* ---- backward ------------------------------------------------------------------------ */

/* On entry c->dx = dL/d(layer output) and the layer's forward intermediates are in place
 * (cpu_layer_forward with recompute, c->x = layer input). On return c->dx = dL/d(layer
 * input) when need_dx (layer 0 skips it: the embedding is frozen). */
void cpu_layer_backward(cpu_ctx *c, int l, long T, bool need_dx)
{
    const model_config *mc = &c->m->cfg;
    const cpu_layer_weights *w = &c->m->layers[l];
    int H = mc->hidden_size, I = mc->intermediate_size, d = mc->head_dim, nq = mc->num_attention_heads,
        nkv = mc->num_key_value_heads, qd = nq * d, kvd = nkv * d;
    cpu_pool *p = c->pool;

    /* MLP: x' = xmid + down(h), h = silu(g)·u (sparse layer: x' = xmid + moe(xn2)) */
    if (w->router) {
        cpu_moe_backward(c, l, T);
    } else {
        cpu_sgemm(p, false, false, (int)T, I, H, 1.0f, c->dx, H, w->wdown, I, 0.0f, c->dh, I);
        cpu_lora_bwd(c, l, LORA_DOWN, c->h, c->dx, c->dh);
        cpu_swiglu_bwd(p, c->dg, c->du, c->dh, c->g, c->u, T * I);
        cpu_sgemm(p, false, false, (int)T, H, I, 1.0f, c->dg, I, w->wgate, H, 0.0f, c->dxn, H);
        cpu_sgemm(p, false, false, (int)T, H, I, 1.0f, c->du, I, w->wup, H, 1.0f, c->dxn, H);
        cpu_lora_bwd(c, l, LORA_GATE, c->xn2, c->dg, c->dxn);
        cpu_lora_bwd(c, l, LORA_UP, c->xn2, c->du, c->dxn);
    }
    cpu_rmsnorm_bwd(p, c->dx, c->dxn, c->xmid, c->rstd2, w->mlp_norm, T, H, true); /* dx = dL/dxmid */

    /* attention: xmid = x + o(att) */
    cpu_sgemm(p, false, false, (int)T, qd, H, 1.0f, c->dx, H, w->wo, qd, 0.0f, c->datt, qd);
    cpu_lora_bwd(c, l, LORA_O, c->att, c->dx, c->datt);
    cpu_attn_shape sh = cpu_shape(c);
    cpu_attention_bwd(p, &sh, c->q, c->k, c->v, c->att, c->lse, c->datt, c->dq, c->dk, c->dv, c->attn_scratch,
                      c->attn_per_thread);
    cpu_rope(p, c->dq, T, nq, d, c->pos, c->rope_cos, c->rope_sin, true);
    cpu_rope(p, c->dk, T, nkv, d, c->pos, c->rope_cos, c->rope_sin, true);
    if (mc->qk_norm) { /* in place: the kernel reads dy[i] before writing dx[i] */
        cpu_rmsnorm_bwd(p, c->dq, c->dq, c->q_pre, c->rstd_q, w->q_norm, T * nq, d, false);
        cpu_rmsnorm_bwd(p, c->dk, c->dk, c->k_pre, c->rstd_k, w->k_norm, T * nkv, d, false);
    }
    if (!need_dx) {
        cpu_lora_bwd(c, l, LORA_Q, c->xn1, c->dq, NULL);
        cpu_lora_bwd(c, l, LORA_K, c->xn1, c->dk, NULL);
        cpu_lora_bwd(c, l, LORA_V, c->xn1, c->dv, NULL);
        return;
    }
    cpu_sgemm(p, false, false, (int)T, H, qd, 1.0f, c->dq, qd, w->wq, H, 0.0f, c->dxn, H);
    cpu_sgemm(p, false, false, (int)T, H, kvd, 1.0f, c->dk, kvd, w->wk, H, 1.0f, c->dxn, H);
    cpu_sgemm(p, false, false, (int)T, H, kvd, 1.0f, c->dv, kvd, w->wv, H, 1.0f, c->dxn, H);
    cpu_lora_bwd(c, l, LORA_Q, c->xn1, c->dq, c->dxn);
    cpu_lora_bwd(c, l, LORA_K, c->xn1, c->dk, c->dxn);
    cpu_lora_bwd(c, l, LORA_V, c->xn1, c->dv, c->dxn);
    cpu_rmsnorm_bwd(p, c->dx, c->dxn, c->x, c->rstd1, w->attn_norm, T, H, true);
}
