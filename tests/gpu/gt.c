/* gt.c — the gpu test harness (see gt.h). */
#include "tests/gpu/gt.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

int gt_passed, gt_failed;
rng_state gt_rng;
static const char *gt_name = "gpu test";

void gt_init(const char *name)
{
    gt_name = name;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("%s: no CUDA device (%s): skipped\n", name, e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        exit(77);
    }
    struct cudaDeviceProp p;
    GT_CUDA(cudaGetDeviceProperties(&p, 0));
    GT_CUDA(cudaSetDevice(0));
    const char *env = getenv("GT_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    rng_seed(&gt_rng, seed);
    printf("%s: %s, sm_%d%d, %d SMs, %.1f GiB; GT_SEED=%llu\n", name, p.name, p.major, p.minor,
           p.multiProcessorCount, p.totalGlobalMem / 1073741824.0, (unsigned long long)seed);
}

bool gt_small(void) { return getenv("GT_SMALL") != NULL; }

int gt_finish(void)
{
    printf("%s: %d passed, %d failed\n", gt_name, gt_passed, gt_failed);
    return gt_failed ? 1 : 0;
}

void gt_cuda_ok(int rc, const char *what, const char *file, int line)
{
    if (rc == 0) return;
    printf("FATAL %s:%d: %s -> %d (%s)\n", file, line, what, rc, cudaGetErrorString((cudaError_t)rc));
    exit(1);
}

void gt_lcu_ok(int rc, const char *what, const char *file, int line)
{
    if (rc == 0) {
        /* catch asynchronous faults where they happen, not at some later call */
        cudaError_t e = cudaDeviceSynchronize();
        if (e == cudaSuccess) return;
        rc = (int)e;
    }
    printf("FATAL %s:%d: %s -> %d (%s)\n", file, line, what, rc, lcu_strerror(rc));
    exit(1);
}

bool gt_check(bool ok, const char *fmt, ...)
{
    if (ok) gt_passed++; else gt_failed++;
    if (!ok || getenv("GT_VERBOSE")) {
        va_list ap;
        va_start(ap, fmt);
        printf("%s ", ok ? "PASS" : "FAIL");
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
    }
    return ok;
}

double gt_uniform(double lo, double hi) { return lo + (hi - lo) * rng_uniform(&gt_rng); }
int gt_int(int lo, int hi) { return lo + (int)(rng_uniform(&gt_rng) * (hi - lo + 1)); }

void gt_fill(float *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)gt_uniform(lo, hi);
}

void gt_fill_bf16_exact(float *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++) x[i] = gt_round_bf16((float)gt_uniform(lo, hi));
}

uint16_t gt_f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float gt_bf2f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float gt_round_bf16(float f) { return gt_bf2f(gt_f2bf(f)); }

static void **gt_bufs; /* every gt_dev_poison buffer, in order (gt_dev_mark/release) */
static size_t gt_nbufs, gt_capbufs;

void *gt_dev_poison(size_t bytes)
{
    void *d = NULL;
    GT_CUDA(cudaMalloc(&d, bytes ? bytes : 16));
    GT_CUDA(cudaMemset(d, 0xff, bytes ? bytes : 16));
    if (gt_nbufs == gt_capbufs) {
        gt_capbufs = gt_capbufs ? 2 * gt_capbufs : 256;
        gt_bufs = realloc(gt_bufs, gt_capbufs * sizeof *gt_bufs);
        if (!gt_bufs) {
            fprintf(stderr, "FATAL gt_dev_poison: out of host memory\n");
            exit(1);
        }
    }
    gt_bufs[gt_nbufs++] = d;
    return d;
}

size_t gt_dev_mark(void) { return gt_nbufs; }

void gt_dev_release(size_t mark)
{
    GT_CUDA(cudaDeviceSynchronize());
    for (; gt_nbufs > mark; gt_nbufs--)
        if (gt_bufs[gt_nbufs - 1]) GT_CUDA(cudaFree(gt_bufs[gt_nbufs - 1]));
}

