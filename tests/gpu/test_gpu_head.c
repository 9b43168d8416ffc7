/* test_gpu_head.c — lcu_head_loss and lcu_head_topk against an fp64 reference that uses
 * the CPU backend's own per-token loss (backend/loss.h loss_token) and its dlogits rule (zero
 * rows for sequences without gradient, for 1-target rows whose dℓ/dlp is 0 and for rows
 * whose dℓ/dlp is not finite): all five
 * losses with their default clip/beta, 2-D cross entropy with duplicate targets and
 * negative or zero weights, RL rows masked by zero advantages, two chunks (row0 offset,
 * padded strides), the Qwen vocabulary (151936), bitwise reruns, poisoned outputs.
 *
 * Tolerances: lp 1e-6 and lse 1e-6 (relative L2; fp32 logits, double sums); loss 1e-5;
 * dlogits (bf16) 5e-3; zero rows exactly zero; top-k ids exactly the reference order
 * (value desc, id asc), their lp 1e-6; dlogits vs central differences of the GPU loss 1e-2.
 * lp, loss, lse and dlogits also meet their bar row by row (gt_expect_blocks: each value of
 * lp, loss, lse, each row of dlogits, against the larger of its own size and the tensor's
 * typical one), so that one wrong row cannot pass inside the whole tensor's norm: a bf16
 * rounding moves each value by at most 2⁻⁹ of itself, so no row of dlogits is off by more
 * than 2e-3 from rounding alone.
 */
#include "tests/gpu/gt.h"
#include "tests/gpu/twin.h"

#include <math.h>
#include <string.h>

typedef struct {
    long T, nnz;
    int nseq;
    int32_t *row_seq;
    lcu_loss_seq *seqs;
    loss_spec *specs;
    int64_t *tgt_start;
    int32_t *targets;
    float *weights, *sampler_lp, *adv;
} batch;

static void make_batch(batch *b, int nseq, int V)
{
    b->nseq = nseq;
    b->seqs = calloc(nseq, sizeof *b->seqs);
    b->specs = calloc(nseq, sizeof *b->specs);
    int *len = malloc(nseq * sizeof(int)), *kk = malloc(nseq * sizeof(int));
    b->T = 0;
    b->nnz = 0;
    for (int s = 0; s < nseq; s++) {
        int kind = s % 5; /* every loss in every batch */
        b->specs[s] = loss_spec_default((loss_kind)kind);
        b->seqs[s] = (lcu_loss_seq){kind, gt_int(0, 3) > 0, b->specs[s].clip_low, b->specs[s].clip_high, b->specs[s].beta};
        len[s] = gt_int(1, 40);
        kk[s] = kind == 0 && gt_int(0, 1) ? gt_int(2, 9) : 1; /* 2-D cross entropy */
        b->T += len[s];
        b->nnz += (long)len[s] * kk[s];
    }
    b->row_seq = malloc(b->T * 4);
    b->tgt_start = malloc((b->T + 1) * 8);
    b->targets = malloc(b->nnz * 4);
    b->weights = malloc(b->nnz * 4);
    b->sampler_lp = malloc(b->T * 4);
    b->adv = malloc(b->T * 4);
    long t = 0, k = 0;
    for (int s = 0; s < nseq; s++)
        for (int i = 0; i < len[s]; i++, t++) {
            b->row_seq[t] = s;
            b->tgt_start[t] = k;
            for (int j = 0; j < kk[s]; j++, k++) {
                /* duplicates within a 2-D row now and then */
                b->targets[k] = j > 0 && gt_int(0, 3) == 0 ? b->targets[k - 1] : gt_int(0, V - 1);
                int w = gt_int(0, 5);
                b->weights[k] = w == 0 ? 0.0f : w == 1 ? (float)gt_uniform(-1, 0) : (float)gt_uniform(0.1, 2);
            }
            b->adv[t] = gt_int(0, 3) == 0 ? 0.0f : (float)gt_uniform(-2, 2);
            b->sampler_lp[t] = 0; /* set from the logits below, near the learner's lp */
        }
    b->tgt_start[t] = k;
    free(len);
    free(kk);
}

