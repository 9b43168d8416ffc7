/* cpu_gemm.h — the CPU backend's own single-precision GEMM, written for batch invariance
 * (docs/architecture.md, "Batch invariance"): every element of C is computed by the same
 * sequence of roundings whatever M, N, the element's position, the thread split or the
 * machine's vector width,
 *
 *   acc_b = fma(a[k], b[k], … fma(a[k0], b[k0], 0))      over each block b of CPU_GEMM_KC
 *                                                         values of k, blocks from k = 0
 *   C = beta·C + alpha·acc_0 (C = alpha·acc_0 when beta = 0), then C += alpha·acc_b
 *
 * so that a token's numbers do not depend on the other tokens packed with it. OpenBLAS
 * does not promise this (its micro-kernels round rows and columns differently by their
 * place in a tile), and its results also differ between CPU models of one pool.
 *
 * Kernels: AVX-512, AVX2+FMA and portable C with fmaf, picked at run time; all give the
 * same bits (each lane is one scalar fma chain). Single-threaded; cpu_sgemm (cpu_ops.h)
 * splits work across the pool.
 * defines: cpu_gemm, cpu_gemm_kernel, cpu_gemm_use_kernel */
#ifndef LOOM_BACKEND_CPU_GEMM_H
#define LOOM_BACKEND_CPU_GEMM_H

#include <stdbool.h>

#define CPU_GEMM_KC 256   /* k values per accumulation block: part of the numerics, fixed */

/* C[M,N] = alpha·op(A)·op(B) + beta·C as above (op = transpose when ta/tb); K may be 0 (C
 * is then scaled by beta). When beta is 0, C is not read (it may hold anything). */
void cpu_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc);

/* The kernel in use: "avx512", "avx2" or "generic". */
const char *cpu_gemm_kernel(void);
/* Uses the named kernel (tests compare them); false when this CPU cannot run it. */
bool cpu_gemm_use_kernel(const char *name);

#endif
