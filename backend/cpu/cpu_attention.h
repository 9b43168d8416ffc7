/* cpu_attention.h — causal GQA attention over a packed batch (each sequence attends only
 * within itself), forward and backward, without a T×T matrix: work is done per
 * (sequence, head, block of CPU_ATTN_BLOCK query rows), and the backward recomputes the
 * probabilities from the saved log-sum-exp (flash-attention style).
 * defines: cpu_attn_shape, cpu_attention_fwd, cpu_attention_bwd */
#ifndef LOOM_BACKEND_CPU_ATTENTION_H
#define LOOM_BACKEND_CPU_ATTENTION_H

#include "backend/cpu/cpu_pool.h"

#define CPU_ATTN_BLOCK 64

typedef struct {
    int nseq;
    const int *seq_start; /* [nseq + 1] row offsets in the packed batch */
    const int *blk_start; /* [nseq + 1] cumulative counts of CPU_ATTN_BLOCK-row blocks */
    int nq, nkv, d;       /* query heads, kv heads, head dim */
    float scale;          /* 1/sqrt(d) */
} cpu_attn_shape;

/* Fills blk_start[0..nseq] from seq_start (the caller owns both arrays). */
void cpu_attention_blocks(int nseq, const int *seq_start, int *blk_start);

/* Floats of scratch each thread needs for sequences up to max_len tokens. */
long cpu_attention_scratch(int max_len);

/* q [T, nq·d], k/v [T, nkv·d] (RoPE applied) → out [T, nq·d], lse [T, nq]. scratch holds
 * cpu_pool_size(p) · cpu_attention_scratch(max_len) floats. */
void cpu_attention_fwd(cpu_pool *p, const cpu_attn_shape *s, const float *q, const float *k, const float *v,
                       float *out, float *lse, float *scratch, long scratch_per_thread);

/* Gradients with respect to q, k, v (all overwritten) from dout, given the forward's
 * out and lse. */
void cpu_attention_bwd(cpu_pool *p, const cpu_attn_shape *s, const float *q, const float *k, const float *v,
                       const float *out, const float *lse, const float *dout, float *dq, float *dk, float *dv,
                       float *scratch, long scratch_per_thread);

#endif
