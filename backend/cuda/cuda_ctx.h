/* cuda_ctx.h — the CUDA backend's context (one per device and model) and what its files
 * share. The files, from the bottom up (each includes only headers below it):
 * cuda_check (errors, LOOM_CUDA_SYNC), cuda_prof (the decode profile's per-operation
 * marks), cuda_weights (bf16 base weights, one allocation),
 * cuda_adapter (adapters in device memory), cuda_buffers (workspace, packing), cuda_layer
 * (decoder layer forward/backward with segmented LoRA, KV caches of sampling), cuda_head
 * (output head, losses, top-k), cuda_sample (sampling), cuda_backend (the table).
 *
 * Numbers: base weights bf16; the residual stream, GEMM outputs, norms' statistics,
 * logits and all accumulators fp32; GEMM inputs bf16 (the kernel layer's convention,
 * cuda_ops.h). LoRA masters, gradients and AdamW moments fp32 on the device, with a bf16
 * copy of A and B for the GEMMs refreshed whenever the masters change.
 *
 * Memory: nothing is allocated per step. The workspace (cuda_buffers.c) holds one layer's
 * intermediates for the largest batch seen so far, plus each layer's input when
 * gradients flow ([L, T, H] fp32, as the CPU backend: the backward recomputes a layer's
 * forward from its input); it grows (by 1.5×) only when a larger batch arrives.
 */
#ifndef LOOM_BACKEND_CUDA_CTX_H
#define LOOM_BACKEND_CUDA_CTX_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"

/* ---- base weights (cuda_weights.c) -------------------------------------------------------- */

/* One decoder layer, bf16, HF nn.Linear layout [out, in]; NULL where the architecture has
 * no such tensor (biases, q/k norm). */
typedef struct {
    lcu_bf16 *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo, *q_norm, *k_norm, *mlp_norm, *wgate, *wup, *wdown;
    /* a sparse layer (model_layer_moe): the router [E, H], then expert by expert its gate
     * [Im, H], up [Im, H] and down [H, Im] in one block (cu_expert_w); NULL in a dense layer */
    lcu_bf16 *router, *experts;
} cu_layer_w;

/* Expert e's projection (0 gate, 1 up, 2 down) in a sparse layer's weights. */
static inline const lcu_bf16 *cu_expert_w(const cu_layer_w *w, const model_config *c, int e, int proj)
{
    size_t m = (size_t)c->moe_intermediate_size * c->hidden_size;
    return w->experts + (size_t)e * 3 * m + (size_t)proj * m;
}

typedef struct {
    lcu_bf16 *embed, *final_norm, *lm_head; /* lm_head == embed when tied */
    cu_layer_w *layers;                     /* [L], host array of device pointers */
    void *mem;                              /* the one device allocation */
    size_t bytes;
} cu_weights;

/* ---- adapters (cuda_adapter.c) ------------------------------------------------------------ */

/* One adapted linear: device pointers, all NULL when the module is not trained. */
typedef struct {
    int in, out, rank;
    const lcu_bf16 *A, *B; /* [r, in], [out, r]: the bf16 copies the GEMMs read */
    float *gA, *gB;        /* fp32 gradient accumulators; NULL unless trainable */
} cu_lora_pair;

/* An adapter: ONE device allocation holding, in this order, params, grads, m, v (fp32,
 * num_params each; grads, m, v only when trainable) and the bf16 copy of params. Every
 * part keeps the layout's tensor order (model/lora.h), so a transfer is one copy. */
typedef struct {
    be_adapter pub;
    float scale;                   /* LORA_ALPHA / rank */
    float *params, *grads, *m, *v;
    lcu_bf16 *params_bf16;
    void *mem;
    cu_lora_pair *mods;            /* [L * LORA_NUM_MODULES], host */
    cu_lora_pair *experts;         /* [L * num_experts * 3] each expert's gate, up, down in a
                                      sparse layer, host (NULL for a dense model) */
    cu_lora_pair head;
} cu_adapter;

static inline cu_adapter *cu_adapter_of(be_adapter *a) { return (cu_adapter *)a; }

/* A run of consecutive packed rows sharing one adapter and one group (operation, see
 * be_seq.group): the LoRA products are per run. */
typedef struct {
    const cu_adapter *ad;
    long row_begin, row_end;
    bool grad; /* its rows carry a loss gradient */
    int group;
} cu_segment;

