/* lcu_sgmv3.cu — LoRA version 3 (LCU_LORA=sgmv3): the products of every segment of a call
 * in a few launches, like version 2 (lcu_sgmv.cu), with kernels built for where version 2
 * lost its time on the GPU windows (bench/cuda/WINDOWS.md: 3–7× its floor at 1–32
 * adapters, ~47 µs a module in decode):
 *
 *   - the tiled kernel (every shape): 16-byte loads, each operand kept in shared memory in
 *     its memory layout (WMMA's column-major fragments read the transposed ones; version 2
 *     transposed element by element), the next K step's tiles loaded into registers while
 *     the tensor cores work on the current one, float4 epilogues, and a tile height that
 *     follows the item (16, 32 or 64 rows: a 16-row segment no longer fills a 64-row tile);
 *   - two kernels for segments of at most 16 rows (decode: a few samples per adapter;
 *     training with many adapters), in the manner of Punica's BGMV: the shrink
 *     z = x·Aᵀ splits the input dimension across the 256 threads of a block (each reads
 *     8 values of x and of 4 rows of A per step) and sums the partials by warp butterflies
 *     and then warps in order; the expand y += s·z·Bᵀ (and dx += dz·A) gives each thread 4
 *     output columns and every row of the segment, z staged in shared memory. No split-K,
 *     no scratch: one launch each;
 *   - the backward's two gradient products in one launch (gB += s·dyᵀ·z and gA += dzᵀ·x
 *     have the same transposes and output), after dz.
 *
 * Why not cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx, cuBLAS ≥ 12.5; the project's
 * rule is NVIDIA's libraries first where they fit): with CUBLAS_COMPUTE_32F it takes bf16
 * inputs only with a bf16 output (CUDA_R_16BF → CUDA_R_16BF; fp32 C only with fp32 inputs),
 * so it fits the two bf16 products (z, dz) and none of the four that accumulate into fp32
 * (y, dx, gA, gB: the residual stream and the gradient accumulators stay fp32), and its
 * matrix pointers are device arrays, which a decode graph would have to capture from host
 * memory that every module's call rewrites. The tables here are kernel parameters, captured
 * by value.
 *
 * Determinism, and packed == alone: every output element is written by one thread after a
 * fixed-order sum (a tile's K loop in order; split-K partials summed in split order by a
 * second kernel; the shrink's lanes, warps and steps in a fixed pattern); which kernel, tile
 * height and split count an item gets depends on its own m, n, k, alignment and
 * LCU_SGMV3_SMALL only, so a segment's result does not depend on the other segments of the
 * call. Segments sharing an adapter's gradients go in waves, as in version 2. Not bitwise
 * equal to versions 1 or 2; tests/gpu/test_gpu_lora.c holds all three to the same fp64
 * products.
 *
 * The products per segment (rows = the segment's rows, r its rank; C = alpha·op(A)·op(B),
 * row-major): z = x·Aᵀ (bf16); y += scale·z·Bᵀ; gB += scale·dyᵀ·z; dz = scale·dy·B (bf16);
 * gA += dzᵀ·x; dx += dz·A — the operands exactly as in lcu_sgmv.cu.
 *
 * LCU_SGMV3_SMALL (read per call, 0–16, default 16): the largest segment that takes the
 * small kernels (0: the tiled kernel for everything), for measuring one against the other.
 */
#include <mma.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "backend/cuda/lcu_common.cuh"
#include "backend/cuda/lcu_sgmv.cuh"

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

enum { V3_BN = 64, V3_BK = 32, V3_THREADS = 128, V3_MAX = 48 };
static_assert((int)V3_BK == (int)LCU_SGMV_KSTEP, "split-K chunks are whole K steps (lcu_sgmv_splits)");
enum { V3_SMALL = 16, V3_JB = 4, V3_SHRINK_THREADS = 256, V3_EXPAND_THREADS = 128, V3_EXPAND_KC = 64 };
enum { V3_EXPAND_COLS = 4 * V3_EXPAND_THREADS }; /* output columns of one expand block */
enum { V3_VA = 1, V3_VB = 2, V3_VC = 4 };         /* item flags: vector loads of A, B, vector C */

typedef struct {
    const bf16 *a, *b;
    void *c;
    float *part;   /* splits > 1: [splits][m][round4(n)] fp32 partials in the context's scratch */
    int m, n, k;
    int lda, ldb, ldc;
    float alpha;
    int tiles_n;   /* tiled kernel: ceil(n / V3_BN) */
    int splits;    /* tiled kernel: K chunks (1: the whole K, written straight to c) */
    int kchunk;    /* tiled kernel: K per chunk, a multiple of V3_BK */
    int blk_end;   /* first block of the next item (a running sum over the table) */
    unsigned flags;
} v3_item;

typedef struct {
    int count;
    v3_item it[V3_MAX];
} v3_table;
static_assert(sizeof(v3_table) <= 4000, "a table is one kernel parameter (4 KiB at most)");

/* The item of this block: the first whose blk_end is past it. */
__device__ __forceinline__ int v3_find(const v3_table &t, int *local)
{
    int i = 0;
    while (i < t.count - 1 && (int)blockIdx.x >= t.it[i].blk_end) i++;
    *local = (int)blockIdx.x - (i ? t.it[i - 1].blk_end : 0);
    return i;
}

