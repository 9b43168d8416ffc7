/* adamw.c — torch.optim.AdamW semantics on flat fp32 arrays (moments fp32, math in double). */
#include "backend/adamw.h"

#include <math.h>
#include <stdio.h>

int adamw_check(const adam_params *hp, char *err, size_t errlen)
{
    if (hp->learning_rate >= 0 && hp->beta1 >= 0 && hp->beta1 < 1 && hp->beta2 >= 0 && hp->beta2 < 1 && hp->eps >= 0 &&
        hp->weight_decay >= 0 && hp->grad_clip_norm >= 0 && isfinite(hp->learning_rate) && isfinite(hp->eps) &&
        isfinite(hp->weight_decay) && isfinite(hp->grad_clip_norm))
        return 0;
    snprintf(err, errlen, "bad adam_params (need lr, eps, weight_decay, grad_clip_norm ≥ 0 and betas in [0, 1))");
    return -1;
}

double adamw_grad_norm(const float *g, size_t n)
{
    /* Four partial sums: keeps the loop pipelined and the rounding order fixed. */
    double s[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) s[k] += (double)g[i + k] * g[i + k];
    for (; i < n; i++) s[0] += (double)g[i] * g[i];
    return sqrt(s[0] + s[1] + s[2] + s[3]);
}

double adamw_clip_coef(double grad_norm, double max_norm)
{
    if (max_norm <= 0) return 1.0;
    double c = max_norm / (grad_norm + 1e-6); /* torch adds 1e-6 to the norm */
    return c < 1.0 ? c : 1.0;
}

void adamw_update(float *p, const float *g, float *m, float *v, size_t n, const adam_params *hp, int64_t step,
                  double grad_scale)
{
    const double lr = hp->learning_rate, b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps;
    const double decay = 1.0 - lr * hp->weight_decay;
    const double bc1 = 1.0 - pow(b1, (double)step), bc2_sqrt = sqrt(1.0 - pow(b2, (double)step));
    const double step_size = lr / bc1;
    for (size_t i = 0; i < n; i++) {
        double gi = (double)g[i] * grad_scale;
        double mi = b1 * m[i] + (1.0 - b1) * gi;
        double vi = b2 * v[i] + (1.0 - b2) * gi * gi;
        m[i] = (float)mi;
        v[i] = (float)vi;
        double denom = sqrt(vi) / bc2_sqrt + eps;
        p[i] = (float)((double)p[i] * decay - step_size * mi / denom);
    }
}
