/* cpu_moe.c — the sparse MoE block of a Qwen3-MoE layer (transformers'
 * Qwen3MoeSparseMoeBlock), forward and backward, over the packed rows:
 *
 *   p = softmax(xn2 Wrᵀ)                      the router, over all E experts, per token
 *   sel = the K largest p (ties: lower index)  w = p[sel] (/ Σ p[sel] when norm_topk_prob)
 *   y_e(x) = (silu(x W_gᵀ + LoRA) · (x W_uᵀ + LoRA)) W_dᵀ + LoRA     expert e's SwiGLU
 *   out = Σ_k w_k · y_sel[k](xn2)
 *
 * Grouping: a token's K assignments go to their experts' blocks of rows (e_off), tokens in
 * row order within a block, so that each expert's products are one GEMM over its rows
 * (the shape of a GPU's grouped GEMM). A segment (one adapter, one operation) is a
 * contiguous run of rows, hence a contiguous run inside every expert's block: its LoRA
 * products are per (expert, segment), each expert with its own A and B.
 *
 * Batch invariance (docs/architecture.md): a row's products are the same bits in any
 * position of any GEMM (cpu_gemm.h), routing and combining are per token (the K terms in
 * the order of sel), and a segment's LoRA gradient is one GEMM over its own rows of the
 * expert's block; so nothing a token or an operation gets depends on what else is packed.
 * Experts run side by side (one pool task each) when there are enough of them, else one
 * after another with each GEMM split over the pool: the same bits either way.
 */
#include "backend/cpu/cpu_moe.h"
#include "backend/cpu/cpu_buffers.h"
#include "backend/cpu/cpu_layer.h"
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- buffers --------------------------------------------------------------------------- */

void cpu_moe_free(cpu_ctx *c)
{
    float **fl[] = {&c->r_prob, &c->r_w, &c->r_dw, &c->ex, &c->ey, &c->eg, &c->eu, &c->eh, &c->edh, &c->ez, &c->edz};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) { free(*fl[i]); *fl[i] = NULL; }
    free(c->r_sel); free(c->e_off); free(c->a_pos); free(c->a_tok);
    c->r_sel = c->a_pos = c->a_tok = NULL;
    c->e_off = NULL;
}

int cpu_moe_reserve(cpu_ctx *c, long cap, int rank)
{
    const model_config *mc = &c->m->cfg;
    if (mc->num_experts <= 0) return 0;
    cpu_moe_free(c);
    size_t f = sizeof(float), E = mc->num_experts, K = mc->num_experts_per_tok, H = mc->hidden_size,
           Im = mc->moe_intermediate_size, A = (size_t)cap * K;
    int rc = cpu_alloc(&c->r_prob, cap * E * f) | cpu_alloc(&c->r_w, A * f) | cpu_alloc(&c->r_dw, A * f) |
             cpu_alloc(&c->r_sel, A * sizeof(int32_t)) | cpu_alloc(&c->a_pos, A * sizeof(int32_t)) |
             cpu_alloc(&c->a_tok, A * sizeof(int32_t)) | cpu_alloc(&c->e_off, (2 * E + 1) * sizeof(int)) |
             cpu_alloc(&c->ex, A * H * f) | cpu_alloc(&c->ey, A * H * f) | cpu_alloc(&c->eg, A * Im * f) |
             cpu_alloc(&c->eu, A * Im * f) | cpu_alloc(&c->eh, A * Im * f) | cpu_alloc(&c->edh, A * Im * f) |
             cpu_alloc(&c->ez, A * rank * f) | cpu_alloc(&c->edz, A * rank * f);
    if (rc) cpu_moe_free(c);
    return rc ? -1 : 0;
}

/* ---- routing ----------------------------------------------------------------------------- */

typedef struct {
    cpu_ctx *c;
    const cpu_layer_weights *w;
    const float *dx;       /* backward: dL/d(block output) */
    float *out;            /* forward: the block output; backward: dL/dxn2 */
    int l;
    bool backward;
    int *experts, n_experts; /* the experts that have rows, for the side-by-side tasks */
} moe_job;

/* Softmax over the experts (in double), then the K most likely: a strict > keeps the
 * lower index of equal probabilities first, as torch.topk gives them on the CPU. */
