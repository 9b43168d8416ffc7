/* cuda_layer.h — one decoder layer over the packed rows, forward and backward, with each
 * segment's LoRA (cuda_layer.c). */
#ifndef LOOM_BACKEND_CUDA_LAYER_H
#define LOOM_BACKEND_CUDA_LAYER_H

#include "backend/cuda/cuda_ctx.h"

/* Layer l over T rows: x_out = layer(x_in) (x_out may be x_in). recompute: stop once the
 * backward's inputs are in place (x_out unused). In sampling passes (c->kv_mode) K/V go
 * to and come from the KV caches. Positions: c->d_pos. 0 or -1 (recorded in c). */
int cu_layer_forward(cu_ctx *c, int l, long T, const float *x_in, float *x_out, bool recompute);
/* c->a.dx = dL/d(layer input) from dL/d(layer output) (need_dx false: skipped), adding the
 * LoRA gradients of the segments that carry one; the layer's forward intermediates must be
 * in place (cu_layer_forward with recompute, from the same x_in). */
int cu_layer_backward(cu_ctx *c, int l, long T, const float *x_in, bool need_dx);

/* Attention. LCU_ATTN=cudnn at context creation: c->dnn = cuDNN's fused attention (one line
 * on stderr either way: which cuDNN, or why none and the own kernels run). */
void cu_attn_choose(cu_ctx *c);
/* The longest of nseq sequences of a host q_start [nseq + 1] (c->attn_max_len). */
int cu_attn_max_len(const int32_t *q_start, int nseq);

/* c->lsegs = the kernel layer's segments for module mod of layer l (l < 0: the output
 * head), from the segments meeting rows [r0, r1), clipped to them and counted from r0;
 * grad_only: only segments that carry a gradient. Returns how many. */
int cu_lora_segs(cu_ctx *c, int l, lora_module mod, long r0, long r1, bool grad_only);
/* The same into set `set` of c->lsegs (0 .. CU_LSEG_SETS − 1): c->lsegs + set·cap_segs. */
int cu_lora_segs_set(cu_ctx *c, int set, int l, lora_module mod, long r0, long r1, bool grad_only);

#endif
