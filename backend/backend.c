/* backend.c — backend-independent helpers of the executor backend table. */
#include "backend/backend.h"
#include "backend/loss.h"

#include <stdarg.h>
#include <stdio.h>

static void be_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int exe_seq_check(const base_model *m, const exe_seq *s, char *err, size_t errlen)
{
    const model_config *mc = &m->cfg;
    if (s->n < 0) { be_err(err, errlen, "negative length"); return -1; }
    if (s->n == 0) return 0;
    if (!s->tokens || !s->targets) { be_err(err, errlen, "missing tokens or target_tokens"); return -1; }
    if (s->n > mc->max_position_embeddings) {
        be_err(err, errlen, "%d tokens exceed the model's context of %d", s->n, mc->max_position_embeddings);
        return -1;
    }
    if ((unsigned)s->loss.kind > LOSS_DRO) { be_err(err, errlen, "unknown loss"); return -1; }
    int K = s->k > 1 ? s->k : 1;
    if (s->k < 0 || s->k > (1 << 16) || (K > 1 && s->loss.kind != LOSS_CROSS_ENTROPY)) {
        be_err(err, errlen, "2-D target_tokens (k = %d) need cross_entropy", s->k);
        return -1;
    }
    if (loss_needs_rl_inputs(s->loss.kind) && (!s->sampler_logprobs || !s->advantages)) {
        be_err(err, errlen, "loss %s needs logprobs and advantages", loss_kind_name(s->loss.kind));
        return -1;
    }
    if ((s->loss.kind == LOSS_PPO || s->loss.kind == LOSS_CISPO) && !(s->loss.clip_low <= s->loss.clip_high)) {
        be_err(err, errlen, "clip_low_threshold %g > clip_high_threshold %g", s->loss.clip_low, s->loss.clip_high);
        return -1;
    }
    if (s->topk < 0 || s->topk > EXE_MAX_TOPK || s->topk > mc->vocab_size || (s->topk > 0 && (!s->topk_ids_out || !s->topk_lp_out))) {
        be_err(err, errlen, "topk %d outside 0..%d or without output buffers", s->topk, EXE_MAX_TOPK);
        return -1;
    }
    if (s->ad && !adapter_matches(s->ad, m)) { be_err(err, errlen, "adapter was made for another base model"); return -1; }
    for (int t = 0; t < s->n; t++)
        if (s->tokens[t] < 0 || s->tokens[t] >= mc->vocab_size) {
            be_err(err, errlen, "position %d: token id outside [0, %d)", t, mc->vocab_size);
            return -1;
        }
    for (long t = 0; t < (long)s->n * K; t++)
        if (s->targets[t] < 0 || s->targets[t] >= mc->vocab_size) {
            be_err(err, errlen, "target %ld: token id outside [0, %d)", t, mc->vocab_size);
            return -1;
        }
    return 0;
}
