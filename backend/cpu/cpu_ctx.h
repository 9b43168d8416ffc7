/* cpu_ctx.h — the CPU backend's context (one per device and model): its weights, thread
 * pool and buffers. The files that work on it, from the bottom up (each includes only
 * headers below it): cpu_buffers (buffers, packing), cpu_kv (KV caches), cpu_layer
 * (decoder layer forward/backward, LoRA), cpu_moe (a sparse layer's router and experts,
 * called by cpu_layer), cpu_head (output head, losses), cpu_sample (KV-cache sampling),
 * cpu_backend (the table's entry points).
 *
 * Activation memory: a pass over T packed tokens keeps one layer's intermediates
 * ([T, dim] buffers below), plus, when gradients are wanted, each layer's input x_l
 * ([L, T, H] in `saved`). The backward recomputes a layer's forward from x_l just before
 * differentiating it, trading one extra forward for L-fold less memory.
 */
#ifndef LOOM_BACKEND_CPU_CTX_H
#define LOOM_BACKEND_CPU_CTX_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_adapter.h"
#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_pool.h"
#include "backend/cpu/cpu_weights.h"

/* A run of consecutive sequences sharing one adapter and one group (operation): the LoRA
 * GEMMs are done per segment, so a segment's gradient is one reduction over its rows. */
typedef struct {
    const cpu_adapter *ad;
    int row_begin, row_end;
    bool grad; /* its rows carry a loss gradient (backward pass, not forward_only) */
    int group;
} cpu_segment;

typedef struct {
    cpu_weights *m;                 /* owned */
    int device;
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
    /* sparse layers (cpu_moe.c), allocated only for a MoE model. K = num_experts_per_tok;
     * a token's K (token, expert) assignments are grouped expert by expert, tokens in row
     * order within an expert, so that each expert's rows are one contiguous block. */
    float *r_prob;                               /* [T, E] router probabilities */
    int32_t *r_sel;                              /* [T, K] chosen experts, most likely first */
    float *r_w, *r_dw;                           /* [T, K] their weights; dL/dweights */
    int *e_off;                                  /* [E + 1] each expert's first grouped row */
    int32_t *a_pos;                              /* [T, K] grouped row of each assignment */
    int32_t *a_tok;                              /* [T·K] token row of each grouped row */
    float *ex, *ey;                              /* [T·K, H] gathered inputs; expert outputs
                                                    (in the backward: dL/dy, then dL/dx) */
    float *eg, *eu, *eh, *edh;                   /* [T·K, Im] */
    float *ez, *edz;                             /* [T·K, cap_rank] LoRA intermediates */
    be_seq *route_seqs;                          /* the pass's sequences, whose
                                                    expert_counts_out the forward fills
                                                    (NULL: sampling, recompute) */
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

#endif
