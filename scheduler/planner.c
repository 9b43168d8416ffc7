/* planner.c: deciding a clock cycle (see planner.h; docs/architecture.md, "Clock cycles").
 *
 * Per model, operations run in seq order from next_seq; a gap stops the model
 * (out-of-order arrivals wait). A model contributes a run: create_model first if pending,
 * then forward/forward_backward operations, then at most one optim_step, after which its
 * run ends (later work must see the new weights and waits for the next cycle). A run that
 * ends in a forward_backward is held back for its optim_step when the model has shown that
 * one follows (hold_left). The token budget is shared between tenants round-robin: each
 * round every tenant with work left may add operations up to an equal share, so a tenant
 * with a huge backlog cannot starve a small one. A single operation larger than the budget
 * still runs, alone. */
#include "scheduler/planner.h"
#include "contract/contract.h"
#include "common/xalloc.h"
#include <stdio.h>
#include <string.h>

/* Length of the eligible run of a model's queued operations (rule 1). */
static int eligible_run(const plan_model *m) {
    int n = 0, seq = m->next_seq;
    bool seen_step = false;
    for (int i = 0; i < m->nops && !seen_step; i++) {
        if (m->ops[i].seq != seq) break;   /* gap: wait for the missing operation */
        const char *k = m->ops[i].kind;
        if (!strcmp(k, OP_CREATE_MODEL)) {
            if (i != 0) break;
        } else if (!strcmp(k, OP_OPTIM_STEP)) {
            seen_step = true;
        } else if (strcmp(k, OP_FORWARD) && strcmp(k, OP_FORWARD_BACKWARD)) {
            /* checkpoint / sampler work: runs after the step, alone at the end of the run */
            if (n > 0) { n++; break; }
            seen_step = true;
        }
        n++;
        seq++;
    }
    return n;
}

/* Rule 5, learned per model: a run ending in a forward_backward is held for the
 * optim_step only when the model's history says one follows (pair_p > 0.5), and only for
 * about the gap its client leaves between the two submits (3 gaps + 1 ms), never longer
 * than pair_hold_ms. A new model is not held (its first step may take two cycles); a
 * model that sends forward_backwards alone, or accumulates gradients over several, is
 * never held once it has shown it. Returns the hold left in ms (<= 0: none). */
double plan_pair_window_ms(double pair_gap_ms, int pair_hold_ms) {
    double window = pair_gap_ms >= 0 ? 3 * pair_gap_ms + 1 : pair_hold_ms;
    return window > pair_hold_ms ? pair_hold_ms : window;
}

static double hold_left(const plan_model *m, const plan_op *last, int pair_hold_ms) {
    if (pair_hold_ms <= 0 || strcmp(last->kind, OP_FORWARD_BACKWARD) || m->pair_p <= 0.5) return 0;
    return plan_pair_window_ms(m->pair_gap_ms, pair_hold_ms) - last->age_ms;
}

#define PAIR_ALPHA 0.3   /* weight of the newest observation in the moving averages */

/* Learns from the operations of m claimed now (ops[0 .. taken)), after its previous claim. */
static void learn_pattern(plan_model *m) {
    for (int i = 0; i < m->taken; i++) {
        const plan_op *q = &m->ops[i];
        if (m->tail_fb_ms >= 0) {
            bool hit = !strcmp(q->kind, OP_OPTIM_STEP);
            m->pair_p = (1 - PAIR_ALPHA) * m->pair_p + PAIR_ALPHA * (hit ? 1 : 0);
            double gap = q->created_ms - m->tail_fb_ms;
            if (hit && gap >= 0) m->pair_gap_ms = m->pair_gap_ms < 0 ? gap : (1 - PAIR_ALPHA) * m->pair_gap_ms + PAIR_ALPHA * gap;
        }
        m->tail_fb_ms = !strcmp(q->kind, OP_FORWARD_BACKWARD) ? q->created_ms : -1;
    }
}

int plan_held_tenants(const plan_rate *rates, int nrates, int64_t *held) {
    int n = 0;
    for (int i = 0; i < nrates; i++)
        if (rates[i].left <= 0) held[n++] = rates[i].tenant;
    return n;
}

/* What the round-robin takes turns over: a model's run, or a sample (a run of one). */
typedef struct {
    const plan_op *ops;
    int n, taken;
    int64_t tenant;
} run;

/* A tenant's rate limit in this cycle. */
typedef struct {
    int64_t left;     /* tokens it may still claim */
    bool claimed;     /* it claimed something already in this cycle */
} rate_left;

