/* test_bounded_queries.c — no periodic query's cost grows with the history the database
 * keeps: the statements the scheduler runs on every wake-up and every 2 s, the
 * executor on every poll and heartbeat, and the api on every retrieve_future,
 * retrieve_futures poll and readiness probe must reach the history tables (operations, cycles, executors, models,
 * sessions, sampling sessions) through indexes, never a sequential scan.
 *
 * A private PostgreSQL is filled with the history of a long-running deployment (300k
 * finished operations, 100k cycles, 3k executor registrations, 20k finished runs and
 * sessions, 20k sampling sessions) beside a little live work, analyzed, and each
 * statement's plan is read with EXPLAIN, both as PostgreSQL first plans it and as the
 * generic plan the processes' prepared statements settle on. */
#include "scheduler/sched_sql.h"
#include "executor/exe_sql.h"
#include "tinker/api_sql.h"
#include "tinker/api_futures_sql.h"
#include "check.h"
#include "dbtest.h"

static const char *HISTORY[] = {
    "INSERT INTO tenants (name) SELECT 't' || i FROM generate_series(1, 50) i",
    "INSERT INTO base_models (name, path, arch, max_context, vocab_size, config)"
    " VALUES ('m', '/x', 'LlamaForCausalLM', 128, 256, '{}')",
    "INSERT INTO executors (name, hostname, pid, backend, device, base_model, token_budget, state, heartbeat_at)"
    " SELECT 'e', 'h', i, 'cpu', 'cpu', 'm', 100, 'gone', now() - interval '1 day' FROM generate_series(1, 3000) i",
    "INSERT INTO executors (name, hostname, pid, backend, device, base_model, token_budget)"
    " VALUES ('live', 'h', 5001, 'cpu', 'cpu', 'm', 100), ('live2', 'h', 5002, 'cpu', 'cpu', 'm', 100)",
    "INSERT INTO sessions (id, tenant_id, last_heartbeat_at, expired_at)"
    " SELECT 's' || i, 1 + i % 50, now() - interval '2 days', now() - interval '1 day' FROM generate_series(1, 20000) i",
    "INSERT INTO sessions (id, tenant_id) SELECT 'live' || i, 1 FROM generate_series(1, 10) i",
    "INSERT INTO models (id, tenant_id, session_id, model_seq_id, base_model, lora_rank, lora_seed, train_attn,"
    " train_mlp, train_unembed, status, executor_id, next_seq)"
    " SELECT 's' || i || ':train:0', 1 + i % 50, 's' || i, 0, 'm', 8, 1, true, true, true, 'unloaded', 1 + i % 3000, 16"
    " FROM generate_series(1, 20000) i",
    "INSERT INTO models (id, tenant_id, session_id, model_seq_id, base_model, lora_rank, lora_seed, train_attn,"
    " train_mlp, train_unembed, executor_id, next_seq)"
    " SELECT 'live' || i || ':train:0', 1, 'live' || i, 0, 'm', 8, 1, true, true, true, 3001, 3"
    " FROM generate_series(1, 10) i",
    "INSERT INTO cycles (executor_id, state, n_ops, n_tokens, lease_expires_at, started_at, finished_at)"
    " SELECT 1 + i % 3000, 'done', 3, 30, now() - interval '1 day', now() - interval '1 day',"
    " now() - interval '1 day' FROM generate_series(1, 100000) i",
    "INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, state, cycle_id, applied,"
    " created_at, finished_at)"
    " SELECT 'r' || i, 1 + i % 50, 's' || (1 + i % 20000) || ':train:0', i / 20000, CASE WHEN i % 2 = 0"
    " THEN 'forward_backward' ELSE 'optim_step' END, '{}', 'done', 1 + i % 100000, true, now() - interval '1 day',"
    " now() - interval '1 day' FROM generate_series(1, 300000) i",
    "INSERT INTO sampling_sessions (id, tenant_id, session_id, seq_id, base_model, source_model_id, executor_id)"
    " SELECT 's' || i || ':sample:0', 1 + i % 50, 's' || i, 0, 'm', 's' || i || ':train:0', 1 + i % 3000"
    " FROM generate_series(1, 20000) i",
    /* finished samples of the sampling sessions, half of them numbered by a poll (§4.4) */
    "INSERT INTO operations (request_id, tenant_id, sampling_session_id, seq_id, kind, payload, state, finished_at,"
    " report_seq) SELECT 'smp' || i, 1 + i % 50, 's' || (1 + i % 20000) || ':sample:0', i / 20000, 'sample', '{}',"
    " 'done', now() - interval '1 day', CASE WHEN i % 2 = 0 THEN i END FROM generate_series(1, 100000) i",
    /* limits for tenant 1 (the queries that read them run), a rate-limited tenant */
    "INSERT INTO tenant_limits (tenant_id, max_queued_ops, tokens_per_minute, max_live_models,"
    " max_checkpoint_bytes) VALUES (1, 100, 10000, 5, 1000000)",
    /* live work: queued operations of the live models */
    "INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload)"
    " SELECT 'q' || i, 1, 'live' || i || ':train:0', 3, 'forward_backward', '{}' FROM generate_series(1, 10) i",
    "ANALYZE",
};

