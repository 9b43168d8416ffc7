/* cpu_gemm.c — the batch-invariant SGEMM (see cpu_gemm.h). A block of op(B) (CPU_GEMM_KC ×
 * NC) is packed into panels of the kernel's NR columns (zero-padded at the edge), and a
 * micro-kernel computes an MR × NR tile of fma chains, reading op(A) in place (rows past
 * the edge repeat a row), into a scratch tile that one routine adds into C. Padding rows
 * and columns are computed like the others and never written, so an element at the edge
 * of C goes through exactly the instructions of one in the middle.
 *
 * Own code rather than a library: no packaged BLAS states per-element invariance, and
 * OpenBLAS measurably lacks it (rows and columns of one product round differently by
 * their place in its tiles: docs/architecture.md, "Batch invariance"). The file is built
 * with -ffp-contract=off so that the C update is the same roundings in every kernel. */
#include "backend/cpu/cpu_gemm.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_GEMM_X86 1
#endif

#define NC 2048   /* columns of op(B) packed at a time (a multiple of every NR) */

/* acc[r·NR + c] = Σ_k a(r, k) · Bp[k·NR + c] with a(r, k) = A[r'·rs + k·ks] (r' = r for
 * r < rows, else 0: rows past the edge repeat row 0 and are never written back). */
typedef void (*kernel_fn)(int kc, const float *A, long rs, long ks, int rows, const float *Bp, float *acc);

typedef struct {
    const char *name;
    int mr, nr;
    kernel_fn run;
    bool (*supported)(void);
} gemm_kernel;

/* ---- kernels: each acc[r·NR + c] one fma chain over k ------------------------------------ */

static void kern_generic(int kc, const float *A, long rs, long ks, int rows, const float *Bp, float *acc)
{
    enum { MR = 4, NR = 8 };
    float c[MR][NR] = {{0}};
    const float *a[MR];
    for (int r = 0; r < MR; r++) a[r] = A + (r < rows ? r : 0) * rs;
    for (int k = 0; k < kc; k++)
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < NR; j++) c[r][j] = fmaf(a[r][k * ks], Bp[k * NR + j], c[r][j]);
    memcpy(acc, c, sizeof c);
}

static bool always(void) { return true; }