/* The tenants counted in one round; a tenant past the first this many with work left
 * waits for a later round (a cycle reads at most 256 models and 256 samples). */
#define MAX_TENANTS_PER_ROUND 256

/* Rule 3: a tenant held by its rate limit gets nothing (its candidates are usually not
 * even read). */
static bool rate_held(const plan_input *in, int64_t tenant) {
    for (int k = 0; k < in->nrates; k++)
        if (in->rates[k].tenant == tenant && in->rates[k].left <= 0) return true;
    return false;
}

int plan_cycle(plan_input *in, plan *out) {
    *out = (plan){0};
    int nruns = in->nmodels + in->nsamples;
    run *runs = xcalloc((size_t)nruns, sizeof *runs);
    plan_op *sample_ops = xcalloc((size_t)in->nsamples, sizeof *sample_ops);
    size_t cap = 0;
    for (int i = 0; i < in->nmodels; i++) {
        plan_model *m = &in->models[i];
        m->taken = 0;
        m->run = rate_held(in, m->tenant) ? 0 : eligible_run(m);
        /* rule 5: a run that ends in a fresh forward_backward of a model whose optim_step
         * usually follows at once is held briefly, so that both share a cycle */
        if (m->run > 0) {
            double left = hold_left(m, &m->ops[m->run - 1], in->pair_hold_ms);
            if (left > 0) {
                m->run = 0;
                if (out->held_ms <= 0 || left < out->held_ms) out->held_ms = (int)left + 1;
            }
        }
        runs[i] = (run){m->ops, m->run, 0, m->tenant};
        cap += (size_t)m->run;
    }
    for (int k = 0; k < in->nsamples; k++) {
        const plan_sample *s = &in->samples[k];
        sample_ops[k] = (plan_op){.id = s->id, .tokens = s->tokens};
        snprintf(sample_ops[k].kind, sizeof sample_ops[k].kind, "%s", OP_SAMPLE);
        runs[in->nmodels + k] = (run){&sample_ops[k], rate_held(in, s->tenant) ? 0 : 1, 0, s->tenant};
        cap += (size_t)runs[in->nmodels + k].n;
    }
    /* Rule 5, a round together: while a model is held for its optim_step, the cycle waits
     * for it (the steps of many clients stepping in lockstep go in one cycle, not spread
     * over the cycles their submits happen to straddle), but no model's work waits longer
     * than round_hold_ms from its submit (a tenth of the executor's last cycle: the
     * clients' turnaround must not idle it for longer), and samples never wait. The
     * scheduler looks again when the first hold ends. */
    if (out->held_ms > 0) {
        double oldest = 0;
        bool samples = false;
        int round = in->round_hold_ms > 0 && in->round_hold_ms < in->pair_hold_ms ? in->round_hold_ms
                                                                                   : in->pair_hold_ms;
        for (int i = 0; i < in->nmodels; i++)
            if (in->models[i].run > 0 && in->models[i].ops[0].age_ms > oldest) oldest = in->models[i].ops[0].age_ms;
        for (int k = 0; k < in->nsamples; k++) samples |= runs[in->nmodels + k].n > 0;
        if (!samples && oldest < round) {
            int left = round - (int)oldest;
            if (left < out->held_ms) out->held_ms = left;
            for (int i = 0; i < in->nmodels; i++) in->models[i].taken = 0;
            free(sample_ops);
            free(runs);
            return 0;
        }
    }
    /* Rule 3: a tenant with a rate limit claims at most the tokens it has left, but its
     * first operation of the cycle may take more (one larger than a minute's tokens still
     * runs: the tenant then waits out the minute). */
    rate_left *rates = xcalloc((size_t)in->nrates, sizeof *rates);
    for (int k = 0; k < in->nrates; k++) rates[k] = (rate_left){in->rates[k].left, false};
    out->ops = xcalloc(cap, sizeof *out->ops);

    /* Round-robin over tenants by equal token shares. */
    int budget = in->budget, used = 0;
    int64_t tenants[MAX_TENANTS_PER_ROUND];
    bool progress = true;
    while (progress && used < budget) {
        progress = false;
        int nt = 0;
        for (int i = 0; i < nruns; i++) {
            if (runs[i].taken >= runs[i].n) continue;
            bool seen = false;
            for (int t = 0; t < nt; t++) seen |= tenants[t] == runs[i].tenant;
            if (!seen && nt < MAX_TENANTS_PER_ROUND) tenants[nt++] = runs[i].tenant;
        }
        if (nt == 0) break;
        int share = (budget - used) / nt;
        if (share < 1) share = 1;
        for (int t = 0; t < nt && used < budget; t++) {
            int tused = 0;
            rate_left *rl = NULL;   /* the tenant's rate limit, if it has one */
            for (int k = 0; k < in->nrates; k++) if (in->rates[k].tenant == tenants[t]) rl = &rates[k];
            for (int i = 0; i < nruns; i++) {
                run *r = &runs[i];
                if (r->tenant != tenants[t]) continue;
                while (r->taken < r->n) {
                    const plan_op *q = &r->ops[r->taken];
                    bool first_of_cycle = out->nops == 0;
                    if (!first_of_cycle && (tused + q->tokens > share || used + q->tokens > budget)) break;
                    if (rl && q->tokens > rl->left && rl->claimed) break;
                    out->ops[out->nops++] = q->id;
                    tused += q->tokens;
                    used += q->tokens;
                    if (rl) { rl->left -= q->tokens; rl->claimed = true; }
                    r->taken++;
                    progress = true;
                }
            }
        }
    }
    out->tokens = used;
    for (int i = 0; i < in->nmodels; i++) {
        in->models[i].taken = runs[i].taken;
        if (runs[i].taken) learn_pattern(&in->models[i]);
    }
    free(rates);
    free(sample_ops);
    free(runs);
    return out->nops;
}

