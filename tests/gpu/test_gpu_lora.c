/* test_gpu_lora.c — segmented LoRA (lcu_lora_fwd / lcu_lora_bwd): several adapters of
 * different ranks (1, 3, 8, 32, 64, 136; scale = 32/r) over runs of rows of one packed batch,
 * against the fp64 products of the CPU backend (cpu_lora_fwd_rows / cpu_lora_bwd_rows);
 * the packed call equal, bit for bit, to each segment run alone; 56 segments, so each
 * adapter's gradients accumulate over several of them (in segment order) and a call holds
 * more segments than one launch of versions 2 and 3 takes; bitwise reruns; the fp64
 * reference gradients against finite differences. Every version of the kernel layer
 * (LCU_LORA=gemm, sgmv, sgmv3) runs every check, version 3 twice: with its small-segment
 * kernels (segments of at most 16 rows) and with its tiled kernel alone
 * (LCU_SGMV3_SMALL=0). The shapes: widths 256/192, odd widths (unaligned rows: the
 * scalar paths), long K (split-K), and decode-sized segments (1–16 rows each, 4104 inputs:
 * the small kernels' every loop, over more segments than one launch takes).
 *
 * Tolerances (relative L2, on the LoRA contribution): y delta 5e-3 (z rounded to bf16
 * before the expand); dx delta, gA, gB delta 1e-2 (dz rounded to bf16 as well).
 */
#include "tests/gpu/gt.h"

#include <math.h>
#include <string.h>

#define NSEG 56 /* more than lcu_sgmv.cu's 32 and lcu_sgmv3.cu's 48 per launch, 9+ per adapter: flushes and waves */
#define NAD 6   /* adapters, ranks 1, 3, 8, 32, 64, 136 (over 64: version 3's expand in two K chunks) */
#define MAXR 136

static const char *version; /* LCU_LORA of the checks running: every check names it (a FAIL line alone says which) */

typedef struct {
    int in, out, nseg;
    long rows;
    long begin[NSEG], end[NSEG];
    int rank[NSEG], ad[NSEG]; /* ad: which adapter (segments 4 and 5 share adapter 4, then s % NAD) */
    int arank[NAD];           /* each adapter's rank */
    float *A[NSEG], *B[NSEG]; /* host fp32 (bf16-exact) */
} setup;

/* y += scale (x Aᵀ) Bᵀ; gB += scale dyᵀ z; dz = scale dy B; gA += dzᵀ x; dx += dz A; in fp64. */
static void ref(const setup *S, const float *x, const float *dy, double *y, double *dx, double **gA, double **gB)
{
    for (int s = 0; s < S->nseg; s++) {
        int r = S->rank[s], a = S->ad[s];
        double scale = 32.0 / r;
        for (long t = S->begin[s]; t < S->end[s]; t++) {
            double z[MAXR], dz[MAXR];
            for (int j = 0; j < r; j++) {
                z[j] = 0;
                for (int i = 0; i < S->in; i++) z[j] += (double)x[t * S->in + i] * S->A[a][j * S->in + i];
            }
            for (int o = 0; o < S->out; o++) {
                double acc = 0;
                for (int j = 0; j < r; j++) acc += z[j] * S->B[a][o * r + j];
                y[t * S->out + o] += scale * acc;
            }
            for (int j = 0; j < r; j++) {
                dz[j] = 0;
                for (int o = 0; o < S->out; o++) dz[j] += scale * dy[t * S->out + o] * S->B[a][o * r + j];
            }
            for (int o = 0; o < S->out; o++)
                for (int j = 0; j < r; j++) gB[a][o * r + j] += scale * dy[t * S->out + o] * z[j];
            for (int j = 0; j < r; j++)
                for (int i = 0; i < S->in; i++) gA[a][j * S->in + i] += dz[j] * x[t * S->in + i];
            for (int i = 0; i < S->in; i++)
                for (int j = 0; j < r; j++) dx[t * S->in + i] += dz[j] * S->A[a][j * S->in + i];
        }
    }
}

/* rows of segment 3 when > 0 (else random like the others): with in and out over 512, the
 * products whose K is in, out or the rows run split-K in versions 2 and 3 */
static int long_rows;
/* the largest random segment: 90, or 16 for decode-sized segments (every one in version 3's
 * small kernels); segments 0 and 4 have 16 and 17 rows otherwise (its boundary) */
static int max_rows = 90;

