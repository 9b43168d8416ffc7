/* test_migrate_0030.c — migration 0030's loom_metrics_fold() adds the same totals to
 * metric_counters as 0026's did, for the same events: every histogram bucket (values on a
 * bucket's bound, between bounds, past the last one, zero and negative), sums and counts,
 * operations by kind and state, tokens by tenant and kind, cycles by state, busy seconds
 * by executor, cycles that ran no operation.
 *
 * A private PostgreSQL is migrated up to 0028; events are written (and copied aside) and
 * folded by 0026's function; the counters are kept and emptied, the same events written
 * again, 0030 applied, and folded by its function; both sets of counters must be equal
 * row for row. */
#include "check.h"
#include "dbtest.h"

static const char *DATA[] = {
    "INSERT INTO tenants (id, name) VALUES (1, 'alpha'), (2, 'beta'), (3, 'gamma')",
    "INSERT INTO base_models (name, path, arch, max_context, vocab_size, config) VALUES"
    " ('m1', '/x', 'LlamaForCausalLM', 128, 256, '{}'), ('m2', '/y', 'LlamaForCausalLM', 128, 256, '{}')",
    "INSERT INTO executors (id, name, hostname, device_index, pid, backend, device, base_model, token_budget)"
    " VALUES (1, 'e1', 'h1', 0, 1, 'cpu', 'cpu', 'm1', 100), (2, 'e2', 'h1', 1, 2, 'cuda', 'cuda:1', 'm2', 100),"
    " (3, 'e3', 'h2', 0, 3, 'cpu', 'cpu', 'm1', 100)",
    /* cycles: done, failed and expired, on all three executors, of varied lengths and sizes */
    "INSERT INTO cycles (id, executor_id, state, n_ops, n_tokens, lease_expires_at, started_at, finished_at)"
    " SELECT i, 1 + i % 3, CASE WHEN i % 7 = 0 THEN 'failed' WHEN i % 11 = 0 THEN 'expired' ELSE 'done' END,"
    " i % 9, (i * 37) % 5000, now(), now() - make_interval(secs => (i % 13) * 0.05),"
    " CASE WHEN i % 17 = 0 THEN NULL ELSE now() END FROM generate_series(1, 120) i",
    /* operations of the cycles (the tenants of each cycle) */
    "INSERT INTO operations (request_id, tenant_id, kind, payload, state, cycle_id)"
    " SELECT 'r' || i, 1 + i % 3, 'forward_backward', '{}', 'done', 1 + i % 100 FROM generate_series(1, 400) i",
};

/* The events to fold: what the triggers would have appended. */
static const char *EVENTS[] = {
    "DELETE FROM metric_op_events", "DELETE FROM metric_cycle_events", "DELETE FROM metric_usage_events",
    /* every bucket bound of the operation histograms, a little below and above it, zero, a
     * negative wait (clock skew), past the last bound, and NULLs (never claimed) */
    "INSERT INTO metric_op_events SELECT 1 + (k % 3), (ARRAY['forward_backward','optim_step','sample'])[1 + k % 3],"
    " (ARRAY['done','done','failed','canceled'])[1 + k % 4], k % 50, v, v * 2, CASE WHEN k % 5 = 0 THEN NULL"
    " ELSE v + 0.5 END FROM (SELECT row_number() OVER () AS k, v FROM (SELECT b * f AS v FROM metric_families,"
    " unnest(buckets) b, unnest(ARRAY[1, 0.999, 1.001]) f WHERE family = 'loom_operation_wait_seconds'"
    " UNION ALL VALUES (0), (-0.001), (1e9), (NULL)) x) y",
    "INSERT INTO metric_cycle_events SELECT i FROM generate_series(1, 120) i",
    "INSERT INTO metric_usage_events SELECT 1 + i % 3, (ARRAY['train','prefill','sample'])[1 + i % 3], i * 7"
    " FROM generate_series(1, 90) i",
};

int main(void) {
    dbt_start_upto("loom-migrate-0030", 28);
    sql("SET session_replication_role = replica");   /* the history without its triggers */
    for (size_t i = 0; i < sizeof DATA / sizeof DATA[0]; i++) sql(DATA[i]);
    sql("SET session_replication_role = DEFAULT");
    for (size_t i = 0; i < sizeof EVENTS / sizeof EVENTS[0]; i++) sql(EVENTS[i]);
    long nev = scalar("SELECT count(*) FROM metric_op_events");
    CHECK(nev > 40, "%ld operation events to fold", nev);
    CHECK(!strcmp(text("SELECT loom_metrics_fold()"), "t"), "0026's fold ran");
    sql("CREATE TABLE before_0030 AS SELECT * FROM metric_counters");
    sql("DELETE FROM metric_counters");
    for (size_t i = 0; i < sizeof EVENTS / sizeof EVENTS[0]; i++) sql(EVENTS[i]);

    char err[512];
    if (migrate_run(C, err, sizeof err) < 0) dbt_die("migrate", err);
    CHECK(scalar("SELECT count(*) FROM schema_migrations WHERE version = 30") == 1, "0030 applied");
    CHECK(!strcmp(text("SELECT loom_metrics_fold()"), "t"), "0030's fold ran");
    CHECK(scalar("SELECT count(*) FROM metric_op_events") == 0, "the events are folded");

    long rows = scalar("SELECT count(*) FROM before_0030");
    long families = scalar("SELECT count(DISTINCT family) FROM before_0030");
    CHECK(rows > 200 && families >= 10, "0026's fold wrote %ld counters of %ld families", rows, families);
    /* Every counter the same; a sum may differ in its last bits (the two folds add the
     * same values in another order). */
    const char *diff =
        "SELECT count(*) FROM before_0030 b FULL JOIN metric_counters c USING (family, labels, suffix, le)"
        " WHERE b.value IS NULL OR c.value IS NULL OR (b.suffix = 'sum' AND abs(b.value - c.value)"
        " > 1e-12 * greatest(abs(b.value), 1)) OR (b.suffix <> 'sum' AND b.value <> c.value)";
    long n = scalar(diff);
    CHECK(n == 0, "0030's fold wrote the same %ld counters as 0026's (%ld rows differ)", rows, n);
    if (n) {
        char q[1024];
        snprintf(q, sizeof q,
                 "SELECT string_agg(concat_ws(' ', w, family, labels, suffix, le, value), E'\\n') FROM ("
                 "(SELECT '0026' w, * FROM before_0030 EXCEPT SELECT '0026', * FROM metric_counters)"
                 " UNION ALL (SELECT '0030', * FROM metric_counters EXCEPT SELECT '0030', * FROM before_0030)"
                 " ORDER BY 2, 3, 4, 5, 1 LIMIT 40) d");
        printf("%s\n", text(q));
    }
    dbt_stop();
    return check_summary();
}
