/* reaper.c: taking back what is stuck, every 2 s (docs/architecture.md, "Clock cycles",
 * rule 4): cycles whose lease ran out or whose executor is gone (their operations go back
 * to the queue), and seq order that would wedge a model: operations settled without
 * running are passed over, and a seq_id that never arrives is given up on. */
#include "scheduler/sched.h"
#include "scheduler/sched_sql.h"
#include "common/common_sql.h"
#include "common/db.h"
#include "common/log.h"
#include <stdio.h>
#include <stdlib.h>

int sched_begin_live_reads(PGconn *c, char *err, size_t errlen) {
    if (db_begin(c, err, errlen) < 0) return -1;
    if (db_exec(c, SQL_NO_BITMAP, 0, NULL, err, errlen) < 0) {
        db_rollback(c);
        return -1;
    }
    return 0;
}

int sched_reap(PGconn *c, bool judge_silence, int silence_s, char *err, size_t errlen) {
    int changed = 0;
    if (sched_begin_live_reads(c, err, errlen) < 0) return -1;
    char secs[16];
    snprintf(secs, sizeof secs, "%d", silence_s);
    const char *pj[2] = {judge_silence ? "t" : "f", secs};
    PGresult *r;
    if (!(r = db_query(c, SQL_REAP_EXECUTORS, 2, pj, err, errlen))) goto fail;
    changed += atoi(PQcmdTuples(r));
    PQclear(r);
    if (!(r = db_query(c, SQL_REAP_CYCLES, 1, pj, err, errlen))) goto fail;
    int expired = PQntuples(r);
    PQclear(r);
    if (expired > 0) {
        if (db_exec(c, SQL_REAP_LEASE_LOST, 0, NULL, err, errlen) < 0) goto fail;
        log_warn("reaper: %d cycle(s) expired", expired);
        changed += expired;
    }
    if (!(r = db_query(c, SQL_REQUEUE_SAMPLES, 0, NULL, err, errlen))) goto fail;
    changed += PQntuples(r);
    PQclear(r);
    if (!(r = db_query(c, SQL_REQUEUE_MODEL_OPS, 0, NULL, err, errlen))) goto fail;
    if (PQntuples(r) > 0) log_warn("reaper: %d operation(s) of expired cycles queued again", PQntuples(r));
    changed += PQntuples(r);
    PQclear(r);
    if (!(r = db_query(c, SQL_FAIL_ORPHANED_SAMPLES, 0, NULL, err, errlen))) goto fail;
    changed += PQntuples(r);
    PQclear(r);
    if (!(r = db_query(c, SQL_UNPIN_GONE, 0, NULL, err, errlen))) goto fail;
    if (PQntuples(r) > 0) log_warn("reaper: %d model(s) of gone executors to be placed again", PQntuples(r));
    changed += PQntuples(r);
    PQclear(r);
    if (db_exec(c, SQL_DROP_INACTIVE_SNAPSHOTS, 0, NULL, err, errlen) < 0) goto fail;
    if (db_commit(c, err, errlen) < 0) return -1;
    return changed;
fail:
    db_rollback(c);
    return -1;
}

/* ---- settling seq order ------------------------------------------------------------------ */

int sched_skip_settled(PGconn *c, char *err, size_t errlen) {
    PGresult *r = db_query(c, SQL_SKIP_SETTLED, 0, NULL, err, errlen);
    if (!r) return -1;
    int n = atoi(PQcmdTuples(r));
    PQclear(r);
    return n;
}

int sched_give_up_gaps(PGconn *c, int gap_timeout_s, char *err, size_t errlen) {
    char secs[16];
    snprintf(secs, sizeof secs, "%d", gap_timeout_s);
    const char *p[1] = {secs};
    /* Both read every model's live operations: an index scan, not a bitmap scan, so that
     * the dead versions are marked once rather than fetched every 2 s. */
    if (sched_begin_live_reads(c, err, errlen) < 0) return -1;
    PGresult *r;
    if (!(r = db_query(c, SQL_GIVE_UP_GAPS, 1, p, err, errlen))) goto fail;
    int failed = PQntuples(r);
    if (failed) log_warn("gave up on missing seq_ids of %s model(s) after %d s: %d waiting operation(s) failed",
                         PQgetvalue(r, 0, 1), gap_timeout_s, failed);
    PQclear(r);
    if (!(r = db_query(c, SQL_FAIL_STRAGGLERS, 0, NULL, err, errlen))) goto fail;
    int late = PQntuples(r);
    PQclear(r);
    if (db_commit(c, err, errlen) < 0) return -1;
    return failed + late;
fail:
    db_rollback(c);
    return -1;
}
