/* reg_gc.c: registry garbage collection (registry.h: reg_gc).
 *
 * 1. versions past their TTL are marked deleted; with keep_last, all but the newest
 *    keep_last live versions of each run and kind are deleted too (audit rows for both);
 * 2. for every digest a dead version still points to: in its own transaction, take the
 *    digest's exclusive advisory lock, count the live versions that use the digest, and
 *    only when there are none remove the blob and mark the dead rows blob_removed_at.
 * A save takes the same lock (shared) before it checks its blob and inserts its row, so
 * the count always sees a committing save, and a save that waited for GC re-stores the
 * blob it lost.
 * 3. adapter uploads (docs/protocol.md §12.7) not finished before they expired are dropped, with
 *    their staged files;
 * 4. (sweep_orphans) blobs in the store that no version row counts on, older than the
 *    grace period by mtime, go the same way under the same lock; so do stale temporary
 *    files of interrupted puts. A save in flight either holds the shared lock (its row
 *    is then counted) or has not taken it yet: it then finds its blob gone and stores it
 *    again, and a blob a save reuses had its mtime refreshed by that put. */
#include "registry/registry.h"
#include "registry/reg_sql.h"
#include "common/db.h"
#include "common/pgarray.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* One digest under its exclusive lock. cutoff >= 0 marks an orphan candidate: it goes
 * only if its mtime, read again under the lock, is still before cutoff. */
static int collect_blob(PGconn *c, blobstore *bs, const char *digest, int64_t cutoff, const reg_gc_opts *o,
                        reg_gc_stats *st, char *err, size_t errlen) {
    const char *p[1] = {digest};
    bool orphan = cutoff >= 0;
    blob_info bi = {.size = 0};
    if (db_begin(c, err, errlen) < 0) return -1;
    if (reg_blob_lock(c, digest, err, errlen) < 0) goto fail;
    if (orphan) {
        int s = blob_stat(bs, digest, &bi, err, errlen);
        if (s < 0) goto fail;
        if (s == 1 || bi.mtime >= cutoff) {   /* gone, or stored again meanwhile */
            if (s == 0) st->orphans_young++;
            db_rollback(c);
            return 0;
        }
    }
    PGresult *r = db_query(c, SQL_REG_GC_LIVE_REFS, 1, p, err, errlen);
    if (!r) goto fail;
    int64_t live = db_int(r, 0, 0);
    PQclear(r);
    if (live > 0) {
        if (!orphan) st->blobs_kept++;   /* an orphan that a save just committed: not one any more */
        db_rollback(c);
        return 0;
    }
    if (o->dry_run) {
        if (!orphan && blob_stat(bs, digest, &bi, err, errlen) != 0) bi.size = 0;   /* absent: frees nothing */
        st->blobs_removed++;
        st->bytes_freed += bi.size;
        if (orphan) st->orphans_removed++;
        db_rollback(c);
        return 0;
    }
    r = db_query(c, SQL_REG_GC_MARK_REMOVED, 1, p, err, errlen);
    if (!r) goto fail;
    int64_t size = orphan ? bi.size : PQntuples(r) ? db_int(r, 0, 0) : 0;
    PQclear(r);
    /* Remove while the lock is held; the rows are marked in the same transaction, so a
     * failed commit leaves them unmarked and the next pass tries again. */
    bool had = blob_exists(bs, digest);
    if (had && blob_remove(bs, digest, err, errlen) < 0) goto fail;
    if (db_commit(c, err, errlen) < 0) return -1;
    if (had) {
        st->blobs_removed++;
        st->bytes_freed += size;
        if (orphan) st->orphans_removed++;
    }
    return 0;
fail:
    db_rollback(c);
    return -1;
}

/* Orphan blobs: stored, but no version row counts on them. Asked of the database 1000
 * digests at a time; the young ones are only counted, the old ones collected one by one
 * under their lock (collect_blob checks again that no live version uses them). */
