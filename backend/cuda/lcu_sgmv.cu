/* lcu_sgmv.cu — LoRA version 2: the products of every segment of a call in one launch per
 * product (SGMV style), instead of version 1's cuBLASLt calls per segment and product
 * (lcu_lora.cu). With 32 adapters in a pass, version 1 issues 32 × 7 small GEMMs per module
 * and layer (launch-bound); this issues 2 launches for the forward and 5 for the backward,
 * whatever the number of adapters.
 *
 * One kernel, a segmented GEMM: C = alpha·op(A)·op(B) (+ C), bf16 inputs, fp32 tensor-core
 * accumulation (WMMA 16×16×16), fp32 or bf16 output, with a table of items (one per
 * segment: its pointers, sizes and strides) passed by value as the kernel parameter. Every
 * 64×64 output tile is computed by one block with a fixed K order, so
 *   - runs are bitwise reproducible, and a segment's results do not depend on the other
 *     segments of the call (packed == alone, bit for bit, as version 1);
 *   - segments sharing an adapter (the same gA/gB) must not run in one launch: the
 *     gradient products go in waves (wave w holds the w-th segment of each adapter), so each
 *     accumulator sees its segments in segment order, as in version 1.
 * It is not bitwise equal to version 1 (cuBLASLt orders its K loop differently): both are
 * checked against the same fp64 products (tests/gpu/test_gpu_lora.c runs both).
 *
 * The products per segment (rows = the segment's rows, r its rank; row-major everywhere):
 *   forward   z  = x·Aᵀ          [rows×r],   K = in     (z bf16)
 *             y += scale·z·Bᵀ    [rows×out], K = r
 *   backward  z  = x·Aᵀ (recomputed)
 *             gB += scale·dyᵀ·z  [out×r],    K = rows   (waves)
 *             dz = scale·dy·B    [rows×r],   K = out    (dz bf16)
 *             gA += dzᵀ·x        [r×in],     K = rows   (waves)
 *             dx += dz·A         [rows×in],  K = r
 * The same kernel is the grouped GEMM of a mixture-of-experts layer (lcu_grouped_gemm): one
 * item per expert, its rows of the grouped activations against its own weights.
 * Correct-first: scalar loads into shared memory, no double buffering.
 *
 * Split-K (the LoRA products; not the experts' grouped GEMM, which has no scratch): an item
 * whose output has few tiles and whose K is long (z = x·Aᵀ and dz = dy·B: rows × r outputs
 * over K = 4096; gA, gB over K = rows) has its K range cut into `splits` chunks, each a
 * block writing its fp32 partial tile to the context's scratch; a second kernel sums the
 * partials in split order (fixed: deterministic), applies alpha and the output's dtype and
 * accumulation. The first GPU run measured the unsplit kernel at ~1.5 ms a module whatever
 * the adapters: one segment of 512 rows has 8 tiles for its 4096-long K, 8 blocks on 132
 * SMs. The split count depends on the item's own m, n, k only, so a segment's result still
 * does not depend on the other segments.
 */
#include <mma.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/lcu_common.cuh"
#include "backend/cuda/lcu_sgmv.cuh"

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

enum { SG_BM = 64, SG_BN = 64, SG_BK = 32, SG_THREADS = 128, SG_MAX = 32 };
enum { SG_LDA = SG_BK + 8, SG_LDB = SG_BN + 8, SG_LDC = SG_BN + 4 }; /* wmma: ld multiple of 8 (bf16) / 4 (fp32) */

typedef struct {
    const bf16 *a, *b;
    void *c;
    int m, n, k;
    int lda, ldb, ldc;
    float alpha;
    int tiles_n;  /* ceil(n / SG_BN) */
    int tile_end; /* first block of the next item (a running sum over the table: tiles × splits) */
    int splits;   /* K chunks (1: the tile's whole K, written straight to c) */
    int kchunk;   /* K per chunk, a multiple of SG_BK */
    float *part;  /* splits > 1: [splits][m][n] fp32 partial sums (the context's scratch) */
} sg_item;

typedef struct {
    int count;
    sg_item it[SG_MAX];
} sg_table; /* ~2 KiB: well inside the 4 KiB of kernel parameters */

