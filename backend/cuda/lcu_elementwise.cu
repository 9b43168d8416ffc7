/* lcu_elementwise.cu — the memory-bound kernels between GEMMs (see cuda_ops.h): dtype
 * conversion, row copies, embedding, residual and bias adds, RMSNorm (also q/k norm),
 * RoPE, SwiGLU. Grid-stride loops, each one pass over its tensors, so the bytes-moved floor
 * in bench/cuda/NOTES.md is the target when tuning. Conversions and SwiGLU take 4 elements
 * an access where the pointers allow (lcu_ld4 / lcu_st4: the same bits as their scalar
 * forms), RoPE divides in 32 bits, RMSNorm's loops keep 4 loads in flight; fusion into the
 * neighbours is what is left.
 */
#include "backend/cuda/lcu_common.cuh"

#include <cuda_fp16.h>

#define LCU_GRID_STRIDE(i, n) \
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

/* Four consecutive values at element 4·i of p, or into it: one 16-byte access for fp32, one
 * 8-byte access for bf16 (the caller checked p's alignment: lcu_aligned4). Each value is
 * converted as lcu_ld / lcu_st would (__floats2bfloat162_rn rounds each half to nearest
 * even), so a kernel's vector and scalar forms give the same bits: the vector form only
 * moves more bytes per instruction (the scalar loops ran these kernels at 25–45 % of the
 * H200's bandwidth in the fourth window's profile). */
__device__ __forceinline__ float4 lcu_ld4(const float *p, long i) { return reinterpret_cast<const float4 *>(p)[i]; }
__device__ __forceinline__ float4 lcu_ld4(const __nv_bfloat16 *p, long i)
{
    uint2 u = reinterpret_cast<const uint2 *>(p)[i];
    float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.x));
    float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void lcu_st4(float *p, long i, float4 v) { reinterpret_cast<float4 *>(p)[i] = v; }
__device__ __forceinline__ void lcu_st4(__nv_bfloat16 *p, long i, float4 v)
{
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    reinterpret_cast<uint2 *>(p)[i] = make_uint2(*reinterpret_cast<const unsigned *>(&a),
                                                 *reinterpret_cast<const unsigned *>(&b));
}

/* Whether p can be read or written four elements of `bytes` at a time (lcu_ld4 / lcu_st4). */
static inline bool lcu_aligned4(const void *p, size_t bytes) { return (uintptr_t)p % (4 * bytes) == 0; }
static inline size_t lcu_dtype_bytes(lcu_dtype t) { return t == LCU_F32 ? 4 : 2; }

/* The vector kernels' tail: the n − 4·n4 (< 4) last elements, by the grid's first threads. */
#define LCU_TAIL(t, n4, n) if (long t = 4 * (n4) + blockIdx.x * (long)blockDim.x + threadIdx.x; t < (n))

/* ---- conversion, copies ------------------------------------------------------------------ */

template <typename D, typename S> __global__ void lcu_convert_k(D *dst, const S *src, long n)
{
    LCU_GRID_STRIDE(i, n) lcu_st(dst, i, lcu_ld(src, i));
}

template <typename D, typename S> __global__ void lcu_convert4_k(D *dst, const S *src, long n4, long n)
{
    LCU_GRID_STRIDE(i, n4) lcu_st4(dst, i, lcu_ld4(src, i));
    LCU_TAIL(t, n4, n) lcu_st(dst, t, lcu_ld(src, t));
}

template <typename D> __global__ void lcu_convert_f16_k(D *dst, const __half *src, long n)
{
    LCU_GRID_STRIDE(i, n) lcu_st(dst, i, __half2float(src[i])); /* f16 → f32 is exact */
}

int lcu_convert(void *dst, lcu_dtype dt, const void *src, lcu_dtype st, size_t n, cudaStream_t s)
{
    if ((!dst || !src) && n) return LCU_EINVAL;
    if (n == 0) return 0;
    unsigned g = lcu_blocks((long)n, 256);
    if (st == LCU_F16) {
        LCU_DISPATCH_F32_BF16(dt, D, lcu_convert_f16_k<D><<<g, 256, 0, s>>>((D *)dst, (const __half *)src, (long)n));
        return lcu_launch_status();
    }
    long n4 = (long)n / 4;
    if (n4 > 0 && lcu_aligned4(dst, lcu_dtype_bytes(dt)) && lcu_aligned4(src, lcu_dtype_bytes(st))) {
        unsigned g4 = lcu_blocks(n4, 256);
        LCU_DISPATCH_F32_BF16(dt, D, LCU_DISPATCH_F32_BF16(st, S,
            lcu_convert4_k<D, S><<<g4, 256, 0, s>>>((D *)dst, (const S *)src, n4, (long)n)));
        return lcu_launch_status();
    }
    LCU_DISPATCH_F32_BF16(dt, D, LCU_DISPATCH_F32_BF16(st, S,
        lcu_convert_k<D, S><<<g, 256, 0, s>>>((D *)dst, (const S *)src, (long)n)));
    return lcu_launch_status();
}

