/* test_gpu_attention.c — lcu_attn_fwd / lcu_attn_bwd (packed variable-length causal GQA)
 * against an fp64 reference on the same bf16 inputs and against the CPU backend's
 * cpu_attention_fwd/bwd twin; the reference backward against central finite differences
 * of the reference forward; KV-cache layouts (queries at the end of longer key runs, cache
 * rows apart from the query rows); determinism (bitwise reruns); poisoned outputs.
 *
 * Both kernel versions (LCU_ATTN=wmma, the default, and LCU_ATTN=mma) run every case.
 *
 * Tolerances (‖out − ref‖/‖ref‖): out (bf16, P rounded to bf16 in the PV product) 1e-2;
 * lse (fp32) 1e-5; dq, dk, dv (P and dS rounded to bf16 for the products) 2e-2; the fp64
 * reference backward vs finite differences 1e-6. The same bars hold for every (sequence,
 * head) block on its own (gt_expect_blocks), so that one wrong row, head or sequence cannot
 * pass inside the whole tensor's norm. Emulating the kernels' rounding in numpy on these
 * shapes (tests/gpu/attn_rounding.py, seeds 1-7) gives at worst, for a block, out 2.0e-3,
 * lse 5e-8, dq 6.3e-3, dk 4.6e-3, dv 2.0e-3 (whole tensors: 2.0e-3, 3.6e-8, 2.4e-3,
 * 2.2e-3, 1.7e-3).
 */
#include "tests/gpu/gt.h"
#include "tests/gpu/twin.h"

#include <math.h>
#include <string.h>

typedef struct {
    int nseq, nq, nkv, d;
    int *q_start;      /* [nseq + 1] */
    long *kv_start;    /* [nseq] rows of k/v */
    int *kv_len;       /* [nseq] */
    long kv_rows;      /* rows of the k/v buffers */
} shape;

/* out, lse in fp64 for every (row, head); keys 0 .. kv_len − q_len + i visible to query i. */
static void ref_fwd(const shape *s, const float *q, const float *k, const float *v, double *out, double *lse)
{
    int nq = s->nq, d = s->d, grp = s->nq / s->nkv;
    long qd = (long)nq * d, kvd = (long)s->nkv * d;
    double scale = 1.0 / sqrt((double)d);
    double *p = malloc(sizeof(double) * 65536);
    for (int sq = 0; sq < s->nseq; sq++) {
        int q0 = s->q_start[sq], ql = s->q_start[sq + 1] - q0, kl = s->kv_len[sq], off = kl - ql;
        long k0 = s->kv_start[sq];
        for (int h = 0; h < nq; h++) {
            int g = h / grp;
            for (int i = 0; i < ql; i++) {
                const float *qi = q + (q0 + i) * qd + h * d;
                int nvis = off + i + 1;
                double mx = -INFINITY;
                for (int j = 0; j < nvis; j++) {
                    const float *kj = k + (k0 + j) * kvd + g * d;
                    double dot = 0;
                    for (int c = 0; c < d; c++) dot += (double)qi[c] * kj[c];
                    p[j] = dot * scale;
                    if (p[j] > mx) mx = p[j];
                }
                double sum = 0;
                for (int j = 0; j < nvis; j++) { p[j] = exp(p[j] - mx); sum += p[j]; }
                double *o = out + (q0 + i) * qd + h * d;
                for (int c = 0; c < d; c++) o[c] = 0;
                for (int j = 0; j < nvis; j++) {
                    const float *vj = v + (k0 + j) * kvd + g * d;
                    for (int c = 0; c < d; c++) o[c] += p[j] / sum * vj[c];
                }
                lse[(q0 + i) * nq + h] = mx + log(sum);
            }
        }
    }
    free(p);
}