template <bool TA, bool TB, typename OutT, bool ACC>
__global__ void __launch_bounds__(SG_THREADS) lcu_sgmv_k(const __grid_constant__ sg_table t)
{
    __shared__ __align__(128) bf16 As[SG_BM * SG_LDA]; /* op(A) tile, [m][k] */
    __shared__ __align__(128) bf16 Bs[SG_BK * SG_LDB]; /* op(B) tile, [k][n] */
    __shared__ __align__(128) float Cs[SG_BM * SG_LDC];
    int item = 0;
    while (item < t.count - 1 && (int)blockIdx.x >= t.it[item].tile_end) item++;
    const sg_item &g = t.it[item];
    int local = (int)blockIdx.x - (item ? t.it[item - 1].tile_end : 0);
    int split = local % g.splits, tile = local / g.splits;
    int m0 = tile / g.tiles_n * SG_BM, n0 = tile % g.tiles_n * SG_BN;
    int kb = split * g.kchunk, ke = min(g.k, kb + g.kchunk);
    int mv = min(SG_BM, g.m - m0), nv = min(SG_BN, g.n - n0);
    int warp = threadIdx.x >> 5, wm = (warp >> 1) * 32, wn = (warp & 1) * 32;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    const bf16 zero = __float2bfloat16_rn(0.0f);
    for (int k0 = kb; k0 < ke; k0 += SG_BK) {
        int kv = min(SG_BK, ke - k0);
        /* op(A)[i][kk]: A[i][kk] (lda per row of m), or A[kk][i] when transposed; the
         * fastest-moving index follows memory so that a warp reads consecutive elements */
        for (int e = threadIdx.x; e < SG_BM * SG_BK; e += SG_THREADS) {
            int i = TA ? e % SG_BM : e / SG_BK, kk = TA ? e / SG_BM : e % SG_BK;
            bf16 v = zero;
            if (i < mv && kk < kv)
                v = TA ? g.a[(long)(k0 + kk) * g.lda + m0 + i] : g.a[(long)(m0 + i) * g.lda + k0 + kk];
            As[i * SG_LDA + kk] = v;
        }
        /* op(B)[kk][j]: B[kk][j], or B[j][kk] when transposed */
        for (int e = threadIdx.x; e < SG_BK * SG_BN; e += SG_THREADS) {
            int kk = TB ? e % SG_BK : e / SG_BN, j = TB ? e / SG_BK : e % SG_BN;
            bf16 v = zero;
            if (j < nv && kk < kv)
                v = TB ? g.b[(long)(n0 + j) * g.ldb + k0 + kk] : g.b[(long)(k0 + kk) * g.ldb + n0 + j];
            Bs[kk * SG_LDB + j] = v;
        }
        __syncthreads();
        for (int ks = 0; ks < SG_BK; ks += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb[2];
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], As + (wm + 16 * i) * SG_LDA + ks, SG_LDA);
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], Bs + ks * SG_LDB + wn + 16 * j, SG_LDB);
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads(); /* the tiles are overwritten by the next K step */
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(Cs + (wm + 16 * i) * SG_LDC + wn + 16 * j, acc[i][j], SG_LDC, wmma::mem_row_major);
    __syncthreads();
    if (g.splits > 1) { /* this chunk's partial tile; lcu_sgmv_reduce_k finishes the item */
        float *p = g.part + (size_t)split * g.m * g.n;
        for (int e = threadIdx.x; e < SG_BM * SG_BN; e += SG_THREADS) {
            int i = e / SG_BN, j = e % SG_BN;
            if (i < mv && j < nv) p[(long)(m0 + i) * g.n + n0 + j] = Cs[i * SG_LDC + j];
        }
        return;
    }
    OutT *c = (OutT *)g.c;
    for (int e = threadIdx.x; e < SG_BM * SG_BN; e += SG_THREADS) {
        int i = e / SG_BN, j = e % SG_BN;
        if (i >= mv || j >= nv) continue;
        long at = (long)(m0 + i) * g.ldc + n0 + j;
        float v = g.alpha * Cs[i * SG_LDC + j];
        if (ACC) v += lcu_ld(c, at);
        lcu_st(c, at, v);
    }
}