__global__ void lcu_copy_rows_k(uint32_t *dst, const int64_t *dr, const uint32_t *src, const int64_t *sr, long n,
                                long words)
{
    LCU_GRID_STRIDE(i, n * words) {
        long r = i / words, w = i % words;
        long d = dr ? dr[r] : r, s = sr ? sr[r] : r;
        dst[d * words + w] = src[s * words + w];
    }
}

int lcu_copy_rows(void *dst, const int64_t *dst_rows, const void *src, const int64_t *src_rows, long n,
                  size_t row_bytes, cudaStream_t s)
{
    if (n < 0 || row_bytes % 4 || ((!dst || !src) && n)) return LCU_EINVAL;
    if (n == 0 || row_bytes == 0) return 0;
    long words = (long)(row_bytes / 4);
    lcu_copy_rows_k<<<lcu_blocks(n * words, 256), 256, 0, s>>>((uint32_t *)dst, dst_rows, (const uint32_t *)src,
                                                                src_rows, n, words);
    return lcu_launch_status();
}

/* ---- embedding, adds --------------------------------------------------------------------- */

__global__ void lcu_embed_k(float *x, const __nv_bfloat16 *table, const int32_t *tok, long T, int H)
{
    LCU_GRID_STRIDE(i, T * H) {
        long t = i / H, c = i % H;
        x[i] = __bfloat162float(table[(long)tok[t] * H + c]);
    }
}

int lcu_embed(float *x, const lcu_bf16 *table, const int32_t *tokens, long T, int H, cudaStream_t s)
{
    if (T < 0 || H <= 0 || ((!x || !table || !tokens) && T)) return LCU_EINVAL;
    if (T == 0) return 0;
    lcu_embed_k<<<lcu_blocks(T * H, 256), 256, 0, s>>>(x, (const __nv_bfloat16 *)table, tokens, T, H);
    return lcu_launch_status();
}

__global__ void lcu_add_k(float *y, const float *a, const float *b, long n)
{
    LCU_GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}

int lcu_add(float *y, const float *a, const float *b, long n, cudaStream_t s)
{
    if (n < 0 || ((!y || !a || !b) && n)) return LCU_EINVAL;
    if (n == 0) return 0;
    lcu_add_k<<<lcu_blocks(n, 256), 256, 0, s>>>(y, a, b, n);
    return lcu_launch_status();
}

__global__ void lcu_add_bias_k(float *y, const __nv_bfloat16 *b, long T, int n)
{
    LCU_GRID_STRIDE(i, T * n) y[i] += __bfloat162float(b[i % n]);
}

int lcu_add_bias(float *y, const lcu_bf16 *bias, long T, int n, cudaStream_t s)
{
    if (T < 0 || n <= 0 || ((!y || !bias) && T)) return LCU_EINVAL;
    if (T == 0) return 0;
    lcu_add_bias_k<<<lcu_blocks(T * n, 256), 256, 0, s>>>(y, (const __nv_bfloat16 *)bias, T, n);
    return lcu_launch_status();
}

/* ---- RMSNorm: one warp per row ------------------------------------------------------------ */

/* A row's sums are one warp's (lane l adds elements l, l + 32, ... in that order, then the
 * warp's butterfly), so a row's bits depend on nothing but the row: not on the number of
 * rows, the block shape or the kernel that calls it (the fused decode kernel shares these
 * functions). The fifth GPU window measured the first form, four loads in flight a lane, at
 * ~50 µs for 32 rows of 4,096 (a decode step's norm, against ~1 µs of memory): a chain of 32
 * memory latencies. These load LCU_NORM_U values a lane into registers before adding them in
 * the same order, so the same bits with a quarter of the round trips; and small row counts
 * take one-warp blocks, so that a decode step's 32 rows spread over 32 SMs, not four. */