#ifdef CPU_GEMM_X86
__attribute__((target("avx2,fma"))) static void kern_avx2(int kc, const float *A, long rs, long ks, int rows,
                                                          const float *Bp, float *acc)
{
    __m256 c[6][2];
    const float *a[6];
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++) {
        c[r][0] = c[r][1] = _mm256_setzero_ps();
        a[r] = A + (r < rows ? r : 0) * rs;
    }
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(Bp + 16 * k), b1 = _mm256_loadu_ps(Bp + 16 * k + 8);
#pragma GCC unroll 6
        for (int r = 0; r < 6; r++) {
            __m256 v = _mm256_broadcast_ss(a[r] + k * ks);
            c[r][0] = _mm256_fmadd_ps(v, b0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(v, b1, c[r][1]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++) {
        _mm256_storeu_ps(acc + 16 * r, c[r][0]);
        _mm256_storeu_ps(acc + 16 * r + 8, c[r][1]);
    }
}

__attribute__((target("avx512f"))) static void kern_avx512(int kc, const float *A, long rs, long ks, int rows,
                                                          const float *Bp, float *acc)
{
    __m512 c[12][2];
    const float *a[12];
#pragma GCC unroll 12
    for (int r = 0; r < 12; r++) {
        c[r][0] = c[r][1] = _mm512_setzero_ps();
        a[r] = A + (r < rows ? r : 0) * rs;
    }
    for (int k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(Bp + 32 * k), b1 = _mm512_loadu_ps(Bp + 32 * k + 16);
#pragma GCC unroll 12
        for (int r = 0; r < 12; r++) {
            __m512 v = _mm512_set1_ps(a[r][k * ks]);
            c[r][0] = _mm512_fmadd_ps(v, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(v, b1, c[r][1]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < 12; r++) {
        _mm512_storeu_ps(acc + 32 * r, c[r][0]);
        _mm512_storeu_ps(acc + 32 * r + 16, c[r][1]);
    }
}

static bool has_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
static bool has_avx512(void) { return __builtin_cpu_supports("avx512f"); }
#endif

static const gemm_kernel KERNELS[] = {
#ifdef CPU_GEMM_X86
    {"avx512", 12, 32, kern_avx512, has_avx512},
    {"avx2", 6, 16, kern_avx2, has_avx2},
#endif
    {"generic", 4, 8, kern_generic, always},
};
#define NKERNELS (int)(sizeof KERNELS / sizeof KERNELS[0])

static const gemm_kernel *g_kernel;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* The widest kernel this CPU runs, or LOOM_CPU_GEMM_KERNEL's when it can. */
static void pick_kernel(void)
{
    const char *want = getenv("LOOM_CPU_GEMM_KERNEL");
    for (int i = 0; i < NKERNELS && !g_kernel; i++)
        if ((!want || !*want || !strcmp(want, KERNELS[i].name)) && KERNELS[i].supported()) g_kernel = &KERNELS[i];
    if (!g_kernel) g_kernel = &KERNELS[NKERNELS - 1];
}

static const gemm_kernel *kernel(void)
{
    pthread_once(&g_once, pick_kernel);
    return g_kernel;
}

const char *cpu_gemm_kernel(void) { return kernel()->name; }

bool cpu_gemm_use_kernel(const char *name)
{
    kernel();
    for (int i = 0; i < NKERNELS; i++)
        if (!strcmp(KERNELS[i].name, name) && KERNELS[i].supported()) {
            g_kernel = &KERNELS[i];
            return true;
        }
    return false;
}

/* ---- per-thread packing buffers --------------------------------------------------------- */

typedef struct {
    float *b;
    size_t cap_b;
} pack_bufs;

static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;

static void free_bufs(void *p)
{
    pack_bufs *b = p;
    free(b->b);
    free(b);
}

static void make_key(void) { pthread_key_create(&g_key, free_bufs); }

static float *grow(float **p, size_t *cap, size_t n)
{
    if (n <= *cap) return *p;
    free(*p);
    if (posix_memalign((void **)p, 64, n * sizeof(float)) != 0) { *p = NULL; *cap = 0; return NULL; }
    *cap = n;
    return *p;
}

static pack_bufs *bufs(void)
{
    pthread_once(&g_key_once, make_key);
    pack_bufs *b = pthread_getspecific(g_key);
    if (!b && (b = calloc(1, sizeof *b))) pthread_setspecific(g_key, b);
    return b;
}

/* ---- packing ------------------------------------------------------------------------------ */

/* op(B)[k0.., j0..] (kc × nc) into panels of NR columns: Bp[p][k][c], zero columns past nc. */
static void pack_b(bool tb, const float *B, int ldb, int k0, int kc, int j0, int nc, int NR, float *Bp)
{
    for (int p = 0; p < nc; p += NR) {
        float *dst = Bp + (size_t)p * kc;
        int cols = nc - p < NR ? nc - p : NR;
        if (tb) {   /* op(B)'s column c is B's row c: transposed in 8 × 8 tiles (cache lines both ways) */
            int c8 = cols / 8 * 8, k8 = kc / 8 * 8;
            for (int c = 0; c < c8; c += 8)
                for (int k = 0; k < k8; k += 8) {
                    const float *src = B + (long)(j0 + p + c) * ldb + k0 + k;
                    float *d = dst + (size_t)k * NR + c;
                    for (int i = 0; i < 8; i++)
                        for (int j = 0; j < 8; j++) d[(size_t)i * NR + j] = src[(long)j * ldb + i];
                }
            for (int c = 0; c < NR; c++) {   /* the edges: k past k8, columns past c8 (zero past cols) */
                const float *src = B + (long)(j0 + p + c) * ldb + k0;
                for (int k = c < c8 ? k8 : 0; k < kc; k++) dst[(size_t)k * NR + c] = c < cols ? src[k] : 0.0f;
            }
            continue;
        }
        for (int k = 0; k < kc; k++) {
            float *d = dst + (size_t)k * NR;
            memcpy(d, B + (long)(k0 + k) * ldb + j0 + p, (size_t)cols * sizeof(float));
            for (int c = cols; c < NR; c++) d[c] = 0.0f;
        }
    }
}

/* ---- the driver ----------------------------------------------------------------------------- */

/* The one place C changes: the same roundings for every element and kernel (separate
 * multiplies and adds, each rounded: vectorised or not, the same bits). */
static void update(float *C, int ldc, const float *acc, int NR, int rows, int cols, float alpha, float beta, bool first)
{
    for (int r = 0; r < rows; r++) {
        float *restrict c = C + (long)r * ldc;
        const float *restrict a = acc + (size_t)r * NR;
        if (!first)
            for (int j = 0; j < cols; j++) c[j] = c[j] + alpha * a[j];
        else if (beta == 0.0f)
            for (int j = 0; j < cols; j++) c[j] = alpha * a[j];
        else
            for (int j = 0; j < cols; j++) c[j] = beta * c[j] + alpha * a[j];
    }
}

void cpu_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(long)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(long)i * ldc + j];
        return;
    }
    const gemm_kernel *kn = kernel();
    int MR = kn->mr, NR = kn->nr;
    pack_bufs *pb = bufs();
    int kcmax = K < CPU_GEMM_KC ? K : CPU_GEMM_KC, ncmax = N < NC ? N : NC;
    size_t need_b = (size_t)kcmax * ((ncmax + NR - 1) / NR * NR);
    float *Bp = pb ? grow(&pb->b, &pb->cap_b, need_b) : NULL;
    if (!Bp) abort();   /* a few hundred KB of scratch: nothing sensible is left to do */
    /* op(A) is read in place (a(i, k) = A[i·rs + k·ks]): the kernels broadcast one value
     * per row and k, so packing it would only copy it once more. */
    long rs = ta ? 1 : lda, ks = ta ? lda : 1;
    float acc[12 * 32];
    for (int jc = 0; jc < N; jc += NC) {
        int nc = N - jc < NC ? N - jc : NC;
        for (int pc = 0; pc < K; pc += CPU_GEMM_KC) {
            int kc = K - pc < CPU_GEMM_KC ? K - pc : CPU_GEMM_KC;
            pack_b(tb, B, ldb, pc, kc, jc, nc, NR, Bp);
            for (int ir = 0; ir < M; ir += MR) {
                int rows = M - ir < MR ? M - ir : MR;
                const float *a = A + ir * rs + pc * ks;
                for (int jr = 0; jr < nc; jr += NR) {
                    kn->run(kc, a, rs, ks, rows, Bp + (size_t)jr * kc, acc);
                    update(C + (long)ir * ldc + jc + jr, ldc, acc, NR, rows, nc - jr < NR ? nc - jr : NR, alpha, beta,
                           pc == 0);
                }
            }
        }
    }
}