/* The split items of a table: c (=, or += when ACC) alpha · Σ_split partials, summed in
 * split order. Grid: blocks over the elements × one row of blocks per item. */
template <typename OutT, bool ACC>
__global__ void __launch_bounds__(256) lcu_sgmv_reduce_k(const __grid_constant__ sg_table t)
{
    const sg_item &g = t.it[blockIdx.y];
    if (g.splits <= 1) return;
    long mn = (long)g.m * g.n;
    OutT *c = (OutT *)g.c;
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < mn; e += (long)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int p = 0; p < g.splits; p++) s += g.part[p * mn + e];
        long at = e / g.n * g.ldc + e % g.n;
        float v = g.alpha * s;
        if (ACC) v += lcu_ld(c, at);
        lcu_st(c, at, v);
    }
}

/* A table filled item by item and launched when full or flushed. */
typedef struct {
    sg_table t;
    int tiles;                 /* blocks of the main kernel */
    bool ta, tb, acc, bf16_out;
    cudaStream_t s;
    int rc;
    lcu_ctx *ctx;              /* NULL: no split-K (no scratch) */
    size_t part_off[SG_MAX];   /* each split item's partials, in floats from the scratch's start */
    size_t part_floats;
    long max_mn;               /* the largest m·n of a split item */
} sg_batch;

/* K chunks for an item of `tiles` output tiles over k: none unless k is long (≥ 512), at
 * most 16, and no more than bring the item to ~256 blocks; chunks are whole SG_BK steps.
 * Version 3 (lcu_sgmv3.cu) splits by the same rule. */
static_assert((int)SG_BK == (int)LCU_SGMV_KSTEP, "split-K chunks are whole K steps");
int lcu_sgmv_splits(long tiles, long k, int *kchunk)
{
    long s = k >= 512 ? k / 256 : 1, cap = 256 / (tiles > 0 ? tiles : 1);
    if (s > 16) s = 16;
    if (s > cap) s = cap;
    if (s < 1) s = 1;
    long kc = (k + s - 1) / s;
    kc = (kc + SG_BK - 1) / SG_BK * SG_BK;
    *kchunk = (int)kc;
    return (int)((k + kc - 1) / kc);
}

static void sg_flush(sg_batch *b)
{
    if (b->rc || !b->t.count) return;
    if (b->part_floats) { /* the split items' partials in the context's scratch */
        void *base = NULL;
        b->rc = lcu_ctx_splitk_scratch(b->ctx, b->part_floats * sizeof(float), &base);
        if (b->rc) return;
        for (int i = 0; i < b->t.count; i++)
            if (b->t.it[i].splits > 1) b->t.it[i].part = (float *)base + b->part_off[i];
    }
#define SG_GO(TA, TB, OT, AC) lcu_sgmv_k<TA, TB, OT, AC><<<b->tiles, SG_THREADS, 0, b->s>>>(b->t)
    /* the five (transpose, output) combinations the LoRA products use */
    if (!b->ta && b->tb && b->bf16_out && !b->acc) SG_GO(false, true, bf16, false);        /* z = x·Aᵀ */
    else if (!b->ta && b->tb && !b->bf16_out && b->acc) SG_GO(false, true, float, true);   /* y += z·Bᵀ */
    else if (b->ta && !b->tb && !b->bf16_out && b->acc) SG_GO(true, false, float, true);   /* gB, gA */
    else if (!b->ta && !b->tb && b->bf16_out && !b->acc) SG_GO(false, false, bf16, false); /* dz = dy·B */
    else if (!b->ta && !b->tb && !b->bf16_out && b->acc) SG_GO(false, false, float, true); /* dx += dz·A */
    /* the experts' grouped GEMMs (lcu_grouped_gemm) */
    else if (!b->ta && b->tb && !b->bf16_out && !b->acc) SG_GO(false, true, float, false);  /* g = x·W_gᵀ */
    else if (!b->ta && !b->tb && !b->bf16_out && !b->acc) SG_GO(false, false, float, false); /* dh = dy·W_d */
    else b->rc = LCU_EINVAL;
#undef SG_GO
    if (!b->rc) b->rc = lcu_launch_status();
    if (!b->rc && b->part_floats) {
        long per = (b->max_mn + 255) / 256;
        dim3 grid((unsigned)(per < 1024 ? per : 1024), (unsigned)b->t.count);
        if (b->bf16_out && !b->acc) lcu_sgmv_reduce_k<bf16, false><<<grid, 256, 0, b->s>>>(b->t);
        else if (!b->bf16_out && b->acc) lcu_sgmv_reduce_k<float, true><<<grid, 256, 0, b->s>>>(b->t);
        else if (!b->bf16_out && !b->acc) lcu_sgmv_reduce_k<float, false><<<grid, 256, 0, b->s>>>(b->t);
        else b->rc = LCU_EINVAL;
        if (!b->rc) b->rc = lcu_launch_status();
    }
    b->t.count = 0;
    b->tiles = 0;
    b->part_floats = 0;
    b->max_mn = 0;
}

