/* test_exe_commit.c — the executor's commit of a cycle in one round trip (executor.c,
 * commit_cycle; executor/exe_sql.h, SQL_EXE_FINISH_OPS_ALL; migration 0033), on a private
 * PostgreSQL: the batch the executor sends (BEGIN, the results, the cycle's end, COMMIT)
 *   - commits every result and ends the cycle when every operation is still the cycle's;
 *   - commits nothing when one was taken back meanwhile (the reaper requeued it): the
 *     results' statement fails with EXE_SQLSTATE_TAKEN_BACK and a message that says so,
 *     the COMMIT after it does not run, and after the rollback the cycle and the operation
 *     left in it are as they were;
 *   - after the commit, says (SQL_EXE_WORK_WAITS, a row) whether work a pass could give
 *     this executor waits, for its own pass at once, and wakes nobody: a model placed here
 *     with its next operation queued, or a queued sample; not a model placed elsewhere,
 *     an inactive one, or one whose next operation is not queued (a gap);
 *   - writes the events of the operations it makes done itself (migration 0034): a metric
 *     event each, usage for a forward_backward (train), and for a sample its prompt
 *     (prefill) and sequences (sample) under its sampler's source, each in
 *     metric_usage_events too; a failed one's metric event comes from the trigger, with no
 *     usage; an operation failed elsewhere (the reaper) still gets its metric event. */
#include "tests/check.h"
#include "executor/exe_sql.h"
#include "tests/dbtest.h"

static const char *SETUP[] = {
    "INSERT INTO tenants (id, name) VALUES (1, 't')",
    "INSERT INTO base_models (name, path, arch, max_context, vocab_size, config)"
    " VALUES ('m', '/x', 'LlamaForCausalLM', 128, 256, '{}')",
    "INSERT INTO executors (id, name, hostname, pid, backend, device, base_model, token_budget, state,"
    " memory_budget, adapter_bytes_per_rank) VALUES (1, 'e', 'h', 5001, 'cpu', 'cpu', 'm', 100, 'busy', 1000, 10)",
    "INSERT INTO sessions (id, tenant_id) VALUES ('s', 1)",
    "INSERT INTO models (id, tenant_id, session_id, model_seq_id, base_model, lora_rank, lora_seed, train_attn,"
    " train_mlp, train_unembed, executor_id, next_seq, state_seq) VALUES ('s:train:0', 1, 's', 0, 'm', 8, 1, true,"
    " true, true, 1, 3, 0)",
    "INSERT INTO cycles (id, executor_id, state, n_ops, n_tokens, lease_expires_at, started_at)"
    " VALUES (7, 1, 'running', 2, 16, now() + interval '60 seconds', now()),"
    " (8, 1, 'running', 2, 16, now() + interval '60 seconds', now())",
    "INSERT INTO operations (id, request_id, tenant_id, model_id, seq_id, kind, payload, n_tokens, state,"
    " cycle_id, claimed_at) VALUES"
    " (1, 'r1', 1, 's:train:0', 1, 'forward_backward', '{}', 8, 'claimed', 7, now()),"
    " (2, 'r2', 1, 's:train:0', 2, 'forward_backward', '{}', 8, 'claimed', 7, now()),"
    " (3, 'r3', 1, 's:train:0', 3, 'forward_backward', '{}', 8, 'claimed', 8, now()),"
    " (4, 'r4', 1, 's:train:0', 4, 'forward_backward', '{}', 8, 'queued', NULL, NULL)",   /* taken back from 8 */
};

static const char *OUTCOMES =
    "[{\"id\": %d, \"state\": \"done\", \"result\": {\"metrics\": {\"loss:sum\": 1.5}}, \"error\": null,"
    " \"category\": null, \"applied\": true, \"bin_at\": null, \"bin_len\": null},"
    " {\"id\": %d, \"state\": \"done\", \"result\": {\"metrics\": {\"loss:sum\": 2.5}}, \"error\": null,"
    " \"category\": null, \"applied\": true, \"bin_at\": null, \"bin_len\": null}]";

/* The batch commit_cycle sends for cycle `cyc` with outcomes for ops a and b: the number
 * of statements that succeeded (of 4), err and the SQLSTATE of a failure. */
static int commit(int cyc, int a, int b, char *err, size_t errlen, char *state, size_t statelen) {
    char outcomes[1024], scyc[16];
    snprintf(outcomes, sizeof outcomes, OUTCOMES, a, b);
    snprintf(scyc, sizeof scyc, "%d", cyc);
    const char *pf[4] = {outcomes, scyc, NULL, "2"};
    const char *pc[10] = {scyc, "0.5", "1", "0", "1", "0", "0", NULL, NULL, NULL};
    db_stmt st[4] = {{"BEGIN", 0, NULL}, {SQL_EXE_FINISH_OPS_ALL, 4, pf}, {SQL_EXE_FINISH_CYCLE, 10, pc},
                     {"COMMIT", 0, NULL}};
    PGresult *r[4];
    int got = db_pipeline(C, st, 4, r, err, errlen);
    snprintf(state, statelen, "%s", db_last_sqlstate());
    if (got < 4) snprintf(err, errlen, "%s", db_last_message());   /* what the executor logs */
    for (int i = 0; i < 4; i++) PQclear(r[i]);
    return got;
}

