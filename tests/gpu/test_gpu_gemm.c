/* test_gpu_gemm.c — lcu_gemm (cuBLASLt, bf16 in, fp32 accumulate) against an fp64 GEMM on
 * the same bf16-exact inputs: every transpose combination, fp32 and bf16 outputs, beta 0 and
 * 1 with C apart from D and in place, padded strides, misaligned sub-matrices (the plan key
 * includes pointer alignment), odd leading dimensions (the cublasGemmEx fallback), K = 0,
 * a large shape, determinism and the plan cache. Every case runs twice: as lcu_gemm picks
 * (cuBLASLt, cublasGemmEx only where cuBLASLt has no plan) and with the fallback forced for
 * every shape (lcu_gemm_force_fallback, LCU_GEMM=cublas), so that the path the odd shapes
 * take is tested on all of them; each check's label starts with "lt" or "cublas".
 *
 * Tolerances (‖D − ref‖/‖ref‖): fp32 output 1e-5 (exact bf16 products, fp32 sums);
 * bf16 output 5e-3 (one rounding to 8 bits of mantissa: ≤ 2⁻⁹ per element).
 */
#include "tests/gpu/gt.h"

#include <math.h>
#include <string.h>

typedef struct {
    bool ta, tb;
    int M, N, K;
    long lda, ldb, ldc, ldd;
    lcu_dtype dt;
    float alpha, beta;
    bool c_apart;   /* C is a separate buffer (else C = D, in place) */
    int a_off;      /* element offset of A inside its allocation (misalignment) */
} gcase;

static void ref_gemm(const gcase *g, const float *A, const float *B, const float *C, double *D)
{
    for (int i = 0; i < g->M; i++)
        for (int j = 0; j < g->N; j++) {
            double s = 0;
            for (int k = 0; k < g->K; k++) {
                double a = g->ta ? A[(long)k * g->lda + i] : A[(long)i * g->lda + k];
                double b = g->tb ? B[(long)j * g->ldb + k] : B[(long)k * g->ldb + j];
                s += a * b;
            }
            double c = g->beta != 0.0f ? C[(long)i * (g->c_apart ? g->ldc : g->ldd) + j] : 0.0;
            D[(long)i * g->N + j] = g->alpha * s + g->beta * c;
        }
}

static const char *g_path = "lt"; /* the path under test, for the labels */