static void sg_begin(sg_batch *b, lcu_ctx *ctx, bool ta, bool tb, bool bf16_out, bool acc, cudaStream_t s)
{
    memset(&b->t, 0, sizeof b->t);
    b->tiles = 0;
    b->ctx = ctx;
    b->part_floats = 0;
    b->max_mn = 0;
    b->ta = ta;
    b->tb = tb;
    b->bf16_out = bf16_out;
    b->acc = acc;
    b->s = s;
    b->rc = 0;
}

static void sg_add(sg_batch *b, const void *a, long lda, const void *bb, long ldb, void *c, long ldc, long m, long n,
                   long k, float alpha)
{
    if (b->rc || m <= 0 || n <= 0 || k <= 0) return; /* an empty segment: version 1 skips it too */
    long tiles_n = (n + SG_BN - 1) / SG_BN, tiles = (m + SG_BM - 1) / SG_BM * tiles_n;
    if (lda > INT32_MAX || ldb > INT32_MAX || ldc > INT32_MAX || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX ||
        tiles > INT32_MAX / 2) {
        b->rc = LCU_EINVAL;
        return;
    }
    int kchunk = (int)k, splits = b->ctx ? lcu_sgmv_splits(tiles, k, &kchunk) : 1;
    long blocks = tiles * splits;
    if (b->t.count == SG_MAX || (long)b->tiles + blocks > INT32_MAX) sg_flush(b);
    int at = b->t.count++;
    sg_item *it = &b->t.it[at];
    *it = (sg_item){(const bf16 *)a, (const bf16 *)bb, c, (int)m, (int)n, (int)k, (int)lda, (int)ldb, (int)ldc,
                    alpha, (int)tiles_n, 0, splits, kchunk, NULL};
    if (splits > 1) {
        b->part_off[at] = b->part_floats;
        b->part_floats += (size_t)splits * m * n;
        if (m * n > b->max_mn) b->max_mn = m * n;
    }
    b->tiles += (int)blocks;
    it->tile_end = b->tiles;
}

/* z = x·Aᵀ for every segment (forward, and recomputed in the backward). */
static int sg_z(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, const lcu_bf16 *x, long ldx, lcu_bf16 *z,
                long ldz, cudaStream_t s)
{
    sg_batch b;
    sg_begin(&b, c, false, true, true, false, s);
    for (int i = 0; i < nseg; i++) {
        const lcu_lora_seg *g = &segs[i];
        sg_add(&b, x + g->row_begin * ldx, ldx, g->A, in, z + g->row_begin * ldz, ldz, g->row_end - g->row_begin,
               g->rank, in, 1.0f);
    }
    sg_flush(&b);
    return b.rc;
}

int lcu_sgmv_lora_fwd(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x, long ldx,
                      float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s)
{
    int rc = sg_z(c, segs, nseg, in, x, ldx, z, ldz, s);
    if (rc) return rc;
    sg_batch b;
    sg_begin(&b, c, false, true, false, true, s);
    for (int i = 0; i < nseg; i++) {
        const lcu_lora_seg *g = &segs[i];
        sg_add(&b, z + g->row_begin * ldz, ldz, g->B, g->rank, y + g->row_begin * ldy, ldy, g->row_end - g->row_begin,
               out, g->rank, g->scale);
    }
    sg_flush(&b);
    return b.rc;
}