static void make_setup(setup *S, int in, int out)
{
    const int ranks[NAD] = {1, 3, 8, 32, 64, 136};
    S->in = in;
    S->out = out;
    S->nseg = NSEG;
    long row = 0;
    for (int s = 0; s < NSEG; s++) {
        S->ad[s] = s < 5 ? s : s == 5 ? 4 : s % NAD;
        S->rank[s] = ranks[S->ad[s]];
        row += s == 2 ? 7 : 0; /* rows without an adapter between segments */
        S->begin[s] = row;
        row += s == 1                  ? 0 /* segment 1 is empty */
               : s == 3 && long_rows   ? long_rows
               : s == 0 && max_rows > 16 ? 16
               : s == 4 && max_rows > 16 ? 17
                                       : gt_int(1, max_rows);
        S->end[s] = row;
    }
    S->rows = row + 5;
    for (int a = 0; a < NAD; a++) {
        S->arank[a] = ranks[a];
        S->A[a] = malloc((size_t)ranks[a] * in * 4);
        S->B[a] = malloc((size_t)out * ranks[a] * 4);
        gt_fill_bf16_exact(S->A[a], (size_t)ranks[a] * in, -1.0 / sqrt(in), 1.0 / sqrt(in));
        gt_fill_bf16_exact(S->B[a], (size_t)out * ranks[a], -0.05, 0.05);
    }
}

typedef struct {
    void *A, *B;
    float *gA, *gB;
} dev_ad;

/* z, dz: workspaces with the stride of the largest rank in every call, packed or alone */
static void run(lcu_ctx *c, const setup *S, dev_ad *D, int only, void *x, void *y, void *dy, void *dx, void *z,
                void *dz, bool bwd)
{
    lcu_lora_seg segs[NSEG];
    int n = 0;
    for (int s = 0; s < S->nseg; s++) {
        if (only >= 0 && s != only) continue;
        int a = S->ad[s];
        segs[n++] = (lcu_lora_seg){S->begin[s], S->end[s], S->rank[s], 32.0f / S->rank[s], D[a].A, D[a].B, D[a].gA, D[a].gB};
    }
    long ldz = lcu_lora_ldz(MAXR);
    if (!bwd) GT_LCU(lcu_lora_fwd(c, segs, n, S->in, S->out, x, S->in, y, S->out, z, ldz, 0));
    else GT_LCU(lcu_lora_bwd(c, segs, n, S->in, S->out, x, S->in, dy, S->out, dx, S->in, z, dz, ldz, 0));
}

