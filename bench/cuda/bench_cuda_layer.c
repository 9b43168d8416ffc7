/* bench_cuda_layer.c — one decoder layer (Llama/Qwen3 layout, random bf16 weights, LoRA
 * r = 32 on q,k,v,o,gate,up,down for 1, 8 or 32 adapters packed in one pass) composed from
 * the kernel layer, forward and backward, plus the output head; timed and extrapolated to
 * the whole model: tokens/s and MFU (the convention of bench/cuda/peft_peer.py) to set
 * beside the PyTorch + PEFT peer before the backend exists. The composition is the CPU
 * backend's (backend/cpu/cpu_layer.c): the backward recomputes the layer's forward from its
 * saved input. Prints figures; never a test. The attention: the own kernels (version 2 with
 * LCU_ATTN=mma), or cuDNN's fused attention with LCU_ATTN=cudnn (as the backend).
 *
 *   bench_cuda_layer [--quick] [--geo NAME]
 */
#include "tests/gpu/gt.h"

#include <math.h>
#include <string.h>

#define PEAK 989e12

typedef struct {
    const char *name;
    int H, nq, nkv, d, I, V, L;
    bool qk_norm;
} geo;

static const geo geos[] = {
    {"Qwen3-0.6B", 1024, 16, 8, 128, 3072, 151936, 28, true},
    {"Llama-3.2-1B", 2048, 32, 8, 64, 8192, 128256, 16, false},
    {"Qwen3-8B", 4096, 32, 8, 128, 12288, 151936, 36, true},
};

/* the PyTorch + PEFT fwd+bwd tokens/s on one H100 (0 = not measured / OOM) */
typedef struct {
    const char *geo;
    int batch, seq;
    double peft;
} row;

static const row rows[] = {
    {"Qwen3-0.6B", 16, 512, 29892}, {"Qwen3-0.6B", 1, 8192, 27085}, {"Qwen3-0.6B", 1, 32768, 0},
    {"Llama-3.2-1B", 4, 2048, 33888}, {"Qwen3-8B", 8, 512, 7576}, {"Qwen3-8B", 2, 2048, 7443},
    {"Qwen3-8B", 1, 8192, 0},
};

static lcu_ctx *ctx;
static lcu_cudnn *dnn; /* LCU_ATTN=cudnn: cuDNN's fused attention instead of the own kernels */
#define OK(call) GT_LCU_ASYNC(call)
/* inside the timed region: check the status, synchronize only on failure */
#define GT_LCU_ASYNC(call)                                                                   \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_) { printf("FATAL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, lcu_cudnn_strerror(rc_)); exit(1); } \
    } while (0)

enum { M_Q, M_K, M_V, M_O, M_G, M_U, M_D, NMOD };

typedef struct {
    const geo *g;
    long T;
    int nseq, nad, seqlen;
    /* weights (bf16) */
    void *wn1, *wn2, *wq, *wk, *wv, *wo, *wg, *wu, *wd, *qn, *kn, *head, *fnorm;
    lcu_lora_seg segs[NMOD][32];
    /* sequence layout */
    void *q_start, *pos, *cos_t, *sin_t, *attn_ws;
    lcu_attn_desc ad;
    /* activations */
    float *x, *xmid, *xout, *q_pre, *k_pre, *qf, *kf, *vf, *g_, *u_, *rstd1, *rstd2, *rstd_q, *rstd_k, *lse;
    lcu_bf16 *xn1, *xn2, *q, *k, *v, *att, *h, *z, *dz;
    /* gradients */
    float *dxo, *dh, *dxn, *dxmid, *datt, *dq, *dk, *dv;
    lcu_bf16 *dxo_b, *dg, *du, *dxmid_b, *datt_b, *dq_b, *dk_b, *dv_b;
    /* head */
    int R;
    float *logits, *dxf;
    lcu_bf16 *dlog;
    lcu_head_batch hb;
    size_t mark; /* gt_dev_mark() before the first buffer: free_layer releases from there */
} layer;

static void *rnd(size_t n, lcu_dtype t, double lo, double hi) { return gt_dev_random(n, t, lo, hi); }