#define LCU_NORM_WARPS 8
#define LCU_NORM_U 16 /* loads in flight a lane in the sums (registers: 16 floats) */
#define LCU_NORM_UA 8 /* ... in the element-wise passes */

/* Blocks of one warp below this many rows (a decode step, a short prefill), of
 * LCU_NORM_WARPS above (a row a warp either way). */
#define LCU_NORM_SMALL_ROWS 2048

static inline void lcu_norm_grid(long rows, unsigned *g, unsigned *b)
{
    int w = rows < LCU_NORM_SMALL_ROWS ? 1 : LCU_NORM_WARPS;
    *g = lcu_blocks(rows, w);
    *b = 32u * (unsigned)w;
}

/* A row's 1/sqrt(mean(x²) + eps) by one warp, and a normalized value: shared by the norm's
 * kernel and the fused decode kernel (lcu_decode_qkv_k), so both give the same bits. */
__device__ __forceinline__ float lcu_rms_rstd_warp(const float *xr, int dim, double eps, int lane)
{
    float ss = 0.0f;
    int i = lane;
    for (; i + 32 * (LCU_NORM_U - 1) < dim; i += 32 * LCU_NORM_U) {
        float v[LCU_NORM_U];
#pragma unroll
        for (int u = 0; u < LCU_NORM_U; u++) v[u] = xr[i + 32 * u];
#pragma unroll
        for (int u = 0; u < LCU_NORM_U; u++) ss += v[u] * v[u];
    }
#pragma unroll 4 /* the rest (a head's 128: all of it), as the first form */
    for (; i < dim; i += 32) ss += xr[i] * xr[i];
    ss = lcu_warp_sum(ss);
    return (float)(1.0 / sqrt((double)ss / dim + eps));
}

__device__ __forceinline__ float lcu_rms_apply(float x, float rs, __nv_bfloat16 w)
{
    return x * rs * __bfloat162float(w);
}

template <typename Y>
__global__ void lcu_rmsnorm_fwd_k(Y *y, float *rstd, const float *x, const __nv_bfloat16 *w, long rows, int dim,
                                  double eps)
{
    int lane = threadIdx.x & 31;
    long warp = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5, nwarps = ((long)gridDim.x * blockDim.x) >> 5;
    for (long r = warp; r < rows; r += nwarps) {
        const float *xr = x + r * dim;
        float rs = lcu_rms_rstd_warp(xr, dim, eps, lane);
        if (lane == 0 && rstd) rstd[r] = rs;
        for (int i0 = lane; i0 < dim; i0 += 32 * LCU_NORM_UA) {
            float xv[LCU_NORM_UA];
            __nv_bfloat16 wv[LCU_NORM_UA];
#pragma unroll
            for (int u = 0; u < LCU_NORM_UA; u++)
                if (i0 + 32 * u < dim) xv[u] = xr[i0 + 32 * u], wv[u] = w[i0 + 32 * u];
#pragma unroll
            for (int u = 0; u < LCU_NORM_UA; u++)
                if (i0 + 32 * u < dim) lcu_st(y, r * dim + i0 + 32 * u, lcu_rms_apply(xv[u], rs, wv[u]));
        }
    }
}

int lcu_rmsnorm_fwd(void *y, lcu_dtype yt, float *rstd, const float *x, const lcu_bf16 *w, long rows, int dim,
                    double eps, cudaStream_t s)
{
    if (rows < 0 || dim <= 0 || ((!y || !x || !w) && rows)) return LCU_EINVAL;
    if (rows == 0) return 0;
    unsigned g, b;
    lcu_norm_grid(rows, &g, &b);
    LCU_DISPATCH_F32_BF16(yt, Y,
        lcu_rmsnorm_fwd_k<Y><<<g, b, 0, s>>>((Y *)y, rstd, x, (const __nv_bfloat16 *)w, rows, dim, eps));
    return lcu_launch_status();
}

/* A lane reads dy[i] before writing dx[i] for the same i (a chunk's loads all come before its
 * stores), so dx may alias dy. */