static void run_case(lcu_ctx *ctx, const gcase *g, const char *label)
{
    long arows = g->ta ? g->K : g->M, brows = g->tb ? g->N : g->K;
    size_t na = (size_t)arows * g->lda + g->a_off, nb = (size_t)brows * g->ldb;
    long cld = g->c_apart ? g->ldc : g->ldd;
    size_t nc = (size_t)g->M * cld, nd = (size_t)g->M * g->ldd;
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc((nc ? nc : 1) * 4), *out = malloc(nd * 4);
    double *ref = malloc((size_t)g->M * g->N * sizeof *ref);
    gt_fill_bf16_exact(A, na, -1, 1);
    gt_fill_bf16_exact(B, nb, -1, 1);
    gt_fill_bf16_exact(C, nc, -1, 1); /* bf16-exact so a bf16 C means the same numbers */
    ref_gemm(g, A + g->a_off, B, C, ref);

    void *dA = gt_dev_bf16(A, na), *dB = gt_dev_bf16(B, nb);
    size_t es = g->dt == LCU_F32 ? 4 : 2;
    void *dC = NULL, *dD;
    if (g->c_apart) dC = g->dt == LCU_F32 ? gt_dev_f32(C, nc) : gt_dev_bf16(C, nc);
    if (g->c_apart || g->beta == 0.0f) dD = gt_dev_poison(nd * es); /* every element must be written */
    else dD = g->dt == LCU_F32 ? gt_dev_f32(C, nd) : gt_dev_bf16(C, nd);
    lcu_gemm_args a = {g->ta, g->tb, g->M, g->N, g->K, g->alpha, g->beta,
                       (const lcu_bf16 *)dA + g->a_off, g->lda, dB, g->ldb, dC, g->ldc, dD, g->ldd, g->dt};
    GT_LCU(lcu_gemm(ctx, &a, 0));
    if (g->dt == LCU_F32) gt_get_f32(out, dD, nd); else gt_get_bf16(out, dD, nd);
    /* compact the ldd-strided rows */
    float *o = malloc((size_t)g->M * g->N * 4);
    for (int i = 0; i < g->M; i++) memcpy(o + (long)i * g->N, out + (long)i * g->ldd, g->N * 4);
    char what[200];
    snprintf(what, sizeof what, "%s %s ta=%d tb=%d M=%d N=%d K=%d ld=%ld/%ld/%ld %s beta=%g %s off=%d", g_path, label, g->ta,
             g->tb, g->M, g->N, g->K, g->lda, g->ldb, g->ldd, g->dt == LCU_F32 ? "f32" : "bf16", g->beta,
             g->c_apart ? "C apart" : "in place", g->a_off);
    gt_expect_close(what, o, ref, (size_t)g->M * g->N, g->dt == LCU_F32 ? 1e-5 : 5e-3);

    /* determinism: the same call again gives the same bits (beta = 0 so D is not an input) */
    if (g->beta == 0.0f) {
        float *again = malloc(nd * 4);
        GT_CUDA(cudaMemset(dD, 0xff, nd * es));
        GT_LCU(lcu_gemm(ctx, &a, 0));
        if (g->dt == LCU_F32) gt_get_f32(again, dD, nd); else gt_get_bf16(again, dD, nd);
        for (int i = 0; i < g->M; i++) memmove(again + (long)i * g->N, again + (long)i * g->ldd, g->N * 4);
        char w2[240];
        snprintf(w2, sizeof w2, "%s (rerun)", what);
        gt_expect_bits(w2, o, again, (size_t)g->M * g->N * 4);
        free(again);
    }
    gt_free(dA); gt_free(dB); gt_free(dC); gt_free(dD);
    free(A); free(B); free(C); free(out); free(o); free(ref);
}