void *gt_dev_copy(const void *h, size_t bytes)
{
    void *d = gt_dev_poison(bytes);
    if (bytes) GT_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

void *gt_dev_f32(const float *h, size_t n) { return gt_dev_copy(h, n * sizeof(float)); }

void *gt_dev_bf16(const float *h, size_t n)
{
    uint16_t *b = malloc((n ? n : 1) * sizeof *b);
    for (size_t i = 0; i < n; i++) b[i] = gt_f2bf(h[i]);
    void *d = gt_dev_copy(b, n * sizeof *b);
    free(b);
    return d;
}

#define GT_POOL_N (1 << 22)

/* device pools of GT_POOL_N values in [lo, hi], kept per range (benchmarks ask for a few
 * ranges many times) */
static struct {
    double lo, hi;
    float *dev;
} gt_pools[8];
static int gt_npools;

void *gt_dev_random(size_t n, lcu_dtype t, double lo, double hi)
{
    static float *pool;
    if (!pool) {
        pool = malloc((size_t)GT_POOL_N * 4);
        for (size_t i = 0; i < GT_POOL_N; i++) pool[i] = (float)rng_uniform(&gt_rng);
    }
    float *src = NULL;
    for (int i = 0; i < gt_npools && !src; i++)
        if (gt_pools[i].lo == lo && gt_pools[i].hi == hi) src = gt_pools[i].dev;
    if (!src) {
        float *h = malloc((size_t)GT_POOL_N * 4);
        for (size_t i = 0; i < GT_POOL_N; i++) h[i] = (float)(lo + (hi - lo) * pool[i]);
        int slot = gt_npools < 8 ? gt_npools++ : 7; /* past 8 ranges the last slot is replaced */
        if (gt_pools[slot].dev) GT_CUDA(cudaFree(gt_pools[slot].dev));
        GT_CUDA(cudaMalloc((void **)&gt_pools[slot].dev, (size_t)GT_POOL_N * 4));
        GT_CUDA(cudaMemcpy(gt_pools[slot].dev, h, (size_t)GT_POOL_N * 4, cudaMemcpyHostToDevice));
        gt_pools[slot].lo = lo;
        gt_pools[slot].hi = hi;
        src = gt_pools[slot].dev;
        free(h);
    }
    size_t es = t == LCU_F32 ? 4 : 2;
    void *d = gt_dev_poison(n * es);
    for (size_t off = 0; off < n; off += GT_POOL_N - 7) { /* shifted copies: no exact period */
        size_t m = n - off < GT_POOL_N - 7 ? n - off : GT_POOL_N - 7;
        GT_LCU(lcu_convert((char *)d + off * es, t, src + (off / (GT_POOL_N - 7)) % 7, LCU_F32, m, 0));
    }
    return d;
}

void gt_get(void *h, const void *d, size_t bytes)
{
    if (bytes) GT_CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

void gt_get_f32(float *h, const void *d, size_t n) { gt_get(h, d, n * sizeof(float)); }

void gt_get_bf16(float *h, const void *d, size_t n)
{
    uint16_t *b = malloc((n ? n : 1) * sizeof *b);
    gt_get(b, d, n * sizeof *b);
    for (size_t i = 0; i < n; i++) h[i] = gt_bf2f(b[i]);
    free(b);
}

void gt_free(void *d)
{
    if (!d) return;
    for (size_t i = gt_nbufs; i-- > 0;)
        if (gt_bufs[i] == d) {
            gt_bufs[i] = NULL; /* not freed again by gt_dev_release */
            break;
        }
    GT_CUDA(cudaFree(d));
}

double gt_rel_err(const float *out, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) return INFINITY;
        double e = out[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-30);
}

double gt_rel_err_f(const float *out, const float *ref, size_t n)
{
    double *r = malloc((n ? n : 1) * sizeof *r);
    for (size_t i = 0; i < n; i++) r[i] = ref[i];
    double e = gt_rel_err(out, r, n);
    free(r);
    return e;
}

double gt_max_abs_err(const float *out, const double *ref, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) return INFINITY;
        m = fmax(m, fabs(out[i] - ref[i]));
    }
    return m;
}