static void test_lora(lcu_ctx *c, int in, int out)
{
    setup S;
    make_setup(&S, in, out);
    long R = S.rows;
    float *x = malloc(R * in * 4), *y0 = malloc(R * out * 4), *dy = malloc(R * out * 4), *dx0 = malloc(R * in * 4);
    gt_fill_bf16_exact(x, R * in, -1, 1);
    gt_fill(y0, R * out, -1, 1);
    gt_fill_bf16_exact(dy, R * out, -1, 1);
    gt_fill(dx0, R * in, -1, 1);
    dev_ad D[NAD];
    float *gA0[NAD], *gB0[NAD];
    double *rgA[NAD], *rgB[NAD];
    for (int a = 0; a < NAD; a++) {
        int r = S.arank[a];
        gA0[a] = malloc((size_t)r * in * 4);
        gB0[a] = malloc((size_t)out * r * 4);
        gt_fill(gA0[a], (size_t)r * in, -0.1, 0.1);
        gt_fill(gB0[a], (size_t)out * r, -0.1, 0.1);
        rgA[a] = calloc((size_t)r * in, 8);
        rgB[a] = calloc((size_t)out * r, 8);
        D[a].A = gt_dev_bf16(S.A[a], (size_t)r * in);
        D[a].B = gt_dev_bf16(S.B[a], (size_t)out * r);
        D[a].gA = gt_dev_f32(gA0[a], (size_t)r * in);
        D[a].gB = gt_dev_f32(gB0[a], (size_t)out * r);
    }
    double *ry = calloc(R * out, 8), *rdx = calloc(R * in, 8);
    ref(&S, x, dy, ry, rdx, rgA, rgB);

    int ldz = lcu_lora_ldz(MAXR);
    void *dxb = gt_dev_bf16(x, R * in), *dyb = gt_dev_bf16(dy, R * out), *dyv = gt_dev_f32(y0, R * out);
    void *ddx = gt_dev_f32(dx0, R * in), *z = gt_dev_poison(R * ldz * 2), *dz = gt_dev_poison(R * ldz * 2);
    run(c, &S, D, -1, dxb, dyv, NULL, NULL, z, NULL, false);
    run(c, &S, D, -1, dxb, NULL, dyb, ddx, z, dz, true);

    float *y = malloc(R * out * 4), *dxo = malloc(R * in * 4);
    gt_get_f32(y, dyv, R * out);
    gt_get_f32(dxo, ddx, R * in);
    /* compare the LoRA contributions (outputs minus their initial values) */
    float *dl = malloc((R * (in > out ? in : out)) * 4);
    for (long i = 0; i < R * out; i++) dl[i] = y[i] - y0[i];
    char what[160];
    snprintf(what, sizeof what, "lora %s fwd delta in=%d out=%d (%d segments, ranks 1..136)", version, in, out,
             S.nseg);
    gt_expect_close(what, dl, ry, R * out, 5e-3);
    bool untouched = true;
    for (long t = 0; t < R; t++) {
        bool in_seg = false;
        for (int s = 0; s < S.nseg; s++) in_seg |= t >= S.begin[s] && t < S.end[s];
        if (!in_seg)
            for (int o = 0; o < out; o++) untouched &= y[t * out + o] == y0[t * out + o];
    }
    gt_check(untouched, "lora %s fwd leaves rows outside every segment alone (in=%d out=%d)", version, in, out);
    for (long i = 0; i < R * in; i++) dl[i] = dxo[i] - dx0[i];
    snprintf(what, sizeof what, "lora %s bwd dx delta in=%d out=%d", version, in, out);
    gt_expect_close(what, dl, rdx, R * in, 1e-2);
    for (int a = 0; a < NAD; a++) {
        int r = S.arank[a];
        float *g = malloc((size_t)r * (in > out ? in : out) * 4);
        gt_get_f32(g, D[a].gA, (size_t)r * in);
        for (long i = 0; i < (long)r * in; i++) g[i] -= gA0[a][i];
        snprintf(what, sizeof what, "lora %s gA adapter %d rank %d in=%d out=%d", version, a, r, in, out);
        gt_expect_close(what, g, rgA[a], (size_t)r * in, 1e-2);
        gt_get_f32(g, D[a].gB, (size_t)out * r);
        for (long i = 0; i < (long)out * r; i++) g[i] -= gB0[a][i];
        snprintf(what, sizeof what, "lora %s gB adapter %d rank %d in=%d out=%d", version, a, r, in, out);
        gt_expect_close(what, g, rgB[a], (size_t)out * r, 1e-2);
        free(g);
    }

    /* packed == alone, bit for bit: rerun from the same starting values segment by
     * segment (in the same order), then packed again, and compare everything */
    float *yp = malloc(R * out * 4), *dxp = malloc(R * in * 4), *ya = malloc(R * out * 4), *dxa = malloc(R * in * 4);
    float *gp[NAD][2], *ga[NAD][2];
    for (int mode = 0; mode < 2; mode++) {
        GT_CUDA(cudaMemcpy(dyv, y0, R * out * 4, cudaMemcpyHostToDevice));
        GT_CUDA(cudaMemcpy(ddx, dx0, R * in * 4, cudaMemcpyHostToDevice));
        for (int a = 0; a < NAD; a++) {
            int r = S.arank[a];
            GT_CUDA(cudaMemcpy(D[a].gA, gA0[a], (size_t)r * in * 4, cudaMemcpyHostToDevice));
            GT_CUDA(cudaMemcpy(D[a].gB, gB0[a], (size_t)out * r * 4, cudaMemcpyHostToDevice));
        }
        if (mode == 0) {
            run(c, &S, D, -1, dxb, dyv, NULL, NULL, z, NULL, false);
            run(c, &S, D, -1, dxb, NULL, dyb, ddx, z, dz, true);
        } else {
            for (int s = 0; s < S.nseg; s++) run(c, &S, D, s, dxb, dyv, NULL, NULL, z, NULL, false);
            for (int s = 0; s < S.nseg; s++) run(c, &S, D, s, dxb, NULL, dyb, ddx, z, dz, true);
        }
        gt_get_f32(mode ? ya : yp, dyv, R * out);
        gt_get_f32(mode ? dxa : dxp, ddx, R * in);
        for (int a = 0; a < NAD; a++) {
            int r = S.arank[a];
            float **dst = mode ? ga[a] : gp[a];
            dst[0] = malloc((size_t)r * in * 4);
            dst[1] = malloc((size_t)out * r * 4);
            gt_get_f32(dst[0], D[a].gA, (size_t)r * in);
            gt_get_f32(dst[1], D[a].gB, (size_t)out * r);
        }
    }
    snprintf(what, sizeof what, "lora %s packed == alone: y (in=%d out=%d)", version, in, out);
    gt_expect_bits(what, yp, ya, R * out * 4);
    snprintf(what, sizeof what, "lora %s packed == alone: dx (in=%d out=%d)", version, in, out);
    gt_expect_bits(what, dxp, dxa, R * in * 4);
    snprintf(what, sizeof what, "lora %s packed rerun == first run: y (in=%d out=%d)", version, in, out);
    gt_expect_bits(what, yp, y, R * out * 4);
    snprintf(what, sizeof what, "lora %s packed rerun == first run: dx (in=%d out=%d)", version, in, out);
    gt_expect_bits(what, dxp, dxo, R * in * 4);
    bool same = true;
    for (int a = 0; a < NAD; a++) {
        int r = S.arank[a];
        same &= memcmp(gp[a][0], ga[a][0], (size_t)r * in * 4) == 0 && memcmp(gp[a][1], ga[a][1], (size_t)out * r * 4) == 0;
        free(gp[a][0]); free(gp[a][1]); free(ga[a][0]); free(ga[a][1]);
    }
    gt_check(same, "lora %s packed == alone: gA, gB of every adapter, bit for bit (in=%d out=%d)", version, in, out);

    for (int a = 0; a < NAD; a++) {
        gt_free(D[a].A); gt_free(D[a].B); gt_free(D[a].gA); gt_free(D[a].gB);
        free(S.A[a]); free(S.B[a]); free(gA0[a]); free(gB0[a]); free(rgA[a]); free(rgB[a]);
    }
    gt_free(dxb); gt_free(dyb); gt_free(dyv); gt_free(ddx); gt_free(z); gt_free(dz);
    free(x); free(y0); free(dy); free(dx0); free(ry); free(rdx); free(y); free(dxo); free(dl);
    free(yp); free(dxp); free(ya); free(dxa);
}

