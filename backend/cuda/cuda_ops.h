/* cuda_ops.h — the CUDA backend's kernel layer, callable from C.
 *
 * Conventions (the same as the CPU backend, backend/cpu/): row-major tensors whose rows are
 * the tokens of a packed batch; HF Llama/Qwen2/Qwen3 math (rotate_half RoPE, RMSNorm with
 * the weight after the normalisation, SwiGLU, GQA with kv head = q head / (nq / nkv)).
 * Data types: base weights bf16 (lcu_bf16: the 16 bits of a bfloat16); the residual stream,
 * GEMM outputs, LoRA masters, their gradients and Adam moments fp32; GEMM inputs bf16.
 * Kernels between two GEMMs read fp32 and write the dtype the next GEMM wants.
 *
 * Every function returns 0 on success, else an error code that lcu_strerror() explains:
 * a CUDA error (launch or runtime), a cuBLAS status, or LCU_EINVAL for a bad argument
 * (nothing was launched then). All work is queued on the given stream; pointers are device
 * pointers unless a comment says "host".
 *
 * Determinism: every kernel writes each output element from one thread in a fixed order
 * (no floating-point atomics), and GEMM plans are cached per shape, so the same inputs
 * give the same bits run to run on one GPU model.
 */
#ifndef LOOM_BACKEND_CUDA_OPS_H
#define LOOM_BACKEND_CUDA_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t lcu_bf16;

typedef enum { LCU_F32 = 0, LCU_BF16 = 1, LCU_F16 = 2 } lcu_dtype;

#define LCU_EINVAL (-1)          /* bad argument */
#define LCU_ECUBLAS_BASE 100000  /* LCU_ECUBLAS_BASE + cublasStatus_t */

const char *lcu_strerror(int rc);

/* ---- context: cuBLASLt handle, GEMM workspace and plan cache --------------------------- */

typedef struct lcu_ctx lcu_ctx;

/* Binds to the current device. workspace_bytes 0 = 32 MiB (cuBLASLt's advice for Hopper).
 * A context is used by one stream at a time (its workspace is shared by its GEMMs). */
int lcu_ctx_create(lcu_ctx **out, size_t workspace_bytes);
void lcu_ctx_destroy(lcu_ctx *c);

/* ---- GEMM: the one entry point for matrix products ------------------------------------- */

/* D = alpha·op(A)·op(B) + beta·C, row-major like cblas: op(A) is M×K, op(B) K×N, D M×N;
 * op(X) = Xᵀ when tX. A and B bf16, fp32 accumulation, C/D fp32 or bf16 (one type).
 * C is read only when beta ≠ 0; C == NULL means C = D (in place, ldc = ldd). M, N or
 * K = 0 is allowed (K = 0: D = beta·C). Plans (layouts + cuBLASLt heuristic) are cached
 * per shape, strides, types and pointer alignment; shapes cuBLASLt has no plan for go
 * through cublasGemmEx (same precision). */
typedef struct {
    bool ta, tb;
    int M, N, K;
    float alpha, beta;
    const lcu_bf16 *A; long lda;
    const lcu_bf16 *B; long ldb;
    const void *C; long ldc;
    void *D; long ldd;
    lcu_dtype d_type;            /* LCU_F32 or LCU_BF16; C has the same type */
} lcu_gemm_args;

int lcu_gemm(lcu_ctx *c, const lcu_gemm_args *g, cudaStream_t s);

/* Plans cached so far (tests, benchmarks), and how many of them go through cublasGemmEx. */
int lcu_gemm_plans(const lcu_ctx *c);
int lcu_gemm_fallback_plans(const lcu_ctx *c);

/* on: every shape goes through the cublasGemmEx fallback (else only those cuBLASLt has no
 * plan for), so that the fallback can be tested on every case. The environment variable
 * LCU_GEMM=cublas sets it for every context created. Flushes the plan cache. */
void lcu_gemm_force_fallback(lcu_ctx *c, bool on);

/* ---- conversion, copies, elementwise ---------------------------------------------------- */

/* dst[i] = src[i] converted (round to nearest even). dst F32|BF16; src F32|BF16|F16. */
int lcu_convert(void *dst, lcu_dtype dt, const void *src, lcu_dtype st, size_t n, cudaStream_t s);

