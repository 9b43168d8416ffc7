/* cpu_moe.h — a sparse mixture-of-experts layer's MLP (Qwen3-MoE) over the packed rows,
 * forward and backward, with each segment's LoRA on every expert's gate, up and down
 * (cpu_moe.c). cpu_layer.c calls it in place of the dense MLP. */
#ifndef LOOM_BACKEND_CPU_MOE_H
#define LOOM_BACKEND_CPU_MOE_H

#include "backend/cpu/cpu_ctx.h"

/* The sparse layers' buffers for cap_T rows and LoRA rank cap_rank (cpu_reserve). 0 or -1. */
int cpu_moe_reserve(cpu_ctx *c, long cap_T, int cap_rank);
void cpu_moe_free(cpu_ctx *c);

/* c->tmp = the MoE block of sparse layer l applied to c->xn2 over T rows (recompute: stop
 * once the backward's inputs are in place: routing, gathered rows, the experts' g, u, h
 * and outputs). Counts the routing into c->route_seqs' expert_counts_out when set. */
void cpu_moe_forward(cpu_ctx *c, int l, long T, bool recompute);
/* c->dxn = dL/dxn2 from c->dx = dL/d(block output), the recomputed forward in place;
 * adds the experts' LoRA gradients of the segments that carry one. The router is frozen:
 * its part of dL/dxn2 flows through the routing weights only. */
void cpu_moe_backward(cpu_ctx *c, int l, long T);

#endif
