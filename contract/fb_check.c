/* fb_check.c: the shared validation of a forward / forward_backward (fb_check.h). The
 * messages name the datum and field and say what to send instead. */
#include "contract/fb_check.h"
#include "common/err.h"
#include <math.h>

int fb_check_loss(const loss_spec *s, const char *where, char *err, size_t errlen) {
    for (int i = 0; i < LOSS_CONFIG_KEYS; i++) {
        double v = loss_config_get(s, i);
        if (loss_config_used(s->kind, i) && !(fabs(v) < LIMIT_ABS)) {
            err_set(err, errlen, "%s.loss_fn_config.%s: %g is out of range (|x| < 1e18)", where, loss_config_keys[i], v);
            return -1;
        }
    }
    if ((s->kind == LOSS_PPO || s->kind == LOSS_CISPO) && !(s->clip_low <= s->clip_high)) {
        err_set(err, errlen, "%s.loss_fn_config: clip_low_threshold %g is above clip_high_threshold %g; they are the "
                "bounds [low, high] the importance ratio is clipped to (defaults 0.8 and 1.2)", where, s->clip_low,
                s->clip_high);
        return -1;
    }
    return 0;
}

int fb_err_two_d(const char *where, const char *name, char *err, size_t errlen) {
    err_set(err, errlen, "%s.%s: 2-D loss inputs are supported only for target_tokens and weights with loss_fn "
            "cross_entropy (send one value per token)", where, name);
    return -1;
}

/* ids: int64 ids, or NULL and ids32. */
static int check_ids(const int64_t *ids, const int32_t *ids32, size_t n, size_t cols, int64_t vocab,
                     const char *where, const char *field, char *err, size_t errlen) {
    for (size_t p = 0; p < n; p++) {
        int64_t id = ids ? ids[p] : ids32[p];
        if (id >= 0 && id < vocab) continue;
        if (cols > 1)
            err_set(err, errlen, "%s.%s: token id %lld at [%zu, %zu] is outside the vocabulary [0, %lld)", where, field,
                    (long long)id, p / cols, p % cols, (long long)vocab);
        else
            err_set(err, errlen, "%s.%s: token id %lld at position %zu is outside the vocabulary [0, %lld)", where,
                    field, (long long)id, p, (long long)vocab);
        return -1;
    }
    return 0;
}

static int check_input(loss_kind loss, loss_input k, const fb_view_input *t, size_t n_tokens, const char *where,
                       char *err, size_t errlen) {
    const char *name = loss_input_names[k];
    if (!t->present) {
        if (!(loss_inputs_required(loss) & (1u << k))) return 0;
        err_set(err, errlen, "%s.loss_fn_inputs.%s is required by loss_fn \"%s\"", where, name, loss_kind_name(loss));
        return -1;
    }
    if (t->dims == 2 && !loss_input_two_d(loss, k)) {
        char w[160];
        err_set(w, sizeof w, "%s.loss_fn_inputs", where);
        return fb_err_two_d(w, name, err, errlen);
    }
    if (t->cols < 1 || t->cols > LIMIT_K) {
        err_set(err, errlen, "%s.loss_fn_inputs.%s has K = %zu columns; a 2-D loss input has shape [N, K] with "
                "1 <= K <= %d", where, name, t->cols, LIMIT_K);
        return -1;
    }
    if (t->values != n_tokens * t->cols) {
        if (t->dims == 2)
            err_set(err, errlen, "%s.loss_fn_inputs.%s has %zu values but shape [N, K] = [%zu, %zu] needs %zu (N the "
                    "number of input tokens)", where, name, t->values, n_tokens, t->cols, n_tokens * t->cols);
        else
            err_set(err, errlen, "%s.loss_fn_inputs.%s has %zu values but the model input has %zu tokens (one value "
                    "per input token)", where, name, t->values, n_tokens);
        return -1;
    }
    return 0;
}

/* 2-D cross_entropy: weights [N, K] go with target_tokens [N, K]. */
static int check_same_shape(const fb_view *d, const char *where, char *err, size_t errlen) {
    const fb_view_input *tt = &d->in[LOSS_IN_TARGET_TOKENS], *w = &d->in[LOSS_IN_WEIGHTS];
    if (!tt->present || !w->present || tt->cols == w->cols) return 0;
    size_t n = d->n_tokens;
    if (w->dims == 1)
        err_set(err, errlen, "%s.loss_fn_inputs.weights is 1-D but target_tokens has shape [%zu, %zu]: send weights "
                "with the same shape [%zu, %zu]", where, n, tt->cols, n, tt->cols);
    else if (tt->dims == 1)
        err_set(err, errlen, "%s.loss_fn_inputs.weights has shape [%zu, %zu] but target_tokens is 1-D: weights must "
                "have target_tokens' shape", where, n, w->cols);
    else
        err_set(err, errlen, "%s.loss_fn_inputs.weights has K = %zu columns but target_tokens has K = %zu: they must "
                "have the same shape [N, K]", where, w->cols, tt->cols);
    return -1;
}

int fb_check_datum(const fb_check_model *m, loss_kind loss, const fb_view *d, const char *where, char *err,
                   size_t errlen) {
    if ((unsigned)loss >= LOSS_N) {
        err_set(err, errlen, "%s: unknown loss", where);
        return -1;
    }
    if (d->n_tokens == 0) {
        err_set(err, errlen, "%s.model_input has no tokens", where);
        return -1;
    }
    if ((int64_t)d->n_tokens > m->max_context) {
        err_set(err, errlen, "%s: model input has %zu tokens, more than the base model's context length %lld", where,
                d->n_tokens, (long long)m->max_context);
        return -1;
    }
    if (check_ids(d->tokens, d->tokens32, d->n_tokens, 1, m->vocab_size, where, "model_input", err, errlen) < 0)
        return -1;
    for (int k = 0; k < LOSS_N_INPUTS; k++)
        if (check_input(loss, (loss_input)k, &d->in[k], d->n_tokens, where, err, errlen) < 0) return -1;
    const fb_view_input *tt = &d->in[LOSS_IN_TARGET_TOKENS];
    if (tt->present &&
        check_ids(d->targets, d->targets32, tt->values, tt->cols, m->vocab_size, where, "loss_fn_inputs.target_tokens",
                  err, errlen) < 0)
        return -1;
    return check_same_shape(d, where, err, errlen);
}
