/* test_gpu_sample.c — lcu_sample against the CPU backend's token choice: the same token
 * for every row (greedy; temperatures; top-k from 1 to V, ties included; top-p from 0.05
 * to 1), the same per-row xoshiro256** state afterwards (one draw per sampled row, none for
 * greedy ones), log-probs within 1e-6, several rounds continuing the same streams, the
 * Qwen vocabulary; at temperature 1 without filtering the sampled log-prob equals the
 * log-softmax of the logits (the forward's logprob).
 *
 * The reference is the CPU backend's own choice, cpu_choose_token (backend/cpu/cpu_choose.c).
 */
#include "tests/gpu/gt.h"
#include "tests/gpu/twin.h"
#include "backend/cpu/cpu_choose.h"

#include <math.h>
#include <string.h>


static void test_rows(int rows, int V, bool ties, int rounds)
{
    long ld = V + gt_int(0, 4);
    float *z = malloc(rows * ld * 4);
    gt_fill(z, rows * ld, -8, 8);
    if (ties) for (long i = 0; i < rows * ld; i++) z[i] = roundf(z[i] * 2) / 2;
    lcu_sample_params *p = malloc(rows * sizeof *p);
    const double temps[5] = {0, 0.5, 1.0, 1.0, 1.7};
    const double tps[5] = {1.0, 1.0, 0.9, 0.5, 0.05};
    for (int r = 0; r < rows; r++) {
        p[r].temperature = temps[gt_int(0, 4)];
        int kc = gt_int(0, 5);
        p[r].top_k = kc == 0 ? 0 : kc == 1 ? 1 : kc == 2 ? gt_int(2, 60) : kc == 3 ? V - 1 : kc == 4 ? V : -1;
        p[r].top_p = tps[gt_int(0, 4)];
    }
    p[0] = (lcu_sample_params){1.0, 0, 1.0}; /* the plain sampler: lp = log-softmax */
    rng_state *st = malloc(rows * sizeof *st);
    uint64_t *s4 = malloc(rows * 4 * 8);
    for (int r = 0; r < rows; r++) {
        rng_seed(&st[r], rng_next(&gt_rng));
        memcpy(s4 + 4 * r, st[r].s, 32);
    }
    void *dz = gt_dev_f32(z, rows * ld), *drng = gt_dev_copy(s4, rows * 32);
    void *dtok = gt_dev_poison(rows * 4), *dlp = gt_dev_poison(rows * 4);
    size_t wsb = lcu_sample_workspace_bytes(rows, V);
    gt_check(wsb > 0, "sample workspace for %d rows of %d: %zu bytes", rows, V, wsb);
    void *ws = gt_dev_poison(wsb);
    float *w = malloc(V * 4), *lp = malloc(rows * 4), *glp = malloc(rows * 4);
    uint64_t *keys = malloc(V * 8), *g4 = malloc(rows * 32);
    int32_t *tok = malloc(rows * 4), *gtok = malloc(rows * 4);
    double *lp64 = malloc(rows * 8);
    for (int round = 0; round < rounds; round++) {
        for (int r = 0; r < rows; r++) {
            be_sample_req q = {.temperature = p[r].temperature, .top_k = p[r].top_k, .top_p = p[r].top_p};
            tok[r] = cpu_choose_token(&q, z + r * ld, V, &st[r], w, keys, &lp[r]);
            lp64[r] = lp[r];
            memcpy(s4 + 4 * r, st[r].s, 32);
        }
        GT_CUDA(cudaMemset(dtok, 0xff, rows * 4));
        GT_CUDA(cudaMemset(dlp, 0xff, rows * 4));
        GT_LCU(lcu_sample(dz, ld, rows, V, p, drng, dtok, dlp, ws, wsb, 0));
        gt_get(gtok, dtok, rows * 4);
        gt_get_f32(glp, dlp, rows);
        gt_get(g4, drng, rows * 32);
        int diff = 0, first = -1;
        for (int r = 0; r < rows; r++)
            if (gtok[r] != tok[r]) { diff++; if (first < 0) first = r; }
        gt_check(diff == 0, "sample round %d rows=%d V=%d%s: %d tokens differ from cpu_choose_token (first row %d: gpu %d cpu %d, "
                 "T=%g k=%d p=%g)", round, rows, V, ties ? " ties" : "", diff, first, first >= 0 ? gtok[first] : 0,
                 first >= 0 ? tok[first] : 0, first >= 0 ? p[first].temperature : 0, first >= 0 ? p[first].top_k : 0,
                 first >= 0 ? p[first].top_p : 0);
        char what[120];
        snprintf(what, sizeof what, "sample round %d log-probs", round);
        gt_expect_close(what, glp, lp64, rows, 1e-6);
        snprintf(what, sizeof what, "sample round %d rng states", round);
        gt_expect_bits(what, g4, s4, rows * 32);
    }
    /* row 0 samples the plain distribution: its lp is the log-softmax of its token */
    {
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, z[v]);
        for (int v = 0; v < V; v++) s += exp(z[v] - mx);
        double want = z[gtok[0]] - mx - log(s);
        gt_check(fabs(glp[0] - want) <= 1e-5 * fmax(1, fabs(want)), "temperature 1, no filter: lp %.7g = log-softmax %.7g",
                 glp[0], want);
    }
    gt_free(dz); gt_free(drng); gt_free(dtok); gt_free(dlp); gt_free(ws);
    free(z); free(p); free(st); free(s4); free(w); free(lp); free(glp); free(keys); free(g4); free(tok); free(gtok);
    free(lp64);
}

int main(void)
{
    gt_init("test_gpu_sample");
    test_rows(200, gt_int(2, 500), false, 3);
    test_rows(200, gt_int(2, 500), true, 3);
    if (!gt_small()) {
        test_rows(300, gt_int(5000, 20000), false, 2);
        test_rows(24, 151936, false, 2);
        test_rows(24, 151936, true, 1);
    }
    lcu_sample_params bad = {-1, 0, 1};
    gt_check(lcu_sample((void *)16, 4, 1, 4, &bad, (void *)16, (void *)16, (void *)16, (void *)16, 1 << 20, 0) == LCU_EINVAL,
             "negative temperature refused");
    return gt_finish();
}