/* Self-attention backward in fp64 (kv = q rows). */
static void ref_bwd(const shape *s, const float *q, const float *k, const float *v, const float *dout, double *dq,
                    double *dk, double *dv)
{
    int nq = s->nq, d = s->d, grp = s->nq / s->nkv;
    long qd = (long)nq * d, kvd = (long)s->nkv * d, T = s->q_start[s->nseq];
    double scale = 1.0 / sqrt((double)d);
    memset(dq, 0, T * qd * 8);
    memset(dk, 0, T * kvd * 8);
    memset(dv, 0, T * kvd * 8);
    double *o = malloc(T * qd * 8), *lse = malloc(T * nq * 8), *dp = malloc(sizeof(double) * 65536);
    ref_fwd(s, q, k, v, o, lse);
    for (int sq = 0; sq < s->nseq; sq++) {
        int q0 = s->q_start[sq], n = s->q_start[sq + 1] - q0;
        for (int h = 0; h < nq; h++) {
            int g = h / grp;
            for (int i = 0; i < n; i++) {
                long qi = (q0 + i) * qd + h * d;
                double D = 0;
                for (int c = 0; c < d; c++) D += dout[qi + c] * o[qi + c];
                for (int j = 0; j <= i; j++) {
                    long kj = (q0 + j) * kvd + g * d;
                    double sdot = 0, pdot = 0;
                    for (int c = 0; c < d; c++) {
                        sdot += (double)q[qi + c] * k[kj + c];
                        pdot += (double)dout[qi + c] * v[kj + c];
                    }
                    double pr = exp(sdot * scale - lse[(q0 + i) * nq + h]);
                    double ds = pr * (pdot - D);
                    for (int c = 0; c < d; c++) {
                        dv[kj + c] += pr * dout[qi + c];
                        dq[qi + c] += scale * ds * k[kj + c];
                        dk[kj + c] += scale * ds * q[qi + c];
                    }
                }
            }
        }
    }
    free(o); free(lse); free(dp);
}

static void self_shape(shape *s, int nseq, const int *lens, int nq, int nkv, int d)
{
    s->nseq = nseq;
    s->nq = nq;
    s->nkv = nkv;
    s->d = d;
    s->q_start = malloc((nseq + 1) * sizeof(int));
    s->kv_start = malloc((nseq + 1) * sizeof(long));
    s->kv_len = malloc((nseq + 1) * sizeof(int));
    s->q_start[0] = 0;
    for (int i = 0; i < nseq; i++) {
        s->q_start[i + 1] = s->q_start[i] + lens[i];
        s->kv_start[i] = s->q_start[i];
        s->kv_len[i] = lens[i];
    }
    s->kv_rows = s->q_start[nseq];
}

static void free_shape(shape *s)
{
    free(s->q_start); free(s->kv_start); free(s->kv_len);
}

static double rel64(const float *out, const double *ref, size_t n) { return gt_rel_err(out, ref, n); }

/* On a failed check: where the worst element sits (sequence, position, 64-row tile, head,
 * column) and the error of each sequence, to tell a mask, tile-edge or head-mapping bug
 * from plain rounding. Rows are the packed query rows (for dk, dv in self-attention the
 * key rows are the same rows). */
static void explain(const shape *s, const char *name, const float *got, const double *ref, int heads)
{
    int d = s->d;
    long T = s->q_start[s->nseq], w = (long)gt_worst(got, ref, (size_t)T * heads * d);
    long row = w / ((long)heads * d);
    int h = (int)(w / d % heads), c = (int)(w % d), sq = 0;
    while (sq + 1 < s->nseq && s->q_start[sq + 1] <= row) sq++;
    int pos = (int)(row - s->q_start[sq]);
    printf("     %s worst: row %ld = sequence %d (len %d) position %d (tile %d, row %d in tile), head %d, col %d\n",
           name, row, sq, s->q_start[sq + 1] - s->q_start[sq], pos, pos / 64, pos % 64, h, c);
    for (int i = 0; i < s->nseq; i++) {
        long a = (long)s->q_start[i] * heads * d, n = (long)(s->q_start[i + 1] - s->q_start[i]) * heads * d;
        if (n) printf("     %s sequence %d (len %d): rel err %.3g\n", name, i, s->q_start[i + 1] - s->q_start[i],
                      gt_rel_err(got + a, ref + a, n));
    }
}

/* Blocks of a [T, heads, d] tensor: (sequence of the row, head). */
typedef struct {
    const int *row_seq;
    int heads, d;
} attn_blocks;

static long attn_block(size_t i, const void *arg)
{
    const attn_blocks *a = arg;
    size_t row = i / ((size_t)a->heads * a->d);
    return (long)a->row_seq[row] * a->heads + (long)(i / a->d % a->heads);
}

/* The bar of a whole tensor for each (sequence, head) block alone. */
static void check_blocks(const shape *s, const int *row_seq, const char *what, const float *got, const double *ref,
                         int heads, int d, double tol)
{
    attn_blocks ab = {row_seq, heads, d};
    long T = s->q_start[s->nseq], w;
    char label[240];
    snprintf(label, sizeof label, "%s, per (sequence, head)", what);
    if (!gt_expect_blocks(label, "block", got, ref, (size_t)T * heads * d, (long)s->nseq * heads, attn_block, &ab, tol,
                          &w) && w >= 0) {
        int sq = (int)(w / heads);
        printf("     worst block: sequence %d (%d rows), head %ld\n", sq, s->q_start[sq + 1] - s->q_start[sq], w % heads);
    }
}