/* The fp64 reference's gradients against central differences of L = Σ c ⊙ y + Σ dy0 ⊙ ...:
 * with L = Σ dy ⊙ y, dL/dA = gA and dL/dB = gB (scale included), dL/dx = dx. */
static void test_ref_fd(void)
{
    setup S;
    make_setup(&S, 5, 4);
    S.nseg = 1;
    S.ad[0] = 2; /* rank 8 */
    S.rank[0] = 8;
    S.begin[0] = 0;
    S.end[0] = 3;
    S.rows = 3;
    float x[15], dy[12];
    gt_fill(x, 15, -1, 1);
    gt_fill(dy, 12, -1, 1);
    double *gA[NAD] = {0}, *gB[NAD] = {0}, dx[15] = {0}, y[12];
    gA[2] = calloc(8 * 5, 8);
    gB[2] = calloc(4 * 8, 8);
    memset(y, 0, sizeof y);
    ref(&S, x, dy, y, dx, gA, gB);
    double worst = 0;
    float *params[2] = {S.A[2], S.B[2]};
    double *grads[2] = {gA[2], gB[2]};
    int sizes[2] = {40, 32};
    double *ga2[NAD] = {0}, *gb2[NAD] = {0}, dxx[15];
    ga2[2] = calloc(40, 8);
    gb2[2] = calloc(32, 8);
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < sizes[p]; i++) {
            float v0 = params[p][i];
            double L[2];
            for (int sg = 0; sg < 2; sg++) {
                params[p][i] = v0 + (sg ? -1e-3f : 1e-3f);
                memset(y, 0, sizeof y);
                ref(&S, x, dy, y, dxx, ga2, gb2);
                L[sg] = 0;
                for (int t = 0; t < 12; t++) L[sg] += dy[t] * y[t];
            }
            params[p][i] = v0;
            double fd = (L[0] - L[1]) / ((double)(v0 + 1e-3f) - (double)(v0 - 1e-3f));
            worst = fmax(worst, fabs(fd - grads[p][i]) / fmax(1.0, fabs(grads[p][i])));
        }
    gt_check(worst < 1e-8, "fp64 LoRA reference gradients vs finite differences: max err %.3g", worst);
    for (int a = 0; a < NAD; a++) { free(S.A[a]); free(S.B[a]); }
    free(gA[2]); free(gB[2]); free(ga2[2]); free(gb2[2]);
}

/* lcu_lora_fwd_into (LCU_LORA_FIRST's LoRA, written where the output is produced): y = LoRA
 * (+ C) over segments tiling every row, against the running version's lcu_lora_fwd into a
 * copy of C (or zeros): the same products, equal within fp32 rounding; segments with a gap
 * or short of the rows, and C on version 3, are declined (LCU_ENOTSUP). */