static void *buf(size_t bytes) { return gt_dev_poison(bytes); }

static void setup(layer *y, const geo *g, long T, int seqlen, int nad)
{
    memset(y, 0, sizeof *y);
    y->mark = gt_dev_mark();
    y->g = g;
    y->T = T;
    y->nad = nad;
    y->nseq = (int)(T / seqlen);
    y->seqlen = seqlen;
    int H = g->H, I = g->I, qd = g->nq * g->d, kvd = g->nkv * g->d, r = 32, ldz = lcu_lora_ldz(r);
    double sH = 1 / sqrt(H), sI = 1 / sqrt(I);
    y->wn1 = rnd(H, LCU_BF16, 0.9, 1.1);
    y->wn2 = rnd(H, LCU_BF16, 0.9, 1.1);
    y->qn = rnd(g->d, LCU_BF16, 0.9, 1.1);
    y->kn = rnd(g->d, LCU_BF16, 0.9, 1.1);
    y->fnorm = rnd(H, LCU_BF16, 0.9, 1.1);
    y->wq = rnd((size_t)qd * H, LCU_BF16, -sH, sH);
    y->wk = rnd((size_t)kvd * H, LCU_BF16, -sH, sH);
    y->wv = rnd((size_t)kvd * H, LCU_BF16, -sH, sH);
    y->wo = rnd((size_t)H * qd, LCU_BF16, -sH, sH);
    y->wg = rnd((size_t)I * H, LCU_BF16, -sH, sH);
    y->wu = rnd((size_t)I * H, LCU_BF16, -sH, sH);
    y->wd = rnd((size_t)H * I, LCU_BF16, -sI, sI);
    y->head = rnd((size_t)g->V * H, LCU_BF16, -sH, sH);
    const int ins[NMOD] = {H, H, H, qd, H, H, I}, outs[NMOD] = {qd, kvd, kvd, H, I, I, H};
    for (int m = 0; m < NMOD; m++)
        for (int a = 0; a < nad; a++) {
            long b = T * a / nad, e = T * (a + 1) / nad;
            y->segs[m][a] = (lcu_lora_seg){b, e, r, 32.0f / r, rnd((size_t)r * ins[m], LCU_BF16, -0.02, 0.02),
                                           rnd((size_t)outs[m] * r, LCU_BF16, -0.02, 0.02), buf((size_t)r * ins[m] * 4),
                                           buf((size_t)outs[m] * r * 4)};
            GT_CUDA(cudaMemset(y->segs[m][a].gA, 0, (size_t)r * ins[m] * 4));
            GT_CUDA(cudaMemset(y->segs[m][a].gB, 0, (size_t)outs[m] * r * 4));
        }
    int32_t *qs = malloc((y->nseq + 1) * 4), *pos = malloc(T * 4);
    for (int i = 0; i <= y->nseq; i++) qs[i] = i * seqlen;
    for (long t = 0; t < T; t++) pos[t] = (int32_t)(t % seqlen);
    y->q_start = gt_dev_copy(qs, (y->nseq + 1) * 4);
    y->pos = gt_dev_copy(pos, T * 4);
    free(qs);
    free(pos);
    double inv[128];
    for (int i = 0; i < g->d / 2; i++) inv[i] = pow(1e6, -2.0 * i / g->d);
    y->cos_t = buf((size_t)seqlen * g->d / 2 * 4);
    y->sin_t = buf((size_t)seqlen * g->d / 2 * 4);
    GT_LCU(lcu_rope_table(y->cos_t, y->sin_t, inv, g->d / 2, seqlen, 0));
    y->ad = (lcu_attn_desc){y->nseq, y->q_start, NULL, NULL, T, g->nq, g->nkv, g->d, (float)(1 / sqrt(g->d)), false};
    y->attn_ws = buf(lcu_attn_workspace_bytes(&y->ad));

    y->x = rnd(T * H, LCU_F32, -1, 1);
    y->dxo = rnd(T * H, LCU_F32, -1e-3, 1e-3);
    float **f32s[] = {&y->xmid, &y->xout, &y->dh, &y->dxn, &y->dxmid};
    size_t f32n[] = {(size_t)T * H, (size_t)T * H, (size_t)T * I, (size_t)T * H, (size_t)T * H};
    for (int i = 0; i < 5; i++) *f32s[i] = buf(f32n[i] * 4);
    y->q_pre = buf(T * qd * 4); y->qf = buf(T * qd * 4); y->datt = buf(T * qd * 4); y->dq = buf(T * qd * 4);
    y->k_pre = buf(T * kvd * 4); y->kf = buf(T * kvd * 4); y->vf = buf(T * kvd * 4);
    y->dk = buf(T * kvd * 4); y->dv = buf(T * kvd * 4);
    y->g_ = buf(T * (long)I * 4); y->u_ = buf(T * (long)I * 4);
    y->rstd1 = buf(T * 4); y->rstd2 = buf(T * 4);
    y->rstd_q = buf(T * g->nq * 4); y->rstd_k = buf(T * g->nkv * 4); y->lse = buf(T * g->nq * 4);
    y->xn1 = buf(T * H * 2); y->xn2 = buf(T * H * 2); y->q = buf(T * qd * 2); y->k = buf(T * kvd * 2);
    y->v = buf(T * kvd * 2); y->att = buf(T * qd * 2); y->h = buf(T * (long)I * 2);
    y->z = buf(T * ldz * 2); y->dz = buf(T * ldz * 2);
    y->dxo_b = buf(T * H * 2); y->dg = buf(T * (long)I * 2); y->du = buf(T * (long)I * 2);
    y->dxmid_b = buf(T * H * 2); y->datt_b = buf(T * qd * 2); y->dq_b = buf(T * qd * 2);
    y->dk_b = buf(T * kvd * 2); y->dv_b = buf(T * kvd * 2);

    y->R = (int)(T < 1024 ? T : 1024);
    y->logits = buf((size_t)y->R * g->V * 4);
    y->dlog = buf((size_t)y->R * g->V * 2);
    y->dxf = buf(T * H * 4);
    int32_t *rs = calloc(T, 4), *tg = malloc(T * 4);
    int64_t *ts = malloc((T + 1) * 8);
    for (long t = 0; t <= T; t++) ts[t] = t;
    for (long t = 0; t < T; t++) tg[t] = (int32_t)((t * 7919) % g->V);
    lcu_loss_seq ls = {0, 1, 0.8, 1.2, 0.05};
    y->hb = (lcu_head_batch){gt_dev_copy(rs, T * 4), gt_dev_copy(&ls, sizeof ls), gt_dev_copy(ts, (T + 1) * 8),
                             gt_dev_copy(tg, T * 4), NULL, NULL, NULL, buf(T * 4), buf(T * 4), NULL};
    free(rs); free(tg); free(ts);
    GT_CUDA(cudaDeviceSynchronize());
}

