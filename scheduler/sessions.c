/* sessions.c: session expiry (docs/architecture.md, "Session expiry"): sessions silent
 * for the timeout expire, their queued work is canceled, each active model's state is
 * saved as a last checkpoint before the model is let go. */
#include "scheduler/sched.h"
#include "scheduler/sched_sql.h"
#include "common/db.h"
#include "common/log.h"
#include <stdio.h>
#include <stdlib.h>

int sched_expire_sessions(PGconn *c, int timeout_s, char *err, size_t errlen) {
    char secs[16];
    snprintf(secs, sizeof secs, "%d", timeout_s);
    const char *p[1] = {secs};
    /* One transaction, bitmap scans off: each statement reads live operations, and index
     * scans mark the dead versions they step on. */
    if (sched_begin_live_reads(c, err, errlen) < 0) return -1;
    PGresult *r;
    if (!(r = db_query(c, SQL_EXPIRE_SESSIONS, 1, p, err, errlen))) goto fail;
    int n = PQntuples(r);
    PQclear(r);
    if (!(r = db_query(c, SQL_EXPIRE_MODELS, 0, NULL, err, errlen))) goto fail;
    int models = atoi(PQcmdTuples(r));
    PQclear(r);
    if (db_exec(c, SQL_DROP_EXPIRED_SAMPLER_SNAPSHOTS, 0, NULL, err, errlen) < 0) goto fail;
    if (db_commit(c, err, errlen) < 0) return -1;
    if (models) log_info("sessions: %d model(s) of expired sessions saved and expired", models);
    if (n) log_info("sessions: expired after %d s of silence; %d operation(s) canceled or queued", timeout_s, n);
    return n + models;
fail:
    db_rollback(c);
    return -1;
}