/* 8 bf16 from p as one 16-byte value: one load when vec (p 16-byte aligned) and all 8 are
 * inside (lim ≥ 8), else the first lim values and zeros. */
__device__ __forceinline__ uint4 v3_ld8(const bf16 *p, int lim, bool vec)
{
    if (vec && lim >= 8) return __ldg((const uint4 *)p);
    const unsigned short *q = (const unsigned short *)p;
    unsigned h[8];
#pragma unroll
    for (int e = 0; e < 8; e++) h[e] = e < lim ? q[e] : 0u;
    return make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
}

/* The 8 bf16 of a 16-byte value as floats (exact: a bf16 is the high half of a float). */
__device__ __forceinline__ void v3_unpack8(uint4 u, float *f)
{
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        f[2 * e] = __uint_as_float(w[e] << 16);
        f[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
    }
}

/* out[at .. at+4) = alpha·s (+ out when ACC), the first lim of the 4 (lim ≥ 1); one vector
 * access when vec (the row is aligned for it) and all 4 are inside. The products and sums
 * are explicit roundings (no fused multiply-add the compiler might form in one kernel and
 * not in another): every kernel that ends in this gives the same bits for the same sums. */
template <typename OutT, bool ACC>
__device__ __forceinline__ void v3_out4(void *c, long at, int lim, float alpha, float4 s, bool vec)
{
    float v[4] = {__fmul_rn(alpha, s.x), __fmul_rn(alpha, s.y), __fmul_rn(alpha, s.z), __fmul_rn(alpha, s.w)};
    OutT *p = (OutT *)c + at;
    if (vec && lim >= 4) {
        if constexpr (std::is_same<OutT, float>::value) {
            float4 *q = (float4 *)p;
            if (ACC) {
                float4 o = *q;
                v[0] = __fadd_rn(v[0], o.x); v[1] = __fadd_rn(v[1], o.y);
                v[2] = __fadd_rn(v[2], o.z); v[3] = __fadd_rn(v[3], o.w);
            }
            *q = make_float4(v[0], v[1], v[2], v[3]);
        } else {
            __nv_bfloat162 *q = (__nv_bfloat162 *)p;
            if (ACC) {
                float2 o0 = __bfloat1622float2(q[0]), o1 = __bfloat1622float2(q[1]);
                v[0] = __fadd_rn(v[0], o0.x); v[1] = __fadd_rn(v[1], o0.y);
                v[2] = __fadd_rn(v[2], o1.x); v[3] = __fadd_rn(v[3], o1.y);
            }
            q[0] = __floats2bfloat162_rn(v[0], v[1]);
            q[1] = __floats2bfloat162_rn(v[2], v[3]);
        }
        return;
    }
    for (int e = 0; e < 4 && e < lim; e++) {
        float x = v[e];
        if (ACC) x = __fadd_rn(x, lcu_ld(p, e));
        lcu_st(p, e, x);
    }
}

/* ---- the tiled kernel ------------------------------------------------------------------- */

/* A tile of ROWS × COLS bf16 whose COLS run along memory (row stride ld), from g: NV 16-byte
 * vectors per thread into registers (rows from rlim on, columns from clim on are zeros). */
template <int ROWS, int COLS, int NV>
__device__ __forceinline__ void v3_fetch(uint4 (&r)[NV], const bf16 *g, long ld, int rlim, int clim, bool vec)
{
#pragma unroll
    for (int t = 0; t < NV; t++) {
        int v = threadIdx.x + t * V3_THREADS, row = v / (COLS / 8), col = v % (COLS / 8) * 8;
        r[t] = make_uint4(0u, 0u, 0u, 0u);
        if (v < ROWS * COLS / 8 && row < rlim && col < clim) r[t] = v3_ld8(g + (long)row * ld + col, clim - col, vec);
    }
}

/* ... and from the registers into shared memory (row stride lds, a multiple of 8). */
template <int ROWS, int COLS, int NV>
__device__ __forceinline__ void v3_stash(bf16 *s, int lds, const uint4 (&r)[NV])
{
#pragma unroll
    for (int t = 0; t < NV; t++) {
        int v = threadIdx.x + t * V3_THREADS, row = v / (COLS / 8), col = v % (COLS / 8) * 8;
        if (v < ROWS * COLS / 8) *(uint4 *)(s + row * lds + col) = r[t];
    }
}

/* C = alpha·op(A)·op(B) (+ C) for a table of items, one block per BM × 64 output tile and K
 * chunk. 4 warps: 2 × 2 of 32 × 32 (BM 64), 2 × 2 of 16 × 32 (BM 32), 1 × 4 of 16 × 16
 * (BM 16). The shared tiles keep memory's layout: op(A) = A [m][k] row-major or, when TA,
 * A [k][m] read as column-major fragments; op(B) = B [k][n] or, when TB, B [n][k]
 * column-major. */