/* The KV-cache cases through the decode's own kernel (lcu_attn_decode_fwd) instead of the
 * tile kernels of LCU_ATTN's version. */
static bool decode_kernel;

static int attn_fwd(const lcu_attn_desc *a, const void *q, const void *k, const void *v, void *out, float *lse,
                    void *ws)
{
    if (decode_kernel && a->kv_start) return lcu_attn_decode_fwd(a, q, k, v, out, lse, 0);
    return lcu_attn_fwd(a, q, k, v, out, lse, ws, 0);
}

/* Forward (+ backward when kv is self) on the GPU vs fp64 and vs the CPU twin. */
static void check_case(const shape *s, bool self, const char *label)
{
    int nq = s->nq, nkv = s->nkv, d = s->d;
    long T = s->q_start[s->nseq], qd = (long)nq * d, kvd = (long)nkv * d, KR = s->kv_rows;
    float *q = malloc(T * qd * 4), *k = malloc(KR * kvd * 4), *v = malloc(KR * kvd * 4);
    gt_fill_bf16_exact(q, T * qd, -2, 2);
    gt_fill_bf16_exact(k, KR * kvd, -2, 2);
    gt_fill_bf16_exact(v, KR * kvd, -1, 1);
    double *oref = malloc(T * qd * 8), *lref = malloc(T * nq * 8);
    ref_fwd(s, q, k, v, oref, lref);
    int *rs = malloc((T > 0 ? T : 1) * sizeof *rs); /* the sequence of each query row */
    for (int i = 0; i < s->nseq; i++)
        for (int r = s->q_start[i]; r < s->q_start[i + 1]; r++) rs[r] = i;

    int32_t *qs = malloc((s->nseq + 1) * 4);
    int64_t *ks = calloc(s->nseq + 1, 8); /* all nseq + 1 entries are copied */
    for (int i = 0; i <= s->nseq; i++) qs[i] = s->q_start[i];
    for (int i = 0; i < s->nseq; i++) ks[i] = s->kv_start[i];
    void *dqs = gt_dev_copy(qs, (s->nseq + 1) * 4), *dks = gt_dev_copy(ks, s->nseq * 8 + 8);
    void *dkl = gt_dev_copy(s->kv_len, s->nseq * 4);
    lcu_attn_desc a = {s->nseq, dqs, self ? NULL : dks, self ? NULL : dkl, T, nq, nkv, d, (float)(1.0 / sqrt((double)d)), false};
    size_t wsb = lcu_attn_workspace_bytes(&a);
    void *ws = gt_dev_poison(wsb);
    void *dq_ = gt_dev_bf16(q, T * qd), *dk_ = gt_dev_bf16(k, KR * kvd), *dv_ = gt_dev_bf16(v, KR * kvd);
    void *dout = gt_dev_poison(T * qd * 2), *dlse = gt_dev_poison(T * nq * 4);
    GT_LCU(attn_fwd(&a, dq_, dk_, dv_, dout, dlse, ws));
    float *o = malloc(T * qd * 4), *l = malloc(T * nq * 4), *o2 = malloc(T * qd * 4), *l2 = malloc(T * nq * 4);
    gt_get_bf16(o, dout, T * qd);
    gt_get_f32(l, dlse, T * nq);
    char what[200];
    snprintf(what, sizeof what, "%s fwd out nseq=%d T=%ld nq=%d nkv=%d d=%d", label, s->nseq, T, nq, nkv, d);
    if (!gt_expect_close(what, o, oref, T * qd, 1e-2)) explain(s, "out", o, oref, nq);
    check_blocks(s, rs, what, o, oref, nq, d, 1e-2);
    snprintf(what, sizeof what, "%s fwd lse nseq=%d T=%ld nq=%d nkv=%d d=%d", label, s->nseq, T, nq, nkv, d);
    gt_expect_close(what, l, lref, T * nq, 1e-5);
    check_blocks(s, rs, what, l, lref, nq, 1, 1e-5);
    GT_CUDA(cudaMemset(dout, 0xff, T * qd * 2));
    GT_CUDA(cudaMemset(dlse, 0xff, T * nq * 4));
    GT_LCU(attn_fwd(&a, dq_, dk_, dv_, dout, dlse, ws));
    gt_get_bf16(o2, dout, T * qd);
    gt_get_f32(l2, dlse, T * nq);
    snprintf(what, sizeof what, "%s fwd rerun out", label);
    gt_expect_bits(what, o, o2, T * qd * 4);
    snprintf(what, sizeof what, "%s fwd rerun lse", label);
    gt_expect_bits(what, l, l2, T * nq * 4);

    if (self) {
        /* the CPU twin on the same (bf16-exact) inputs */
        int *blk = malloc((s->nseq + 1) * sizeof(int));
        cpu_attention_blocks(s->nseq, s->q_start, blk);
        int maxlen = 1;
        for (int i = 0; i < s->nseq; i++) if (s->kv_len[i] > maxlen) maxlen = s->kv_len[i];
        cpu_pool *pool = cpu_pool_create(2);
        long per = cpu_attention_scratch(maxlen);
        float *scr = malloc(2 * per * 4), *co = malloc(T * qd * 4), *cl = malloc(T * nq * 4);
        cpu_attn_shape cs = {s->nseq, s->q_start, blk, nq, nkv, d, (float)(1.0 / sqrt((double)d))};
        cpu_attention_fwd(pool, &cs, q, k, v, co, cl, scr, per);
        snprintf(what, sizeof what, "%s fwd out vs cpu twin", label);
        gt_check(gt_rel_err_f(o, co, T * qd) <= 1e-2, "%s: rel err %.3g", what, gt_rel_err_f(o, co, T * qd));

        /* backward */
        float *g = malloc(T * qd * 4);
        gt_fill_bf16_exact(g, T * qd, -1, 1);
        double *rq = malloc(T * qd * 8), *rk = malloc(T * kvd * 8), *rv = malloc(T * kvd * 8);
        ref_bwd(s, q, k, v, g, rq, rk, rv);
        void *dg = gt_dev_bf16(g, T * qd);
        float *gq = gt_dev_poison(T * qd * 4), *gk = gt_dev_poison(T * kvd * 4), *gv = gt_dev_poison(T * kvd * 4);
        GT_LCU(lcu_attn_bwd(&a, dq_, dk_, dv_, dout, dlse, dg, gq, gk, gv, ws, 0));
        float *hq = malloc(T * qd * 4), *hk = malloc(T * kvd * 4), *hv = malloc(T * kvd * 4);
        gt_get_f32(hq, gq, T * qd);
        gt_get_f32(hk, gk, T * kvd);
        gt_get_f32(hv, gv, T * kvd);
        snprintf(what, sizeof what, "%s bwd dq nseq=%d T=%ld nq=%d nkv=%d d=%d", label, s->nseq, T, nq, nkv, d);
        if (!gt_expect_close(what, hq, rq, T * qd, 2e-2)) explain(s, "dq", hq, rq, nq);
        check_blocks(s, rs, what, hq, rq, nq, d, 2e-2);
        snprintf(what, sizeof what, "%s bwd dk", label);
        if (!gt_expect_close(what, hk, rk, T * kvd, 2e-2)) explain(s, "dk", hk, rk, nkv);
        check_blocks(s, rs, what, hk, rk, nkv, d, 2e-2);
        snprintf(what, sizeof what, "%s bwd dv", label);
        if (!gt_expect_close(what, hv, rv, T * kvd, 2e-2)) explain(s, "dv", hv, rv, nkv);
        check_blocks(s, rs, what, hv, rv, nkv, d, 2e-2);

        float *cq = malloc(T * qd * 4), *ck = malloc(T * kvd * 4), *cv = malloc(T * kvd * 4);
        cpu_attention_bwd(pool, &cs, q, k, v, co, cl, g, cq, ck, cv, scr, per);
        double e = fmax(gt_rel_err_f(hq, cq, T * qd), fmax(gt_rel_err_f(hk, ck, T * kvd), gt_rel_err_f(hv, cv, T * kvd)));
        gt_check(e <= 2e-2, "%s bwd vs cpu twin: max rel err %.3g", label, e);
        printf("  %s: cpu twin vs fp64: fwd %.2g, dq %.2g dk %.2g dv %.2g\n", label, rel64(co, oref, T * qd),
               rel64(cq, rq, T * qd), rel64(ck, rk, T * kvd), rel64(cv, rv, T * kvd));

        /* bitwise rerun of the backward */
        float *hq2 = malloc(T * qd * 4), *hk2 = malloc(T * kvd * 4), *hv2 = malloc(T * kvd * 4);
        GT_CUDA(cudaMemset(gq, 0xff, T * qd * 4));
        GT_CUDA(cudaMemset(gk, 0xff, T * kvd * 4));
        GT_CUDA(cudaMemset(gv, 0xff, T * kvd * 4));
        GT_LCU(lcu_attn_bwd(&a, dq_, dk_, dv_, dout, dlse, dg, gq, gk, gv, ws, 0));
        gt_get_f32(hq2, gq, T * qd);
        gt_get_f32(hk2, gk, T * kvd);
        gt_get_f32(hv2, gv, T * kvd);
        snprintf(what, sizeof what, "%s bwd rerun dq", label);
        gt_expect_bits(what, hq, hq2, T * qd * 4);
        snprintf(what, sizeof what, "%s bwd rerun dk", label);
        gt_expect_bits(what, hk, hk2, T * kvd * 4);
        snprintf(what, sizeof what, "%s bwd rerun dv", label);
        gt_expect_bits(what, hv, hv2, T * kvd * 4);

        gt_free(dg); gt_free(gq); gt_free(gk); gt_free(gv);
        free(g); free(rq); free(rk); free(rv); free(hq); free(hk); free(hv); free(cq); free(ck); free(cv);
        free(hq2); free(hk2); free(hv2); free(blk); free(scr); free(co); free(cl);
        cpu_pool_destroy(pool);
    }
    gt_free(dqs); gt_free(dks); gt_free(dkl); gt_free(ws); gt_free(dq_); gt_free(dk_); gt_free(dv_);
    gt_free(dout); gt_free(dlse);
    free(q); free(k); free(v); free(oref); free(lref); free(qs); free(ks); free(o); free(l); free(o2); free(l2);
    free(rs);
}

