/* cuda_moe.c — the sparse MoE block of a Qwen3-MoE layer on the GPU, step for step the CPU
 * backend's cpu_moe.c (its header has the math) with the kernel layer's dtypes:
 *
 *   p = softmax(xn2 Wrᵀ), the K most likely      lcu_gemm, lcu_moe_route   (fp32, double)
 *   group the T·K assignments by expert           be_moe_group on the host (as the CPU)
 *   x_e = the rows of expert e                   lcu_moe_gather            (bf16)
 *   g, u = x_e W{g,u}ᵀ + LoRA                    lcu_grouped_gemm + lcu_lora_fwd (fp32)
 *   h = silu(g)·u → bf16,  y = h W_dᵀ + LoRA     (fp32)
 *   x' = xmid + Σ_k w_k y_k                      lcu_moe_combine
 *
 * The experts' products are one grouped GEMM per projection (an item per expert with rows),
 * their LoRA one segmented product per projection over every (expert, segment) run of rows
 * (lcu_lora_fwd / lcu_lora_bwd take runs that are sorted and disjoint, which grouped rows
 * are). The grouping is computed on the host from the router's choices, brought back once
 * per layer and pass: the host needs each expert's row count to size the products anyway,
 * and the CPU backend's grouping (be_moe_group) then gives the same rows on both.
 */
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_adapter.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/cuda_check.h"

#include <string.h>

/* The router's choices to the host, grouped there, the grouping back to the device; with
 * count, the routing added into the pass's sequences' expert_counts_out. */
static int cm_group(cu_ctx *c, int l, long T, bool count)
{
    const model_config *mc = &c->cfg;
    int E = mc->num_experts, K = mc->num_experts_per_tok;
    size_t A = (size_t)T * K;
    CU_TRY(c, cudaMemcpyAsync(c->h_sel, c->a.r_sel, A * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream));
    if (cu_sync(c) < 0) return -1;
    be_moe_group(c->h_sel, T, K, E, c->h_off, c->h_off + E + 1, c->h_apos, c->h_atok);
    /* from pageable memory: staged before the call returns, so the arrays may change after */
    CU_TRY(c, cudaMemcpyAsync(c->a.a_pos, c->h_apos, A * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream));
    CU_TRY(c, cudaMemcpyAsync(c->a.a_tok, c->h_atok, A * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream));
    if (!count) return 0;
    const int32_t *row_seq = cu_meta_host(c, c->ml.row_seq);
    int li = model_moe_index(mc, l);
    for (long t = 0; t < T; t++) {
        int32_t *cnt = c->route_seqs[c->seq_index[row_seq[t]]].expert_counts_out;
        if (!cnt) continue;
        for (int k = 0; k < K; k++) cnt[(size_t)li * E + c->h_sel[t * K + k]]++;
    }
    return 0;
}

/* c->esegs = every (expert, segment) run of grouped rows whose adapter trains module mod of
 * layer l (grad_only: and carries a gradient), expert by expert: sorted and disjoint.
 * Returns how many. */
static int cm_esegs(cu_ctx *c, int l, lora_module mod, bool grad_only)
{
    int n = 0, E = c->cfg.num_experts;
    for (int e = 0; e < E; e++) {
        int r0 = c->h_off[e], r1 = c->h_off[e + 1];
        if (r0 == r1) continue;
        for (int s = 0; s < c->nsegs; s++) {
            const cu_segment *sg = &c->segs[s];
            const cu_lora_pair *p = cu_adapter_expert(sg->ad, l, e, mod);
            if (!p || (grad_only && !sg->grad)) continue;
            int a = be_moe_lower(c->h_atok, r0, r1, sg->row_begin), b = be_moe_lower(c->h_atok, a, r1, sg->row_end);
            if (a < b) c->esegs[n++] = (lcu_lora_seg){a, b, p->rank, sg->ad->scale, p->A, p->B, p->gA, p->gB};
        }
    }
    return n;
}

/* One grouped GEMM over the experts with rows: C_e = op(X_e)·op(W_e) (+ C_e), X_e the rows of
 * expert e in x (row stride ldx), W_e its projection proj ([out, in] as stored; tb: the
 * forward's x Wᵀ, else the backward's dy W), C_e its rows of out (stride ldc). */
static int cm_experts(cu_ctx *c, const cu_layer_w *w, int proj, bool tb, const lcu_bf16 *x, long ldx, float *out,
                      long ldc, int N, int K, bool acc)
{
    int n = 0, E = c->cfg.num_experts;
    for (int e = 0; e < E; e++) {
        long r0 = c->h_off[e], rows = c->h_off[e + 1] - r0;
        if (!rows) continue;
        c->gitems[n++] = (lcu_group_item){x + r0 * ldx, ldx, cu_expert_w(w, &c->cfg, e, proj), tb ? K : N,
                                          out + r0 * ldc, ldc, rows, N, K, 1.0f};
    }
    CU_TRY(c, lcu_grouped_gemm(c->gitems, n, false, tb, LCU_F32, acc, c->stream));
    return 0;
}

