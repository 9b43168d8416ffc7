/* test_scheduler.c: the scheduler's cycle building and reaping against a real
 * PostgreSQL cluster started for this test (Unix socket under /tmp, removed after).
 * Checks seq-order with gaps, the forward_backward + optim_step rule, the token budget
 * shared between tenants, two schedulers racing for the same work, and the reaper. */
#include "scheduler/sched.h"
#include "scheduler/sched_sql.h"
#include "check.h"
#include "dbtest.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


static void reset(void) {
    sql("TRUNCATE operations, cycles, models, sessions, executors, base_models, api_keys, tenants RESTART IDENTITY CASCADE");
    sql("INSERT INTO tenants (name) VALUES ('a'), ('b')");
    sql("INSERT INTO base_models (name, path, arch, max_context, vocab_size, config)"
        " VALUES ('m', '/x', 'LlamaForCausalLM', 128, 256, '{}')");
    sql("INSERT INTO sessions (id, tenant_id) VALUES ('sa', 1), ('sb', 2)");
    sql("INSERT INTO executors (name, hostname, pid, backend, device, base_model, token_budget)"
        " VALUES ('e1', 'h', 1, 'cpu', 'cpu', 'm', 100), ('e2', 'h', 2, 'cpu', 'cpu', 'm', 100)");
}

static void model(const char *id, int tenant) {
    char q[512];
    snprintf(q, sizeof q, "INSERT INTO models (id, tenant_id, session_id, model_seq_id, base_model, lora_rank,"
             " lora_seed, train_attn, train_mlp, train_unembed) VALUES ('%s', %d, '%s', %ld, 'm', 8, 1, true, true, true)",
             id, tenant, tenant == 1 ? "sa" : "sb", scalar("SELECT count(*) FROM models"));
    sql(q);
}

static void op(const char *model, int seq, const char *kind, int tokens) {
    char q[512];
    int tenant = (int)(model[0] == 'b' ? 2 : 1);
    snprintf(q, sizeof q, "INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, n_tokens)"
             " VALUES ('%s-%d', %d, '%s', %d, '%s', '{}', %d)", model, seq, tenant, model, seq, kind, tokens);
    sql(q);
}

/* Builds a cycle for executor exe, after placing the models that wait for a place there
 * (placement itself is test_placement's subject). */
static int build(int64_t exe, int64_t *cycle) {
    char err[512], q[160];
    snprintf(q, sizeof q, "UPDATE models SET executor_id = %lld WHERE executor_id IS NULL AND status = 'active'",
             (long long)exe);
    sql(q);
    sched_opts o = {.lease_s = 60, .max_models = 64, .pair_hold_ms = 0};
    int n = sched_build_cycle(C, exe, &o, cycle, NULL, err, sizeof err);
    if (n < 0) fprintf(stderr, "build: %s\n", err);
    return n;
}

static void finish_cycle(int64_t cycle) {
    char q[256];
    snprintf(q, sizeof q, "UPDATE operations SET state = 'done' WHERE cycle_id = %lld", (long long)cycle);
    sql(q);
    snprintf(q, sizeof q, "UPDATE cycles SET state = 'done' WHERE id = %lld", (long long)cycle);
    sql(q);
    sql("UPDATE executors SET state = 'idle'");
}

static void test_order_and_steps(void) {
    reset();
    model("a1", 1);
    op("a1", 0, "create_model", 0);
    op("a1", 1, "forward_backward", 10);
    op("a1", 2, "optim_step", 0);
    op("a1", 3, "forward_backward", 10);
    op("a1", 5, "forward_backward", 10);   /* gap at 4 */
    int64_t cyc;
    int n = build(1, &cyc);
    CHECK(n == 3, "create + forward_backward + optim_step in one cycle, stop after the step (got %d)", n);
    CHECK(scalar("SELECT count(*) FROM operations WHERE state='claimed' AND seq_id IN (0,1,2)") == 3,
          "claimed seq 0..2");
    CHECK(scalar("SELECT next_seq FROM models WHERE id='a1'") == 3, "next_seq advanced to 3");
    CHECK(scalar("SELECT (state = 'busy')::int FROM executors WHERE id=1") == 1, "executor marked busy");
    int n2 = build(1, &cyc);
    CHECK(n2 == 0, "a busy executor gets no second cycle (got %d)", n2);
    finish_cycle(cyc);
    n = build(1, &cyc);
    CHECK(n == 1, "seq 3 runs, seq 5 waits for the gap at 4 (got %d)", n);
    finish_cycle(cyc);
    n = build(1, &cyc);
    CHECK(n == 0, "nothing eligible while seq 4 is missing (got %d)", n);
    op("a1", 4, "forward", 10);
    n = build(1, &cyc);
    CHECK(n == 2, "gap filled: seq 4 and 5 run together (got %d)", n);
}

