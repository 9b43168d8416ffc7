/* test_gpu_ops.c — the elementwise kernels against the CPU backend's twins (backend/cpu/
 * cpu_ops.c) on fresh random inputs, poisoned outputs, plus finite differences of the GPU
 * forward for each backward and a rerun for determinism.
 *
 * Tolerances (‖out − ref‖/‖ref‖): exact operations (conversion, copies, embedding, adds)
 * bit for bit; fp32 outputs 2e-6 (reduction order, expf vs glibc); bf16 outputs 5e-3
 * (one rounding); backward vs central finite differences of the fp32 GPU forward 5e-3.
 */
#include "tests/gpu/gt.h"
#include "tests/gpu/twin.h"

#include <math.h>
#include <string.h>

static cpu_pool *pool;

/* host fp16 → fp32 (normal, subnormal, inf/nan) for the F16 conversion check */
static float half_to_float(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 1024), e - 25);
    return s ? -v : v;
}

static void test_convert(void)
{
    size_t n = (size_t)gt_int(1000, 70000);
    float *x = malloc(n * 4), *back = malloc(n * 4);
    gt_fill(x, n, -3e4, 3e4);
    for (size_t i = 0; i < n; i += 97) x[i] = (float)gt_uniform(-1e-30, 1e-30); /* tiny values too */
    void *dx = gt_dev_f32(x, n), *db = gt_dev_poison(n * 2), *df = gt_dev_poison(n * 4);
    GT_LCU(lcu_convert(db, LCU_BF16, dx, LCU_F32, n, 0));
    uint16_t *b = malloc(n * 2), *want = malloc(n * 2);
    gt_get(b, db, n * 2);
    for (size_t i = 0; i < n; i++) want[i] = gt_f2bf(x[i]);
    gt_expect_bits("convert f32 -> bf16 (round to nearest even)", b, want, n * 2);
    /* one element in: pointers no longer aligned for the 4-wide form, the scalar form runs */
    GT_CUDA(cudaMemset(db, 0xff, n * 2));
    GT_LCU(lcu_convert((uint16_t *)db + 1, LCU_BF16, (float *)dx + 1, LCU_F32, n - 1, 0));
    gt_get(b, db, n * 2);
    gt_expect_bits("convert f32 -> bf16, unaligned (the scalar form)", b + 1, want + 1, (n - 1) * 2);
    GT_LCU(lcu_convert(db, LCU_BF16, dx, LCU_F32, n, 0));
    GT_LCU(lcu_convert(df, LCU_F32, db, LCU_BF16, n, 0));
    gt_get_f32(back, df, n);
    for (size_t i = 0; i < n; i++) x[i] = gt_bf2f(want[i]);
    gt_expect_bits("convert bf16 -> f32 (exact)", back, x, n * 4);
    /* f16 → bf16: random half bit patterns (finite) */
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        do h[i] = (uint16_t)gt_int(0, 65535); while (((h[i] >> 10) & 31) == 31);
        want[i] = gt_f2bf(half_to_float(h[i]));
    }
    void *dh = gt_dev_copy(h, n * 2);
    GT_CUDA(cudaMemset(db, 0xff, n * 2));
    GT_LCU(lcu_convert(db, LCU_BF16, dh, LCU_F16, n, 0));
    gt_get(b, db, n * 2);
    gt_expect_bits("convert f16 -> bf16", b, want, n * 2);
    gt_check(lcu_convert(dh, LCU_F16, dx, LCU_F32, n, 0) == LCU_EINVAL, "convert to f16 refused");
    gt_free(dx); gt_free(db); gt_free(df); gt_free(dh);
    free(x); free(back); free(b); free(want); free(h);
}

static void test_copy_rows(void)
{
    long n = gt_int(1, 300), src_rows = n + gt_int(0, 50), dst_rows = n + gt_int(0, 50);
    int words = gt_int(1, 40);
    size_t rb = (size_t)words * 4;
    uint32_t *src = malloc(src_rows * rb), *dst = malloc(dst_rows * rb), *got = malloc(dst_rows * rb);
    for (long i = 0; i < src_rows * words; i++) src[i] = (uint32_t)rng_next(&gt_rng);
    for (long i = 0; i < dst_rows * words; i++) dst[i] = (uint32_t)rng_next(&gt_rng);
    int64_t *si = malloc(n * 8), *di = malloc(dst_rows * 8);
    for (long i = 0; i < dst_rows; i++) di[i] = i;
    for (long i = dst_rows - 1; i > 0; i--) { long j = gt_int(0, (int)i); int64_t t = di[i]; di[i] = di[j]; di[j] = t; }
    for (long i = 0; i < n; i++) si[i] = gt_int(0, (int)src_rows - 1);
    void *ds = gt_dev_copy(src, src_rows * rb), *dd = gt_dev_copy(dst, dst_rows * rb);
    void *dsi = gt_dev_copy(si, n * 8), *ddi = gt_dev_copy(di, n * 8);
    GT_LCU(lcu_copy_rows(dd, ddi, ds, dsi, n, rb, 0));
    gt_get(got, dd, dst_rows * rb);
    for (long i = 0; i < n; i++) memcpy(dst + di[i] * words, src + si[i] * words, rb);
    gt_expect_bits("copy_rows gather+scatter (untouched rows kept)", got, dst, dst_rows * rb);
    gt_free(ds); gt_free(dd); gt_free(dsi); gt_free(ddi);
    free(src); free(dst); free(got); free(si); free(di);
}