/* Row copy/gather/scatter: dst row dst_rows[i] = src row src_rows[i] for i < n, rows of
 * row_bytes bytes (a multiple of 4). An index array may be NULL (= i). Destination rows
 * must be distinct. For the KV cache of sampling. */
int lcu_copy_rows(void *dst, const int64_t *dst_rows, const void *src, const int64_t *src_rows, long n,
                  size_t row_bytes, cudaStream_t s);

/* x[t, :] = table[tokens[t], :] (bf16 → fp32) for T rows of H. Token ids must be in range
 * (the backend validates them on the host). */
int lcu_embed(float *x, const lcu_bf16 *table, const int32_t *tokens, long T, int H, cudaStream_t s);

/* y = a + b over n fp32 values (y may alias a or b): residual adds. */
int lcu_add(float *y, const float *a, const float *b, long n, cudaStream_t s);

/* y[t, :] += bias over T rows of n (y fp32, bias bf16). */
int lcu_add_bias(float *y, const lcu_bf16 *bias, long T, int n, cudaStream_t s);

/* RMSNorm per row of dim values: rstd[r] = 1/sqrt(mean(x²) + eps), y = x·rstd·w.
 * x fp32; y fp32|bf16 (yt); rstd may be NULL. q/k norm is this over rows·heads rows of
 * head_dim. */
int lcu_rmsnorm_fwd(void *y, lcu_dtype yt, float *rstd, const float *x, const lcu_bf16 *w, long rows, int dim,
                    double eps, cudaStream_t s);

/* Backward: with x̂ = x·rstd, g = dy·w: dx = rstd·(g − x̂·mean(g·x̂)). dy fp32|bf16 (dyt),
 * dx fp32|bf16 (dxt); accumulate (dx += ...) needs dxt == LCU_F32. dx may alias dy when
 * dxt == dyt (in place). */
int lcu_rmsnorm_bwd(void *dx, lcu_dtype dxt, const void *dy, lcu_dtype dyt, const float *x, const float *rstd,
                    const lcu_bf16 *w, long rows, int dim, bool accumulate, cudaStream_t s);

/* RoPE tables: cos_t/sin_t [max_pos, half] with angle pos·inv_freq[i], computed in double.
 * inv_freq: HOST array of half ≤ 256 values (model_rope_inv_freq: llama3 scaling applied). */
int lcu_rope_table(float *cos_t, float *sin_t, const double *inv_freq, int half, int max_pos, cudaStream_t s);

/* HF rotate_half RoPE (element i pairs with i + d/2) on T rows of nh heads of d values:
 * out = rot(pos[t]·θ) in, inverse = rotation by −θ (the backward). in fp32; out fp32|bf16;
 * out may alias in when ot == LCU_F32. */
int lcu_rope(void *out, lcu_dtype ot, const float *in, long T, int nh, int d, const int32_t *pos,
             const float *cos_t, const float *sin_t, bool inverse, cudaStream_t s);

/* A decode pass's q, k and v after their projections, in one kernel (LCU_DECODE_FUSE): per
 * row t, q/k RMSNorm over each head's d values when q_norm and k_norm are given (Qwen3; both
 * or neither), RoPE at pos[t], bf16 rounding; q into q [T, nq·d], k and v into the rows
 * kv_dst[t] (NULL: t) of k_cache and v_cache ([rows, nkv·d] each). The inputs' rows are
 * ldq, ldk, ldv floats apart (separate buffers, or one GEMM's [q | k | v]). Bit for bit
 * lcu_rmsnorm_fwd (F32) + lcu_rope (BF16) + lcu_convert + lcu_copy_rows, the five to seven
 * launches it replaces. */
int lcu_decode_qkv(lcu_bf16 *q, lcu_bf16 *k_cache, lcu_bf16 *v_cache, const int64_t *kv_dst, const float *q_pre,
                   long ldq, const float *k_pre, long ldk, const float *v, long ldv, const lcu_bf16 *q_norm,
                   const lcu_bf16 *k_norm, long T, int nq, int nkv, int d, double eps, const int32_t *pos,
                   const float *cos_t, const float *sin_t, cudaStream_t s);

