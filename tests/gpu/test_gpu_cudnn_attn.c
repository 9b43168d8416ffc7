/* test_gpu_cudnn_attn.c — the cuDNN attention path (lcu_cudnn_attn_fwd / _bwd) against the
 * own version 1 kernels (lcu_attn_fwd / _bwd, the reference implementation) and against an
 * fp64 host reference (tests/gpu/attn_ref.c, itself checked against finite differences),
 * on random packed batches: sequence lengths around cuDNN's and the own tiles (1, 63, 64,
 * 65, 127, 128, 129, random), an empty sequence inside the batch, a sequence count that
 * is not the bucket's (the bucket's padding sequences), GQA groups of 1, 2, 4, and head
 * dims 64 and 128 (16 and 32 too: cuDNN may refuse those, and the backend then runs the
 * own kernels, so a refusal there is reported, not failed).
 *
 * Per case: out, lse, dq, dk, dv against fp64 (relative L2 and the worst row's largest
 * error over the tensor's largest reference value) and against version 1 element for
 * element; the backward once more from version 1's out and lse (the backend may run the
 * forward and the backward on different paths); determinism: the forward and the backward
 * twice, bit for bit; poisoned outputs (an unwritten element is a NaN and fails).
 *
 * Tolerances: out relative L2 1e-2, worst row 1.5e-2 of max |out|; lse 1e-5 and 2e-4
 * absolute; dq, dk, dv relative L2 2e-2 (cuDNN's gradients are bf16, widened), worst row
 * 3e-2 of the tensor's max |ref|; cuDNN vs version 1 the same bars.
 *
 * Without a GPU: exit 77. Without a loadable cuDNN: exit 77 too with the reason, unless
 * LOOM_CUDNN_REQUIRED is set (the GPU machine's runs: there cuDNN must load).
 */
#include "backend/cuda/lcu_cudnn.h"
#include "tests/gpu/attn_ref.h"
#include "tests/gpu/gt.h"

#include <math.h>
#include <string.h>

static lcu_cudnn *dnn;

/* The largest |got − ref| of one (row, head) over the tensor's largest |ref|: the worst
 * row, its sequence and position, printed; returns that relative value. */
static double worst_row(const char *what, const float *got, const double *ref, const attn_ref_shape *s, int heads,
                        int width, bool print)
{
    long T = s->q_start[s->nseq];
    double scale = 1e-30, worst = 0;
    long wr = 0;
    int wh = 0;
    for (long i = 0; i < T * heads * width; i++) scale = fmax(scale, fabs(ref[i]));
    for (long r = 0; r < T; r++)
        for (int h = 0; h < heads; h++) {
            double m = 0;
            for (int c = 0; c < width; c++) {
                long i = (r * heads + h) * width + c;
                double e = fabs((double)got[i] - ref[i]);
                m = isnan(e) ? INFINITY : fmax(m, e);
            }
            if (m > worst) worst = m, wr = r, wh = h;
        }
    if (print) {
        int sq = 0;
        while (sq + 1 < s->nseq && s->q_start[sq + 1] <= wr) sq++;
        printf("     %s worst row: %ld (sequence %d of %d rows, position %ld), head %d: %.3g of max |ref| %.3g\n", what,
               wr, sq, s->q_start[sq + 1] - s->q_start[sq], wr - s->q_start[sq], wh, worst / scale, scale);
    }
    return worst / scale;
}