static void test_embed_add(void)
{
    int V = gt_int(10, 500), H = gt_int(1, 300);
    long T = gt_int(1, 400);
    float *table = malloc((size_t)V * H * 4), *x = malloc(T * H * 4), *ref = malloc(T * H * 4);
    int32_t *tok = malloc(T * 4);
    gt_fill_bf16_exact(table, (size_t)V * H, -2, 2);
    for (long t = 0; t < T; t++) tok[t] = gt_int(0, V - 1);
    void *dt = gt_dev_bf16(table, (size_t)V * H), *dtok = gt_dev_copy(tok, T * 4), *dx = gt_dev_poison(T * H * 4);
    GT_LCU(lcu_embed(dx, dt, dtok, T, H, 0));
    gt_get_f32(x, dx, T * H);
    cpu_embed(pool, ref, table, tok, T, H);
    gt_expect_bits("embed vs cpu_embed", x, ref, T * H * 4);

    /* bias add (bf16 bias) vs cpu_add_bias, then residual add vs host */
    float *bias = malloc(H * 4), *y = malloc(T * H * 4), *z = malloc(T * H * 4);
    gt_fill_bf16_exact(bias, H, -1, 1);
    void *db = gt_dev_bf16(bias, H);
    GT_LCU(lcu_add_bias(dx, db, T, H, 0));
    gt_get_f32(x, dx, T * H);
    cpu_add_bias(pool, ref, bias, T, H);
    gt_expect_bits("add_bias vs cpu_add_bias", x, ref, T * H * 4);
    gt_fill(y, T * H, -5, 5);
    void *dy = gt_dev_f32(y, T * H), *dz = gt_dev_poison(T * H * 4);
    GT_LCU(lcu_add(dz, dx, dy, T * H, 0));
    gt_get_f32(z, dz, T * H);
    for (long i = 0; i < T * H; i++) ref[i] = ref[i] + y[i];
    gt_expect_bits("add", z, ref, T * H * 4);
    GT_LCU(lcu_add(dy, dx, dy, T * H, 0)); /* y = x + y in place */
    gt_get_f32(z, dy, T * H);
    gt_expect_bits("add in place", z, ref, T * H * 4);
    gt_free(dt); gt_free(dtok); gt_free(dx); gt_free(db); gt_free(dy); gt_free(dz);
    free(table); free(x); free(ref); free(tok); free(bias); free(y); free(z);
}

/* ---- RMSNorm ---------------------------------------------------------------------------- */