template <typename DX, typename DY>
__global__ void lcu_rmsnorm_bwd_k(DX *dx, const DY *dy, const float *x, const float *rstd, const __nv_bfloat16 *w,
                                  long rows, int dim, bool acc)
{
    int lane = threadIdx.x & 31;
    long warp = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5, nwarps = ((long)gridDim.x * blockDim.x) >> 5;
    for (long r = warp; r < rows; r += nwarps) {
        const float *xr = x + r * dim;
        float dot = 0.0f;
        int i = lane;
        for (; i + 32 * (LCU_NORM_UA - 1) < dim; i += 32 * LCU_NORM_UA) {
            float gv[LCU_NORM_UA], wv[LCU_NORM_UA], xv[LCU_NORM_UA];
#pragma unroll
            for (int u = 0; u < LCU_NORM_UA; u++)
                gv[u] = lcu_ld(dy, r * dim + i + 32 * u), wv[u] = __bfloat162float(w[i + 32 * u]),
                xv[u] = xr[i + 32 * u];
#pragma unroll
            for (int u = 0; u < LCU_NORM_UA; u++) dot += gv[u] * wv[u] * xv[u];
        }
#pragma unroll 4
        for (; i < dim; i += 32) dot += lcu_ld(dy, r * dim + i) * __bfloat162float(w[i]) * xr[i];
        dot = lcu_warp_sum(dot);
        float rs = rstd[r];
        float c = (float)((double)dot * rs * rs / dim);
        for (int i0 = lane; i0 < dim; i0 += 32 * LCU_NORM_UA) {
            float gv[LCU_NORM_UA], wv[LCU_NORM_UA], xv[LCU_NORM_UA], av[LCU_NORM_UA];
#pragma unroll
            for (int u = 0; u < LCU_NORM_UA; u++)
                if (i0 + 32 * u < dim) {
                    long j = r * dim + i0 + 32 * u;
                    gv[u] = lcu_ld(dy, j), wv[u] = __bfloat162float(w[i0 + 32 * u]), xv[u] = xr[i0 + 32 * u];
                    av[u] = acc ? lcu_ld(dx, j) : 0.0f;
                }
#pragma unroll
            for (int u = 0; u < LCU_NORM_UA; u++)
                if (i0 + 32 * u < dim) {
                    float v = rs * (gv[u] * wv[u] - xv[u] * c);
                    if (acc) v += av[u];
                    lcu_st(dx, r * dim + i0 + 32 * u, v);
                }
        }
    }
}

int lcu_rmsnorm_bwd(void *dx, lcu_dtype dxt, const void *dy, lcu_dtype dyt, const float *x, const float *rstd,
                    const lcu_bf16 *w, long rows, int dim, bool accumulate, cudaStream_t s)
{
    if (rows < 0 || dim <= 0 || ((!dx || !dy || !x || !rstd || !w) && rows)) return LCU_EINVAL;
    if (accumulate && dxt != LCU_F32) return LCU_EINVAL;
    if (dx == dy && dxt != dyt) return LCU_EINVAL;
    if (rows == 0) return 0;
    unsigned g, b;
    lcu_norm_grid(rows, &g, &b);
    LCU_DISPATCH_F32_BF16(dxt, DX, LCU_DISPATCH_F32_BF16(dyt, DY,
        lcu_rmsnorm_bwd_k<DX, DY><<<g, b, 0, s>>>((DX *)dx, (const DY *)dy, x, rstd, (const __nv_bfloat16 *)w, rows,
                                                 dim, accumulate)));
    return lcu_launch_status();
}

/* ---- RoPE -------------------------------------------------------------------------------- */

typedef struct {
    double inv[256];
} lcu_inv_freq;

__global__ void lcu_rope_table_k(float *cos_t, float *sin_t, lcu_inv_freq f, int half, int max_pos)
{
    LCU_GRID_STRIDE(i, (long)max_pos * half) {
        /* angles in double: pos·θ reaches 10⁴–10⁵ rad, where fp32 would lose ~1e-3 rad */
        double a = (double)(i / half) * f.inv[i % half];
        cos_t[i] = (float)cos(a);
        sin_t[i] = (float)sin(a);
    }
}

int lcu_rope_table(float *cos_t, float *sin_t, const double *inv_freq, int half, int max_pos, cudaStream_t s)
{
    if (half <= 0 || half > 256 || max_pos < 0 || !inv_freq || ((!cos_t || !sin_t) && max_pos)) return LCU_EINVAL;
    if (max_pos == 0) return 0;
    lcu_inv_freq f;
    for (int i = 0; i < half; i++) f.inv[i] = inv_freq[i];
    lcu_rope_table_k<<<lcu_blocks((long)max_pos * half, 256), 256, 0, s>>>(cos_t, sin_t, f, half, max_pos);
    return lcu_launch_status();
}

