/* bench_cuda_kernels.c — times the CUDA kernel layer at the geometries (Qwen3-0.6B,
 * Llama-3.2-1B, Qwen3-8B) and token counts (512, 2K, 8K, 32K) and prints each kernel's time
 * against its two floors: FLOPs over 989 TFLOP/s (H100 dense bf16) and bytes over
 * 3.35 TB/s, plus the ceilings measured here (a device-to-device copy, a bf16 8192³ GEMM).
 * The attention rows: the own kernels' versions 1 (wmma) and 2 (mma), then cuDNN's fused
 * attention through the kernel layer (cudnn, where libcudnn loads: lcu_cudnn_attn_*).
 * Each geometry starts with the decode rows: one decode step's operations of a layer at
 * 32 rows (bench_cuda --decode's 32 samples), base GEMMs, the KV-cache attention and the
 * LoRA forward over 1 and 8 adapters, where a step's time is far from its HBM bound.
 * Prints figures; never a test. bench/cuda/NOTES.md explains the counts.
 *
 *   bench_cuda_kernels [--quick] [--decode] [--geo NAME] [--csv FILE]
 * --quick: 512 and 2K tokens only; --decode: the decode rows only (a few seconds). Exit
 * status 77 without a device (like the gpu tests).
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

/* The floor in ms: the larger of FLOPs/peak and bytes/peak. */
static double floor_ms_of(double flops, double bytes)
{
    return fmax(flops / (PEAK_TFLOPS * 1e12), bytes / (PEAK_TBS * 1e12)) * 1e3;
}

/* One result row: time, rates, and the floor. */
static void report(const char *kernel, const char *g, const char *shape, double ms, double flops, double bytes)
{
    double tf = flops / (ms * 1e-3) / 1e12, tb = bytes / (ms * 1e-3) / 1e12;
    double floor_ms = floor_ms_of(flops, bytes);
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
                          (float)(1.0 / sqrt((double)g->d)), false};
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

/* bench_cuda --decode's shape: 8 requests × 4 samples, a 128-token prompt, 64 steps
 * (run_on_gpu.sh's decode steps). */
#define DEC_ROWS 32     /* rows of a decode pass: one per sample */
#define DEC_ADS 8       /* adapters of the 8-adapter rows, DEC_ROWS / DEC_ADS rows each */
#define DEC_KV_LEN 192  /* keys a row attends to: the prompt and the steps so far, near the end */
#define DEC_KV_CAP 193  /* cache rows per sample: prompt + max_tokens (128 + 65) */
#define DEC_LDZ 512     /* the backend's LoRA z stride (cuda_ctx.h CU_LDZ) */
#define DEC_COPIES 64   /* at most this many copies of a cycled operand */

/* ---- LoRA segments ---------------------------------------------------------------------------- */

typedef struct {
    int in, out, nseg;
    long ldz;
    lcu_lora_seg segs[32];
    void *x, *y, *dy, *dx, *z, *dz;
} lora_arg;

static void run_lora_fwd(void *p)
{
    lora_arg *l = p;
    B_OK(lcu_lora_fwd(ctx, l->segs, l->nseg, l->in, l->out, l->x, l->in, l->y, l->out, l->z, l->ldz, 0));
}

static void run_lora(void *p)
{
    lora_arg *l = p;
    run_lora_fwd(l);
    B_OK(lcu_lora_bwd(ctx, l->segs, l->nseg, l->in, l->out, l->x, l->in, l->dy, l->out, l->dx, l->in, l->z, l->dz,
                      l->ldz, 0));
}

/* The LoRA paths the rows compare (LCU_LORA, and LCU_SGMV3_SMALL=0: version 3's tiled kernel
 * alone, without its small-segment kernels). */
static const struct { const char *lora, *small; } LORA_PATHS[] = {
    {"gemm", NULL}, {"sgmv", NULL}, {"sgmv3", NULL}, {"sgmv3", "0"}};

