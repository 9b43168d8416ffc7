/* cpu_head.h — the output head and the losses (cpu_head.c). */
#ifndef LOOM_BACKEND_CPU_HEAD_H
#define LOOM_BACKEND_CPU_HEAD_H

#include "backend/cpu/cpu_ctx.h"

/* c->logits[0..n) = output head (+ head LoRA per segment) of rows c0..c0+n of xf. */
void cpu_head_logits_chunk(cpu_ctx *c, const float *xf, long c0, int n);
/* Runs the head over all T rows of xf [T, H] in chunks: log-probs, losses and top-k into
 * the sequences' outputs; with any_grad, adds the head-LoRA gradients and (dxf not NULL)
 * writes dL/dxf into dxf. */
void cpu_head(cpu_ctx *c, be_seq *seqs, long T, const float *xf, bool any_grad, float *dxf);

#endif
