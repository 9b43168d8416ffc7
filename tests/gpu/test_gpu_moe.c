/* test_gpu_moe.c — the mixture-of-experts kernels (lcu_moe.cu) and the grouped GEMM
 * (lcu_grouped_gemm, lcu_sgmv.cu) against fp64 host references written from the CPU twin's
 * definitions (backend/cpu/cpu_moe.c):
 *
 *   routing    the chosen experts equal the reference's exactly (rows with exact ties
 *              included: the lower index first), probabilities and weights rel 1e-6, with
 *              and without renormalisation, K from 1 to 8, E up to 128
 *   gather     bitwise
 *   combine    rel 1e-6 (fp32 sums of K terms)
 *   dweights   dL/dw rel 1e-6; the experts' dL/dy bitwise (one fp32 product, rounded to bf16)
 *   dinput     dL/dxn rel 1e-6; dL/dlogits rel 4e-3 (bf16)
 *   grouped    the experts' products (x Wᵀ, dy W, dy W accumulated) over items of uneven
 *   GEMM       rows, empty ones among them, rel 1e-5 against fp64 on the bf16 inputs;
 *              reruns bitwise
 */
#include "tests/gpu/gt.h"

#include <math.h>
#include <string.h>

/* ---- routing ------------------------------------------------------------------------- */

static void route_ref(const float *logits, int T, int E, int K, bool norm, double *prob, int *sel, double *w)
{
    for (int t = 0; t < T; t++) {
        const float *l = logits + (long)t * E;
        double mx = l[0], sum = 0;
        for (int i = 1; i < E; i++) mx = fmax(mx, l[i]);
        for (int i = 0; i < E; i++) sum += exp((double)l[i] - mx);
        for (int i = 0; i < E; i++) prob[(long)t * E + i] = exp((double)l[i] - mx) / sum;
        /* the order of the fp32 probabilities the kernels compare, ties to the lower index */
        float pf[1024];
        for (int i = 0; i < E; i++) pf[i] = (float)prob[(long)t * E + i];
        double tot = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int i = 0; i < E; i++) {
                bool taken = false;
                for (int q = 0; q < k; q++) taken |= sel[t * K + q] == i;
                if (!taken && (best < 0 || pf[i] > pf[best])) best = i;
            }
            sel[t * K + k] = best;
            tot += pf[best];
        }
        for (int k = 0; k < K; k++) w[t * K + k] = norm ? pf[sel[t * K + k]] / tot : pf[sel[t * K + k]];
    }
}

static void test_route(int T, int E, int K, bool norm)
{
    float *l = malloc((size_t)T * E * 4), *prob = malloc((size_t)T * E * 4), *w = malloc((size_t)T * K * 4);
    int32_t *sel = malloc((size_t)T * K * 4);
    double *rp = malloc((size_t)T * E * 8), *rw = malloc((size_t)T * K * 8);
    int *rs = malloc((size_t)T * K * sizeof(int));
    gt_fill(l, (size_t)T * E, -3, 3);
    for (int t = 0; t < T; t += 3) /* exact ties: a row's best logit repeated at a higher index */
        for (int i = E / 2; i < E; i += 5) l[(long)t * E + i] = l[(long)t * E + (i % (E / 2))];
    float *dp = gt_dev_f32(l, (size_t)T * E), *dw = gt_dev_poison((size_t)T * K * 4);
    int32_t *ds = gt_dev_poison((size_t)T * K * 4);
    GT_LCU(lcu_moe_route(dp, T, E, K, norm, ds, dw, 0));
    gt_get_f32(prob, dp, (size_t)T * E);
    gt_get_f32(w, dw, (size_t)T * K);
    gt_get(sel, ds, (size_t)T * K * 4);
    route_ref(l, T, E, K, norm, rp, rs, rw);
    int bad = 0;
    for (long i = 0; i < (long)T * K; i++) bad += sel[i] != rs[i];
    char what[96];
    gt_check(bad == 0, "route T=%d E=%d K=%d norm=%d: %d choices differ from the reference's", T, E, K, norm, bad);
    snprintf(what, sizeof what, "route T=%d E=%d K=%d norm=%d probabilities", T, E, K, norm);
    gt_expect_close(what, prob, rp, (size_t)T * E, 1e-6);
    snprintf(what, sizeof what, "route T=%d E=%d K=%d norm=%d weights", T, E, K, norm);
    gt_expect_close(what, w, rw, (size_t)T * K, 1e-6);
    gt_free(dp); gt_free(dw); gt_free(ds);
    free(l); free(prob); free(w); free(sel); free(rp); free(rw); free(rs);
}