/* SQL_EXE_WORK_WAITS for executor `exe`, as the executor sends it after its commit: the
 * rows it returned (whether work waits), checked to have woken nobody (C listens on the
 * scheduler's channel: the executor runs its own pass instead). */
static int ready(int exe) {
    char sexe[16], err[512];
    snprintf(sexe, sizeof sexe, "%d", exe);
    const char *p[1] = {sexe};
    PGresult *r = db_query(C, SQL_EXE_WORK_WAITS, 1, p, err, sizeof err);
    if (!r) dbt_die("ready", err);
    int rows = PQntuples(r), notes = 0;
    PQclear(r);
    PQconsumeInput(C);
    for (PGnotify *n; (n = PQnotifies(C)); PQfreemem(n)) notes += !strcmp(n->relname, "loom_executor_ready");
    CHECK(notes == 0 && rows <= 1, "executor %d: %d row(s), no wake-up of the scheduler (%d)", exe, rows, notes);
    return rows;
}

int main(void) {
    dbt_start("loom-commit");
    for (size_t i = 0; i < sizeof SETUP / sizeof SETUP[0]; i++) sql(SETUP[i]);
    char err[1024], state[8];

    int got = commit(7, 1, 2, err, sizeof err, state, sizeof state);
    CHECK(got == 4, "a cycle whose operations are all still its own commits in one batch (%d of 4: %s)", got, err);
    CHECK(scalar("SELECT count(*) FROM operations WHERE cycle_id = 7 AND state = 'done'") == 2,
          "both results are written");
    CHECK(scalar("SELECT count(*) FROM cycles WHERE id = 7 AND state = 'done'") == 1, "the cycle is done");
    CHECK(scalar("SELECT count(*) FROM executors WHERE id = 1 AND state = 'idle' AND last_compute_ms = 500") == 1,
          "the executor is idle, with its cycle's compute (0.5 s) as its last (rule 5's round wait reads it)");

    got = commit(8, 3, 4, err, sizeof err, state, sizeof state);
    CHECK(got == 1, "a cycle with an operation taken back: the results' statement fails, the rest do not run "
          "(%d of 4 succeeded)", got);
    CHECK(!strcmp(state, EXE_SQLSTATE_TAKEN_BACK), "with SQLSTATE %s (%s)", EXE_SQLSTATE_TAKEN_BACK, state);
    CHECK(!strcmp(err, "1 of the 2 operations of cycle 8 are no longer claimed by it (lease expired?)"),
          "and a message that says which, alone (%s)", err);
    CHECK(PQtransactionStatus(C) == PQTRANS_INERROR, "the transaction is left aborted for the caller's rollback");
    db_rollback(C);
    CHECK(scalar("SELECT count(*) FROM operations WHERE id = 3 AND state = 'claimed' AND cycle_id = 8") == 1,
          "the operation still in the cycle is left claimed (its result not written)");
    CHECK(scalar("SELECT count(*) FROM operations WHERE id = 4 AND state = 'queued' AND result IS NULL") == 1,
          "the one taken back stays queued");
    CHECK(scalar("SELECT count(*) FROM cycles WHERE id = 8 AND state = 'running'") == 1,
          "the cycle is not ended (the reaper expires it)");

    /* After the commit: executor 1 idle again. Its model's next_seq is 3 (claimed in cycle
     * 8); 4 is queued behind it. Executor 2's model has its next operation queued. */
    sql("UPDATE executors SET state = 'idle' WHERE id = 1");
    sql("INSERT INTO executors (id, name, hostname, pid, backend, device, base_model, token_budget, state)"
        " VALUES (2, 'e2', 'h', 5002, 'cpu', 'cpu', 'm', 100, 'busy')");
    sql("INSERT INTO sessions (id, tenant_id) VALUES ('s2', 1)");
    sql("INSERT INTO models (id, tenant_id, session_id, model_seq_id, base_model, lora_rank, lora_seed, train_attn,"
        " train_mlp, train_unembed, executor_id, next_seq, state_seq) VALUES ('s2:train:0', 1, 's2', 0, 'm', 8, 1,"
        " true, true, true, 2, 1, 0)");
    sql("INSERT INTO operations (id, request_id, tenant_id, model_id, seq_id, kind, payload, n_tokens, state)"
        " VALUES (5, 'r5', 1, 's2:train:0', 1, 'forward_backward', '{}', 8, 'queued')");
    sql("LISTEN loom_executor_ready");
    CHECK(ready(1) == 0, "no work waits: the queued operation of the executor's model is not its next (a gap), "
          "and the other queued one is another executor's model's");
    CHECK(ready(2) == 1, "work waits for the executor whose model has its next operation queued");
    sql("UPDATE models SET next_seq = 4 WHERE id = 's:train:0'");
    CHECK(ready(1) == 1, "so does executor 1 once its model's next operation is the queued one");
    sql("UPDATE models SET status = 'unloaded' WHERE id = 's:train:0'");
    CHECK(ready(1) == 0, "not for a model that is no longer active");
    sql("INSERT INTO sampling_sessions (id, tenant_id, session_id, seq_id, base_model) VALUES ('s:sample:0', 1,"
        " 's', 0, 'm')");
    sql("INSERT INTO operations (id, request_id, tenant_id, sampling_session_id, seq_id, kind, payload, n_tokens,"
        " state) VALUES (6, 'r6', 1, 's:sample:0', 0, 'sample', '{}', 8, 'queued')");
    CHECK(ready(1) == 1, "and for a queued sample (any executor of its base model may take it)");
    sql("UNLISTEN *");

    /* Events: cycle 7's two forward_backwards (8 tokens each) were made done above. */
    CHECK(scalar("SELECT count(*) FROM metric_op_events WHERE tenant_id = 1 AND kind = 'forward_backward'"
                 " AND state = 'done' AND n_tokens = 8 AND wait_s >= 0 AND run_s >= 0 AND latency_s >= run_s") == 2,
          "a metric event for each operation made done");
    CHECK(scalar("SELECT count(*) FROM usage_events WHERE tenant_id = 1 AND run = 's:train:0' AND kind = 'train'"
                 " AND tokens = 8") == 2, "usage for each forward_backward: its tokens as train");
    CHECK(scalar("SELECT count(*) FROM metric_usage_events WHERE tenant_id = 1 AND kind = 'train' AND tokens = 8")
          == 2, "the same in the tokens metric's events");
    CHECK(scalar("SELECT count(*) FROM metric_op_events") == 2 && scalar("SELECT count(*) FROM usage_events") == 2,
          "and nothing else (the rolled-back cycle 8 wrote none)");

    /* Cycle 9: the sample made done, a forward_backward failed, through SQL_EXE_FINISH_OPS. */
    sql("INSERT INTO cycles (id, executor_id, state, n_ops, n_tokens, lease_expires_at, started_at)"
        " VALUES (9, 1, 'running', 2, 16, now() + interval '60 seconds', now())");
    sql("UPDATE operations SET state = 'claimed', cycle_id = 9, claimed_at = now(), payload = '{\"prompt\": [1, 2, 3]}'"
        " WHERE id = 6");
    sql("UPDATE operations SET state = 'claimed', cycle_id = 9, claimed_at = now() WHERE id = 5");
    const char *outs9 = "[{\"id\": 6, \"state\": \"done\", \"result\": {\"sequences\": [{\"tokens\": [4, 5]},"
                        " {\"tokens\": [6]}]}, \"error\": null, \"category\": null, \"applied\": false},"
                        " {\"id\": 5, \"state\": \"failed\", \"result\": null, \"error\": \"no\","
                        " \"category\": \"user\", \"applied\": false}]";
    const char *pf9[3] = {outs9, "9", NULL};
    PGresult *r9 = db_query(C, SQL_EXE_FINISH_OPS, 3, pf9, err, sizeof err);
    if (!r9) dbt_die("finish cycle 9", err);
    CHECK(PQntuples(r9) == 1 && !strcmp(PQgetvalue(r9, 0, 0), "2"), "SQL_EXE_FINISH_OPS says it wrote both (%s)",
          PQntuples(r9) ? PQgetvalue(r9, 0, 0) : "no row");
    PQclear(r9);
    CHECK(scalar("SELECT count(*) FROM usage_events WHERE tenant_id = 1 AND run = 'base:m' AND"
                 " ((kind = 'prefill' AND tokens = 3) OR (kind = 'sample' AND tokens = 3))") == 2,
          "a sample's usage: its prompt as prefill and its sequences as sample, under its sampler's source");
    CHECK(scalar("SELECT count(*) FROM metric_usage_events WHERE kind IN ('prefill', 'sample') AND tokens = 3") == 2,
          "the same in the tokens metric's events");
    CHECK(scalar("SELECT count(*) FROM metric_op_events WHERE kind = 'sample' AND state = 'done'") == 1,
          "the sample's metric event");
    CHECK(scalar("SELECT count(*) FROM metric_op_events WHERE kind = 'forward_backward' AND state = 'failed'"
                 " AND n_tokens = 8") == 1, "the failed one's metric event (the trigger's)");
    CHECK(scalar("SELECT count(*) FROM usage_events") == 4, "and no usage for it");
    sql("UPDATE operations SET state = 'failed', finished_at = now() WHERE id = 3");
    CHECK(scalar("SELECT count(*) FROM metric_op_events WHERE state = 'failed'") == 2,
          "an operation failed by another statement gets its metric event from the trigger");
    sql("UPDATE operations SET state = 'failed' WHERE id = 3");
    CHECK(scalar("SELECT count(*) FROM metric_op_events") == 5, "once");
    dbt_stop();
    return check_summary();
}