/* Round trips c makes while fn runs: each ends with a message that asks the server to
 * answer (Sync, or a simple Query), counted in libpq's trace of the connection. */
static int round_trips(PGconn *c, void (*fn)(void *), void *arg) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    PQtrace(c, f);
    PQsetTraceFlags(c, PQTRACE_SUPPRESS_TIMESTAMPS);
    fn(arg);
    PQuntrace(c);
    fclose(f);
    int n = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
        if (!strncmp(line, "F\t", 2) && (strstr(line, "\tSync") || strstr(line, "\tQuery\t"))) n++;
    free(buf);
    return n;
}

typedef struct { int64_t exe; int n; int64_t cycle; const char *base; } build_arg;
static void build_fn(void *p) {
    build_arg *a = p;
    char err[512];
    sched_opts o = {.lease_s = 60, .max_models = 64, .pair_hold_ms = 0, .only_base = a->base};
    a->n = sched_build_cycle(C, a->exe, &o, &a->cycle, NULL, err, sizeof err);
    if (a->n < 0) fprintf(stderr, "build: %s\n", err);
}

/* The cycle build's round trips (docs/architecture.md, "One forward_backward, end to end"): four when it
 * claims (lock the executor and read the rate limits; lock models and samples; lock
 * their operations; claim, advance, notify and commit), fewer when it finds nothing. The
 * statements are prepared by a first build (a round trip each, once per connection). */
static void test_round_trips(void) {
    reset();
    sql("INSERT INTO tenant_limits (tenant_id, tokens_per_minute) VALUES (2, 1000)");
    model("a1", 1);
    model("b1", 2);
    sql("UPDATE models SET executor_id = 1");
    op("a1", 0, "create_model", 0);
    op("b1", 0, "create_model", 0);
    build_arg a = {.exe = 1};
    build_fn(&a);   /* prepares */
    finish_cycle(a.cycle);
    op("a1", 1, "forward_backward", 10);
    op("b1", 1, "forward_backward", 10);
    op("b1", 2, "optim_step", 0);
    int rt = round_trips(C, build_fn, &a);
    CHECK(a.n == 3 && rt == 4, "a cycle of 3 operations of 2 tenants is built in 4 round trips (%d ops, %d trips)", a.n, rt);
    rt = round_trips(C, build_fn, &a);
    CHECK(a.n == 0 && rt == 2, "a busy executor: 2 round trips (the lock finds it busy; rollback) (%d trips)", rt);
    finish_cycle(a.cycle);
    rt = round_trips(C, build_fn, &a);
    CHECK(a.n == 0 && rt == 3, "nothing queued: 3 round trips (executor; models and samples; rollback) (%d trips)", rt);

    /* an executor's own pass (it names its base model): the reads go with the lock */
    build_arg own = {.exe = 1, .base = "m"};
    op("a1", 2, "forward_backward", 10);
    build_fn(&own); /* prepares */
    finish_cycle(own.cycle);
    CHECK(own.n == 1, "an executor's own pass claims like the scheduler's (%d)", own.n);
    op("a1", 3, "forward_backward", 10);
    op("b1", 3, "forward_backward", 10);
    op("b1", 4, "optim_step", 0);
    rt = round_trips(C, build_fn, &own);
    CHECK(own.n == 3 && rt == 2, "its cycle of 3 operations of 2 tenants: 2 round trips (%d ops, %d trips)", own.n, rt);
    CHECK(scalar("SELECT count(*) FROM operations WHERE state = 'claimed' AND seq_id IN (3, 4)") == 3 &&
              scalar("SELECT next_seq FROM models WHERE id = 'b1'") == 5,
          "the same operations claimed, the models advanced");
    rt = round_trips(C, build_fn, &own);
    CHECK(own.n == 0 && rt == 2, "busy: 2 round trips (the reads found nothing to lock; rollback) (%d trips)", rt);
    finish_cycle(own.cycle);
    rt = round_trips(C, build_fn, &own);
    CHECK(own.n == 0 && rt == 2, "nothing queued: 2 round trips (%d trips)", rt);
    /* rule 3 in the statement: a tenant with nothing left in this minute is passed over */
    sql("UPDATE tenant_limits SET tokens_per_minute = 20 WHERE tenant_id = 2");
    op("a1", 4, "forward_backward", 10);
    op("b1", 5, "forward_backward", 10);
    const char *po[3] = {"{1}", "{m}", "8"};
    PQclear(PQexec(C, "BEGIN"));
    PQclear(PQexec(C, SQL_TENANT_RATE_KEEP_HELD));
    PGresult *rm = PQexecParams(C, SQL_LOCK_READY_OPS_OWN, 3, NULL, po, NULL, NULL, 0);
    CHECK(PQntuples(rm) == 1 && !strcmp(PQgetvalue(rm, 0, 1), "a1"),
          "its models' read passes over the held tenant's (%d operations read, the first of %s)", PQntuples(rm),
          PQntuples(rm) ? PQgetvalue(rm, 0, 1) : "none");
    PQclear(rm);
    PQclear(PQexec(C, "ROLLBACK"));
    build_fn(&own);
    CHECK(own.n == 1 && scalar("SELECT count(*) FROM operations WHERE request_id = 'a1-4' AND state = 'claimed'") == 1 &&
              scalar("SELECT count(*) FROM operations WHERE request_id = 'b1-5' AND state = 'queued'") == 1,
          "a tenant over its rate limit waits in an own pass too (%d claimed)", own.n);
}