template <bool TA, bool TB, typename OutT, bool ACC, int BM>
__global__ void __launch_bounds__(V3_THREADS) lcu_sgmv3_tc_k(const __grid_constant__ v3_table t)
{
    constexpr int WN = BM == 16 ? 4 : 2, WM = 4 / WN;    /* warps along n and m */
    constexpr int FM = BM / WM / 16, FN = V3_BN / WN / 16; /* fragments per warp */
    constexpr int AR = TA ? V3_BK : BM, AC = TA ? BM : V3_BK; /* A's tile as in memory */
    constexpr int BR = TB ? V3_BN : V3_BK, BC = TB ? V3_BK : V3_BN;
    constexpr int LDA = AC + 8, LDB = BC + 8, LDC = V3_BN + 4; /* wmma: ld % 8 (bf16), % 4 (fp32) */
    constexpr int NVA = (AR * AC / 8 + V3_THREADS - 1) / V3_THREADS, NVB = (BR * BC / 8 + V3_THREADS - 1) / V3_THREADS;
    typedef typename std::conditional<TA, wmma::col_major, wmma::row_major>::type LayA;
    typedef typename std::conditional<TB, wmma::col_major, wmma::row_major>::type LayB;
    __shared__ __align__(128) bf16 As[AR * LDA];
    __shared__ __align__(128) bf16 Bs[BR * LDB];
    __shared__ __align__(128) float Cs[BM * LDC];

    int local, item = v3_find(t, &local);
    const v3_item &g = t.it[item];
    int split = local % g.splits, tile = local / g.splits;
    int m0 = tile / g.tiles_n * BM, n0 = tile % g.tiles_n * V3_BN;
    int kb = split * g.kchunk, ke = min(g.k, kb + g.kchunk);
    int mv = min(BM, g.m - m0), nv = min(V3_BN, g.n - n0);
    bool va = g.flags & V3_VA, vb = g.flags & V3_VB;
    int warp = threadIdx.x >> 5, wm = warp / WN * (BM / WM), wn = warp % WN * (V3_BN / WN);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    uint4 ra[NVA], rb[NVB];
#define V3_FETCH(k0)                                                                                            \
    do {                                                                                                        \
        int kv_ = ke - (k0);                                                                                    \
        v3_fetch<AR, AC, NVA>(ra, TA ? g.a + (long)(k0) * g.lda + m0 : g.a + (long)m0 * g.lda + (k0), g.lda,    \
                              TA ? kv_ : mv, TA ? mv : kv_, va);                                                \
        v3_fetch<BR, BC, NVB>(rb, TB ? g.b + (long)n0 * g.ldb + (k0) : g.b + (long)(k0) * g.ldb + n0, g.ldb,    \
                              TB ? nv : kv_, TB ? kv_ : nv, vb);                                                \
    } while (0)
    if (kb < ke) V3_FETCH(kb);
    for (int k0 = kb; k0 < ke; k0 += V3_BK) {
        v3_stash<AR, AC, NVA>(As, LDA, ra);
        v3_stash<BR, BC, NVB>(Bs, LDB, rb);
        __syncthreads();
        if (k0 + V3_BK < ke) V3_FETCH(k0 + V3_BK); /* in flight while the tensor cores work */
#pragma unroll
        for (int ks = 0; ks < V3_BK; ks += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LayA> fa[FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LayB> fb[FN];
#pragma unroll
            for (int i = 0; i < FM; i++)
                wmma::load_matrix_sync(fa[i], TA ? As + ks * LDA + wm + 16 * i : As + (wm + 16 * i) * LDA + ks, LDA);
#pragma unroll
            for (int j = 0; j < FN; j++)
                wmma::load_matrix_sync(fb[j], TB ? Bs + (wn + 16 * j) * LDB + ks : Bs + ks * LDB + wn + 16 * j, LDB);
#pragma unroll
            for (int i = 0; i < FM; i++)
#pragma unroll
                for (int j = 0; j < FN; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads(); /* the tiles are overwritten by the next step */
    }
#undef V3_FETCH
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++)
            wmma::store_matrix_sync(Cs + (wm + 16 * i) * LDC + wn + 16 * j, acc[i][j], LDC, wmma::mem_row_major);
    __syncthreads();
    /* 4 columns per thread and step: float4 from Cs, to the partials or the output */
    int ldp = (g.n + 3) & ~3;
    for (int e = threadIdx.x; e < BM * V3_BN / 4; e += V3_THREADS) {
        int i = e / (V3_BN / 4), j = e % (V3_BN / 4) * 4;
        if (i >= mv || j >= nv) continue;
        float4 v = *(const float4 *)(Cs + i * LDC + j);
        if (g.splits > 1) /* this chunk's partial; lcu_sgmv3_reduce_k finishes the item */
            *(float4 *)(g.part + (size_t)split * g.m * ldp + (long)(m0 + i) * ldp + n0 + j) = v;
        else
            v3_out4<OutT, ACC>(g.c, (long)(m0 + i) * g.ldc + n0 + j, nv - j, g.alpha, v, g.flags & V3_VC);
    }
}

/* The split items of a table: c (=, or += when ACC) alpha · Σ_split partials, summed in
 * split order, 4 columns per thread. Grid: blocks over the elements × one row per item. */
template <typename OutT, bool ACC>
__global__ void __launch_bounds__(256) lcu_sgmv3_reduce_k(const __grid_constant__ v3_table t)
{
    const v3_item &g = t.it[blockIdx.y];
    if (g.splits <= 1) return;
    int ldp = (g.n + 3) & ~3, gpr = ldp / 4;
    long groups = (long)g.m * gpr;
    size_t stride = (size_t)g.m * ldp;
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < groups; e += (long)gridDim.x * blockDim.x) {
        long i = e / gpr;
        int j = (int)(e % gpr) * 4;
        const float *p = g.part + i * ldp + j;
        float4 s = *(const float4 *)p;
        for (int q = 1; q < g.splits; q++) {
            float4 u = *(const float4 *)(p + q * stride);
            s.x += u.x; s.y += u.y; s.z += u.z; s.w += u.w;
        }
        v3_out4<OutT, ACC>(g.c, i * g.ldc + j, g.n - j, g.alpha, s, g.flags & V3_VC);
    }
}

/* ---- the small-segment kernels (at most 16 rows) ------------------------------------------ */

/* Shrink: c[i][j] = alpha·Σ_k a[i][k]·b[j][k] (bf16 out) for the m ≤ MT rows of an item, one
 * block per V3_JB columns j (rows of b = the LoRA A). Thread t of the block takes the 8
 * values k = 8t + 2048q, q = 0, 1, ... (16-byte loads of a's rows and b's rows: the host
 * sends only items with k % 8 == 0 and aligned rows); each (i, j) is then summed over the
 * lanes of a warp by a butterfly and over the 8 warps in order: the same bits every run. */
template <int MT>
__global__ void __launch_bounds__(V3_SHRINK_THREADS) lcu_sgmv3_shrink_k(const __grid_constant__ v3_table t)
{
    __shared__ float red[V3_SHRINK_THREADS / 32][MT][V3_JB];
    int local, item = v3_find(t, &local);
    const v3_item &g = t.it[item];
    int j0 = local * V3_JB, nj = min((int)V3_JB, g.n - j0);
    float acc[MT][V3_JB];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int jb = 0; jb < V3_JB; jb++) acc[i][jb] = 0.0f;
    for (int k = threadIdx.x * 8; k < g.k; k += V3_SHRINK_THREADS * 8) {
        float w[V3_JB][8];
#pragma unroll
        for (int jb = 0; jb < V3_JB; jb++) {
            uint4 u = make_uint4(0u, 0u, 0u, 0u);
            if (jb < nj) u = __ldg((const uint4 *)(g.b + (long)(j0 + jb) * g.ldb + k));
            v3_unpack8(u, w[jb]);
        }
#pragma unroll
        for (int i = 0; i < MT; i++) {
            if (i >= g.m) break;
            float xv[8];
            v3_unpack8(__ldg((const uint4 *)(g.a + (long)i * g.lda + k)), xv);
#pragma unroll
            for (int jb = 0; jb < V3_JB; jb++)
#pragma unroll
                for (int e = 0; e < 8; e++) acc[i][jb] = fmaf(xv[e], w[jb][e], acc[i][jb]);
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < MT; i++) {
        if (i >= g.m) break; /* the same for the whole block: every lane shuffles */
#pragma unroll
        for (int jb = 0; jb < V3_JB; jb++) {
            float s = lcu_warp_sum(acc[i][jb]);
            if (lane == 0) red[warp][i][jb] = s;
        }
    }
    __syncthreads();
    if (threadIdx.x < MT * V3_JB) {
        int i = threadIdx.x / V3_JB, jb = threadIdx.x % V3_JB;
        if (i < g.m && jb < nj) {
            float s = red[0][i][jb];
            for (int w = 1; w < V3_SHRINK_THREADS / 32; w++) s += red[w][i][jb];
            ((bf16 *)g.c)[(long)i * g.ldc + j0 + jb] = __float2bfloat16_rn(__fmul_rn(g.alpha, s));
        }
    }
}

/* Expand: c[i][n] += (ACC; else =) alpha·Σ_k a[i][k]·op(b)[k][n] (fp32) for the m ≤ MT rows of an item, K
 * short (the rank); op(b) = b [k][n], or b [n][k] when TB. One block per 512 columns, 4
 * consecutive columns per thread for every row; a's rows staged in shared memory 64 k at a
 * time; each output summed over k in order. */
template <bool TB, bool ACC, int MT>
__global__ void __launch_bounds__(V3_EXPAND_THREADS) lcu_sgmv3_expand_k(const __grid_constant__ v3_table t)
{
    __shared__ float zs[MT][V3_EXPAND_KC];
    int local, item = v3_find(t, &local);
    const v3_item &g = t.it[item];
    int n0 = local * V3_EXPAND_COLS + threadIdx.x * 4, nl = g.n - n0; /* this thread's columns, how many left */
    bool vb = g.flags & V3_VB;
    float acc[MT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[i][c] = 0.0f;
    for (int kc = 0; kc < g.k; kc += V3_EXPAND_KC) {
        int kv = min((int)V3_EXPAND_KC, g.k - kc);
        __syncthreads(); /* the previous chunk is read */
        for (int e = threadIdx.x; e < MT * V3_EXPAND_KC; e += V3_EXPAND_THREADS) {
            int i = e / V3_EXPAND_KC, kk = e % V3_EXPAND_KC;
            zs[i][kk] = i < g.m && kk < kv ? __bfloat162float(g.a[(long)i * g.lda + kc + kk]) : 0.0f;
        }
        __syncthreads();
        if (nl <= 0) continue;
        if (TB) { /* 8 k of each of the 4 rows b[n0 + c] per load */
            for (int kk = 0; kk < kv; kk += 8) {
                float w[4][8];
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    uint4 u = make_uint4(0u, 0u, 0u, 0u);
                    if (c < nl) u = v3_ld8(g.b + (long)(n0 + c) * g.ldb + kc + kk, kv - kk, vb);
                    v3_unpack8(u, w[c]);
                }
                int ev = min(8, kv - kk);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    if (e >= ev) break; /* constant indices into w: it stays in registers */
#pragma unroll
                    for (int i = 0; i < MT; i++) {
                        if (i >= g.m) break;
                        float zv = zs[i][kk + e];
#pragma unroll
                        for (int c = 0; c < 4; c++) acc[i][c] = fmaf(zv, w[c][e], acc[i][c]);
                    }
                }
            }
        } else { /* the 4 columns of row k of b per load */
            for (int kk = 0; kk < kv; kk++) {
                const bf16 *p = g.b + (long)(kc + kk) * g.ldb + n0;
                float w[4];
                if (vb && nl >= 4) {
                    uint2 u = __ldg((const uint2 *)p);
                    w[0] = __uint_as_float(u.x << 16); w[1] = __uint_as_float(u.x & 0xffff0000u);
                    w[2] = __uint_as_float(u.y << 16); w[3] = __uint_as_float(u.y & 0xffff0000u);
                } else {
#pragma unroll
                    for (int c = 0; c < 4; c++) w[c] = c < nl ? __bfloat162float(p[c]) : 0.0f;
                }
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    if (i >= g.m) break;
                    float zv = zs[i][kk];
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[i][c] = fmaf(zv, w[c], acc[i][c]);
                }
            }
        }
    }
    if (nl <= 0) return;
