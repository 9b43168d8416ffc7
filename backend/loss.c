/* loss.c — loss names and defaults (spec §8). The per-token math is inline in loss.h. */
#include "backend/loss.h"

#include <string.h>

static const char *const loss_names[] = {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"};

loss_spec loss_spec_default(loss_kind kind)
{
    /* PPO's documented ε = 0.2 on both sides, as ratio bounds; cispo assumed the same;
     * dro's β is undocumented, the docs' example uses 0.05. */
    loss_spec s = {.kind = kind, .clip_low = 0.8, .clip_high = 1.2, .beta = 0.05};
    return s;
}

int loss_kind_parse(const char *name, loss_kind *out)
{
    for (int i = 0; i < (int)(sizeof loss_names / sizeof loss_names[0]); i++)
        if (strcmp(name, loss_names[i]) == 0) { *out = (loss_kind)i; return 0; }
    return -1;
}

const char *loss_kind_name(loss_kind kind)
{
    return (unsigned)kind < sizeof loss_names / sizeof loss_names[0] ? loss_names[kind] : "?";
}

int loss_needs_rl_inputs(loss_kind kind) { return kind != LOSS_CROSS_ENTROPY; }
