/* lcu_attention.cu — causal GQA attention over packed variable-length sequences, forward
 * and backward, flash-attention style (see cuda_ops.h). Version 1: simple and checkable.
 *
 * Tiles of 64 query rows × 64 keys; matrix products on the tensor cores through WMMA
 * (bf16 in, fp32 accumulate, 16×16×16 fragments), softmax and masking in fp32 on plain
 * threads through shared memory, so the fragment layouts never matter.
 *
 * Forward: one block (4 warps) per (query tile, query head); warp w owns query rows
 * 16w..16w+15 and needs only __syncwarp between its own S → P → PV steps. Online softmax
 * with the running output in registers; P is rounded to bf16 for the PV product, and the
 * row sum adds the fp32 values before rounding (as FlashAttention-2 and the CPU twin), so
 * lse is the log-sum-exp of the fp32 scores: summing the rounded values instead would put
 * ~1e-3 (bf16 rounding over a row) into lse and into the backward's P = exp(S − lse).
 *
 * Backward (deterministic, no atomics): D = rowsum(dO ⊙ O) first; then one block per (key
 * tile, kv head) recomputes P = exp(scale·QKᵀ − lse) for every query tile and query head of
 * its group and owns dK, dV of its keys; another block per (query tile, query head) owns dQ.
 * That recomputes S and dP once more than a kernel with atomic dQ updates (7 instead of 5
 * matrix products per tile pair) and is the price of bitwise reproducibility.
 *
 * Tiles → (sequence, tile): a small kernel writes cumulative tile counts into the
 * workspace; each block finds its sequence by binary search. Query-tile passes number the
 * blocks from the last tile backwards (late query tiles see the most keys), the key-tile
 * pass from the first (early key tiles see the most queries), so the heavy blocks start
 * first.
 *
 * Tuning is local to this file: the entry points and the workspace stay as they are.
 */
#include "backend/cuda/lcu_common.cuh"

#include <math.h>
#include <mma.h>
#include <stdlib.h>
#include <string.h>

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

#define LCU_AT 64 /* query and key tile */
#define LCU_FULL 0xffffffffu

template <int D> struct lcu_attn_cfg {
    static constexpr int LDQ = D + 8;          /* bf16 tiles [64][LDQ] (Q, K, V, dO) */
    static constexpr int LDS = LCU_AT + 4;     /* fp32 score tiles [64][LDS] */
    static constexpr int LDP = LCU_AT + 8;     /* bf16 probability tiles [64][LDP] */
    static constexpr int LDO = D + 4;          /* fp32 output tiles */
    static constexpr int TILE = LCU_AT * LDQ * 2;
    static constexpr int STILE = LCU_AT * LDS * 4;
    static constexpr int PTILE = LCU_AT * LDP * 2;
    static constexpr int WREG = 16 * (LDO > LDS ? LDO : LDS); /* fwd: floats per warp for S / PV */
    static constexpr int NT = (D / 16 + 1) / 2; /* bwd: 16-column output blocks per warp */
    static constexpr int FWD_SMEM = 3 * TILE + PTILE + 4 * WREG * 4;
    static constexpr int DKDV_SMEM = 4 * TILE + 2 * STILE + 2 * PTILE + 2 * LCU_AT * 4;
    static constexpr int DQ_SMEM = 4 * TILE + 2 * STILE + PTILE + 2 * LCU_AT * 4;
    static_assert(LCU_AT * LDO * 4 <= 2 * STILE, "output staging must fit the two score tiles");
};

typedef struct {
    const int32_t *q_start;
    const int64_t *kv_start;
    const int32_t *kv_len;
    const int32_t *cum; /* cumulative tiles of the pass */
    int nseq, nq, nkv;
    float scale;
    long ub; /* blocks launched along x (an upper bound on the tiles) */
} lcu_attn_p;

/* Cumulative 64-row tile counts of the queries (cum_q) and of the keys (cum_k). One block:
 * each thread sums a contiguous run of sequences, thread 0 scans the runs. */
__global__ void lcu_attn_prep_k(const int32_t *q_start, const int32_t *kv_len, int nseq, int32_t *cum_q,
                                int32_t *cum_k)
{
    __shared__ int sq[1024], sk[1024];
    int chunk = (nseq + blockDim.x - 1) / blockDim.x, b = threadIdx.x * chunk;
    int e = b + chunk < nseq ? b + chunk : nseq;
    int tq = 0, tk = 0;
    for (int i = b; i < e; i++) {
        int ql = q_start[i + 1] - q_start[i], kl = kv_len ? kv_len[i] : ql;
        tq += (ql + LCU_AT - 1) / LCU_AT;
        tk += (kl + LCU_AT - 1) / LCU_AT;
    }
    sq[threadIdx.x] = tq;
    sk[threadIdx.x] = tk;
    __syncthreads();
    if (threadIdx.x == 0) {
        int rq = 0, rk = 0;
        for (int t = 0; t < (int)blockDim.x; t++) {
            int a = sq[t], c = sk[t];
            sq[t] = rq;
            sk[t] = rk;
            rq += a;
            rk += c;
        }
        cum_q[nseq] = rq;
        cum_k[nseq] = rk;
    }
    __syncthreads();
    int rq = sq[threadIdx.x], rk = sk[threadIdx.x];
    for (int i = b; i < e; i++) {
        int ql = q_start[i + 1] - q_start[i], kl = kv_len ? kv_len[i] : ql;
        cum_q[i] = rq;
        cum_k[i] = rk;
        rq += (ql + LCU_AT - 1) / LCU_AT;
        rk += (kl + LCU_AT - 1) / LCU_AT;
    }
}

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
    constexpr int VPR = D / 8, LDQ = lcu_attn_cfg<D>::LDQ;
    for (int i = threadIdx.x; i < LCU_AT * VPR; i += blockDim.x) {
        int r = i / VPR, c = (i % VPR) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < nvalid) v = *reinterpret_cast<const uint4 *>(src + r * stride + c);
        *reinterpret_cast<uint4 *>(dst + r * LDQ + c) = v;
    }
}

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> lcu_acc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> lcu_fa;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> lcu_fb_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> lcu_fb_col;

/* ---- forward ------------------------------------------------------------------------------ */