#pragma unroll
    for (int i = 0; i < MT; i++) {
        if (i >= g.m) break;
        v3_out4<float, ACC>(g.c, (long)i * g.ldc + n0, nl, g.alpha, make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]),
                            g.flags & V3_VC);
    }
}

/* ---- host: products, kernel classes, tables ----------------------------------------------- */

/* The five products (transposes, output type, accumulate) of lcu_sgmv.cu's LoRA, and V3_YW,
 * V3_DXW: V3_Y and V3_DX writing their output instead of adding to it (lcu_lora_fwd_into,
 * lcu_lora_bwd_into). */
typedef enum { V3_Z, V3_Y, V3_G, V3_DZ, V3_DX, V3_YW, V3_DXW } v3_prod;

/* A product's item: C = alpha·op(A)·op(B) (+ C), the grouped GEMM's item of cuda_ops.h. */
typedef lcu_group_item v3_op;

/* Which kernel an item takes: the small ones, or the tiled one with 16, 32 or 64-row tiles. */
enum { V3_CL_SMALL, V3_CL_TC16, V3_CL_TC32, V3_CL_TC64, V3_NCLASS };

typedef struct {
    lcu_ctx *ctx;
    cudaStream_t s;
    int small_rows; /* LCU_SGMV3_SMALL */
    int rc;
    v3_table t;
    long blocks;
    size_t part_off[V3_MAX], part_floats;
    long max_groups; /* the largest m·round4(n)/4 of a split item */
    int max_m;
} v3_run;

