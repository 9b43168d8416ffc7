/* emu.h — a CPU emulation of the CUDA constructs the LoRA kernels (lcu_sgmv.cu,
 * lcu_sgmv3.cu) and the decode's attention kernel (lcu_attention_decode.cu) use, so that
 * their index logic can be checked on a machine without a GPU (tests/gpu/emu/run_emu.sh,
 * and with its argument decode-attn): one OS thread per CUDA thread, the blocks of a launch one after
 * another, __syncthreads as a barrier over the block, warp shuffles through a per-warp slot
 * array, __shared__ as function statics (one block at a time), WMMA fragments as whole
 * 16×16 matrices that every lane holds (loads check the 32-byte alignment WMMA needs; a
 * store is lane 0's). Not a GPU: no memory model, no timing, no races found, sums in
 * another order than the tensor cores'. A pass here says the indices are right, nothing
 * about speed. */
#ifndef EMU_H
#define EMU_H
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <functional>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
static inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }

extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;
void __syncthreads();
float emu_shfl_xor(float v, int o);
template <typename T> T __shfl_xor_sync(unsigned, T v, int o) { return (T)emu_shfl_xor((float)v, o); }
static inline int atomicAdd(int *p, int v) { int o = *p; *p += v; return o; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
template <typename T> T max(T a, T b) { return a > b ? a : b; }
template <typename T> T __ldg(const T *p) { return *p; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }

#include "emu_rt.h"

struct __nv_bfloat16 { unsigned short __x; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    unsigned u; memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) { h.__x = 0x7fff; return h; }
    u += 0x7fffu + ((u >> 16) & 1u);
    h.__x = (unsigned short)(u >> 16);
    return h;
}
static inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float((unsigned)h.__x << 16); }
static inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{__bfloat162float(h.x), __bfloat162float(h.y)}; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }

/* launch: blockDim OS threads, every block in turn */
struct emu_launch_ctx { void (*run)(void *); void *arg; dim3 grid, block; };
void emu_run(emu_launch_ctx *c);
template <typename T> struct emu_kernel_call { void (*k)(T); const T *arg; };
template <typename T> static void emu_thunk(void *p) { emu_kernel_call<T> *c = (emu_kernel_call<T> *)p; c->k(*c->arg); }
template <typename T> static void emu_launch(void (*k)(T), dim3 grid, dim3 block, const T &arg)
{
    emu_kernel_call<T> call{k, &arg};
    emu_launch_ctx c{emu_thunk<T>, &call, grid, block};
    emu_run(&c);
}
/* a kernel of any arguments: `k<<<g, b, 0, s>>>(a...)` rewritten as emu_launchv(k, g, b, a...) */
static inline void emu_fn_thunk(void *p) { (*(std::function<void()> *)p)(); }
template <typename... P, typename... A> static void emu_launchv(void (*k)(P...), dim3 grid, dim3 block, A... a)
{
    std::function<void()> f = [=]() { k(a...); };
    emu_launch_ctx c{emu_fn_thunk, &f, grid, block};
    emu_run(&c);
}

namespace nvcuda { namespace wmma {
struct row_major {}; struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
struct matrix_a {}; struct matrix_b {}; struct accumulator {};
template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment { float x[16][16]; };
template <typename F> void fill_fragment(F &f, float v) { for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) f.x[i][j] = v; }
/* matrix_a: M x K (i, k); matrix_b: K x N (k, j); element (r, c) of a row-major fragment at p[r*ld + c], column-major p[r + c*ld] */
template <typename Use, typename T, typename L>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ld)
{
    if (((uintptr_t)p) % 32) { fprintf(stderr, "EMU: wmma load pointer not 32-byte aligned\n"); abort(); }
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            const T &v = std::is_same<L, row_major>::value ? p[r * ld + c] : p[r + c * ld];
            f.x[r][c] = __bfloat162float(v);
        }
}
template <typename TA, typename LA, typename TB, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, TA, LA> &a,
              const fragment<matrix_b, 16, 16, 16, TB, LB> &b, const fragment<accumulator, 16, 16, 16, float> &c)
{
    float t[16][16];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = c.x[i][j];
            for (int k = 0; k < 16; k++) s += a.x[i][k] * b.x[k][j];
            t[i][j] = s;
        }
    memcpy(d.x, t, sizeof t);
}
void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ld, layout_t l);
}}
#endif
