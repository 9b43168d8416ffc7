/* adamw.h — AdamW exactly as torch.optim.AdamW (decoupled weight decay, bias correction,
 * eps added to the bias-corrected sqrt(v)), plus torch's clip_grad_norm_ rule. Plain loops
 * over flat arrays: the CPU backend calls these directly; a device backend has them as the
 * reference its kernels must match.
 * defines: adamw_check, adamw_grad_norm, adamw_clip_coef, adamw_update */
#ifndef LOOM_BACKEND_ADAMW_H
#define LOOM_BACKEND_ADAMW_H

#include <stddef.h>
#include <stdint.h>

/* Hyperparameters of one step (the api's AdamParams; torch.optim.AdamW's names). */
typedef struct {
    double learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm;
} adam_params;

/* Checks a step's hyperparameters (lr, eps, weight_decay, grad_clip_norm ≥ 0 and finite,
 * betas in [0, 1)). 0, or -1 with a message in err. */
int adamw_check(const adam_params *hp, char *err, size_t errlen);

/* Global L2 norm of g[0..n), accumulated in double. */
double adamw_grad_norm(const float *g, size_t n);

/* torch.nn.utils.clip_grad_norm_: the factor the gradients are multiplied by (1 when
 * max_norm ≤ 0 or the norm is already within it). */
double adamw_clip_coef(double grad_norm, double max_norm);

/* One step for n parameters. step = the step number after incrementing (1 for the first
 * step); grad_scale multiplies g on the fly (the clip coefficient). */
void adamw_update(float *p, const float *g, float *m, float *v, size_t n, const adam_params *hp, int64_t step,
                  double grad_scale);

#endif