template <int D>
__global__ void __launch_bounds__(128) lcu_attn_fwd_k(lcu_attn_p p, const bf16 *q, const bf16 *k, const bf16 *v,
                                                      bf16 *out, float *lse)
{
    typedef lcu_attn_cfg<D> C;
    extern __shared__ __align__(128) unsigned char lcu_sm[];
    bf16 *Qs = reinterpret_cast<bf16 *>(lcu_sm), *Ks = Qs + LCU_AT * C::LDQ, *Vs = Ks + LCU_AT * C::LDQ;
    bf16 *Ps = Vs + LCU_AT * C::LDQ;
    float *SO = reinterpret_cast<float *>(Ps + LCU_AT * C::LDP);

    long tile = p.ub - 1 - (long)blockIdx.x;
    if (tile >= p.cum[p.nseq]) return;
    int s = lcu_find_seq(p.cum, p.nseq, (int)tile), qt = (int)tile - p.cum[s];
    int h = blockIdx.y, g = h / (p.nq / p.nkv);
    long q0 = p.q_start[s];
    int q_len = p.q_start[s + 1] - (int)q0;
    long kv0 = p.kv_start ? p.kv_start[s] : q0;
    int kv_len = p.kv_len ? p.kv_len[s] : q_len, q_off = kv_len - q_len;
    int row0 = qt * LCU_AT, nvalid = min(LCU_AT, q_len - row0);
    long qstride = (long)p.nq * D, kvstride = (long)p.nkv * D;

    lcu_load_tile<D>(Qs, q + (q0 + row0) * qstride + (long)h * D, qstride, nvalid);
    __syncthreads();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    lcu_fa qf[D / 16];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wmma::load_matrix_sync(qf[kk], Qs + warp * 16 * C::LDQ + kk * 16, C::LDQ);

    float *Sw = SO + warp * C::WREG;      /* this warp's scores [16][LDS], then PV [16][LDO] */
    bf16 *Pw = Ps + warp * 16 * C::LDP;   /* this warp's probabilities [16][LDP] */
    int r = lane >> 1, half = lane & 1;   /* two lanes per row, 32 keys / D/2 columns each */
    int qrow = row0 + warp * 16 + r;
    bool row_ok = qrow < q_len;
    int qpos = q_off + qrow;
    float m = -INFINITY, l = 0.0f, o[D / 2];
#pragma unroll
    for (int j = 0; j < D / 2; j++) o[j] = 0.0f;

    int kt_end = (q_off + row0 + nvalid - 1) / LCU_AT;
    for (int kt = 0; kt <= kt_end; kt++) {
        __syncthreads(); /* everyone is done with the previous K/V */
        int kvalid = min(LCU_AT, kv_len - kt * LCU_AT);
        lcu_load_tile<D>(Ks, k + (kv0 + (long)kt * LCU_AT) * kvstride + (long)g * D, kvstride, kvalid);
        lcu_load_tile<D>(Vs, v + (kv0 + (long)kt * LCU_AT) * kvstride + (long)g * D, kvstride, kvalid);
        __syncthreads();

#pragma unroll
        for (int n = 0; n < LCU_AT / 16; n++) {
            lcu_acc acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                lcu_fb_col kf;
                wmma::load_matrix_sync(kf, Ks + n * 16 * C::LDQ + kk * 16, C::LDQ);
                wmma::mma_sync(acc, qf[kk], kf, acc);
            }
            wmma::store_matrix_sync(Sw + n * 16, acc, C::LDS, wmma::mem_row_major);
        }
        __syncwarp();

        float sv[32], mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < 32; c++) {
            int col = half * 32 + c, kpos = kt * LCU_AT + col;
            bool ok = row_ok && kpos <= qpos; /* kpos ≤ qpos < kv_len */
            sv[c] = ok ? Sw[r * C::LDS + col] * p.scale : -INFINITY;
            mx = fmaxf(mx, sv[c]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(LCU_FULL, mx, 1));
        float m_new = fmaxf(m, mx), alpha = 1.0f, ls = 0.0f;
        if (m_new == -INFINITY) { /* nothing visible yet (or a padding row) */
#pragma unroll
            for (int c = 0; c < 32; c++) Pw[r * C::LDP + half * 32 + c] = __float2bfloat16_rn(0.0f);
        } else {
            alpha = expf(m - m_new);
#pragma unroll
            for (int c = 0; c < 32; c++) {
                float pv = expf(sv[c] - m_new);
                Pw[r * C::LDP + half * 32 + c] = __float2bfloat16_rn(pv);
                ls += pv; /* the fp32 value: lse stays exact (see the file comment) */
            }
        }
        ls += __shfl_xor_sync(LCU_FULL, ls, 1);
        l = l * alpha + ls;
        m = m_new;
        __syncwarp(); /* P written, S read: the region is free for PV */

#pragma unroll
        for (int n = 0; n < D / 16; n++) {
            lcu_acc acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < LCU_AT / 16; kk++) {
                lcu_fa pf;
                lcu_fb_row vf;
                wmma::load_matrix_sync(pf, Pw + kk * 16, C::LDP);
                wmma::load_matrix_sync(vf, Vs + kk * 16 * C::LDQ + n * 16, C::LDQ);
                wmma::mma_sync(acc, pf, vf, acc);
            }
            wmma::store_matrix_sync(Sw + n * 16, acc, C::LDO, wmma::mem_row_major);
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < D / 2; j++) o[j] = o[j] * alpha + Sw[r * C::LDO + half * (D / 2) + j];
    }

    if (row_ok) {
        float inv = 1.0f / l; /* l > 0: a row always sees the key at its own position */
        bf16 *orow = out + (q0 + qrow) * qstride + (long)h * D + half * (D / 2);
#pragma unroll
        for (int j = 0; j < D / 2; j += 8) {
            union {
                uint4 u;
                __nv_bfloat162 b[4];
            } pk;
#pragma unroll
            for (int e = 0; e < 4; e++) pk.b[e] = __floats2bfloat162_rn(o[j + 2 * e] * inv, o[j + 2 * e + 1] * inv);
            *reinterpret_cast<uint4 *>(orow + j) = pk.u;
        }
        if (half == 0) lse[(q0 + qrow) * p.nq + h] = m + logf(l);
    }
}

/* ---- backward ----------------------------------------------------------------------------- */

/* Dv[t, h] = Σ_c dO[t, h, c]·O[t, h, c] (fp32) for every row and query head. */
__global__ void lcu_attn_bwd_pre_k(const bf16 *out, const bf16 *dout, float *Dv, long n, int d)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const uint4 *o = reinterpret_cast<const uint4 *>(out + i * d), *g = reinterpret_cast<const uint4 *>(dout + i * d);
        float s = 0.0f;
        for (int c = 0; c < d / 8; c++) {
            uint4 a = o[c], b = g[c];
            const __nv_bfloat162 *pa = reinterpret_cast<const __nv_bfloat162 *>(&a);
            const __nv_bfloat162 *pb = reinterpret_cast<const __nv_bfloat162 *>(&b);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 x = __bfloat1622float2(pa[e]), y = __bfloat1622float2(pb[e]);
                s += x.x * y.x + x.y * y.y;
            }
        }
        Dv[i] = s;
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