void plan_free(plan *p) {
    free(p->ops);
    *p = (plan){0};
}

int plan_round_hold_ms(double last_compute_ms, int pair_hold_ms) {
    if (last_compute_ms <= 0) return pair_hold_ms;
    double r = last_compute_ms / 10;
    if (r >= pair_hold_ms) return pair_hold_ms;
    int ms = (int)r + (r > (int)r); /* rounded up */
    return ms < 1 ? 1 : ms;
}

int plan_pass(plan_executor *exes, int nexes, const plan_sample *samples, int nsamples, const plan_rate *rates,
              int nrates, int pair_hold_ms, int *held_ms) {
    bool *taken = xcalloc((size_t)nsamples, sizeof *taken);
    plan_sample *mine = xcalloc((size_t)nsamples, sizeof *mine);
    int *mine_at = xcalloc((size_t)nsamples, sizeof *mine_at);
    plan_rate *left = xcalloc((size_t)nrates, sizeof *left);
    for (int k = 0; k < nrates; k++) left[k] = rates[k];
    int total = 0;
    *held_ms = 0;
    for (int e = 0; e < nexes; e++) {
        plan_executor *x = &exes[e];
        int nmine = 0;
        for (int k = 0; k < nsamples; k++) {
            const plan_sample *s = &samples[k];
            if (taken[k] || strcmp(s->base_model, x->base_model) || (s->executor && s->executor != x->id)) continue;
            mine_at[nmine] = k;
            mine[nmine++] = *s;
        }
        plan_input in = {.budget = x->budget,
                         .pair_hold_ms = pair_hold_ms,
                         .round_hold_ms = plan_round_hold_ms(x->last_compute_ms, pair_hold_ms),
                         .rates = left,
                         .nrates = nrates,
                         .models = x->models,
                         .nmodels = x->nmodels,
                         .samples = mine,
                         .nsamples = nmine};
        plan_cycle(&in, &x->cycle);
        if (x->cycle.held_ms > 0 && (*held_ms <= 0 || x->cycle.held_ms < *held_ms)) *held_ms = x->cycle.held_ms;
        total += x->cycle.nops;
        /* what this cycle claimed is no one else's: its samples, and its tokens of each
         * tenant's minute */
        for (int i = 0; i < x->cycle.nops; i++)
            for (int j = 0; j < nmine; j++)
                if (mine[j].id == x->cycle.ops[i]) {
                    taken[mine_at[j]] = true;
                    for (int k = 0; k < nrates; k++)
                        if (left[k].tenant == mine[j].tenant) left[k].left -= mine[j].tokens;
                }
        for (int i = 0; i < x->nmodels; i++) {
            const plan_model *m = &x->models[i];
            for (int k = 0; k < nrates; k++)
                if (left[k].tenant == m->tenant)
                    for (int j = 0; j < m->taken; j++) left[k].left -= m->ops[j].tokens;
        }
    }
    free(left);
    free(mine_at);
    free(mine);
    free(taken);
    return total;
}
