/* lcu_attention.cuh — what the attention kernel versions share: the 64-row tiles, the
 * launch parameters, the tile → sequence search, the tile loads, and each version's table
 * of kernels. lcu_attention.cu holds the entry points of cuda_ops.h (checks, workspace,
 * tile tables, D = rowsum(dO ⊙ O)) and picks the version; lcu_attention_v1.cu (WMMA) and
 * lcu_attention_v2.cu (mma.sync) hold the kernels, lcu_attention_decode.cu the KV-cache
 * decode's own. For these four files only.
 */
#ifndef LOOM_BACKEND_CUDA_ATTENTION_CUH
#define LOOM_BACKEND_CUDA_ATTENTION_CUH

#include "backend/cuda/lcu_common.cuh"

typedef __nv_bfloat16 bf16;

#define LCU_AT 64 /* query and key tile */
#define LCU_FULL 0xffffffffu
#define LCU_LDQ(D) ((D) + 8) /* stride of the bf16 row tiles [64][D + 8] (Q, K, V, dO) */

typedef struct {
    const int32_t *q_start;
    const int64_t *kv_start;
    const int32_t *kv_len;
    const int32_t *cum; /* cumulative tiles of the pass */
    int nseq, nq, nkv;
    float scale;
    long ub; /* blocks launched along x (an upper bound on the tiles) */
} lcu_attn_p;

/* The sequence holding tile t: the last s with cum[s] ≤ t (empty sequences are skipped). */
__device__ __forceinline__ int lcu_find_seq(const int32_t *cum, int nseq, int t)
{
    int lo = 0, hi = nseq - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cum[mid] <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* 64 rows of D bf16 from global (row stride `stride` elements) into shared memory (stride
 * LDQ), 16 bytes per access; rows ≥ nvalid are zero (so 0·garbage never makes a NaN). */
template <int D>
__device__ __forceinline__ void lcu_load_tile(bf16 *dst, const bf16 *src, long stride, int nvalid)
{
    constexpr int VPR = D / 8, LDQ = LCU_LDQ(D);
    for (int i = threadIdx.x; i < LCU_AT * VPR; i += blockDim.x) {
        int r = i / VPR, c = (i % VPR) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < nvalid) v = *reinterpret_cast<const uint4 *>(src + r * stride + c);
        *reinterpret_cast<uint4 *>(dst + r * LDQ + c) = v;
    }
}

/* The query side of a backward tile: Q and dO rows r0.. of head h (zero past qvalid)
 * and their lse and D values. */
template <int D>
__device__ __forceinline__ void lcu_load_q_side(bf16 *Qs, bf16 *dOs, float *lse_s, float *D_s, const lcu_attn_p &p,
                                                const bf16 *q, const bf16 *dout, const float *lse, const float *Dv,
                                                long r0, int h, int qvalid)
{
    long qstride = (long)p.nq * D;
    lcu_load_tile<D>(Qs, q + r0 * qstride + (long)h * D, qstride, qvalid);
    lcu_load_tile<D>(dOs, dout + r0 * qstride + (long)h * D, qstride, qvalid);
    if (threadIdx.x < LCU_AT) {
        bool ok = (int)threadIdx.x < qvalid;
        lse_s[threadIdx.x] = ok ? lse[(r0 + threadIdx.x) * p.nq + h] : 0.0f;
        D_s[threadIdx.x] = ok ? Dv[(r0 + threadIdx.x) * p.nq + h] : 0.0f;
    }
}

/* A version's kernels for one head size and how they are launched: dynamic shared memory
 * (bytes) of each, threads per block of the two backward passes (the forward runs 128). */
typedef struct {
    void (*fwd)(lcu_attn_p, const bf16 *q, const bf16 *k, const bf16 *v, bf16 *out, float *lse);
    void (*dkdv)(lcu_attn_p, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout, const float *lse,
                 const float *Dv, float *dk, float *dv);
    void (*dq)(lcu_attn_p, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout, const float *lse,
               const float *Dv, float *dq);
    int fwd_smem, dkdv_smem, dq_smem;
    int bwd_threads;
} lcu_attn_kernels;

/* Version 1 (lcu_attention_v1.cu) and version 2 (lcu_attention_v2.cu) for head size
 * d ∈ {16, 32, 64, 128}. */
lcu_attn_kernels lcu_attn_v1_kernels(int d);
lcu_attn_kernels lcu_attn_v2_kernels(int d);

#endif