static void test_rmsnorm(long rows, int dim)
{
    double eps = 1e-6;
    size_t n = (size_t)rows * dim;
    float *x = malloc(n * 4), *w = malloc(dim * 4), *y = malloc(n * 4), *yref = malloc(n * 4);
    float *rs = malloc(rows * 4), *rsref = malloc(rows * 4);
    gt_fill(x, n, -3, 3);
    gt_fill_bf16_exact(w, dim, 0.5, 1.5);
    void *dx = gt_dev_f32(x, n), *dw = gt_dev_bf16(w, dim), *dy = gt_dev_poison(n * 4), *drs = gt_dev_poison(rows * 4);
    cpu_rmsnorm_fwd(pool, yref, rsref, x, w, rows, dim, eps);
    double *r64 = malloc(n * 8);
    char what[120];

    GT_LCU(lcu_rmsnorm_fwd(dy, LCU_F32, drs, dx, dw, rows, dim, eps, 0));
    gt_get_f32(y, dy, n);
    gt_get_f32(rs, drs, rows);
    for (size_t i = 0; i < n; i++) r64[i] = yref[i];
    snprintf(what, sizeof what, "rmsnorm fwd f32 rows=%ld dim=%d vs cpu", rows, dim);
    gt_expect_close(what, y, r64, n, 2e-6);
    for (long i = 0; i < rows; i++) r64[i] = rsref[i];
    snprintf(what, sizeof what, "rmsnorm rstd rows=%ld dim=%d vs cpu", rows, dim);
    gt_expect_close(what, rs, r64, rows, 2e-6);

    void *dyb = gt_dev_poison(n * 2);
    GT_LCU(lcu_rmsnorm_fwd(dyb, LCU_BF16, NULL, dx, dw, rows, dim, eps, 0));
    gt_get_bf16(y, dyb, n);
    for (size_t i = 0; i < n; i++) r64[i] = yref[i];
    snprintf(what, sizeof what, "rmsnorm fwd bf16 rows=%ld dim=%d vs cpu", rows, dim);
    gt_expect_close(what, y, r64, n, 5e-3);

    /* backward: dy fp32 / bf16, dx fp32 (= and +=) / bf16, in place */
    float *g = malloc(n * 4), *dxref = malloc(n * 4), *dxo = malloc(n * 4), *acc0 = malloc(n * 4);
    gt_fill_bf16_exact(g, n, -1, 1); /* bf16-exact: the bf16 dy copy holds the same values */
    gt_fill(acc0, n, -1, 1);
    cpu_rmsnorm_bwd(pool, dxref, g, x, rsref, w, rows, dim, false);
    void *dg = gt_dev_f32(g, n), *dgb = gt_dev_bf16(g, n), *ddx = gt_dev_poison(n * 4), *ddxb = gt_dev_poison(n * 2);
    for (size_t i = 0; i < n; i++) r64[i] = dxref[i];
    GT_LCU(lcu_rmsnorm_bwd(ddx, LCU_F32, dg, LCU_F32, dx, drs, dw, rows, dim, false, 0));
    gt_get_f32(dxo, ddx, n);
    snprintf(what, sizeof what, "rmsnorm bwd f32<-f32 rows=%ld dim=%d vs cpu", rows, dim);
    gt_expect_close(what, dxo, r64, n, 2e-6);
    float *first = malloc(n * 4);
    memcpy(first, dxo, n * 4);
    GT_CUDA(cudaMemset(ddx, 0xff, n * 4));
    GT_LCU(lcu_rmsnorm_bwd(ddx, LCU_F32, dg, LCU_F32, dx, drs, dw, rows, dim, false, 0));
    gt_get_f32(dxo, ddx, n);
    gt_expect_bits("rmsnorm bwd rerun", dxo, first, n * 4);
    GT_LCU(lcu_rmsnorm_bwd(ddx, LCU_F32, dgb, LCU_BF16, dx, drs, dw, rows, dim, false, 0));
    gt_get_f32(dxo, ddx, n);
    snprintf(what, sizeof what, "rmsnorm bwd f32<-bf16 rows=%ld dim=%d vs cpu", rows, dim);
    gt_expect_close(what, dxo, r64, n, 2e-6);
    GT_LCU(lcu_rmsnorm_bwd(ddxb, LCU_BF16, dg, LCU_F32, dx, drs, dw, rows, dim, false, 0));
    gt_get_bf16(dxo, ddxb, n);
    snprintf(what, sizeof what, "rmsnorm bwd bf16<-f32 rows=%ld dim=%d vs cpu", rows, dim);
    gt_expect_close(what, dxo, r64, n, 5e-3);
    GT_CUDA(cudaMemcpy(ddx, acc0, n * 4, cudaMemcpyHostToDevice));
    GT_LCU(lcu_rmsnorm_bwd(ddx, LCU_F32, dg, LCU_F32, dx, drs, dw, rows, dim, true, 0));
    gt_get_f32(dxo, ddx, n);
    for (size_t i = 0; i < n; i++) r64[i] = (double)dxref[i] + acc0[i];
    snprintf(what, sizeof what, "rmsnorm bwd accumulate rows=%ld dim=%d", rows, dim);
    gt_expect_close(what, dxo, r64, n, 2e-6);
    GT_LCU(lcu_rmsnorm_bwd(dg, LCU_F32, dg, LCU_F32, dx, drs, dw, rows, dim, false, 0)); /* in place */
    gt_get_f32(dxo, dg, n);
    for (size_t i = 0; i < n; i++) r64[i] = dxref[i];
    snprintf(what, sizeof what, "rmsnorm bwd in place rows=%ld dim=%d", rows, dim);
    gt_expect_close(what, dxo, r64, n, 2e-6);

    gt_free(dx); gt_free(dw); gt_free(dy); gt_free(drs); gt_free(dyb); gt_free(dg); gt_free(dgb); gt_free(ddx);
    gt_free(ddxb);
    free(x); free(w); free(y); free(yref); free(rs); free(rsref); free(r64); free(g); free(dxref); free(dxo);
    free(acc0); free(first);
}

/* L(x) = Σ c·f(x) by the GPU forward in fp32; the backward of dy = c against central
 * differences (step h relative to |x|). fwd(out, x) runs the kernel on device buffers. */
typedef void (*fwd_fn)(void *ctx, float *dout, const float *dx);

static double fd_loss(fwd_fn f, void *ctx, const float *x, const float *c, size_t nin, size_t nout, float *dbuf_in,
                      float *dbuf_out, float *hout)
{
    GT_CUDA(cudaMemcpy(dbuf_in, x, nin * 4, cudaMemcpyHostToDevice));
    f(ctx, dbuf_out, dbuf_in);
    GT_CUDA(cudaDeviceSynchronize());
    gt_get_f32(hout, dbuf_out, nout);
    double s = 0;
    for (size_t i = 0; i < nout; i++) s += (double)c[i] * hout[i];
    return s;
}

