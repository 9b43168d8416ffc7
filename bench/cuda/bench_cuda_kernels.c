/* bench_cuda_kernels.c — times the CUDA kernel layer at the geometries (Qwen3-0.6B,
 * Llama-3.2-1B, Qwen3-8B) and token counts (512, 2K, 8K, 32K) and prints each kernel's time
 * against its two floors: FLOPs over 989 TFLOP/s (H100 dense bf16) and bytes over
 * 3.35 TB/s, plus the ceilings measured here (a device-to-device copy, a bf16 8192³ GEMM).
 * The attention rows: the own kernels' versions 1 (wmma) and 2 (mma), then cuDNN's fused
 * attention through the kernel layer (cudnn, where libcudnn loads: lcu_cudnn_attn_*).
 * Prints figures; never a test. bench/cuda/NOTES.md explains the counts.
 *
 *   bench_cuda_kernels [--quick] [--geo NAME] [--csv FILE]
 * --quick: 512 and 2K tokens only. Exit status 77 without a device (like the gpu tests).
 */
#include "common/clock.h"
#include "tests/gpu/gt.h"

#include <math.h>
#include <string.h>

#define PEAK_TFLOPS 989.0
#define PEAK_TBS 3.35

typedef struct {
    const char *name;
    int H, nq, nkv, d, I, V, L;
} geo;

static const geo geos[] = {
    {"Qwen3-0.6B", 1024, 16, 8, 128, 3072, 151936, 28},
    {"Llama-3.2-1B", 2048, 32, 8, 64, 8192, 128256, 16},
    {"Qwen3-8B", 4096, 32, 8, 128, 12288, 151936, 36},
};

static FILE *csv;
static double ceil_tflops, ceil_tbs;
static lcu_ctx *ctx;
static lcu_cudnn *dnn; /* cuDNN's fused attention, when libcudnn loads here */

/* Inside the timed region: checks the status only (GT_LCU synchronizes after each call,
 * which would time the host's wake-up instead of the kernels); a fault surfaces at the
 * event synchronization of time_ms. */