static void test_fairness(void) {
    reset();
    model("a1", 1);
    model("a2", 1);
    model("b1", 2);
    sql("UPDATE models SET next_seq = 1");
    for (int s = 1; s <= 5; s++) { op("a1", s, "forward", 20); op("a2", s, "forward", 20); }
    op("b1", 1, "forward", 20);
    op("b1", 2, "forward", 20);
    int64_t cyc;
    int n = build(1, &cyc);   /* budget 100 tokens */
    long b = scalar("SELECT count(*) FROM operations WHERE state='claimed' AND tenant_id=2");
    long tok = scalar("SELECT n_tokens FROM cycles ORDER BY id DESC LIMIT 1");
    CHECK(n == 5 && tok == 100, "cycle filled to the token budget: %d ops, %ld tokens", n, tok);
    CHECK(b == 2, "the small tenant got its share despite the other's backlog (%ld of its 2 ops)", b);
    sql("UPDATE executors SET state='idle', token_budget=10 WHERE id=2");
    sql("UPDATE models SET executor_id = NULL");
    int64_t c2;
    n = build(2, &c2);
    CHECK(n == 1, "an op larger than the budget still runs, alone (got %d)", n);
}

typedef struct { int64_t exe; int claimed; } race_arg;

static void *racer(void *p) {
    race_arg *a = p;
    char err[512];
    PGconn *c = db_connect(conninfo, 5000, err, sizeof err);
    sched_opts o = {.lease_s = 60, .max_models = 64, .pair_hold_ms = 0};
    for (int i = 0; i < 50; i++) {
        int64_t cyc;
        if (sched_place(c, 30, err, sizeof err) < 0) fprintf(stderr, "place: %s\n", err);
        int n = sched_build_cycle(c, a->exe, &o, &cyc, NULL, err, sizeof err);
        if (n > 0) {
            a->claimed += n;
            char q[256];
            snprintf(q, sizeof q, "UPDATE operations SET state='done' WHERE cycle_id=%lld;"
                     "UPDATE executors SET state='idle' WHERE id=%lld", (long long)cyc, (long long)a->exe);
            PQclear(PQexec(c, q));
        }
    }
    PQfinish(c);
    return NULL;
}

static void test_race(void) {
    reset();
    sql("UPDATE executors SET token_budget = 30, memory_budget = 1000000, adapter_bytes_per_rank = 1000");
    char id[16];
    for (int m = 0; m < 20; m++) {
        snprintf(id, sizeof id, "a%d", m);
        model(id, 1);
        for (int s = 0; s < 6; s++) op(id, s, s == 0 ? "create_model" : (s % 3 == 0 ? "optim_step" : "forward_backward"), 5);
    }
    race_arg a1 = {1, 0}, a2 = {2, 0};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, racer, &a1);
    pthread_create(&t2, NULL, racer, &a2);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    long dup = scalar("SELECT count(*) FROM (SELECT id FROM operations GROUP BY id HAVING count(DISTINCT cycle_id) > 1) d");
    long done = scalar("SELECT count(*) FROM operations WHERE state = 'done'");
    CHECK(a1.claimed + a2.claimed == 120 && done == 120, "two schedulers claimed all 120 ops exactly once (%d + %d)",
          a1.claimed, a2.claimed);
    CHECK(dup == 0, "no op in two cycles");
    long split = scalar("SELECT count(*) FROM (SELECT model_id FROM operations o JOIN cycles c ON c.id = o.cycle_id"
                        " GROUP BY model_id HAVING count(DISTINCT c.executor_id) > 1) s");
    CHECK(split == 0, "each model stayed on the executor that holds its adapter");
    long e1 = scalar("SELECT count(*) FROM models WHERE executor_id = 1"), e2 = scalar("SELECT count(*) FROM models"
                                                                                     " WHERE executor_id = 2");
    CHECK(e1 + e2 == 20 && e1 >= 8 && e2 >= 8, "placed by free memory, the 20 models spread (%ld + %ld)", e1, e2);
    long order = scalar("SELECT count(*) FROM operations a JOIN operations b ON a.model_id = b.model_id"
                        " AND a.seq_id < b.seq_id WHERE a.cycle_id > b.cycle_id");
    CHECK(order == 0, "per model, cycles follow seq order");
}

