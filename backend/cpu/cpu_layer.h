/* cpu_layer.h — one decoder layer over the packed rows, forward and backward, with each
 * segment's LoRA (cpu_layer.c). */
#ifndef LOOM_BACKEND_CPU_LAYER_H
#define LOOM_BACKEND_CPU_LAYER_H

#include "backend/cpu/cpu_ctx.h"

/* c->x = layer l of c->x over T rows; recompute: stop once the backward's inputs are in
 * place. In sampling passes (c->kv_mode) K/V go to and come from the KV caches. */
void cpu_layer_forward(cpu_ctx *c, int l, long T, bool recompute);
/* c->dx = dL/d(layer input) from dL/d(layer output) (need_dx false: skip it), adding the
 * LoRA gradients of the segments that carry one. */
void cpu_layer_backward(cpu_ctx *c, int l, long T, bool need_dx);
/* y[rows, out] += scale·(x Aᵀ) Bᵀ for rows of one segment. */
void cpu_lora_fwd_rows(cpu_ctx *c, const lora_pair *p, float scale, const float *x, float *y, int rows);
/* Gradients of one segment: gA, gB accumulate; dx += ... when dx is not NULL. */
void cpu_lora_bwd_rows(cpu_ctx *c, const lora_pair *p, float scale, const float *x, const float *dy, float *dx,
                       int rows);

/* The same on pool (NULL: this thread) with z, dz as rows × rank scratch: for callers
 * that run products side by side (cpu_moe.c: one task per expert). */
void cpu_lora_fwd_on(cpu_pool *pool, float *z, const lora_pair *p, float scale, const float *x, float *y, int rows);
void cpu_lora_bwd_on(cpu_pool *pool, float *z, float *dz, const lora_pair *p, float scale, const float *x,
                     const float *dy, float *dx, int rows);

#endif