/* ---- workspace (cuda_buffers.c) ------------------------------------------------------------ */

/* A device buffer with an optional host mirror of the same size, grown, never shrunk. The
 * mirror is page-locked (cudaMallocHost) when the system allows, so that an upload from it
 * is a plain DMA queued on the stream: the host goes on queueing the pass's kernels
 * instead of waiting while the driver stages pageable memory (which may also wait for the
 * stream's earlier work). The price: the host must not rewrite the mirror while an upload
 * from it may still be in flight; every table call starts on an idle stream (cu_begin),
 * and within a call each mirror region is rewritten only after a stream sync. */
typedef struct {
    void *dev, *host;
    size_t cap;
    bool pinned;                    /* host came from cudaMallocHost (else malloc) */
} cu_buf;

/* One layer's intermediates over T rows (one device allocation, cu_act_reserve). */
typedef struct {
    float *x, *xmid, *dx, *dxn, *dxf;           /* [T, H] fp32 */
    lcu_bf16 *xn1, *xn2, *dyb;                  /* [T, H] bf16 (xn2 also the final norm's output) */
    float *q_pre, *qf, *datt, *dq;              /* [T, nq·d] fp32 */
    lcu_bf16 *q, *att, *dattb, *dqb;            /* [T, nq·d] bf16 */
    float *k_pre, *kf, *vf, *dk, *dv;           /* [T, nkv·d] fp32 */
    lcu_bf16 *k, *v, *dkb, *dvb;                /* [T, nkv·d] bf16 */
    float *g, *u, *dh;                          /* [T, I] fp32 */
    lcu_bf16 *h, *dg, *du;                      /* [T, I] bf16 */
    float *rstd1, *rstd2, *rstd_f;              /* [T] */
    float *rstd_q, *rstd_k, *lse;               /* [T, nq], [T, nkv], [T, nq] */
    lcu_bf16 *z, *dz;                           /* [T, CU_LDZ] LoRA intermediates */
    /* sparse layers (cuda_moe.c), MoE models only; K = num_experts_per_tok, the K·T
     * assignments grouped expert by expert as on the CPU (cpu_ctx.h) */
    float *r_prob;                              /* [T, E] router logits, then probabilities */
    lcu_bf16 *r_dlogits;                        /* [T, E] their gradient (bf16: a GEMM input) */
    int32_t *r_sel, *a_pos, *a_tok;             /* [T, K] chosen experts; grouped row of each
                                                   assignment; [T·K] token of each grouped row */
    float *r_w, *r_dw;                          /* [T, K] routing weights, dL/dweights */
    lcu_bf16 *ex, *edy;                         /* [T·K, H] gathered inputs; the experts' dL/dy */
    float *ey, *edx;                            /* [T·K, H] the experts' outputs; dL/dx */
    float *eg, *eu, *edh;                       /* [T·K, Im] */
    lcu_bf16 *eh, *edg, *edu;                   /* [T·K, Im] */
    lcu_bf16 *ez, *edz;                         /* [T·K, CU_LDZ] the experts' LoRA intermediates */
    void *attn_ws;                              /* lcu_attn_workspace_bytes for cap rows, cap seqs */
    float *saved;                               /* [L, T, H] layer inputs (when cap_saved) */
} cu_act;

/* Kept activations (unless LCU_KEEP_ACT=0; cu_keep_reserve in cuda_buffers.c): what each dense
 * layer's backward reads, kept from the forward in a slot per layer, so that the backward
 * recomputes nothing. The forward writes them through c->a's pointers, which cu_keep_bind
 * points at layer l's slot (and cu_keep_unbind back at the shared buffers); the values are
 * those the recompute would produce, bit for bit (the same kernels on the same inputs).
 * q_pre/k_pre only with q/k-norm (their backward reads them); else NULL in the slots. */
#define CU_KEPT_FIELDS(X) \
    X(xn1) X(rstd1) X(q_pre) X(k_pre) X(rstd_q) X(rstd_k) X(q) X(k) X(v) X(att) X(lse) X(xmid) X(rstd2) X(xn2) \
    X(g) X(u) X(h)