static void moe_route_rows(void *va, long b, long e, int thread)
{
    (void)thread;
    const moe_job *j = va;
    const cpu_ctx *c = j->c;
    const model_config *mc = &c->m->cfg;
    int E = mc->num_experts, K = mc->num_experts_per_tok;
    for (long t = b; t < e; t++) {
        float *p = c->r_prob + t * E;
        double mx = p[0], sum = 0;
        for (int i = 1; i < E; i++) mx = p[i] > mx ? p[i] : mx;
        for (int i = 0; i < E; i++) sum += exp((double)p[i] - mx);
        for (int i = 0; i < E; i++) p[i] = (float)(exp((double)p[i] - mx) / sum);
        int32_t *sel = c->r_sel + t * K;
        float *w = c->r_w + t * K;
        double s = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int i = 0; i < E; i++) {
                bool taken = false;
                for (int q = 0; q < k && !taken; q++) taken = sel[q] == i;
                if (!taken && (best < 0 || p[i] > p[best])) best = i;
            }
            sel[k] = best;
            s += p[best];
        }
        for (int k = 0; k < K; k++) w[k] = mc->norm_topk_prob ? (float)(p[sel[k]] / s) : p[sel[k]];
    }
}

/* e_off, a_pos, a_tok: the assignments grouped by expert, tokens in row order. */
static void moe_group(cpu_ctx *c, long T)
{
    const model_config *mc = &c->m->cfg;
    be_moe_group(c->r_sel, T, mc->num_experts_per_tok, mc->num_experts, c->e_off, c->e_off + mc->num_experts + 1,
                 c->a_pos, c->a_tok);
}

/* The routing of each sequence added into its expert_counts_out (cpu_forward_backward
 * zeroes them first). */
static void moe_count(cpu_ctx *c, int l, long T)
{
    const model_config *mc = &c->m->cfg;
    int E = mc->num_experts, K = mc->num_experts_per_tok, li = model_moe_index(mc, l);
    for (long t = 0; t < T; t++) {
        int32_t *cnt = c->route_seqs[c->row_seq[t]].expert_counts_out;
        if (!cnt) continue;
        for (int k = 0; k < K; k++) cnt[(size_t)li * E + c->r_sel[t * K + k]]++;
    }
}

/* ---- the experts ------------------------------------------------------------------------- */

/* Expert e's LoRA for module mod over its rows, segment by segment: forward y += ...
 * (dy NULL), else the gradients of the segments that carry one and dx += ... */
static void moe_lora(const moe_job *j, cpu_pool *pool, int e, lora_module mod, const float *x, int in, float *y,
                     const float *dy, float *dx, int out)
{
    cpu_ctx *c = j->c;
    int r0 = c->e_off[e], r1 = c->e_off[e + 1];
    for (int s = 0; s < c->nsegs; s++) {
        const cpu_segment *sg = &c->segs[s];
        if (dy && !sg->grad) continue;
        const lora_pair *p = cpu_adapter_expert(sg->ad, j->l, e, mod);
        if (!p) continue;
        int a = be_moe_lower(c->a_tok, r0, r1, sg->row_begin), b = be_moe_lower(c->a_tok, a, r1, sg->row_end);
        if (a == b) continue;
        float *z = c->ez + (size_t)a * c->cap_rank, *dz = c->edz + (size_t)a * c->cap_rank;
        if (dy)
            cpu_lora_bwd_on(pool, z, dz, p, sg->ad->scale, x + (size_t)a * in, dy + (size_t)a * out,
                            dx ? dx + (size_t)a * in : NULL, b - a);
        else
            cpu_lora_fwd_on(pool, z, p, sg->ad->scale, x + (size_t)a * in, y + (size_t)a * out, b - a);
    }
}

/* Expert e forward: g, u = x W{g,u}ᵀ + LoRA, h = silu(g)·u, y = h W_dᵀ + LoRA. */
static void moe_expert_fwd(const moe_job *j, int e, cpu_pool *pool)
{
    cpu_ctx *c = j->c;
    const model_config *mc = &c->m->cfg;
    int H = mc->hidden_size, Im = mc->moe_intermediate_size, r0 = c->e_off[e], n = c->e_off[e + 1] - r0;
    float *x = c->ex + (size_t)r0 * H, *g = c->eg + (size_t)r0 * Im, *u = c->eu + (size_t)r0 * Im,
          *h = c->eh + (size_t)r0 * Im, *y = c->ey + (size_t)r0 * H;
    cpu_sgemm(pool, false, true, n, Im, H, 1.0f, x, H, cpu_expert_w(j->w, mc, e, 0), H, 0.0f, g, Im);
    cpu_sgemm(pool, false, true, n, Im, H, 1.0f, x, H, cpu_expert_w(j->w, mc, e, 1), H, 0.0f, u, Im);
    moe_lora(j, pool, e, LORA_GATE, c->ex, H, c->eg, NULL, NULL, Im);
    moe_lora(j, pool, e, LORA_UP, c->ex, H, c->eu, NULL, NULL, Im);
    cpu_swiglu_fwd(pool, h, g, u, (long)n * Im);
    cpu_sgemm(pool, false, true, n, H, Im, 1.0f, h, Im, cpu_expert_w(j->w, mc, e, 2), Im, 0.0f, y, H);
    moe_lora(j, pool, e, LORA_DOWN, c->eh, Im, c->ey, NULL, NULL, H);
}