/* One RoPE pair rotated, shared by lcu_rope_k and lcu_decode_qkv_k. Each product and the
 * sum rounded on its own (no contraction into an FMA, whose one rounding the compiler could
 * choose differently in two kernels): the two kernels give the same bits, and the CPU
 * backend's C does the same operations. */
__device__ __forceinline__ void lcu_rope_rot(float x1, float x2, float c, float sn, float *o1, float *o2)
{
    *o1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sn));
    *o2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sn));
}

/* One thread per rotated pair (i, i + d/2): it reads both before writing, so out may
 * alias in. I: the index type of the divisions, 32-bit when the pairs fit (64-bit division
 * takes several times the instructions of a 32-bit one, in a kernel that does little else). */
template <typename O, typename I>
__global__ void lcu_rope_k(O *out, const float *in, I n, int nh, int d, const int32_t *pos, const float *cos_t,
                           const float *sin_t, bool inverse)
{
    I half = (I)(d / 2);
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I row = i / half; /* t·nh + h */
        int j = (int)(i % half);
        long t = (long)(row / (I)nh), base = (long)row * d;
        long p = (long)pos[t] * half + j;
        float c = cos_t[p], sn = inverse ? -sin_t[p] : sin_t[p];
        float o1, o2;
        lcu_rope_rot(in[base + j], in[base + j + half], c, sn, &o1, &o2);
        lcu_st(out, base + j, o1);
        lcu_st(out, base + j + half, o2);
    }
}

int lcu_rope(void *out, lcu_dtype ot, const float *in, long T, int nh, int d, const int32_t *pos,
             const float *cos_t, const float *sin_t, bool inverse, cudaStream_t s)
{
    if (T < 0 || nh <= 0 || d <= 0 || d % 2 || ((!out || !in || !pos || !cos_t || !sin_t) && T)) return LCU_EINVAL;
    if (out == (const void *)in && ot != LCU_F32) return LCU_EINVAL;
    if (T == 0) return 0;
    long n = T * nh * (d / 2);
    unsigned g = lcu_blocks(n, 256);
    if (n <= INT32_MAX) /* i + the grid's stride stays within 32 bits */
        LCU_DISPATCH_F32_BF16(ot, O,
            lcu_rope_k<O, unsigned><<<g, 256, 0, s>>>((O *)out, in, (unsigned)n, nh, d, pos, cos_t, sin_t, inverse));
    else
        LCU_DISPATCH_F32_BF16(ot, O, lcu_rope_k<O, long><<<g, 256, 0, s>>>((O *)out, in, n, nh, d, pos, cos_t, sin_t,
                                                                           inverse));
    return lcu_launch_status();
}

/* ---- a decode pass's q, k, v after their projections, in one kernel ------------------------ */

/* One warp per (row, head) of q, k and v: q/k RMSNorm (norm weights given) and RoPE, or v's
 * rounding; q to its rows, k and v to the caches' rows kv_dst[t]. The norm and the rotation
 * are lcu_rmsnorm_fwd_k's and lcu_rope_k's device functions, so the values are theirs. */
__global__ void lcu_decode_qkv_k(__nv_bfloat16 *q, __nv_bfloat16 *kc, __nv_bfloat16 *vc, const int64_t *kv_dst,
                                 const float *q_pre, long ldq, const float *k_pre, long ldk, const float *v, long ldv,
                                 const __nv_bfloat16 *qn, const __nv_bfloat16 *kn, long T, int nq, int nkv, int d,
                                 double eps, const int32_t *pos, const float *cos_t, const float *sin_t)
{
    int lane = threadIdx.x & 31, nh = nq + 2 * nkv, half = d / 2;
    long warp = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5, nwarps = ((long)gridDim.x * blockDim.x) >> 5;
    for (long w = warp; w < T * nh; w += nwarps) {
        long t = w / nh, row = kv_dst ? kv_dst[t] : t;
        int h = (int)(w % nh);
        if (h >= nq + nkv) { /* v: rounded into its cache row */
            int hv = h - nq - nkv;
            const float *src = v + t * ldv + (long)hv * d;
            __nv_bfloat16 *dst = vc + (row * nkv + hv) * d;
            for (int i = lane; i < d; i += 32) dst[i] = __float2bfloat16_rn(src[i]);
            continue;
        }
        bool isq = h < nq;
        int hh = isq ? h : h - nq;
        const float *xr = isq ? q_pre + t * ldq + (long)hh * d : k_pre + t * ldk + (long)hh * d;
        const __nv_bfloat16 *wn = isq ? qn : kn;
        __nv_bfloat16 *out = isq ? q + (t * nq + hh) * d : kc + (row * nkv + hh) * d;
        float rs = wn ? lcu_rms_rstd_warp(xr, d, eps, lane) : 1.0f;
        long p0 = (long)pos[t] * half;
        for (int j = lane; j < half; j += 32) {
            float x1 = xr[j], x2 = xr[j + half];
            if (wn) {
                x1 = lcu_rms_apply(x1, rs, wn[j]);
                x2 = lcu_rms_apply(x2, rs, wn[j + half]);
            }
            float o1, o2;
            lcu_rope_rot(x1, x2, cos_t[p0 + j], sin_t[p0 + j], &o1, &o2);
            out[j] = __float2bfloat16_rn(o1);
            out[j + half] = __float2bfloat16_rn(o2);
        }
    }
}