/* The wave of each segment: how many earlier segments of the call accumulate into the same
 * gradients (the same adapter). Returns the number of waves. */
static int sg_waves(const lcu_lora_seg *segs, int nseg, int *wave)
{
    int waves = 0;
    for (int i = 0; i < nseg; i++) {
        wave[i] = 0;
        for (int j = 0; j < i; j++)
            if (segs[j].gA == segs[i].gA || segs[j].gB == segs[i].gB) wave[i] = max(wave[i], wave[j] + 1);
        waves = max(waves, wave[i] + 1);
    }
    return waves;
}

int lcu_sgmv_lora_bwd(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x, long ldx,
                      const lcu_bf16 *dy, long lddy, float *dx, long lddx, lcu_bf16 *z, lcu_bf16 *dz, long ldz,
                      cudaStream_t s)
{
    int *wave = (int *)malloc((size_t)(nseg > 0 ? nseg : 1) * sizeof(int));
    if (!wave) return LCU_EINVAL;
    int waves = sg_waves(segs, nseg, wave);
    int rc = sg_z(c, segs, nseg, in, x, ldx, z, ldz, s);
    sg_batch b;
    for (int w = 0; w < waves && !rc; w++) { /* gB += scale·dyᵀ·z */
        sg_begin(&b, c, true, false, false, true, s);
        for (int i = 0; i < nseg; i++) {
            const lcu_lora_seg *g = &segs[i];
            if (wave[i] == w)
                sg_add(&b, dy + g->row_begin * lddy, lddy, z + g->row_begin * ldz, ldz, g->gB, g->rank, out, g->rank,
                       g->row_end - g->row_begin, g->scale);
        }
        sg_flush(&b);
        rc = b.rc;
    }
    if (!rc) { /* dz = scale·dy·B */
        sg_begin(&b, c, false, false, true, false, s);
        for (int i = 0; i < nseg; i++) {
            const lcu_lora_seg *g = &segs[i];
            sg_add(&b, dy + g->row_begin * lddy, lddy, g->B, g->rank, dz + g->row_begin * ldz, ldz,
                   g->row_end - g->row_begin, g->rank, out, g->scale);
        }
        sg_flush(&b);
        rc = b.rc;
    }
    for (int w = 0; w < waves && !rc; w++) { /* gA += dzᵀ·x */
        sg_begin(&b, c, true, false, false, true, s);
        for (int i = 0; i < nseg; i++) {
            const lcu_lora_seg *g = &segs[i];
            if (wave[i] == w)
                sg_add(&b, dz + g->row_begin * ldz, ldz, x + g->row_begin * ldx, ldx, g->gA, in, g->rank, in,
                       g->row_end - g->row_begin, 1.0f);
        }
        sg_flush(&b);
        rc = b.rc;
    }
    if (!rc && dx) { /* dx += dz·A */
        sg_begin(&b, c, false, false, false, true, s);
        for (int i = 0; i < nseg; i++) {
            const lcu_lora_seg *g = &segs[i];
            sg_add(&b, dz + g->row_begin * ldz, ldz, g->A, in, dx + g->row_begin * lddx, lddx,
                   g->row_end - g->row_begin, in, g->rank, 1.0f);
        }
        sg_flush(&b);
        rc = b.rc;
    }
    free(wave);
    return rc;
}

/* ---- grouped GEMM: the experts of a mixture-of-experts layer (cuda_ops.h) -------------- */

int lcu_grouped_gemm(const lcu_group_item *items, int n, bool ta, bool tb, lcu_dtype ct, bool acc, cudaStream_t s)
{
    if (n < 0 || (n > 0 && !items) || (ct != LCU_F32 && ct != LCU_BF16)) return LCU_EINVAL;
    sg_batch b;
    sg_begin(&b, NULL, ta, tb, ct == LCU_BF16, acc, s);
    for (int i = 0; i < n; i++) {
        const lcu_group_item *g = &items[i];
        sg_add(&b, g->A, g->lda, g->B, g->ldb, g->C, g->ldc, g->M, g->N, g->K, g->alpha);
    }
    sg_flush(&b);
    return b.rc;
}
