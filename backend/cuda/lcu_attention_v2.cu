/* lcu_attention_v2.cu — attention kernels, version 2: mma.sync with the operands in
 * registers (FlashAttention-2 style).
 *
 * Selected with LCU_ATTN=mma. Both passed on the first GPU run (an H200, 2026-11-26), where
 * this one was no faster than version 1 at model level, so version 1 stays the own kernels'
 * default (cuDNN's fused attention runs training passes where it loads). Same tiles, same tile tables, same
 * arithmetic (fp32 softmax, P and dS rounded to bf16, the row sum over the fp32 P), but
 * S, P, dP, dS and the accumulators never leave registers: P and dS become the A operands
 * of the next product directly from the accumulator layout. Every operand is read from
 * shared memory with 32-bit loads of two consecutive bf16, so a product whose k index
 * runs along the rows of a tensor (PV, PᵀdO, dSᵀQ, dS K) reads a transposed copy.
 */
#include "backend/cuda/lcu_attention.cuh"

#include <math.h>

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
    static constexpr int LDQ = LCU_LDQ(D);
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

/* ---- the version's kernels, for lcu_attention.cu to launch --------------------------------- */

template <int D> static lcu_attn_kernels lcu_attn_v2_at()
{
    typedef lcu_attn2_cfg<D> C;
    return {lcu_attn_fwd2_k<D>, lcu_attn_dkdv2_k<D>, lcu_attn_dq2_k<D>, C::FWD_SMEM, C::DKDV_SMEM, C::DQ_SMEM, 128};
}

lcu_attn_kernels lcu_attn_v2_kernels(int d)
{
    switch (d) {
    case 16: return lcu_attn_v2_at<16>();
    case 32: return lcu_attn_v2_at<32>();
    case 64: return lcu_attn_v2_at<64>();
    default: return lcu_attn_v2_at<128>();
    }
}
