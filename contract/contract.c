/* contract.c: the loss table and the optimizer's accepted ranges of contract.h, and the ids
 * of sampled sequences. */
#include "contract/contract.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

#define BIT(i) (1u << (i))

static const char *const loss_names[LOSS_N] = {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"};
const char *const loss_input_names[LOSS_N_INPUTS] = {"target_tokens", "weights", "logprobs", "advantages"};
const char *const loss_config_keys[LOSS_CONFIG_KEYS] = {"clip_low_threshold", "clip_high_threshold", "beta"};

int loss_kind_parse(const char *name, loss_kind *out) {
    for (int i = 0; i < LOSS_N; i++)
        if (name && !strcmp(name, loss_names[i])) { *out = (loss_kind)i; return 0; }
    return -1;
}

const char *loss_kind_name(loss_kind kind) { return (unsigned)kind < LOSS_N ? loss_names[kind] : "?"; }

bool loss_needs_rl_inputs(loss_kind kind) { return kind != LOSS_CROSS_ENTROPY; }

unsigned loss_inputs_required(loss_kind kind) {
    return loss_needs_rl_inputs(kind) ? BIT(LOSS_IN_TARGET_TOKENS) | BIT(LOSS_IN_LOGPROBS) | BIT(LOSS_IN_ADVANTAGES)
                                      : BIT(LOSS_IN_TARGET_TOKENS);
}

unsigned loss_inputs_accepted(loss_kind kind) {
    return loss_needs_rl_inputs(kind) ? loss_inputs_required(kind) : BIT(LOSS_IN_TARGET_TOKENS) | BIT(LOSS_IN_WEIGHTS);
}

bool loss_input_two_d(loss_kind kind, loss_input in) {
    return kind == LOSS_CROSS_ENTROPY && (in == LOSS_IN_TARGET_TOKENS || in == LOSS_IN_WEIGHTS);
}

loss_spec loss_spec_default(loss_kind kind) {
    /* PPO's documented ε = 0.2 on both sides, as ratio bounds; cispo assumed the same;
     * dro's β is undocumented, the docs' example uses 0.05 (docs/protocol.md §8). */
    return (loss_spec){.kind = kind, .clip_low = 0.8, .clip_high = 1.2, .beta = 0.05};
}

bool loss_config_used(loss_kind kind, int i) {
    if (kind == LOSS_PPO || kind == LOSS_CISPO) return i == 0 || i == 1;
    return kind == LOSS_DRO && i == 2;
}

static double *config_slot(loss_spec *s, int i) {
    return i == 0 ? &s->clip_low : i == 1 ? &s->clip_high : &s->beta;
}

double loss_config_get(const loss_spec *s, int i) { return i == 0 ? s->clip_low : i == 1 ? s->clip_high : s->beta; }

void loss_config_set(loss_spec *s, const char *key, double v) {
    for (int i = 0; i < LOSS_CONFIG_KEYS; i++)
        if (!strcmp(key, loss_config_keys[i]) && loss_config_used(s->kind, i)) *config_slot(s, i) = v;
}

int sample_sequence_id(char *out, size_t n, const char *request_id, int index) {
    return snprintf(out, n, "%s:%d", request_id, index);
}

int optim_param_check(const char *name, double v, char *err, size_t errlen) {
    static const struct {
        const char *name;
        double lo, hi;
        bool lo_open, hi_open;
        const char *rule;
    } r[] = {
        {"learning_rate", 0, 10, false, false, "must be in [0, 10]"},
        {"beta1", 0, 1, false, true, "must be in [0, 1)"},
        {"beta2", 0, 1, false, true, "must be in [0, 1)"},
        {"eps", 0, 1, true, false, "must be in (0, 1]"},
        {"weight_decay", 0, 10, false, false, "must be in [0, 10]"},
        {"grad_clip_norm", 0, LIMIT_ABS, false, true, "must be >= 0 and < 1e18 (0: no clipping)"},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        if (strcmp(r[i].name, name)) continue;
        bool ok = isfinite(v) && (r[i].lo_open ? v > r[i].lo : v >= r[i].lo) &&
                  (r[i].hi_open ? v < r[i].hi : v <= r[i].hi);
        if (ok) return 0;
        snprintf(err, errlen, "%s %s, got %g", name, r[i].rule, v);
        return -1;
    }
    return 0;
}