static void free_batch(batch *b)
{
    free(b->row_seq); free(b->seqs); free(b->specs); free(b->tgt_start); free(b->targets); free(b->weights);
    free(b->sampler_lp); free(b->adv);
}

/* The CPU head's arithmetic in fp64 (cpu_backend.c cb_head_rows). */
static void ref_rows(const batch *b, const float *z, long ld, int V, double *lp, double *loss, double *lse,
                     double *dlog)
{
    for (long t = 0; t < b->T; t++) {
        const float *r = z + t * ld;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, r[v]);
        for (int v = 0; v < V; v++) sum += exp(r[v] - mx);
        lse[t] = mx + log(sum);
        const loss_spec *sp = &b->specs[b->row_seq[t]];
        double L = 0, dsum = 0;
        float dlp0 = 0;
        long k0 = b->tgt_start[t], K = b->tgt_start[t + 1] - k0;
        double *g = dlog + t * V;
        for (int v = 0; v < V; v++) g[v] = 0;
        for (long k = 0; k < K; k++) {
            float l, dl, lpf = (float)((double)r[b->targets[k0 + k]] - lse[t]);
            loss_token(sp, lpf, b->weights[k0 + k], b->sampler_lp[t], b->adv[t], &l, &dl);
            lp[k0 + k] = (double)r[b->targets[k0 + k]] - lse[t];
            L += l;
            dsum += dl;
            if (k == 0) dlp0 = dl;
            g[b->targets[k0 + k]] += dl;
        }
        loss[t] = L;
        bool grad = b->seqs[b->row_seq[t]].grad && !(K == 1 && dlp0 == 0.0f) && isfinite(dsum);
        for (int v = 0; v < V; v++) g[v] = grad ? g[v] - dsum * exp(r[v] - lse[t]) : 0.0;
    }
}