/* y = x Wᵀ (+ C with beta 1) + LoRA for every segment */
static void linear(layer *y, int mod, const lcu_bf16 *x, int in, const void *W, int out, const float *C, float *D)
{
    lcu_gemm_args a = {false, true, (int)y->T, out, in, 1.0f, C ? 1.0f : 0.0f, x, in, W, in, C, out, D, out, LCU_F32};
    OK(lcu_gemm(ctx, &a, 0));
    OK(lcu_lora_fwd(ctx, y->segs[mod], y->nad, in, out, x, in, D, out, y->z, lcu_lora_ldz(32), 0));
}

static void fwd(layer *y)
{
    const geo *g = y->g;
    long T = y->T;
    int H = g->H, I = g->I, qd = g->nq * g->d, kvd = g->nkv * g->d;
    OK(lcu_rmsnorm_fwd(y->xn1, LCU_BF16, y->rstd1, y->x, y->wn1, T, H, 1e-6, 0));
    linear(y, M_Q, y->xn1, H, y->wq, qd, NULL, y->q_pre);
    linear(y, M_K, y->xn1, H, y->wk, kvd, NULL, y->k_pre);
    linear(y, M_V, y->xn1, H, y->wv, kvd, NULL, y->vf);
    const float *qsrc = y->q_pre, *ksrc = y->k_pre;
    if (g->qk_norm) {
        OK(lcu_rmsnorm_fwd(y->qf, LCU_F32, y->rstd_q, y->q_pre, y->qn, T * g->nq, g->d, 1e-6, 0));
        OK(lcu_rmsnorm_fwd(y->kf, LCU_F32, y->rstd_k, y->k_pre, y->kn, T * g->nkv, g->d, 1e-6, 0));
        qsrc = y->qf;
        ksrc = y->kf;
    }
    OK(lcu_rope(y->q, LCU_BF16, qsrc, T, g->nq, g->d, y->pos, y->cos_t, y->sin_t, false, 0));
    OK(lcu_rope(y->k, LCU_BF16, ksrc, T, g->nkv, g->d, y->pos, y->cos_t, y->sin_t, false, 0));
    OK(lcu_convert(y->v, LCU_BF16, y->vf, LCU_F32, T * kvd, 0));
    if (dnn) OK(lcu_cudnn_attn_fwd(dnn, &y->ad, y->seqlen, y->q, y->k, y->v, y->att, y->lse, 0));
    else OK(lcu_attn_fwd(&y->ad, y->q, y->k, y->v, y->att, y->lse, y->attn_ws, 0));
    linear(y, M_O, y->att, qd, y->wo, H, y->x, y->xmid);
    OK(lcu_rmsnorm_fwd(y->xn2, LCU_BF16, y->rstd2, y->xmid, y->wn2, T, H, 1e-6, 0));
    linear(y, M_G, y->xn2, H, y->wg, I, NULL, y->g_);
    linear(y, M_U, y->xn2, H, y->wu, I, NULL, y->u_);
    OK(lcu_swiglu_fwd(y->h, LCU_BF16, y->g_, y->u_, T * I, 0));
    linear(y, M_D, y->h, I, y->wd, H, y->xmid, y->xout);
}