/* SwiGLU: h = silu(g)·u over n values; g, u fp32; h fp32|bf16. */
int lcu_swiglu_fwd(void *h, lcu_dtype ht, const float *g, const float *u, long n, cudaStream_t s);
/* The same into h [T, I] (bf16) from rows of g and u that are ld floats apart (one GEMM's
 * [gate | up]: u = g + I, ld = 2I); bit for bit lcu_swiglu_fwd on the same values. */
int lcu_swiglu_rows(lcu_bf16 *h, const float *g, const float *u, long T, int I, long ld, cudaStream_t s);
/* dg = dh·u·σ(g)·(1 + g·(1 − σ(g))), du = dh·g·σ(g); dh, g, u fp32; dg, du of type t. */
int lcu_swiglu_bwd(void *dg, void *du, lcu_dtype t, const float *dh, const float *g, const float *u, long n,
                   cudaStream_t s);

/* ---- attention: packed variable-length causal GQA, flash-attention style ---------------- */

/* Sequence i has q_len_i = q_start[i+1] − q_start[i] query rows (rows q_start[i].. of q and
 * out) and kv_len_i keys (rows kv_start[i].. of k and v). Query j of the sequence sits at
 * position kv_len_i − q_len_i + j and attends to keys 0..that position (causal, aligned to
 * the end: a prefill has kv_len = q_len, a decode step q_len = 1 against its cache).
 * kv_start/kv_len NULL = self-attention over the same packed rows (kv = q); otherwise
 * q_len_i ≤ kv_len_i. Layouts: q, out [rows, nq·d]; k, v [rows, nkv·d]; lse [rows, nq]
 * (natural log, of scale·q·k). Two kernel versions compute the same function: the
 * environment variable LCU_ATTN=mma selects version 2 (FlashAttention-2 style, mma.sync),
 * anything else version 1 (WMMA); see lcu_attention.cu (the versions: lcu_attention_v1.cu,
 * lcu_attention_v2.cu). (LCU_ATTN=cudnn is the backend's
 * switch to cuDNN's attention, below; these functions then run version 1.) */
typedef struct {
    int nseq;
    const int32_t *q_start;      /* device [nseq + 1] */
    const int64_t *kv_start;     /* device [nseq] or NULL */
    const int32_t *kv_len;       /* device [nseq] or NULL */
    long total_q;                /* q_start[nseq] (host value) */
    int nq, nkv, d;              /* d ∈ {16, 32, 64, 128}; nq a multiple of nkv */
    float scale;                 /* 1/sqrt(d) */
    bool counted;                /* lcu_attn_fwd: ws already holds this descriptor's tile
                                    counts (an earlier call with it and the same ws, as a
                                    decode pass's later layers): not counted again */
} lcu_attn_desc;

/* Workspace bytes for lcu_attn_fwd / lcu_attn_bwd with this descriptor. */
size_t lcu_attn_workspace_bytes(const lcu_attn_desc *a);

/* q, k, v bf16 (RoPE applied) → out bf16, lse fp32. */
int lcu_attn_fwd(const lcu_attn_desc *a, const lcu_bf16 *q, const lcu_bf16 *k, const lcu_bf16 *v, lcu_bf16 *out,
                 float *lse, void *ws, cudaStream_t s);

/* The same forward for KV-cache attention (kv_start and kv_len set) by a kernel made for
 * decode steps (lcu_attention_decode.cu: one block per sequence and kv head, the keys split
 * among its warps; fast for the few query rows a decode step has, correct for any q_len ≤
 * kv_len). Values agree with lcu_attn_fwd's within bf16 rounding (its P stays fp32), bit
 * for bit from run to run; no workspace. The backend takes it unless LCU_DECODE_ATTN=0. */
int lcu_attn_decode_fwd(const lcu_attn_desc *a, const lcu_bf16 *q, const lcu_bf16 *k, const lcu_bf16 *v,
                        lcu_bf16 *out, float *lse, cudaStream_t s);

/* Gradients from dout given the forward's out and lse (self-attention only: kv_start and
 * kv_len NULL). dq, dk, dv fp32, all overwritten. Recomputes P from lse; no T×T matrix and
 * no atomics: one pass owns dK/dV per key block, another dQ per query block. */
int lcu_attn_bwd(const lcu_attn_desc *a, const lcu_bf16 *q, const lcu_bf16 *k, const lcu_bf16 *v,
                 const lcu_bf16 *out, const float *lse, const lcu_bf16 *dout, float *dq, float *dk, float *dv,
                 void *ws, cudaStream_t s);

