/* cpu_ops.c — CPU kernels (see cpu_ops.h). Per-row reductions accumulate in double so the
 * CPU backend stays a trustworthy reference for the CUDA one. */
#include "backend/cpu/cpu_ops.h"

#include "backend/cpu/cpu_gemm.h"
#include <math.h>
#include <string.h>

/* ---- GEMM ---------------------------------------------------------------------------- */

typedef struct {
    bool ta, tb;
    int M, N, K;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int lda, ldb, ldc;
    bool split_n; /* split columns of C (else rows) */
    int chunk;
} cpu_gemm_job;

static void cpu_gemm_task(void *va, int task, int thread)
{
    (void)thread;
    const cpu_gemm_job *j = va;
    int b = task * j->chunk, total = j->split_n ? j->N : j->M, e = b + j->chunk < total ? b + j->chunk : total;
    if (b >= e) return;
    const float *A = j->A, *B = j->B;
    float *C = j->C;
    int M = j->M, N = j->N;
    if (j->split_n) {
        B += j->tb ? (long)b * j->ldb : b; /* op(B) columns b..e */
        C += b;
        N = e - b;
    } else {
        A += j->ta ? b : (long)b * j->lda; /* op(A) rows b..e */
        C += (long)b * j->ldc;
        M = e - b;
    }
    cpu_gemm(j->ta, j->tb, M, N, j->K, j->alpha, A, j->lda, B, j->ldb, j->beta, C, j->ldc);
}

