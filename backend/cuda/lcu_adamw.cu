/* lcu_adamw.cu — the global gradient norm and the AdamW step on the device (see
 * cuda_ops.h).
 *
 * Norm: a fixed two-stage reduction whose shape does not depend on the GPU (1024 blocks,
 * each summing one contiguous slice in double, then one block over the 1024 partials), so
 * the same gradients give the same bits everywhere.
 *
 * Step: backend/adamw.c's expression, operation for operation in double, written with
 * round-to-nearest intrinsics so nvcc cannot contract a·b + c into a fused multiply-add
 * (which the x86-64 CPU build does not do either): p, m, v come out bit-identical to the
 * CPU backend's for the same inputs and clip coefficient.
 */
#include "backend/cuda/lcu_common.cuh"

#include <math.h>

#define LCU_NORM_BLOCKS 1024
#define LCU_NORM_THREADS 256

size_t lcu_sumsq_workspace_bytes(void) { return LCU_NORM_BLOCKS * sizeof(double); }

__global__ void __launch_bounds__(LCU_NORM_THREADS) lcu_sumsq_part_k(const float *g, size_t n, double *part)
{
    __shared__ double sc[32];
    size_t chunk = (n + LCU_NORM_BLOCKS - 1) / LCU_NORM_BLOCKS, b = blockIdx.x * chunk;
    size_t e = b + chunk < n ? b + chunk : n;
    double s = 0;
    for (size_t i = b + threadIdx.x; i < e; i += blockDim.x) {
        double x = g[i];
        s = __dadd_rn(s, __dmul_rn(x, x));
    }
    s = lcu_block_sum(s, sc);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void __launch_bounds__(LCU_NORM_BLOCKS) lcu_sumsq_final_k(const double *part, double *out)
{
    __shared__ double sc[32];
    double s = lcu_block_sum(part[threadIdx.x], sc);
    if (threadIdx.x == 0) *out = s;
}

int lcu_sumsq(double *out, const float *g, size_t n, void *ws, cudaStream_t s)
{
    if (!out || !ws || (n && !g)) return LCU_EINVAL;
    double *part = (double *)ws;
    lcu_sumsq_part_k<<<LCU_NORM_BLOCKS, LCU_NORM_THREADS, 0, s>>>(g, n, part);
    int rc = lcu_launch_status();
    if (rc) return rc;
    lcu_sumsq_final_k<<<1, LCU_NORM_BLOCKS, 0, s>>>(part, out);
    return lcu_launch_status();
}

typedef struct {
    double b1, omb1, b2, omb2, eps, decay, bc2_sqrt, step_size, grad_scale;
} lcu_adam_k_args;

__global__ void lcu_adamw_k(float *p, const float *g, float *m, float *v, size_t n, lcu_adam_k_args a)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        double gi = __dmul_rn((double)g[i], a.grad_scale);
        double mi = __dadd_rn(__dmul_rn(a.b1, (double)m[i]), __dmul_rn(a.omb1, gi));
        double vi = __dadd_rn(__dmul_rn(a.b2, (double)v[i]), __dmul_rn(__dmul_rn(a.omb2, gi), gi));
        m[i] = __double2float_rn(mi);
        v[i] = __double2float_rn(vi);
        double denom = __dadd_rn(__ddiv_rn(__dsqrt_rn(vi), a.bc2_sqrt), a.eps);
        p[i] = __double2float_rn(__dsub_rn(__dmul_rn((double)p[i], a.decay), __ddiv_rn(__dmul_rn(a.step_size, mi), denom)));
    }
}

int lcu_adamw(float *p, const float *g, float *m, float *v, size_t n, const lcu_adamw_args *a, cudaStream_t s)
{
    if (!a || a->step < 1 || (n && (!p || !g || !m || !v))) return LCU_EINVAL;
    if (n == 0) return 0;
    /* the host constants exactly as adamw_update computes them */
    lcu_adam_k_args k;
    k.b1 = a->beta1;
    k.omb1 = 1.0 - a->beta1;
    k.b2 = a->beta2;
    k.omb2 = 1.0 - a->beta2;
    k.eps = a->eps;
    k.decay = 1.0 - a->lr * a->weight_decay;
    k.bc2_sqrt = sqrt(1.0 - pow(a->beta2, (double)a->step));
    k.step_size = a->lr / (1.0 - pow(a->beta1, (double)a->step));
    k.grad_scale = a->grad_scale;
    lcu_adamw_k<<<lcu_blocks((long)n, 256), 256, 0, s>>>(p, g, m, v, n, k);
    return lcu_launch_status();
}