static void lora_path(int i)
{
    setenv("LCU_LORA", LORA_PATHS[i].lora, 1);
    if (LORA_PATHS[i].small) setenv("LCU_SGMV3_SMALL", LORA_PATHS[i].small, 1);
    else unsetenv("LCU_SGMV3_SMALL");
}

/* One module's LoRA (r = 32) over T rows in nad equal segments, one adapter each, through the
 * version LCU_LORA names: forward and backward as a training pass calls them, or (fwd_only)
 * the forward alone as a decode pass does (the backend's z stride, no gradients). A decode
 * row does not cycle its adapters through copies as bench_decode's GEMMs do their weights:
 * A and B are 0.5-1 MB per adapter on Qwen3-8B, 8 MB (2.4 us at 3.35 TB/s) for 8 adapters.
 * Returns the time. */
static double bench_lora(const geo *g, long T, const char *mod, int in, int out, int nad, double one_ms,
                         bool fwd_only)
{
    const int r = 32;
    lora_arg l;
    memset(&l, 0, sizeof l);
    l.in = in;
    l.out = out;
    l.nseg = nad;
    l.ldz = fwd_only ? DEC_LDZ : lcu_lora_ldz(r);
    l.x = dev_random(T * in, LCU_BF16, 1);
    if (!fwd_only) l.dy = dev_random(T * out, LCU_BF16, 1);
    l.y = dev_random(T * out, LCU_F32, 1);
    if (!fwd_only) l.dx = dev_random(T * in, LCU_F32, 1);
    l.z = gt_dev_poison(T * l.ldz * 2);
    if (!fwd_only) l.dz = gt_dev_poison(T * l.ldz * 2);
    for (int s = 0; s < nad; s++) {
        long b = T * s / nad, e = T * (s + 1) / nad;
        l.segs[s] = (lcu_lora_seg){b, e, r, 32.0f / r, dev_random((size_t)r * in, LCU_BF16, 0.02),
                                   dev_random((size_t)out * r, LCU_BF16, 0.02),
                                   fwd_only ? NULL : dev_random((size_t)r * in, LCU_F32, 0.01),
                                   fwd_only ? NULL : dev_random((size_t)out * r, LCU_F32, 0.01)};
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%s T=%ld x%d ad", mod, T, nad);
    double ms = time_ms(fwd_only ? run_lora_fwd : run_lora, &l);
    /* fwd: shrink + expand; bwd: shrink again, gB, dz, gA, dx. Bytes of the forward alone: x
     * read, z written and read, y read and written (fp32), every adapter's A and B */
    double flops = 2.0 * T * r * (in + out) + (fwd_only ? 0 : 2.0 * T * r * (3.0 * in + 2.0 * out));
    double bytes = fwd_only ? T * (in * 2.0 + r * 4.0 + out * 8.0) + nad * (double)r * (in + out) * 2
                            : T * (in * 2.0 * 3 + out * 2.0 * 2 + out * 8.0 + in * 8.0) +
                                  nad * (double)r * (in + out) * (2 + 8);
    char name[40];
    const char *small = getenv("LCU_SGMV3_SMALL");
    snprintf(name, sizeof name, "lora %s r=32 %s%s", fwd_only ? "fwd" : "fwd+bwd",
             getenv("LCU_LORA") ? getenv("LCU_LORA") : "auto", small && !strcmp(small, "0") ? " tiled" : "");
    report(name, g->name, shape, ms, flops, bytes);
    if (one_ms > 0) printf("%-22s %-13s %-22s %.2fx the time of one adapter\n", "", "", "", ms / one_ms);
    gt_free(l.x); gt_free(l.dy); gt_free(l.y); gt_free(l.dx); gt_free(l.z); gt_free(l.dz);
    for (int s = 0; s < nad; s++) {
        gt_free((void *)l.segs[s].A); gt_free((void *)l.segs[s].B); gt_free(l.segs[s].gA); gt_free(l.segs[s].gB);
    }
    return ms;
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
    int dim, nh, d;
    void *x, *w, *y, *rstd, *g, *u, *dh, *y2, *pos, *cos_t, *sin_t;
} ew_arg;

static void run_swiglu_bwd(void *p)
{
    ew_arg *e = p;
    B_OK(lcu_swiglu_bwd(e->y, e->y2, LCU_BF16, e->dh, e->g, e->u, e->rows * e->dim, 0));
}

static void run_convert(void *p)
{
    ew_arg *e = p;
    B_OK(lcu_convert(e->y, LCU_BF16, e->x, LCU_F32, (size_t)e->rows * e->dim, 0));
}

static void run_rope(void *p)
{
    ew_arg *e = p;
    B_OK(lcu_rope(e->y, LCU_BF16, e->x, e->rows, e->nh, e->d, e->pos, e->cos_t, e->sin_t, false, 0));
}

static void run_norm(void *p)
{
    ew_arg *e = p;
    B_OK(lcu_rmsnorm_fwd(e->y, LCU_BF16, e->rstd, e->x, e->w, e->rows, e->dim, 1e-6, 0));
}

/* the norm's backward as the layer's calls it at the residual: dx fp32 written from dy fp32 */
static void run_norm_bwd(void *p)
{
    ew_arg *e = p;
    B_OK(lcu_rmsnorm_bwd(e->g, LCU_F32, e->dh, LCU_F32, e->x, e->rstd, e->w, e->rows, e->dim, false, 0));
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
    long qd = (long)g->nq * g->d; /* the rope row below reads T·qd values of x */
    e.x = dev_random(T * (g->H > qd ? g->H : qd), LCU_F32, 1);
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
    /* its backward (dh, g, u fp32 in; dg, du bf16 out), as the layer's backward calls it */
    e.dh = dev_random(T * g->I, LCU_F32, 1);
    e.y2 = gt_dev_poison(T * (long)g->I * 2);
    report("swiglu bwd ->bf16", g->name, shape, time_ms(run_swiglu_bwd, &e), 0, T * (double)g->I * 16);
    /* the norm's backward (x, dy fp32 in, dx fp32 out; rstd from the forward row's runs) */
    e.dim = g->H;
    snprintf(shape, sizeof shape, "T=%ld H=%d", T, g->H);
    report("rmsnorm bwd f32", g->name, shape, time_ms(run_norm_bwd, &e), 0, T * (double)g->H * 12);
    /* a [T, H] fp32 -> bf16 conversion (the backward's dy convert) */
    report("convert f32->bf16", g->name, shape, time_ms(run_convert, &e), 0, T * (double)g->H * 6);
    /* q's RoPE (fp32 in, bf16 out), positions 0 .. T-1 */
    int half = g->d / 2;
    float *cs = malloc((size_t)T * half * 4);
    int32_t *pos = malloc((size_t)T * 4);
    for (long i = 0; i < T * half; i++) cs[i] = (float)cos(0.001 * (double)i);
    for (long t = 0; t < T; t++) pos[t] = (int32_t)t;
    e.nh = g->nq;
    e.d = g->d;
    e.cos_t = gt_dev_f32(cs, (size_t)T * half);
    e.sin_t = gt_dev_f32(cs, (size_t)T * half);
    e.pos = gt_dev_copy(pos, (size_t)T * 4);
    snprintf(shape, sizeof shape, "T=%ld %dx%d", T, g->nq, g->d);
    report("rope q f32->bf16", g->name, shape, time_ms(run_rope, &e), 0,
           T * (double)g->nq * g->d * 6 + T * (double)half * 8);
    free(cs);
    free(pos);
    void *bufs[] = {e.x, e.w, e.y, e.rstd, e.g, e.u, e.dh, e.y2, e.pos, e.cos_t, e.sin_t};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(bufs[i]);
}

/* ---- decode: one decode step's operations of a layer ------------------------------------------ */

static size_t l2_bytes; /* the device's L2 cache */

/* A decode step reads each layer's weights and KV caches once, from HBM; a row that called a
 * kernel on the same 8-32 MB again and again would read them from the L2 cache the previous
 * call filled (50 MB on Hopper). So the decode rows cycle through copies of the weight or
 * the caches, enough for 3x the L2 (the small inputs and outputs stay: in a step they come
 * from the operation before). How many copies of `bytes` that takes: */
static int dec_copies(double bytes)
{
    int n = (int)ceil(3.0 * l2_bytes / bytes);
    return n < 1 ? 1 : n > DEC_COPIES ? DEC_COPIES : n;
}

typedef struct {
    simple_arg s;
    void *W[DEC_COPIES];
    int n, next;
} dec_gemm_arg;

static void run_gemm_cycled(void *p)
{
    dec_gemm_arg *d = p;
    d->s.g.B = d->W[d->next++ % d->n];
    run_gemm(&d->s);
}

/* y[32, N] = x[32, K]·W[N, K]ᵀ as cl_linear calls it; resid: + C (beta 1, C apart from D: the
 * residual add of o and down). Returns the time; *floor (unless NULL) the floor. */
static double bench_decode_gemm(const geo *g, const char *what, int N, int K, bool resid, double *floor)
{
    const long T = DEC_ROWS;
    dec_gemm_arg d;
    memset(&d, 0, sizeof d);
    d.n = dec_copies((double)N * K * 2);
    for (int i = 0; i < d.n; i++) d.W[i] = dev_random((size_t)N * K, LCU_BF16, 0.05);
    void *A = dev_random(T * K, LCU_BF16, 1), *D = gt_dev_poison(T * N * 4);
    void *C = resid ? dev_random(T * N, LCU_F32, 1) : NULL;
    d.s.g = (lcu_gemm_args){false, true, (int)T, N, K, 1.0f, resid ? 1.0f : 0.0f, A, K, d.W[0], K, C, resid ? N : 0,
                            D, N, LCU_F32};
    char shape[64];
    snprintf(shape, sizeof shape, "%s%s %ldx%dx%d", what, resid ? "+resid" : "", T, N, K);
    double ms = time_ms(run_gemm_cycled, &d);
    double flops = 2.0 * T * N * K, bytes = T * K * 2.0 + (double)N * K * 2 + T * N * (resid ? 8.0 : 4.0);
    report("gemm bf16->f32", g->name, shape, ms, flops, bytes);
    if (floor) *floor = floor_ms_of(flops, bytes);
    for (int i = 0; i < d.n; i++) gt_free(d.W[i]);
    gt_free(A); gt_free(D); gt_free(C);
    return ms;
}

typedef struct {
    attn_arg x;
    void *k[DEC_COPIES], *v[DEC_COPIES];
    int n, next;
    bool own; /* the decode's own kernel (lcu_attn_decode_fwd), not the tile kernels */
} dec_attn_arg;

static void run_attn_cycled(void *p)
{
    dec_attn_arg *d = p;
    int i = d->next++ % d->n;
    if (d->own) B_OK(lcu_attn_decode_fwd(&d->x.a, d->x.q, d->k[i], d->v[i], d->x.o, d->x.lse, 0));
    else B_OK(lcu_attn_fwd(&d->x.a, d->x.q, d->k[i], d->v[i], d->x.o, d->x.lse, d->x.ws, 0));
}

/* The KV-cache attention of a decode pass as cuda_sample.c's cs_decode sets it up: sample i's
 * one query row i against rows i·kv_cap .. i·kv_cap + kv_len of one layer's K and V caches
 * [samples·kv_cap, nkv·d]. Returns version 1's time (the one decode runs unless
 * LCU_ATTN=mma); *floor its floor. */
static double bench_decode_attention(const geo *g, double *floor)
{
    const int S = DEC_ROWS;
    int32_t qs[DEC_ROWS + 1], kl[DEC_ROWS];
    int64_t ks[DEC_ROWS];
    for (int i = 0; i < S; i++) {
        qs[i] = i;
        ks[i] = (int64_t)i * DEC_KV_CAP;
        kl[i] = DEC_KV_LEN;
    }
    qs[S] = S;
    dec_attn_arg d;
    memset(&d, 0, sizeof d);
    attn_arg *x = &d.x;
    long qd = (long)g->nq * g->d, kvd = (long)g->nkv * g->d, cache = (long)S * DEC_KV_CAP;
    x->a = (lcu_attn_desc){S, gt_dev_copy(qs, sizeof qs), gt_dev_copy(ks, sizeof ks), gt_dev_copy(kl, sizeof kl), S,
                           g->nq, g->nkv, g->d, (float)(1.0 / sqrt((double)g->d)), false};
    d.n = dec_copies(cache * kvd * 2.0 * 2);
    for (int i = 0; i < d.n; i++) {
        d.k[i] = dev_random(cache * kvd, LCU_BF16, 1);
        d.v[i] = dev_random(cache * kvd, LCU_BF16, 1);
    }
    x->q = dev_random(S * qd, LCU_BF16, 1);
    x->o = gt_dev_poison(S * qd * 2);
    x->lse = gt_dev_poison(S * g->nq * 4);
    x->ws = gt_dev_poison(lcu_attn_workspace_bytes(&x->a));
    /* QKᵀ and PV of one query over kv_len keys per sample and head; bytes: q and out, each
     * sample's K and V rows once (a kv head's rows serve its nq/nkv query heads), lse */
    double flops = 4.0 * S * DEC_KV_LEN * g->d * g->nq;
    double bytes = S * qd * 2.0 * 2 + (double)S * DEC_KV_LEN * kvd * 2 * 2 + S * g->nq * 4.0;
    *floor = floor_ms_of(flops, bytes);
    char shape[64];
    snprintf(shape, sizeof shape, "%dx1 kv %d", S, DEC_KV_LEN);
    const char *variants[2] = {"wmma", "mma"};
    double v1 = 0;
    for (int vi = 0; vi < 2; vi++) {
        char name[40];
        setenv("LCU_ATTN", variants[vi], 1);
        snprintf(name, sizeof name, "attention decode %s", variants[vi]);
        double ms = time_ms(run_attn_cycled, &d);
        report(name, g->name, shape, ms, flops, bytes);
        if (vi == 0) v1 = ms;
    }
    unsetenv("LCU_ATTN");
    d.own = true; /* LCU_DECODE_ATTN=1's kernel */
    report("attention decode own", g->name, shape, time_ms(run_attn_cycled, &d), flops, bytes);
    for (int i = 0; i < d.n; i++) {
        gt_free(d.k[i]); gt_free(d.v[i]);
    }
    void *bufs[] = {(void *)x->a.q_start, (void *)x->a.kv_start, (void *)x->a.kv_len, x->q, x->o, x->lse, x->ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(bufs[i]);
    return v1;
}

/* A decode pass's per-layer operations at DEC_ROWS rows, then what a layer's base GEMMs and
 * attention add up to against their floors (the layer's other operations, timed in place:
 * the decode profile, LCU_DECODE_PROFILE=2, run_on_gpu.sh decode-ops). */
static void bench_decode(const geo *g)
{
    int H = g->H, I = g->I, qd = g->nq * g->d, kvd = g->nkv * g->d;
    printf("-- decode rows: %d rows (samples), KV cache %d keys each, LoRA r=32 over 1 and %d adapters; weights and "
           "caches cycled over copies of 3x the L2 (%.0f MiB)\n", DEC_ROWS, DEC_KV_LEN, DEC_ADS, l2_bytes / 1048576.0);
    /* the layer's seven products (o and down with their residual add, beta 1, as the layer
     * calls them; also without, for the epilogue's cost), then the attention */
    double f[6], t = 0;
    t += bench_decode_gemm(g, "q", qd, H, false, &f[0]);
    t += 2 * bench_decode_gemm(g, "k/v", kvd, H, false, &f[1]);
    bench_decode_gemm(g, "o", H, qd, false, NULL);
    t += bench_decode_gemm(g, "o", H, qd, true, &f[2]);
    t += 2 * bench_decode_gemm(g, "gate/up", I, H, false, &f[3]);
    bench_decode_gemm(g, "down", H, I, false, NULL);
    t += bench_decode_gemm(g, "down", H, I, true, &f[4]);
    double fl = f[0] + 2 * f[1] + f[2] + 2 * f[3] + f[4];
    double ta = bench_decode_attention(g, &f[5]);
    const struct { const char *mod; int in, out; } mods[] = {
        {"q", H, qd}, {"k/v", H, kvd}, {"o", qd, H}, {"gate/up", H, I}, {"down", I, H}};
    for (size_t v = 0; v < sizeof LORA_PATHS / sizeof LORA_PATHS[0]; v++) { /* auto takes sgmv for 8 adapters */
        lora_path((int)v);
        for (size_t m = 0; m < sizeof mods / sizeof mods[0]; m++) {
            double one = bench_lora(g, DEC_ROWS, mods[m].mod, mods[m].in, mods[m].out, 1, 0, true);
            bench_lora(g, DEC_ROWS, mods[m].mod, mods[m].in, mods[m].out, DEC_ADS, one, true);
        }
    }
    unsetenv("LCU_LORA");
    unsetenv("LCU_SGMV3_SMALL");
    bench_elementwise(g, DEC_ROWS);
    printf("decode layer, %d rows: 7 base GEMMs %.1f us (floor %.1f us, x%.1f) + attention wmma %.1f us (floor %.1f "
           "us); x %d layers: %.3f ms a step (floor %.3f ms), before LoRA, norms, RoPE, KV stores\n\n", DEC_ROWS,
           1e3 * t, 1e3 * fl, t / fl, 1e3 * ta, 1e3 * f[5], g->L, (t + ta) * g->L, (fl + f[5]) * g->L);
}

int main(int argc, char **argv)
{
    bool quick = false, decode_only = false;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--decode")) decode_only = true;
        else if (!strcmp(argv[i], "--geo") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = fopen(argv[++i], "w");
        else { fprintf(stderr, "usage: %s [--quick] [--decode] [--geo NAME] [--csv FILE]\n", argv[0]); return 2; }
    }
    gt_init("bench_cuda_kernels");
    if (csv) fprintf(csv, "kernel,geometry,shape,ms,tflops,tbs,floor_ms\n");
    B_OK(lcu_ctx_create(&ctx, 0));
    int l2 = 0;
    GT_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    l2_bytes = l2 > 0 ? (size_t)l2 : (size_t)50 << 20;
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
        bench_decode(g); /* first: the rows a time-limited run most needs */
        for (int ti = 0; ti < (decode_only ? 0 : quick ? 2 : 4); ti++) {
            long T = toks[ti];
            bench_attention(g, T, (int)T);
            if (T > 512) bench_attention(g, T, 512);
            bench_head(g, T);
            bench_gemm_shape(g, T, "gate", g->I, g->H);
            bench_gemm_shape(g, T, "q", g->nq * g->d, g->H);
            for (int v = 0; v < 3; v++) { /* LoRA versions 1, 2 and 3 (LCU_LORA) */
                lora_path(v);
                double one = bench_lora(g, T, "q", g->H, g->nq * g->d, 1, 0, false);
                bench_lora(g, T, "q", g->H, g->nq * g->d, 8, one, false);
                bench_lora(g, T, "q", g->H, g->nq * g->d, 32, one, false);
            }
            unsetenv("LCU_LORA");
            unsetenv("LCU_SGMV3_SMALL");
            bench_elementwise(g, T);
        }
        printf("\n");
    }
    lcu_cudnn_destroy(dnn);
    lcu_ctx_destroy(ctx);
    if (csv) fclose(csv);
    return 0;
}