static void test_loss(int nseq, int V)
{
    batch b;
    make_batch(&b, nseq, V);
    long T = b.T, ld = V + gt_int(0, 5), ldd = V + 8 * gt_int(0, 2);
    float *z = malloc(T * ld * 4);
    gt_fill(z, T * ld, -6, 6);
    /* sampler logprobs within ±0.5 of the learner's (both sides of the clip range) */
    for (long t = 0; t < T; t++) {
        const float *r = z + t * ld;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, r[v]);
        for (int v = 0; v < V; v++) sum += exp(r[v] - mx);
        b.sampler_lp[t] = (float)(r[b.targets[b.tgt_start[t]]] - mx - log(sum) + gt_uniform(-0.5, 0.5));
    }
    double *lp = malloc(b.nnz * 8), *loss = malloc(T * 8), *lse = malloc(T * 8), *dlog = malloc(T * V * 8);
    ref_rows(&b, z, ld, V, lp, loss, lse, dlog);

    void *dz = gt_dev_f32(z, T * ld), *drs = gt_dev_copy(b.row_seq, T * 4);
    void *dseq = gt_dev_copy(b.seqs, nseq * sizeof *b.seqs), *dts = gt_dev_copy(b.tgt_start, (T + 1) * 8);
    void *dtg = gt_dev_copy(b.targets, b.nnz * 4), *dw = gt_dev_f32(b.weights, b.nnz);
    void *dq = gt_dev_f32(b.sampler_lp, T), *da = gt_dev_f32(b.adv, T);
    float *dlp = gt_dev_poison(b.nnz * 4), *dloss = gt_dev_poison(T * 4);
    double *dlse = gt_dev_poison(T * 8);
    lcu_bf16 *dg = gt_dev_poison(T * ldd * 2);
    lcu_head_batch hb = {drs, dseq, dts, dtg, dw, dq, da, dlp, dloss, dlse};
    long split = gt_int(1, (int)T);
    for (int pass = 0; pass < 2; pass++) {
        /* two chunks: rows [0, split) and [split, T) */
        GT_LCU(lcu_head_loss(dz, ld, 0, (int)split, V, &hb, dg, ldd, 0));
        GT_LCU(lcu_head_loss((float *)dz + split * ld, ld, split, (int)(T - split), V, &hb, dg + split * ldd, ldd, 0));
        float *hlp = malloc(b.nnz * 4), *hloss = malloc(T * 4), *hg = malloc(T * ldd * 4), *g = malloc(T * V * 4);
        double *hlse = malloc(T * 8);
        gt_get_f32(hlp, dlp, b.nnz);
        gt_get_f32(hloss, dloss, T);
        gt_get(hlse, dlse, T * 8);
        gt_get_bf16(hg, dg, T * ldd);
        for (long t = 0; t < T; t++) memcpy(g + t * V, hg + t * ldd, V * 4);
        static float *first_lp, *first_loss, *first_g;
        char what[160];
        if (pass == 0) {
            size_t one = 1, row = (size_t)V;
            long w;
            snprintf(what, sizeof what, "head lp T=%ld V=%d nnz=%ld", T, V, b.nnz);
            gt_expect_close(what, hlp, lp, b.nnz, 1e-6);
            gt_expect_blocks(what, "target", hlp, lp, b.nnz, b.nnz, gt_block_run, &one, 1e-6, NULL);
            snprintf(what, sizeof what, "head loss (5 losses) T=%ld V=%d", T, V);
            gt_expect_close(what, hloss, loss, T, 1e-5);
            if (!gt_expect_blocks(what, "row", hloss, loss, T, T, gt_block_run, &one, 1e-5, &w) && w >= 0)
                printf("     worst row %ld: sequence %d, loss %d: got %.9g, want %.9g\n", w, b.row_seq[w],
                       b.seqs[b.row_seq[w]].kind, hloss[w], loss[w]);
            float *lf = malloc(T * 4);
            for (long t = 0; t < T; t++) lf[t] = (float)hlse[t];
            snprintf(what, sizeof what, "head lse T=%ld V=%d", T, V);
            gt_expect_close(what, lf, lse, T, 1e-6);
            gt_expect_blocks(what, "row", lf, lse, T, T, gt_block_run, &one, 1e-6, NULL);
            free(lf);
            snprintf(what, sizeof what, "head dlogits T=%ld V=%d, per row", T, V);
            if (!gt_expect_blocks(what, "row", g, dlog, T * V, T, gt_block_run, &row, 5e-3, &w) && w >= 0)
                printf("     worst row %ld: sequence %d, loss %d, grad %d, %ld targets\n", w, b.row_seq[w],
                       b.seqs[b.row_seq[w]].kind, b.seqs[b.row_seq[w]].grad, (long)(b.tgt_start[w + 1] - b.tgt_start[w]));
            snprintf(what, sizeof what, "head dlogits T=%ld V=%d", T, V);
            if (!gt_expect_close(what, g, dlog, T * V, 5e-3)) {
                long w = (long)gt_worst(g, dlog, T * V), t = w / V, k0 = b.tgt_start[t];
                int v = (int)(w % V), s = b.row_seq[t], tgt = 0;
                for (long k = k0; k < b.tgt_start[t + 1]; k++) tgt += b.targets[k] == v;
                printf("     worst: row %ld (sequence %d, loss %d, grad %d, %ld targets), column %d (a target %d times)\n", t,
                       s, b.seqs[s].kind, b.seqs[s].grad, (long)(b.tgt_start[t + 1] - k0), v, tgt);
            }
            /* rows without gradient are exactly zero; rows with one are not */
            long bad = -1;
            for (long t = 0; t < T && bad < 0; t++) {
                bool zero_ref = true, zero_got = true;
                for (int v = 0; v < V; v++) {
                    zero_ref &= dlog[t * V + v] == 0.0;
                    zero_got &= g[t * V + v] == 0.0f;
                }
                if (zero_ref != zero_got) bad = t;
            }
            gt_check(bad < 0, "head dlogits: zero rows exactly where the CPU has them (first mismatch row %ld)", bad);
            first_lp = hlp;
            first_loss = hloss;
            first_g = g;
        } else {
            gt_expect_bits("head rerun lp", hlp, first_lp, b.nnz * 4);
            gt_expect_bits("head rerun loss", hloss, first_loss, T * 4);
            gt_expect_bits("head rerun dlogits", g, first_g, T * V * 4);
            free(first_lp); free(first_loss); free(first_g);
            free(hlp); free(hloss); free(g);
        }
        free(hg);
        free(hlse);
        GT_CUDA(cudaMemset(dlp, 0xff, b.nnz * 4));
        GT_CUDA(cudaMemset(dloss, 0xff, T * 4));
        GT_CUDA(cudaMemset(dg, 0xff, T * ldd * 2));
    }
    /* forward only (dlogits NULL) writes lp and loss all the same */
    {
        GT_LCU(lcu_head_loss(dz, ld, 0, (int)T, V, &hb, NULL, 0, 0));
        float *hlp = malloc(b.nnz * 4);
        gt_get_f32(hlp, dlp, b.nnz);
        gt_expect_close("head lp, forward only", hlp, lp, b.nnz, 1e-6);
        free(hlp);
    }
    gt_free(dz); gt_free(drs); gt_free(dseq); gt_free(dts); gt_free(dtg); gt_free(dw); gt_free(dq); gt_free(da);
    gt_free(dlp); gt_free(dloss); gt_free(dlse); gt_free(dg);
    free(z); free(lp); free(loss); free(lse); free(dlog);
    free_batch(&b);
}