/* Rule 5, learned per model: a new model's forward_backward is not held; once its
 * optim_steps follow its forward_backwards, a fresh trailing forward_backward waits for
 * its optim_step, about as long as the gap its client leaves (not the whole
 * pair_hold_ms); a model that sends forward_backwards alone is never held. */
static void test_pair_hold(void) {
    reset();
    model("a1", 1);
    model("a2", 1);
    sql("UPDATE models SET next_seq = 1, executor_id = 1");
    sched_opts o = {.lease_s = 60, .max_models = 64, .pair_hold_ms = 400};
    int64_t cyc;
    int held = 0;
    char err[512];
    op("a1", 1, "forward_backward", 10);
    int n = sched_build_cycle(C, 1, &o, &cyc, &held, err, sizeof err);
    CHECK(n == 1 && held == 0, "a new model's forward_backward is not held: nothing learned yet (%d claimed)", n);
    finish_cycle(cyc);
    usleep(20 * 1000);
    op("a1", 2, "optim_step", 0);
    n = sched_build_cycle(C, 1, &o, &cyc, &held, err, sizeof err);
    finish_cycle(cyc);
    long gap = scalar("SELECT round(pair_gap_ms) FROM models WHERE id = 'a1'");
    CHECK(n == 1 && scalar("SELECT (pair_p > 0.5)::int FROM models WHERE id = 'a1'") == 1 && gap >= 20 && gap < 400,
          "its optim_step teaches that one follows, about %ld ms after", gap);
    op("a1", 3, "forward_backward", 10);
    held = 0;
    n = sched_build_cycle(C, 1, &o, &cyc, &held, err, sizeof err);
    CHECK(n == 0 && held > 0 && held <= 3 * gap + 2, "now a fresh trailing forward_backward is held, %d ms (not %d)",
          held, o.pair_hold_ms);
    op("a1", 4, "optim_step", 0);
    held = 0;
    n = sched_build_cycle(C, 1, &o, &cyc, &held, err, sizeof err);
    CHECK(n == 2 && held == 0, "once the optim_step arrives both run in one cycle (%d)", n);
    finish_cycle(cyc);
    op("a1", 5, "forward_backward", 10);
    usleep((3 * gap + 5) * 1000);
    n = sched_build_cycle(C, 1, &o, &cyc, &held, err, sizeof err);
    CHECK(n == 1, "after its hold a forward_backward runs alone (%d)", n);
    finish_cycle(cyc);
    /* a2 sends forward_backwards only (evaluation, gradient accumulation) */
    for (int k = 1; k <= 3; k++) {
        op("a2", k, "forward_backward", 10);
        held = 0;
        n = sched_build_cycle(C, 1, &o, &cyc, &held, err, sizeof err);
        if (n > 0) finish_cycle(cyc);
        if (k == 3) CHECK(n == 1 && held == 0, "a model whose forward_backwards come alone is never held (%d)", n);
    }
}

static void sample_op(const char *ss, int seq, int tokens) {
    char q[512];
    snprintf(q, sizeof q, "INSERT INTO operations (request_id, tenant_id, sampling_session_id, seq_id, kind, payload, n_tokens)"
             " VALUES ('%s-s%d', 1, '%s', %d, 'sample', '{}', %d)", ss, seq, ss, seq, tokens);
    sql(q);
}

static void test_samples(void) {
    reset();
    model("a1", 1);
    sql("INSERT INTO sampling_sessions (id, tenant_id, session_id, seq_id, base_model)"
        " VALUES ('sa:sample:0', 1, 'sa', 0, 'm')");
    sql("INSERT INTO sampling_sessions (id, tenant_id, session_id, seq_id, base_model, source_model_id, source_seq_id)"
        " VALUES ('sa:sample:1', 1, 'sa', 1, 'm', 'a1', 3)");
    sample_op("sa:sample:0", 0, 10);
    sample_op("sa:sample:0", 1, 10);
    sample_op("sa:sample:1", 0, 10);
    int64_t cyc;
    int n = build(2, &cyc);
    CHECK(n == 2, "base-model samples run on any executor; the snapshot's wait for it to exist (%d)", n);
    finish_cycle(cyc);
    sql("UPDATE sampling_sessions SET executor_id = 1 WHERE id = 'sa:sample:1'");
    n = build(2, &cyc);
    CHECK(n == 0, "a snapshot's samples never go to another executor (%d)", n);
    n = build(1, &cyc);
    CHECK(n == 1, "they go to the executor holding the snapshot (%d)", n);
    finish_cycle(cyc);
    sample_op("sa:sample:0", 2, 10);
    n = build(2, &cyc);
    sql("UPDATE cycles SET lease_expires_at = now() - interval '1 second' WHERE state = 'assigned'");
    char err[512];
    sched_reap(C, true, 30, err, sizeof err);
    CHECK(n == 1 && scalar("SELECT count(*) FROM operations WHERE request_id = 'sa:sample:0-s2'"
                           " AND state = 'queued' AND attempt = 1 AND cycle_id IS NULL") == 1,
          "a sample of an expired cycle goes back to the queue (attempt 1)");
}

