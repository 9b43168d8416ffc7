/* migrate.c: schema migrations. Several processes may start at once (api, scheduler,
 * executor, `loom up`): the transaction-scoped advisory lock serialises them, and the
 * version check inside the lock makes a second runner a no-op. */
#include "common/migrate.h"
#include "common/common_sql.h"
#include "common/db.h"
#include "common/log.h"
#include <limits.h>
#include <stdio.h>
#include <string.h>

int migrate_run(PGconn *c, char *err, size_t errlen) { return migrate_run_upto(c, INT_MAX, err, errlen); }

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
    return applied;
fail:
    db_rollback(c);
    return -1;
}