typedef struct {
    bool wanted;                    /* not LCU_KEEP_ACT=0 at context creation */
    size_t cap_bytes;               /* LCU_KEEP_MB: at most this much (0: what the device has free,
                                       less a reserve) */
    int cap_layers;                 /* LCU_KEEP_LAYERS: at most this many layers (0: all) */
    void *mem;
    long cap_T;                     /* rows each slot holds (0: no slots) */
    int nkept;                      /* layers 0 .. nkept-1 have slots (all, or what the memory
                                       holds); the others recompute in the backward */
    cu_act *slot;                   /* [num_hidden_layers], only CU_KEPT_FIELDS set (the first
                                       nkept) */
    cu_act scratch;                 /* c->a as the workspace carved it, while a slot is bound */
    bool bound;
    long refused_T;                 /* the smallest batch found not to fit (0: none): larger
                                       ones recompute without asking again */
} cu_keep;

/* The per-call rows of a packed batch, as offsets into one host/device buffer (cu_meta):
 * the inputs [0, in_end) go up in one copy, the outputs [in_end, out_end) come down in one. */
typedef struct {
    size_t tokens, pos, row_seq, q_start, tgt_start, topk_start, targets, weights, sampler_lp, adv, loss_seqs;
    size_t in_end;
    size_t lp, loss, topk_ids, topk_lp;
    size_t out_end;
    size_t lse; /* device only */
    size_t total;
} cu_meta_layout;

/* The z/dz stride of every LoRA call: fixed (from the largest rank an adapter may have), so
 * that GEMM plans never depend on which adapters share a pass (cuda_ops.h, lcu_lora_ldz). */
#define CU_LDZ 512
#define CU_LSEG_SETS 3 /* q, k, v */

enum { CU_KV_NONE, CU_KV_PREFILL, CU_KV_DECODE };

typedef struct cu_ops_prof cu_ops_prof; /* cuda_prof.c */

