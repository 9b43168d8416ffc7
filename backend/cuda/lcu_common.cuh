/* lcu_common.cuh — helpers shared by the kernel files of backend/cuda: launch checks,
 * bf16 conversion, warp/block reductions with a fixed order (determinism), dtype dispatch.
 */
#ifndef LOOM_BACKEND_CUDA_COMMON_CUH
#define LOOM_BACKEND_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_ops.h"

/* Status of the launch just queued (configuration errors, missing kernel image). */
static inline int lcu_launch_status(void) { return (int)cudaGetLastError(); }

/* Grid of at most max_blocks blocks of `threads` covering n items (grid-stride loops do
 * the rest): large enough to fill the GPU, small enough to stay within 2³¹−1. */
static inline unsigned lcu_blocks(long n, int threads, long max_blocks = 65535L * 8)
{
    long b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return (unsigned)(b < max_blocks ? b : max_blocks);
}

__device__ __forceinline__ float lcu_ld(const float *p, long i) { return p[i]; }
__device__ __forceinline__ float lcu_ld(const __nv_bfloat16 *p, long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void lcu_st(float *p, long i, float v) { p[i] = v; }
__device__ __forceinline__ void lcu_st(__nv_bfloat16 *p, long i, float v) { p[i] = __float2bfloat16_rn(v); }

/* Sum over a warp by a butterfly: every lane gets the same bits (fixed order). */
template <typename T> __device__ __forceinline__ T lcu_warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T> __device__ __forceinline__ T lcu_warp_max(T v)
{
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result.
 * scratch: ≥ 32 values of shared memory. Fixed order: warp butterflies, then warp 0. */
template <typename T> __device__ T lcu_block_sum(T v, T *scratch)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = lcu_warp_sum(v);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    T r = lane < nw ? scratch[lane] : T(0);
    r = lcu_warp_sum(r);
    return r;
}

template <typename T> __device__ T lcu_block_max(T v, T *scratch, T lowest)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = lcu_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    T r = lane < nw ? scratch[lane] : lowest;
    return lcu_warp_max(r);
}

/* The k-th largest of key(i) for i < n, equal keys counted separately (1 ≤ k ≤ n), by an
 * MSB radix select over 8-bit digits. The histograms count with integer atomics in shared
 * memory, so the result does not depend on scheduling. Block-wide (every thread gets the
 * result); hist: 256 ints, s_prefix and s_rem: scratch, all in shared memory. */
template <typename K, typename F>
__device__ K lcu_radix_kth(F key, long n, int k, int *hist, K *s_prefix, int *s_rem)
{
    if (threadIdx.x == 0) {
        *s_prefix = 0;
        *s_rem = k;
    }
    K mask = 0;
    for (int shift = 8 * (int)sizeof(K) - 8; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        K prefix = *s_prefix;
        for (long i = threadIdx.x; i < n; i += blockDim.x) {
            K x = key(i);
            if ((x & mask) == prefix) atomicAdd(&hist[(int)((x >> shift) & 255)], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) { /* the digit where the count from the top reaches k */
            int rem = *s_rem, cum = 0, d = 0;
            for (int dg = 255; dg >= 0; dg--) {
                if (cum + hist[dg] >= rem) { d = dg; break; }
                cum += hist[dg];
            }
            *s_rem = rem - cum;
            *s_prefix = prefix | ((K)d << shift);
        }
        mask |= (K)255 << shift;
        __syncthreads();
    }
    K r = *s_prefix;
    __syncthreads(); /* the scratch may be reused as soon as this returns */
    return r;
}

/* Calls f.template operator()<T>() with T the C++ type of dtype t (F32 or BF16). */
#define LCU_DISPATCH_F32_BF16(t, T, ...)                                                          \
    do {                                                                                          \
        if ((t) == LCU_F32) { typedef float T; __VA_ARGS__; }                                     \
        else if ((t) == LCU_BF16) { typedef __nv_bfloat16 T; __VA_ARGS__; }                       \
        else return LCU_EINVAL;                                                                   \
    } while (0)

#endif