int lcu_decode_qkv(lcu_bf16 *q, lcu_bf16 *k_cache, lcu_bf16 *v_cache, const int64_t *kv_dst, const float *q_pre,
                   long ldq, const float *k_pre, long ldk, const float *v, long ldv, const lcu_bf16 *q_norm,
                   const lcu_bf16 *k_norm, long T, int nq, int nkv, int d, double eps, const int32_t *pos,
                   const float *cos_t, const float *sin_t, cudaStream_t s)
{
    if (T < 0 || nq <= 0 || nkv <= 0 || d <= 0 || d % 2 || !q_norm != !k_norm) return LCU_EINVAL;
    if (ldq < (long)nq * d || ldk < (long)nkv * d || ldv < (long)nkv * d) return LCU_EINVAL;
    if (T > 0 && (!q || !k_cache || !v_cache || !q_pre || !k_pre || !v || !pos || !cos_t || !sin_t)) return LCU_EINVAL;
    if (T == 0) return 0;
    long warps = T * (nq + 2 * nkv);
    lcu_decode_qkv_k<<<lcu_blocks(warps, LCU_NORM_WARPS), 32 * LCU_NORM_WARPS, 0, s>>>(
        (__nv_bfloat16 *)q, (__nv_bfloat16 *)k_cache, (__nv_bfloat16 *)v_cache, kv_dst, q_pre, ldq, k_pre, ldk, v, ldv,
        (const __nv_bfloat16 *)q_norm, (const __nv_bfloat16 *)k_norm, T, nq, nkv, d, eps, pos, cos_t, sin_t);
    return lcu_launch_status();
}

/* ---- SwiGLU ------------------------------------------------------------------------------ */

/* silu(g)·u: shared by both SwiGLU forwards, so they give the same bits */
__device__ __forceinline__ float lcu_silu_mul(float x, float u) { return x / (1.0f + expf(-x)) * u; }

template <typename H> __global__ void lcu_swiglu_fwd_k(H *h, const float *g, const float *u, long n)
{
    LCU_GRID_STRIDE(i, n) lcu_st(h, i, lcu_silu_mul(g[i], u[i]));
}

template <typename H> __global__ void lcu_swiglu_fwd4_k(H *h, const float *g, const float *u, long n4, long n)
{
    LCU_GRID_STRIDE(i, n4) {
        float4 a = lcu_ld4(g, i), b = lcu_ld4(u, i);
        lcu_st4(h, i, make_float4(lcu_silu_mul(a.x, b.x), lcu_silu_mul(a.y, b.y), lcu_silu_mul(a.z, b.z),
                                  lcu_silu_mul(a.w, b.w)));
    }
    LCU_TAIL(t, n4, n) lcu_st(h, t, lcu_silu_mul(g[t], u[t]));
}

/* the same over T rows of I values whose g and u rows are ld apart (one GEMM's [gate | up]) */
__global__ void lcu_swiglu_rows_k(__nv_bfloat16 *h, const float *g, const float *u, long T, int I, long ld)
{
    LCU_GRID_STRIDE(i, T * I) {
        long t = i / I, j = i % I;
        h[i] = __float2bfloat16_rn(lcu_silu_mul(g[t * ld + j], u[t * ld + j]));
    }
}

