/* test_gpu_adamw.c — the device AdamW step and gradient norm against the CPU backend's
 * backend/adamw.c (torch.optim.AdamW arithmetic): p, m, v bit for bit for the same inputs and
 * clip coefficient, over several steps; the sum of squares within 1e-12 of the CPU norm²
 * (another summation order) and bitwise on reruns; sizes that do not divide the blocks.
 */
#include "tests/gpu/gt.h"
#include "tests/gpu/twin.h"

#include "backend/adamw.h"

#include <math.h>
#include <string.h>

static void test_norm(size_t n, void *ws)
{
    float *g = malloc((n ? n : 1) * 4);
    gt_fill(g, n, -3, 3);
    void *dg = gt_dev_f32(g, n);
    double *dout = gt_dev_poison(8), a, b;
    GT_LCU(lcu_sumsq(dout, dg, n, ws, 0));
    gt_get(&a, dout, 8);
    GT_CUDA(cudaMemset(dout, 0xff, 8));
    GT_LCU(lcu_sumsq(dout, dg, n, ws, 0));
    gt_get(&b, dout, 8);
    double cpu = adamw_grad_norm(g, n);
    double err = fabs(sqrt(a) - cpu) / fmax(cpu, 1e-300);
    gt_check(n == 0 ? a == 0 : err < 1e-12, "sumsq n=%zu: sqrt %.17g vs cpu norm %.17g (rel %.3g)", n, sqrt(a), cpu, err);
    gt_expect_bits("sumsq rerun", &a, &b, 8);
    gt_free(dg);
    gt_free(dout);
    free(g);
}

static void test_steps(size_t n, void *ws)
{
    float *p = malloc(n * 4), *g = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4);
    gt_fill(p, n, -0.5, 0.5);
    gt_fill(m, n, -0.01, 0.01);
    gt_fill(v, n, 0, 1e-4);
    void *dp = gt_dev_f32(p, n), *dgr = gt_dev_poison(n * 4), *dm = gt_dev_f32(m, n), *dv = gt_dev_f32(v, n);
    double *dnorm = gt_dev_poison(8);
    adam_params hp = {gt_uniform(1e-5, 1e-2), 0.9, 0.999, 1e-8, gt_uniform(0, 0.1), gt_uniform(0.05, 2)};
    int64_t step0 = gt_int(0, 500);
    for (int s = 1; s <= 4; s++) {
        gt_fill(g, n, -1, 1);
        if (s == 3) for (size_t i = 0; i < n; i += 5) g[i] = 0.0f; /* zeros too */
        GT_CUDA(cudaMemcpy(dgr, g, n * 4, cudaMemcpyHostToDevice));
        double sq;
        GT_LCU(lcu_sumsq(dnorm, dgr, n, ws, 0));
        gt_get(&sq, dnorm, 8);
        /* the clip coefficient from the device norm, given to both sides */
        double coef = adamw_clip_coef(sqrt(sq), hp.grad_clip_norm);
        lcu_adamw_args a = {hp.learning_rate, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, step0 + s, coef};
        GT_LCU(lcu_adamw(dp, dgr, dm, dv, n, &a, 0));
        adamw_update(p, g, m, v, n, &hp, step0 + s, coef);
    }
    float *hp_ = malloc(n * 4), *hm = malloc(n * 4), *hv = malloc(n * 4);
    gt_get_f32(hp_, dp, n);
    gt_get_f32(hm, dm, n);
    gt_get_f32(hv, dv, n);
    char what[100];
    snprintf(what, sizeof what, "adamw 4 steps n=%zu: params == cpu", n);
    gt_expect_bits(what, hp_, p, n * 4);
    snprintf(what, sizeof what, "adamw 4 steps n=%zu: m == cpu", n);
    gt_expect_bits(what, hm, m, n * 4);
    snprintf(what, sizeof what, "adamw 4 steps n=%zu: v == cpu", n);
    gt_expect_bits(what, hv, v, n * 4);
    lcu_adamw_args bad = {1e-3, 0.9, 0.999, 1e-8, 0, 0, 1};
    gt_check(lcu_adamw(dp, dgr, dm, dv, n, &bad, 0) == LCU_EINVAL, "adamw step 0 refused");
    gt_free(dp); gt_free(dgr); gt_free(dm); gt_free(dv); gt_free(dnorm);
    free(p); free(g); free(m); free(v); free(hp_); free(hm); free(hv);
}

int main(void)
{
    gt_init("test_gpu_adamw");
    void *ws = gt_dev_poison(lcu_sumsq_workspace_bytes());
    test_norm(0, ws);
    test_norm(1, ws);
    test_norm((size_t)gt_int(2, 5000), ws);
    test_norm((size_t)gt_int(1000000, 9000000), ws);
    test_steps(1, ws);
    test_steps((size_t)gt_int(2, 3000), ws);
    test_steps((size_t)gt_int(1000000, 5000000), ws);
    gt_free(ws);
    return gt_finish();
}