static bool v3_aligned(const void *p, unsigned bytes) { return (uintptr_t)p % bytes == 0; }
static bool v3_out_bf16(v3_prod p) { return p == V3_Z || p == V3_DZ; }

static int v3_class(const v3_run *R, v3_prod p, const v3_op *o)
{
    /* gB (m = out) and gA (m = r ≤ 64 mostly, a tile with empty rows costs only MMAs) in one
     * launch: both take 64-row tiles */
    if (p == V3_G) return V3_CL_TC64;
    if (o->M <= R->small_rows) {
        if (p == V3_Y || p == V3_YW || p == V3_DX || p == V3_DXW) return V3_CL_SMALL;
        /* the shrink reads 8 values at a time, whole and aligned */
        if (p == V3_Z && o->K % 8 == 0 && o->lda % 8 == 0 && o->ldb % 8 == 0 && v3_aligned(o->A, 16) &&
            v3_aligned(o->B, 16))
            return V3_CL_SMALL;
    }
    return o->M <= 16 ? V3_CL_TC16 : o->M <= 32 ? V3_CL_TC32 : V3_CL_TC64;
}

static void v3_reset(v3_run *R)
{
    R->t.count = 0;
    R->blocks = 0;
    R->part_floats = 0;
    R->max_groups = 0;
    R->max_m = 0;
}

#define V3_TC(TA, TB, OT, AC)                                                                                    \
    do {                                                                                                         \
        if (bm == 16) lcu_sgmv3_tc_k<TA, TB, OT, AC, 16><<<grid, V3_THREADS, 0, R->s>>>(R->t);                  \
        else if (bm == 32) lcu_sgmv3_tc_k<TA, TB, OT, AC, 32><<<grid, V3_THREADS, 0, R->s>>>(R->t);             \
        else lcu_sgmv3_tc_k<TA, TB, OT, AC, 64><<<grid, V3_THREADS, 0, R->s>>>(R->t);                           \
    } while (0)

#define V3_MT(THREADS, KERNEL, ...)                                                                              \
    do {                                                                                                         \
        if (R->max_m <= 4) KERNEL<__VA_ARGS__ 4><<<grid, THREADS, 0, R->s>>>(R->t);                              \
        else if (R->max_m <= 8) KERNEL<__VA_ARGS__ 8><<<grid, THREADS, 0, R->s>>>(R->t);                         \
        else KERNEL<__VA_ARGS__ 16><<<grid, THREADS, 0, R->s>>>(R->t);                                           \
    } while (0)