/* fp32 copy of a float array as double (for comparing cuDNN to version 1). */
static double *as_double(const float *x, size_t n)
{
    double *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

/* got against ref (fp64) and against v1 (the own kernels' result): relative L2 and worst row. */
static void expect(const char *label, const char *what, const float *got, const double *ref, const float *v1,
                   const attn_ref_shape *s, int heads, int width, double l2_tol, double row_tol)
{
    long n = (long)s->q_start[s->nseq] * heads * width;
    char m[256];
    snprintf(m, sizeof m, "%s %s vs fp64", label, what);
    gt_expect_close(m, got, ref, n, l2_tol);
    double w = worst_row(what, got, ref, s, heads, width, false);
    if (!gt_check(w <= row_tol, "%s %s worst row vs fp64: %.3g (bar %.3g)", label, what, w, row_tol))
        worst_row(what, got, ref, s, heads, width, true);
    if (v1) {
        double *v1d = as_double(v1, n);
        double wv = worst_row(what, got, v1d, s, heads, width, false), w1 = worst_row(what, v1, ref, s, heads, width, false);
        if (!gt_check(wv <= row_tol, "%s %s worst row vs version 1: %.3g (bar %.3g; version 1 vs fp64 %.3g)", label,
                      what, wv, row_tol, w1))
            worst_row(what, got, v1d, s, heads, width, true);
        printf("  %s %s: worst row vs fp64 %.2g (version 1: %.2g), vs version 1 %.2g\n", label, what, w, w1, wv);
        free(v1d);
    }
}

/* lse: relative L2 and the largest absolute error (the log-sum-exp of logits of order 1). */
static void expect_lse(const char *label, const float *got, const double *ref, long n)
{
    char m[200];
    snprintf(m, sizeof m, "%s lse vs fp64", label);
    gt_expect_close(m, got, ref, n, 1e-5);
    double e = gt_max_abs_err(got, ref, n);
    gt_check(e <= 2e-4, "%s lse largest error %.3g (bar 2e-4)", label, e);
}

/* One packed batch: inputs, the fp64 reference, version 1's results, device buffers. */
typedef struct {
    attn_ref_shape s;
    int maxlen;
    long T, qd, kvd;
    lcu_attn_desc a;
    double *oref, *lref, *rq, *rk, *rv;            /* fp64 */
    float *vo, *vl, *vq, *vk, *vv;                 /* version 1 */
    void *q, *k, *v, *g, *ws, *o1, *l1, *o2, *l2;  /* device */
    float *gq, *gk, *gv;
    char lab[160];
} tcase;

/* cuDNN's forward and backward of the case against fp64 and version 1. false: cuDNN
 * refused the shape (LCU_ENOTSUP). */
static bool check_cudnn(tcase *t, bool may_refuse)
{
    const attn_ref_shape *s = &t->s;
    long T = t->T, qd = t->qd, kvd = t->kvd;
    int nq = s->nq, nkv = s->nkv, d = s->d;
    const char *lab = t->lab;
    int rc = lcu_cudnn_attn_fwd(dnn, &t->a, t->maxlen, t->q, t->k, t->v, t->o2, t->l2, 0);
    if (rc == LCU_ENOTSUP) {
        gt_check(may_refuse, "%s: cuDNN refused the shape (the backend would run the own kernels)", lab);
        if (may_refuse) printf("  %s: cuDNN refused (the own kernels run it): reported, not failed\n", lab);
        return false;
    }
    GT_CUDA(cudaDeviceSynchronize());
    if (!gt_check(rc == 0, "%s fwd: %s", lab, lcu_cudnn_strerror(rc))) return true;
    float *co = malloc(T * qd * 4), *cl = malloc(T * nq * 4), *co2 = malloc(T * qd * 4), *cl2 = malloc(T * nq * 4);
    gt_get_bf16(co, t->o2, T * qd);
    gt_get_f32(cl, t->l2, T * nq);
    expect(lab, "out", co, t->oref, t->vo, s, nq, d, 1e-2, 1.5e-2);
    expect_lse(lab, cl, t->lref, T * nq);
    double *vld = as_double(t->vl, T * nq);
    double e = gt_max_abs_err(cl, vld, T * nq);
    gt_check(e <= 2e-4, "%s lse vs version 1: largest difference %.3g (bar 2e-4)", lab, e);
    free(vld);
    /* the forward again, bit for bit */
    GT_CUDA(cudaMemset(t->o2, 0xff, T * qd * 2));
    GT_CUDA(cudaMemset(t->l2, 0xff, T * nq * 4));
    rc = lcu_cudnn_attn_fwd(dnn, &t->a, t->maxlen, t->q, t->k, t->v, t->o2, t->l2, 0);
    GT_CUDA(cudaDeviceSynchronize());
    gt_check(rc == 0, "%s fwd rerun", lab);
    gt_get_bf16(co2, t->o2, T * qd);
    gt_get_f32(cl2, t->l2, T * nq);
    gt_expect_bits("fwd rerun out (bits)", co, co2, T * qd * 4);
    gt_expect_bits("fwd rerun lse (bits)", cl, cl2, T * nq * 4);
    free(co); free(cl); free(co2); free(cl2);

    /* backward from cuDNN's own out and lse, twice: bit for bit (deterministic engines) */
    float *c1[3], *c2[3];
    long n[3] = {T * qd, T * kvd, T * kvd};
    for (int r = 0; r < 2; r++) {
        GT_CUDA(cudaMemset(t->gq, 0xff, T * qd * 4));
        GT_CUDA(cudaMemset(t->gk, 0xff, T * kvd * 4));
        GT_CUDA(cudaMemset(t->gv, 0xff, T * kvd * 4));
        rc = lcu_cudnn_attn_bwd(dnn, &t->a, t->maxlen, t->q, t->k, t->v, t->o2, t->l2, t->g, t->gq, t->gk, t->gv, 0);
        if (rc == LCU_ENOTSUP) {
            gt_check(may_refuse, "%s: cuDNN refused the backward (it took the forward)", lab);
            if (r) for (int i = 0; i < 3; i++) free(c1[i]);
            return false;
        }
        GT_CUDA(cudaDeviceSynchronize());
        gt_check(rc == 0, "%s bwd%s: %s", lab, r ? " rerun" : "", lcu_cudnn_strerror(rc));
        float **c = r ? c2 : c1;
        float *dev[3] = {t->gq, t->gk, t->gv};
        for (int i = 0; i < 3; i++) {
            c[i] = malloc(n[i] * 4);
            gt_get_f32(c[i], dev[i], n[i]);
        }
    }
    expect(lab, "dq", c1[0], t->rq, t->vq, s, nq, d, 2e-2, 3e-2);
    expect(lab, "dk", c1[1], t->rk, t->vk, s, nkv, d, 2e-2, 3e-2);
    expect(lab, "dv", c1[2], t->rv, t->vv, s, nkv, d, 2e-2, 3e-2);
    gt_expect_bits("bwd rerun dq (bits)", c1[0], c2[0], n[0] * 4);
    gt_expect_bits("bwd rerun dk (bits)", c1[1], c2[1], n[1] * 4);
    gt_expect_bits("bwd rerun dv (bits)", c1[2], c2[2], n[2] * 4);

    /* backward from version 1's out and lse (the backend may run the two passes on
     * different paths) */
    rc = lcu_cudnn_attn_bwd(dnn, &t->a, t->maxlen, t->q, t->k, t->v, t->o1, t->l1, t->g, t->gq, t->gk, t->gv, 0);
    GT_CUDA(cudaDeviceSynchronize());
    gt_check(rc == 0, "%s bwd from version 1's forward", lab);
    float *dev[3] = {t->gq, t->gk, t->gv};
    for (int i = 0; i < 3; i++) gt_get_f32(c2[i], dev[i], n[i]);
    char lab2[200];
    snprintf(lab2, sizeof lab2, "%s from v1's fwd", lab);
    expect(lab2, "dq", c2[0], t->rq, NULL, s, nq, d, 2e-2, 3e-2);
    expect(lab2, "dk", c2[1], t->rk, NULL, s, nkv, d, 2e-2, 3e-2);
    expect(lab2, "dv", c2[2], t->rv, NULL, s, nkv, d, 2e-2, 3e-2);
    for (int i = 0; i < 3; i++) free(c1[i]), free(c2[i]);
    return true;
}

/* One packed batch of nseq sequences (lens; 0 allowed): version 1 and cuDNN on the same
 * bf16 inputs. Returns false when cuDNN refused the shape. */
static bool check_case(const char *label, int nseq, const int *lens, int nq, int nkv, int d, bool may_refuse)
{
    tcase t;
    memset(&t, 0, sizeof t);
    int *qs = malloc((nseq + 1) * sizeof(int));
    int32_t *qs32 = malloc((nseq + 1) * 4);
    qs[0] = 0;
    for (int i = 0; i < nseq; i++) {
        qs[i + 1] = qs[i] + lens[i];
        if (lens[i] > t.maxlen) t.maxlen = lens[i];
    }
    for (int i = 0; i <= nseq; i++) qs32[i] = qs[i];
    t.s = (attn_ref_shape){nseq, qs, nq, nkv, d};
    long T = t.T = qs[nseq], qd = t.qd = (long)nq * d, kvd = t.kvd = (long)nkv * d;
    snprintf(t.lab, sizeof t.lab, "%s [%d seqs, %ld rows, longest %d, heads %d/%d x %d]", label, nseq, T, t.maxlen, nq,
             nkv, d);
    float *q = malloc(T * qd * 4), *k = malloc(T * kvd * 4), *v = malloc(T * kvd * 4), *g = malloc(T * qd * 4);
    gt_fill_bf16_exact(q, T * qd, -2, 2);
    gt_fill_bf16_exact(k, T * kvd, -2, 2);
    gt_fill_bf16_exact(v, T * kvd, -1, 1);
    gt_fill_bf16_exact(g, T * qd, -1, 1);
    t.oref = malloc(T * qd * 8), t.lref = malloc(T * nq * 8);
    t.rq = malloc(T * qd * 8), t.rk = malloc(T * kvd * 8), t.rv = malloc(T * kvd * 8);
    attn_ref_fwd(&t.s, q, k, v, t.oref, t.lref);
    attn_ref_bwd(&t.s, q, k, v, g, t.rq, t.rk, t.rv);

    t.a = (lcu_attn_desc){nseq, gt_dev_copy(qs32, (nseq + 1) * 4), NULL, NULL, T, nq, nkv, d,
                          (float)(1.0 / sqrt((double)d)), false};
    t.q = gt_dev_bf16(q, T * qd), t.k = gt_dev_bf16(k, T * kvd), t.v = gt_dev_bf16(v, T * kvd);
    t.g = gt_dev_bf16(g, T * qd), t.ws = gt_dev_poison(lcu_attn_workspace_bytes(&t.a));
    t.o1 = gt_dev_poison(T * qd * 2), t.l1 = gt_dev_poison(T * nq * 4);
    t.o2 = gt_dev_poison(T * qd * 2), t.l2 = gt_dev_poison(T * nq * 4);
    t.gq = gt_dev_poison(T * qd * 4), t.gk = gt_dev_poison(T * kvd * 4), t.gv = gt_dev_poison(T * kvd * 4);

    /* version 1, the reference implementation on the device */
    unsetenv("LCU_ATTN");
    GT_LCU(lcu_attn_fwd(&t.a, t.q, t.k, t.v, t.o1, t.l1, t.ws, 0));
    GT_LCU(lcu_attn_bwd(&t.a, t.q, t.k, t.v, t.o1, t.l1, t.g, t.gq, t.gk, t.gv, t.ws, 0));
    t.vo = malloc(T * qd * 4), t.vl = malloc(T * nq * 4), t.vq = malloc(T * qd * 4);
    t.vk = malloc(T * kvd * 4), t.vv = malloc(T * kvd * 4);
    gt_get_bf16(t.vo, t.o1, T * qd);
    gt_get_f32(t.vl, t.l1, T * nq);
    gt_get_f32(t.vq, t.gq, T * qd);
    gt_get_f32(t.vk, t.gk, T * kvd);
    gt_get_f32(t.vv, t.gv, T * kvd);

    bool ran = check_cudnn(&t, may_refuse);

    void *dev[] = {(void *)t.a.q_start, t.q, t.k, t.v, t.g, t.ws, t.o1, t.l1, t.o2, t.l2, t.gq, t.gk, t.gv};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gt_free(dev[i]);
    void *host[] = {q, k, v, g, qs, qs32, t.oref, t.lref, t.rq, t.rk, t.rv, t.vo, t.vl, t.vq, t.vk, t.vv};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    return ran;
}

int main(void)
{
    gt_init("test_gpu_cudnn_attn");
    double fd = attn_ref_fd_check();
    gt_check(fd < 1e-5, "fp64 reference backward vs central differences: largest error %.3g", fd);
    char why[1024];
    if (lcu_cudnn_create(&dnn, why, sizeof why) != 0) {
        const char *req = getenv("LOOM_CUDNN_REQUIRED");
        if (req && *req && strcmp(req, "0")) {
            gt_check(false, "cuDNN must load here (LOOM_CUDNN_REQUIRED): %s", why);
            return gt_finish();
        }
        printf("test_gpu_cudnn_attn: no cuDNN: %s: skipped\n", why);
        return 77;
    }
    printf("using %s\n", lcu_cudnn_describe(dnn));

    /* packed batches: tile edges, an empty sequence, 7 sequences (bucket 8) */
    const int heads[4][2] = {{8, 2}, {4, 4}, {16, 8}, {16, 4}};
    const int dims[4] = {64, 128, 128, 64};
    int first[7]; /* the first packed case's lengths: the plan cache's check replays them */
    for (int i = 0; i < 4; i++) {
        int lens[7] = {1, 64, 65, gt_int(2, 63), 0, gt_int(66, 200), gt_int(127, 129)};
        if (i == 0) memcpy(first, lens, sizeof first);
        check_case("packed", 7, lens, heads[i][0], heads[i][1], dims[i], false);
    }
    /* the small head dims the own kernels take: cuDNN may refuse them */
    for (int d = 16; d <= 32; d *= 2) {
        int lens[5] = {gt_int(1, 100), 63, 0, 128, gt_int(1, 300)};
        check_case("small-d", 5, lens, 4, 2, d, true);
    }
    if (!gt_small()) {
        int one[1] = {gt_int(900, 1100)};
        check_case("long", 1, one, 8, 2, 128, false);
        int qwen[9];
        for (int i = 0; i < 9; i++) qwen[i] = gt_int(1, 700);
        check_case("qwen3-heads", 9, qwen, 32, 8, 128, false);
        int many[33]; /* bucket 64, lengths of training batches */
        for (int i = 0; i < 33; i++) many[i] = gt_int(1, 160);
        check_case("many", 33, many, 16, 8, 64, false);
    }

    /* the plan cache: the same bucket again builds nothing (the first packed case's
     * sequence count, longest sequence and heads, other lengths below the longest) */
    int refused, before = lcu_cudnn_plans(dnn, &refused), lens[7], longest = 0;
    for (int i = 0; i < 7; i++) longest = first[i] > longest ? first[i] : longest;
    for (int i = 0; i < 7; i++) lens[i] = first[i] == longest ? longest : gt_int(0, longest);
    check_case("cache", 7, lens, 8, 2, 64, false);
    gt_check(lcu_cudnn_plans(dnn, NULL) == before, "a bucket seen before reuses its plans (%d plans, %d refused)",
             before, refused);

    /* what this path leaves to the own kernels */
    int64_t ks = 0;
    int32_t kl = 1;
    lcu_attn_desc kv = {1, (const int32_t *)&kl, &ks, &kl, 1, 4, 2, 64, 0.125f, false};
    gt_check(lcu_cudnn_attn_fwd(dnn, &kv, 1, (void *)1, (void *)1, (void *)1, (void *)1, (void *)1, 0) == LCU_ENOTSUP,
             "a KV-cache layout is left to the own kernels (LCU_ENOTSUP)");

    /* the backward in head groups: a context whose workspace limit (LCU_CUDNN_WORKSPACE_MB) is
     * 75 % of what this bucket's backward over all 16 heads asks runs it as 2 calls of 8/2
     * heads (lcu_cudnn_attn.c, lca_bwd_plan), checked like every case */
    if (!gt_small()) {
        int lens[3] = {gt_int(300, 500), gt_int(1, 200), 512};
        int64_t q_start64[4] = {0};
        for (int i = 0; i < 3; i++) q_start64[i + 1] = q_start64[i] + lens[i];
        lcu_attn_desc probe = {3, (const int32_t *)1, NULL, NULL, (long)q_start64[3], 16, 4, 64, 0.125f, false};
        int64_t ws = 0, eng = -1;
        int acc = 0;
        int rc = lcu_cudnn_plan_check(dnn, &probe, 512, true, &ws, &eng, &acc);
        lcu_cudnn *all = dnn;
        char mb[32];
        snprintf(mb, sizeof mb, "%lld", (long long)(ws * 3 / 4 >> 20));
        setenv("LCU_CUDNN_WORKSPACE_MB", mb, 1);
        int rc2 = rc == 0 && ws >= (8 << 20) ? lcu_cudnn_create(&dnn, why, sizeof why) : -1;
        unsetenv("LCU_CUDNN_WORKSPACE_MB");
        gt_check(rc2 == 0, "a context with a workspace limit of %s MiB (all heads: %.1f MiB, plan rc %d)", mb,
                 ws / 1048576.0, rc);
        if (rc2 == 0) {
            int groups = 0;
            lcu_cudnn_bwd_groups(dnn, &probe, 512, &groups, &ws, &eng, &acc);
            gt_check(groups == 2, "the backward over the limit takes 2 head groups (%d; workspace %.1f MiB)", groups,
                     ws / 1048576.0);
            gt_check(check_case("head groups", 3, lens, 16, 4, 64, false), "the head-group backward ran on cuDNN");
            lcu_cudnn_destroy(dnn);
        }
        dnn = all;
    }
    lcu_cudnn_destroy(dnn);
    return gt_finish();
}