static void test_reaper(void) {
    reset();
    model("a1", 1);
    op("a1", 0, "create_model", 0);
    op("a1", 1, "forward_backward", 10);
    int64_t cyc;
    build(1, &cyc);
    op("a1", 2, "optim_step", 0);
    sql("UPDATE cycles SET lease_expires_at = now() - interval '1 second'");
    char err[512];
    int n = sched_reap(C, false, 30, err, sizeof err);
    CHECK(n == 0 && scalar("SELECT count(*) FROM cycles WHERE state = 'expired'") == 0,
          "right after the scheduler connects, leases and silence are not judged (%d)", n);
    n = sched_reap(C, true, 30, err, sizeof err);
    CHECK(n > 0, "reaper acted (%d)", n);
    CHECK(scalar("SELECT count(*) FROM cycles WHERE state = 'expired'") == 1, "expired cycle marked");
    CHECK(scalar("SELECT count(*) FROM operations WHERE state = 'queued' AND cycle_id IS NULL AND attempt = 1") == 2 &&
              scalar("SELECT count(*) FROM operations WHERE state = 'queued'") == 3,
          "the claimed ops of the expired cycle are queued again (attempt 1), nothing failed");
    CHECK(scalar("SELECT next_seq FROM models WHERE id = 'a1'") == 0, "the model's next_seq moved back to them");
    CHECK(scalar("SELECT count(*) FROM executors WHERE id = 1 AND state = 'gone'") == 1, "executor marked gone");
    CHECK(scalar("SELECT count(*) FROM models WHERE id = 'a1' AND executor_id IS NULL AND status = 'active'") == 1,
          "the model of the gone executor is unpinned, still active (its state is restored elsewhere)");
    /* the same ops claimed and lost twice more: the third loss fails them, unapplied */
    for (int k = 0; k < 2; k++) {
        sql("UPDATE executors SET state = 'idle', heartbeat_at = now() WHERE id = 2");
        build(2, &cyc);
        sql("UPDATE executors SET state = 'gone' WHERE id = 2");
        sched_reap(C, true, 30, err, sizeof err);
    }
    CHECK(scalar("SELECT count(*) FROM operations WHERE model_id = 'a1' AND state = 'failed' AND NOT applied"
                 " AND error LIKE '%3 times%'") == 2,
          "an operation lost with its executor 3 times fails, naming why");
}

/* Placement (docs/architecture.md, "Pools and placement"): a model waiting for a place goes
 * to the live, not draining executor of its base model with the largest share of its adapter
 * memory budget left (the budget minus the ranks placed there), counted as it goes; placed models stay. */
static void test_placement(void) {
    reset();
    char err[512];
    sql("INSERT INTO base_models (name, path, arch, max_context, vocab_size, config)"
        " VALUES ('m2', '/y', 'LlamaForCausalLM', 128, 256, '{}')");
    sql("INSERT INTO executors (name, hostname, pid, backend, device, base_model, token_budget)"
        " VALUES ('e3', 'h', 3, 'cpu', 'cpu', 'm', 100), ('e4', 'h', 4, 'cpu', 'cpu', 'm2', 100)");
    /* e1 3000, e2 1000, e3 2000 bytes free (10 bytes a rank); e3 drains later, e1 falls silent */
    sql("UPDATE executors SET adapter_bytes_per_rank = 10, memory_budget = CASE id WHEN 1 THEN 3000 WHEN 2 THEN 1000"
        " WHEN 3 THEN 2000 ELSE 500 END");
    char id[16];
    for (int m = 0; m < 6; m++) {
        snprintf(id, sizeof id, "a%d", m);
        model(id, 1);
        op(id, 0, "create_model", 0);
    }
    sql("UPDATE models SET base_model = 'm2' WHERE id = 'a5'");
    model("a6", 1);   /* no queued work: waits unplaced */
    int n = sched_place(C, 30, err, sizeof err);
    CHECK(n == 6, "the 6 models with queued work are placed, the idle one is not (%d)", n);
    /* rank 8 = 80 bytes each: turns by the largest share of the budget left (ties: the
     * most bytes left): e1, e3, e2, e1, e3 */
    long on1 = scalar("SELECT count(*) FROM models WHERE executor_id = 1"), on2 = scalar("SELECT count(*) FROM models"
                                                                                        " WHERE executor_id = 2"),
         on3 = scalar("SELECT count(*) FROM models WHERE executor_id = 3");
    CHECK(on1 == 2 && on2 == 1 && on3 == 2 && scalar("SELECT executor_id FROM models WHERE id = 'a5'") == 4,
          "each goes where the largest share of the budget is left, of its own base model (e1 %ld, e2 %ld, e3 %ld)",
          on1, on2, on3);
    sql("UPDATE executors SET memory_budget = 100000 WHERE id = 3");
    sql("UPDATE executors SET draining = true WHERE id = 3");
    model("a7", 1);
    op("a7", 0, "create_model", 0);
    sched_place(C, 30, err, sizeof err);
    CHECK(scalar("SELECT executor_id FROM models WHERE id = 'a7'") == 1, "a draining executor takes no model");
    CHECK(scalar("SELECT count(*) FROM models WHERE executor_id = 1 AND id <> 'a7'") == 2 &&
              scalar("SELECT count(*) FROM models WHERE executor_id = 3") == 2,
          "placed models stay where they are (affinity), on the draining one too until it hands them over");
    sql("UPDATE executors SET heartbeat_at = now() - interval '40 seconds' WHERE id = 1");
    model("a8", 1);
    op("a8", 0, "create_model", 0);
    sched_place(C, 30, err, sizeof err);
    CHECK(scalar("SELECT executor_id FROM models WHERE id = 'a8'") == 2, "nor does a silent one");
}