/* The GPU's dlogits against central differences of the GPU's own loss (fp32) in the
 * logits, on a tiny batch of the smooth losses: cross_entropy (1 and 3 targets),
 * importance_sampling and dro (ppo has kinks; cispo's stop-gradient makes its gradient
 * differ from the derivative of its value by design). */
static void test_fd(void)
{
    enum { R = 8, V = 40 };
    const int kinds[R] = {0, 0, 0, 0, 1, 1, 4, 4};
    lcu_loss_seq seqs[R];
    int32_t row_seq[R], targets[4 * R];
    int64_t ts[R + 1];
    float w[4 * R], q[R], adv[R], z[R * V];
    gt_fill(z, R * V, -3, 3);
    long k = 0;
    for (int r = 0; r < R; r++) {
        loss_spec sp = loss_spec_default((loss_kind)kinds[r]);
        seqs[r] = (lcu_loss_seq){kinds[r], 1, sp.clip_low, sp.clip_high, sp.beta};
        row_seq[r] = r;
        ts[r] = k;
        int K = r == 1 ? 3 : 1;
        for (int j = 0; j < K; j++, k++) {
            targets[k] = gt_int(0, V - 1);
            w[k] = (float)gt_uniform(0.2, 1.5);
        }
        q[r] = (float)gt_uniform(-5, -2);
        adv[r] = (float)gt_uniform(0.5, 2);
    }
    ts[R] = k;
    void *dz = gt_dev_f32(z, R * V), *drs = gt_dev_copy(row_seq, sizeof row_seq), *dseq = gt_dev_copy(seqs, sizeof seqs);
    void *dts = gt_dev_copy(ts, sizeof ts), *dtg = gt_dev_copy(targets, k * 4), *dw = gt_dev_f32(w, k);
    void *dq = gt_dev_f32(q, R), *da = gt_dev_f32(adv, R), *dlp = gt_dev_poison(k * 4), *dloss = gt_dev_poison(R * 4);
    lcu_bf16 *dg = gt_dev_poison(R * V * 2);
    lcu_head_batch hb = {drs, dseq, dts, dtg, dw, dq, da, dlp, dloss, NULL};
    GT_LCU(lcu_head_loss(dz, V, 0, R, V, &hb, dg, V, 0));
    float g[R * V], fd[R * V], loss[R];
    double g64[R * V];
    gt_get_bf16(g, dg, R * V);
    for (int i = 0; i < R * V; i++) {
        int r = i / V;
        float z0 = z[i], h = 1e-2f;
        double L[2];
        for (int s = 0; s < 2; s++) {
            z[i] = z0 + (s ? -h : h);
            GT_CUDA(cudaMemcpy((float *)dz + i, &z[i], 4, cudaMemcpyHostToDevice));
            GT_LCU(lcu_head_loss(dz, V, 0, R, V, &hb, NULL, 0, 0));
            gt_get_f32(loss, dloss, R);
            L[s] = loss[r];
        }
        z[i] = z0;
        GT_CUDA(cudaMemcpy((float *)dz + i, &z0, 4, cudaMemcpyHostToDevice));
        fd[i] = (float)((L[0] - L[1]) / ((double)(z0 + h) - (double)(z0 - h)));
        g64[i] = g[i];
    }
    gt_expect_close("head dlogits vs finite differences of the loss (ce, ce 2-D, is, dro)", fd, g64, R * V, 1e-2);
    gt_free(dz); gt_free(drs); gt_free(dseq); gt_free(dts); gt_free(dtg); gt_free(dw); gt_free(dq); gt_free(da);
    gt_free(dlp); gt_free(dloss); gt_free(dg);
}

