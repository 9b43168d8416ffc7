/* test_planner.c: the cycle planner (scheduler/planner.c) without a database: the rules of
 * docs/architecture.md, "Clock cycles": order per model and where a run ends (rule 1),
 * the token budget and its equal shares between tenants, rate limits (rule 3), a
 * forward_backward held for its optim_step and what a model's claims teach (rule 5),
 * samples as runs of one (rule 6); a scheduler's pass over several executors at once
 * (plan_pass); then invariants over many random inputs. */
#include "scheduler/planner.h"
#include "contract/contract.h"
#include "check.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- building inputs ---------------------------------------------------------------------- */

#define MAXM 64
#define MAXO 4096

static plan_model models[MAXM];
static plan_op ops[MAXO];
static plan_sample samples[MAXM];
static plan_rate rates[MAXM];
static int nm, no, ns, nr;
static int64_t next_id;

static void fresh(void) {
    memset(models, 0, sizeof models);
    memset(ops, 0, sizeof ops);
    nm = no = ns = nr = 0;
    next_id = 1;
}

/* A model of tenant, its queue starting at next_seq, nothing learned yet. */
static plan_model *model(int64_t tenant, int next_seq) {
    plan_model *m = &models[nm++];
    *m = (plan_model){.tenant = tenant, .next_seq = next_seq, .ops = &ops[no], .pair_p = 0.5, .pair_gap_ms = -1,
                      .tail_fb_ms = -1};
    return m;
}

/* Queues an operation on m (the model added last: a model's operations are one slice).
 * Old (an hour) unless age_ms says otherwise; returns its id. */
static int64_t op_aged(plan_model *m, int seq, const char *kind, int tokens, double age_ms) {
    plan_op *o = &ops[no++];
    *o = (plan_op){.id = next_id++, .seq = seq, .tokens = tokens, .age_ms = age_ms, .created_ms = 1e7 - age_ms};
    snprintf(o->kind, sizeof o->kind, "%s", kind);
    m->nops++;
    return o->id;
}
static int64_t op(plan_model *m, int seq, const char *kind, int tokens) { return op_aged(m, seq, kind, tokens, 3.6e6); }

static int64_t sample(int64_t tenant, int tokens) {
    samples[ns] = (plan_sample){.id = next_id++, .tenant = tenant, .tokens = tokens, .base_model = "base"};
    return samples[ns++].id;
}

static void rate(int64_t tenant, int64_t left) { rates[nr++] = (plan_rate){tenant, left}; }

static plan P;

static int round_hold; /* plan_input.round_hold_ms of decide (0: pair_hold_ms) */

static int decide(int budget, int pair_hold_ms) {
    plan_free(&P);
    plan_input in = {.budget = budget, .pair_hold_ms = pair_hold_ms, .round_hold_ms = round_hold, .rates = rates,
                     .nrates = nr, .models = models, .nmodels = nm, .samples = samples, .nsamples = ns};
    return plan_cycle(&in, &P);
}

static bool claimed(int64_t id) {
    for (int i = 0; i < P.nops; i++)
        if (P.ops[i] == id) return true;
    return false;
}

/* ---- rule 1: order per model --------------------------------------------------------------- */