typedef struct {
    model_config cfg;
    int device;
    char device_name[128];
    cudaStream_t stream;
    lcu_ctx *lcu;
    lcu_cudnn *dnn;                 /* cuDNN's fused attention (LCU_ATTN=cudnn); NULL: the own
                                       kernels only (cuda_layer.c chooses per call) */
    cu_weights w;
    size_t mem_cap;                 /* LCU_DEVICE_MB in bytes (0: the whole device) */
    void *mem_held;                 /* the device's memory beyond mem_cap, held for that */

    /* errors (cuda_check.c) */
    bool sync_debug;                /* LOOM_CUDA_SYNC: synchronize and check after every call */
    bool failed;                    /* a sticky device error happened (cu_sticky), or an
                                       adapter's state is half-updated: every later call
                                       reports it */
    bool grad_started;              /* the pass running now has begun adding gradients */
    char where[96];                 /* the step running now, for messages */
    char errmsg[512];               /* the first failure of the current call */

    /* RoPE tables [cap_pos, d/2], computed on the host exactly as the CPU backend does */
    float *rope_cos, *rope_sin;
    int cap_pos;

    /* workspace */
    void *act_mem;
    cu_act a;
    long cap_T;
    int cap_seqs;
    bool cap_saved;
    cu_keep keep;                   /* kept activations (LCU_KEEP_ACT) */
    cu_buf meta;                    /* per-call rows (cu_meta_layout), host mirror */
    cu_meta_layout ml;
    int head_rows;                  /* rows of logits per head chunk */
    float *logits;                  /* [head_rows, V] */
    lcu_bf16 *dlogits;              /* [head_rows, V] */
    void *norm_ws;                  /* lcu_sumsq's workspace, then its double result */

    /* per call (host) */
    cu_segment *segs;
    int nsegs, cap_segs;
    int *seq_index;                 /* [cap_segs] packed sequence → caller's index */
    lcu_lora_seg *lsegs;            /* [CU_LSEG_SETS][cap_segs] the kernel layer's view of a
                                       module (the first set), or of each module of a packed
                                       decode GEMM (cl_linear_packed) */
    /* sparse layers (cuda_moe.c), host: the grouping of the assignments (be_moe_group, on
     * the router's choices brought back from the device), the experts' LoRA segments
     * (nsegs × E) and grouped-GEMM items (E) */
    int32_t *h_sel, *h_apos, *h_atok;   /* [cap_T·K] */
    int *h_off;                         /* [2E + 1] */
    lcu_lora_seg *esegs;
    int cap_esegs;
    lcu_group_item *gitems;             /* [E] */
    const be_seq *route_seqs;           /* the pass's sequences: the first forward adds its
                                           routing into their expert_counts_out */
    int nseq_packed;                /* non-empty sequences of the pass */
    const int32_t *d_pos;           /* device [T] position of each row in its sequence */
    lcu_attn_desc attn;             /* self-attention over the packed rows */
    int attn_max_len;               /* its longest sequence (the cuDNN plan's bucket) */

    /* sampling (cuda_sample.c): KV caches, per layer K then V, [S·kv_cap, nkv·d] bf16 each,
     * and the maps from a pass's rows to cache rows (cuda_layer.c uses them) */
    int kv_mode;                    /* CU_KV_NONE / PREFILL / DECODE */
    cu_buf kv;
    int kv_cap;                     /* cache rows per stream */
    long kv_streams;
    const int64_t *kv_dst, *kv_src; /* device [kv_nmap]: cache row ← pass row (src NULL = i) */
    long kv_nmap;
    lcu_attn_desc kv_attn;          /* decode: each row against its stream's cache */
    cu_buf smap, sstep, sws;        /* prefill maps, per-step rows, lcu_sample workspace */
    /* decode passes replayed as a CUDA graph (unless LCU_DECODE_GRAPH=0; cuda_sample.c
     * cs_decode_pass): captured on the second pass of a shape, for one sampling call */
    bool dgraph_wanted, dgraph_off; /* asked for; off after a capture or replay failed */
    int dfuse;                      /* LCU_DECODE_FUSE: 1 a decode layer's q/k norms, RoPE, v
                                       rounding and cache stores in one kernel
                                       (lcu_decode_qkv), the attention's tile counts once a
                                       pass; 2 also one GEMM for q|k|v and one for gate|up */
    bool lora_first;                /* LCU_LORA_FIRST (unless 0): cl_linear writes the LoRA
                                       first and the base GEMM adds into it */
    bool dattn;                     /* LCU_DECODE_ATTN (unless 0): decode passes' attention
                                       through lcu_attn_decode_fwd */
    /* LCU_DECODE_SIDE=1: a decode layer's LoRA shrinks (version 3) on a second stream with
     * its own cuBLASLt context, beside the base GEMM (cuda_layer.c, cl_side_fork); created
     * when the context opens with the switch on (side NULL: off) */
    cudaStream_t side;
    lcu_ctx *lcu_side;
    cudaEvent_t side_fork, side_join;
    cudaGraphExec_t dgraph;
    uint64_t dgraph_sig;            /* the shape (cs_sig) of dgraph, or of the passes so far */
    int dgraph_seen;                /* passes of that shape run eagerly */
    /* LCU_DECODE_PROFILE=1 (read when the context opens, as the other switches): where a
     * decode step's time goes, from CUDA events around its parts (cuda_sample.c cs_prof_*),
     * said on stderr per sampling call */
    int dprof_level;                /* the switch's value: 0 off, 1 the parts, 2 also each operation */
    bool dprof;                     /* this sampling call is profiled */
    cudaEvent_t dprof_ev[4];        /* step start, layers done, head done, pick done */
    double dprof_ms[4];             /* summed: layers, head, pick, the host's whole step */
    long dprof_steps;
    /* LCU_DECODE_PROFILE=2: also each operation of the decode passes (cuda_prof.c), which
     * then run eagerly; NULL outside a profiled sampling call (the marks' only cost) */
    cu_ops_prof *dops;
    /* LCU_TRAIN_PROFILE=1: the same per operation for forward(_backward) passes, summed per
     * shape (cuda_prof.c cu_train_prof_*); installed in dops while a pass is queued */
    bool tprof_wanted, tprof_grad;
    cu_ops_prof *tops;
    long tprof_T;
    int tprof_nseq;
    long tprof_passes;              /* passes of that shape so far */
    double tprof_t0, tprof_host_ms; /* the pass's start (s), the host's time to queue it */
} cu_ctx;

/* The device K (which 0) or V (which 1) cache of layer l. */
static inline lcu_bf16 *cu_kv_cache(const cu_ctx *c, int l, int which)
{
    size_t per = (size_t)c->kv_streams * c->kv_cap * c->cfg.num_key_value_heads * c->cfg.head_dim;
    return (lcu_bf16 *)c->kv.dev + ((size_t)l * 2 + which) * per;
}

#endif
