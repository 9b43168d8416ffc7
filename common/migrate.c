/* migrate.c: schema migrations. Several processes may start at once (api, scheduler,
 * executor, `loom up`): the transaction-scoped advisory lock serialises them, and the
 * version check inside the lock makes a second runner a no-op.
 *
 * Then the planner's statistics (docs/architecture.md, "Bounded by the work"): without
 * them PostgreSQL guesses, and a guess can turn a lookup by key into a read of the whole
 * history. After migrations every table that holds rows is analyzed; at every other
 * start, those of them that have no statistics (a cluster restored from a dump). Empty
 * tables never are (common_sql.h, SQL_MIGRATE_WITH_ROWS: why). */
#include "common/migrate.h"
#include "common/common_sql.h"
#include "common/db.h"
#include "common/log.h"
#include "common/clock.h"
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int migrate_run(PGconn *c, char *err, size_t errlen) { return migrate_run_upto(c, INT_MAX, err, errlen); }

/* Analyzes every table that holds rows (all) or those of them without statistics, under
 * the migrations' lock so that processes starting together do it once. */
static int analyze(PGconn *c, bool all, char *err, size_t errlen) {
    if (db_begin(c, err, errlen) < 0) return -1;
    if (db_exec(c, SQL_MIGRATE_LOCK, 0, NULL, err, errlen) < 0) goto fail;
    char *q = NULL;
    PGresult *r = db_query(c, all ? SQL_MIGRATE_WITH_ROWS : SQL_MIGRATE_UNANALYZED, 0, NULL, err, errlen);
    if (!r) goto fail;
    if (!PQgetisnull(r, 0, 0)) {
        const char *tables = PQgetvalue(r, 0, 0);
        size_t n = strlen(tables) + 16;
        q = malloc(n);
        if (q) snprintf(q, n, "ANALYZE %s", tables);
    }
    PQclear(r);
    if (!q) return db_commit(c, err, errlen);
    if (!all) log_info("tables without planner statistics: %s; analyzing them", q + 8);
    double t0 = clock_mono_s();
    /* Table names are quoted by format('%I'): the statement is the catalog's own text. */
    int rc = db_exec(c, q, 0, NULL, err, errlen);
    free(q);
    if (rc < 0) goto fail;
    if (db_commit(c, err, errlen) < 0) return -1;
    log_info("planner statistics updated in %.1f s", clock_mono_s() - t0);
    return 0;
fail:
    db_rollback(c);
    return -1;
}

int migrate_run_upto(PGconn *c, int last, char *err, size_t errlen) {
    if (db_exec(c, SQL_MIGRATIONS_TABLE, 0, NULL, err, errlen) < 0) {
        /* Two first-time runners can race on CREATE TABLE IF NOT EXISTS; retry once. */
        if (db_exec(c, SQL_MIGRATIONS_PROBE, 0, NULL, err, errlen) < 0)
            return -1;
    }
    int applied = 0;
    for (const loom_migration *m = loom_migrations; m->name && m->version <= last; m++) {
        char ver[16];
        snprintf(ver, sizeof ver, "%d", m->version);
        const char *p[2] = {ver, m->name};
        if (db_begin(c, err, errlen) < 0) return -1;
        if (db_exec(c, SQL_MIGRATE_LOCK, 0, NULL, err, errlen) < 0)
            goto fail;
        PGresult *r = db_query(c, SQL_MIGRATION_DONE, 1, p, err, errlen);
        if (!r) goto fail;
        int done = PQntuples(r) > 0;
        PQclear(r);
        if (done) { db_rollback(c); continue; }
        PGresult *res = PQexec(c, m->sql);   /* multi-statement script: simple protocol */
        if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK) {
            snprintf(err, errlen, "migration %s: %s", m->name, PQresultErrorMessage(res));
            PQclear(res);
            db_rollback(c);
            return -1;
        }
        PQclear(res);
        if (db_exec(c, SQL_MIGRATION_RECORD, 2, p, err, errlen) < 0)
            goto fail;
        if (db_commit(c, err, errlen) < 0) return -1;
        log_info("applied migration %s", m->name);
        applied++;
    }
    return analyze(c, applied > 0, err, errlen) < 0 ? -1 : applied;
fail:
    db_rollback(c);
    return -1;
}