/* ---- attention through cuDNN (lcu_cudnn_attn.c) ------------------------------------------ */

/* The same function as lcu_attn_fwd / lcu_attn_bwd for self-attention over the packed rows
 * (kv_start and kv_len NULL), computed by cuDNN 9's fused flash attention (forward and
 * deterministic backward, ragged offsets for the packed sequences, GQA, causal mask),
 * through cuDNN's backend API with libcudnn loaded at run time (lcu_cudnn.c says where it is
 * looked for; LOOM_CUDNN_LIBRARY names it). Execution plans are cached per shape bucket
 * (sequences rounded up to a power of two, the longest sequence to 64, 128, 192, 256, 384,
 * … rows). The version 1 kernels stay the reference and the KV-cache decode path.
 * Environment, read by lcu_cudnn_create: LCU_CUDNN_VERBOSE=1 (a line per plan: engine,
 * workspace, build time), LCU_CUDNN_EXACT_BATCH=1 (no padding sequences in the bucket),
 * LCU_CUDNN_WORKSPACE_MB (a plan needing more is refused; default a quarter of the device),
 * LCU_CUDNN_ANY_ENGINE=1 (the backward may take an engine cuDNN notes NONDETERMINISTIC:
 * for trying, the bitwise rerun test then decides).
 *
 * Differences from lcu_attn_bwd: dq, dk, dv are cuDNN's bf16 results widened to fp32 (the
 * own kernels keep fp32 accumulators); rows [0, total_q) must be exactly the sequences'
 * rows (q_start[0] = 0). The context owns its device workspace (grown with the largest
 * batch and bucket, never per call once warm) and is used by one stream at a time. */
#define LCU_ENOTSUP (-2)         /* this path does not take these arguments: run another */
#define LCU_ECUDNN_BASE 200000   /* LCU_ECUDNN_BASE + cudnnStatus_t */

typedef struct lcu_cudnn lcu_cudnn;

/* Loads libcudnn (once per process) and makes a handle on the current device. 0, or
 * LCU_ENOTSUP with why filled (not found, not cuDNN ≥ 9.6, built without cuDNN's headers,
 * no device): the caller keeps the own kernels. */
int lcu_cudnn_create(lcu_cudnn **out, char *why, size_t whylen);
void lcu_cudnn_destroy(lcu_cudnn *c);
/* "cuDNN 9.x.y (path)", for logs. */
const char *lcu_cudnn_describe(const lcu_cudnn *c);
/* Messages for LCU_ENOTSUP, LCU_ECUDNN_BASE + status, and everything lcu_strerror knows. */
const char *lcu_cudnn_strerror(int rc);

/* max_len: the longest sequence's rows, known on the host (it picks the plan's bucket; 0 =
 * not known: total_q bounds it, at the cost of a larger bucket; a value below the real one
 * is the caller's bug: the rows past it would be dropped). Returns 0; LCU_ENOTSUP when this
 * path does not take the call (KV-cache layouts, a bucket cuDNN has no plan for, no device
 * memory for the workspace: logged once on stderr); LCU_EINVAL; a CUDA error; or
 * LCU_ECUDNN_BASE + the status of a failed execution. */
int lcu_cudnn_attn_fwd(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, const lcu_bf16 *q, const lcu_bf16 *k,
                       const lcu_bf16 *v, lcu_bf16 *out, float *lse, cudaStream_t s);
int lcu_cudnn_attn_bwd(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, const lcu_bf16 *q, const lcu_bf16 *k,
                       const lcu_bf16 *v, const lcu_bf16 *out, const float *lse, const lcu_bf16 *dout, float *dq,
                       float *dk, float *dv, cudaStream_t s);

/* Plans built so far; *refused = buckets cuDNN had no plan for (tests, benchmarks). */
int lcu_cudnn_plans(const lcu_cudnn *c, int *refused);
/* Device memory the context holds for its workspace now. */
size_t lcu_cudnn_workspace_bytes(const lcu_cudnn *c);

/* ---- output head: per-token logprobs, losses, dlogits, top-k ---------------------------- */

/* Losses of backend/loss.h (kind values as loss_kind): 0 cross_entropy, 1 importance_sampling,
 * 2 ppo, 3 cispo, 4 dro. */