/* Seq order cannot wedge: a refused submit (recorded failed, never claimed) is passed
 * over; a gap that stays open past the timeout fails what waits behind it, naming the
 * missing seq_id, and the model moves on; a late arrival of the missing seq_id fails. */
static void test_settle(void) {
    reset();
    model("a1", 1);
    op("a1", 0, "create_model", 0);
    op("a1", 1, "forward_backward", 10);
    sql("INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, state, error,"
        " error_category) VALUES ('a1-2', 1, 'a1', 2, 'forward_backward', '{}', 'failed', 'bad token', 'user')");
    op("a1", 3, "forward_backward", 10);
    int64_t cyc;
    int n = build(1, &cyc);
    CHECK(n == 2, "the run stops before the refused seq_id 2 (%d)", n);
    finish_cycle(cyc);
    char err[512];
    int k = sched_skip_settled(C, err, sizeof err);
    n = build(1, &cyc);
    CHECK(k == 1 && n == 1 && scalar("SELECT count(*) FROM operations WHERE request_id = 'a1-3' AND state = 'claimed'") == 1,
          "next_seq moves past the refused seq_id: seq_id 3 runs (%d, %d)", k, n);
    finish_cycle(cyc);

    model("a2", 1);
    op("a2", 0, "create_model", 0);
    n = build(1, &cyc);
    finish_cycle(cyc);
    op("a2", 2, "forward_backward", 10);
    op("a2", 3, "optim_step", 0);
    CHECK(sched_give_up_gaps(C, 30, err, sizeof err) == 0 &&
              scalar("SELECT count(*) FROM operations WHERE model_id = 'a2' AND state = 'queued'") == 2,
          "a fresh gap is waited on");
    sql("UPDATE operations SET created_at = now() - interval '31 seconds' WHERE request_id = 'a2-2'");
    k = sched_give_up_gaps(C, 30, err, sizeof err);
    CHECK(k == 2 && scalar("SELECT count(*) FROM operations WHERE model_id = 'a2' AND state = 'failed'"
                           " AND error_category = 'user' AND error LIKE 'seq_id 1 of model a2 never arrived within 30 s%'") == 2,
          "after the timeout the waiting operations fail, naming the missing seq_id 1 (%d)", k);
    CHECK(scalar("SELECT next_seq FROM models WHERE id = 'a2'") == 4, "the model moved past them");
    op("a2", 1, "forward_backward", 10);
    op("a2", 4, "forward_backward", 10);
    k = sched_give_up_gaps(C, 30, err, sizeof err);
    n = build(1, &cyc);
    CHECK(k == 1 && scalar("SELECT count(*) FROM operations WHERE request_id = 'a2-1' AND state = 'failed'"
                           " AND error LIKE '%arrived after model a2 had given up%'") == 1,
          "the missing seq_id arriving late fails with a message (%d)", k);
    CHECK(n == 1 && scalar("SELECT count(*) FROM operations WHERE request_id = 'a2-4' AND state = 'claimed'") == 1,
          "what the client sends next runs (%d)", n);
}

/* A claim in progress locks its models against other claims, not against submits: the
 * operation's foreign key to its model takes FOR KEY SHARE, which FOR UPDATE would make
 * wait for the claim's commit (10 ms at the median under loom_bench's throughput part,
 * each api worker's connection held meanwhile). */
