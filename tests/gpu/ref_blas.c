/* ref_blas.c — cblas_sgemm for the CPU-backend twins linked into the gpu tests
 * (cpu_ops.c, cpu_attention.c). The gpu test binaries run on a GPU machine that is not
 * guaranteed to have this machine's OpenBLAS (and it is too large to carry along), and the
 * twins only see test-sized shapes, so a plain triple loop with double accumulation is
 * enough and makes the twins a slightly more exact reference.
 */
#include <cblas.h>

void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER order, OPENBLAS_CONST enum CBLAS_TRANSPOSE ta,
                 OPENBLAS_CONST enum CBLAS_TRANSPOSE tb, OPENBLAS_CONST blasint M, OPENBLAS_CONST blasint N,
                 OPENBLAS_CONST blasint K, OPENBLAS_CONST float alpha, OPENBLAS_CONST float *A,
                 OPENBLAS_CONST blasint lda, OPENBLAS_CONST float *B, OPENBLAS_CONST blasint ldb,
                 OPENBLAS_CONST float beta, float *C, OPENBLAS_CONST blasint ldc)
{
    /* Row-major only (all the callers); column-major is the transposed problem. */
    if (order == CblasColMajor) {
        cblas_sgemm(CblasRowMajor, tb, ta, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
        return;
    }
    for (long i = 0; i < M; i++)
        for (long j = 0; j < N; j++) {
            double s = 0;
            for (long k = 0; k < K; k++) {
                double a = ta == CblasNoTrans ? A[i * lda + k] : A[k * lda + i];
                double b = tb == CblasNoTrans ? B[k * ldb + j] : B[j * ldb + k];
                s += a * b;
            }
            float *c = &C[i * ldc + j];
            *c = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * *c));
        }
}