/* S (or Sᵀ) and dP (or dPᵀ) tiles: 16 output blocks of 16×16 each, two per warp:
 * S = A1·B1ᵀ, dP = A2·B2ᵀ over D (the B operands read as col_major matrix_b). */
template <int D>
__device__ __forceinline__ void lcu_scores(float *S, float *dP, const bf16 *A1, const bf16 *B1, const bf16 *A2,
                                           const bf16 *B2, int warp)
{
    typedef lcu_attn_cfg<D> C;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        int idx = warp + 8 * j, mi = idx >> 2, ni = idx & 3;
        lcu_acc s, dp;
        wmma::fill_fragment(s, 0.0f);
        wmma::fill_fragment(dp, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            lcu_fa a;
            lcu_fb_col b;
            wmma::load_matrix_sync(a, A1 + mi * 16 * C::LDQ + kk * 16, C::LDQ);
            wmma::load_matrix_sync(b, B1 + ni * 16 * C::LDQ + kk * 16, C::LDQ);
            wmma::mma_sync(s, a, b, s);
            wmma::load_matrix_sync(a, A2 + mi * 16 * C::LDQ + kk * 16, C::LDQ);
            wmma::load_matrix_sync(b, B2 + ni * 16 * C::LDQ + kk * 16, C::LDQ);
            wmma::mma_sync(dp, a, b, dp);
        }
        wmma::store_matrix_sync(S + mi * 16 * C::LDS + ni * 16, s, C::LDS, wmma::mem_row_major);
        wmma::store_matrix_sync(dP + mi * 16 * C::LDS + ni * 16, dp, C::LDS, wmma::mem_row_major);
    }
}

/* P = exp(scale·S − lse) and dS = P ⊙ (dP − D) on a 64×64 tile in place of the causal mask,
 * as bf16 for the next products. Element (a, b) of the tiles is (query, key) when
 * !transposed and (key, query) when transposed. */
template <int D>
__device__ __forceinline__ void lcu_probs(const float *S, const float *dP, bf16 *P, bf16 *dS, const float *lse_s,
                                          const float *D_s, int qt, int kt, int n, float scale, bool transposed)
{
    typedef lcu_attn_cfg<D> C;
    for (int e = threadIdx.x; e < LCU_AT * LCU_AT; e += blockDim.x) {
        int a = e >> 6, b = e & 63, i = transposed ? b : a, j = transposed ? a : b;
        int kpos = kt * LCU_AT + j, qpos = qt * LCU_AT + i;
        bool ok = kpos <= qpos && qpos < n;
        float pr = ok ? expf(S[a * C::LDS + b] * scale - lse_s[i]) : 0.0f;
        float ds = ok ? pr * (dP[a * C::LDS + b] - D_s[i]) : 0.0f;
        if (P) P[a * C::LDP + b] = __float2bfloat16_rn(pr);
        dS[a * C::LDP + b] = __float2bfloat16_rn(ds);
    }
}

/* acc[jj] += A[16 rows of block mi, 0..64) · B[0..64, 16 columns of block cj]: the warp's
 * share of a [64][D] += [64][64]·[64][D] product (A: stride LDP, B: stride LDQ). */
template <int D>
__device__ __forceinline__ void lcu_acc_product(lcu_acc *acc, const bf16 *A, const bf16 *B, int warp)
{
    typedef lcu_attn_cfg<D> C;
    int mi = warp & 3;
#pragma unroll
    for (int jj = 0; jj < C::NT; jj++) {
        int cj = (warp >> 2) + 2 * jj;
        if (cj >= D / 16) continue;
#pragma unroll
        for (int kk = 0; kk < LCU_AT / 16; kk++) {
            lcu_fa a;
            lcu_fb_row b;
            wmma::load_matrix_sync(a, A + mi * 16 * C::LDP + kk * 16, C::LDP);
            wmma::load_matrix_sync(b, B + kk * 16 * C::LDQ + cj * 16, C::LDQ);
            wmma::mma_sync(acc[jj], a, b, acc[jj]);
        }
    }
}

/* Writes scale·acc (the block's fp32 [64][D] result, staged in shared memory with stride
 * D+4) to dst (row stride `stride`), the first nvalid rows only: the rows after them belong
 * to the next sequence or lie beyond the batch. Starts and ends with a barrier. */
template <int D>
__device__ __forceinline__ void lcu_store_acc(float *dst, long stride, float *stage, lcu_acc *acc, float scale,
                                              int warp, int nvalid)
{
    typedef lcu_attn_cfg<D> C;
    int mi = warp & 3;
    __syncthreads();
#pragma unroll
    for (int jj = 0; jj < C::NT; jj++) {
        int cj = (warp >> 2) + 2 * jj;
        if (cj >= D / 16) continue;
        for (int t = 0; t < acc[jj].num_elements; t++) acc[jj].x[t] *= scale;
        wmma::store_matrix_sync(stage + mi * 16 * (D + 4) + cj * 16, acc[jj], D + 4, wmma::mem_row_major);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < LCU_AT * D; e += blockDim.x) {
        int j = e / D, c = e % D;
        if (j < nvalid) dst[j * stride + c] = stage[j * (D + 4) + c];
    }
    __syncthreads();
}

/* One block per (key tile, kv head): dK = scale·Σ dSᵀ Q, dV = Σ Pᵀ dO over the query heads
 * of the group and the query tiles at or after the key tile. 8 warps; warp w accumulates
 * key rows 16·(w % 4).. and column blocks (w / 4) + 2j. */
