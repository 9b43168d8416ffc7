/* reg_gc.c: registry garbage collection (registry.h: reg_gc).
 *
 * 1. versions past their TTL are marked deleted; with keep_last, all but the newest
 *    keep_last live versions of each run and kind are deleted too (audit rows for both);
 * 2. for every digest a dead version still points to: in its own transaction, take the
 *    digest's exclusive advisory lock, count the live versions that use the digest, and
 *    only when there are none remove the blob and mark the dead rows blob_removed_at.
 * A save takes the same lock (shared) before it checks its blob and inserts its row, so
 * the count always sees a committing save, and a save that waited for GC re-stores the
 * blob it lost. */
#include "registry/registry.h"
#include "registry/reg_sql.h"
#include "common/db.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int audit_rows(PGconn *c, PGresult *r, const char *action, char *err, size_t errlen) {
    for (int i = 0; i < PQntuples(r); i++)
        if (reg_audit(c, db_int(r, i, 1), "system", action, PQgetvalue(r, i, 2), "{\"by\": \"gc\"}", err,
                      errlen) < 0)
            return -1;
    return 0;
}

static int mark_dead(PGconn *c, const reg_gc_opts *o, reg_gc_stats *st, char *err, size_t errlen) {
    const char *p1[1] = {o->run};
    if (o->dry_run) {
        /* count what would expire without changing anything */
        PGresult *r = db_query(c, SQL_REG_GC_EXPIRE_COUNT, 1, p1, err, errlen);
        if (!r) return -1;
        st->expired = (int)db_int(r, 0, 0);
        PQclear(r);
    } else {
        if (db_begin(c, err, errlen) < 0) return -1;
        PGresult *r = db_query(c, SQL_REG_GC_EXPIRE, 1, p1, err, errlen);
        if (!r) goto fail;
        st->expired = PQntuples(r);
        int rc = audit_rows(c, r, "checkpoint.expire", err, errlen);
        PQclear(r);
        if (rc < 0 || db_commit(c, err, errlen) < 0) goto fail;
    }
    if (o->keep_last > 0) {
        char keep[16];
        snprintf(keep, sizeof keep, "%d", o->keep_last);
        const char *p2[2] = {keep, o->run};
        if (!o->dry_run && db_begin(c, err, errlen) < 0) return -1;
        PGresult *r = db_query(c, SQL_REG_GC_PRUNE_LIST, 2, p2, err, errlen);
        if (!r) goto fail;
        st->pruned = PQntuples(r);
        if (!o->dry_run) {
            for (int i = 0; i < PQntuples(r); i++) {
                const char *pd[1] = {PQgetvalue(r, i, 0)};
                if (db_exec(c, SQL_REG_MARK_DELETED, 1, pd, err, errlen) < 0) { PQclear(r); goto fail; }
            }
            int rc = audit_rows(c, r, "checkpoint.prune", err, errlen);
            PQclear(r);
            if (rc < 0 || db_commit(c, err, errlen) < 0) goto fail;
        } else {
            PQclear(r);
        }
    }
    return 0;
fail:
    db_rollback(c);
    return -1;
}

/* One digest under its exclusive lock. */
static int collect_blob(PGconn *c, blobstore *bs, const char *digest, const reg_gc_opts *o, reg_gc_stats *st,
                        char *err, size_t errlen) {
    const char *p[1] = {digest};
    if (db_begin(c, err, errlen) < 0) return -1;
    if (reg_blob_lock(c, digest, err, errlen) < 0) goto fail;
    PGresult *r = db_query(c, SQL_REG_GC_LIVE_REFS, 1, p, err, errlen);
    if (!r) goto fail;
    int64_t live = db_int(r, 0, 0);
    PQclear(r);
    if (live > 0) {
        st->blobs_kept++;
        db_rollback(c);
        return 0;
    }
    if (o->dry_run) {
        st->blobs_removed++;
        db_rollback(c);
        return 0;
    }
    r = db_query(c, SQL_REG_GC_MARK_REMOVED, 1, p, err, errlen);
    if (!r) goto fail;
    int64_t size = PQntuples(r) ? db_int(r, 0, 0) : 0;
    PQclear(r);
    /* Remove while the lock is held; the rows are marked in the same transaction, so a
     * failed commit leaves them unmarked and the next pass tries again. */
    bool had = blob_exists(bs, digest);
    if (had && blob_remove(bs, digest, err, errlen) < 0) goto fail;
    if (db_commit(c, err, errlen) < 0) return -1;
    if (had) {
        st->blobs_removed++;
        st->bytes_freed += size;
    }
    return 0;
fail:
    db_rollback(c);
    return -1;
}

int reg_gc(PGconn *c, blobstore *bs, const reg_gc_opts *o, reg_gc_stats *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    if (mark_dead(c, o, st, err, errlen) < 0) return -1;
    PGresult *r = db_query(c, SQL_REG_GC_CANDIDATES, 0, NULL, err, errlen);
    if (!r) return -1;
    int n = PQntuples(r);
    char (*digests)[BLOB_DIGEST_HEX] = calloc(n ? n : 1, sizeof *digests);
    if (!digests) { PQclear(r); snprintf(err, errlen, "gc: out of memory"); return -1; }
    for (int i = 0; i < n; i++) snprintf(digests[i], BLOB_DIGEST_HEX, "%s", PQgetvalue(r, i, 0));
    PQclear(r);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        if (blob_digest_valid(digests[i])) rc = collect_blob(c, bs, digests[i], o, st, err, errlen);
    free(digests);
    return rc;
}