static void test_order(void) {
    fresh();
    plan_model *a = model(1, 0);
    op(a, 0, OP_CREATE_MODEL, 0);
    op(a, 1, OP_FORWARD_BACKWARD, 10);
    op(a, 2, OP_OPTIM_STEP, 0);
    int64_t after = op(a, 3, OP_FORWARD_BACKWARD, 10);
    decide(1000, 0);
    CHECK(a->run == 3 && a->taken == 3 && P.nops == 3 && !claimed(after),
          "create_model, forward_backward, optim_step: the run ends after the step (run %d)", a->run);

    fresh();
    a = model(1, 4);
    op(a, 4, OP_FORWARD, 5);
    op(a, 5, OP_FORWARD_BACKWARD, 5);
    op(a, 7, OP_FORWARD_BACKWARD, 5);
    decide(1000, 0);
    CHECK(a->run == 2 && P.nops == 2, "a gap (seq 6 missing) stops the run (run %d)", a->run);

    fresh();
    a = model(1, 4);
    op(a, 5, OP_FORWARD, 5);
    decide(1000, 0);
    CHECK(a->run == 0 && P.nops == 0, "nothing runs while next_seq itself is missing");

    fresh();
    a = model(1, 0);
    op(a, 0, OP_FORWARD_BACKWARD, 5);
    op(a, 1, OP_CREATE_MODEL, 0);
    decide(1000, 0);
    CHECK(a->run == 1, "a create_model not first ends the run before it (run %d)", a->run);

    fresh();
    a = model(1, 0);
    op(a, 0, OP_FORWARD_BACKWARD, 5);
    op(a, 1, OP_OPTIM_STEP, 0);
    op(a, 2, OP_SAVE_WEIGHTS, 0);
    decide(1000, 0);
    CHECK(a->run == 2, "checkpoint work after a step waits for the next cycle (run %d)", a->run);

    fresh();
    a = model(1, 0);
    op(a, 0, OP_FORWARD_BACKWARD, 5);
    op(a, 1, OP_SAVE_FOR_SAMPLER, 0);
    op(a, 2, OP_FORWARD, 5);
    decide(1000, 0);
    CHECK(a->run == 2, "checkpoint work ends a run without a step: it is its last operation (run %d)", a->run);

    fresh();
    a = model(1, 0);
    op(a, 0, OP_LOAD_WEIGHTS, 0);
    op(a, 1, OP_FORWARD, 5);
    decide(1000, 0);
    CHECK(a->run == 1, "checkpoint work first runs alone (run %d)", a->run);
}

/* ---- rule 3: budget, fairness, rate limits -------------------------------------------------- */

static void test_budget(void) {
    fresh();
    plan_model *a = model(1, 0);
    for (int s = 0; s < 10; s++) op(a, s, OP_FORWARD, 30);
    decide(100, 0);
    CHECK(P.nops == 3 && P.tokens == 90 && a->taken == 3, "the budget caps the cycle (%d ops, %d tokens of 100)", P.nops,
          P.tokens);

    fresh();
    a = model(1, 0);
    op(a, 0, OP_FORWARD, 500);
    op(a, 1, OP_FORWARD, 1);
    decide(100, 0);
    CHECK(P.nops == 1 && P.tokens == 500, "an operation larger than the budget runs, alone (%d ops)", P.nops);

    fresh();
    a = model(1, 0);
    op(a, 0, OP_FORWARD, 10);
    plan_model *b = model(2, 0);
    int64_t big = op(b, 0, OP_FORWARD, 500);
    decide(100, 0);
    CHECK(P.nops == 1 && !claimed(big), "... but not after another: it waits to be first (%d ops)", P.nops);
}

