/* sched.h: the scheduler. Builds clock cycles for idle executors from queued
 * operations and reaps expired leases. Several schedulers may run at once: every
 * claim locks its executor and operation rows with FOR UPDATE SKIP LOCKED, its model rows
 * with FOR NO KEY UPDATE SKIP LOCKED (a FOR KEY SHARE goes on; a submit locks no model).
 * The loop is sched.c; a cycle's SQL cycle.c, its decisions planner.c; the reaper and
 * seq order reaper.c; placement place.c; session expiry sessions.c; every statement
 * sched_sql.h. */
#pragma once
#include "common/db.h"
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int lease_s;        /* a cycle's lease; the executor extends it while it works */
    int max_models;     /* models considered per cycle */
    int pair_hold_ms;   /* the longest a run ending in a forward_backward waits for the
                           optim_step its model usually sends right after it
                           (docs/architecture.md, rule 5) */
    /* An executor that builds its own cycle (executor/executor.c, "a cycle of its own"):
     * its statements in the pass's transaction. first[0..nfirst) right after BEGIN (its
     * UNLISTEN and asynchronous commit: undone with the pass when nothing is claimed);
     * start after the claims, before COMMIT (the cycle's start and the read of its
     * operations, with start_bin's result format), its result in *started when the pass
     * claimed (else NULL; the caller PQclears it). NULL / 0: none (the scheduler). */
    const char *const *first;
    int nfirst;
    const db_stmt *start;
    const db_bin *start_bin;
    PGresult **started;
    /* the base model of the executor `only` (sched_build_cycles), when the caller is that
     * executor: its models, samples and operations are read in the round trip that locks
     * it (two round trips in all instead of four). NULL: read after the lock. */
    const char *only_base;
} sched_opts;
#define SCHED_MAX_FIRST 4

/* The options an executor that claims its own cycles shares with the scheduler (lease-s,
 * pair-hold-ms; sched.c), for `loom executor` and `loom up` to take too. */
#include "common/config.h"
extern const opt_spec SCHED_CLAIM_OPTS[];

/* Builds the cycles of a pass: one for every idle executor (only: that executor alone; 0:
 * all) with eligible work, all in one transaction (cycle.c). Returns the number of
 * operations claimed in all (0 = none, the executors left idle) or -1 with err; *cycle_id
 * (may be NULL) the cycle of only, if one was built. *held (may be NULL; start it at 0):
 * when models are held back for their optim_step (rule 5), the ms until the first hold
 * ends, at most what it was: the caller should look again then. */
int sched_build_cycles(PGconn *c, int64_t only, const sched_opts *o, int64_t *cycle_id, int *held, char *err,
                       size_t errlen);
/* sched_build_cycles for one executor (the tests build cycles one by one). */
int sched_build_cycle(PGconn *c, int64_t executor_id, const sched_opts *o, int64_t *cycle_id,
                      int *held, char *err, size_t errlen);

/* A submit's hint with its details (CYCLE_HINT_QUEUED or CYCLE_HINT_PAIR, contract/
 * contract.h): one operation queued, and what an executor's own pass would read of it and
 * its model. */
typedef struct {
    bool pair;           /* CYCLE_HINT_PAIR: a forward_backward held for its optim_step */
    int64_t op, tenant;
    int seq, next_seq, tokens;
    bool limited;        /* the tenant has a rate limit (rule 3): the full pass decides */
    double created_ms, pair_p, pair_gap_ms, tail_fb_ms;
    char kind[32];
    char model[128];
} sched_hint;
/* payload as a hint with details: true with *h; false for anything else (a bare
 * "queued"). */
bool sched_hint_parse(const char *payload, sched_hint *h);

/* An executor's own pass from submits' hints (what woke it, idle): n operations of one
 * model in seq order from the model's next_seq (a lone operation; a held forward_backward
 * and its optim_step). The planner decides on them as it would on what the pass reads for
 * them alone (the same rules on the same figures: the executor's token budget, rule 5's
 * hold; their age from now on this machine's clock), and the claim is one round trip:
 * o->first, a guard, the claim and the model's advance as sched_build_cycles writes them,
 * o->start and COMMIT. The guard (SQL_OWN_HINT_GUARD) locks what the pass locks: the
 * executor, idle with that budget; the model, active, placed there, still at the first
 * seq_id, its tenant without a rate limit; the operations, queued; or refuses, and nothing
 * is written. Returns as sched_build_cycles (the operations claimed; 0 when the planner
 * held them, *held; -1 on a database error), or -2 when the guard refused or the hints do
 * not qualify (a gap, a rate-limited tenant, not one model's consecutive operations): the
 * caller runs the full pass. A pass that claimed nothing is rolled back here. */
int sched_build_own_hinted(PGconn *c, int64_t executor, const char *base_model, int budget, const sched_opts *o,
                           const sched_hint *h, int n, int *held, char *err, size_t errlen);

/* Expires cycles whose lease ran out or whose executor is gone, puts their model
 * operations back in the queue (their models' state is restored wherever they run next:
 * docs/architecture.md, "Durable training state"), requeues stateless samples, marks
 * executors silent for silence_s gone and unpins their models. judge_silence false: heartbeat age and
 * leases are not judged (right after the scheduler (re)connects: after a database outage
 * every heartbeat is old). Returns the number of rows changed or -1. */
int sched_reap(PGconn *c, bool judge_silence, int silence_s, char *err, size_t errlen);
/* Begins a transaction whose statements read live operations, with bitmap scans off
 * (SQL_NO_BITMAP, common_sql.h): the reaper, seq order, session expiry. -1 (nothing
 * open) on a database error. */
int sched_begin_live_reads(PGconn *c, char *err, size_t errlen);

/* Places models that wait for an executor (new ones, those moved off a gone or draining
 * executor, evicted ones) on the live, not draining executor of their base model with the
 * most adapter memory left; a placed model stays (affinity). Returns how many were placed,
 * or -1 with err. */
int sched_place(PGconn *c, int silence_s, char *err, size_t errlen);

/* Keeps seq order from wedging. sched_skip_settled moves each model's next_seq past
 * operations settled without running (submits the api refused); run it before building
 * cycles. sched_give_up_gaps fails the operations that have waited more than
 * gap_timeout_s for a missing seq_id (naming it), moves the model past them, and fails
 * operations that arrive for a seq_id a model has moved past. Both return the number of
 * rows changed or -1 with err. */
int sched_skip_settled(PGconn *c, char *err, size_t errlen);
int sched_give_up_gaps(PGconn *c, int gap_timeout_s, char *err, size_t errlen);

/* Sessions silent (no heartbeat, no submit) for timeout_s expire: their queued work is
 * canceled with a message, each active model's state is saved as the checkpoint
 * weights/session-expired, and then the model is 'expired' (its executor frees it).
 * Returns the rows changed or -1 with err. */
int sched_expire_sessions(PGconn *c, int timeout_s, char *err, size_t errlen);

int sched_main(int argc, char **argv);
/* Its options but --db, for `loom up` to take and pass through. */
#include "common/config.h"
extern const opt_spec SCHED_OPTS[];