int lcu_swiglu_rows(lcu_bf16 *h, const float *g, const float *u, long T, int I, long ld, cudaStream_t s)
{
    if (T < 0 || I <= 0 || ld < I || ((!h || !g || !u) && T)) return LCU_EINVAL;
    if (T == 0) return 0;
    lcu_swiglu_rows_k<<<lcu_blocks(T * I, 256), 256, 0, s>>>((__nv_bfloat16 *)h, g, u, T, I, ld);
    return lcu_launch_status();
}

/* dg and du of one element: shared by both SwiGLU backwards, so they give the same bits */
__device__ __forceinline__ void lcu_swiglu_grad(float d, float x, float u, float *dg, float *du)
{
    float sg = 1.0f / (1.0f + expf(-x));
    *dg = d * u * sg * (1.0f + x * (1.0f - sg));
    *du = d * x * sg;
}

template <typename D>
__global__ void lcu_swiglu_bwd_k(D *dg, D *du, const float *dh, const float *g, const float *u, long n)
{
    LCU_GRID_STRIDE(i, n) {
        float a, b;
        lcu_swiglu_grad(dh[i], g[i], u[i], &a, &b);
        lcu_st(dg, i, a);
        lcu_st(du, i, b);
    }
}

template <typename D>
__global__ void lcu_swiglu_bwd4_k(D *dg, D *du, const float *dh, const float *g, const float *u, long n4, long n)
{
    LCU_GRID_STRIDE(i, n4) {
        float4 d = lcu_ld4(dh, i), x = lcu_ld4(g, i), v = lcu_ld4(u, i), a, b;
        lcu_swiglu_grad(d.x, x.x, v.x, &a.x, &b.x);
        lcu_swiglu_grad(d.y, x.y, v.y, &a.y, &b.y);
        lcu_swiglu_grad(d.z, x.z, v.z, &a.z, &b.z);
        lcu_swiglu_grad(d.w, x.w, v.w, &a.w, &b.w);
        lcu_st4(dg, i, a);
        lcu_st4(du, i, b);
    }
    LCU_TAIL(t, n4, n) {
        float a, b;
        lcu_swiglu_grad(dh[t], g[t], u[t], &a, &b);
        lcu_st(dg, t, a);
        lcu_st(du, t, b);
    }
}

int lcu_swiglu_fwd(void *h, lcu_dtype ht, const float *g, const float *u, long n, cudaStream_t s)
{
    if (n < 0 || ((!h || !g || !u) && n)) return LCU_EINVAL;
    if (n == 0) return 0;
    long n4 = n / 4;
    if (n4 > 0 && lcu_aligned4(h, lcu_dtype_bytes(ht)) && lcu_aligned4(g, 4) && lcu_aligned4(u, 4)) {
        LCU_DISPATCH_F32_BF16(ht, H,
            lcu_swiglu_fwd4_k<H><<<lcu_blocks(n4, 256), 256, 0, s>>>((H *)h, g, u, n4, n));
        return lcu_launch_status();
    }
    LCU_DISPATCH_F32_BF16(ht, H, lcu_swiglu_fwd_k<H><<<lcu_blocks(n, 256), 256, 0, s>>>((H *)h, g, u, n));
    return lcu_launch_status();
}

int lcu_swiglu_bwd(void *dg, void *du, lcu_dtype t, const float *dh, const float *g, const float *u, long n,
                   cudaStream_t s)
{
    if (n < 0 || ((!dg || !du || !dh || !g || !u) && n)) return LCU_EINVAL;
    if (n == 0) return 0;
    long n4 = n / 4;
    if (n4 > 0 && lcu_aligned4(dg, lcu_dtype_bytes(t)) && lcu_aligned4(du, lcu_dtype_bytes(t)) &&
        lcu_aligned4(dh, 4) && lcu_aligned4(g, 4) && lcu_aligned4(u, 4)) {
        LCU_DISPATCH_F32_BF16(t, D,
            lcu_swiglu_bwd4_k<D><<<lcu_blocks(n4, 256), 256, 0, s>>>((D *)dg, (D *)du, dh, g, u, n4, n));
        return lcu_launch_status();
    }
    LCU_DISPATCH_F32_BF16(t, D,
        lcu_swiglu_bwd_k<D><<<lcu_blocks(n, 256), 256, 0, s>>>((D *)dg, (D *)du, dh, g, u, n));
    return lcu_launch_status();
}