static void test_fwd_into(lcu_ctx *c, int in, int out)
{
    long rows = gt_int(20, 150), cut = gt_int(1, (int)rows - 1), ldz = lcu_lora_ldz(16);
    float *x = malloc(rows * in * 4), *Cm = malloc(rows * out * 4), *A0 = malloc(8L * in * 4), *B0 = malloc(8L * out * 4),
          *A1 = malloc(16L * in * 4), *B1 = malloc(16L * out * 4), *ya = malloc(rows * out * 4), *yb = malloc(rows * out * 4);
    gt_fill_bf16_exact(x, rows * in, -1, 1);
    gt_fill(Cm, rows * out, -2, 2);
    gt_fill_bf16_exact(A0, 8L * in, -0.2, 0.2);
    gt_fill_bf16_exact(B0, 8L * out, -0.2, 0.2);
    gt_fill_bf16_exact(A1, 16L * in, -0.2, 0.2);
    gt_fill_bf16_exact(B1, 16L * out, -0.2, 0.2);
    void *dx = gt_dev_bf16(x, rows * in), *dC = gt_dev_f32(Cm, rows * out), *z = gt_dev_poison(rows * ldz * 2);
    lcu_lora_seg segs[2] = {{0, cut, 8, 2.0f, gt_dev_bf16(A0, 8L * in), gt_dev_bf16(B0, 8L * out), NULL, NULL},
                            {cut, rows, 16, 0.5f, gt_dev_bf16(A1, 16L * in), gt_dev_bf16(B1, 16L * out), NULL, NULL}};
    bool v3 = strncmp(version, "sgmv3", 5) == 0;
    for (int withC = 0; withC < 2; withC++) {
        float *zeros = calloc(rows * out, 4);
        void *ref = gt_dev_f32(withC ? Cm : zeros, rows * out), *y = gt_dev_poison(rows * out * 4);
        if (withC && v3) { /* version 3's expand would add to a copy of C: declined */
            gt_check(lcu_lora_fwd_into(c, segs, 2, rows, in, out, dx, in, dC, out, y, out, z, ldz, 0) == LCU_ENOTSUP,
                     "[%s] lcu_lora_fwd_into with C: LCU_ENOTSUP (the GEMM first, then lcu_lora_fwd)", version);
            gt_free(ref);
            gt_free(y);
            free(zeros);
            continue;
        }
        GT_LCU(lcu_lora_fwd(c, segs, 2, in, out, dx, in, ref, out, z, ldz, 0));
        GT_LCU(lcu_lora_fwd_into(c, segs, 2, rows, in, out, dx, in, withC ? dC : NULL, out, y, out, z, ldz, 0));
        gt_get_f32(ya, ref, rows * out);
        gt_get_f32(yb, y, rows * out);
        double e = gt_rel_err_f(yb, ya, rows * out);
        gt_check(e <= 1e-6, "[%s] lcu_lora_fwd_into %s C (%ld rows, %d -> %d, 2 segments) vs lcu_lora_fwd: rel err %.3g",
                 version, withC ? "with" : "without", rows, in, out, e);
        gt_free(ref);
        gt_free(y);
        free(zeros);
    }
    lcu_lora_seg gap[2] = {segs[0], segs[1]};
    gap[1].row_begin = cut + 1;
    void *y = gt_dev_poison(rows * out * 4);
    gt_check(lcu_lora_fwd_into(c, gap, 2, rows, in, out, dx, in, NULL, out, y, out, z, ldz, 0) == LCU_ENOTSUP &&
                 lcu_lora_fwd_into(c, segs, 2, rows + 1, in, out, dx, in, NULL, out, y, out, z, ldz, 0) == LCU_ENOTSUP,
             "[%s] lcu_lora_fwd_into declines segments with a gap or short of the rows (LCU_ENOTSUP)", version);
    gt_free(y);
    void *bufs[] = {dx, dC, z, (void *)segs[0].A, (void *)segs[0].B, (void *)segs[1].A, (void *)segs[1].B};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(bufs[i]);
    free(x); free(Cm); free(A0); free(B0); free(A1); free(B1); free(ya); free(yb);
}

/* lcu_lora_fwd_multi (a decode layer's q, k, v or gate and up LoRA in one call): three
 * modules of different widths over the same x and segments (two adapters, ranks 8 and 16,
 * a row with no segment), each into its columns of one y, against lcu_lora_fwd per module
 * into a copy: bit for bit on every version (version 3 runs them together, the others one by
 * one). Modules whose z columns overlap, or whose columns leave y's row, are refused. */