typedef struct {
    int kind;
    int grad;                    /* 1: this sequence's rows get dlogits; 0: zero rows */
    double clip_low, clip_high, beta;
} lcu_loss_seq;

/* Per-row inputs and outputs of the head over a whole packed batch of T rows. Row t has
 * targets tgt_start[t] .. tgt_start[t+1] (1 usually; k for 2-D cross_entropy). */
typedef struct {
    const int32_t *row_seq;      /* [T] index into seqs */
    const lcu_loss_seq *seqs;    /* [nseq] */
    const int64_t *tgt_start;    /* [T + 1] */
    const int32_t *targets;      /* [nnz] token ids */
    const float *weights;        /* [nnz] cross-entropy weights; NULL = 1 */
    const float *sampler_lp;     /* [T] RL sampler log-probs; NULL = 0 */
    const float *adv;            /* [T] RL advantages; NULL = 0 */
    float *lp_out;               /* [nnz] log p(target) */
    float *loss_out;             /* [T] elementwise loss (sum over the row's targets) */
    double *lse_out;             /* [T] log-sum-exp of the row's logits; NULL = not kept */
} lcu_head_batch;

/* For rows row0 .. row0+rows of the batch, whose logits [rows, V] (fp32, row stride ld)
 * the caller computed (a chunk: never [T, V] at once): logprobs, losses and, when dlogits
 * is not NULL, dℓ/dlogits = Σ_j dℓ/dlp_j·(onehot(t_j) − softmax) as bf16 [rows, V] (row
 * stride ldd), zero rows where the sequence has no gradient, dℓ/dlp = 0 or the sum of the
 * row's dℓ/dlp is not finite (as the CPU). */
int lcu_head_loss(const float *logits, long ld, long row0, int rows, int V, const lcu_head_batch *b,
                  lcu_bf16 *dlogits, long ldd, cudaStream_t s);

/* The topk largest logits of each row of the chunk (k_r = topk_start[row+1] − topk_start[row]
 * for batch row row0 + r, 0 ≤ k_r ≤ 1024), best first, ties lower id first, as ids and
 * log-probs z − lse (lse from lcu_head_loss's lse_out). */
int lcu_head_topk(const float *logits, long ld, long row0, int rows, int V, const int64_t *topk_start,
                  const double *lse, int32_t *ids_out, float *lp_out, cudaStream_t s);

/* ---- LoRA over segments of rows (many adapters, different ranks, one pass) -------------- */

/* y = x Wᵀ + scale·(x Aᵀ) Bᵀ for the rows of a segment (row_begin .. row_end of x/y).
 * A, B: bf16 copies of the fp32 masters (lcu_convert after each optimizer step); gA, gB:
 * the fp32 gradient accumulators (same shapes), used by lcu_lora_bwd only. */
typedef struct {
    long row_begin, row_end;
    int rank;
    float scale;
    const lcu_bf16 *A;           /* [rank, in] */
    const lcu_bf16 *B;           /* [out, rank] */
    float *gA, *gB;
} lcu_lora_seg;

/* z (and dz in the backward) are bf16 workspaces of (last row_end) rows with stride ldz ≥
 * lcu_lora_ldz(largest rank of the call's segments), each segment using its own rows. Keep
 * ldz the same for every call (e.g. from the largest rank the backend holds): the GEMM plans
 * then do not depend on which adapters share a pass, and a packed pass is bitwise the same
 * as each segment alone. */
int lcu_lora_ldz(int max_rank);

/* y[rows, out] += scale·(x Aᵀ) Bᵀ per segment (host array segs[nseg]). x bf16 [*, in]
 * (stride ldx), y fp32 (stride ldy). */
int lcu_lora_fwd(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x, long ldx,
                 float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s);

/* y[rows, out] = scale·(x Aᵀ) Bᵀ (+ C when C is not NULL, fp32 stride ldc): the LoRA written
 * where the output is produced, so that the base GEMM then adds into it (beta 1) instead of
 * the LoRA reading and writing the output once more (LCU_LORA_FIRST, cuda_layer.c). By the
 * products of the version LCU_LORA picks for these segments (lcu_sgmv.cuh): version 1's, or
 * version 3's with its expand writing y. LCU_ENOTSUP (nothing done: run the GEMM, then
 * lcu_lora_fwd) when the segments do not tile rows 0 .. rows − 1 in order, on version 2,
 * and on version 3 with C (its expand would have to add to a copy of C: no gain). The same
 * function as lcu_lora_fwd after y = C (or 0): fp32 rounding apart. */
