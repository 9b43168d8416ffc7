/* loss.h — per-token losses of docs/protocol.md §8 and their derivative with respect to the learner
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

#include "contract/contract.h"

#include <math.h>
#include <stdbool.h>

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

/* Overflow. A learner log-prob is at most 0 (lp = z − logsumexp z), and in a model whose
 * logits span less than 10^4 it is above LOSS_LP_FLOOR. loss_token_at_risk tells from the
 * inputs alone whether |ℓ| or |dℓ/dlp| of a token may reach LIMIT_LOSS for such an lp: the
 * ratio exp(lp − q) of importance_sampling and ppo is at most exp(−q), so a sampler
 * log-prob of −1000 with an advantage ≠ 0 may overflow float32, while ordinary inputs
 * never do. The executor runs the operations at risk without gradients first and fails
 * those whose loss is out of range, before their gradient is added anywhere. */
#define LOSS_LP_FLOOR (-1e4)

static inline bool loss_token_at_risk(const loss_spec *s, float w, float q, float adv)
{
    double A = fabs((double)adv), L = -LOSS_LP_FLOOR, lim = LIMIT_LOSS;
    double hi = fmax(fabs(s->clip_low), fabs(s->clip_high));
    if (s->kind == LOSS_CROSS_ENTROPY) return fabs((double)w) * L >= lim;
    if (A == 0.0) return false;                                       /* masked */
    switch (s->kind) {
    case LOSS_IMPORTANCE_SAMPLING:                                    /* |ℓ| = |dℓ/dlp| = r·A ≤ exp(−q)·A */
        return -(double)q + log(A) >= log(lim);
    case LOSS_PPO:                                                    /* ≤ max(exp(−q), hi)·A; exp(−q) only for A < 0 */
        return (adv < 0 && -(double)q + log(A) >= log(lim)) || hi * A >= lim;
    case LOSS_CISPO:                                                  /* |ℓ| ≤ hi·L·A, |dℓ/dlp| ≤ hi·A */
        return hi * L * A >= lim;
    case LOSS_DRO: {                                                  /* |ℓ| ≤ L·A + ½β(L + |q|)², |dℓ/dlp| ≤ A + β(L + |q|) */
        double d = L + fabs((double)q), b = fabs(s->beta);
        return L * A + 0.5 * b * d * d >= lim || A + b * d >= lim;
    }
    default:
        return true;
    }
}

#endif