int cu_moe_forward(cu_ctx *c, int l, long T, const float *resid, float *x_out, bool recompute)
{
    const model_config *mc = &c->cfg;
    const cu_layer_w *w = &c->w.layers[l];
    cu_act *a = &c->a;
    int H = mc->hidden_size, E = mc->num_experts, K = mc->num_experts_per_tok, Im = mc->moe_intermediate_size;
    long A = T * K;
    cudaStream_t s = c->stream;
    cu_where(c, "layer %d experts %s", l, recompute ? "recompute" : "forward");
    lcu_gemm_args g = {false, true, (int)T, E, H, 1.0f, 0.0f, a->xn2, H, w->router, H, NULL, 0, a->r_prob, E, LCU_F32};
    CU_TRY(c, lcu_gemm(c->lcu, &g, s));
    CU_TRY(c, lcu_moe_route(a->r_prob, T, E, K, mc->norm_topk_prob, a->r_sel, a->r_w, s));
    if (cm_group(c, l, T, !recompute && c->route_seqs) < 0) return -1;
    CU_TRY(c, lcu_moe_gather(a->ex, a->xn2, a->a_tok, A, H, s));
    if (cm_experts(c, w, 0, true, a->ex, H, a->eg, Im, Im, H, false) < 0 ||
        cm_experts(c, w, 1, true, a->ex, H, a->eu, Im, Im, H, false) < 0)
        return -1;
    int n = cm_esegs(c, l, LORA_GATE, false);
    if (n) CU_TRY(c, lcu_lora_fwd(c->lcu, c->esegs, n, H, Im, a->ex, H, a->eg, Im, a->ez, CU_LDZ, s));
    if ((n = cm_esegs(c, l, LORA_UP, false)))
        CU_TRY(c, lcu_lora_fwd(c->lcu, c->esegs, n, H, Im, a->ex, H, a->eu, Im, a->ez, CU_LDZ, s));
    CU_TRY(c, lcu_swiglu_fwd(a->eh, LCU_BF16, a->eg, a->eu, A * Im, s));
    if (cm_experts(c, w, 2, true, a->eh, Im, a->ey, H, H, Im, false) < 0) return -1;
    if ((n = cm_esegs(c, l, LORA_DOWN, false)))
        CU_TRY(c, lcu_lora_fwd(c->lcu, c->esegs, n, Im, H, a->eh, Im, a->ey, H, a->ez, CU_LDZ, s));
    if (recompute) return 0; /* the backward needs the experts' outputs, not their sum */
    CU_TRY(c, lcu_moe_combine(x_out, resid, a->ey, a->a_pos, a->r_w, T, K, H, s));
    return 0;
}

int cu_moe_backward(cu_ctx *c, int l, long T)
{
    const model_config *mc = &c->cfg;
    const cu_layer_w *w = &c->w.layers[l];
    cu_act *a = &c->a;
    int H = mc->hidden_size, E = mc->num_experts, K = mc->num_experts_per_tok, Im = mc->moe_intermediate_size;
    long A = T * K;
    cudaStream_t s = c->stream;
    cu_where(c, "layer %d experts backward", l);
    CU_TRY(c, lcu_moe_dweights(a->r_dw, a->edy, a->dx, a->ey, a->a_pos, a->r_w, T, K, H, s));
    /* dh = dy W_d + LoRA; dg, du from the SwiGLU; dx = dg W_g + du W_u + LoRA */
    if (cm_experts(c, w, 2, false, a->edy, H, a->edh, Im, Im, H, false) < 0) return -1;
    int n = cm_esegs(c, l, LORA_DOWN, true);
    if (n)
        CU_TRY(c, lcu_lora_bwd(c->lcu, c->esegs, n, Im, H, a->eh, Im, a->edy, H, a->edh, Im, a->ez, a->edz, CU_LDZ, s));
    CU_TRY(c, lcu_swiglu_bwd(a->edg, a->edu, LCU_BF16, a->edh, a->eg, a->eu, A * Im, s));
    if (cm_experts(c, w, 0, false, a->edg, Im, a->edx, H, H, Im, false) < 0 ||
        cm_experts(c, w, 1, false, a->edu, Im, a->edx, H, H, Im, true) < 0)
        return -1;
    if ((n = cm_esegs(c, l, LORA_GATE, true)))
        CU_TRY(c, lcu_lora_bwd(c->lcu, c->esegs, n, H, Im, a->ex, H, a->edg, Im, a->edx, H, a->ez, a->edz, CU_LDZ, s));
    if ((n = cm_esegs(c, l, LORA_UP, true)))
        CU_TRY(c, lcu_lora_bwd(c->lcu, c->esegs, n, H, Im, a->ex, H, a->edu, Im, a->edx, H, a->ez, a->edz, CU_LDZ, s));
    /* dxn = Σ_k dL/dx_k, plus the router's share: dlogits Wr (the router is frozen) */
    CU_TRY(c, lcu_moe_dinput(a->dxn, a->r_dlogits, a->edx, a->a_pos, a->r_prob, a->r_sel, a->r_w, a->r_dw, T, K, E, H,
                             mc->norm_topk_prob, s));
    lcu_gemm_args g = {false, false, (int)T, H, E, 1.0f, 1.0f, a->r_dlogits, E, w->router, H, NULL, 0, a->dxn, H,
                       LCU_F32};
    CU_TRY(c, lcu_gemm(c->lcu, &g, s));
    return 0;
}