static void test_fwd_multi(lcu_ctx *c, int in, int out)
{
    enum { NM = 3, NS = 4 };
    int outs[NM] = {out, out / 2 + 3, out / 2 + 3}, ldy = outs[0] + outs[1] + outs[2];
    long b[NS + 1] = {0, gt_int(1, 4), 0, 0, 0}, ldz = NM * lcu_lora_ldz(16);
    b[2] = b[1] + gt_int(1, 16);
    b[3] = b[2] + 1 + gt_int(1, 16); /* a row between: no segment */
    b[4] = b[3] + gt_int(1, 16);
    long rows = b[4];
    float *x = malloc(rows * in * 4), *C = malloc(rows * ldy * 4), *ya = malloc(rows * ldy * 4),
          *yb = malloc(rows * ldy * 4);
    gt_fill_bf16_exact(x, rows * in, -1, 1);
    gt_fill(C, rows * ldy, -2, 2);
    void *dx = gt_dev_bf16(x, rows * in), *z = gt_dev_poison(rows * ldz * 2), *bufs[NM * 4];
    lcu_lora_seg segs[NM][NS];
    lcu_lora_mod mods[NM];
    int nb = 0;
    for (int m = 0, col = 0; m < NM; col += outs[m++]) {
        for (int ad = 0; ad < 2; ad++) {
            int r = ad ? 16 : 8;
            float *A = malloc((size_t)r * in * 4), *B = malloc((size_t)r * outs[m] * 4);
            gt_fill_bf16_exact(A, (size_t)r * in, -0.2, 0.2);
            gt_fill_bf16_exact(B, (size_t)r * outs[m], -0.2, 0.2);
            void *dA = gt_dev_bf16(A, (size_t)r * in), *dB = gt_dev_bf16(B, (size_t)r * outs[m]);
            bufs[nb++] = dA;
            bufs[nb++] = dB;
            for (int i = ad; i < NS; i += 2) /* adapters alternate over the segments */
                segs[m][i] = (lcu_lora_seg){i == 2 ? b[2] + 1 : b[i], b[i + 1], r, ad ? 0.5f : 2.0f, dA, dB, NULL,
                                            NULL};
            free(A);
            free(B);
        }
        mods[m] = (lcu_lora_mod){segs[m], NS, outs[m], col, m * lcu_lora_ldz(16)};
    }
    void *yr = gt_dev_f32(C, rows * ldy), *ym = gt_dev_f32(C, rows * ldy);
    for (int m = 0; m < NM; m++)
        GT_LCU(lcu_lora_fwd(c, segs[m], NS, in, outs[m], dx, in, (float *)yr + mods[m].ycol, ldy, z, ldz, 0));
    GT_LCU(lcu_lora_fwd_multi(c, mods, NM, in, dx, in, ym, ldy, z, ldz, 0));
    gt_get_f32(ya, yr, rows * ldy);
    gt_get_f32(yb, ym, rows * ldy);
    gt_check(memcmp(ya, yb, rows * ldy * 4) == 0, "[%s] lcu_lora_fwd_multi (3 modules %d, %d, %d wide, %ld rows in %d "
             "segments, in %d) vs lcu_lora_fwd per module: bit for bit", version, outs[0], outs[1], outs[2], rows, NS, in);
    /* in two calls (the shrinks, then the expands: LCU_DECODE_SIDE's split), where version 3
     * takes every module; elsewhere declined, nothing written */
    void *yp = gt_dev_f32(C, rows * ldy), *zp = gt_dev_poison(rows * ldz * 2);
    bool split = lcu_lora_fwd_multi_splits(mods, NM);
    int rz = lcu_lora_fwd_multi_part(c, true, mods, NM, in, dx, in, yp, ldy, zp, ldz, 0);
    int ry = rz ? rz : lcu_lora_fwd_multi_part(c, false, mods, NM, in, dx, in, yp, ldy, zp, ldz, 0);
    float *yc = malloc(rows * ldy * 4);
    gt_get_f32(yc, yp, rows * ldy);
    if (split)
        gt_check(rz == 0 && ry == 0 && memcmp(yb, yc, rows * ldy * 4) == 0,
                 "[%s] lcu_lora_fwd_multi_part: the shrinks, then the expands, bit for bit the one call", version);
    else
        gt_check(rz == LCU_ENOTSUP && memcmp(C, yc, rows * ldy * 4) == 0,
                 "[%s] lcu_lora_fwd_multi_part declines what version 3 does not take (LCU_ENOTSUP), writing nothing",
                 version);
    free(yc);
    gt_free(yp);
    gt_free(zp);
    lcu_lora_mod bad[NM];
    memcpy(bad, mods, sizeof bad);
    bad[1].zcol = 8; /* inside module 0's 16 columns */
    int rc1 = lcu_lora_fwd_multi(c, bad, NM, in, dx, in, ym, ldy, z, ldz, 0);
    memcpy(bad, mods, sizeof bad);
    bad[2].ycol = ldy - outs[2] + 1; /* past the row */
    int rc2 = lcu_lora_fwd_multi(c, bad, NM, in, dx, in, ym, ldy, z, ldz, 0);
    gt_get_f32(yb, ym, rows * ldy);
    int rc3 = lcu_lora_fwd_multi_part(c, true, bad, NM, in, dx, in, ym, ldy, z, ldz, 0);
    gt_check(rc1 == LCU_EINVAL && rc2 == LCU_EINVAL && rc3 == LCU_EINVAL && memcmp(ya, yb, rows * ldy * 4) == 0,
             "[%s] lcu_lora_fwd_multi refuses overlapping z columns and columns past y's row (LCU_EINVAL), writing "
             "nothing", version);
    gt_free(yr);
    gt_free(ym);
    gt_free(dx);
    gt_free(z);
    for (int i = 0; i < nb; i++) gt_free(bufs[i]);
    free(x); free(C); free(ya); free(yb);
}