/* ---- gather, combine, backward ----------------------------------------------------------- */

/* A random routing of T tokens to K of E experts, grouped as be_moe_group does. */
static void random_routing(int T, int K, int E, int32_t *sel, int32_t *a_pos, int32_t *a_tok)
{
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e;
            bool dup;
            do {
                e = gt_int(0, E - 1);
                dup = false;
                for (int q = 0; q < k; q++) dup |= sel[t * K + q] == e;
            } while (dup);
            sel[t * K + k] = e;
        }
    int off[257] = {0}, fill[256];
    for (long a = 0; a < (long)T * K; a++) off[sel[a] + 1]++;
    for (int e = 0; e < E; e++) { off[e + 1] += off[e]; fill[e] = off[e]; }
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int pos = fill[sel[t * K + k]]++;
            a_pos[t * K + k] = pos;
            a_tok[pos] = t;
        }
}

static void test_rows(int T, int K, int E, int H, bool norm)
{
    long A = (long)T * K;
    int32_t *sel = malloc(A * 4), *a_pos = malloc(A * 4), *a_tok = malloc(A * 4);
    random_routing(T, K, E, sel, a_pos, a_tok);
    float *x = malloc((size_t)T * H * 4), *ey = malloc((size_t)A * H * 4), *resid = malloc((size_t)T * H * 4);
    float *w = malloc(A * 4), *dout = malloc((size_t)T * H * 4), *edx = malloc((size_t)A * H * 4);
    float *prob = malloc((size_t)T * E * 4);
    gt_fill_bf16_exact(x, (size_t)T * H, -1, 1);
    gt_fill(ey, (size_t)A * H, -1, 1);
    gt_fill(resid, (size_t)T * H, -1, 1);
    gt_fill(dout, (size_t)T * H, -1, 1);
    gt_fill(edx, (size_t)A * H, -1, 1);
    for (int t = 0; t < T; t++) { /* a softmax row and its chosen experts' weights */
        double s = 0;
        for (int e = 0; e < E; e++) s += prob[(long)t * E + e] = (float)gt_uniform(0.01, 1);
        for (int e = 0; e < E; e++) prob[(long)t * E + e] = (float)(prob[(long)t * E + e] / s);
        double tot = 0;
        for (int k = 0; k < K; k++) tot += prob[(long)t * E + sel[t * K + k]];
        for (int k = 0; k < K; k++) w[t * K + k] = norm ? (float)(prob[(long)t * E + sel[t * K + k]] / tot)
                                                        : prob[(long)t * E + sel[t * K + k]];
    }
    int32_t *d_pos = gt_dev_copy(a_pos, A * 4), *d_tok = gt_dev_copy(a_tok, A * 4), *d_sel = gt_dev_copy(sel, A * 4);
    void *dx = gt_dev_bf16(x, (size_t)T * H), *dex = gt_dev_poison((size_t)A * H * 2);
    float *dey = gt_dev_f32(ey, (size_t)A * H), *dres = gt_dev_f32(resid, (size_t)T * H), *dw = gt_dev_f32(w, A);
    float *dout_d = gt_dev_f32(dout, (size_t)T * H), *dedx = gt_dev_f32(edx, (size_t)A * H);
    float *dprob = gt_dev_f32(prob, (size_t)T * E), *dcomb = gt_dev_poison((size_t)T * H * 4);
    float *ddw = gt_dev_poison(A * 4), *ddxn = gt_dev_poison((size_t)T * H * 4);
    void *dedy = gt_dev_poison((size_t)A * H * 2), *ddl = gt_dev_poison((size_t)T * E * 2);
    char what[96];

    /* gather: bitwise */
    GT_LCU(lcu_moe_gather(dex, dx, d_tok, A, H, 0));
    uint16_t *ex = malloc((size_t)A * H * 2), *xb = malloc((size_t)T * H * 2), *ref = malloc((size_t)A * H * 2);
    gt_get(ex, dex, (size_t)A * H * 2);
    for (long i = 0; i < (long)T * H; i++) xb[i] = gt_f2bf(x[i]);
    for (long r = 0; r < A; r++) memcpy(ref + r * H, xb + (long)a_tok[r] * H, (size_t)H * 2);
    snprintf(what, sizeof what, "gather T=%d K=%d H=%d", T, K, H);
    gt_expect_bits(what, ex, ref, (size_t)A * H * 2);

    /* combine */
    double *rc = malloc((size_t)T * H * 8);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            double acc = resid[(long)t * H + h];
            for (int k = 0; k < K; k++) acc += (double)w[t * K + k] * ey[(long)a_pos[t * K + k] * H + h];
            rc[(long)t * H + h] = acc;
        }
    GT_LCU(lcu_moe_combine(dcomb, dres, dey, d_pos, dw, T, K, H, 0));
    float *comb = malloc((size_t)T * H * 4);
    gt_get_f32(comb, dcomb, (size_t)T * H);
    snprintf(what, sizeof what, "combine T=%d K=%d H=%d", T, K, H);
    gt_expect_close(what, comb, rc, (size_t)T * H, 1e-6);

    /* dweights */
    double *rdw = malloc(A * 8);
    uint16_t *redy = malloc((size_t)A * H * 2), *edy = malloc((size_t)A * H * 2);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            long row = (long)a_pos[t * K + k] * H;
            double dot = 0;
            for (int h = 0; h < H; h++) {
                dot += (double)dout[(long)t * H + h] * ey[row + h];
                redy[row + h] = gt_f2bf(w[t * K + k] * dout[(long)t * H + h]);
            }
            rdw[t * K + k] = dot;
        }
    GT_LCU(lcu_moe_dweights(ddw, dedy, dout_d, dey, d_pos, dw, T, K, H, 0));
    float *gdw = malloc(A * 4);
    gt_get_f32(gdw, ddw, A);
    gt_get(edy, dedy, (size_t)A * H * 2);
    snprintf(what, sizeof what, "dweights T=%d K=%d H=%d dL/dw", T, K, H);
    gt_expect_close(what, gdw, rdw, A, 1e-6);
    snprintf(what, sizeof what, "dweights T=%d K=%d H=%d experts' dL/dy", T, K, H);
    gt_expect_bits(what, edy, redy, (size_t)A * H * 2);

    /* dinput, from the reference's dL/dw */
    double *rdxn = malloc((size_t)T * H * 8), *rdl = malloc((size_t)T * E * 8);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += edx[(long)a_pos[t * K + k] * H + h];
            rdxn[(long)t * H + h] = acc;
        }
        const float *p = prob + (long)t * E;
        double S = 0, dot = 0, q = 0, dp[64];
        for (int k = 0; k < K; k++) { S += p[sel[t * K + k]]; dot += gdw[t * K + k] * (double)w[t * K + k]; }
        for (int k = 0; k < K; k++) {
            dp[k] = norm ? (gdw[t * K + k] - dot) / S : gdw[t * K + k];
            q += p[sel[t * K + k]] * dp[k];
        }
        for (int e = 0; e < E; e++) {
            double d = 0;
            for (int k = 0; k < K; k++) if (sel[t * K + k] == e) d = dp[k];
            rdl[(long)t * E + e] = p[e] * (d - q);
        }
    }
    GT_LCU(lcu_moe_dinput(ddxn, ddl, dedx, d_pos, dprob, d_sel, dw, ddw, T, K, E, H, norm, 0));
    float *dxn = malloc((size_t)T * H * 4), *dl = malloc((size_t)T * E * 4);
    gt_get_f32(dxn, ddxn, (size_t)T * H);
    gt_get_bf16(dl, ddl, (size_t)T * E);
    snprintf(what, sizeof what, "dinput T=%d K=%d E=%d norm=%d dL/dxn", T, K, E, norm);
    gt_expect_close(what, dxn, rdxn, (size_t)T * H, 1e-6);
    snprintf(what, sizeof what, "dinput T=%d K=%d E=%d norm=%d dL/dlogits", T, K, E, norm);
    gt_expect_close(what, dl, rdl, (size_t)T * E, 4e-3);

    void *dev[] = {d_pos, d_tok, d_sel, dx, dex, dey, dres, dw, dout_d, dedx, dprob, dcomb, ddw, ddxn, dedy, ddl};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gt_free(dev[i]);
    void *host[] = {sel, a_pos, a_tok, x, ey, resid, w, dout, edx, prob, ex, xb, ref, rc, comb, rdw, redy, edy, gdw,
                    rdxn, rdl, dxn, dl};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}