static void fd_check(const char *what, fwd_fn f, void *ctx, const float *x, const float *c, const float *grad,
                     size_t nin, size_t nout)
{
    float *xp = malloc(nin * 4), *hout = malloc(nout * 4), *fd = malloc(nin * 4);
    float *din = gt_dev_poison(nin * 4), *dout = gt_dev_poison(nout * 4);
    double *g64 = malloc(nin * 8);
    memcpy(xp, x, nin * 4);
    for (size_t i = 0; i < nin; i++) {
        float h = 4e-3f * fmaxf(1.0f, fabsf(x[i]));
        xp[i] = x[i] + h;
        double lp = fd_loss(f, ctx, xp, c, nin, nout, din, dout, hout);
        xp[i] = x[i] - h;
        double lm = fd_loss(f, ctx, xp, c, nin, nout, din, dout, hout);
        xp[i] = x[i];
        fd[i] = (float)((lp - lm) / (2.0 * ((double)(x[i] + h) - x[i])));
        g64[i] = grad[i];
    }
    gt_expect_close(what, fd, g64, nin, 5e-3);
    gt_free(din); gt_free(dout);
    free(xp); free(hout); free(fd); free(g64);
}

typedef struct {
    long rows;
    int dim;
    void *dw;
} norm_ctx;

static void norm_fwd(void *vc, float *dout, const float *dx)
{
    norm_ctx *c = vc;
    GT_LCU(lcu_rmsnorm_fwd(dout, LCU_F32, NULL, dx, c->dw, c->rows, c->dim, 1e-6, 0));
}

static void test_rmsnorm_fd(void)
{
    norm_ctx c = {3, 8, NULL};
    size_t n = (size_t)c.rows * c.dim;
    float *x = malloc(n * 4), *w = malloc(c.dim * 4), *cw = malloc(n * 4), *dx = malloc(n * 4);
    gt_fill(x, n, -2, 2);
    gt_fill_bf16_exact(w, c.dim, 0.5, 1.5);
    gt_fill(cw, n, -1, 1);
    c.dw = gt_dev_bf16(w, c.dim);
    void *dxd = gt_dev_f32(x, n), *dy = gt_dev_poison(n * 4), *drs = gt_dev_poison(c.rows * 4);
    void *dc = gt_dev_f32(cw, n), *ddx = gt_dev_poison(n * 4);
    GT_LCU(lcu_rmsnorm_fwd(dy, LCU_F32, drs, dxd, c.dw, c.rows, c.dim, 1e-6, 0));
    GT_LCU(lcu_rmsnorm_bwd(ddx, LCU_F32, dc, LCU_F32, dxd, drs, c.dw, c.rows, c.dim, false, 0));
    gt_get_f32(dx, ddx, n);
    fd_check("rmsnorm bwd vs finite differences", norm_fwd, &c, x, cw, dx, n, n);
    gt_free(c.dw); gt_free(dxd); gt_free(dy); gt_free(drs); gt_free(dc); gt_free(ddx);
    free(x); free(w); free(cw); free(dx);
}

/* ---- RoPE ------------------------------------------------------------------------------- */