/* Launches the table (one class of one product) and, for its split items, the reduction. */
static void v3_flush(v3_run *R, v3_prod p, int cls)
{
    if (R->rc || !R->t.count) return;
    if (R->part_floats) {
        void *base = NULL;
        R->rc = lcu_ctx_splitk_scratch(R->ctx, R->part_floats * sizeof(float), &base);
        if (R->rc) return;
        for (int i = 0; i < R->t.count; i++)
            if (R->t.it[i].splits > 1) R->t.it[i].part = (float *)base + R->part_off[i];
    }
    unsigned grid = (unsigned)R->blocks;
    if (cls == V3_CL_SMALL) { /* MT: the rows the kernel has registers for (the results do not depend on it) */
        if (p == V3_Z) V3_MT(V3_SHRINK_THREADS, lcu_sgmv3_shrink_k, );
        else if (p == V3_Y) V3_MT(V3_EXPAND_THREADS, lcu_sgmv3_expand_k, true, true, );
        else if (p == V3_YW) V3_MT(V3_EXPAND_THREADS, lcu_sgmv3_expand_k, true, false, );
        else if (p == V3_DXW) V3_MT(V3_EXPAND_THREADS, lcu_sgmv3_expand_k, false, false, );
        else V3_MT(V3_EXPAND_THREADS, lcu_sgmv3_expand_k, false, true, );
    } else {
        int bm = cls == V3_CL_TC16 ? 16 : cls == V3_CL_TC32 ? 32 : 64;
        switch (p) {
        case V3_Z: V3_TC(false, true, bf16, false); break;   /* z = x·Aᵀ */
        case V3_Y: V3_TC(false, true, float, true); break;   /* y += z·Bᵀ */
        case V3_G: V3_TC(true, false, float, true); break;   /* gB, gA */
        case V3_DZ: V3_TC(false, false, bf16, false); break; /* dz = dy·B */
        case V3_DX: V3_TC(false, false, float, true); break; /* dx += dz·A */
        case V3_YW: V3_TC(false, true, float, false); break; /* y = z·Bᵀ */
        case V3_DXW: V3_TC(false, false, float, false); break; /* dx = dz·A */
        }
    }
    R->rc = lcu_launch_status();
    if (!R->rc && R->part_floats) {
        long per = (R->max_groups + 255) / 256;
        dim3 rg((unsigned)(per < 1024 ? per : 1024), (unsigned)R->t.count);
        if (v3_out_bf16(p)) lcu_sgmv3_reduce_k<bf16, false><<<rg, 256, 0, R->s>>>(R->t);
        else if (p == V3_YW || p == V3_DXW) lcu_sgmv3_reduce_k<float, false><<<rg, 256, 0, R->s>>>(R->t);
        else lcu_sgmv3_reduce_k<float, true><<<rg, 256, 0, R->s>>>(R->t);
        R->rc = lcu_launch_status();
    }
    v3_reset(R);
}
#undef V3_TC
#undef V3_MT

static void v3_add(v3_run *R, v3_prod p, int cls, const v3_op *o)
{
    if (R->rc) return;
    if (o->lda > INT32_MAX || o->ldb > INT32_MAX || o->ldc > INT32_MAX || o->M > INT32_MAX || o->N > INT32_MAX ||
        o->K > INT32_MAX) {
        R->rc = LCU_EINVAL;
        return;
    }
    v3_item it;
    memset(&it, 0, sizeof it);
    it.a = (const bf16 *)o->A;
    it.b = (const bf16 *)o->B;
    it.c = o->C;
    it.m = (int)o->M;
    it.n = (int)o->N;
    it.k = (int)o->K;
    it.lda = (int)o->lda;
    it.ldb = (int)o->ldb;
    it.ldc = (int)o->ldc;
    it.alpha = o->alpha;
    it.splits = 1;
    it.kchunk = (int)o->K;
    bool bf16_out = v3_out_bf16(p);
    /* a vector C: float4 rows (fp32) or 4 bf16 (8 bytes) */
    if (o->ldc % 4 == 0 && v3_aligned(o->C, bf16_out ? 8 : 16)) it.flags |= V3_VC;
    long blocks;
    if (cls == V3_CL_SMALL) {
        if (p == V3_Z) blocks = (o->N + V3_JB - 1) / V3_JB;
        else {
            blocks = (o->N + V3_EXPAND_COLS - 1) / V3_EXPAND_COLS;
            /* y's B [n][k]: 16-byte runs along k; dx's A [k][n]: 8-byte runs of 4 columns */
            if (p == V3_Y || p == V3_YW ? o->ldb % 8 == 0 && v3_aligned(o->B, 16)
                                        : o->ldb % 4 == 0 && v3_aligned(o->B, 8))
                it.flags |= V3_VB;
        }
    } else {
        int bm = cls == V3_CL_TC16 ? 16 : cls == V3_CL_TC32 ? 32 : 64;
        long tiles_n = (o->N + V3_BN - 1) / V3_BN, tiles = (o->M + bm - 1) / bm * tiles_n;
        if (o->lda % 8 == 0 && v3_aligned(o->A, 16)) it.flags |= V3_VA;
        if (o->ldb % 8 == 0 && v3_aligned(o->B, 16)) it.flags |= V3_VB;
        it.tiles_n = (int)tiles_n;
        it.splits = lcu_sgmv_splits(tiles, o->K, &it.kchunk); /* version 2's rule, over these tiles */
        blocks = tiles * it.splits;
    }
    if (blocks > INT32_MAX / 2) {
        R->rc = LCU_EINVAL;
        return;
    }
    if (R->t.count == V3_MAX || R->blocks + blocks > INT32_MAX / 2) v3_flush(R, p, cls);
    if (R->rc) return;
    int at = R->t.count++;
    if (it.splits > 1) {
        long ldp = (o->N + 3) & ~3L;
        R->part_off[at] = R->part_floats;
        R->part_floats += (size_t)it.splits * o->M * ldp;
        if (o->M * ldp / 4 > R->max_groups) R->max_groups = o->M * ldp / 4;
    }
    if (it.m > R->max_m) R->max_m = it.m;
    R->blocks += blocks;
    it.blk_end = (int)R->blocks;
    R->t.it[at] = it;
}