/* The reference backward against central differences of the reference forward, on a tiny
 * packed batch: L = Σ c ⊙ out. */
static void check_ref_fd(void)
{
    int lens[2] = {3, 5};
    shape s;
    self_shape(&s, 2, lens, 4, 2, 4);
    long T = 8, qd = 16, kvd = 8;
    float *q = malloc(T * qd * 4), *k = malloc(T * kvd * 4), *v = malloc(T * kvd * 4), *c = malloc(T * qd * 4);
    gt_fill(q, T * qd, -1, 1);
    gt_fill(k, T * kvd, -1, 1);
    gt_fill(v, T * kvd, -1, 1);
    gt_fill(c, T * qd, -1, 1);
    double *rq = malloc(T * qd * 8), *rk = malloc(T * kvd * 8), *rv = malloc(T * kvd * 8);
    double *o = malloc(T * qd * 8), *l = malloc(T * 4 * 8);
    ref_bwd(&s, q, k, v, c, rq, rk, rv);
    float *bufs[3] = {q, k, v};
    double *grads[3] = {rq, rk, rv};
    long sizes[3] = {T * qd, T * kvd, T * kvd};
    double worst = 0;
    for (int b = 0; b < 3; b++)
        for (long i = 0; i < sizes[b]; i++) {
            float x0 = bufs[b][i];
            double L[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                bufs[b][i] = x0 + (sgn ? -1e-4f : 1e-4f);
                ref_fwd(&s, q, k, v, o, l);
                L[sgn] = 0;
                for (long t = 0; t < T * qd; t++) L[sgn] += c[t] * o[t];
            }
            double h = ((double)(x0 + 1e-4f) - (double)(x0 - 1e-4f));
            bufs[b][i] = x0;
            double fd = (L[0] - L[1]) / h;
            double e = fabs(fd - grads[b][i]) / fmax(1.0, fabs(grads[b][i]));
            if (e > worst) worst = e;
        }
    gt_check(worst < 1e-6, "fp64 reference backward vs finite differences: max err %.3g", worst);
    free(q); free(k); free(v); free(c); free(rq); free(rk); free(rv); free(o); free(l);
    free_shape(&s);
}