int lcu_lora_fwd_into(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, long rows, int in, int out, const lcu_bf16 *x,
                      long ldx, const float *C, long ldc, float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s);

/* Several modules' LoRA over one input x (a decode layer's q, k, v, or gate and up, whose
 * base GEMM is one over their packed weights): module m adds its segments' products into
 * its columns of y, y + ycol .. + out. The same as lcu_lora_fwd per module (y + ycol), bit
 * for bit. Where every module's segments take version 3 (lcu_sgmv.cuh), each product of all
 * the modules in one launch (per kernel class) instead of one per module, module m's z in
 * z's columns zcol .. (+ its largest rank; the modules' columns apart, else LCU_EINVAL);
 * else one module after another through z's first columns. */
typedef struct {
    const lcu_lora_seg *segs;
    int nseg;
    int out;
    long ycol, zcol;
} lcu_lora_mod;
int lcu_lora_fwd_multi(lcu_ctx *c, const lcu_lora_mod *mods, int nmod, int in, const lcu_bf16 *x, long ldx, float *y,
                       long ldy, lcu_bf16 *z, long ldz, cudaStream_t s);
/* lcu_lora_fwd_multi in two calls, where every module's segments take version 3 (else
 * LCU_ENOTSUP, nothing done: lcu_lora_fwd_multi_splits says which beforehand): the shrinks
 * (z_part: z = x Aᵀ into each module's z columns), then the expands (y += scale·z Bᵀ, x
 * unused); in that order, bit for bit the one call. Between them the caller may run other
 * work, on another stream and lcu_ctx too (a decode layer's base GEMM beside the shrinks:
 * LCU_DECODE_SIDE, cuda_layer.c); the two calls check the same arguments. */
bool lcu_lora_fwd_multi_splits(const lcu_lora_mod *mods, int nmod);
int lcu_lora_fwd_multi_part(lcu_ctx *c, bool z_part, const lcu_lora_mod *mods, int nmod, int in, const lcu_bf16 *x,
                            long ldx, float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s);

/* Per segment: gB += scale·dyᵀ z, gA += dzᵀ x with dz = scale·dy B (z = x Aᵀ recomputed);
 * dx += dz A when dx is not NULL (fp32). dy bf16 (stride lddy). Segments of one call that
 * share gA/gB accumulate in segment order (fixed, so deterministic). */
int lcu_lora_bwd(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x, long ldx,
                 const lcu_bf16 *dy, long lddy, float *dx, long lddx, lcu_bf16 *z, lcu_bf16 *dz, long ldz,
                 cudaStream_t s);

/* lcu_lora_bwd with dx = dz A (+ dx when acc) written rather than added: the LoRA's part of
 * dx first, the base GEMM's dgrad then adding into it (beta 1; LCU_LORA_FIRST,
 * cuda_layer.c). Versions 1 and 3; LCU_ENOTSUP (nothing done) as lcu_lora_fwd_into. The
 * gradients are lcu_lora_bwd's, bit for bit; dx its value within fp32 rounding. */
int lcu_lora_bwd_into(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, long rows, int in, int out,
                      const lcu_bf16 *x, long ldx, const lcu_bf16 *dy, long lddy, float *dx, long lddx, bool acc,
                      lcu_bf16 *z, lcu_bf16 *dz, long ldz, cudaStream_t s);

/* ---- mixture-of-experts layers (Qwen3-MoE): lcu_moe.cu, the grouped GEMM of lcu_sgmv.cu --- */

/* One product of a grouped GEMM: C[M, N] = alpha·op(A)·op(B) (+ C), row-major, A and B bf16. */
typedef struct {
    const lcu_bf16 *A; long lda;
    const lcu_bf16 *B; long ldb;
    void *C; long ldc;
    long M, N, K;
    float alpha;
} lcu_group_item;

/* Every item's product (acc: C += ...) with the segmented GEMM of the LoRA version 2
 * (lcu_sgmv.cu): up to 32 items per launch, fp32 accumulation, each 64×64 tile by one block
 * in a fixed K order (deterministic; an item's results do not depend on the others). Items
 * with M, N or K = 0 are skipped. C is fp32 (ct LCU_F32) or bf16; the combinations
 * (ta, tb, ct, acc) it has: (F, T, F32, F/T), (F, F, F32, F/T), (T, F, F32, T),
 * (F, T, BF16, F), (F, F, BF16, F). items: HOST array. */
