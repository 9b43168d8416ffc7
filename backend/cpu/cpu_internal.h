/* cpu_internal.h — the CPU backend's context, shared by cpu_backend.c (entry points,
 * buffers, loss head, optimizer), cpu_layer.c (decoder layer forward/backward, LoRA) and
 * cpu_sample.c (KV-cache sampling, which reuses the layer forward).
 *
 * Activation memory: a pass over T packed tokens keeps one layer's intermediates
 * ([T, dim] buffers below), plus, when gradients are wanted, each layer's input x_l
 * ([L, T, H] in `saved`). The backward recomputes a layer's forward from x_l just before
 * differentiating it, trading one extra forward for L-fold less memory.
 */
#ifndef LOOM_BACKEND_CPU_INTERNAL_H
#define LOOM_BACKEND_CPU_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_pool.h"

/* A run of consecutive sequences sharing one adapter: the LoRA GEMMs are done per segment. */
typedef struct {
    adapter *ad;
    int row_begin, row_end;
    bool grad; /* its rows carry a loss gradient (backward pass, not forward_only) */
} cpu_segment;

typedef struct {
    const base_model *m;
    cpu_pool *pool;

    long cap_T;       /* rows the [T, ·] buffers hold */
    int cap_len;      /* longest sequence the attention scratch and RoPE table hold */
    int cap_rank;     /* largest LoRA rank the z/dz buffers hold */
    bool cap_saved;   /* `saved` allocated for cap_T */

    float *rope_cos, *rope_sin; /* [cap_len, d/2] */

    /* forward intermediates, [T, ·] */
    float *x, *xn1, *xn2, *xmid, *tmp;          /* H */
    float *q_pre, *q, *att, *datt, *dq;          /* nq·d */
    float *k_pre, *k, *v, *dk, *dv;              /* nkv·d */
    float *g, *u, *h, *dg, *du, *dh;             /* I */
    float *dx, *dxn;                             /* H */
    float *rstd1, *rstd2, *rstd_f;               /* [T] */
    float *rstd_q, *rstd_k, *lse;                /* [T, nq], [T, nkv], [T, nq] */
    float *saved;                                /* [L, T, H] layer inputs */
    float *z, *dz;                               /* [T, cap_rank] LoRA intermediates */
    float *attn_scratch;                         /* per thread */
    long attn_per_thread;
    float *logits;                               /* [head_rows, V] */
    int head_rows;

    /* per call */
    int32_t *tokens, *pos;           /* [T] */
    int *row_seq;                    /* [T] → index into seqs */
    int *seq_start;                  /* [nseq + 1] over the packed (non-empty) sequences */
    int *blk_start;                  /* [nseq + 1] attention blocks, see cpu_attention_blocks */
    int *seq_index;                  /* packed index → caller's index */
    cpu_segment *segs;
    int nsegs, nseq_packed, cap_seqs;

    /* sampling (cpu_sample.c): a KV cache per stream, [2][L][kv_cap][nkv·d] floats each.
     * Rows of a pass map to streams through row_seq: row t writes its K/V into streams
     * kv_stream0[row_seq[t]] .. + kv_nstream[row_seq[t]] at position pos[t]. */
    int kv_mode;                     /* CPU_KV_NONE / PREFILL / DECODE */
    float *kv_mem;
    size_t kv_mem_floats;
    int kv_cap;
    int *kv_stream0, *kv_nstream;
    int cap_kv_map;
    void *sample_scratch;            /* per thread: V floats + V uint64 (top-k / top-p) */
} cpu_ctx;

enum { CPU_KV_NONE, CPU_KV_PREFILL, CPU_KV_DECODE };

/* cpu_backend.c */
int cpu_reserve(cpu_ctx *c, long T, int max_len, int max_rank, bool need_saved);
int cpu_pack(cpu_ctx *c, const exe_seq *seqs, int nseq, bool any_grad);
int cpu_reserve_seqs(cpu_ctx *c, int nseq); /* seq_start, blk_start, seq_index, segs for nseq */

/* cpu_sample.c: the KV-cache side of cpu_layer_forward in sampling passes. */
void cpu_kv_store(cpu_ctx *c, int l, long T);
void cpu_kv_attention(cpu_ctx *c, int l, long T);

/* cpu_layer.c */
void cpu_layer_forward(cpu_ctx *c, int l, long T, bool recompute);
void cpu_layer_backward(cpu_ctx *c, int l, long T, bool need_dx);
/* y[rows, out] += scale·(x Aᵀ) Bᵀ for rows of one segment. */
void cpu_lora_fwd_rows(cpu_ctx *c, const lora_pair *p, float scale, const float *x, float *y, int rows);
/* Gradients of one segment: gA, gB accumulate; dx += ... when dx is not NULL. */
void cpu_lora_bwd_rows(cpu_ctx *c, const lora_pair *p, float scale, const float *x, const float *dy, float *dx,
                       int rows);

/* c->logits[0..n) = output head (+ head LoRA per segment) of rows c0..c0+n of xf. */
void cpu_head_logits_chunk(cpu_ctx *c, const float *xf, long c0, int n);

#endif
