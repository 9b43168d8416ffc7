/* cuda_head.h — the output head and the losses (cuda_head.c). */
#ifndef LOOM_BACKEND_CUDA_HEAD_H
#define LOOM_BACKEND_CUDA_HEAD_H

#include "backend/cuda/cuda_ctx.h"

/* Rows per head chunk for a vocabulary of V (logits fp32 + dlogits bf16 within
 * LOOM_CUDA_HEAD_MB, default 512 MiB). */
int cu_head_rows(long V);

/* c->logits[0..n) = the output head (base weights + each segment's head LoRA) of rows
 * c0..c0+n of xf (bf16 [*, H]); shared by training and sampling. */
int cu_head_logits(cu_ctx *c, const lcu_bf16 *xf, long c0, int n);

/* The head over all T rows of xf (bf16 [T, H]) in chunks: log-probs, losses and (topk)
 * top-k into c->meta's outputs; with any_grad, adds the head-LoRA gradients and, when dxf
 * is not NULL, writes dL/dxf (fp32 [T, H]) there. extras: the packed sequences when some
 * ask for sampling's prompt-pass extras (be_seq score_* / draw_*), written straight into
 * their output arrays; NULL when none do. 0 or -1 (recorded in c). */
int cu_head(cu_ctx *c, long T, const lcu_bf16 *xf, bool any_grad, bool topk, const be_seq *extras, float *dxf);

#endif
