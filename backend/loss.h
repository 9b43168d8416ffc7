/* loss.h — per-token losses of spec §8 and their derivative with respect to the learner
 * log-prob. Every loss is a function of lp[i] alone (plus constant inputs), so a backend
 * needs only ℓ and dℓ/dlp per token; the chain rule through log-softmax does the rest.
 *
 *   cross_entropy        ℓ = −w·lp
 *   importance_sampling  ℓ = −r·A,                        r = exp(lp − q)
 *   ppo                  ℓ = −min(r·A, clip(r, lo, hi)·A)
 *   cispo                ℓ = −stopgrad(clip(r, lo, hi))·lp·A
 *   dro                  ℓ = −(lp·A − ½·β·(lp − q)²)
 * RL losses are masked (ℓ = 0, dℓ/dlp = 0) where A == 0: prompt positions are padded with
 * A = 0, q = 0, and exp(lp − q)·0 must not become inf·0 = NaN (as hosted_tinker does).
 */
#ifndef LOOM_BACKEND_LOSS_H
#define LOOM_BACKEND_LOSS_H

#include <math.h>

/* Losses of spec §8. */
typedef enum { LOSS_CROSS_ENTROPY, LOSS_IMPORTANCE_SAMPLING, LOSS_PPO, LOSS_CISPO, LOSS_DRO } loss_kind;

/* clip_low/clip_high: ratio bounds for ppo and cispo (default 0.8 / 1.2); beta: dro
 * (default 0.05). loss_spec_default() fills them. */
typedef struct {
    loss_kind kind;
    double clip_low, clip_high, beta;
} loss_spec;

loss_spec loss_spec_default(loss_kind kind);
/* "cross_entropy", "importance_sampling", "ppo", "cispo", "dro" → kind; -1 if unknown. */
int loss_kind_parse(const char *name, loss_kind *out);
const char *loss_kind_name(loss_kind kind);
/* True for the losses that need sampler_logprobs and advantages. */
int loss_needs_rl_inputs(loss_kind kind);

/* ℓ and dℓ/dlp of one token. lp: learner log-prob; w: CE weight; q: sampler log-prob;
 * adv: advantage. Computed in double: exp(lp − q) may be large before clipping. */
static inline void loss_token(const loss_spec *s, float lp, float w, float q, float adv, float *loss, float *dlp)
{
    if (s->kind == LOSS_CROSS_ENTROPY) {
        *loss = -w * lp;
        *dlp = -w;
        return;
    }
    if (adv == 0.0f) { *loss = 0.0f; *dlp = 0.0f; return; }
    double A = adv, l = lp, r = exp(l - (double)q);
    switch (s->kind) {
    case LOSS_IMPORTANCE_SAMPLING:
        *loss = (float)(-r * A);
        *dlp = (float)(-r * A);
        return;
    case LOSS_PPO: {
        double rc = r < s->clip_low ? s->clip_low : r > s->clip_high ? s->clip_high : r;
        double unclipped = r * A, clipped = rc * A;
        *loss = (float)(-(unclipped < clipped ? unclipped : clipped));
        /* The clipped branch is constant in lp outside [lo, hi] (and equal to the unclipped
         * one inside), so the gradient flows only where the unclipped term is the min. */
        *dlp = unclipped <= clipped ? (float)(-r * A) : 0.0f;
        return;
    }
    case LOSS_CISPO: {
        double rc = r < s->clip_low ? s->clip_low : r > s->clip_high ? s->clip_high : r;
        *loss = (float)(-rc * l * A);
        *dlp = (float)(-rc * A);
        return;
    }
    case LOSS_DRO: {
        double dq = l - (double)q;
        *loss = (float)(-(l * A - 0.5 * s->beta * dq * dq));
        *dlp = (float)(-(A - s->beta * dq));
        return;
    }
    default:
        *loss = 0.0f;
        *dlp = 0.0f;
    }
}

#endif