int lcu_grouped_gemm(const lcu_group_item *items, int n, bool ta, bool tb, lcu_dtype ct, bool acc, cudaStream_t s);

/* The router: prob [T, E] holds the logits on entry, the softmax (in double) on return;
 * sel [T, K] the K most likely experts, most likely first (a strict >: the lower index of
 * equal probabilities first), w [T, K] their probabilities, ÷ their sum when norm.
 * E ≤ 1024. */
int lcu_moe_route(float *prob, long T, int E, int K, bool norm, int32_t *sel, float *w, cudaStream_t s);
/* ex[r, :] = x[a_tok[r], :] for n grouped rows of H (bf16). */
int lcu_moe_gather(lcu_bf16 *ex, const lcu_bf16 *x, const int32_t *a_tok, long n, int H, cudaStream_t s);
/* out[t] = resid[t] + Σ_k w[t, k]·ey[a_pos[t, k]] (k in order; out may alias resid). */
int lcu_moe_combine(float *out, const float *resid, const float *ey, const int32_t *a_pos, const float *w, long T,
                    int K, int H, cudaStream_t s);
/* dw[t, k] = dout[t]·ey[a_pos[t, k]] (double), edy[a_pos[t, k]] = w[t, k]·dout[t] (bf16). */
int lcu_moe_dweights(float *dw, lcu_bf16 *edy, const float *dout, const float *ey, const int32_t *a_pos,
                     const float *w, long T, int K, int H, cudaStream_t s);
/* dxn[t] = Σ_k edx[a_pos[t, k]] (fp32), and dlogits [T, E] (bf16) = the router logits'
 * gradient through the routing weights (K ≤ 64; the formula at lcu_moe_dinput_k). */
int lcu_moe_dinput(float *dxn, lcu_bf16 *dlogits, const float *edx, const int32_t *a_pos, const float *prob,
                   const int32_t *sel, const float *w, const float *dw, long T, int K, int E, int H, bool norm,
                   cudaStream_t s);

/* ---- AdamW with global-norm clipping ----------------------------------------------------- */

/* Bytes of workspace lcu_sumsq needs. */
size_t lcu_sumsq_workspace_bytes(void);

/* *out = Σ g[i]² over n values, in double, by a fixed two-stage reduction (the same bits
 * every run). out: device double. */
int lcu_sumsq(double *out, const float *g, size_t n, void *ws, cudaStream_t s);

/* torch.optim.AdamW step on n parameters (backend/adamw.c's arithmetic, in double, without
 * fused multiply-adds, so it matches the CPU backend bit for bit): step = the step number
 * after incrementing (1 first), grad_scale multiplies g (the clip coefficient). */
typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step;
    double grad_scale;
} lcu_adamw_args;

int lcu_adamw(float *p, const float *g, float *m, float *v, size_t n, const lcu_adamw_args *a, cudaStream_t s);

/* ---- sampling ---------------------------------------------------------------------------- */

/* Per-row sampling parameters, as be_sample_req: temperature 0 = greedy; top_k ≤ 0 = no
 * limit; top_p in (0, 1], 1 = no limit. */
typedef struct {
    double temperature;
    int top_k;
    double top_p;
} lcu_sample_params;

size_t lcu_sample_workspace_bytes(int rows, int V);

/* One token for each of rows rows of logits [rows, V] (stride ld), with the CPU backend's
 * algorithm (cpu_choose.c cpu_choose_token): temperature, then the top-k threshold, then the top-p
 * nucleus in (weight desc, id desc) order, then one uniform draw u·mass from the row's
 * xoshiro256** state (model/rng.h; rng[row*4 .. +4], advanced on the device) walked in that
 * order. tok_out/lp_out [rows]: the token and its log-prob under the sampled distribution.
 * params: HOST array [rows] (uploaded into ws). */
int lcu_sample(const float *logits, long ld, int rows, int V, const lcu_sample_params *params, uint64_t *rng,
               int32_t *tok_out, float *lp_out, void *ws, size_t ws_bytes, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
