/* lcu_gemm.cu — the context (cuBLASLt/cuBLAS handles, workspace), error strings and the
 * one GEMM entry point with its plan cache (see cuda_ops.h).
 *
 * Row-major to column-major: cuBLASLt is column-major, and a row-major X [r, c] with
 * stride ld is the column-major Xᵀ [c, r] with the same ld. So D = op(A)·op(B) (row-major)
 * is computed as Dᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's "A" is our B and its "B" our A, m = N,
 * n = M — the usual trick, with no data movement.
 *
 * The cublasGemmEx fallback serves the layouts cuBLASLt has no plan for (odd bf16 leading
 * dimensions). It rarely runs on its own, so it can be forced for every shape, to test
 * it: LCU_GEMM=cublas in the environment when the context is created, or
 * lcu_gemm_force_fallback.
 */
#include "backend/cuda/lcu_common.cuh"
#include "backend/cuda/lcu_sgmv.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LCU_PLAN_CAP 1024 /* open-addressing table; flushed when 3/4 full */

typedef struct {
    bool ta, tb, beta_nonzero, c_is_d;
    int M, N, K;
    long lda, ldb, ldc, ldd;
    int d_type;
    int align_a, align_b, align_c, align_d;
} lcu_plan_key;

typedef struct {
    bool used;
    bool fallback; /* no cuBLASLt algorithm: cublasGemmEx */
    lcu_plan_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatmulAlgo_t algo;
} lcu_plan;

struct lcu_ctx {
    cublasLtHandle_t lt;
    cublasHandle_t blas;
    void *ws;
    size_t ws_bytes;
    lcu_plan *plans;
    int nplans;
    bool force_fallback; /* every plan is a cublasGemmEx one (LCU_GEMM=cublas) */
    int waves;           /* LCU_GEMM_WAVES (lcu_plan_pick): 0 the heuristic's first, 1 the rule, 2 also says */
    void *sk;            /* split-K partial sums of the segmented GEMM (lcu_sgmv.cu) */
    size_t sk_bytes;
};

int lcu_ctx_splitk_scratch(lcu_ctx *c, size_t bytes, void **out)
{
    *out = NULL;
    if (!c) return LCU_EINVAL;
    if (bytes > c->sk_bytes) {
        size_t cap = c->sk_bytes + c->sk_bytes / 2 > bytes ? c->sk_bytes + c->sk_bytes / 2 : bytes;
        void *p = NULL;
        int rc = (int)cudaMalloc(&p, cap);
        if (rc) {
            cudaGetLastError(); /* out of memory is not sticky */
            return rc;
        }
        if (c->sk) cudaFree(c->sk); /* waits for the device: no kernel still reads it */
        c->sk = p;
        c->sk_bytes = cap;
    }
    *out = c->sk;
    return 0;
}

const char *lcu_strerror(int rc)
{
    if (rc == 0) return "no error";
    if (rc == LCU_EINVAL) return "invalid argument";
    if (rc >= LCU_ECUBLAS_BASE) return cublasGetStatusString((cublasStatus_t)(rc - LCU_ECUBLAS_BASE));
    return cudaGetErrorString((cudaError_t)rc);
}

static int lcu_blas_rc(cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS ? 0 : LCU_ECUBLAS_BASE + (int)st; }

static void lcu_plan_release(lcu_plan *p)
{
    if (!p->used) return;
    if (!p->fallback) {
        cublasLtMatrixLayoutDestroy(p->la);
        cublasLtMatrixLayoutDestroy(p->lb);
        cublasLtMatrixLayoutDestroy(p->lc);
        cublasLtMatrixLayoutDestroy(p->ld);
        cublasLtMatmulDescDestroy(p->op);
    }
    memset(p, 0, sizeof *p);
}

static void lcu_plans_flush(lcu_ctx *c)
{
    for (int i = 0; i < LCU_PLAN_CAP; i++) lcu_plan_release(&c->plans[i]);
    c->nplans = 0;
}