/* lcu_lora_bwd_into (LCU_LORA_FIRST's backward: dx = dz A (+ dx) written first): against the
 * running version's lcu_lora_bwd adding into zeros or into dx's earlier values, the gradients
 * bit for bit (the same products) and dx within fp32 rounding; a gap declined. */
static void test_bwd_into(lcu_ctx *c, int in, int out)
{
    long rows = gt_int(20, 150), cut = gt_int(1, (int)rows - 1), ldz = lcu_lora_ldz(16);
    const int rk[2] = {8, 16};
    float *x = malloc(rows * in * 4), *dy = malloc(rows * out * 4), *dx0 = malloc(rows * in * 4);
    float *a = malloc(rows * in * 4), *b = malloc(rows * in * 4);
    gt_fill_bf16_exact(x, rows * in, -1, 1);
    gt_fill_bf16_exact(dy, rows * out, -1, 1);
    gt_fill(dx0, rows * in, -2, 2);
    void *dxv = gt_dev_bf16(x, rows * in), *dyv = gt_dev_bf16(dy, rows * out);
    void *z = gt_dev_poison(rows * ldz * 2), *dz = gt_dev_poison(rows * ldz * 2);
    lcu_lora_seg sa[2], sb[2];
    float *hA[2], *hB[2];
    for (int i = 0; i < 2; i++) {
        hA[i] = malloc((size_t)rk[i] * in * 4);
        hB[i] = malloc((size_t)rk[i] * out * 4);
        gt_fill_bf16_exact(hA[i], (size_t)rk[i] * in, -0.2, 0.2);
        gt_fill_bf16_exact(hB[i], (size_t)rk[i] * out, -0.2, 0.2);
        lcu_lora_seg g = {i ? cut : 0, i ? rows : cut, rk[i], i ? 0.5f : 2.0f, gt_dev_bf16(hA[i], (size_t)rk[i] * in),
                          gt_dev_bf16(hB[i], (size_t)rk[i] * out), NULL, NULL};
        sa[i] = sb[i] = g;
    }
    for (int acc = 0; acc < 2; acc++) {
        float *zeros = calloc(rows * in, 4);
        void *ya = gt_dev_f32(acc ? dx0 : zeros, rows * in), *yb = acc ? gt_dev_f32(dx0, rows * in)
                                                                        : gt_dev_poison(rows * in * 4);
        for (int i = 0; i < 2; i++) {
            float *zA = calloc((size_t)rk[i] * in, 4), *zB = calloc((size_t)rk[i] * out, 4);
            sa[i].gA = gt_dev_f32(zA, (size_t)rk[i] * in);
            sa[i].gB = gt_dev_f32(zB, (size_t)rk[i] * out);
            sb[i].gA = gt_dev_f32(zA, (size_t)rk[i] * in);
            sb[i].gB = gt_dev_f32(zB, (size_t)rk[i] * out);
            free(zA);
            free(zB);
        }
        GT_LCU(lcu_lora_bwd(c, sa, 2, in, out, dxv, in, dyv, out, ya, in, z, dz, ldz, 0));
        GT_LCU(lcu_lora_bwd_into(c, sb, 2, rows, in, out, dxv, in, dyv, out, yb, in, acc, z, dz, ldz, 0));
        gt_get_f32(a, ya, rows * in);
        gt_get_f32(b, yb, rows * in);
        double e = gt_rel_err_f(b, a, rows * in);
        bool same = true;
        for (int i = 0; i < 2; i++) {
            size_t na = (size_t)rk[i] * in, nb = (size_t)rk[i] * out;
            float *p = malloc(na * 4), *q = malloc(na * 4), *pb = malloc(nb * 4), *qb = malloc(nb * 4);
            gt_get_f32(p, sa[i].gA, na);
            gt_get_f32(q, sb[i].gA, na);
            gt_get_f32(pb, sa[i].gB, nb);
            gt_get_f32(qb, sb[i].gB, nb);
            same &= !memcmp(p, q, na * 4) && !memcmp(pb, qb, nb * 4);
            free(p); free(q); free(pb); free(qb);
            gt_free(sa[i].gA); gt_free(sa[i].gB); gt_free(sb[i].gA); gt_free(sb[i].gB);
        }
        gt_check(e <= 1e-6 && same, "[%s] lcu_lora_bwd_into (%s) vs lcu_lora_bwd: dx rel err %.3g, gradients %s", version,
                 acc ? "adding to dx" : "writing dx", e, same ? "bitwise equal" : "DIFFERENT");
        gt_free(ya);
        gt_free(yb);
        free(zeros);
    }
    sb[1].row_begin = cut + 1;
    void *y = gt_dev_poison(rows * in * 4);
    gt_check(lcu_lora_bwd_into(c, sb, 2, rows, in, out, dxv, in, dyv, out, y, in, false, z, dz, ldz, 0) == LCU_ENOTSUP,
             "[%s] lcu_lora_bwd_into declines segments with a gap (LCU_ENOTSUP)", version);
    gt_free(y);
    for (int i = 0; i < 2; i++) {
        gt_free((void *)sa[i].A);
        gt_free((void *)sa[i].B);
        free(hA[i]);
        free(hB[i]);
    }
    gt_free(dxv); gt_free(dyv); gt_free(z); gt_free(dz);
    free(x); free(dy); free(dx0); free(a); free(b);
}