#define ORPHAN_BATCH 1000
static int sweep_orphans(PGconn *c, blobstore *bs, const reg_gc_opts *o, reg_gc_stats *st, char *err,
                         size_t errlen) {
    int64_t cutoff = (int64_t)time(NULL) - (o->orphan_grace_s > 0 ? o->orphan_grace_s : 0);
    if (blob_clean_tmp(bs, cutoff, o->dry_run, &st->tmp_removed, err, errlen) < 0) return -1;
    blob_info *all;
    size_t n;
    if (blob_list(bs, &all, &n, err, errlen) < 0) return -1;
    int rc = 0;
    for (size_t start = 0; start < n && rc == 0; start += ORPHAN_BATCH) {
        size_t end = start + ORPHAN_BATCH < n ? start + ORPHAN_BATCH : n;
        pgarray a;
        pga_init(&a);
        for (size_t i = start; i < end; i++) pga_text(&a, all[i].digest);
        char *arr = pga_end(&a);
        const char *p[1] = {arr};
        PGresult *r = db_query(c, SQL_REG_GC_ORPHANS, 1, p, err, errlen);
        free(arr);
        if (!r) { rc = -1; break; }
        for (int k = 0; k < PQntuples(r) && rc == 0; k++) {
            int64_t i = db_int(r, k, 0);
            if (i < 1 || (size_t)i > end - start) continue;
            const blob_info *b = &all[start + (size_t)i - 1];
            if (b->mtime >= cutoff) st->orphans_young++;
            else rc = collect_blob(c, bs, b->digest, cutoff, o, st, err, errlen);
        }
        PQclear(r);
    }
    free(all);
    return rc;
}

/* Adapter uploads not finished before they expired: their rows go, then their staged
 * files (a crash between the two leaves files the temporary-file sweep removes later). */
static int drop_expired_uploads(PGconn *c, blobstore *bs, const reg_gc_opts *o, reg_gc_stats *st, char *err,
                                size_t errlen) {
    PGresult *r = db_query(c, o->dry_run ? SQL_REG_GC_EXPIRED_UPLOADS_COUNT : SQL_REG_GC_EXPIRED_UPLOADS, 0, NULL,
                           err, errlen);
    if (!r) return -1;
    if (o->dry_run) {
        st->uploads_expired = (int)db_int(r, 0, 0);
        PQclear(r);
        return 0;
    }
    st->uploads_expired = PQntuples(r);
    int rc = 0;
    for (int i = 0; i < PQntuples(r) && rc == 0; i++)
        for (int k = 0; k < REG_UPLOAD_NFILES && rc == 0; k++) {
            char name[128];
            reg_upload_stage_name(PQgetvalue(r, i, 0), k, name);
            rc = blob_stage_remove(bs, name, err, errlen);
        }
    PQclear(r);
    return rc;
}

int reg_gc(PGconn *c, blobstore *bs, const reg_gc_opts *o, reg_gc_stats *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    if (mark_dead(c, o, st, err, errlen) < 0) return -1;
    if (!o->run && drop_expired_uploads(c, bs, o, st, err, errlen) < 0) return -1;
    PGresult *r = db_query(c, SQL_REG_GC_CANDIDATES, 0, NULL, err, errlen);
    if (!r) return -1;
    int n = PQntuples(r);
    char (*digests)[BLOB_DIGEST_HEX] = calloc(n ? n : 1, sizeof *digests);
    if (!digests) { PQclear(r); snprintf(err, errlen, "gc: out of memory"); return -1; }
    for (int i = 0; i < n; i++) snprintf(digests[i], BLOB_DIGEST_HEX, "%s", PQgetvalue(r, i, 0));
    PQclear(r);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        if (blob_digest_valid(digests[i])) rc = collect_blob(c, bs, digests[i], -1, o, st, err, errlen);
    free(digests);
    if (rc == 0 && o->sweep_orphans) rc = sweep_orphans(c, bs, o, st, err, errlen);
    return rc;
}