int lcu_ctx_create(lcu_ctx **out, size_t workspace_bytes)
{
    *out = NULL;
    lcu_ctx *c = (lcu_ctx *)calloc(1, sizeof *c);
    if (!c) return (int)cudaErrorMemoryAllocation;
    c->plans = (lcu_plan *)calloc(LCU_PLAN_CAP, sizeof *c->plans);
    c->ws_bytes = workspace_bytes ? workspace_bytes : (32u << 20);
    int rc = c->plans ? 0 : (int)cudaErrorMemoryAllocation;
    if (!rc) rc = lcu_blas_rc(cublasLtCreate(&c->lt));
    if (!rc) rc = lcu_blas_rc(cublasCreate(&c->blas));
    if (!rc) rc = (int)cudaMalloc(&c->ws, c->ws_bytes);
    /* The fallback path shares the workspace; it never runs concurrently with a Lt call. */
    if (!rc) rc = lcu_blas_rc(cublasSetWorkspace(c->blas, c->ws, c->ws_bytes));
    /* split-K partial sums in fp32 even for a bf16 output, as the header promises */
    if (!rc)
        rc = lcu_blas_rc(cublasSetMathMode(c->blas, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                                   CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    if (rc) { lcu_ctx_destroy(c); return rc; }
    const char *e = getenv("LCU_GEMM");
    c->force_fallback = e && strcmp(e, "cublas") == 0;
    const char *w = getenv("LCU_GEMM_WAVES");
    c->waves = w && *w ? atoi(w) : 0;
    *out = c;
    return 0;
}

void lcu_ctx_destroy(lcu_ctx *c)
{
    if (!c) return;
    if (c->plans) lcu_plans_flush(c);
    free(c->plans);
    if (c->ws) cudaFree(c->ws);
    if (c->sk) cudaFree(c->sk);
    if (c->blas) cublasDestroy(c->blas);
    if (c->lt) cublasLtDestroy(c->lt);
    free(c);
}

int lcu_gemm_plans(const lcu_ctx *c) { return c->nplans; }

int lcu_gemm_fallback_plans(const lcu_ctx *c)
{
    int n = 0;
    for (int i = 0; i < LCU_PLAN_CAP; i++) n += c->plans[i].used && c->plans[i].fallback;
    return n;
}

void lcu_gemm_force_fallback(lcu_ctx *c, bool on)
{
    if (c->force_fallback == on) return;
    lcu_plans_flush(c); /* the cached plans are of the other kind */
    c->force_fallback = on;
}

/* Largest power of two dividing the address, at most 256 (cuBLASLt's default assumption). */
static int lcu_align(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    if (!a) return 256;
    a &= ~a + 1;
    return a > 256 ? 256 : (int)a;
}

static uint64_t lcu_key_hash(const lcu_plan_key *k)
{
    const unsigned char *b = (const unsigned char *)k;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* LCU_GEMM_WAVES=1 (off unless set: written without a GPU, for a window to measure): a
 * product of few rows (a decode step's 32) gives cuBLASLt's first choice a few dozen tiles
 * (Qwen3-8B's o projection: 4,096 columns in 128-column tiles, 32 blocks on 132 SMs), and
 * the fifth window measured that GEMM at 18 µs against a 7 µs memory floor. With the switch
 * such a plan asks for the heuristic's first LCU_WAVES_CANDIDATES and, when the first fills
 * under half a wave of the device (cuBLASLt's wavesCount), takes the first that fills at
 * least half (split-K or smaller tiles). The choice depends on the shape, the device and
 * the library only (no timing: cuBLAS's own bits are the same on every run there); fp32
 * outputs only (a split-K's partial sums then stay fp32). LCU_GEMM_WAVES=2 also prints
 * each such plan's candidates (stderr). */
enum { LCU_WAVES_CANDIDATES = 8, LCU_WAVES_MAX_M = 64 };

static int lcu_plan_pick(const lcu_ctx *c, const lcu_plan_key *k, const cublasLtMatmulHeuristicResult_t *res, int n)
{
    int pick = 0;
    if (n > 1 && res[0].wavesCount < 0.5f)
        for (int i = 1; i < n; i++)
            if (res[i].wavesCount >= 0.5f) {
                pick = i;
                break;
            }
    if (c->waves >= 2 && n > 1) {
        fprintf(stderr, "lcu_gemm plan M=%d N=%d K=%d (%s out): %d candidates, waves", k->M, k->N, k->K,
                k->d_type == LCU_F32 ? "f32" : "bf16", n);
        for (int i = 0; i < n; i++) {
            int splitk = 0, tile = 0;
            size_t w = 0;
            cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
            cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
            fprintf(stderr, " %.2f(tile %d, split %d)", res[i].wavesCount, tile, splitk);
        }
        fprintf(stderr, "; takes %d\n", pick);
    }
    return pick;
}

/* Builds the cuBLASLt objects for a key; falls back to cublasGemmEx when the heuristic
 * offers nothing (e.g. bf16 leading dimensions that are not a multiple of 8). */
static int lcu_plan_build(lcu_ctx *c, lcu_plan *p)
{
    if (c->force_fallback) {
        p->fallback = true;
        return 0;
    }
    const lcu_plan_key *k = &p->key;
    cudaDataType_t dt = k->d_type == LCU_F32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int rc = lcu_blas_rc(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (!rc) rc = lcu_blas_rc(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    if (!rc) rc = lcu_blas_rc(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    /* Stored shapes of the column-major views (see the file comment). */
    if (!rc)
        rc = lcu_blas_rc(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, k->tb ? k->K : k->N, k->tb ? k->N : k->K, k->ldb));
    if (!rc)
        rc = lcu_blas_rc(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, k->ta ? k->M : k->K, k->ta ? k->K : k->M, k->lda));
    if (!rc) rc = lcu_blas_rc(cublasLtMatrixLayoutCreate(&p->lc, dt, k->N, k->M, k->ldc));
    if (!rc) rc = lcu_blas_rc(cublasLtMatrixLayoutCreate(&p->ld, dt, k->N, k->M, k->ldd));
    cublasLtMatmulPreference_t pref = NULL;
    if (!rc) rc = lcu_blas_rc(cublasLtMatmulPreferenceCreate(&pref));
    if (!rc) {
        uint32_t al[4] = {(uint32_t)k->align_b, (uint32_t)k->align_a, (uint32_t)k->align_c, (uint32_t)k->align_d};
        uint64_t wsb = c->ws_bytes;
        const cublasLtMatmulPreferenceAttributes_t which[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        rc = lcu_blas_rc(
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
        for (int i = 0; i < 4 && !rc; i++)
            rc = lcu_blas_rc(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]));
    }
    if (!rc) {
        cublasLtMatmulHeuristicResult_t res[LCU_WAVES_CANDIDATES];
        int n = 0, want = c->waves && k->M <= LCU_WAVES_MAX_M && k->d_type == LCU_F32 ? LCU_WAVES_CANDIDATES : 1;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->ld, pref, want, res, &n);
        if (st == CUBLAS_STATUS_SUCCESS && n > 0) p->algo = res[lcu_plan_pick(c, k, res, n)].algo;
        else p->fallback = true; /* no plan for this layout: not an error */
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (rc || p->fallback) {
        if (p->op) cublasLtMatmulDescDestroy(p->op);
        if (p->la) cublasLtMatrixLayoutDestroy(p->la);
        if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
        if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
        if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
        p->op = NULL;
        p->la = p->lb = p->lc = p->ld = NULL;
    }
    return rc;
}

static int lcu_plan_get(lcu_ctx *c, const lcu_plan_key *k, lcu_plan **out)
{
    if (c->nplans >= LCU_PLAN_CAP * 3 / 4) lcu_plans_flush(c);
    uint64_t h = lcu_key_hash(k);
    for (int i = 0; i < LCU_PLAN_CAP; i++) {
        lcu_plan *p = &c->plans[(h + i) % LCU_PLAN_CAP];
        if (p->used && memcmp(&p->key, k, sizeof *k) == 0) { *out = p; return 0; }
        if (!p->used) {
            memset(p, 0, sizeof *p);
            p->key = *k;
            int rc = lcu_plan_build(c, p);
            if (rc) { memset(p, 0, sizeof *p); return rc; }
            p->used = true;
            c->nplans++;
            *out = p;
            return 0;
        }
    }
    return LCU_EINVAL; /* unreachable: the table is flushed before it fills */
}

/* D = beta·C for K = 0 (cuBLAS wants k ≥ 1). */
template <typename T>
__global__ void lcu_scale_rows(T *D, long ldd, const T *C, long ldc, int M, int N, float beta)
{
    long n = (long)M * N;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long r = i / N, col = i % N;
        lcu_st(D, r * ldd + col, beta == 0.0f ? 0.0f : beta * lcu_ld(C, r * ldc + col));
    }
}

int lcu_gemm(lcu_ctx *c, const lcu_gemm_args *g, cudaStream_t s)
{
    if (!c || !g || g->M < 0 || g->N < 0 || g->K < 0) return LCU_EINVAL;
    if (g->d_type != LCU_F32 && g->d_type != LCU_BF16) return LCU_EINVAL;
    if (g->M == 0 || g->N == 0) return 0;
    const void *C = g->C ? g->C : g->D;
    long ldc = g->C ? g->ldc : g->ldd;
    if (!g->D || g->ldd < g->N || (g->beta != 0.0f && ldc < g->N)) return LCU_EINVAL;
    if (g->K == 0) {
        LCU_DISPATCH_F32_BF16(g->d_type, T,
            lcu_scale_rows<T><<<lcu_blocks((long)g->M * g->N, 256), 256, 0, s>>>(
                (T *)g->D, g->ldd, (const T *)C, ldc, g->M, g->N, g->beta));
        return lcu_launch_status();
    }
    if (!g->A || !g->B || g->lda < (g->ta ? g->M : g->K) || g->ldb < (g->tb ? g->K : g->N)) return LCU_EINVAL;

    lcu_plan_key k;
    memset(&k, 0, sizeof k); /* padding bytes take part in the hash and the comparison */
    k.ta = g->ta;
    k.tb = g->tb;
    k.beta_nonzero = g->beta != 0.0f;
    k.c_is_d = C == g->D;
    k.M = g->M;
    k.N = g->N;
    k.K = g->K;
    k.lda = g->lda;
    k.ldb = g->ldb;
    k.ldc = k.beta_nonzero ? ldc : g->ldd;
    k.ldd = g->ldd;
    k.d_type = g->d_type;
    k.align_a = lcu_align(g->A);
    k.align_b = lcu_align(g->B);
    k.align_d = lcu_align(g->D);
    k.align_c = k.beta_nonzero ? lcu_align(C) : k.align_d;
    lcu_plan *p;
    int rc = lcu_plan_get(c, &k, &p);
    if (rc) return rc;
    if (!k.beta_nonzero) C = g->D; /* never read; cuBLASLt still wants a pointer */

    if (!p->fallback) {
        return lcu_blas_rc(cublasLtMatmul(c->lt, p->op, &g->alpha, g->B, p->la, g->A, p->lb, &g->beta, C, p->lc, g->D,
                                          p->ld, &p->algo, c->ws, c->ws_bytes, s));
    }
    /* cublasGemmEx works in place only: copy C into D first when they differ. */
    size_t es = g->d_type == LCU_F32 ? 4 : 2;
    if (k.beta_nonzero && C != g->D) {
        rc = (int)cudaMemcpy2DAsync(g->D, g->ldd * es, C, ldc * es, g->N * es, g->M, cudaMemcpyDeviceToDevice, s);
        if (rc) return rc;
    }
    rc = lcu_blas_rc(cublasSetStream(c->blas, s));
    if (rc) return rc;
    cudaDataType_t dt = g->d_type == LCU_F32 ? CUDA_R_32F : CUDA_R_16BF;
    return lcu_blas_rc(cublasGemmEx(c->blas, g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, g->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    g->N, g->M, g->K, &g->alpha, g->B, CUDA_R_16BF, (int)g->ldb, g->A, CUDA_R_16BF,
                                    (int)g->lda, &g->beta, g->D, dt, (int)g->ldd, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
}