/* A row whose dℓ/dlp is not finite adds no gradient (backend/backend.h): importance
 * sampling with a sampler log-prob of −1000 makes r = exp(lp − q) overflow, so dℓ/dlp is
 * −inf; its dlogits row must be zero (the CPU's !isfinite(dsum)), the other rows not. */
static void test_nonfinite(void)
{
    enum { R = 3, V = 64 };
    lcu_loss_seq seqs[R];
    const int kinds[R] = {1, 0, 1};
    int32_t row_seq[R], targets[R];
    int64_t ts[R + 1];
    float q[R] = {-1000.0f, 0.0f, -1.0f}, adv[R] = {1.0f, 0.0f, 1.0f}, z[R * V];
    gt_fill(z, R * V, -3, 3);
    for (int r = 0; r < R; r++) {
        loss_spec sp = loss_spec_default((loss_kind)kinds[r]);
        seqs[r] = (lcu_loss_seq){kinds[r], 1, sp.clip_low, sp.clip_high, sp.beta};
        row_seq[r] = r;
        ts[r] = r;
        targets[r] = gt_int(0, V - 1);
    }
    ts[R] = R;
    void *dz = gt_dev_f32(z, R * V), *drs = gt_dev_copy(row_seq, sizeof row_seq), *dseq = gt_dev_copy(seqs, sizeof seqs);
    void *dts = gt_dev_copy(ts, sizeof ts), *dtg = gt_dev_copy(targets, sizeof targets);
    void *dq = gt_dev_f32(q, R), *da = gt_dev_f32(adv, R), *dlp = gt_dev_poison(R * 4), *dloss = gt_dev_poison(R * 4);
    lcu_bf16 *dg = gt_dev_poison(R * V * 2);
    lcu_head_batch hb = {drs, dseq, dts, dtg, NULL, dq, da, dlp, dloss, NULL};
    GT_LCU(lcu_head_loss(dz, V, 0, R, V, &hb, dg, V, 0));
    float g[R * V];
    gt_get_bf16(g, dg, R * V);
    int nonzero[R] = {0, 0, 0}, nonfinite = 0;
    for (int i = 0; i < R * V; i++) {
        nonzero[i / V] += g[i] != 0.0f;
        nonfinite += !isfinite(g[i]);
    }
    gt_check(nonzero[0] == 0 && nonfinite == 0, "head dlogits: a row with dℓ/dlp = -inf is zero (%d nonzero, %d non-finite "
             "values in the batch)", nonzero[0], nonfinite);
    gt_check(nonzero[1] > 0 && nonzero[2] > 0, "head dlogits: the finite rows beside it keep their gradient");
    gt_free(dz); gt_free(drs); gt_free(dseq); gt_free(dts); gt_free(dtg); gt_free(dq); gt_free(da); gt_free(dlp);
    gt_free(dloss); gt_free(dg);
}

/* ---- top-k ------------------------------------------------------------------------------ */

static const float *cmp_z;
static int cmp_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    if (cmp_z[x] != cmp_z[y]) return cmp_z[x] > cmp_z[y] ? -1 : 1;
    return x - y;
}