static void test_rope(void)
{
    int d = 2 * gt_int(1, 64), half = d / 2, nh = gt_int(1, 8), max_pos = gt_int(1, 5000);
    long T = gt_int(1, 300);
    double *inv = malloc(half * 8);
    /* HF-like frequencies, some divided as llama3 scaling does */
    for (int i = 0; i < half; i++) inv[i] = pow(500000.0, -2.0 * i / d) / (i > half / 2 ? 8.0 : 1.0);
    float *ct = malloc((size_t)max_pos * half * 4), *st = malloc((size_t)max_pos * half * 4);
    float *cref = malloc((size_t)max_pos * half * 4), *sref = malloc((size_t)max_pos * half * 4);
    for (int p = 0; p < max_pos; p++)
        for (int i = 0; i < half; i++) {
            cref[(long)p * half + i] = (float)cos(p * inv[i]);
            sref[(long)p * half + i] = (float)sin(p * inv[i]);
        }
    void *dct = gt_dev_poison((size_t)max_pos * half * 4), *dst = gt_dev_poison((size_t)max_pos * half * 4);
    GT_LCU(lcu_rope_table(dct, dst, inv, half, max_pos, 0));
    gt_get_f32(ct, dct, (size_t)max_pos * half);
    gt_get_f32(st, dst, (size_t)max_pos * half);
    double e = fmax(gt_rel_err_f(ct, cref, (size_t)max_pos * half), gt_rel_err_f(st, sref, (size_t)max_pos * half));
    gt_check(e < 1e-7, "rope table vs host double cos/sin: rel err %.3g (d=%d, max_pos=%d)", e, d, max_pos);

    size_t n = (size_t)T * nh * d;
    int32_t *pos = malloc(T * 4);
    for (long t = 0; t < T; t++) pos[t] = gt_int(0, max_pos - 1);
    float *x = malloc(n * 4), *ref = malloc(n * 4), *out = malloc(n * 4);
    double *r64 = malloc(n * 8);
    gt_fill(x, n, -2, 2);
    void *dx = gt_dev_f32(x, n), *dpos = gt_dev_copy(pos, T * 4), *dout = gt_dev_poison(n * 4), *dob = gt_dev_poison(n * 2);
    char what[120];
    for (int inverse = 0; inverse < 2; inverse++) {
        memcpy(ref, x, n * 4);
        cpu_rope(pool, ref, T, nh, d, pos, cref, sref, inverse);
        for (size_t i = 0; i < n; i++) r64[i] = ref[i];
        GT_CUDA(cudaMemset(dout, 0xff, n * 4));
        GT_LCU(lcu_rope(dout, LCU_F32, dx, T, nh, d, dpos, dct, dst, inverse, 0));
        gt_get_f32(out, dout, n);
        snprintf(what, sizeof what, "rope%s f32 T=%ld nh=%d d=%d vs cpu", inverse ? " inverse" : "", T, nh, d);
        gt_expect_close(what, out, r64, n, 2e-6);
        GT_LCU(lcu_rope(dob, LCU_BF16, dx, T, nh, d, dpos, dct, dst, inverse, 0));
        gt_get_bf16(out, dob, n);
        snprintf(what, sizeof what, "rope%s bf16 T=%ld nh=%d d=%d vs cpu", inverse ? " inverse" : "", T, nh, d);
        gt_expect_close(what, out, r64, n, 5e-3);
    }
    /* in place, forward then inverse: the identity */
    GT_LCU(lcu_rope(dx, LCU_F32, dx, T, nh, d, dpos, dct, dst, false, 0));
    GT_LCU(lcu_rope(dx, LCU_F32, dx, T, nh, d, dpos, dct, dst, true, 0));
    gt_get_f32(out, dx, n);
    for (size_t i = 0; i < n; i++) r64[i] = x[i];
    gt_expect_close("rope in place, then inverse = identity", out, r64, n, 2e-6);
    gt_free(dct); gt_free(dst); gt_free(dx); gt_free(dpos); gt_free(dout); gt_free(dob);
    free(inv); free(ct); free(st); free(cref); free(sref); free(pos); free(x); free(ref); free(out); free(r64);
}

/* ---- a decode pass's q/k/v in one kernel --------------------------------------------------- */

/* lcu_decode_qkv against the launches it replaces (q/k lcu_rmsnorm_fwd to fp32, lcu_rope to
 * bf16, v lcu_convert, k and v lcu_copy_rows into cache rows): the same bits in q and in
 * the caches' written rows, the other cache rows untouched; with and without the q/k norm
 * (Qwen3, Llama), at head dims whose halves do and do not fill a warp. */