/* ---- grouped GEMM ------------------------------------------------------------------------ */

/* E experts' products over rows[e] rows each (some zero): forward C = X Wᵀ (tb), backward
 * C = X W (then accumulated again), X [rows, K] bf16 in one grouped block, W [N, K] (tb) or
 * [K, N] per expert. */
static void test_grouped(int E, int N, int K, bool tb, bool acc)
{
    int rows[40], off[41] = {0};
    for (int e = 0; e < E; e++) {
        rows[e] = e % 5 == 3 ? 0 : gt_int(1, 150);
        off[e + 1] = off[e] + rows[e];
    }
    long R = off[E];
    float *x = malloc((size_t)R * K * 4), *w = malloc((size_t)E * N * K * 4), *c0 = malloc((size_t)R * N * 4);
    gt_fill_bf16_exact(x, (size_t)R * K, -1, 1);
    gt_fill_bf16_exact(w, (size_t)E * N * K, -1, 1);
    gt_fill(c0, (size_t)R * N, -1, 1);
    void *dxb = gt_dev_bf16(x, (size_t)R * K), *dwb = gt_dev_bf16(w, (size_t)E * N * K);
    float *dc = acc ? gt_dev_f32(c0, (size_t)R * N) : gt_dev_poison((size_t)R * N * 4);
    lcu_group_item it[40];
    int n = 0;
    for (int e = 0; e < E; e++)
        it[n++] = (lcu_group_item){(const lcu_bf16 *)dxb + (long)off[e] * K, K,
                                   (const lcu_bf16 *)dwb + (long)e * N * K, tb ? K : N, dc + (long)off[e] * N, N,
                                   rows[e], N, K, 1.0f};
    GT_LCU(lcu_grouped_gemm(it, n, false, tb, LCU_F32, acc, 0));
    float *c = malloc((size_t)R * N * 4), *c2 = malloc((size_t)R * N * 4);
    gt_get_f32(c, dc, (size_t)R * N);
    double *ref = malloc((size_t)R * N * 8);
    for (int e = 0; e < E; e++)
        for (long r = off[e]; r < off[e + 1]; r++)
            for (int j = 0; j < N; j++) {
                double s = acc ? c0[r * N + j] : 0;
                const float *we = w + (long)e * N * K;
                for (int k = 0; k < K; k++) s += (double)x[r * K + k] * (tb ? we[(long)j * K + k] : we[(long)k * N + j]);
                ref[r * N + j] = s;
            }
    char what[96];
    snprintf(what, sizeof what, "grouped GEMM %d experts N=%d K=%d %s%s", E, N, K, tb ? "x·Wᵀ" : "x·W", acc ? " (+C)" : "");
    gt_expect_close(what, c, ref, (size_t)R * N, 1e-5);
    if (!acc) { /* a rerun, bitwise */
        GT_LCU(lcu_grouped_gemm(it, n, false, tb, LCU_F32, acc, 0));
        gt_get_f32(c2, dc, (size_t)R * N);
        strcat(what, " rerun");
        gt_expect_bits(what, c, c2, (size_t)R * N * 4);
    }
    gt_free(dxb); gt_free(dwb); gt_free(dc);
    free(x); free(w); free(c0); free(c); free(c2); free(ref);
}

int main(void)
{
    gt_init("test_gpu_moe");
    test_route(1, 8, 2, true);
    test_route(300, 8, 2, true);
    test_route(257, 128, 8, true);
    test_route(100, 60, 1, false);
    test_route(64, 6, 3, false);
    test_rows(37, 2, 8, 64, true);
    test_rows(200, 8, 128, 96, true);
    test_rows(50, 3, 6, 32, false);
    test_grouped(8, 32, 64, true, false);   /* gate / up: x Wᵀ */
    test_grouped(40, 96, 48, true, false);  /* 40 items: two launches of 32 */
    test_grouped(8, 32, 64, false, false);  /* dh = dy W_d */
    test_grouped(8, 64, 32, false, true);   /* dx += du W_u */
    return gt_finish();
}