/* Every case on one path (ctx's choice of cuBLASLt or the forced fallback). */
static void run_cases(lcu_ctx *ctx)
{
    /* every transpose pair, both output types, beta 0 / 1 (apart and in place) */
    for (int t = 0; t < 4; t++)
        for (int dt = 0; dt < 2; dt++)
            for (int b = 0; b < 3; b++) {
                gcase g = {0};
                g.ta = t & 1;
                g.tb = t >> 1;
                g.M = gt_int(1, 96);
                g.N = 8 * gt_int(1, 24);
                g.K = 8 * gt_int(1, 40);
                g.lda = (g.ta ? g.M : g.K) + 8 * gt_int(0, 2);
                g.ldb = (g.tb ? g.K : g.N) + 8 * gt_int(0, 2);
                g.ldd = g.N + 8 * gt_int(0, 2);
                g.ldc = g.N + 8 * gt_int(0, 2);
                g.dt = dt ? LCU_BF16 : LCU_F32;
                g.alpha = (float)gt_uniform(0.5, 2.0);
                g.beta = b == 0 ? 0.0f : 1.0f;
                g.c_apart = b == 1;
                run_case(ctx, &g, "shape");
            }
    /* odd sizes and strides (no tensor-core plan: cublasGemmEx fallback), misaligned A */
    for (int i = 0; i < 6; i++) {
        gcase g = {0};
        g.ta = i & 1;
        g.tb = (i >> 1) & 1;
        g.M = gt_int(1, 37);
        g.N = gt_int(1, 37);
        g.K = gt_int(1, 37);
        g.lda = (g.ta ? g.M : g.K) + gt_int(0, 3);
        g.ldb = (g.tb ? g.K : g.N) + gt_int(0, 3);
        g.ldd = g.N + gt_int(0, 3);
        g.ldc = g.N;
        g.dt = i < 3 ? LCU_F32 : LCU_BF16;
        g.alpha = 1.0f;
        g.beta = i % 3 == 2 ? 1.0f : 0.0f;
        g.c_apart = i == 2;
        g.a_off = gt_int(1, 7);
        run_case(ctx, &g, "odd");
    }
    /* LoRA-like shapes: rank 32 shrink/expand and weight-gradient (K = rows) */
    {
        gcase s = {false, true, 300, 32, 1024, 1024, 1024, 0, 32, LCU_BF16, 1.0f, 0.0f, false, 0};
        run_case(ctx, &s, "lora shrink");
        gcase e = {false, true, 300, 1024, 32, 32, 32, 1024, 1024, LCU_F32, 2.0f, 1.0f, true, 0};
        run_case(ctx, &e, "lora expand");
        gcase w = {true, false, 1024, 32, 300, 1024, 32, 32, 32, LCU_F32, 2.0f, 1.0f, false, 0};
        run_case(ctx, &w, "lora grad");
    }
    /* a large shape, like a projection of 2K tokens */
    {
        gcase g = {false, true, 2048, 1536, 1024, 1024, 1024, 0, 1536, LCU_F32, 1.0f, 0.0f, false, 0};
        run_case(ctx, &g, "large");
    }
    /* a decode step's products: 32 rows of Qwen3-8B's o projection (its residual added, beta
     * 1) and k projection (beta 0: the rerun's bits compared too); few tiles, where
     * LCU_GEMM_WAVES may take a split-K */
    {
        gcase o = {false, true, 32, 4096, 4096, 4096, 4096, 4096, 4096, LCU_F32, 1.0f, 1.0f, true, 0};
        run_case(ctx, &o, "decode o");
        gcase k = {false, true, 32, 1024, 4096, 4096, 4096, 0, 1024, LCU_F32, 1.0f, 0.0f, false, 0};
        run_case(ctx, &k, "decode k");
    }
    /* K = 0: D = beta·C */
    {
        gcase g = {false, false, 5, 24, 0, 8, 24, 24, 24, LCU_F32, 1.0f, 1.0f, true, 0};
        run_case(ctx, &g, "K=0");
    }
    /* the plan cache: a repeated shape reuses its plan */
    {
        gcase g = {false, true, 64, 64, 64, 64, 64, 0, 64, LCU_F32, 1.0f, 0.0f, false, 0};
        run_case(ctx, &g, "cache");
        int n = lcu_gemm_plans(ctx);
        run_case(ctx, &g, "cache");
        gt_check(lcu_gemm_plans(ctx) == n, "%s plan cache: repeated shape adds no plan (%d -> %d)", g_path, n,
                 lcu_gemm_plans(ctx));
    }
}

int main(void)
{
    gt_init("test_gpu_gemm");
    lcu_ctx *ctx;
    unsetenv("LCU_GEMM"); /* the first pass is lcu_gemm's own choice */
    GT_LCU(lcu_ctx_create(&ctx, 0));

    g_path = "lt";
    run_cases(ctx);
    int np = lcu_gemm_plans(ctx), nf = lcu_gemm_fallback_plans(ctx);
    printf("  lt: %d plans cached, %d of them through cublasGemmEx (the shapes cuBLASLt has no plan for)\n", np, nf);
    gt_check(nf < np, "lt: cuBLASLt finds plans (%d of %d plans are fallbacks)", nf, np);

    g_path = "cublas";
    lcu_gemm_force_fallback(ctx, true);
    gt_check(lcu_gemm_plans(ctx) == 0, "cublas: forcing the fallback flushes the plan cache (%d left)", lcu_gemm_plans(ctx));
    run_cases(ctx);
    np = lcu_gemm_plans(ctx);
    nf = lcu_gemm_fallback_plans(ctx);
    gt_check(np > 0 && nf == np, "cublas: every plan goes through cublasGemmEx (%d of %d)", nf, np);
    lcu_gemm_force_fallback(ctx, false);

    /* bad arguments are refused before anything is launched */
    {
        lcu_gemm_args bad = {false, false, 4, 4, 4, 1.0f, 0.0f, NULL, 4, NULL, 4, NULL, 4, NULL, 4, LCU_F32};
        gt_check(lcu_gemm(ctx, &bad, 0) == LCU_EINVAL, "NULL operands -> LCU_EINVAL");
    }
    lcu_ctx_destroy(ctx);
    return gt_finish();
}