/* One product over a list of items: each class in its own launches, items in list order. */
static int v3_product(v3_run *R, v3_prod p, const v3_op *ops, int n)
{
    for (int cls = 0; cls < V3_NCLASS && !R->rc; cls++) {
        v3_reset(R);
        for (int i = 0; i < n && !R->rc; i++) {
            const v3_op *o = &ops[i];
            if (o->M <= 0 || o->N <= 0 || o->K <= 0) continue; /* an empty segment: skipped, as version 1 does */
            if (v3_class(R, p, o) == cls) v3_add(R, p, cls, o);
        }
        v3_flush(R, p, cls);
    }
    return R->rc;
}

static void v3_begin(v3_run *R, lcu_ctx *c, cudaStream_t s)
{
    memset(R, 0, sizeof *R);
    R->ctx = c;
    R->s = s;
    const char *e = getenv("LCU_SGMV3_SMALL");
    int v = e && *e ? atoi(e) : V3_SMALL;
    R->small_rows = v < 0 ? 0 : v > V3_SMALL ? V3_SMALL : v;
}

/* z = x·Aᵀ for every segment (forward, and recomputed in the backward). */
static int v3_z(v3_run *R, v3_op *ops, const lcu_lora_seg *segs, int nseg, int in, const lcu_bf16 *x, long ldx,
                lcu_bf16 *z, long ldz)
{
    for (int i = 0; i < nseg; i++) {
        const lcu_lora_seg *g = &segs[i];
        ops[i] = (v3_op){x + g->row_begin * ldx, ldx, g->A, in, z + g->row_begin * ldz, ldz,
                         g->row_end - g->row_begin, g->rank, in, 1.0f};
    }
    return v3_product(R, V3_Z, ops, nseg);
}

/* z = x·Aᵀ, then y += (p = V3_Y) or y = (V3_YW) scale·z·Bᵀ for every segment of every
 * module (its columns y + ycol, z + zcol): each product one table for all of them, items in
 * module order, then segment order. An item's kernel, tile and split depend on the item
 * alone (see the top), so a module's results are those of a call of its own, bit for bit. */
static int v3_fwd_parts(lcu_ctx *c, v3_prod p, bool do_z, bool do_y, const lcu_lora_mod *mods, int nmod, int in,
                        const lcu_bf16 *x, long ldx, float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s)
{
    long total = 0;
    for (int m = 0; m < nmod; m++) total += mods[m].nseg;
    v3_op *ops = (v3_op *)calloc((size_t)(total > 0 ? total : 1), sizeof *ops);
    if (!ops) return LCU_EINVAL;
    v3_run R;
    v3_begin(&R, c, s);
    int n = 0;
    for (int m = 0; m < nmod; m++)
        for (int i = 0; i < mods[m].nseg; i++) {
            const lcu_lora_seg *g = &mods[m].segs[i];
            ops[n++] = (v3_op){x + g->row_begin * ldx, ldx, g->A, in, z + mods[m].zcol + g->row_begin * ldz, ldz,
                               g->row_end - g->row_begin, g->rank, in, 1.0f};
        }
    int rc = do_z ? v3_product(&R, V3_Z, ops, n) : 0;
    if (!rc && do_y) {
        n = 0;
        for (int m = 0; m < nmod; m++)
            for (int i = 0; i < mods[m].nseg; i++) {
                const lcu_lora_seg *g = &mods[m].segs[i];
                ops[n++] = (v3_op){z + mods[m].zcol + g->row_begin * ldz, ldz, g->B, g->rank,
                                   y + mods[m].ycol + g->row_begin * ldy, ldy, g->row_end - g->row_begin,
                                   mods[m].out, g->rank, g->scale};
            }
        rc = v3_product(&R, p, ops, n);
    }
    free(ops);
    return rc;
}

static int v3_fwd(lcu_ctx *c, v3_prod p, const lcu_lora_mod *mods, int nmod, int in, const lcu_bf16 *x, long ldx,
                  float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s)
{
    return v3_fwd_parts(c, p, true, true, mods, nmod, in, x, ldx, y, ldy, z, ldz, s);
}

int lcu_sgmv3_lora_fwd(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x, long ldx,
                       float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s)
{
    lcu_lora_mod m = {segs, nseg, out, 0, 0};
    return v3_fwd(c, V3_Y, &m, 1, in, x, ldx, y, ldy, z, ldz, s);
}

