/* test_migrate_stats.c — the planner statistics every process takes when it starts
 * (common/migrate.c) are of tables that hold rows, never of empty ones.
 *
 * An empty table that is analyzed is taken for empty (reltuples 0) until autovacuum
 * analyzes it again; one never analyzed is assumed to be at least 10 pages. A fresh
 * install's prepared statements planned in between read the growing queue once per model
 * (the scheduler's ready-models statement took 70 ms a pass instead of 1 in loom_bench's
 * tenants part). So: after the migrations of a fresh database the empty tables stay
 * never analyzed; a table that got rows is analyzed at the next start, and the empty
 * ones still are not. */
#include "check.h"
#include "common/migrate.h"
#include "dbtest.h"

static const char *EMPTY[] = {"operations", "models", "cycles", "sessions", "sampling_sessions"};

static long reltuples(const char *table) {
    char q[256];
    snprintf(q, sizeof q, "SELECT reltuples::bigint FROM pg_class WHERE oid = 'public.%s'::regclass", table);
    return scalar(q);
}

static long stats_rows(const char *table) {
    char q[256];
    snprintf(q, sizeof q, "SELECT count(*) FROM pg_stats WHERE schemaname = 'public' AND tablename = '%s'", table);
    return scalar(q);
}

int main(void) {
    dbt_start("loom-migrate-stats");   /* a fresh database, every migration applied */
    for (size_t i = 0; i < sizeof EMPTY / sizeof EMPTY[0]; i++)
        CHECK(reltuples(EMPTY[i]) == -1, "after the migrations, empty %s is not analyzed (reltuples %ld)",
              EMPTY[i], reltuples(EMPTY[i]));

    /* rows arrive (as `loom up`'s first tenant and base model do), then a process starts */
    sql("INSERT INTO tenants (name) SELECT 't' || i FROM generate_series(1, 20) i");
    sql("INSERT INTO base_models (name, path, arch, max_context, vocab_size, config)"
        " VALUES ('m', '/x', 'LlamaForCausalLM', 128, 256, '{}')");
    CHECK(stats_rows("tenants") == 0, "tenants has no statistics yet");
    char err[512];
    if (migrate_run(C, err, sizeof err) < 0) dbt_die("migrate", err);
    CHECK(stats_rows("tenants") > 0 && reltuples("tenants") == 20,
          "at the next start the tables with rows are analyzed (tenants: %ld rows counted)", reltuples("tenants"));
    CHECK(stats_rows("base_models") > 0, "base_models too");
    for (size_t i = 0; i < sizeof EMPTY / sizeof EMPTY[0]; i++)
        CHECK(reltuples(EMPTY[i]) == -1, "the empty %s still is not (reltuples %ld)", EMPTY[i],
              reltuples(EMPTY[i]));

    dbt_stop();
    return check_summary();
}