static void run_kv_cases(const char *variant);

/* A KV-cache batch of nseq sequences, each sequence's keys elsewhere in the cache with gaps
 * between: decode, one query row each against up to 700 keys (200 with GT_SMALL); else
 * query rows at the end of up to 300 keys (every other sequence one row). */
static void kv_shape(shape *s, int nseq, int nq, int nkv, int d, bool decode)
{
    s->nseq = nseq;
    s->nq = nq;
    s->nkv = nkv;
    s->d = d;
    s->q_start = malloc((nseq + 1) * sizeof(int));
    s->kv_start = malloc(nseq * sizeof(long));
    s->kv_len = malloc(nseq * sizeof(int));
    s->q_start[0] = 0;
    long row = 0;
    for (int i = 0; i < nseq; i++) {
        int kl = decode ? gt_int(1, gt_small() ? 200 : 700) : gt_int(1, 300);
        int ql = decode || i % 2 ? 1 : gt_int(1, kl);
        s->kv_len[i] = kl;
        row += gt_int(0, decode ? 20 : 70); /* a gap */
        s->kv_start[i] = row;
        row += kl;
        s->q_start[i + 1] = s->q_start[i] + ql;
    }
    s->kv_rows = row + 3;
}

/* Every case for one kernel version (LCU_ATTN: "wmma" = version 1, "mma" = version 2). */
static void run_cases(const char *variant)
{
    setenv("LCU_ATTN", variant, 1);
    char label[64];
    /* packed training batches: lengths around the 64-row tiles, an empty sequence, GQA */
    const int dims[4] = {16, 32, 64, 128};
    const int heads[4][2] = {{4, 2}, {4, 4}, {8, 2}, {16, 8}};
    for (int di = 0; di < 4; di++) {
        int lens[7] = {1, 64, 65, gt_int(2, 63), 0, gt_int(66, 200), gt_int(1, 130)};
        shape s;
        self_shape(&s, 7, lens, heads[di][0], heads[di][1], dims[di]);
        snprintf(label, sizeof label, "%s packed", variant);
        check_case(&s, true, label);
        free_shape(&s);
    }
    /* one long sequence, 4 query heads per kv head, many tiles */
    if (!gt_small()) {
        int lens[1] = {gt_int(900, 1100)};
        shape s;
        self_shape(&s, 1, lens, 8, 2, 64);
        snprintf(label, sizeof label, "%s long", variant);
        check_case(&s, true, label);
        free_shape(&s);
    }
    /* Qwen3-like heads on a few random lengths */
    if (!gt_small()) {
        int lens[3] = {gt_int(1, 300), gt_int(1, 300), gt_int(1, 300)};
        shape s;
        self_shape(&s, 3, lens, 32, 8, 128);
        snprintf(label, sizeof label, "%s qwen3-heads", variant);
        check_case(&s, true, label);
        free_shape(&s);
    }
    run_kv_cases(variant);
}