static void test_claim_lock(void) {
    reset();
    model("a1", 1);
    sql("UPDATE models SET executor_id = 1");
    op("a1", 0, "forward_backward", 10);
    char err[512];
    PGconn *x = db_connect(conninfo, 5000, err, sizeof err), *y = db_connect(conninfo, 5000, err, sizeof err);
    if (!x || !y) dbt_die("connect", err);
    const char *p[4] = {"{1}", "{m}", "8", "{}"};
    PQclear(PQexec(x, "BEGIN"));
    PGresult *r = PQexecParams(x, SQL_LOCK_READY_MODELS, 4, NULL, p, NULL, NULL, 0);
    CHECK(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1, "a claim locks the model with its queued operation");
    PQclear(r);
    PQclear(PQexec(y, "BEGIN"));
    r = PQexecParams(y, SQL_LOCK_READY_MODELS, 4, NULL, p, NULL, NULL, 0);
    CHECK(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 0, "a second claim meanwhile skips it (SKIP LOCKED)");
    PQclear(r);
    PQclear(PQexec(y, "ROLLBACK"));
    sql("SET statement_timeout = '2s'");
    int rc = db_exec(C, "INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, n_tokens)"
                        " VALUES ('a1-1', 1, 'a1', 1, 'optim_step', '{}', 0)", 0, NULL, err, sizeof err);
    sql("SET statement_timeout = 0");
    CHECK(rc == 0, "a submit for the model goes in while the claim holds it, without waiting for it (%s)",
          rc == 0 ? "ok" : err);
    PQclear(PQexec(x, "ROLLBACK"));

    /* an executor's own pass reads and locks nothing while a pass of the scheduler's holds
     * its row (it would take that pass's operations away from it for nothing) */
    const char *po[3] = {"{1}", "{m}", "8"};
    PQclear(PQexec(x, "BEGIN"));
    PQclear(PQexec(x, "SELECT 1 FROM executors WHERE id = 1 FOR UPDATE"));
    PQclear(PQexec(y, "BEGIN"));
    PGresult *ro = PQexecParams(y, SQL_LOCK_READY_OPS_OWN, 3, NULL, po, NULL, NULL, 0);
    CHECK(PQresultStatus(ro) == PGRES_TUPLES_OK && PQntuples(ro) == 0,
          "an own pass's read takes nothing while the scheduler holds the executor (%d operations)", PQntuples(ro));
    PQclear(ro);
    PQclear(PQexec(y, "ROLLBACK"));
    PQclear(PQexec(x, "ROLLBACK"));
    PQclear(PQexec(y, "BEGIN"));
    ro = PQexecParams(y, SQL_LOCK_READY_OPS_OWN, 3, NULL, po, NULL, NULL, 0);
    CHECK(PQntuples(ro) == 2 && !strcmp(PQgetvalue(ro, 0, 1), PQgetvalue(ro, 1, 1)) &&
              scalar("SELECT count(*) FROM (SELECT 1 FROM models WHERE id = 'a1' FOR NO KEY UPDATE SKIP LOCKED) x") == 0,
          "and once it is free it takes its model, locked, and both its operations (%d)", PQntuples(ro));
    PQclear(ro);
    PQclear(PQexec(y, "ROLLBACK"));
    PQfinish(x);
    PQfinish(y);
}

/* A submit's hint as the api writes it (SQL_OP_SUBMIT's notification: its detailed form),
 * parsed by the executor; op: that operation's row id. */
static sched_hint hint_of(const char *model, int seq, int next_seq, const char *kind, bool pair) {
    char q[512], payload[512];
    snprintf(q, sizeof q, "SELECT id FROM operations WHERE model_id = '%s' AND seq_id = %d", model, seq);
    long op = scalar(q);
    snprintf(payload, sizeof payload, "%s %ld %d %d 10 1795794609003.463 1 0 0.5 -1 -1 %s %s",
             pair ? "pair 12.5" : "queued", op, seq, next_seq, kind, model);
    sched_hint h;
    bool ok = sched_hint_parse(payload, &h);
    CHECK(ok && h.op == op && h.seq == seq && h.pair == pair && !strcmp(h.model, model) && !strcmp(h.kind, kind) &&
              h.created_ms > 1.7e12 && h.pair_gap_ms == -1,
          "a hint's details parse (%s)", payload);
    return h;
}

/* An executor's own pass from submits' hints (sched_build_own_hinted): claimed in one
 * round trip while what they say holds; refused, nothing written, when it no longer does. */