/* dX[T, in] (= or +=) dY[T, out] · W[out, in], then the LoRA backward of the module */
static void linear_bwd(layer *y, int mod, const lcu_bf16 *x, int in, const void *W, int out, const lcu_bf16 *dy,
                       float *dx, bool acc)
{
    lcu_gemm_args a = {false, false, (int)y->T, in, out, 1.0f, acc ? 1.0f : 0.0f, dy, out, W, in, NULL, 0, dx, in,
                       LCU_F32};
    OK(lcu_gemm(ctx, &a, 0));
    OK(lcu_lora_bwd(ctx, y->segs[mod], y->nad, in, out, x, in, dy, out, dx, in, y->z, y->dz, lcu_lora_ldz(32), 0));
}

static void bwd(layer *y)
{
    const geo *g = y->g;
    long T = y->T;
    int H = g->H, I = g->I, qd = g->nq * g->d, kvd = g->nkv * g->d;
    OK(lcu_convert(y->dxo_b, LCU_BF16, y->dxo, LCU_F32, T * H, 0));
    linear_bwd(y, M_D, y->h, I, y->wd, H, y->dxo_b, y->dh, false);
    OK(lcu_swiglu_bwd(y->dg, y->du, LCU_BF16, y->dh, y->g_, y->u_, T * I, 0));
    linear_bwd(y, M_G, y->xn2, H, y->wg, I, y->dg, y->dxn, false);
    linear_bwd(y, M_U, y->xn2, H, y->wu, I, y->du, y->dxn, true);
    GT_CUDA(cudaMemcpyAsync(y->dxmid, y->dxo, T * H * 4, cudaMemcpyDeviceToDevice, 0));
    OK(lcu_rmsnorm_bwd(y->dxmid, LCU_F32, y->dxn, LCU_F32, y->xmid, y->rstd2, y->wn2, T, H, true, 0));
    OK(lcu_convert(y->dxmid_b, LCU_BF16, y->dxmid, LCU_F32, T * H, 0));
    linear_bwd(y, M_O, y->att, qd, y->wo, H, y->dxmid_b, y->datt, false);
    OK(lcu_convert(y->datt_b, LCU_BF16, y->datt, LCU_F32, T * qd, 0));
    if (dnn)
        OK(lcu_cudnn_attn_bwd(dnn, &y->ad, y->seqlen, y->q, y->k, y->v, y->att, y->lse, y->datt_b, y->dq, y->dk, y->dv,
                              0));
    else OK(lcu_attn_bwd(&y->ad, y->q, y->k, y->v, y->att, y->lse, y->datt_b, y->dq, y->dk, y->dv, y->attn_ws, 0));
    OK(lcu_rope(y->dq, LCU_F32, y->dq, T, g->nq, g->d, y->pos, y->cos_t, y->sin_t, true, 0));
    OK(lcu_rope(y->dk, LCU_F32, y->dk, T, g->nkv, g->d, y->pos, y->cos_t, y->sin_t, true, 0));
    if (g->qk_norm) {
        OK(lcu_rmsnorm_bwd(y->dq_b, LCU_BF16, y->dq, LCU_F32, y->q_pre, y->rstd_q, y->qn, T * g->nq, g->d, false, 0));
        OK(lcu_rmsnorm_bwd(y->dk_b, LCU_BF16, y->dk, LCU_F32, y->k_pre, y->rstd_k, y->kn, T * g->nkv, g->d, false, 0));
    } else {
        OK(lcu_convert(y->dq_b, LCU_BF16, y->dq, LCU_F32, T * qd, 0));
        OK(lcu_convert(y->dk_b, LCU_BF16, y->dk, LCU_F32, T * kvd, 0));
    }
    OK(lcu_convert(y->dv_b, LCU_BF16, y->dv, LCU_F32, T * kvd, 0));
    linear_bwd(y, M_Q, y->xn1, H, y->wq, qd, y->dq_b, y->dxn, false);
    linear_bwd(y, M_K, y->xn1, H, y->wk, kvd, y->dk_b, y->dxn, true);
    linear_bwd(y, M_V, y->xn1, H, y->wv, kvd, y->dv_b, y->dxn, true);
    OK(lcu_rmsnorm_bwd(y->dxmid, LCU_F32, y->dxn, LCU_F32, y->x, y->rstd1, y->wn1, T, H, true, 0));
}

