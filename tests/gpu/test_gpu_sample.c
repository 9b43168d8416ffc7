/* test_gpu_sample.c — lcu_sample against the CPU backend's token choice: the same token
 * for every row (greedy; temperatures; top-k from 1 to V, ties included; top-p from 0.05
 * to 1), the same per-row xoshiro256** state afterwards (one draw per sampled row, none for
 * greedy ones), log-probs within 1e-6, several rounds continuing the same streams, the
 * Qwen vocabulary; at temperature 1 without filtering the sampled log-prob equals the
 * log-softmax of the logits (the forward's logprob).
 *
 * The reference below is cpu_sample.c's cs_choose, copied verbatim because it is static
 * there (when the CPU backend exposes it, call it instead and delete the copy).
 */
#include "tests/gpu/gt.h"
#include "tests/gpu/twin.h" /* exe_sample_req */

#include <math.h>
#include <string.h>

static int cs_cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int32_t cs_choose(const exe_sample_req *r, const float *z, long V, rng_state *rng, float *w, uint64_t *keys,
                         float *lp)
{
    float mx = z[0];
    long best = 0;
    for (long v = 1; v < V; v++) if (z[v] > mx) { mx = z[v]; best = v; }
    if (r->temperature == 0) {
        double sum = 0;
        for (long v = 0; v < V; v++) sum += expf(z[v] - mx);
        *lp = (float)(-log(sum));
        return (int32_t)best;
    }
    double inv_t = 1.0 / r->temperature;
    for (long v = 0; v < V; v++) w[v] = (float)exp((z[v] - mx) * inv_t);
    if (r->top_k > 0 && r->top_k < V) {
        float *tmp = (float *)keys;
        memcpy(tmp, w, V * sizeof(float));
        long lo = 0, hi = V - 1, k = r->top_k - 1;
        while (lo < hi) {
            float piv = tmp[(lo + hi) / 2];
            long i = lo, j = hi;
            while (i <= j) {
                while (tmp[i] > piv) i++;
                while (tmp[j] < piv) j--;
                if (i <= j) { float x = tmp[i]; tmp[i] = tmp[j]; tmp[j] = x; i++; j--; }
            }
            if (k <= j) hi = j;
            else if (k >= i) lo = i;
            else break;
        }
        float thr = tmp[k];
        for (long v = 0; v < V; v++) if (w[v] < thr) w[v] = 0.0f;
    }
    double sum = 0;
    for (long v = 0; v < V; v++) sum += w[v];
    if (r->top_p < 1.0) {
        long n = 0;
        for (long v = 0; v < V; v++) {
            if (w[v] <= 0) continue;
            uint32_t bits;
            memcpy(&bits, &w[v], 4);
            keys[n++] = ((uint64_t)bits << 32) | (uint32_t)v;
        }
        qsort(keys, n, sizeof *keys, cs_cmp_desc);
        double cum = 0, target = r->top_p * sum;
        long keep = 0;
        while (keep < n && (keep == 0 || cum < target)) cum += w[(uint32_t)keys[keep++]];
        double u = rng_uniform(rng) * cum, acc = 0;
        for (long i = 0; i < keep; i++) {
            int32_t v = (int32_t)(uint32_t)keys[i];
            acc += w[v];
            if (u < acc || i == keep - 1) {
                *lp = (float)log(w[v] / cum);
                return v;
            }
        }
    }
    double u = rng_uniform(rng) * sum, acc = 0;
    long pick = best;
    for (long v = 0; v < V; v++) {
        if (w[v] == 0.0f) continue;
        acc += w[v];
        pick = v;
        if (u < acc) break;
    }
    *lp = (float)log(w[pick] / sum);
    return (int32_t)pick;
}

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
            exe_sample_req q = {.temperature = p[r].temperature, .top_k = p[r].top_k, .top_p = p[r].top_p};
            tok[r] = cs_choose(&q, z + r * ld, V, &st[r], w, keys, &lp[r]);
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
        gt_check(diff == 0, "sample round %d rows=%d V=%d%s: %d tokens differ from cs_choose (first row %d: gpu %d cpu %d, "
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
