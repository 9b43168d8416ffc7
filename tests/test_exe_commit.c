/* test_exe_commit.c — the executor's commit of a cycle in one round trip (executor.c,
 * commit_cycle; executor/exe_sql.h, SQL_EXE_FINISH_OPS_ALL; migration 0033), on a private
 * PostgreSQL: the batch the executor sends (BEGIN, the results, the cycle's end, COMMIT)
 *   - commits every result and ends the cycle when every operation is still the cycle's;
 *   - commits nothing when one was taken back meanwhile (the reaper requeued it): the
 *     results' statement fails with EXE_SQLSTATE_TAKEN_BACK and a message that says so,
 *     the COMMIT after it does not run, and after the rollback the cycle and the operation
 *     left in it are as they were;
 *   - after the commit, wakes the scheduler (SQL_EXE_READY_IF_QUEUED) only when work it
 *     could give this executor waits: a model placed here with its next operation queued,
 *     or a queued sample; not for a model placed elsewhere, an inactive one, or one whose
 *     next operation is not queued (a gap). */
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
    const char *pc[8] = {scyc, "0.5", "1", "0", "1", "0", "0", NULL};
    db_stmt st[4] = {{"BEGIN", 0, NULL}, {SQL_EXE_FINISH_OPS_ALL, 4, pf}, {SQL_EXE_FINISH_CYCLE, 8, pc},
                     {"COMMIT", 0, NULL}};
    PGresult *r[4];
    int got = db_pipeline(C, st, 4, r, err, errlen);
    snprintf(state, statelen, "%s", db_last_sqlstate());
    if (got < 4) snprintf(err, errlen, "%s", db_last_message());   /* what the executor logs */
    for (int i = 0; i < 4; i++) PQclear(r[i]);
    return got;
}

/* SQL_EXE_READY_IF_QUEUED for executor `exe`, as the executor sends it after its commit:
 * the notifications it sent (C listens on the scheduler's channel), checked against the
 * rows it returned. */
static int ready(int exe) {
    char sexe[16], err[512];
    snprintf(sexe, sizeof sexe, "%d", exe);
    const char *p[1] = {sexe};
    PGresult *r = db_query(C, SQL_EXE_READY_IF_QUEUED, 1, p, err, sizeof err);
    if (!r) dbt_die("ready", err);
    int rows = PQntuples(r), notes = 0;
    PQclear(r);
    PQconsumeInput(C);
    for (PGnotify *n; (n = PQnotifies(C)); PQfreemem(n)) notes += !strcmp(n->relname, "loom_executor_ready");
    CHECK(notes == rows, "executor %d: %d notification(s) for %d row(s)", exe, notes, rows);
    return notes;
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
    CHECK(ready(1) == 0, "no wake-up: the queued operation of the executor's model is not its next (a gap), and "
          "the other queued one is another executor's model's");
    CHECK(ready(2) == 1, "the executor whose model has its next operation queued wakes the scheduler");
    sql("UPDATE models SET next_seq = 4 WHERE id = 's:train:0'");
    CHECK(ready(1) == 1, "so does executor 1 once its model's next operation is the queued one");
    sql("UPDATE models SET status = 'unloaded' WHERE id = 's:train:0'");
    CHECK(ready(1) == 0, "not for a model that is no longer active");
    sql("INSERT INTO sampling_sessions (id, tenant_id, session_id, seq_id, base_model) VALUES ('s:sample:0', 1,"
        " 's', 0, 'm')");
    sql("INSERT INTO operations (id, request_id, tenant_id, sampling_session_id, seq_id, kind, payload, n_tokens,"
        " state) VALUES (6, 'r6', 1, 's:sample:0', 0, 'sample', '{}', 8, 'queued')");
    CHECK(ready(1) == 1, "a queued sample wakes it (any executor of its base model may take it)");
    sql("UNLISTEN *");

    dbt_stop();
    return check_summary();
}