/* the output head over all rows in chunks: logits, loss (+ dlogits and dX when bwd) */
static void head(layer *y, bool backward)
{
    const geo *g = y->g;
    int V = g->V, H = g->H;
    OK(lcu_rmsnorm_fwd(y->xn2, LCU_BF16, y->rstd2, y->xout, y->fnorm, y->T, H, 1e-6, 0));
    for (long c0 = 0; c0 < y->T; c0 += y->R) {
        int n = (int)(y->T - c0 < y->R ? y->T - c0 : y->R);
        lcu_gemm_args a = {false, true, n, V, H, 1.0f, 0.0f, y->xn2 + c0 * H, H, y->head, H, NULL, 0, y->logits, V,
                           LCU_F32};
        OK(lcu_gemm(ctx, &a, 0));
        OK(lcu_head_loss(y->logits, V, c0, n, V, &y->hb, backward ? y->dlog : NULL, V, 0));
        if (!backward) continue;
        lcu_gemm_args b = {false, false, n, H, V, 1.0f, 0.0f, y->dlog, V, y->head, H, NULL, 0, y->dxf + c0 * H, H,
                           LCU_F32};
        OK(lcu_gemm(ctx, &b, 0));
    }
}

static double elapsed(void (*fn)(layer *), layer *y, int reps)
{
    cudaEvent_t a, b;
    GT_CUDA(cudaEventCreate(&a));
    GT_CUDA(cudaEventCreate(&b));
    fn(y); /* warm-up: plans, attributes */
    GT_CUDA(cudaDeviceSynchronize());
    GT_CUDA(cudaEventRecord(a, 0));
    for (int i = 0; i < reps; i++) fn(y);
    GT_CUDA(cudaEventRecord(b, 0));
    GT_CUDA(cudaEventSynchronize(b));
    GT_CUDA(cudaGetLastError());
    float ms;
    GT_CUDA(cudaEventElapsedTime(&ms, a, b));
    GT_CUDA(cudaEventDestroy(a));
    GT_CUDA(cudaEventDestroy(b));
    return ms / reps;
}