static void test_decode_qkv(bool norm, int d)
{
    int nq = 2 * gt_int(1, 8), nkv = nq / 2, half = d / 2, max_pos = 300, cap = 8;
    long T = gt_int(1, 40), rows = T * cap; /* each row t its own stream of cap positions */
    size_t nqd = (size_t)T * nq * d, nkd = (size_t)T * nkv * d, ncache = (size_t)rows * nkv * d;
    double *inv = malloc(half * 8);
    for (int i = 0; i < half; i++) inv[i] = pow(1000000.0, -2.0 * i / d);
    void *dct = gt_dev_poison((size_t)max_pos * half * 4), *dst = gt_dev_poison((size_t)max_pos * half * 4);
    GT_LCU(lcu_rope_table(dct, dst, inv, half, max_pos, 0));
    int32_t *pos = malloc(T * 4);
    int64_t *krow = malloc(T * 8);
    for (long t = 0; t < T; t++) {
        pos[t] = gt_int(0, max_pos - 1);
        krow[t] = t * cap + gt_int(0, cap - 1);
    }
    float *q = malloc(nqd * 4), *k = malloc(nkd * 4), *v = malloc(nkd * 4), *wq = malloc(d * 4), *wk = malloc(d * 4);
    gt_fill(q, nqd, -3, 3);
    gt_fill(k, nkd, -3, 3);
    gt_fill(v, nkd, -3, 3);
    gt_fill(wq, d, 0.5, 1.5);
    gt_fill(wk, d, 0.5, 1.5);
    void *dq = gt_dev_f32(q, nqd), *dk = gt_dev_f32(k, nkd), *dv = gt_dev_f32(v, nkd), *dwq = gt_dev_bf16(wq, d),
         *dwk = gt_dev_bf16(wk, d), *dpos = gt_dev_copy(pos, T * 4), *drow = gt_dev_copy(krow, T * 8);
    void *qf = gt_dev_poison(nqd * 4), *kf = gt_dev_poison(nkd * 4), *qb = gt_dev_poison(nqd * 2),
         *kb = gt_dev_poison(nkd * 2), *vb = gt_dev_poison(nkd * 2);
    void *kc1 = gt_dev_poison(ncache * 2), *vc1 = gt_dev_poison(ncache * 2), *kc2 = gt_dev_poison(ncache * 2),
         *vc2 = gt_dev_poison(ncache * 2), *q2 = gt_dev_poison(nqd * 2);
    double eps = 1e-6;
    /* the separate launches, as cu_layer_forward runs them without the switch */
    const float *qs = dq, *ks = dk;
    if (norm) {
        GT_LCU(lcu_rmsnorm_fwd(qf, LCU_F32, NULL, dq, dwq, T * nq, d, eps, 0));
        GT_LCU(lcu_rmsnorm_fwd(kf, LCU_F32, NULL, dk, dwk, T * nkv, d, eps, 0));
        qs = qf;
        ks = kf;
    }
    GT_LCU(lcu_rope(qb, LCU_BF16, qs, T, nq, d, dpos, dct, dst, false, 0));
    GT_LCU(lcu_rope(kb, LCU_BF16, ks, T, nkv, d, dpos, dct, dst, false, 0));
    GT_LCU(lcu_convert(vb, LCU_BF16, dv, LCU_F32, nkd, 0));
    GT_LCU(lcu_copy_rows(kc1, drow, kb, NULL, T, (size_t)nkv * d * 2, 0));
    GT_LCU(lcu_copy_rows(vc1, drow, vb, NULL, T, (size_t)nkv * d * 2, 0));
    /* the one kernel */
    GT_LCU(lcu_decode_qkv(q2, kc2, vc2, drow, dq, (long)nq * d, dk, (long)nkv * d, dv, (long)nkv * d,
                          norm ? dwq : NULL, norm ? dwk : NULL, T, nq, nkv, d, eps, dpos, dct, dst, 0));
    uint16_t *a = malloc(ncache * 2), *b = malloc(ncache * 2);
    gt_get(a, qb, nqd * 2);
    gt_get(b, q2, nqd * 2);
    bool qsame = memcmp(a, b, nqd * 2) == 0;
    gt_get(a, kc1, ncache * 2);
    gt_get(b, kc2, ncache * 2);
    bool ksame = memcmp(a, b, ncache * 2) == 0; /* written rows equal, the rest both still poison */
    gt_get(a, vc1, ncache * 2);
    gt_get(b, vc2, ncache * 2);
    bool vsame = memcmp(a, b, ncache * 2) == 0;
    gt_check(qsame && ksame && vsame, "decode q/k/v in one kernel (%s, T=%ld nq=%d nkv=%d d=%d) = the separate launches, "
             "bitwise: q %s, k cache %s, v cache %s", norm ? "q/k norm" : "no norm", T, nq, nkv, d,
             qsame ? "same" : "DIFFERS", ksame ? "same" : "DIFFERS", vsame ? "same" : "DIFFERS");
    gt_check(lcu_decode_qkv(q2, kc2, vc2, drow, dq, (long)nq * d, dk, (long)nkv * d, dv, (long)nkv * d, dwq, NULL, T,
                            nq, nkv, d, eps, dpos, dct, dst, 0) == LCU_EINVAL,
             "decode q/k/v: a q norm without a k norm is refused");
    /* the same rows read from one [q | k | v] buffer (row stride nq·d + 2·nkv·d), as after one GEMM */
    long ld = (long)(nq + 2 * nkv) * d;
    float *qkv = malloc((size_t)T * ld * 4);
    for (long t = 0; t < T; t++) {
        memcpy(qkv + t * ld, q + t * nq * d, (size_t)nq * d * 4);
        memcpy(qkv + t * ld + nq * d, k + t * nkv * d, (size_t)nkv * d * 4);
        memcpy(qkv + t * ld + (nq + nkv) * d, v + t * nkv * d, (size_t)nkv * d * 4);
    }
    float *dqkv = gt_dev_f32(qkv, (size_t)T * ld);
    void *kc3 = gt_dev_poison(ncache * 2), *vc3 = gt_dev_poison(ncache * 2), *q3 = gt_dev_poison(nqd * 2);
    GT_LCU(lcu_decode_qkv(q3, kc3, vc3, drow, dqkv, ld, dqkv + nq * d, ld, dqkv + (nq + nkv) * d, ld, norm ? dwq : NULL,
                          norm ? dwk : NULL, T, nq, nkv, d, eps, dpos, dct, dst, 0));
    bool strided = true;
    gt_get(a, q2, nqd * 2);
    gt_get(b, q3, nqd * 2);
    strided &= memcmp(a, b, nqd * 2) == 0;
    gt_get(a, kc2, ncache * 2);
    gt_get(b, kc3, ncache * 2);
    strided &= memcmp(a, b, ncache * 2) == 0;
    gt_get(a, vc2, ncache * 2);
    gt_get(b, vc3, ncache * 2);
    strided &= memcmp(a, b, ncache * 2) == 0;
    gt_check(strided, "decode q/k/v from one [q | k | v] buffer = from three, bitwise (%s, d=%d)",
             norm ? "q/k norm" : "no norm", d);
    free(qkv);
    gt_free(dqkv); gt_free(kc3); gt_free(vc3); gt_free(q3);
    gt_free(dct); gt_free(dst); gt_free(dq); gt_free(dk); gt_free(dv); gt_free(dwq); gt_free(dwk); gt_free(dpos);
    gt_free(drow); gt_free(qf); gt_free(kf); gt_free(qb); gt_free(kb); gt_free(vb); gt_free(kc1); gt_free(vc1);
    gt_free(kc2); gt_free(vc2); gt_free(q2);
    free(inv); free(pos); free(krow); free(q); free(k); free(v); free(wq); free(wk); free(a); free(b);
}

