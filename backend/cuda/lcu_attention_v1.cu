/* lcu_attention_v1.cu — attention kernels, version 1: simple and checkable (the default;
 * lcu_attention.cu has what both versions share and chooses).
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
 * Backward: one block per (key tile, kv head) for dK, dV and one per (query tile, query
 * head) for dQ, as lcu_attention.cu describes.
 */
#include "backend/cuda/lcu_attention.cuh"

#include <math.h>
#include <mma.h>

using namespace nvcuda;

template <int D> struct lcu_attn_cfg {
    static constexpr int LDQ = LCU_LDQ(D);     /* bf16 tiles [64][LDQ] (Q, K, V, dO) */
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

/* ---- the version's kernels, for lcu_attention.cu to launch --------------------------------- */

template <int D> static lcu_attn_kernels lcu_attn_v1_at()
{
    typedef lcu_attn_cfg<D> C;
    return {lcu_attn_fwd_k<D>, lcu_attn_dkdv_k<D>, lcu_attn_dq_k<D>, C::FWD_SMEM, C::DKDV_SMEM, C::DQ_SMEM, 256};
}

lcu_attn_kernels lcu_attn_v1_kernels(int d)
{
    switch (d) {
    case 16: return lcu_attn_v1_at<16>();
    case 32: return lcu_attn_v1_at<32>();
    case 64: return lcu_attn_v1_at<64>();
    default: return lcu_attn_v1_at<128>();
    }
}