static void test_fairness(void) {
    /* tenant 1 floods with two models, tenant 2 has two operations */
    fresh();
    plan_model *a1 = model(1, 1), *a2 = model(1, 1);
    for (int s = 1; s <= 5; s++) op(a1, s, OP_FORWARD, 20);
    for (int s = 1; s <= 5; s++) op(a2, s, OP_FORWARD, 20);
    plan_model *b = model(2, 1);
    op(b, 1, OP_FORWARD, 20);
    op(b, 2, OP_FORWARD, 20);
    decide(100, 0);
    CHECK(P.nops == 5 && P.tokens == 100 && b->taken == 2 && a1->taken + a2->taken == 3,
          "the small tenant gets its share beside a flood: %d of its 2; the flood %d", b->taken, a1->taken + a2->taken);
    CHECK(P.ops[0] == a1->ops[0].id && P.ops[1] == a1->ops[1].id, "the tenants take turns in the models' order");

    /* three tenants, equal shares of 90; what one leaves goes to the others next round */
    fresh();
    plan_model *t1 = model(1, 0), *t2 = model(2, 0), *t3 = model(3, 0);
    for (int s = 0; s < 10; s++) op(t1, s, OP_FORWARD, 10);
    for (int s = 0; s < 10; s++) op(t2, s, OP_FORWARD, 10);
    op(t3, 0, OP_FORWARD, 10);
    decide(90, 0);
    CHECK(t1->taken == 4 && t2->taken == 4 && t3->taken == 1 && P.tokens == 90,
          "shares of 30 each, then the 20 tenant 3 left split (%d, %d, %d)", t1->taken, t2->taken, t3->taken);

    /* more tenants than one round counts: all served in later rounds */
    fresh();
    int served = 0;
    static plan_sample many[300];
    for (int t = 0; t < 300; t++) many[t] = (plan_sample){.id = 1000 + t, .tenant = 100 + t, .tokens = 1};
    plan_free(&P);
    plan_input in = {.budget = 1000, .samples = many, .nsamples = 300};
    plan_cycle(&in, &P);
    for (int t = 0; t < 300; t++) served += claimed(1000 + t);
    CHECK(served == 300, "300 tenants with a sample each all get theirs (%d)", served);
}

static void test_rate_limits(void) {
    fresh();
    rate(1, 0);
    rate(2, -50);
    rate(3, 25);
    int64_t held[3];
    int nh = plan_held_tenants(rates, nr, held);
    CHECK(nh == 2 && held[0] == 1 && held[1] == 2, "tenants with no tokens left this minute are held (%d)", nh);

    plan_model *a = model(1, 0);
    op(a, 0, OP_FORWARD, 5);
    sample(2, 5);
    plan_model *c = model(3, 0);
    for (int s = 0; s < 5; s++) op(c, s, OP_FORWARD, 10);
    plan_model *d = model(4, 0);
    op(d, 0, OP_FORWARD, 10);
    decide(1000, 0);
    CHECK(a->taken == 0 && P.nops == 3, "a held tenant's candidates get nothing, even when read (%d ops)", P.nops);
    CHECK(c->taken == 2 && d->taken == 1, "one with 25 tokens left claims 2 operations of 10 (%d)", c->taken);

    fresh();
    rate(1, 5);
    a = model(1, 0);
    op(a, 0, OP_FORWARD, 40);
    op(a, 1, OP_FORWARD, 1);
    decide(1000, 0);
    CHECK(a->taken == 1, "its first operation may take more than it has left (then it waits out the minute)");
}

/* ---- rule 5: a step with its gradient -------------------------------------------------------- */

