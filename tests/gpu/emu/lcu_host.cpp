/* lcu_host.cpp — what the LoRA paths need of the kernel layer besides their own kernels, on
 * the CPU: the context with its split-K scratch, lcu_gemm (version 1's products: bf16
 * inputs, fp32 sums in K order, the cuBLASLt semantics of cuda_ops.h), lcu_convert. */
#include "emu.h"
#include "backend/cuda/lcu_common.cuh"
#include "backend/cuda/lcu_sgmv.cuh"
struct lcu_ctx { void *sk; size_t bytes; };
int lcu_ctx_create(lcu_ctx **out, size_t) { *out = (lcu_ctx *)calloc(1, sizeof(lcu_ctx)); return 0; }
void lcu_ctx_destroy(lcu_ctx *c) { if (c) { free(c->sk); free(c); } }
int lcu_ctx_splitk_scratch(lcu_ctx *c, size_t bytes, void **out)
{
    if (bytes > c->bytes) { free(c->sk); c->sk = malloc(bytes); c->bytes = bytes; memset(c->sk, 0xff, bytes); }
    *out = c->sk;
    return 0;
}
const char *lcu_strerror(int rc) { return rc ? "lcu error" : "no error"; }
static float bfv(const lcu_bf16 *p, long i) { return __uint_as_float((unsigned)p[i] << 16); }
int lcu_gemm(lcu_ctx *, const lcu_gemm_args *g, cudaStream_t)
{
    void *C = g->C ? (void *)g->C : g->D;
    long ldc = g->C ? g->ldc : g->ldd;
    for (int i = 0; i < g->M; i++)
        for (int j = 0; j < g->N; j++) {
            float s = 0;
            for (int k = 0; k < g->K; k++) {
                float a = g->ta ? bfv(g->A, (long)k * g->lda + i) : bfv(g->A, (long)i * g->lda + k);
                float b = g->tb ? bfv(g->B, (long)j * g->ldb + k) : bfv(g->B, (long)k * g->ldb + j);
                s += a * b;
            }
            float v = g->alpha * s;
            if (g->d_type == LCU_F32) {
                if (g->beta != 0) v += g->beta * ((const float *)C)[(long)i * ldc + j];
                ((float *)g->D)[(long)i * g->ldd + j] = v;
            } else {
                if (g->beta != 0) v += g->beta * bfv((const lcu_bf16 *)C, (long)i * ldc + j);
                ((__nv_bfloat16 *)g->D)[(long)i * g->ldd + j] = __float2bfloat16_rn(v);
            }
        }
    return 0;
}
int lcu_convert(void *dst, lcu_dtype dt, const void *src, lcu_dtype st, size_t n, cudaStream_t)
{
    for (size_t i = 0; i < n; i++) {
        float v = st == LCU_F32 ? ((const float *)src)[i] : st == LCU_BF16 ? bfv((const lcu_bf16 *)src, (long)i) : NAN;
        if (dt == LCU_F32) ((float *)dst)[i] = v;
        else ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(v);
    }
    return 0;
}
