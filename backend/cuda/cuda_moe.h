/* cuda_moe.h — a sparse mixture-of-experts layer's MLP (Qwen3-MoE) over the packed rows,
 * forward and backward, with each segment's LoRA on every expert's gate, up and down
 * (cuda_moe.c, the twin of backend/cpu/cpu_moe.c). cuda_layer.c calls it in place of the
 * dense MLP. */
#ifndef LOOM_BACKEND_CUDA_MOE_H
#define LOOM_BACKEND_CUDA_MOE_H

#include "backend/cuda/cuda_ctx.h"

/* x_out = resid + the MoE block of sparse layer l applied to c->a.xn2 over T rows
 * (recompute: stop once the backward's inputs are in place; x_out unused). Adds the
 * routing into c->route_seqs' expert_counts_out when set. 0 or -1 (recorded in c). */
int cu_moe_forward(cu_ctx *c, int l, long T, const float *resid, float *x_out, bool recompute);
/* c->a.dxn = dL/dxn2 from c->a.dx = dL/d(block output), the recomputed forward in place;
 * adds the experts' LoRA gradients of the segments that carry one. 0 or -1. */
int cu_moe_backward(cu_ctx *c, int l, long T);

#endif