template <int D>
__global__ void __launch_bounds__(256) lcu_attn_dkdv_k(lcu_attn_p p, const bf16 *q, const bf16 *k, const bf16 *v,
                                                       const bf16 *dout, const float *lse, const float *Dv,
                                                       float *dk, float *dv)
{
    typedef lcu_attn_cfg<D> C;
    extern __shared__ __align__(128) unsigned char lcu_sm[];
    bf16 *Ks = reinterpret_cast<bf16 *>(lcu_sm), *Vs = Ks + LCU_AT * C::LDQ, *Qs = Vs + LCU_AT * C::LDQ,
         *dOs = Qs + LCU_AT * C::LDQ;
    float *ST = reinterpret_cast<float *>(dOs + LCU_AT * C::LDQ), *dPT = ST + LCU_AT * C::LDS;
    bf16 *PT = reinterpret_cast<bf16 *>(dPT + LCU_AT * C::LDS), *dST = PT + LCU_AT * C::LDP;
    float *lse_s = reinterpret_cast<float *>(dST + LCU_AT * C::LDP), *D_s = lse_s + LCU_AT;

    long tile = blockIdx.x; /* in order: the first key tiles see the most queries */
    if (tile >= p.cum[p.nseq]) return;
    int s = lcu_find_seq(p.cum, p.nseq, (int)tile), kt = (int)tile - p.cum[s];
    int g = blockIdx.y, grp = p.nq / p.nkv;
    long q0 = p.q_start[s], kvstride = (long)p.nkv * D, rk = q0 + (long)kt * LCU_AT;
    int n = p.q_start[s + 1] - (int)q0, kvalid = min(LCU_AT, n - kt * LCU_AT);
    int warp = threadIdx.x >> 5;

    lcu_load_tile<D>(Ks, k + rk * kvstride + (long)g * D, kvstride, kvalid);
    lcu_load_tile<D>(Vs, v + rk * kvstride + (long)g * D, kvstride, kvalid);
    lcu_acc dv_acc[C::NT], dk_acc[C::NT];
#pragma unroll
    for (int j = 0; j < C::NT; j++) {
        wmma::fill_fragment(dv_acc[j], 0.0f);
        wmma::fill_fragment(dk_acc[j], 0.0f);
    }
    for (int hh = 0; hh < grp; hh++) {
        int h = g * grp + hh;
        for (int qt = kt; qt * LCU_AT < n; qt++) {
            __syncthreads(); /* the previous tile's Q, dO, P, dS are consumed */
            lcu_load_q_side<D>(Qs, dOs, lse_s, D_s, p, q, dout, lse, Dv, q0 + (long)qt * LCU_AT, h,
                               min(LCU_AT, n - qt * LCU_AT));
            __syncthreads();
            lcu_scores<D>(ST, dPT, Ks, Qs, Vs, dOs, warp); /* Sᵀ = K Qᵀ, dPᵀ = V dOᵀ */
            __syncthreads();
            lcu_probs<D>(ST, dPT, PT, dST, lse_s, D_s, qt, kt, n, p.scale, true);
            __syncthreads();
            lcu_acc_product<D>(dv_acc, PT, dOs, warp);  /* dV += Pᵀ dO */
            lcu_acc_product<D>(dk_acc, dST, Qs, warp);  /* dK += dSᵀ Q */
        }
    }
    lcu_store_acc<D>(dv + rk * kvstride + (long)g * D, kvstride, ST, dv_acc, 1.0f, warp, kvalid);
    lcu_store_acc<D>(dk + rk * kvstride + (long)g * D, kvstride, ST, dk_acc, p.scale, warp, kvalid);
}

/* One block per (query tile, query head): dQ = scale·Σ dS K over the key tiles up to the
 * diagonal. */
template <int D>
__global__ void __launch_bounds__(256) lcu_attn_dq_k(lcu_attn_p p, const bf16 *q, const bf16 *k, const bf16 *v,
                                                     const bf16 *dout, const float *lse, const float *Dv, float *dq)
{
    typedef lcu_attn_cfg<D> C;
    extern __shared__ __align__(128) unsigned char lcu_sm[];
    bf16 *Qs = reinterpret_cast<bf16 *>(lcu_sm), *dOs = Qs + LCU_AT * C::LDQ, *Ks = dOs + LCU_AT * C::LDQ,
         *Vs = Ks + LCU_AT * C::LDQ;
    float *S = reinterpret_cast<float *>(Vs + LCU_AT * C::LDQ), *dP = S + LCU_AT * C::LDS;
    bf16 *dS = reinterpret_cast<bf16 *>(dP + LCU_AT * C::LDS);
    float *lse_s = reinterpret_cast<float *>(dS + LCU_AT * C::LDP), *D_s = lse_s + LCU_AT;

    long tile = p.ub - 1 - (long)blockIdx.x;
    if (tile >= p.cum[p.nseq]) return;
    int s = lcu_find_seq(p.cum, p.nseq, (int)tile), qt = (int)tile - p.cum[s];
    int h = blockIdx.y, g = h / (p.nq / p.nkv);
    long q0 = p.q_start[s], kvstride = (long)p.nkv * D, r0 = q0 + (long)qt * LCU_AT;
    int n = p.q_start[s + 1] - (int)q0, qvalid = min(LCU_AT, n - qt * LCU_AT);
    int warp = threadIdx.x >> 5;

    lcu_load_q_side<D>(Qs, dOs, lse_s, D_s, p, q, dout, lse, Dv, r0, h, qvalid);
    lcu_acc dq_acc[C::NT];
#pragma unroll
    for (int j = 0; j < C::NT; j++) wmma::fill_fragment(dq_acc[j], 0.0f);
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads(); /* previous K consumed (and Q, dO, lse, D loaded on the first pass) */
        int kvalid = min(LCU_AT, n - kt * LCU_AT);
        lcu_load_tile<D>(Ks, k + (q0 + (long)kt * LCU_AT) * kvstride + (long)g * D, kvstride, kvalid);
        lcu_load_tile<D>(Vs, v + (q0 + (long)kt * LCU_AT) * kvstride + (long)g * D, kvstride, kvalid);
        __syncthreads();
        lcu_scores<D>(S, dP, Qs, Ks, dOs, Vs, warp); /* S = Q Kᵀ, dP = dO Vᵀ */
        __syncthreads();
        lcu_probs<D>(S, dP, NULL, dS, lse_s, D_s, qt, kt, n, p.scale, false);
        __syncthreads();
        lcu_acc_product<D>(dq_acc, dS, Ks, warp); /* dQ += dS K */
    }
    lcu_store_acc<D>(dq + r0 * (long)p.nq * D + (long)h * D, (long)p.nq * D, S, dq_acc, p.scale, warp, qvalid);
}

/* ---- version 2: mma.sync with the operands in registers (FlashAttention-2 style) ---------- */
/* Selected with LCU_ATTN=mma (version 1 stays the default until a GPU run has passed the
 * tests with both and the bench says which is faster). Same tiles, same tile tables, same
 * arithmetic (fp32 softmax, P and dS rounded to bf16, the row sum over the fp32 P), but
 * S, P, dP, dS and the accumulators never leave registers: P and dS become the A operands
 * of the next product directly from the accumulator layout. Every operand is read from
 * shared memory with 32-bit loads of two consecutive bf16, so a product whose k index
 * runs along the rows of a tensor (PV, PᵀdO, dSᵀQ, dS K) reads a transposed copy. */

#define LCU_LDT (LCU_AT + 8) /* stride of transposed tiles [D][64 + 8] */

