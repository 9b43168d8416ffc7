/* planner.h: what goes into an executor's next clock cycle (docs/architecture.md, "Clock
 * cycles": rule 1, order per model; rule 3, budget, fairness and rate limits; rule 5, a
 * step with its gradient; rule 6, samples). Pure: the candidates come in as plain structs,
 * the decisions go out in them; no database. cycle.c reads the candidates under their
 * locks and writes the plan; tests/test_planner.c tries the rules without a database. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

/* One queued operation of a model, or a sample. */
typedef struct {
    int64_t id;
    int seq;             /* seq_id (a sample: unused) */
    char kind[32];       /* OP_* of contract/contract.h */
    int tokens;
    double age_ms;       /* since its submit */
    double created_ms;   /* its submit, epoch ms */
} plan_op;

/* A model with work queued. The caller fills the inputs; plan_cycle the outputs and, for a
 * model it claimed from, the pattern it learned (rule 5; the caller stores it). */
typedef struct {
    const char *id;      /* the caller's: the planner does not read it */
    int64_t tenant;
    int next_seq;        /* the first seq_id not yet run */
    plan_op *ops;        /* its queued operations from next_seq on, in seq order (gaps possible) */
    int nops;
    /* rule 5: P(the operation after a forward_backward is an optim_step); the gap between
     * their submits (ms, -1: unknown); the submit of its last claimed operation when that
     * was a forward_backward (epoch ms, -1: none) */
    double pair_p, pair_gap_ms, tail_fb_ms;
    /* out */
    int run;             /* its eligible run (rule 1); 0 while held for its optim_step (rule 5)
                            or by its tenant's rate limit (rule 3) */
    int taken;           /* claimed: ops[0 .. taken), a prefix of the run; next_seq + taken follows */
} plan_model;

/* A queued sample (rule 6: no order between samples, each one a run of its own). */
typedef struct {
    int64_t id;
    int64_t tenant;
    int tokens;
    /* for plan_pass (plan_cycle does not read them): the base model it samples, and the
     * executor holding its sampler's snapshot when only that one may run it (0: any
     * executor of the base model) */
    const char *base_model;
    int64_t executor;
} plan_sample;

/* A tenant with a rate limit and the tokens it may still claim in this minute. */
typedef struct {
    int64_t tenant;
    int64_t left;
} plan_rate;

typedef struct {
    int budget;          /* the executor's token budget */
    int pair_hold_ms;    /* the longest a forward_backward waits for its optim_step (rule 5) */
    int round_hold_ms;   /* the longest the other models' work waits with a held one (rule 5,
                            a round together; plan_round_hold_ms); <= 0: pair_hold_ms */
    const plan_rate *rates;
    int nrates;
    plan_model *models;  /* the least recently served first: the order the tenants take turns in */
    int nmodels;
    const plan_sample *samples;   /* oldest first */
    int nsamples;
} plan_input;

typedef struct {
    int64_t *ops;        /* the claimed operations' ids, in the order claimed (malloc'd) */
    int nops;
    int tokens;          /* their tokens */
    int held_ms;         /* > 0: models are held for their optim_step; the first hold ends in
                            this many ms (rounded up), when the cycle is worth building again */
} plan;

/* Tenants held by their rate limit (no tokens left in this minute): nothing of theirs goes
 * into a cycle, so the caller need not even read it. Writes their ids to held (room for
 * nrates) and returns how many. */
int plan_held_tenants(const plan_rate *rates, int nrates, int64_t *held);

/* Decides the cycle: the operations in out (plan_free it), the runs and what was taken in
 * in->models. Returns out->nops (0: nothing to run now). */
int plan_cycle(plan_input *in, plan *out);
void plan_free(plan *p);

/* One idle executor of a scheduler's pass. */
typedef struct {
    int64_t id;
    const char *base_model;
    int budget;
    double last_compute_ms; /* its last cycle's compute (ms; <= 0: none yet): rule 5's round wait */
    plan_model *models;  /* the models placed on it with work queued, least recently served first */
    int nmodels;
    plan cycle;          /* out: its cycle (nops 0: none; plan_free it) */
} plan_executor;

/* How long rule 5 holds a forward_backward for its optim_step from its submit: about 3
 * of the model's gaps between the two + 1 ms (pair_hold_ms when the gap is unknown, < 0),
 * never longer than pair_hold_ms. */
double plan_pair_window_ms(double pair_gap_ms, int pair_hold_ms);

/* How long rule 5 lets the other models' work wait with a held one, for an executor whose
 * last cycle computed last_compute_ms: a tenth of that (at least 1 ms), so that gathering
 * a round idles the executor at most about a tenth of its working time, and never longer
 * than pair_hold_ms (which is also the wait before a first cycle, last_compute_ms <= 0). */
int plan_round_hold_ms(double last_compute_ms, int pair_hold_ms);

/* Decides the cycles of every idle executor of a pass at once, in the order given: each
 * executor's cycle as plan_cycle decides it from its own models and the samples it may run
 * (its base model's, rule 6) that an executor before it did not take, with the rate limits
 * left after what the executors before it claimed (rule 3: a tenant's minute is shared by
 * all executors). *held_ms as plan's held_ms over all (0: none). Returns the operations
 * claimed in all. */
int plan_pass(plan_executor *exes, int nexes, const plan_sample *samples, int nsamples, const plan_rate *rates,
              int nrates, int pair_hold_ms, int *held_ms);