static void test_pairing(void) {
    /* a model whose optim_step follows: pair_p 0.8, 100 ms between the submits */
    fresh();
    plan_model *a = model(1, 0);
    a->pair_p = 0.8;
    a->pair_gap_ms = 100;
    op_aged(a, 0, OP_FORWARD_BACKWARD, 10, 50.5);
    decide(1000, 1000);
    CHECK(a->run == 0 && P.nops == 0 && P.held_ms == 251,
          "a fresh trailing forward_backward is held for 3 gaps + 1 ms from its submit (%d ms left)", P.held_ms);

    a->pair_gap_ms = -1;
    decide(1000, 200);
    CHECK(a->run == 0 && P.held_ms == 150, "an unknown gap holds for pair_hold_ms at most (%d ms left)", P.held_ms);
    decide(1000, 0);
    CHECK(a->run == 1 && P.held_ms == 0, "pair_hold_ms 0: never held");
    a->pair_gap_ms = 100;
    a->ops[0].age_ms = 400;
    decide(1000, 1000);
    CHECK(a->run == 1 && P.held_ms == 0, "one older than its window runs alone");

    fresh();
    a = model(1, 0);
    a->pair_p = 0.5;
    op_aged(a, 0, OP_FORWARD_BACKWARD, 10, 1);
    decide(1000, 1000);
    CHECK(a->run == 1, "a new model (pair_p 0.5) is not held");

    fresh();
    a = model(1, 0);
    a->pair_p = 0.9;
    op_aged(a, 0, OP_FORWARD_BACKWARD, 10, 1001);
    op_aged(a, 1, OP_OPTIM_STEP, 0, 1000.5);
    plan_model *b = model(1, 0);
    b->pair_p = 0.9;
    b->pair_gap_ms = 10;
    op_aged(b, 0, OP_FORWARD, 10, 1);
    op_aged(b, 1, OP_FORWARD_BACKWARD, 10, 20.5);
    plan_model *c = model(2, 0);
    c->pair_p = 0.9;
    c->pair_gap_ms = 20;
    op_aged(c, 0, OP_FORWARD_BACKWARD, 10, 1);
    decide(1000, 1000);
    CHECK(a->run == 2 && a->taken == 2, "with its optim_step there, both run in one cycle");
    CHECK(b->run == 0 && b->taken == 0, "a held run is held whole: its forward waits with its forward_backward");
    CHECK(c->run == 0 && P.held_ms == 11, "the cycle is looked at again when the first hold ends (%d ms)", P.held_ms);
    /* a round together: while b and c are held, a's fresh step waits with them */
    a->ops[0].age_ms = 1;
    a->ops[1].age_ms = 0.5;
    decide(1000, 1000);
    CHECK(P.nops == 0 && a->taken == 0 && P.held_ms == 11,
          "a fresh step waits while others are held for theirs, to share their cycle (%d ops, %d ms)", P.nops,
          P.held_ms);
    a->ops[0].age_ms = 995;
    decide(1000, 1000);
    CHECK(P.nops == 0 && P.held_ms == 5, "but no longer than pair_hold_ms from its submit (%d ms left)", P.held_ms);
    /* ... and no longer than round_hold_ms (a tenth of the executor's last cycle): then the
     * cycle runs what is eligible, the held models staying held */
    round_hold = 12;
    a->ops[0].age_ms = 5;
    decide(1000, 1000);
    CHECK(P.nops == 0 && P.held_ms == 7, "a fresh step waits round_hold_ms at most from its submit (%d ms left)",
          P.held_ms);
    a->ops[0].age_ms = 12.5;
    decide(1000, 1000);
    CHECK(a->taken == 2 && P.nops == 2 && b->taken == 0 && c->taken == 0 && P.held_ms == 11,
          "past round_hold_ms it runs, while b and c stay held for their steps (%d ops, %d ms)", P.nops, P.held_ms);
    round_hold = 2000;
    a->ops[0].age_ms = 995;
    decide(1000, 1000);
    CHECK(P.nops == 0 && P.held_ms == 5, "a round_hold_ms over pair_hold_ms waits pair_hold_ms (%d ms left)",
          P.held_ms);
    round_hold = 0;
    CHECK(plan_round_hold_ms(-1, 100) == 100 && plan_round_hold_ms(0, 100) == 100 &&
              plan_round_hold_ms(120, 100) == 12 && plan_round_hold_ms(121, 100) == 13 &&
              plan_round_hold_ms(3, 100) == 1 && plan_round_hold_ms(5000, 100) == 100,
          "the round wait: a tenth of the last cycle's compute, rounded up, within 1 .. pair_hold_ms; "
          "pair_hold_ms before a first cycle");
    sample(3, 5);
    a->ops[0].age_ms = 1;
    decide(1000, 1000);
    CHECK(a->taken == 2 && P.nops == 3, "a sample never waits: the cycle runs what is eligible (%d ops)", P.nops);

    /* learning: a forward_backward then an optim_step 30 ms later, claimed in one cycle */
    fresh();
    a = model(1, 0);
    op_aged(a, 0, OP_FORWARD_BACKWARD, 10, 3.6e6);
    op_aged(a, 1, OP_OPTIM_STEP, 0, 3.6e6 - 30);
    decide(1000, 1000);
    CHECK(fabs(a->pair_p - 0.65) < 1e-9 && fabs(a->pair_gap_ms - 30) < 1e-9 && a->tail_fb_ms == -1,
          "a step after a forward_backward: pair_p 0.5 -> 0.65, the gap learned (30 ms), no tail (%g, %g)", a->pair_p,
          a->pair_gap_ms);
    fresh();
    a = model(1, 0);
    a->pair_p = 0.65;
    a->pair_gap_ms = 30;
    op_aged(a, 0, OP_FORWARD_BACKWARD, 10, 3.6e6);
    op_aged(a, 1, OP_FORWARD_BACKWARD, 10, 3.6e6 - 10);
    decide(1000, 1000);
    CHECK(fabs(a->pair_p - 0.455) < 1e-9 && a->pair_gap_ms == 30 && a->tail_fb_ms == 1e7 - 3.6e6 + 10,
          "two forward_backwards in a row: pair_p falls (%g), the gap stays, the tail is the last one's submit",
          a->pair_p);
    /* the tail teaches across cycles: a step claimed later, 50 ms after that forward_backward */
    double tail = a->tail_fb_ms;
    fresh();
    a = model(1, 2);
    a->pair_p = 0.455;
    a->pair_gap_ms = 30;
    a->tail_fb_ms = tail;
    op_aged(a, 2, OP_OPTIM_STEP, 0, 1e7 - (tail + 50));
    decide(1000, 1000);
    CHECK(fabs(a->pair_p - 0.6185) < 1e-9 && fabs(a->pair_gap_ms - 36) < 1e-9 && a->tail_fb_ms == -1,
          "a step claimed in a later cycle still counts (pair_p %g, gap %g)", a->pair_p, a->pair_gap_ms);
    fresh();
    plan_model *other = model(2, 0);
    op(other, 0, OP_FORWARD, 1000);
    a = model(1, 0);
    a->pair_p = 0.8;
    a->pair_gap_ms = 1;
    a->tail_fb_ms = 5;
    op_aged(a, 0, OP_FORWARD_BACKWARD, 10, 10);
    decide(100, 1000);
    CHECK(a->run == 1 && a->taken == 0 && a->pair_p == 0.8 && a->tail_fb_ms == 5,
          "a model not claimed from (another's operation filled the budget) learns nothing");
}