/* C[16×8] += A[16×16]·B[16×8], bf16 in, fp32 accumulate. Fragments (PTX ISA, mma.m16n8k16;
 * g = lane / 4, t = lane % 4; each register two bf16, the lower k or column in the low half):
 *   A: a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..)
 *   B: b0 (k 2t..2t+1, column g), b1 (k 2t+8..2t+9, column g)
 *   C: c0, c1 (row g, columns 2t, 2t+1), c2, c3 (row g+8, columns 2t, 2t+1) */
__device__ __forceinline__ void lcu_mma(float *c, const uint32_t *a, const uint32_t *b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* A fragment: rows r0..r0+15, k k0..k0+15 of the row-major bf16 array X (stride ld). */
__device__ __forceinline__ void lcu_frag_a(uint32_t *a, const bf16 *X, int ld, int r0, int k0)
{
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const bf16 *p = X + (r0 + g) * ld + k0 + 2 * t;
    a[0] = *reinterpret_cast<const uint32_t *>(p);
    a[1] = *reinterpret_cast<const uint32_t *>(p + 8 * ld);
    a[2] = *reinterpret_cast<const uint32_t *>(p + 8);
    a[3] = *reinterpret_cast<const uint32_t *>(p + 8 * ld + 8);
}

/* B fragment with B(k, n) = Y[n][k]: columns n0..n0+7 are rows of the row-major array Y. */
__device__ __forceinline__ void lcu_frag_b(uint32_t *b, const bf16 *Y, int ld, int n0, int k0)
{
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const bf16 *p = Y + (n0 + g) * ld + k0 + 2 * t;
    b[0] = *reinterpret_cast<const uint32_t *>(p);
    b[1] = *reinterpret_cast<const uint32_t *>(p + 8);
}

__device__ __forceinline__ uint32_t lcu_pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* 64 rows of D bf16 from global into shared memory transposed, dst[c][r] (stride LCU_LDT);
 * zero for rows ≥ nvalid. */
template <int D>
__device__ __forceinline__ void lcu_load_tile_t(bf16 *dst, const bf16 *src, long stride, int nvalid)
{
    constexpr int VPR = D / 8;
    for (int i = threadIdx.x; i < LCU_AT * VPR; i += blockDim.x) {
        int r = i / VPR, c = (i % VPR) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < nvalid) v = *reinterpret_cast<const uint4 *>(src + r * stride + c);
        const bf16 *e = reinterpret_cast<const bf16 *>(&v);
#pragma unroll
        for (int j = 0; j < 8; j++) dst[(c + j) * LCU_LDT + r] = e[j];
    }
}

template <int D> struct lcu_attn2_cfg {
    static constexpr int LDQ = D + 8;
    static constexpr int TILE = LCU_AT * LDQ * 2, TTILE = D * LCU_LDT * 2;
    static constexpr int FWD_SMEM = 2 * TILE + TTILE;
    static constexpr int DKDV_SMEM = 4 * TILE + 2 * TTILE + 2 * LCU_AT * 4;
    static constexpr int DQ_SMEM = 4 * TILE + TTILE + 2 * LCU_AT * 4;
};

/* The warp's 16×(8·NN) blocks S = A1·B1ᵀ and dP = A2·B2ᵀ over D, for B rows n0·8 ..
 * (n0 + NN)·8 − 1 (A1/A2 rows 16·warp.., operands row-major with stride LDQ, k along rows). */
template <int D, int NN>
__device__ __forceinline__ void lcu_scores2(float (*sc)[4], float (*dp)[4], const bf16 *A1, const bf16 *B1,
                                            const bf16 *A2, const bf16 *B2, int warp, int n0)
{
    constexpr int LDQ = lcu_attn2_cfg<D>::LDQ;
#pragma unroll
    for (int nn = 0; nn < NN; nn++)
#pragma unroll
        for (int e = 0; e < 4; e++) sc[nn][e] = dp[nn][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a1[4], a2[4];
        lcu_frag_a(a1, A1, LDQ, warp * 16, kk * 16);
        lcu_frag_a(a2, A2, LDQ, warp * 16, kk * 16);
#pragma unroll
        for (int nn = 0; nn < NN; nn++) {
            uint32_t b[2];
            lcu_frag_b(b, B1, LDQ, (n0 + nn) * 8, kk * 16);
            lcu_mma(sc[nn], a1, b);
            lcu_frag_b(b, B2, LDQ, (n0 + nn) * 8, kk * 16);
            lcu_mma(dp[nn], a2, b);
        }
    }
}

/* One block (4 warps) per (query tile, query head); warp w owns query rows 16w..16w+15,
 * each thread rows g and g+8 of them (the accumulator layout). */