static void test_topk(int rows, int V, bool ties, int kmax)
{
    long ld = V + gt_int(0, 3);
    float *z = malloc(rows * ld * 4);
    gt_fill(z, rows * ld, -4, 4);
    if (ties)
        for (long i = 0; i < rows * ld; i++) z[i] = roundf(z[i] * 4) / 4; /* 33 distinct values */
    int64_t *ks = malloc((rows + 1) * 8);
    ks[0] = 0;
    for (int r = 0; r < rows; r++) ks[r + 1] = ks[r] + (gt_int(0, 4) == 0 ? 0 : gt_int(1, kmax < V ? kmax : V));
    long nk = ks[rows];
    double *lse = malloc(rows * 8);
    for (int r = 0; r < rows; r++) {
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, z[r * ld + v]);
        for (int v = 0; v < V; v++) s += exp(z[r * ld + v] - mx);
        lse[r] = mx + log(s);
    }
    int32_t *want = malloc((nk ? nk : 1) * 4), *got = malloc((nk ? nk : 1) * 4);
    double *wlp = malloc((nk ? nk : 1) * 8);
    int *idx = malloc(V * sizeof(int));
    for (int r = 0; r < rows; r++) {
        for (int v = 0; v < V; v++) idx[v] = v;
        cmp_z = z + r * ld;
        qsort(idx, V, sizeof(int), cmp_desc);
        for (long i = 0; i < ks[r + 1] - ks[r]; i++) {
            want[ks[r] + i] = idx[i];
            wlp[ks[r] + i] = z[r * ld + idx[i]] - lse[r];
        }
    }
    void *dz = gt_dev_f32(z, rows * ld), *dks = gt_dev_copy(ks, (rows + 1) * 8), *dl = gt_dev_copy(lse, rows * 8);
    void *dids = gt_dev_poison(nk * 4 + 4), *dlp = gt_dev_poison(nk * 4 + 4);
    GT_LCU(lcu_head_topk(dz, ld, 0, rows, V, dks, dl, dids, dlp, 0));
    float *glp = malloc((nk ? nk : 1) * 4);
    gt_get(got, dids, nk * 4);
    gt_get_f32(glp, dlp, nk);
    char what[120];
    snprintf(what, sizeof what, "topk ids rows=%d V=%d%s (%ld ids)", rows, V, ties ? " ties" : "", nk);
    gt_expect_bits(what, got, want, nk * 4);
    snprintf(what, sizeof what, "topk lp rows=%d V=%d", rows, V);
    if (nk) gt_expect_close(what, glp, wlp, nk, 1e-6);
    gt_free(dz); gt_free(dks); gt_free(dl); gt_free(dids); gt_free(dlp);
    free(z); free(ks); free(lse); free(want); free(got); free(wlp); free(idx); free(glp);
}

/* -0 and +0 are equal logits: lower id first, as the CPU backend (a key built from the raw
 * bits put +0 before -0: the first H200 run's "topk ids ... ties" failure, where rounding
 * to quarters made both zeros) */
static void test_topk_signed_zero(void)
{
    const float z[8] = {-0.0f, 1.0f, 0.0f, -0.0f, -1.0f, 0.0f, 0.5f, -0.0f};
    const int32_t want[8] = {1, 6, 0, 2, 3, 5, 7, 4};
    int64_t ks[2] = {0, 8};
    double lse = 0;
    for (int v = 0; v < 8; v++) lse += exp(z[v]);
    lse = log(lse);
    void *dz = gt_dev_copy(z, sizeof z), *dks = gt_dev_copy(ks, sizeof ks), *dl = gt_dev_copy(&lse, sizeof lse);
    void *dids = gt_dev_poison(8 * 4), *dlp = gt_dev_poison(8 * 4);
    GT_LCU(lcu_head_topk(dz, 8, 0, 1, 8, dks, dl, dids, dlp, 0));
    int32_t got[8];
    gt_get(got, dids, sizeof got);
    gt_expect_bits("topk ids: -0 and +0 tie (lower id first)", got, want, sizeof want);
    gt_free(dz); gt_free(dks); gt_free(dl); gt_free(dids); gt_free(dlp);
}

int main(void)
{
    gt_init("test_gpu_head");
    test_loss(10, gt_int(50, 3000));
    test_loss(10, gt_int(50, 3000));
    if (!gt_small()) test_loss(5, 151936);
    test_fd();
    test_nonfinite();
    test_topk_signed_zero();
    test_topk(20, gt_int(1, 2000), true, 1024);
    test_topk(20, gt_int(1, 2000), false, 1024);
    if (!gt_small()) {
        test_topk(2, 151936, false, 1024);
        test_topk(6, 151936, true, 20);
    }
    return gt_finish();
}