typedef struct {
    const char *name, *sql, *args;   /* args: the EXECUTE argument list, "" for none */
} stmt;

static const stmt STMTS[] = {
    /* the scheduler: every wake-up */
    {"scheduler: placement, models", SQL_PLACE_MODELS, ""},
    {"scheduler: placement, executors", SQL_PLACE_EXECUTORS, "(30)"},
    {"scheduler: lock the idle executors", SQL_LOCK_IDLE_EXECUTORS, "(0)"},
    {"scheduler: lock an idle executor", SQL_LOCK_IDLE_EXECUTORS, "(3001)"},
    {"scheduler: rate limits", SQL_TENANT_RATE, ""},
    {"scheduler: ready models", SQL_LOCK_READY_MODELS, "('{3001,3002}', '{m,m}', 512, '{}')"},
    {"scheduler: queued samples", SQL_LOCK_QUEUED_SAMPLES, "('{3001,3002}', '{m,m}', 512, '{}')"},
    {"scheduler: queued ops", SQL_LOCK_QUEUED_OPS, "('{live1:train:0,live2:train:0}')"},
    /* the scheduler: every 2 s */
    {"reaper: silent executors", SQL_REAP_EXECUTORS, "(true, 30)"},
    {"reaper: expired cycles", SQL_REAP_CYCLES, "(true)"},
    {"reaper: lease lost", SQL_REAP_LEASE_LOST, ""},
    {"reaper: requeue samples", SQL_REQUEUE_SAMPLES, ""},
    {"reaper: requeue model ops", SQL_REQUEUE_MODEL_OPS, ""},
    {"reaper: orphaned samples", SQL_FAIL_ORPHANED_SAMPLES, ""},
    {"reaper: unpin models of gone executors", SQL_UNPIN_GONE, ""},
    {"reaper: snapshots of inactive models", SQL_DROP_INACTIVE_SNAPSHOTS, ""},
    {"seq order: settled", SQL_SKIP_SETTLED, ""},
    {"seq order: gaps", SQL_GIVE_UP_GAPS, "(30)"},
    {"seq order: stragglers", SQL_FAIL_STRAGGLERS, ""},
    {"sessions: expire", SQL_EXPIRE_SESSIONS, "(600)"},
    {"sessions: expire models", SQL_EXPIRE_MODELS, ""},
    {"sessions: sampler snapshots of expired sessions", SQL_DROP_EXPIRED_SAMPLER_SNAPSHOTS, ""},
    /* the executor: every poll, heartbeat */
    {"executor: start a cycle", SQL_EXE_START_CYCLE, "(3001)"},
    {"executor: heartbeat", SQL_EXE_HEARTBEAT, "(3001)"},
    {"executor: after a commit, whether work waits", SQL_EXE_READY_IF_QUEUED, ""},
    {"executor: inactive models", SQL_EXE_INACTIVE_MODELS, "('[\"live1:train:0\"]', 3001)"},
    {"executor: drain, models without a slot", SQL_EXE_UNPIN_SLOTLESS, "(3001, '[\"live1:train:0\"]')"},
    /* the api: every retrieve_future, readiness probe */
    {"api: retrieve_future", SQL_FUTURE_GET, "('q1', 1, 1000, 30)"},
    {"api: readyz", SQL_READY, "(30)"},
    {"api: a submit's model check", SQL_MODEL_FOR_OP, "('live1:train:0', 1)"},
    {"api: session heartbeat (every client, every 10 s)", SQL_SESSION_HEARTBEAT, "('live1', 1)"},
    {"api: live models limit", SQL_TENANT_LIVE_MODELS, "(1)"},
    {"api: GET usage", SQL_USAGE, "(1, 30)"},
    /* the api: every retrieve_futures poll (and its re-checks while parked) */
    {"api: retrieve_futures, the session's lock", SQL_SSF_LOCK, "('s7:sample:0', 8)"},
    {"api: retrieve_futures, number and report", SQL_SSF_POLL, "('s7:sample:0', 0, 1000000000, 0, 1000)"},
};