/* Expert e backward, ey holding dL/dy on entry and dL/dx on return (its rows only):
 * dh = dy W_d + LoRA; dg, du from the SwiGLU (into eh, edh: h is no longer needed once the
 * down LoRA has its gradient); dx = dg W_g + du W_u + LoRA. */
static void moe_expert_bwd(const moe_job *j, int e, cpu_pool *pool)
{
    cpu_ctx *c = j->c;
    const model_config *mc = &c->m->cfg;
    int H = mc->hidden_size, Im = mc->moe_intermediate_size, r0 = c->e_off[e], n = c->e_off[e + 1] - r0;
    float *dy = c->ey + (size_t)r0 * H, *g = c->eg + (size_t)r0 * Im, *u = c->eu + (size_t)r0 * Im,
          *h = c->eh + (size_t)r0 * Im, *dh = c->edh + (size_t)r0 * Im;
    cpu_sgemm(pool, false, false, n, Im, H, 1.0f, dy, H, cpu_expert_w(j->w, mc, e, 2), Im, 0.0f, dh, Im);
    moe_lora(j, pool, e, LORA_DOWN, c->eh, Im, NULL, c->ey, c->edh, H);
    cpu_swiglu_bwd(pool, h, dh, dh, g, u, (long)n * Im); /* dg → h, du → dh (read before written) */
    float *dg = h, *du = dh, *dx = dy;                  /* dL/dy is spent once the down LoRA has it */
    cpu_sgemm(pool, false, false, n, H, Im, 1.0f, dg, Im, cpu_expert_w(j->w, mc, e, 0), H, 0.0f, dx, H);
    cpu_sgemm(pool, false, false, n, H, Im, 1.0f, du, Im, cpu_expert_w(j->w, mc, e, 1), H, 1.0f, dx, H);
    moe_lora(j, pool, e, LORA_GATE, c->ex, H, NULL, c->eh, c->ey, Im);
    moe_lora(j, pool, e, LORA_UP, c->ex, H, NULL, c->edh, c->ey, Im);
}

static void moe_expert_task(void *va, int task, int thread)
{
    (void)thread;
    const moe_job *j = va;
    if (j->backward) moe_expert_bwd(j, j->experts[task], NULL);
    else moe_expert_fwd(j, j->experts[task], NULL);
}

/* Every expert with rows: side by side when there are at least as many as threads, else
 * one after another with each GEMM split across the pool (the same bits, cpu_gemm.h). */
static void moe_experts(moe_job *j)
{
    cpu_ctx *c = j->c;
    int E = c->m->cfg.num_experts, *list = c->e_off + E + 1; /* fill[] is spent: reuse it */
    j->n_experts = 0;
    for (int e = 0; e < E; e++)
        if (c->e_off[e + 1] > c->e_off[e]) list[j->n_experts++] = e;
    j->experts = list;
    if (c->pool && cpu_pool_size(c->pool) > 1 && j->n_experts >= cpu_pool_size(c->pool)) {
        cpu_pool_run(c->pool, j->n_experts, moe_expert_task, j);
        return;
    }
    for (int k = 0; k < j->n_experts; k++) {
        if (j->backward) moe_expert_bwd(j, list[k], c->pool);
        else moe_expert_fwd(j, list[k], c->pool);
    }
}

/* ---- gather, combine ------------------------------------------------------------------------ */

static void moe_gather_rows(void *va, long b, long e, int thread)
{
    (void)thread;
    const moe_job *j = va;
    const cpu_ctx *c = j->c;
    int H = c->m->cfg.hidden_size;
    for (long r = b; r < e; r++) memcpy(c->ex + r * H, c->xn2 + (long)c->a_tok[r] * H, (size_t)H * sizeof(float));
}

/* out[t] = Σ_k w_k · y[a_pos(t, k)], k in the order of sel. */
static void moe_combine_rows(void *va, long b, long e, int thread)
{
    (void)thread;
    const moe_job *j = va;
    const cpu_ctx *c = j->c;
    int H = c->m->cfg.hidden_size, K = c->m->cfg.num_experts_per_tok;
    for (long t = b; t < e; t++) {
        float *o = j->out + t * H;
        for (int k = 0; k < K; k++) {
            const float *y = c->ey + (size_t)c->a_pos[t * K + k] * H;
            float w = c->r_w[t * K + k];
            for (int i = 0; i < H; i++) o[i] = k ? o[i] + w * y[i] : w * y[i];
        }
    }
}