/* ---- SwiGLU ----------------------------------------------------------------------------- */

typedef struct {
    long n;
    void *du; /* fixed u on the device */
} swi_ctx;

static void swi_fwd_g(void *vc, float *dout, const float *dg)
{
    swi_ctx *c = vc;
    GT_LCU(lcu_swiglu_fwd(dout, LCU_F32, dg, c->du, c->n, 0));
}

static void test_swiglu(void)
{
    long n = gt_int(1, 100000);
    float *g = malloc(n * 4), *u = malloc(n * 4), *dh = malloc(n * 4), *h = malloc(n * 4), *ref = malloc(n * 4);
    float *dgr = malloc(n * 4), *dur = malloc(n * 4);
    double *r64 = malloc(n * 8);
    gt_fill(g, n, -8, 8);
    gt_fill(u, n, -3, 3);
    gt_fill(dh, n, -1, 1);
    void *dg = gt_dev_f32(g, n), *du = gt_dev_f32(u, n), *ddh = gt_dev_f32(dh, n);
    void *dhout = gt_dev_poison(n * 4), *dhb = gt_dev_poison(n * 2);
    cpu_swiglu_fwd(pool, ref, g, u, n);
    for (long i = 0; i < n; i++) r64[i] = ref[i];
    GT_LCU(lcu_swiglu_fwd(dhout, LCU_F32, dg, du, n, 0));
    gt_get_f32(h, dhout, n);
    gt_expect_close("swiglu fwd f32 vs cpu", h, r64, n, 2e-6);
    GT_LCU(lcu_swiglu_fwd(dhb, LCU_BF16, dg, du, n, 0));
    gt_get_bf16(h, dhb, n);
    gt_expect_close("swiglu fwd bf16 vs cpu", h, r64, n, 5e-3);
    if (n > 1) { /* one element in: the scalar form, the same bits as the 4-wide one */
        void *dhs = gt_dev_poison(n * 2);
        GT_LCU(lcu_swiglu_fwd((uint16_t *)dhs + 1, LCU_BF16, (float *)dg + 1, (float *)du + 1, n - 1, 0));
        uint16_t *x = malloc(n * 2), *y = malloc(n * 2);
        gt_get(x, dhs, n * 2);
        gt_get(y, dhb, n * 2);
        gt_check(memcmp(x + 1, y + 1, (n - 1) * 2) == 0, "swiglu fwd bf16: unaligned (scalar) = aligned, bitwise");
        free(x); free(y);
        gt_free(dhs);
    }
    {   /* rows of [g | u] (one GEMM's [gate | up]): the same bits as the flat form */
        int I = gt_int(1, 300);
        long T = n / I > 0 ? n / I : 1, m = T * I;
        if (m > n) m = n, T = 1, I = (int)n;
        float *gu = malloc((size_t)T * 2 * I * 4);
        for (long t = 0; t < T; t++) {
            memcpy(gu + t * 2 * I, g + t * I, (size_t)I * 4);
            memcpy(gu + t * 2 * I + I, u + t * I, (size_t)I * 4);
        }
        float *dgu = gt_dev_f32(gu, (size_t)T * 2 * I);
        void *dhr = gt_dev_poison(m * 2);
        GT_LCU(lcu_swiglu_rows(dhr, dgu, dgu + I, T, I, 2L * I, 0));
        uint16_t *x = malloc(m * 2), *y = malloc(m * 2);
        gt_get(x, dhr, m * 2);
        gt_get(y, dhb, m * 2);
        gt_check(memcmp(x, y, m * 2) == 0, "swiglu over [g | u] rows (T=%ld I=%d) = the flat form, bitwise", T, I);
        gt_check(lcu_swiglu_rows(dhr, dgu, dgu + I, T, I, I - 1, 0) == LCU_EINVAL, "swiglu rows: ld < I refused");
        free(gu); free(x); free(y);
        gt_free(dgu); gt_free(dhr);
    }

    cpu_swiglu_bwd(pool, dgr, dur, dh, g, u, n);
    void *ddg = gt_dev_poison(n * 4), *ddu = gt_dev_poison(n * 4);
    GT_LCU(lcu_swiglu_bwd(ddg, ddu, LCU_F32, ddh, dg, du, n, 0));
    gt_get_f32(h, ddg, n);
    for (long i = 0; i < n; i++) r64[i] = dgr[i];
    gt_expect_close("swiglu bwd dg f32 vs cpu", h, r64, n, 2e-6);
    gt_get_f32(h, ddu, n);
    for (long i = 0; i < n; i++) r64[i] = dur[i];
    gt_expect_close("swiglu bwd du f32 vs cpu", h, r64, n, 2e-6);
    void *ddgb = gt_dev_poison(n * 2), *ddub = gt_dev_poison(n * 2);
    GT_LCU(lcu_swiglu_bwd(ddgb, ddub, LCU_BF16, ddh, dg, du, n, 0));
    gt_get_bf16(h, ddub, n);
    gt_expect_close("swiglu bwd du bf16 vs cpu", h, r64, n, 5e-3);
    gt_get_bf16(h, ddgb, n);
    for (long i = 0; i < n; i++) r64[i] = dgr[i];
    gt_expect_close("swiglu bwd dg bf16 vs cpu", h, r64, n, 5e-3);
    if (n > 1) { /* one element in: the scalar form, the same bits as the 4-wide one */
        void *sg = gt_dev_poison(n * 2), *su = gt_dev_poison(n * 2);
        GT_LCU(lcu_swiglu_bwd((uint16_t *)sg + 1, (uint16_t *)su + 1, LCU_BF16, (float *)ddh + 1, (float *)dg + 1,
                              (float *)du + 1, n - 1, 0));
        uint16_t *x = malloc(n * 2), *y = malloc(n * 2), *xu = malloc(n * 2), *yu = malloc(n * 2);
        gt_get(x, sg, n * 2);
        gt_get(y, ddgb, n * 2);
        gt_get(xu, su, n * 2);
        gt_get(yu, ddub, n * 2);
        gt_check(!memcmp(x + 1, y + 1, (n - 1) * 2) && !memcmp(xu + 1, yu + 1, (n - 1) * 2),
                 "swiglu bwd bf16: unaligned (scalar) = aligned, bitwise");
        free(x); free(y); free(xu); free(yu);
        gt_free(sg); gt_free(su);
    }

    /* finite differences in g on a tiny shape (u fixed); du is linear, checked above */
    {
        swi_ctx c = {16, NULL};
        float gs[16], us[16], cs[16], grad[16];
        gt_fill(gs, 16, -4, 4);
        gt_fill(us, 16, -2, 2);
        gt_fill(cs, 16, -1, 1);
        c.du = gt_dev_f32(us, 16);
        void *dgs = gt_dev_f32(gs, 16), *dcs = gt_dev_f32(cs, 16), *o1 = gt_dev_poison(64), *o2 = gt_dev_poison(64);
        GT_LCU(lcu_swiglu_bwd(o1, o2, LCU_F32, dcs, dgs, c.du, 16, 0));
        gt_get_f32(grad, o1, 16);
        fd_check("swiglu bwd dg vs finite differences", swi_fwd_g, &c, gs, cs, grad, 16, 16);
        gt_free(c.du); gt_free(dgs); gt_free(dcs); gt_free(o1); gt_free(o2);
    }
    gt_free(dg); gt_free(du); gt_free(ddh); gt_free(dhout); gt_free(dhb); gt_free(ddg); gt_free(ddu);
    gt_free(ddgb); gt_free(ddub);
    free(g); free(u); free(dh); free(h); free(ref); free(dgr); free(dur); free(r64);
}

int main(void)
{
    gt_init("test_gpu_ops");
    pool = cpu_pool_create(2);
    test_convert();
    test_copy_rows();
    test_embed_add();
    /* dim ≥ 2: at dim 1 the backward is pure cancellation (x̂² = 1 − eps/x², so dx ~ 1e-6·g
     * from rounding noise of order 1e-7): no fp32 kernel meets a relative bar there */
    test_rmsnorm(gt_int(1, 200), gt_int(2, 200));
    test_rmsnorm(gt_int(1, 64), 4096);
    test_rmsnorm(gt_int(100, 3000), 128); /* q/k norm shape: rows·heads of head_dim */
    test_rmsnorm_fd();
    test_rope();
    test_decode_qkv(true, 128);
    test_decode_qkv(false, 64);
    test_decode_qkv(true, 32);
    test_swiglu();
    cpu_pool_destroy(pool);
    return gt_finish();
}