int lcu_sgmv3_lora_fwd_write(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x,
                             long ldx, float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s)
{
    lcu_lora_mod m = {segs, nseg, out, 0, 0};
    return v3_fwd(c, V3_YW, &m, 1, in, x, ldx, y, ldy, z, ldz, s);
}

int lcu_sgmv3_lora_fwd_multi(lcu_ctx *c, const lcu_lora_mod *mods, int nmod, int in, const lcu_bf16 *x, long ldx,
                             float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s)
{
    return v3_fwd(c, V3_Y, mods, nmod, in, x, ldx, y, ldy, z, ldz, s);
}

int lcu_sgmv3_lora_fwd_multi_part(lcu_ctx *c, bool z_part, const lcu_lora_mod *mods, int nmod, int in,
                                  const lcu_bf16 *x, long ldx, float *y, long ldy, lcu_bf16 *z, long ldz,
                                  cudaStream_t s)
{
    return v3_fwd_parts(c, V3_Y, z_part, !z_part, mods, nmod, in, x, ldx, y, ldy, z, ldz, s);
}

/* The wave of each segment: how many earlier segments of the call accumulate into the same
 * gradients (the same adapter). Returns the number of waves. (As lcu_sgmv.cu.) */
static int v3_waves(const lcu_lora_seg *segs, int nseg, int *wave)
{
    int waves = 0;
    for (int i = 0; i < nseg; i++) {
        wave[i] = 0;
        for (int j = 0; j < i; j++)
            if ((segs[j].gA == segs[i].gA || segs[j].gB == segs[i].gB) && wave[j] + 1 > wave[i]) wave[i] = wave[j] + 1;
        if (wave[i] + 1 > waves) waves = wave[i] + 1;
    }
    return waves;
}

/* The backward; dx += (dxp = V3_DX) or = (V3_DXW) dz·A. */
static int v3_bwd(lcu_ctx *c, v3_prod dxp, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x,
                  long ldx, const lcu_bf16 *dy, long lddy, float *dx, long lddx, lcu_bf16 *z, lcu_bf16 *dz, long ldz,
                  cudaStream_t s)
{
    size_t n1 = (size_t)(nseg > 0 ? nseg : 1);
    v3_op *ops = (v3_op *)calloc(2 * n1, sizeof *ops); /* calloc: gcc cannot see every item written before it is read */
    int *wave = (int *)malloc(n1 * sizeof *wave);
    if (!ops || !wave) {
        free(ops);
        free(wave);
        return LCU_EINVAL;
    }
    int waves = v3_waves(segs, nseg, wave);
    v3_run R;
    v3_begin(&R, c, s);
    int rc = v3_z(&R, ops, segs, nseg, in, x, ldx, z, ldz);
    if (!rc) { /* dz = scale·dy·B */
        for (int i = 0; i < nseg; i++) {
            const lcu_lora_seg *g = &segs[i];
            ops[i] = (v3_op){dy + g->row_begin * lddy, lddy, g->B, g->rank, dz + g->row_begin * ldz, ldz,
                             g->row_end - g->row_begin, g->rank, out, g->scale};
        }
        rc = v3_product(&R, V3_DZ, ops, nseg);
    }
    for (int w = 0; w < waves && !rc; w++) { /* gB += scale·dyᵀ·z and gA += dzᵀ·x, one adapter at most once a wave */
        int n = 0;
        for (int i = 0; i < nseg; i++) {
            const lcu_lora_seg *g = &segs[i];
            if (wave[i] != w) continue;
            long rows = g->row_end - g->row_begin;
            ops[n++] = (v3_op){dy + g->row_begin * lddy, lddy, z + g->row_begin * ldz, ldz, g->gB, g->rank, out,
                               g->rank, rows, g->scale};
            ops[n++] = (v3_op){dz + g->row_begin * ldz, ldz, x + g->row_begin * ldx, ldx, g->gA, in, g->rank, in, rows,
                               1.0f};
        }
        rc = v3_product(&R, V3_G, ops, n);
    }
    if (!rc && dx) { /* dx += (or =) dz·A */
        for (int i = 0; i < nseg; i++) {
            const lcu_lora_seg *g = &segs[i];
            ops[i] = (v3_op){dz + g->row_begin * ldz, ldz, g->A, in, dx + g->row_begin * lddx, lddx,
                             g->row_end - g->row_begin, in, g->rank, 1.0f};
        }
        rc = v3_product(&R, dxp, ops, nseg);
    }
    free(ops);
    free(wave);
    return rc;
}

int lcu_sgmv3_lora_bwd(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x, long ldx,
                       const lcu_bf16 *dy, long lddy, float *dx, long lddx, lcu_bf16 *z, lcu_bf16 *dz, long ldz,
                       cudaStream_t s)
{
    return v3_bwd(c, V3_DX, segs, nseg, in, out, x, ldx, dy, lddy, dx, lddx, z, dz, ldz, s);
}

int lcu_sgmv3_lora_bwd_write(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x,
                             long ldx, const lcu_bf16 *dy, long lddy, float *dx, long lddx, lcu_bf16 *z, lcu_bf16 *dz,
                             long ldz, cudaStream_t s)
{
    return v3_bwd(c, V3_DXW, segs, nseg, in, out, x, ldx, dy, lddy, dx, lddx, z, dz, ldz, s);
}