void cpu_moe_forward(cpu_ctx *c, int l, long T, bool recompute)
{
    const model_config *mc = &c->m->cfg;
    const cpu_layer_weights *w = &c->m->layers[l];
    int H = mc->hidden_size, E = mc->num_experts, K = mc->num_experts_per_tok;
    moe_job j = {.c = c, .w = w, .out = c->tmp, .l = l};
    cpu_sgemm(c->pool, false, true, (int)T, E, H, 1.0f, c->xn2, H, w->router, H, 0.0f, c->r_prob, E);
    cpu_pool_for(c->pool, T, 16, moe_route_rows, &j);
    moe_group(c, T);
    if (!recompute && c->route_seqs) moe_count(c, l, T);
    cpu_pool_for(c->pool, T * K, 64, moe_gather_rows, &j);
    moe_experts(&j);
    if (recompute) return; /* the backward needs the experts' outputs, not their sum */
    cpu_pool_for(c->pool, T, 16, moe_combine_rows, &j);
}

/* ---- backward ------------------------------------------------------------------------------- */

/* dL/dw_k = dx · y_k (in double), then y_k := w_k · dx, the expert's dL/dy. */
static void moe_dweights_rows(void *va, long b, long e, int thread)
{
    (void)thread;
    const moe_job *j = va;
    const cpu_ctx *c = j->c;
    int H = c->m->cfg.hidden_size, K = c->m->cfg.num_experts_per_tok;
    for (long t = b; t < e; t++) {
        const float *dx = j->dx + t * H;
        for (int k = 0; k < K; k++) {
            float *y = c->ey + (size_t)c->a_pos[t * K + k] * H, w = c->r_w[t * K + k];
            double dot = 0;
            for (int i = 0; i < H; i++) dot += (double)dx[i] * y[i];
            c->r_dw[t * K + k] = (float)dot;
            for (int i = 0; i < H; i++) y[i] = w * dx[i];
        }
    }
}

/* dL/dxn2[t] = Σ_k (the experts' dL/dx)[a_pos(t, k)], and the router's dL/dlogits into
 * r_prob (the router GEMM adds their share after):
 *   norm_topk_prob: w_k = p_k / S, S = Σ p_sel  →  dL/dp_k = (dw_k − Σ_i dw_i w_i) / S
 *   else w_k = p_k                            →  dL/dp_k = dw_k
 *   softmax: dL/dlogit_e = p_e (dL/dp_e − Σ_f p_f dL/dp_f), dL/dp zero off the chosen. */
static void moe_dinput_rows(void *va, long b, long e, int thread)
{
    (void)thread;
    const moe_job *j = va;
    const cpu_ctx *c = j->c;
    const model_config *mc = &c->m->cfg;
    int H = mc->hidden_size, K = mc->num_experts_per_tok, E = mc->num_experts;
    double dp[MODEL_MAX_TOPK];
    for (long t = b; t < e; t++) {
        float *o = j->out + t * H;
        for (int k = 0; k < K; k++) {
            const float *dx = c->ey + (size_t)c->a_pos[t * K + k] * H;
            for (int i = 0; i < H; i++) o[i] = k ? o[i] + dx[i] : dx[i];
        }
        float *p = c->r_prob + t * E;
        const int32_t *sel = c->r_sel + t * K;
        const float *w = c->r_w + t * K, *dw = c->r_dw + t * K;
        double S = 0, dot = 0, q = 0;
        for (int k = 0; k < K; k++) {
            S += p[sel[k]];
            dot += (double)dw[k] * w[k];
        }
        for (int k = 0; k < K; k++) {
            dp[k] = mc->norm_topk_prob ? (dw[k] - dot) / S : dw[k];
            q += p[sel[k]] * dp[k];
        }
        double chosen[MODEL_MAX_TOPK];
        for (int k = 0; k < K; k++) chosen[k] = p[sel[k]] * (dp[k] - q);
        for (int i = 0; i < E; i++) p[i] = (float)(-(double)p[i] * q);
        for (int k = 0; k < K; k++) p[sel[k]] = (float)chosen[k];
    }
}

void cpu_moe_backward(cpu_ctx *c, int l, long T)
{
    const model_config *mc = &c->m->cfg;
    const cpu_layer_weights *w = &c->m->layers[l];
    int H = mc->hidden_size, E = mc->num_experts;
    moe_job j = {.c = c, .w = w, .dx = c->dx, .out = c->dxn, .l = l, .backward = true};
    cpu_pool_for(c->pool, T, 16, moe_dweights_rows, &j);
    moe_experts(&j);
    cpu_pool_for(c->pool, T, 16, moe_dinput_rows, &j);
    cpu_sgemm(c->pool, false, false, (int)T, H, E, 1.0f, c->r_prob, E, w->router, H, 1.0f, c->dxn, H);
}