void cpu_sgemm(cpu_pool *p, bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    int nt = p ? cpu_pool_size(p) : 1;
    double flops = 2.0 * M * N * K;
    cpu_gemm_job j = {ta, tb, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc, N >= M, 0};
    int total = j.split_n ? N : M;
    /* Below ~1 MFLOP the hand-off costs more than it saves. Every element is computed the
     * same way however the work is split (cpu_gemm.h), so the split is free to follow the
     * pool's size. */
    if (nt == 1 || flops < 1e6 || total < 2) {
        cpu_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* One chunk per thread, rounded to 32 so that panels stay whole. */
    int chunk = (total + nt - 1) / nt;
    chunk = (chunk + 31) / 32 * 32;
    j.chunk = chunk;
    cpu_pool_run(p, (total + chunk - 1) / chunk, cpu_gemm_task, &j);
}

/* ---- RMSNorm ------------------------------------------------------------------------- */

typedef struct {
    float *y, *rstd, *dx;
    const float *x, *w, *dy, *rstd_in;
    int dim;
    double eps;
    bool accumulate;
} cpu_norm_job;

static void cpu_rmsnorm_fwd_range(void *va, long b, long e, int thread)
{
    (void)thread;
    const cpu_norm_job *j = va;
    int D = j->dim;
    for (long r = b; r < e; r++) {
        const float *x = j->x + r * D;
        float *y = j->y + r * D;
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
        float rs = (float)(1.0 / sqrt(ss / D + j->eps));
        j->rstd[r] = rs;
        for (int i = 0; i < D; i++) y[i] = x[i] * rs * j->w[i];
    }
}

void cpu_rmsnorm_fwd(cpu_pool *p, float *y, float *rstd, const float *x, const float *w, long rows, int dim, double eps)
{
    cpu_norm_job j = {.y = y, .rstd = rstd, .x = x, .w = w, .dim = dim, .eps = eps};
    cpu_pool_for(p, rows, 1 + 4096 / dim, cpu_rmsnorm_fwd_range, &j);
}

/* With x̂ = x·rstd and g = dy·w: dx = rstd · (g − x̂ · mean(g · x̂)). */
static void cpu_rmsnorm_bwd_range(void *va, long b, long e, int thread)
{
    (void)thread;
    const cpu_norm_job *j = va;
    int D = j->dim;
    for (long r = b; r < e; r++) {
        const float *x = j->x + r * D, *dy = j->dy + r * D;
        float *dx = j->dx + r * D;
        double rs = j->rstd_in[r], dot = 0;
        for (int i = 0; i < D; i++) dot += (double)dy[i] * j->w[i] * x[i];
        double c = dot * rs * rs / D;
        for (int i = 0; i < D; i++) {
            float v = (float)(rs * ((double)dy[i] * j->w[i] - x[i] * c));
            dx[i] = j->accumulate ? dx[i] + v : v;
        }
    }
}

void cpu_rmsnorm_bwd(cpu_pool *p, float *dx, const float *dy, const float *x, const float *rstd, const float *w,
                     long rows, int dim, bool accumulate)
{
    cpu_norm_job j = {.dx = dx, .dy = dy, .x = x, .rstd_in = rstd, .w = w, .dim = dim, .accumulate = accumulate};
    cpu_pool_for(p, rows, 1 + 4096 / dim, cpu_rmsnorm_bwd_range, &j);
}

/* ---- RoPE ---------------------------------------------------------------------------- */

typedef struct {
    float *x;
    int nh, d;
    const int32_t *pos;
    const float *cos_t, *sin_t;
    bool inverse;
} cpu_rope_job;

/* rotate_half pairs element i with i + d/2 (not adjacent elements as in GPT-J style). */
static void cpu_rope_range(void *va, long b, long e, int thread)
{
    (void)thread;
    const cpu_rope_job *j = va;
    int d = j->d, half = d / 2;
    for (long t = b; t < e; t++) {
        const float *c = j->cos_t + (long)j->pos[t] * half, *s = j->sin_t + (long)j->pos[t] * half;
        for (int h = 0; h < j->nh; h++) {
            float *v = j->x + (t * j->nh + h) * d;
            for (int i = 0; i < half; i++) {
                float x1 = v[i], x2 = v[i + half], si = j->inverse ? -s[i] : s[i];
                v[i] = x1 * c[i] - x2 * si;
                v[i + half] = x2 * c[i] + x1 * si;
            }
        }
    }
}

void cpu_rope(cpu_pool *p, float *x, long T, int nh, int d, const int32_t *pos, const float *cos_t, const float *sin_t,
              bool inverse)
{
    cpu_rope_job j = {x, nh, d, pos, cos_t, sin_t, inverse};
    cpu_pool_for(p, T, 1 + 2048 / (nh * d), cpu_rope_range, &j);
}

/* ---- SwiGLU -------------------------------------------------------------------------- */

typedef struct {
    float *h, *dg, *du;
    const float *g, *u, *dh;
} cpu_swiglu_job;

static void cpu_swiglu_fwd_range(void *va, long b, long e, int thread)
{
    (void)thread;
    const cpu_swiglu_job *j = va;
    for (long i = b; i < e; i++) {
        float g = j->g[i];
        j->h[i] = g / (1.0f + expf(-g)) * j->u[i];
    }
}

/* silu'(g) = σ(g)·(1 + g·(1 − σ(g))). */
static void cpu_swiglu_bwd_range(void *va, long b, long e, int thread)
{
    (void)thread;
    const cpu_swiglu_job *j = va;
    for (long i = b; i < e; i++) {
        float g = j->g[i], sg = 1.0f / (1.0f + expf(-g)), dh = j->dh[i];
        j->dg[i] = dh * j->u[i] * sg * (1.0f + g * (1.0f - sg));
        j->du[i] = dh * g * sg;
    }
}

void cpu_swiglu_fwd(cpu_pool *p, float *h, const float *g, const float *u, long n)
{
    cpu_swiglu_job j = {.h = h, .g = g, .u = u};
    cpu_pool_for(p, n, 16384, cpu_swiglu_fwd_range, &j);
}

void cpu_swiglu_bwd(cpu_pool *p, float *dg, float *du, const float *dh, const float *g, const float *u, long n)
{
    cpu_swiglu_job j = {.dg = dg, .du = du, .dh = dh, .g = g, .u = u};
    cpu_pool_for(p, n, 16384, cpu_swiglu_bwd_range, &j);
}

/* ---- embedding, bias ----------------------------------------------------------------- */

void cpu_embed(cpu_pool *p, float *x, const float *table, const int32_t *tokens, long T, int H)
{
    (void)p;
    for (long t = 0; t < T; t++) memcpy(x + t * H, table + (long)tokens[t] * H, (size_t)H * sizeof(float));
}

void cpu_add_bias(cpu_pool *p, float *y, const float *b, long T, int n)
{
    (void)p;
    for (long t = 0; t < T; t++)
        for (int i = 0; i < n; i++) y[t * n + i] += b[i];
}