template <int D>
__global__ void __launch_bounds__(128) lcu_attn_fwd2_k(lcu_attn_p p, const bf16 *q, const bf16 *k, const bf16 *v,
                                                       bf16 *out, float *lse)
{
    typedef lcu_attn2_cfg<D> C;
    extern __shared__ __align__(128) unsigned char lcu_sm[];
    bf16 *Qs = reinterpret_cast<bf16 *>(lcu_sm), *Ks = Qs + LCU_AT * C::LDQ, *Vt = Ks + LCU_AT * C::LDQ;

    long tile = p.ub - 1 - (long)blockIdx.x;
    if (tile >= p.cum[p.nseq]) return;
    int s = lcu_find_seq(p.cum, p.nseq, (int)tile), qt = (int)tile - p.cum[s];
    int h = blockIdx.y, kvh = h / (p.nq / p.nkv);
    long q0 = p.q_start[s];
    int q_len = p.q_start[s + 1] - (int)q0;
    long kv0 = p.kv_start ? p.kv_start[s] : q0;
    int kv_len = p.kv_len ? p.kv_len[s] : q_len, q_off = kv_len - q_len;
    int row0 = qt * LCU_AT, nvalid = min(LCU_AT, q_len - row0);
    long qstride = (long)p.nq * D, kvstride = (long)p.nkv * D;

    lcu_load_tile<D>(Qs, q + (q0 + row0) * qstride + (long)h * D, qstride, nvalid);
    __syncthreads();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t qa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) lcu_frag_a(qa[kk], Qs, C::LDQ, warp * 16, kk * 16);
    int row[2] = {row0 + warp * 16 + g, row0 + warp * 16 + g + 8};
    bool ok_row[2] = {row[0] < q_len, row[1] < q_len};
    int pos[2] = {q_off + row[0], q_off + row[1]};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    int kt_end = (q_off + row0 + nvalid - 1) / LCU_AT;
    for (int kt = 0; kt <= kt_end; kt++) {
        __syncthreads();
        int kvalid = min(LCU_AT, kv_len - kt * LCU_AT);
        lcu_load_tile<D>(Ks, k + (kv0 + (long)kt * LCU_AT) * kvstride + (long)kvh * D, kvstride, kvalid);
        lcu_load_tile_t<D>(Vt, v + (kv0 + (long)kt * LCU_AT) * kvstride + (long)kvh * D, kvstride, kvalid);
        __syncthreads();

        float sc[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++) {
            sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t b[2];
                lcu_frag_b(b, Ks, C::LDQ, n * 8, kk * 16);
                lcu_mma(sc[n], qa[kk], b);
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = e >> 1, key = kt * LCU_AT + n * 8 + 2 * t + (e & 1);
                bool ok = ok_row[r] && key <= pos[r]; /* key ≤ pos < kv_len */
                sc[n][e] = ok ? sc[n][e] * p.scale : -INFINITY;
                mx[r] = fmaxf(mx[r], sc[n][e]);
            }
        float mn[2], alpha[2], ls[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(LCU_FULL, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(LCU_FULL, mx[r], 2));
            mn[r] = fmaxf(m[r], mx[r]);
            alpha[r] = mn[r] == -INFINITY ? 1.0f : expf(m[r] - mn[r]);
        }
        uint32_t pa[4][4]; /* P as the A operand of PV, one fragment per 16 keys */
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int hn = 0; hn < 2; hn++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    int n = 2 * j + hn;
                    float p0 = mn[r] == -INFINITY ? 0.0f : expf(sc[n][2 * r] - mn[r]);
                    float p1 = mn[r] == -INFINITY ? 0.0f : expf(sc[n][2 * r + 1] - mn[r]);
                    ls[r] += p0 + p1; /* before rounding, as version 1 */
                    pa[j][hn * 2 + r] = lcu_pack(p0, p1);
                }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            ls[r] += __shfl_xor_sync(LCU_FULL, ls[r], 1);
            ls[r] += __shfl_xor_sync(LCU_FULL, ls[r], 2);
            l[r] = l[r] * alpha[r] + ls[r];
            m[r] = mn[r];
        }
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                uint32_t b[2];
                lcu_frag_b(b, Vt, LCU_LDT, n * 8, j * 16);
                lcu_mma(o[n], pa[j], b);
            }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (!ok_row[r]) continue;
        float inv = 1.0f / l[r];
        bf16 *orow = out + (q0 + row[r]) * qstride + (long)h * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<uint32_t *>(orow + n * 8) = lcu_pack(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        if (t == 0) lse[(q0 + row[r]) * p.nq + h] = m[r] + logf(l[r]);
    }
}

/* dK, dV per (key tile, kv head); warp w owns keys 16w..16w+15. Per query tile the scores
 * are computed transposed (Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, keys as rows), 16 queries at a time. */