/* ---- rule 6: samples ------------------------------------------------------------------------- */

static void test_samples(void) {
    fresh();
    plan_model *a = model(1, 0);
    for (int s = 0; s < 10; s++) op(a, s, OP_FORWARD, 10);
    int64_t s1 = sample(2, 10), s2 = sample(2, 10), s3 = sample(1, 10);
    decide(60, 0);
    CHECK(claimed(s1) && claimed(s2) && !claimed(s3) && a->taken == 4,
          "samples take their tenant's turn: tenant 2's two fit its share; tenant 1's waits behind its model (%d)",
          a->taken);
    CHECK(P.nops == 6 && P.ops[3] == s1 && P.ops[4] == s2 && P.ops[5] == a->ops[3].id,
          "turns: tenant 1 three, tenant 2 its samples, then tenant 1 the rest of the budget");
}

/* ---- invariants over random inputs ------------------------------------------------------------ */

static unsigned rs = 12345;
static unsigned rnd(unsigned n) { rs = rs * 1103515245u + 12345u; return (rs >> 8) % n; }

static void test_random(void) {
    static const char *kinds[] = {OP_FORWARD_BACKWARD, OP_FORWARD_BACKWARD, OP_FORWARD, OP_OPTIM_STEP, OP_SAVE_WEIGHTS,
                                  OP_CREATE_MODEL};
    int bad_prefix = 0, bad_budget = 0, bad_rate = 0, bad_dup = 0, bad_idle = 0, bad_sum = 0, cycles = 0;
    for (int iter = 0; iter < 3000; iter++) {
        fresh();
        int T = 1 + rnd(6), budget = 1 + rnd(200);
        for (int t = 1; t <= T; t++)
            if (rnd(3) == 0) rate(t, (int)rnd(80) - 10);
        int M = rnd(12);
        for (int i = 0; i < M; i++) {
            plan_model *m = model(1 + rnd(T), rnd(3));
            m->pair_p = rnd(4) * 0.3;
            m->pair_gap_ms = rnd(2) ? -1 : rnd(50);
            int seq = m->next_seq, n = rnd(10);
            for (int k = 0; k < n; k++) {
                seq += rnd(8) == 0;
                op_aged(m, seq++, kinds[rnd(6)], rnd(60), rnd(2) ? rnd(100) : 3.6e6);
            }
        }
        for (int k = rnd(5); k > 0; k--) sample(1 + rnd(T), rnd(60));
        int hold = rnd(2) ? 0 : 100;
        decide(budget, hold);
        cycles += P.nops > 0;
        /* each claimed operation's tenant and tokens, in the order claimed */
        static int64_t tenant_of[MAXO + MAXM + 2];
        static int tokens_of[MAXO + MAXM + 2];
        for (int i = 0; i < nm; i++)
            for (int k = 0; k < models[i].nops; k++) {
                tenant_of[models[i].ops[k].id] = models[i].tenant;
                tokens_of[models[i].ops[k].id] = models[i].ops[k].tokens;
            }
        for (int k = 0; k < ns; k++) {
            tenant_of[samples[k].id] = samples[k].tenant;
            tokens_of[samples[k].id] = samples[k].tokens;
        }
        for (int i = 0; i < nm; i++) {
            plan_model *m = &models[i];
            if (m->taken > m->run) bad_prefix++;
            for (int k = 0; k < m->nops; k++)
                if (claimed(m->ops[k].id) != (k < m->taken)) bad_prefix++;   /* exactly a prefix of the run */
        }
        int64_t tenant_tokens[8] = {0};
        int tenant_first[8], tokens = 0;
        for (int t = 0; t < 8; t++) tenant_first[t] = -1;
        for (int i = 0; i < P.nops; i++) {
            int64_t t = tenant_of[P.ops[i]];
            tokens += tokens_of[P.ops[i]];
            tenant_tokens[t] += tokens_of[P.ops[i]];
            if (tenant_first[t] < 0) tenant_first[t] = tokens_of[P.ops[i]];
            for (int j = i + 1; j < P.nops; j++) bad_dup += P.ops[i] == P.ops[j];
        }
        if (tokens != P.tokens) bad_sum++;
        if (P.tokens > budget && P.nops != 1) bad_budget++;   /* over the budget only alone */
        for (int r = 0; r < nr; r++) {
            int64_t t = rates[r].tenant;
            if (rates[r].left <= 0 && tenant_tokens[t] > 0) bad_rate++;
            /* past what it has left only with its first operation, alone */
            if (rates[r].left > 0 && tenant_tokens[t] > rates[r].left && tenant_tokens[t] != tenant_first[t]) bad_rate++;
        }
        /* work-conserving: with something eligible of a tenant not held, something runs,
         * unless it is a model's work younger than the hold, waiting for a held model's
         * optim_step to share its cycle (rule 5) */
        bool runnable = false, may_wait = P.held_ms > 0;
        for (int i = 0; i < nm; i++) {
            runnable |= models[i].run > 0;
            if (models[i].run > 0 && models[i].ops[0].age_ms >= hold) may_wait = false;
        }
        for (int k = 0; k < ns; k++) {
            bool held = false;
            for (int r = 0; r < nr; r++) held |= rates[r].tenant == samples[k].tenant && rates[r].left <= 0;
            runnable |= !held;
            if (!held) may_wait = false;
        }
        if (runnable && P.nops == 0 && !may_wait) bad_idle++;
    }
    CHECK(bad_prefix == 0, "3000 random inputs: each model's claim is a prefix of its run (%d bad)", bad_prefix);
    CHECK(bad_dup == 0 && bad_sum == 0, "no operation twice, tokens add up (%d, %d)", bad_dup, bad_sum);
    CHECK(bad_budget == 0, "never over the budget but for one operation alone (%d)", bad_budget);
    CHECK(bad_rate == 0, "rate limits hold (%d)", bad_rate);
    CHECK(bad_idle == 0 && cycles > 1000, "never an empty cycle while something may run but wait (%d; %d cycles)",
          bad_idle, cycles);
}