#define B_OK(call)                                                                                      \
    do {                                                                                                \
        int rc_ = (call);                                                                               \
        if (rc_) { printf("FATAL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, lcu_cudnn_strerror(rc_)); exit(1); } \
    } while (0)

/* Buffers with random contents (never zeros): uniform in [−scale, scale]. */
static void *dev_random(size_t n, lcu_dtype t, double scale) { return gt_dev_random(n, t, -scale, scale); }

/* ---- timing -------------------------------------------------------------------------------- */

typedef void (*bench_fn)(void *arg);

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Elapsed milliseconds of n back-to-back calls of fn between two events. */
static double time_batch(bench_fn fn, void *arg, int n, cudaEvent_t e0, cudaEvent_t e1)
{
    float ms;
    GT_CUDA(cudaEventRecord(e0, 0));
    for (int i = 0; i < n; i++) fn(arg);
    GT_CUDA(cudaEventRecord(e1, 0));
    GT_CUDA(cudaEventSynchronize(e1));
    GT_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    return ms;
}

/* Median milliseconds per call of fn, after a warm-up call (plans, attributes). Calls are
 * timed in batches of `inner` back-to-back calls (at least ~1 ms per batch, so that the
 * launch gap after an event and the event resolution do not count for microsecond
 * kernels), over enough batches for ~0.3 s (3 to 25). */
static double time_ms(bench_fn fn, void *arg)
{
    cudaEvent_t e0, e1;
    GT_CUDA(cudaEventCreate(&e0));
    GT_CUDA(cudaEventCreate(&e1));
    fn(arg);
    GT_CUDA(cudaDeviceSynchronize());
    GT_CUDA(cudaGetLastError());
    double one = time_batch(fn, arg, 1, e0, e1);
    int inner = one >= 1.0 ? 1 : (int)fmin(200.0, ceil(1.0 / fmax(one, 5e-3)));
    int reps = (int)(300.0 / (one * inner + 1e-3));
    reps = reps < 3 ? 3 : reps > 25 ? 25 : reps;
    double t[25];
    for (int i = 0; i < reps; i++) t[i] = time_batch(fn, arg, inner, e0, e1) / inner;
    GT_CUDA(cudaGetLastError());
    qsort(t, reps, sizeof t[0], cmp_d);
    GT_CUDA(cudaEventDestroy(e0));
    GT_CUDA(cudaEventDestroy(e1));
    return t[reps / 2];
}

/* One result row: time, rates, and the floor (the larger of FLOPs/peak and bytes/peak). */
static void report(const char *kernel, const char *g, const char *shape, double ms, double flops, double bytes)
{
    double tf = flops / (ms * 1e-3) / 1e12, tb = bytes / (ms * 1e-3) / 1e12;
    double floor_ms = fmax(flops / (PEAK_TFLOPS * 1e12), bytes / (PEAK_TBS * 1e12)) * 1e3;
    printf("%-22s %-13s %-22s %10.3f ms %8.1f TFLOP/s %6.2f TB/s  floor %9.3f ms  x%.1f\n", kernel, g, shape, ms, tf, tb,
           floor_ms, ms / floor_ms);
    if (csv) { /* row by row: a run stopped at its time limit keeps what it measured */
        fprintf(csv, "%s,%s,%s,%.6f,%.3f,%.4f,%.6f\n", kernel, g, shape, ms, tf, tb, floor_ms);
        fflush(csv);
    }
}

/* ---- ceilings ------------------------------------------------------------------------------- */

typedef struct {
    void *a, *b;
    size_t bytes;
    lcu_gemm_args g;
} simple_arg;

static void run_copy(void *p)
{
    simple_arg *s = p;
    GT_CUDA(cudaMemcpyAsync(s->b, s->a, s->bytes, cudaMemcpyDeviceToDevice, 0));
}

static void run_gemm(void *p)
{
    simple_arg *s = p;
    int rc = lcu_gemm(ctx, &s->g, 0);
    if (rc) { printf("lcu_gemm: %s\n", lcu_strerror(rc)); exit(1); }
}

static void ceilings(void)
{
    simple_arg s = {0};
    s.bytes = (size_t)2 << 30;
    GT_CUDA(cudaMalloc(&s.a, s.bytes));
    GT_CUDA(cudaMalloc(&s.b, s.bytes));
    GT_CUDA(cudaMemset(s.a, 0x3c, s.bytes));
    double ms = time_ms(run_copy, &s);
    ceil_tbs = 2.0 * s.bytes / (ms * 1e-3) / 1e12;
    report("d2d copy (ceiling)", "-", "2 GiB", ms, 0, 2.0 * s.bytes);
    GT_CUDA(cudaFree(s.a));
    GT_CUDA(cudaFree(s.b));
    int n = 8192;
    void *A = dev_random((size_t)n * n, LCU_BF16, 1), *B = dev_random((size_t)n * n, LCU_BF16, 1);
    void *D = gt_dev_poison((size_t)n * n * 2);
    s.g = (lcu_gemm_args){false, true, n, n, n, 1.0f, 0.0f, A, n, B, n, NULL, 0, D, n, LCU_BF16};
    ms = time_ms(run_gemm, &s);
    ceil_tflops = 2.0 * n * n * (double)n / (ms * 1e-3) / 1e12;
    report("gemm bf16 (ceiling)", "-", "8192^3", ms, 2.0 * n * n * (double)n, 3.0 * n * n * 2);
    printf("measured ceilings: %.0f TFLOP/s (%.0f%% of %.0f), %.2f TB/s (%.0f%% of %.2f)\n\n", ceil_tflops,
           100 * ceil_tflops / PEAK_TFLOPS, PEAK_TFLOPS, ceil_tbs, 100 * ceil_tbs / PEAK_TBS, PEAK_TBS);
    gt_free(A); gt_free(B); gt_free(D);
}

/* ---- attention ------------------------------------------------------------------------------ */

typedef struct {
    lcu_attn_desc a;
    int max_len;
    void *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv, *ws;
} attn_arg;

static void run_attn_fwd(void *p)
{
    attn_arg *x = p;
    B_OK(lcu_attn_fwd(&x->a, x->q, x->k, x->v, x->o, x->lse, x->ws, 0));
}

static void run_attn_bwd(void *p)
{
    attn_arg *x = p;
    B_OK(lcu_attn_bwd(&x->a, x->q, x->k, x->v, x->o, x->lse, x->dout, x->dq, x->dk, x->dv, x->ws, 0));
}

/* cuDNN's: the backward's time includes widening its bf16 gradients to the kernel layer's fp32 */
static void run_cudnn_fwd(void *p)
{
    attn_arg *x = p;
    B_OK(lcu_cudnn_attn_fwd(dnn, &x->a, x->max_len, x->q, x->k, x->v, x->o, x->lse, 0));
}

static void run_cudnn_bwd(void *p)
{
    attn_arg *x = p;
    B_OK(lcu_cudnn_attn_bwd(dnn, &x->a, x->max_len, x->q, x->k, x->v, x->o, x->lse, x->dout, x->dq, x->dk, x->dv, 0));
}

/* The first call of a bucket builds cuDNN's plan (runtime-compiled kernels): its time once,
 * then the rows. A bucket cuDNN refuses says so instead. */
static void bench_cudnn_attention(attn_arg *x, const geo *g, const char *shape, double fwd_flops, double fwd_bytes,
                                  double bwd_bytes)
{
    int rc[2];
    double t0 = clock_mono_s();
    rc[0] = lcu_cudnn_attn_fwd(dnn, &x->a, x->max_len, x->q, x->k, x->v, x->o, x->lse, 0);
    GT_CUDA(cudaDeviceSynchronize());
    double t1 = clock_mono_s();
    rc[1] = rc[0] ? rc[0] : lcu_cudnn_attn_bwd(dnn, &x->a, x->max_len, x->q, x->k, x->v, x->o, x->lse, x->dout, x->dq,
                                               x->dk, x->dv, 0);
    GT_CUDA(cudaDeviceSynchronize());
    if (rc[0] || rc[1]) {
        printf("attention cudnn         %-13s %-22s not run: %s\n", g->name, shape, lcu_cudnn_strerror(rc[0] ? rc[0] : rc[1]));
        return;
    }
    printf("attention cudnn         %-13s %-22s first calls (plans built): fwd %.0f ms, bwd %.0f ms; workspace %.0f MiB\n",
           g->name, shape, (t1 - t0) * 1e3, (clock_mono_s() - t1) * 1e3, lcu_cudnn_workspace_bytes(dnn) / 1048576.0);
    report("attention fwd cudnn", g->name, shape, time_ms(run_cudnn_fwd, x), fwd_flops, fwd_bytes);
    report("attention bwd cudnn", g->name, shape, time_ms(run_cudnn_bwd, x), 2.5 * fwd_flops, bwd_bytes);
}

static void bench_attention(const geo *g, long T, int seqlen)
{
    int nseq = (int)(T / seqlen);
    int32_t *qs = malloc((nseq + 1) * 4);
    for (int i = 0; i <= nseq; i++) qs[i] = i * seqlen;
    attn_arg x;
    long qd = (long)g->nq * g->d, kvd = (long)g->nkv * g->d;
    x.a = (lcu_attn_desc){nseq, gt_dev_copy(qs, (nseq + 1) * 4), NULL, NULL, T, g->nq, g->nkv, g->d,
                          (float)(1.0 / sqrt((double)g->d))};
    x.max_len = seqlen;
    x.q = dev_random(T * qd, LCU_BF16, 1);
    x.k = dev_random(T * kvd, LCU_BF16, 1);
    x.v = dev_random(T * kvd, LCU_BF16, 1);
    x.dout = dev_random(T * qd, LCU_BF16, 1);
    x.o = gt_dev_poison(T * qd * 2);
    x.lse = gt_dev_poison(T * g->nq * 4);
    x.dq = gt_dev_poison(T * qd * 4);
    x.dk = gt_dev_poison(T * kvd * 4);
    x.dv = gt_dev_poison(T * kvd * 4);
    x.ws = gt_dev_poison(lcu_attn_workspace_bytes(&x.a));
    /* causal matmul FLOPs: QKᵀ and PV over n(n+1)/2 pairs per sequence and head */
    double pairs = (double)nseq * seqlen * (seqlen + 1) / 2.0;
    double fwd_flops = 4.0 * pairs * g->d * g->nq;
    double fwd_bytes = (T * qd * 2.0) * 2 + T * kvd * 2.0 * 2 + T * g->nq * 4.0;
    char shape[64];
    snprintf(shape, sizeof shape, "%ldx%d", (long)nseq, seqlen);
    /* backward counted as 2.5x the forward's products (the flash-attention convention; these
     * kernels do 3.5x: S and dP are recomputed in both the dK/dV and the dQ pass) */
    double bwd_bytes = T * qd * 2.0 * 3 + T * kvd * 2.0 * 2 + T * g->nq * 8.0 + T * qd * 4.0 + T * kvd * 8.0;
    const char *variants[2] = {"wmma", "mma"};
    for (int vi = 0; vi < 2; vi++) { /* kernel versions 1 and 2 (LCU_ATTN) */
        char name[40];
        setenv("LCU_ATTN", variants[vi], 1);
        snprintf(name, sizeof name, "attention fwd %s", variants[vi]);
        report(name, g->name, shape, time_ms(run_attn_fwd, &x), fwd_flops, fwd_bytes);
        snprintf(name, sizeof name, "attention bwd %s", variants[vi]);
        report(name, g->name, shape, time_ms(run_attn_bwd, &x), 2.5 * fwd_flops, bwd_bytes);
    }
    unsetenv("LCU_ATTN");
    if (dnn) bench_cudnn_attention(&x, g, shape, fwd_flops, fwd_bytes, bwd_bytes);
    void *bufs[] = {(void *)x.a.q_start, x.q, x.k, x.v, x.dout, x.o, x.lse, x.dq, x.dk, x.dv, x.ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(bufs[i]);
    free(qs);
}

/* ---- output head ------------------------------------------------------------------------- */

typedef struct {
    const geo *g;
    long T;
    int R;
    void *xf, *W, *logits, *dlog, *dxf;
    lcu_head_batch hb;
    bool only_loss;
} head_arg;

static void run_head(void *p)
{
    head_arg *h = p;
    int V = h->g->V, H = h->g->H;
    for (long c0 = 0; c0 < h->T; c0 += h->R) {
        int n = (int)(h->T - c0 < h->R ? h->T - c0 : h->R);
        if (!h->only_loss) {
            lcu_gemm_args a = {false, true, n, V, H, 1.0f, 0.0f, (lcu_bf16 *)h->xf + c0 * H, H, h->W, H, NULL, 0,
                               h->logits, V, LCU_F32};
            B_OK(lcu_gemm(ctx, &a, 0));
        }
        B_OK(lcu_head_loss(h->logits, V, c0, n, V, &h->hb, h->dlog, V, 0));
        if (!h->only_loss) {
            lcu_gemm_args b = {false, false, n, H, V, 1.0f, 0.0f, h->dlog, V, h->W, H, NULL, 0,
                               (float *)h->dxf + c0 * H, H, LCU_F32};
            B_OK(lcu_gemm(ctx, &b, 0));
        }
    }
}

static void bench_head(const geo *g, long T)
{
    head_arg h = {g, T, 512, NULL, NULL, NULL, NULL, NULL, {0}, false};
    int V = g->V, H = g->H;
    h.xf = dev_random(T * H, LCU_BF16, 1);
    h.W = dev_random((size_t)V * H, LCU_BF16, 0.05);
    h.logits = gt_dev_poison((size_t)h.R * V * 4);
    h.dlog = gt_dev_poison((size_t)h.R * V * 2);
    h.dxf = gt_dev_poison(T * H * 4);
    int32_t *rs = calloc(T, 4), *tg = malloc(T * 4);
    int64_t *ts = malloc((T + 1) * 8);
    for (long t = 0; t <= T; t++) ts[t] = t;
    for (long t = 0; t < T; t++) tg[t] = (int32_t)((t * 7919) % V);
    lcu_loss_seq ls = {0, 1, 0.8, 1.2, 0.05};
    h.hb = (lcu_head_batch){gt_dev_copy(rs, T * 4), gt_dev_copy(&ls, sizeof ls), gt_dev_copy(ts, (T + 1) * 8),
                            gt_dev_copy(tg, T * 4), NULL, NULL, NULL, gt_dev_poison(T * 4), gt_dev_poison(T * 4),
                            gt_dev_poison(T * 8)};
    char shape[64];
    snprintf(shape, sizeof shape, "T=%ld V=%d", T, V);
    double ms = time_ms(run_head, &h);
    report("head fwd+bwd (3 steps)", g->name, shape, ms, 4.0 * T * V * (double)H,
           (double)V * H * 2 * 2 * ((T + h.R - 1) / h.R) + T * H * 6.0 + T * (double)V * 12);
    /* the loss kernel alone over logits already in place: a pass over the chunk */
    h.only_loss = true;
    ms = time_ms(run_head, &h);
    report("head loss kernel", g->name, shape, ms, 0, T * (double)V * (4 + 2));
    void *bufs[] = {h.xf, h.W, h.logits, h.dlog, h.dxf, (void *)h.hb.row_seq, (void *)h.hb.seqs,
                    (void *)h.hb.tgt_start, (void *)h.hb.targets, h.hb.lp_out, h.hb.loss_out, h.hb.lse_out};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(bufs[i]);
    free(rs); free(tg); free(ts);
}

/* ---- LoRA segments ---------------------------------------------------------------------------- */

typedef struct {
    int in, out, nseg;
    lcu_lora_seg segs[32];
    void *x, *y, *dy, *dx, *z, *dz;
} lora_arg;

static void run_lora(void *p)
{
    lora_arg *l = p;
    long ldz = lcu_lora_ldz(32);
    B_OK(lcu_lora_fwd(ctx, l->segs, l->nseg, l->in, l->out, l->x, l->in, l->y, l->out, l->z, ldz, 0));
    B_OK(lcu_lora_bwd(ctx, l->segs, l->nseg, l->in, l->out, l->x, l->in, l->dy, l->out, l->dx, l->in, l->z, l->dz, ldz,
                      0));
}

static double bench_lora(const geo *g, long T, const char *mod, int in, int out, int nad, double one_ms)
{
    const int r = 32;
    lora_arg l;
    memset(&l, 0, sizeof l);
    l.in = in;
    l.out = out;
    l.nseg = nad;
    l.x = dev_random(T * in, LCU_BF16, 1);
    l.dy = dev_random(T * out, LCU_BF16, 1);
    l.y = dev_random(T * out, LCU_F32, 1);
    l.dx = dev_random(T * in, LCU_F32, 1);
    l.z = gt_dev_poison(T * lcu_lora_ldz(r) * 2);
    l.dz = gt_dev_poison(T * lcu_lora_ldz(r) * 2);
    for (int s = 0; s < nad; s++) {
        long b = T * s / nad, e = T * (s + 1) / nad;
        l.segs[s] = (lcu_lora_seg){b, e, r, 32.0f / r, dev_random((size_t)r * in, LCU_BF16, 0.02),
                                   dev_random((size_t)out * r, LCU_BF16, 0.02), dev_random((size_t)r * in, LCU_F32, 0.01),
                                   dev_random((size_t)out * r, LCU_F32, 0.01)};
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%s T=%ld x%d ad", mod, T, nad);
    double ms = time_ms(run_lora, &l);
    /* fwd: shrink + expand; bwd: shrink again, gB, dz, gA, dx */
    double flops = 2.0 * T * r * (in + out) + 2.0 * T * r * (3.0 * in + 2.0 * out);
    double bytes = T * (in * 2.0 * 3 + out * 2.0 * 2 + out * 8.0 + in * 8.0) + nad * (double)r * (in + out) * (2 + 8);
    char name[40];
    snprintf(name, sizeof name, "lora fwd+bwd r=32 %s", getenv("LCU_LORA") ? getenv("LCU_LORA") : "auto");
    report(name, g->name, shape, ms, flops, bytes);
    if (one_ms > 0) printf("%-22s %-13s %-22s %.2fx the time of one adapter\n", "", "", "", ms / one_ms);
    gt_free(l.x); gt_free(l.dy); gt_free(l.y); gt_free(l.dx); gt_free(l.z); gt_free(l.dz);
    for (int s = 0; s < nad; s++) {
        gt_free((void *)l.segs[s].A); gt_free((void *)l.segs[s].B); gt_free(l.segs[s].gA); gt_free(l.segs[s].gB);
    }
    return ms;
}

/* ---- LoRA version 3 (LCU_LORA=sgmv3, backend/cuda/lcu_sgmv3.cu) ------------------------------ */
/* Its rows next to the gemm/sgmv ones above, at the same shapes (the q projection, x1/x8/x32
 * adapters), then decode-sized LoRA forwards for every path: 32 rows over 8 adapters (4 rows
 * each, as `bench_cuda --decode`'s 8x4 rows), r=32, on the q projection and on down (the
 * widest input). Kept in functions of their own so that they merge apart from other rows. */

static void run_lora_fwd(void *p)
{
    lora_arg *l = p;
    B_OK(lcu_lora_fwd(ctx, l->segs, l->nseg, l->in, l->out, l->x, l->in, l->y, l->out, l->z, lcu_lora_ldz(32), 0));
}

static void bench_lora_decode(const geo *g, const char *mod, int in, int out, const char *label)
{
    const int r = 32, nad = 8;
    const long T = 32;
    lora_arg l;
    memset(&l, 0, sizeof l);
    l.in = in;
    l.out = out;
    l.nseg = nad;
    l.x = dev_random(T * in, LCU_BF16, 1);
    l.y = dev_random(T * out, LCU_F32, 1);
    l.z = gt_dev_poison(T * lcu_lora_ldz(r) * 2);
    for (int s = 0; s < nad; s++)
        l.segs[s] = (lcu_lora_seg){T * s / nad, T * (s + 1) / nad, r, 32.0f / r,
                                   dev_random((size_t)r * in, LCU_BF16, 0.02), dev_random((size_t)out * r, LCU_BF16, 0.02),
                                   NULL, NULL};
    char shape[64], name[40];
    snprintf(shape, sizeof shape, "%s %ld rows x%d ad", mod, T, nad);
    snprintf(name, sizeof name, "lora fwd r=32 %s", label);
    /* every adapter's A and B once, x, y read and written, z written and read */
    double bytes = nad * (double)r * (in + out) * 2 + T * (in * 2.0 + out * 8.0) + T * r * 4.0;
    report(name, g->name, shape, time_ms(run_lora_fwd, &l), 2.0 * T * r * (in + out), bytes);
    gt_free(l.x); gt_free(l.y); gt_free(l.z);
    for (int s = 0; s < nad; s++) { gt_free((void *)l.segs[s].A); gt_free((void *)l.segs[s].B); }
}

static void bench_lora_v3(const geo *g, long T)
{
    setenv("LCU_LORA", "sgmv3", 1);
    unsetenv("LCU_SGMV3_SMALL");
    double one = bench_lora(g, T, "q", g->H, g->nq * g->d, 1, 0);
    bench_lora(g, T, "q", g->H, g->nq * g->d, 8, one);
    bench_lora(g, T, "q", g->H, g->nq * g->d, 32, one);
    if (T == 512) { /* decode rows, once per geometry: every path, and version 3 without its small kernels */
        static const struct { const char *label, *lora, *small; } paths[] = {
            {"gemm", "gemm", NULL}, {"sgmv", "sgmv", NULL}, {"sgmv3", "sgmv3", NULL}, {"sgmv3 tiled", "sgmv3", "0"}};
        for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
            setenv("LCU_LORA", paths[i].lora, 1);
            if (paths[i].small) setenv("LCU_SGMV3_SMALL", paths[i].small, 1);
            else unsetenv("LCU_SGMV3_SMALL");
            bench_lora_decode(g, "q", g->H, g->nq * g->d, paths[i].label);
            bench_lora_decode(g, "down", g->I, g->H, paths[i].label);
        }
        unsetenv("LCU_SGMV3_SMALL");
    }
    unsetenv("LCU_LORA");
}

/* ---- base GEMMs and elementwise --------------------------------------------------------------- */

static void bench_gemm_shape(const geo *g, long T, const char *what, int N, int K)
{
    simple_arg s = {0};
    void *A = dev_random(T * K, LCU_BF16, 1), *B = dev_random((size_t)N * K, LCU_BF16, 0.05), *D = gt_dev_poison(T * N * 4);
    s.g = (lcu_gemm_args){false, true, (int)T, N, K, 1.0f, 0.0f, A, K, B, K, NULL, 0, D, N, LCU_F32};
    char shape[64];
    snprintf(shape, sizeof shape, "%s %ldx%dx%d", what, T, N, K);
    double ms = time_ms(run_gemm, &s);
    report("gemm bf16->f32", g->name, shape, ms, 2.0 * T * N * K, T * K * 2.0 + (double)N * K * 2 + T * N * 4.0);
    gt_free(A); gt_free(B); gt_free(D);
}

typedef struct {
    long rows;
    int dim;
    void *x, *w, *y, *rstd, *g, *u;
} ew_arg;

static void run_norm(void *p)
{
    ew_arg *e = p;
    B_OK(lcu_rmsnorm_fwd(e->y, LCU_BF16, e->rstd, e->x, e->w, e->rows, e->dim, 1e-6, 0));
}

static void run_swiglu(void *p)
{
    ew_arg *e = p;
    B_OK(lcu_swiglu_fwd(e->y, LCU_BF16, e->g, e->u, e->rows * e->dim, 0));
}

static void bench_elementwise(const geo *g, long T)
{
    ew_arg e;
    memset(&e, 0, sizeof e);
    e.rows = T;
    e.dim = g->H;
    e.x = dev_random(T * g->H, LCU_F32, 1);
    e.w = dev_random(g->H, LCU_BF16, 1);
    e.y = gt_dev_poison(T * (long)g->I * 2);
    e.rstd = gt_dev_poison(T * 4);
    char shape[64];
    snprintf(shape, sizeof shape, "T=%ld H=%d", T, g->H);
    report("rmsnorm fwd f32->bf16", g->name, shape, time_ms(run_norm, &e), 0, T * g->H * 6.0);
    e.dim = g->I;
    e.g = dev_random(T * g->I, LCU_F32, 1);
    e.u = dev_random(T * g->I, LCU_F32, 1);
    snprintf(shape, sizeof shape, "T=%ld I=%d", T, g->I);
    report("swiglu fwd ->bf16", g->name, shape, time_ms(run_swiglu, &e), 0, T * (double)g->I * 10);
    gt_free(e.x); gt_free(e.w); gt_free(e.y); gt_free(e.rstd); gt_free(e.g); gt_free(e.u);
}

int main(int argc, char **argv)
{
    bool quick = false;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--geo") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = fopen(argv[++i], "w");
        else { fprintf(stderr, "usage: %s [--quick] [--geo NAME] [--csv FILE]\n", argv[0]); return 2; }
    }
    gt_init("bench_cuda_kernels");
    if (csv) fprintf(csv, "kernel,geometry,shape,ms,tflops,tbs,floor_ms\n");
    B_OK(lcu_ctx_create(&ctx, 0));
    char why[1024];
    if (lcu_cudnn_create(&dnn, why, sizeof why) == 0) printf("attention rows \"cudnn\": %s\n", lcu_cudnn_describe(dnn));
    else printf("attention rows \"cudnn\": none (%s)\n", why);
    ceilings();
    const long toks[4] = {512, 2048, 8192, 32768};
    for (size_t gi = 0; gi < sizeof geos / sizeof geos[0]; gi++) {
        const geo *g = &geos[gi];
        if (only && strcmp(only, g->name)) continue;
        printf("== %s: H %d, heads %d/%d x %d, I %d, V %d, %d layers\n", g->name, g->H, g->nq, g->nkv, g->d, g->I, g->V,
               g->L);
        for (int ti = 0; ti < (quick ? 2 : 4); ti++) {
            long T = toks[ti];
            bench_attention(g, T, (int)T);
            if (T > 512) bench_attention(g, T, 512);
            bench_head(g, T);
            bench_gemm_shape(g, T, "gate", g->I, g->H);
            bench_gemm_shape(g, T, "q", g->nq * g->d, g->H);
            for (int v = 0; v < 2; v++) { /* LoRA versions 1 and 2 (LCU_LORA) */
                setenv("LCU_LORA", v ? "sgmv" : "gemm", 1);
                double one = bench_lora(g, T, "q", g->H, g->nq * g->d, 1, 0);
                bench_lora(g, T, "q", g->H, g->nq * g->d, 8, one);
                bench_lora(g, T, "q", g->H, g->nq * g->d, 32, one);
            }
            unsetenv("LCU_LORA");
            bench_lora_v3(g, T); /* version 3's rows (LCU_LORA=sgmv3) */
            bench_elementwise(g, T);
        }
        printf("\n");
    }
    lcu_cudnn_destroy(dnn);
    lcu_ctx_destroy(ctx);
    if (csv) fclose(csv);
    return 0;
}
