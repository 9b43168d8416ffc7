/* cpu_buffers.h — buffers and packing of the CPU context (cpu_buffers.c). */
#ifndef LOOM_BACKEND_CPU_BUFFERS_H
#define LOOM_BACKEND_CPU_BUFFERS_H

#include "backend/cpu/cpu_ctx.h"

/* *pp = a new 64-byte aligned block of bytes (the old one freed). 0, or -1 and *pp NULL. */
int cpu_alloc(void *pp, size_t bytes);
/* Makes every buffer large enough for T rows, sequences up to max_len, LoRA rank up to
 * max_rank, and (need_saved) the per-layer inputs. 0 or -1 (out of memory). */
int cpu_reserve(cpu_ctx *c, long T, int max_len, int max_rank, bool need_saved);
/* seq_start, blk_start, seq_index, segs for nseq sequences. */
int cpu_reserve_seqs(cpu_ctx *c, int nseq);
/* Packs the non-empty sequences into rows and builds the LoRA segments. */
int cpu_pack(cpu_ctx *c, const be_seq *seqs, int nseq, bool any_grad);
void cpu_buffers_free(cpu_ctx *c);

#endif