/* ---- a pass over several executors ---------------------------------------------------------- */

static bool in_cycle(const plan *p, int64_t id) {
    for (int i = 0; i < p->nops; i++)
        if (p->ops[i] == id) return true;
    return false;
}

static void test_pass(void) {
    /* two executors of base "base", one of "other": each its own models; a sample taken
     * once; a snapshot's sample only on its executor; a tenant's minute shared */
    fresh();
    plan_model *a = model(1, 0);
    int64_t a0 = op(a, 0, OP_FORWARD_BACKWARD, 10);
    int64_t a1 = op(a, 1, OP_OPTIM_STEP, 0);
    plan_model *b = model(2, 0);
    int64_t b0 = op(b, 0, OP_FORWARD_BACKWARD, 10);
    plan_model *r1 = model(3, 0);
    int64_t r10 = op(r1, 0, OP_FORWARD, 30);
    plan_model *r2 = model(3, 0);
    int64_t r20 = op(r2, 0, OP_FORWARD, 30);
    int64_t s_any = sample(4, 5);
    int64_t s_pinned = sample(5, 5);
    samples[ns - 1].executor = 11;   /* its snapshot is on executor 11 */
    int64_t s_other = sample(6, 5);
    samples[ns - 1].base_model = "other";
    rate(3, 30);                      /* tenant 3: 30 tokens left in its minute */
    plan_executor xs[3] = {{.id = 10, .base_model = "base", .budget = 1000, .models = &models[0], .nmodels = 1},
                           {.id = 11, .base_model = "base", .budget = 1000, .models = &models[1], .nmodels = 2},
                           {.id = 12, .base_model = "other", .budget = 1000, .models = &models[3], .nmodels = 1}};
    int held = 0, n = plan_pass(xs, 3, samples, ns, rates, nr, 0, &held);
    CHECK(in_cycle(&xs[0].cycle, a0) && in_cycle(&xs[0].cycle, a1) && !in_cycle(&xs[0].cycle, b0),
          "each executor claims its own models' runs (%d ops)", xs[0].cycle.nops);
    CHECK(in_cycle(&xs[1].cycle, b0) && in_cycle(&xs[1].cycle, r10), "the second its own (%d ops)", xs[1].cycle.nops);
    CHECK(in_cycle(&xs[0].cycle, s_any) && !in_cycle(&xs[1].cycle, s_any),
          "a sample any executor may run goes to the first only");
    CHECK(in_cycle(&xs[1].cycle, s_pinned) && !in_cycle(&xs[0].cycle, s_pinned),
          "a sample of a snapshot goes to the executor holding it");
    CHECK(in_cycle(&xs[2].cycle, s_other) && !in_cycle(&xs[0].cycle, s_other) && !in_cycle(&xs[1].cycle, s_other),
          "a sample goes to an executor of its base model");
    CHECK(!in_cycle(&xs[2].cycle, r20) && r2->taken == 0,
          "a tenant's minute is shared: its 30 tokens claimed on one executor, nothing on the next (%d)", r2->taken);
    CHECK(n == xs[0].cycle.nops + xs[1].cycle.nops + xs[2].cycle.nops && n == 7, "7 operations in all (%d)", n);
    for (int e = 0; e < 3; e++) plan_free(&xs[e].cycle);
}

int main(void) {
    test_order();
    test_budget();
    test_fairness();
    test_rate_limits();
    test_pairing();
    test_samples();
    test_pass();
    test_random();
    plan_free(&P);
    return check_summary();
}