/* KV cache: each sequence's keys live elsewhere (with gaps), its queries are the last q_len
 * positions of kv_len (prefill continuation and single-token decode); then the decode
 * step's own shapes (one row a sequence, Qwen3's and Llama's head groups, 12 heads a group:
 * two chunks of the decode kernel's tasks). */
static void run_kv_cases(const char *variant)
{
    char label[64];
    const int dims[4] = {16, 32, 64, 128};
    for (int di = 0; di < 4; di++) {
        shape s;
        kv_shape(&s, 5, 8, 4, dims[di], false);
        snprintf(label, sizeof label, "%s kv-cache", variant);
        check_case(&s, false, label);
        free_shape(&s);
    }
    const int groups[3][3] = {{32, 8, 128}, {16, 8, 128}, {24, 2, 64}};
    for (int gi = 0; gi < 3; gi++) {
        shape s;
        kv_shape(&s, gi == 0 ? 33 : 4, groups[gi][0], groups[gi][1], groups[gi][2], true);
        snprintf(label, sizeof label, "%s decode", variant);
        check_case(&s, false, label);
        free_shape(&s);
    }
}

int main(void)
{
    gt_init("test_gpu_attention");
    check_ref_fd();
    run_cases("wmma");
    run_cases("mma");
    /* the KV-cache decode's own kernel (lcu_attn_decode_fwd, lcu_attention_decode.cu) */
    decode_kernel = true;
    run_kv_cases("decode-kernel");
    decode_kernel = false;
    /* refused arguments */
    {
        lcu_attn_desc a = {1, NULL, NULL, NULL, 10, 4, 3, 64, 0.125f, false};
        gt_check(lcu_attn_fwd(&a, NULL, NULL, NULL, NULL, NULL, NULL, 0) == LCU_EINVAL, "nq not a multiple of nkv refused");
        a.nkv = 2;
        a.d = 96;
        gt_check(lcu_attn_fwd(&a, NULL, NULL, NULL, NULL, NULL, NULL, 0) == LCU_EINVAL, "head_dim 96 refused");
    }
    return gt_finish();
}