template <int D>
__global__ void __launch_bounds__(128) lcu_attn_dkdv2_k(lcu_attn_p p, const bf16 *q, const bf16 *k, const bf16 *v,
                                                        const bf16 *dout, const float *lse, const float *Dv,
                                                        float *dk, float *dv)
{
    typedef lcu_attn2_cfg<D> C;
    extern __shared__ __align__(128) unsigned char lcu_sm[];
    bf16 *Ks = reinterpret_cast<bf16 *>(lcu_sm), *Vs = Ks + LCU_AT * C::LDQ, *Qs = Vs + LCU_AT * C::LDQ,
         *dOs = Qs + LCU_AT * C::LDQ, *Qt = dOs + LCU_AT * C::LDQ, *dOt = Qt + D * LCU_LDT;
    float *lse_s = reinterpret_cast<float *>(dOt + D * LCU_LDT), *D_s = lse_s + LCU_AT;

    long tile = blockIdx.x; /* in order: the first key tiles see the most queries */
    if (tile >= p.cum[p.nseq]) return;
    int s = lcu_find_seq(p.cum, p.nseq, (int)tile), kt = (int)tile - p.cum[s];
    int kvh = blockIdx.y, grp = p.nq / p.nkv;
    long q0 = p.q_start[s], qstride = (long)p.nq * D, kvstride = (long)p.nkv * D, rk = q0 + (long)kt * LCU_AT;
    int n_len = p.q_start[s + 1] - (int)q0, kvalid = min(LCU_AT, n_len - kt * LCU_AT);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int kpos[2] = {kt * LCU_AT + warp * 16 + g, kt * LCU_AT + warp * 16 + g + 8};

    lcu_load_tile<D>(Ks, k + rk * kvstride + (long)kvh * D, kvstride, kvalid);
    lcu_load_tile<D>(Vs, v + rk * kvstride + (long)kvh * D, kvstride, kvalid);
    float dva[D / 8][4], dka[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dva[n][e] = dka[n][e] = 0.0f;

    for (int hh = 0; hh < grp; hh++) {
        int h = kvh * grp + hh;
        for (int qt = kt; qt * LCU_AT < n_len; qt++) {
            __syncthreads(); /* the previous tile is consumed */
            int qvalid = min(LCU_AT, n_len - qt * LCU_AT);
            long r0 = q0 + (long)qt * LCU_AT;
            lcu_load_q_side<D>(Qs, dOs, lse_s, D_s, p, q, dout, lse, Dv, r0, h, qvalid);
            lcu_load_tile_t<D>(Qt, q + r0 * qstride + (long)h * D, qstride, qvalid);
            lcu_load_tile_t<D>(dOt, dout + r0 * qstride + (long)h * D, qstride, qvalid);
            __syncthreads();
            /* 16 queries at a time (one k-tile of the dV/dK products): fewer live registers
             * beside the two D-wide accumulators */
#pragma unroll
            for (int j = 0; j < LCU_AT / 16; j++) {
                float st[2][4], dpt[2][4];
                lcu_scores2<D, 2>(st, dpt, Ks, Qs, Vs, dOs, warp, 2 * j); /* Sᵀ = K Qᵀ, dPᵀ = V dOᵀ */
                uint32_t pa[4], da[4]; /* Pᵀ and dSᵀ as A operands */
#pragma unroll
                for (int hn = 0; hn < 2; hn++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        float pr[2], ds[2];
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            int col = (2 * j + hn) * 8 + 2 * t + e, qpos = qt * LCU_AT + col;
                            bool ok = kpos[r] <= qpos && qpos < n_len;
                            pr[e] = ok ? expf(st[hn][2 * r + e] * p.scale - lse_s[col]) : 0.0f;
                            ds[e] = ok ? pr[e] * (dpt[hn][2 * r + e] - D_s[col]) : 0.0f;
                        }
                        pa[hn * 2 + r] = lcu_pack(pr[0], pr[1]);
                        da[hn * 2 + r] = lcu_pack(ds[0], ds[1]);
                    }
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    uint32_t b[2];
                    lcu_frag_b(b, dOt, LCU_LDT, n * 8, j * 16);
                    lcu_mma(dva[n], pa, b); /* dV += Pᵀ dO */
                    lcu_frag_b(b, Qt, LCU_LDT, n * 8, j * 16);
                    lcu_mma(dka[n], da, b); /* dK += dSᵀ Q */
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int kr = warp * 16 + g + 8 * r;
        if (kr >= kvalid) continue;
        long o = (rk + kr) * kvstride + (long)kvh * D + 2 * t;
        float *dvr = dv + o, *dkr = dk + o;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            *reinterpret_cast<float2 *>(dvr + n * 8) = make_float2(dva[n][2 * r], dva[n][2 * r + 1]);
            *reinterpret_cast<float2 *>(dkr + n * 8) = make_float2(dka[n][2 * r] * p.scale, dka[n][2 * r + 1] * p.scale);
        }
    }
}

/* dQ per (query tile, query head); warp w owns query rows 16w..16w+15. */
template <int D>
__global__ void __launch_bounds__(128) lcu_attn_dq2_k(lcu_attn_p p, const bf16 *q, const bf16 *k, const bf16 *v,
                                                      const bf16 *dout, const float *lse, const float *Dv, float *dq)
{
    typedef lcu_attn2_cfg<D> C;
    extern __shared__ __align__(128) unsigned char lcu_sm[];
    bf16 *Qs = reinterpret_cast<bf16 *>(lcu_sm), *dOs = Qs + LCU_AT * C::LDQ, *Ks = dOs + LCU_AT * C::LDQ,
         *Vs = Ks + LCU_AT * C::LDQ, *Kt = Vs + LCU_AT * C::LDQ;
    float *lse_s = reinterpret_cast<float *>(Kt + D * LCU_LDT), *D_s = lse_s + LCU_AT;

    long tile = p.ub - 1 - (long)blockIdx.x;
    if (tile >= p.cum[p.nseq]) return;
    int s = lcu_find_seq(p.cum, p.nseq, (int)tile), qt = (int)tile - p.cum[s];
    int h = blockIdx.y, kvh = h / (p.nq / p.nkv);
    long q0 = p.q_start[s], qstride = (long)p.nq * D, kvstride = (long)p.nkv * D, r0 = q0 + (long)qt * LCU_AT;
    int n_len = p.q_start[s + 1] - (int)q0, qvalid = min(LCU_AT, n_len - qt * LCU_AT);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int lrow[2] = {warp * 16 + g, warp * 16 + g + 8}, qpos[2] = {qt * LCU_AT + lrow[0], qt * LCU_AT + lrow[1]};

    lcu_load_q_side<D>(Qs, dOs, lse_s, D_s, p, q, dout, lse, Dv, r0, h, qvalid);
    float dqa[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads(); /* previous K, V consumed (and the query side loaded, first time) */
        int kvalid = min(LCU_AT, n_len - kt * LCU_AT);
        const bf16 *ksrc = k + (q0 + (long)kt * LCU_AT) * kvstride + (long)kvh * D;
        lcu_load_tile<D>(Ks, ksrc, kvstride, kvalid);
        lcu_load_tile_t<D>(Kt, ksrc, kvstride, kvalid);
        lcu_load_tile<D>(Vs, v + (q0 + (long)kt * LCU_AT) * kvstride + (long)kvh * D, kvstride, kvalid);
        __syncthreads();
        float lse_r[2] = {lse_s[lrow[0]], lse_s[lrow[1]]}, D_r[2] = {D_s[lrow[0]], D_s[lrow[1]]};
#pragma unroll
        for (int hf = 0; hf < 2; hf++) { /* keys 32·hf .. 32·hf + 31 */
            float sc[4][4], dp[4][4];
            lcu_scores2<D, 4>(sc, dp, Qs, Ks, dOs, Vs, warp, 4 * hf); /* S = Q Kᵀ, dP = dO Vᵀ */
            uint32_t da[2][4]; /* dS as the A operand, 16 keys each */
#pragma unroll
            for (int jj = 0; jj < 2; jj++)
#pragma unroll
                for (int hn = 0; hn < 2; hn++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        int nn = 2 * jj + hn;
                        float ds[2];
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            int kp = kt * LCU_AT + (4 * hf + nn) * 8 + 2 * t + e;
                            bool ok = kp <= qpos[r] && qpos[r] < n_len;
                            float pr = ok ? expf(sc[nn][2 * r + e] * p.scale - lse_r[r]) : 0.0f;
                            ds[e] = ok ? pr * (dp[nn][2 * r + e] - D_r[r]) : 0.0f;
                        }
                        da[jj][hn * 2 + r] = lcu_pack(ds[0], ds[1]);
                    }
#pragma unroll
            for (int jj = 0; jj < 2; jj++)
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    uint32_t b[2];
                    lcu_frag_b(b, Kt, LCU_LDT, n * 8, (2 * hf + jj) * 16);
                    lcu_mma(dqa[n], da[jj], b); /* dQ += dS K */
                }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (lrow[r] >= qvalid) continue;
        float *dqr = dq + (r0 + lrow[r]) * qstride + (long)h * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<float2 *>(dqr + n * 8) = make_float2(dqa[n][2 * r] * p.scale, dqa[n][2 * r + 1] * p.scale);
    }
}

/* ---- host side ---------------------------------------------------------------------------- */

static size_t lcu_attn_cum_bytes(int nseq) { return ((size_t)2 * (nseq + 1) * 4 + 255) / 256 * 256; }

size_t lcu_attn_workspace_bytes(const lcu_attn_desc *a)
{
    return lcu_attn_cum_bytes(a->nseq) + (size_t)a->total_q * a->nq * sizeof(float);
}

static int lcu_attn_check(const lcu_attn_desc *a, void *ws)
{
    if (!a || a->nseq < 0 || a->total_q < 0 || a->nq <= 0 || a->nkv <= 0 || a->nq % a->nkv) return LCU_EINVAL;
    if (a->d != 16 && a->d != 32 && a->d != 64 && a->d != 128) return LCU_EINVAL;
    if (a->total_q > 0 && (!a->q_start || !ws)) return LCU_EINVAL;
    if ((long)a->total_q / LCU_AT + a->nseq >= (1L << 31)) return LCU_EINVAL;
    return 0;
}