size_t gt_worst(const float *out, const double *ref, size_t n)
{
    size_t w = 0;
    double m = -1;
    for (size_t i = 0; i < n; i++) {
        double e = isfinite(out[i]) ? fabs(out[i] - ref[i]) : INFINITY;
        if (e > m) { m = e; w = i; }
    }
    return w;
}

bool gt_expect_close(const char *what, const float *out, const double *ref, size_t n, double tol)
{
    double e = gt_rel_err(out, ref, n);
    size_t bad = n, nbad = 0;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(out[i])) { nbad++; if (bad == n) bad = i; }
    if (bad < n)
        return gt_check(false, "%s: element %zu of %zu is %g (unwritten or NaN; %zu such)", what, bad, n, out[bad], nbad);
    bool ok = gt_check(e <= tol, "%s: rel err %.3g (tol %.1g, n %zu)", what, e, tol, n);
    if (!ok) {
        size_t w = gt_worst(out, ref, n);
        printf("     worst element %zu: got %.9g, want %.9g\n", w, out[w], ref[w]);
    }
    return ok;
}

bool gt_expect_bits(const char *what, const void *a, const void *b, size_t bytes)
{
    const unsigned char *x = a, *y = b;
    size_t i = 0;
    while (i < bytes && x[i] == y[i]) i++;
    if (i == bytes) return gt_check(true, "%s: identical bits (%zu bytes)", what, bytes);
    return gt_check(false, "%s: bits differ first at byte %zu of %zu", what, i, bytes);
}

double gt_block_err(const float *out, const double *ref, size_t n, long nblocks, gt_block_fn block_of,
                    const void *arg, long *worst)
{
    double *num = calloc(nblocks > 0 ? nblocks : 1, sizeof *num), *den = calloc(nblocks > 0 ? nblocks : 1, sizeof *den);
    size_t *cnt = calloc(nblocks > 0 ? nblocks : 1, sizeof *cnt);
    double all = 0, e = 0;
    size_t nin = 0; /* elements in some block */
    long w = -1;
    for (size_t i = 0; i < n; i++) {
        long b = block_of(i, arg);
        if (b < 0 || b >= nblocks) continue;
        if (!isfinite(out[i])) {
            e = INFINITY;
            w = b;
            break;
        }
        double d = out[i] - ref[i];
        num[b] += d * d;
        den[b] += ref[i] * ref[i];
        cnt[b]++;
        nin++;
        all += ref[i] * ref[i];
    }
    for (long b = 0; b < nblocks && isfinite(e); b++) {
        if (!cnt[b]) continue;
        double floor_ = sqrt(all * (double)cnt[b] / (double)nin);
        double eb = sqrt(num[b]) / fmax(fmax(sqrt(den[b]), floor_), 1e-30);
        if (eb > e || w < 0) {
            e = eb;
            w = b;
        }
    }
    free(num);
    free(den);
    free(cnt);
    if (worst) *worst = w;
    return e;
}

bool gt_expect_blocks(const char *what, const char *unit, const float *out, const double *ref, size_t n, long nblocks,
                      gt_block_fn block_of, const void *arg, double tol, long *worst)
{
    long w;
    double e = gt_block_err(out, ref, n, nblocks, block_of, arg, &w);
    if (worst) *worst = w;
    return gt_check(e <= tol, "%s: worst %s (%ld of %ld): rel err %.3g (tol %.1g)", what, unit, w, nblocks, e, tol);
}

long gt_block_run(size_t i, const void *per) { return (long)(i / *(const size_t *)per); }