static const char *BIG[] = {"operations", "cycles", "executors", "models", "sessions", "sampling_sessions"};

/* The plan of st (generic or the first custom one) as text. */
static char *plan(const stmt *st, bool generic) {
    char q[256], err[512];
    sql("DEALLOCATE ALL");
    sql(generic ? "SET plan_cache_mode = force_generic_plan" : "SET plan_cache_mode = force_custom_plan");
    PGresult *r = db_query(C, "SELECT 1", 0, NULL, err, sizeof err);   /* keep the session warm */
    PQclear(r);
    size_t n = strlen(st->sql) + 32;
    char *prep = malloc(n);
    snprintf(prep, n, "PREPARE p AS %s", st->sql);
    sql(prep);
    free(prep);
    snprintf(q, sizeof q, "EXPLAIN EXECUTE p%s", st->args);
    r = db_query(C, q, 0, NULL, err, sizeof err);
    if (!r) dbt_die(st->name, err);
    size_t len = 1;
    for (int i = 0; i < PQntuples(r); i++) len += strlen(PQgetvalue(r, i, 0)) + 1;
    char *out = calloc(1, len);
    for (int i = 0; i < PQntuples(r); i++) strcat(strcat(out, PQgetvalue(r, i, 0)), "\n");
    PQclear(r);
    return out;
}

int main(void) {
    dbt_start("loom-bounded");
    for (size_t i = 0; i < sizeof HISTORY / sizeof HISTORY[0]; i++) sql(HISTORY[i]);
    for (size_t i = 0; i < sizeof STMTS / sizeof STMTS[0]; i++)
        for (int generic = 0; generic < 2; generic++) {
            char *p = plan(&STMTS[i], generic);
            const char *bad = NULL;
            for (size_t t = 0; t < sizeof BIG / sizeof BIG[0] && !bad; t++) {
                char pat[64];
                snprintf(pat, sizeof pat, "Seq Scan on %s ", BIG[t]);
                char *hit = strstr(p, pat);
                /* "Seq Scan on models " must not match "Seq Scan on models_x" (none exists) */
                if (hit) bad = BIG[t];
            }
            CHECK(!bad, "%s (%s plan): no sequential scan of a history table%s%s", STMTS[i].name,
                  generic ? "generic" : "custom", bad ? "; scans " : "", bad ? bad : "");
            if (bad) printf("%s", p);
            free(p);
        }
    dbt_stop();
    return check_summary();
}