/* Runs the tile-count kernel and fills the launch parameters; *ub = blocks along x. */
static int lcu_attn_prepare(const lcu_attn_desc *a, void *ws, bool keys, lcu_attn_p *p, cudaStream_t s)
{
    int32_t *cum_q = (int32_t *)ws, *cum_k = cum_q + a->nseq + 1;
    lcu_attn_prep_k<<<1, 1024, 0, s>>>(a->q_start, a->kv_len, a->nseq, cum_q, cum_k);
    int rc = lcu_launch_status();
    if (rc) return rc;
    p->q_start = a->q_start;
    p->kv_start = a->kv_start;
    p->kv_len = a->kv_len;
    p->cum = keys ? cum_k : cum_q;
    p->nseq = a->nseq;
    p->nq = a->nq;
    p->nkv = a->nkv;
    p->scale = a->scale;
    /* Σ ceil(n_i / 64) ≤ floor(Σ n_i / 64) + nseq (for keys: self-attention, the same n_i) */
    p->ub = a->total_q / LCU_AT + a->nseq;
    return 0;
}

/* LCU_ATTN=mma selects version 2 (see above); anything else version 1. */
static bool lcu_attn_v2(void)
{
    const char *e = getenv("LCU_ATTN");
    return e && strcmp(e, "mma") == 0;
}

template <int D>
static int lcu_attn_fwd_d(const lcu_attn_p *p, const bf16 *q, const bf16 *k, const bf16 *v, bf16 *out, float *lse,
                          cudaStream_t s)
{
    bool v2 = lcu_attn_v2();
    int smem = v2 ? lcu_attn2_cfg<D>::FWD_SMEM : lcu_attn_cfg<D>::FWD_SMEM;
    auto kern = v2 ? lcu_attn_fwd2_k<D> : lcu_attn_fwd_k<D>;
    int rc = (int)cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (rc) return rc;
    kern<<<dim3((unsigned)p->ub, p->nq), 128, smem, s>>>(*p, q, k, v, out, lse);
    return lcu_launch_status();
}

int lcu_attn_fwd(const lcu_attn_desc *a, const lcu_bf16 *q, const lcu_bf16 *k, const lcu_bf16 *v, lcu_bf16 *out,
                 float *lse, void *ws, cudaStream_t s)
{
    int rc = lcu_attn_check(a, ws);
    if (rc) return rc;
    if (a->total_q == 0 || a->nseq == 0) return 0;
    if (!q || !k || !v || !out || !lse) return LCU_EINVAL;
    lcu_attn_p p;
    rc = lcu_attn_prepare(a, ws, false, &p, s);
    if (rc) return rc;
    const bf16 *Q = (const bf16 *)q, *K = (const bf16 *)k, *V = (const bf16 *)v;
    bf16 *O = (bf16 *)out;
    switch (a->d) {
    case 16: return lcu_attn_fwd_d<16>(&p, Q, K, V, O, lse, s);
    case 32: return lcu_attn_fwd_d<32>(&p, Q, K, V, O, lse, s);
    case 64: return lcu_attn_fwd_d<64>(&p, Q, K, V, O, lse, s);
    default: return lcu_attn_fwd_d<128>(&p, Q, K, V, O, lse, s);
    }
}

template <int D>
static int lcu_attn_bwd_d(const lcu_attn_desc *a, void *ws, const bf16 *q, const bf16 *k, const bf16 *v,
                          const bf16 *dout, const float *lse, const float *Dv, float *dq, float *dk, float *dv,
                          cudaStream_t s)
{
    lcu_attn_p pk, pq;
    int rc = lcu_attn_prepare(a, ws, true, &pk, s);
    if (rc) return rc;
    pq = pk;
    pq.cum = (const int32_t *)ws; /* query tiles */
    bool v2 = lcu_attn_v2();
    int threads = v2 ? 128 : 256;
    int smem_kv = v2 ? lcu_attn2_cfg<D>::DKDV_SMEM : lcu_attn_cfg<D>::DKDV_SMEM;
    int smem_q = v2 ? lcu_attn2_cfg<D>::DQ_SMEM : lcu_attn_cfg<D>::DQ_SMEM;
    auto kv_kern = v2 ? lcu_attn_dkdv2_k<D> : lcu_attn_dkdv_k<D>;
    auto q_kern = v2 ? lcu_attn_dq2_k<D> : lcu_attn_dq_k<D>;
    rc = (int)cudaFuncSetAttribute(kv_kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_kv);
    if (!rc) rc = (int)cudaFuncSetAttribute(q_kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_q);
    if (rc) return rc;
    kv_kern<<<dim3((unsigned)pk.ub, a->nkv), threads, smem_kv, s>>>(pk, q, k, v, dout, lse, Dv, dk, dv);
    rc = lcu_launch_status();
    if (rc) return rc;
    q_kern<<<dim3((unsigned)pq.ub, a->nq), threads, smem_q, s>>>(pq, q, k, v, dout, lse, Dv, dq);
    return lcu_launch_status();
}

int lcu_attn_bwd(const lcu_attn_desc *a, const lcu_bf16 *q, const lcu_bf16 *k, const lcu_bf16 *v,
                 const lcu_bf16 *out, const float *lse, const lcu_bf16 *dout, float *dq, float *dk, float *dv,
                 void *ws, cudaStream_t s)
{
    int rc = lcu_attn_check(a, ws);
    if (rc) return rc;
    if (a->kv_start || a->kv_len) return LCU_EINVAL; /* self-attention only */
    if (a->total_q == 0 || a->nseq == 0) return 0;
    if (!q || !k || !v || !out || !lse || !dout || !dq || !dk || !dv) return LCU_EINVAL;
    float *Dv = (float *)((char *)ws + lcu_attn_cum_bytes(a->nseq));
    long n = a->total_q * a->nq;
    lcu_attn_bwd_pre_k<<<lcu_blocks(n, 256), 256, 0, s>>>((const bf16 *)out, (const bf16 *)dout, Dv, n, a->d);
    rc = lcu_launch_status();
    if (rc) return rc;
    const bf16 *Q = (const bf16 *)q, *K = (const bf16 *)k, *V = (const bf16 *)v, *dO = (const bf16 *)dout;
    switch (a->d) {
    case 16: return lcu_attn_bwd_d<16>(a, ws, Q, K, V, dO, lse, Dv, dq, dk, dv, s);
    case 32: return lcu_attn_bwd_d<32>(a, ws, Q, K, V, dO, lse, Dv, dq, dk, dv, s);
    case 64: return lcu_attn_bwd_d<64>(a, ws, Q, K, V, dO, lse, Dv, dq, dk, dv, s);
    default: return lcu_attn_bwd_d<128>(a, ws, Q, K, V, dO, lse, Dv, dq, dk, dv, s);
    }
}