static void test_hinted(void) {
    reset();
    model("a1", 1);
    sql("UPDATE models SET executor_id = 1");
    sched_opts o = {.lease_s = 60, .max_models = 64, .pair_hold_ms = 0};
    char err[512];
    sched_hint h;
    CHECK(!sched_hint_parse("queued", &h) && !sched_hint_parse("queued 1 2", &h) && !sched_hint_parse("1", &h),
          "a bare or cut hint has no details");
    op("a1", 0, "forward_backward", 10);
    sched_hint h0 = hint_of("a1", 0, 0, "forward_backward", false);
    int held = 0, n = sched_build_own_hinted(C, 1, "m", 100, &o, &h0, 1, &held, err, sizeof err);
    CHECK(n == 1 && scalar("SELECT count(*) FROM operations WHERE state = 'claimed'") == 1 &&
              scalar("SELECT next_seq FROM models WHERE id = 'a1'") == 1 &&
              scalar("SELECT (state = 'busy')::int FROM executors WHERE id = 1") == 1,
          "a lone operation's hint claims it: model advanced, executor busy (%d: %s)", n, n < 0 ? err : "");
    finish_cycle(scalar("SELECT max(id) FROM cycles"));
    long cycles = scalar("SELECT count(*) FROM cycles");
    /* stale: the same operation again (done), a hint from before a gap, another budget */
    n = sched_build_own_hinted(C, 1, "m", 100, &o, &h0, 1, &held, err, sizeof err);
    CHECK(n == -2 && PQtransactionStatus(C) == PQTRANS_IDLE, "a hint of an operation already run is refused (%d)", n);
    op("a1", 1, "forward_backward", 10);
    op("a1", 3, "optim_step", 0);
    sched_hint h3 = hint_of("a1", 3, 1, "optim_step", false);
    CHECK(sched_build_own_hinted(C, 1, "m", 100, &o, &h3, 1, &held, err, sizeof err) == -2,
          "a hint sent behind a gap goes to the full pass");
    sched_hint h1 = hint_of("a1", 1, 1, "forward_backward", false);
    CHECK(sched_build_own_hinted(C, 1, "m", 50, &o, &h1, 1, &held, err, sizeof err) == -2,
          "a budget the row does not have is refused");
    /* the scheduler's pass holds the executor: the hinted pass takes nothing from it */
    PGconn *x = db_connect(conninfo, 5000, err, sizeof err);
    if (!x) dbt_die("connect", err);
    PQclear(PQexec(x, "BEGIN"));
    PQclear(PQexec(x, "SELECT 1 FROM executors WHERE id = 1 FOR UPDATE"));
    n = sched_build_own_hinted(C, 1, "m", 100, &o, &h1, 1, &held, err, sizeof err);
    CHECK(n == -2, "a hinted pass skips an executor another pass holds (%d)", n);
    PQclear(PQexec(x, "ROLLBACK"));
    sql("INSERT INTO tenant_limits (tenant_id, tokens_per_minute) VALUES (1, 1000)");
    CHECK(sched_build_own_hinted(C, 1, "m", 100, &o, &h1, 1, &held, err, sizeof err) == -2,
          "a tenant with a rate limit set since its submit goes to the full pass");
    sql("DELETE FROM tenant_limits");
    CHECK(scalar("SELECT count(*) FROM cycles") == cycles &&
              scalar("SELECT count(*) FROM operations WHERE state = 'queued'") == 2 &&
              scalar("SELECT next_seq FROM models WHERE id = 'a1'") == 1 &&
              scalar("SELECT (state = 'idle')::int FROM executors WHERE id = 1") == 1,
          "nothing was written by the refused passes");
    /* a held forward_backward and its step: one cycle */
    op("a1", 2, "optim_step", 0);
    sched_hint pair[2] = {hint_of("a1", 1, 1, "forward_backward", true), hint_of("a1", 2, 1, "optim_step", false)};
    n = sched_build_own_hinted(C, 1, "m", 100, &o, pair, 2, &held, err, sizeof err);
    CHECK(n == 2 && scalar("SELECT next_seq FROM models WHERE id = 'a1'") == 3 &&
              scalar("SELECT count(DISTINCT cycle_id) FROM operations WHERE seq_id IN (1, 2) AND state = 'claimed'") == 1,
          "a forward_backward and its step's hints claim both in one cycle (%d)", n);
    finish_cycle(scalar("SELECT max(id) FROM cycles"));
    sched_hint h3now = hint_of("a1", 3, 3, "optim_step", false);
    n = sched_build_own_hinted(C, 1, "m", 100, &o, &h3now, 1, &held, err, sizeof err);
    CHECK(n == 1, "a hint sent once the gap closed claims (%d)", n);
    PQfinish(x);
}

int main(void) {
    char err[1024];
    dbt_start("loom-sched");
    int again = migrate_run(C, err, sizeof err);
    CHECK(again == 0, "a second migrate is a no-op (%d)", again);
    test_order_and_steps();
    test_fairness();
    test_race();
    test_pair_hold();
    test_samples();
    test_reaper();
    test_placement();
    test_settle();
    test_round_trips();
    test_claim_lock();
    test_hinted();
    dbt_stop();
    return check_summary();
}