static void head_fwd(layer *y) { head(y, false); }
static void head_fb(layer *y) { head(y, true); }

/* Every buffer of a configuration comes from gt.c, which lists them: released together
 * (the first H200 window reset the device here instead, and cuBLAS then refused the next
 * configuration's handle). */
static void free_layer(layer *y)
{
    gt_dev_release(y->mark);
}

static double matmul_params(const geo *g)
{
    double qd = (double)g->nq * g->d, kvd = (double)g->nkv * g->d;
    return (g->H * qd + 2.0 * g->H * kvd + qd * g->H + 3.0 * g->H * g->I) * g->L + (double)g->V * g->H;
}

static void run(const geo *g, int batch, int seqlen, int nad, double peft)
{
    long T = (long)batch * seqlen;
    layer y;
    setup(&y, g, T, seqlen, nad);
    int reps = T >= 8192 ? 2 : 5;
    double f = elapsed(fwd, &y, reps), b = elapsed(bwd, &y, reps);
    double hf = elapsed(head_fwd, &y, reps), hb = elapsed(head_fb, &y, reps);
    double fwd_ms = g->L * f + hf, fb_ms = g->L * (2 * f + b) + hb; /* backward recomputes each layer's forward */
    double attn = 2.0 * g->d * g->nq * (double)seqlen * (seqlen + 1) * g->L * batch;
    double fb_flops = 4 * matmul_params(g) * T + 3 * attn, f_flops = 2 * matmul_params(g) * T + attn;
    double tps = T / (fb_ms * 1e-3);
    printf("%-13s %3dx%-6d %2d ad | layer fwd %7.2f bwd %7.2f ms, head fwd %6.2f fwd+bwd %6.2f ms | model fwd %8.0f tok/s "
           "(MFU %4.1f%%)  fwd+bwd %8.0f tok/s (MFU %4.1f%%)", g->name, batch, seqlen, nad, f, b, hf, hb,
           T / (fwd_ms * 1e-3), 100 * f_flops / (fwd_ms * 1e-3) / PEAK, tps, 100 * fb_flops / (fb_ms * 1e-3) / PEAK);
    if (peft > 0) printf("  = %.2fx PEFT", tps / peft);
    printf("\n");
    free_layer(&y);
}

int main(int argc, char **argv)
{
    bool quick = false;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--geo") && i + 1 < argc) only = argv[++i];
        else { fprintf(stderr, "usage: %s [--quick] [--geo NAME]\n", argv[0]); return 2; }
    }
    gt_init("bench_cuda_layer");
    GT_LCU(lcu_ctx_create(&ctx, 0));
    const char *attn = getenv("LCU_ATTN");
    if (attn && !strcmp(attn, "cudnn")) { /* as the backend: cuDNN's attention, or say why not */
        char why[1024];
        if (lcu_cudnn_create(&dnn, why, sizeof why)) {
            printf("LCU_ATTN=cudnn: no cuDNN attention: %s\n", why);
            return 1;
        }
        printf("attention: %s\n", lcu_cudnn_describe(dnn));
    }
    printf("model estimates from one layer x L + head (PEFT figures: the issue's H100 table)\n");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const row *r = &rows[i];
        if (only && strcmp(only, r->geo)) continue;
        if (quick && (long)r->batch * r->seq > 4096) continue;
        const geo *g = NULL;
        for (size_t j = 0; j < sizeof geos / sizeof geos[0]; j++) if (!strcmp(geos[j].name, r->geo)) g = &geos[j];
        run(g, r->batch, r->seq, 1, r->peft);
    }
    /* 8 and 32 adapters packed in one pass vs one adapter on the same tokens */
    if (!only || !strcmp(only, "Qwen3-0.6B")) {
        run(&geos[0], 8, 512, 1, 0);
        run(&geos[0], 8, 512, 8, 0);
        run(&geos[0], 32, 512, 32, 0);
        run(&geos[0], 32, 512, 1, 0);
    }
    lcu_cudnn_destroy(dnn);
    lcu_ctx_destroy(ctx);
    return 0;
}