int main(void)
{
    gt_init("test_gpu_lora");
    test_ref_fd();
    lcu_ctx *c;
    GT_LCU(lcu_ctx_create(&c, 0));
    int in = gt_int(8, 300), out = gt_int(8, 300);
    /* version 1 (cuBLASLt per segment), version 2 (lcu_sgmv.cu), version 3 (lcu_sgmv3.cu)
     * with and without its small-segment kernels */
    static const struct { const char *label, *lora, *small; } versions[] = {
        {"gemm", "gemm", NULL}, {"sgmv", "sgmv", NULL}, {"sgmv3", "sgmv3", NULL}, {"sgmv3 tiled", "sgmv3", "0"}};
    for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++) {
        version = versions[v].label;
        setenv("LCU_LORA", versions[v].lora, 1);
        if (versions[v].small) setenv("LCU_SGMV3_SMALL", versions[v].small, 1);
        else unsetenv("LCU_SGMV3_SMALL");
        printf("== LCU_LORA=%s%s%s\n", versions[v].lora, versions[v].small ? " LCU_SGMV3_SMALL=" : "",
               versions[v].small ? versions[v].small : "");
        test_lora(c, 256, 192);
        test_lora(c, in, out); /* odd widths: unaligned rows, gemmEx fallback */
        test_fwd_multi(c, 256, 192);
        test_fwd_multi(c, in, out);
        if (!gt_small()) { /* long K everywhere: split-K in versions 2 and 3 */
            long_rows = gt_int(600, 900);
            test_lora(c, gt_int(1030, 1100), gt_int(520, 700));
            long_rows = 0;
            max_rows = 16; /* decode-sized segments */
            test_lora(c, 4104, 1032);
            max_rows = 90;
        }
    }
    unsetenv("LCU_SGMV3_SMALL");
    /* lcu_lora_fwd_into and lcu_lora_bwd_into take version 3's products where it is picked
     * (its expand and dx product writing), else version 1's: the reference is the same
     * version's lcu_lora_fwd / lcu_lora_bwd */
    static const struct { const char *label, *lora, *small; } into[] = {
        {"gemm", "gemm", NULL}, {"sgmv3", "sgmv3", NULL}, {"sgmv3 tiled", "sgmv3", "0"}};
    for (size_t v = 0; v < sizeof into / sizeof into[0]; v++) {
        version = into[v].label;
        setenv("LCU_LORA", into[v].lora, 1);
        if (into[v].small) setenv("LCU_SGMV3_SMALL", into[v].small, 1);
        else unsetenv("LCU_SGMV3_SMALL");
        test_fwd_into(c, 256, 192);
        test_fwd_into(c, in, out);
        test_bwd_into(c, 256, 192);
        test_bwd_into(c, in, out);
    }
    unsetenv("LCU_SGMV3_SMALL");
    { /* version 2 has no writing products: both decline */
        version = "sgmv";
        setenv("LCU_LORA", "sgmv", 1);
        lcu_lora_seg one = {0, 4, 8, 1.0f, (const lcu_bf16 *)1, (const lcu_bf16 *)1, (float *)1, (float *)1};
        void *p = (void *)1;
        gt_check(lcu_lora_fwd_into(c, &one, 1, 4, 16, 16, p, 16, NULL, 16, p, 16, p, 8, 0) == LCU_ENOTSUP &&
                     lcu_lora_bwd_into(c, &one, 1, 4, 16, 16, p, 16, p, 16, p, 16, false, p, p, 8, 0) == LCU_ENOTSUP,
                 "[sgmv] lcu_lora_fwd_into and lcu_lora_bwd_into decline version 2 (LCU_ENOTSUP)");
    }
    unsetenv("LCU_LORA");
    lcu_lora_seg bad = {5, 2, 8, 4.0f, NULL, NULL, NULL, NULL};
    gt_check(lcu_lora_fwd(c, &bad, 1, 16, 16, NULL, 16, NULL, 16, NULL, 8, 0) == LCU_EINVAL, "bad segment refused");
    lcu_ctx_destroy(c);
    return gt_finish();
}
