/* cpu_ops.h — the CPU backend's kernels: threaded GEMM, RMSNorm, RoPE, SwiGLU, embedding,
 * each with its backward. Row-major fp32 throughout; rows are tokens of the packed batch.
 * defines: cpu_sgemm, cpu_rmsnorm_fwd/bwd, cpu_rope, cpu_swiglu_fwd/bwd, cpu_embed */
#ifndef LOOM_BACKEND_CPU_OPS_H
#define LOOM_BACKEND_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/cpu_pool.h"

/* C[M,N] = alpha·op(A)·op(B) + beta·C, op = transpose when ta/tb. Splits the larger of M
 * and N across the pool (each piece is cpu_gemm.c's batch-invariant kernel: the pool owns the cores). */
void cpu_sgemm(cpu_pool *p, bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc);

/* y = x · rstd · w per row of `dim` contiguous values; rstd[r] = 1/sqrt(mean(x²) + eps). */
void cpu_rmsnorm_fwd(cpu_pool *p, float *y, float *rstd, const float *x, const float *w, long rows, int dim, double eps);
/* dx (= or += when accumulate) from dy, the forward input x and rstd. */
void cpu_rmsnorm_bwd(cpu_pool *p, float *dx, const float *dy, const float *x, const float *rstd, const float *w,
                     long rows, int dim, bool accumulate);

/* HF rotate_half RoPE in place on x [T, nh·d]: pos[t] is the token's position within its
 * sequence; cos/sin tables are [pos][d/2]. inverse = rotate by −θ (the backward). */
void cpu_rope(cpu_pool *p, float *x, long T, int nh, int d, const int32_t *pos, const float *cos_t,
              const float *sin_t, bool inverse);

/* h = silu(g) · u, elementwise over n values. */
void cpu_swiglu_fwd(cpu_pool *p, float *h, const float *g, const float *u, long n);
/* dg, du from dh (dg/du may alias nothing else). */
void cpu_swiglu_bwd(cpu_pool *p, float *dg, float *du, const float *dh, const float *g, const float *u, long n);

/* x[t] = table[tokens[t]] for rows of dim H. */
void cpu_embed(cpu_pool *p, float *x, const float *table, const int32_t *tokens, long T, int H);

/* y[t, :] += b for T rows of n values. */
void cpu_add_bias(cpu_pool *p, float *y, const float *b, long T, int n);

#endif
