/* regtest.h: saving checkpoint versions as the executor does, and racing such saves
 * against GC, for the registry suites (test_registry_db, test_gc_orphans). Include after
 * dbtest.h. */
#pragma once
#include "registry/blobstore.h"
#include "registry/registry.h"
#include "registry/reg_sql.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static blobstore *B;   /* the suite's blob store */

/* Stores bytes as a blob; its digest in digest. */
static inline void put(const char *bytes, char digest[BLOB_DIGEST_HEX]) {
    char err[256];
    if (blob_put(B, bytes, strlen(bytes), digest, err, sizeof err) < 0) dbt_die("blob_put", err);
}

/* Saves version v as the executor does: in one transaction under its blob's shared lock
 * (reg_blob_lock_shared), so GC cannot remove the blob between the check and the commit;
 * given the blob's bytes, stores the blob again first when GC took it meanwhile.
 * 0 committed (*vid), 1 refused (the name is taken), -1 error; rolled back unless
 * committed. */
static inline int save_version(PGconn *c, const char *bytes, const reg_new_version *v, int64_t *vid, char *err,
                               size_t errlen) {
    char again[BLOB_DIGEST_HEX];
    if (db_begin(c, err, errlen) < 0) return -1;
    int rc = reg_blob_lock_shared(c, v->digest, err, errlen);
    if (rc == 0 && bytes && !blob_exists(B, v->digest)) rc = blob_put(B, bytes, strlen(bytes), again, err, errlen);
    if (rc == 0) rc = reg_version_insert(c, v, vid, err, errlen);
    if (rc == 0 && db_commit(c, err, errlen) < 0) rc = -1;
    if (rc != 0) db_rollback(c);
    return rc;
}

/* Whether version vid is live but its blob is gone. Asked under the blob's shared lock,
 * so GC cannot be half-way through removing it. */
static inline bool live_blob_lost(PGconn *c, int64_t vid, const char *digest) {
    char q[160], err[512];
    bool lost = false;
    snprintf(q, sizeof q, "SELECT count(*) FROM adapter_versions v WHERE id = %lld AND " REG_LIVE, (long long)vid);
    if (db_begin(c, err, sizeof err) == 0 && reg_blob_lock_shared(c, digest, err, sizeof err) == 0) {
        PGresult *r = db_query(c, q, 0, NULL, err, sizeof err);
        lost = r && db_int(r, 0, 0) == 1 && !blob_exists(B, digest);
        if (r) PQclear(r);
    }
    db_rollback(c);
    return lost;
}

/* How many of the live versions' blobs are missing or corrupt; *nlive = their number. */
static inline int live_blobs_missing(int *nlive) {
    char err[512];
    PGresult *r = db_query(C, "SELECT DISTINCT blob_digest FROM adapter_versions v WHERE " REG_LIVE, 0, NULL, err,
                           sizeof err);
    if (!r) dbt_die("live blobs", err);
    int missing = 0;
    *nlive = PQntuples(r);
    for (int i = 0; i < *nlive; i++) {
        void *data;
        size_t n;
        if (blob_get(B, PQgetvalue(r, i, 0), &data, &n, err, sizeof err) < 0) missing++;
        else free(data);
    }
    PQclear(r);
    return missing;
}

/* ---- saves racing GC ---------------------------------------------------------------- */

/* A race: `savers` threads each save `rounds` sampler versions of model sa:train:0 (as
 * the executor does: the blob first, then after a stall the row, save_version), while a
 * collector thread marks a random share p_delete of the live race versions deleted and
 * runs reg_gc with the given options, over and over. The suite says what saver t saves
 * in round i (its bytes and name: a name taken before is refused) and how it stalls
 * between blob and row. */
typedef struct race {
    int savers, rounds;
    double p_delete;
    reg_gc_opts gc;
    void (*round)(int t, int i, char bytes[48], char name[32]);
    void (*stall)(const char *digest);
    /* outcome */
    atomic_int errors, saved, refused, lost, stop;
    atomic_int removed, orphans;   /* blobs GC removed, and orphans among them */
} race;

typedef struct {
    race *r;
    int t;
} race_saver_arg;

static void *race_saver(void *arg) {
    race *r = ((race_saver_arg *)arg)->r;
    int t = ((race_saver_arg *)arg)->t;
    char err[512];
    PGconn *c = db_connect(conninfo, 10000, err, sizeof err);
    for (int i = 0; c && i < r->rounds; i++) {
        char bytes[48], name[32], dg[BLOB_DIGEST_HEX];
        r->round(t, i, bytes, name);
        if (blob_put(B, bytes, strlen(bytes), dg, err, sizeof err) < 0) { r->errors++; continue; }
        r->stall(dg);
        reg_new_version v = {.model_id = "sa:train:0", .seq_id = 10000 + t * 1000 + i, .kind = "sampler",
                             .name = name, .digest = dg, .size_bytes = (int64_t)strlen(bytes), .ttl_seconds = -1};
        int64_t vid;
        int rc = save_version(c, bytes, &v, &vid, err, sizeof err);
        if (rc == 1) { r->refused++; continue; }
        if (rc != 0) {
            fprintf(stderr, "saver: %s\n", err);
            r->errors++;
            continue;
        }
        r->saved++;
        r->lost += live_blob_lost(c, vid, dg);
    }
    if (!c) r->errors++;
    PQfinish(c);
    return NULL;
}

static void *race_collector(void *arg) {
    race *r = arg;
    char err[512], q[200];
    snprintf(q, sizeof q, "UPDATE adapter_versions SET deleted_at = now() WHERE name LIKE 'race-%%'"
             " AND deleted_at IS NULL AND random() < %g", r->p_delete);
    PGconn *c = db_connect(conninfo, 10000, err, sizeof err);
    while (c && !r->stop) {
        db_exec(c, q, 0, NULL, err, sizeof err);
        reg_gc_stats st;
        if (reg_gc(c, B, &r->gc, &st, err, sizeof err) < 0) {
            fprintf(stderr, "gc: %s\n", err);
        } else {
            r->removed += st.blobs_removed;
            r->orphans += st.orphans_removed;
        }
        usleep(rand() % 1000);
    }
    PQfinish(c);
    return NULL;
}

static inline void race_run(race *r) {
    pthread_t s[16], g;
    race_saver_arg args[16];
    if (r->savers > 16) dbt_die("race", "at most 16 savers");
    pthread_create(&g, NULL, race_collector, r);
    for (int t = 0; t < r->savers; t++) {
        args[t] = (race_saver_arg){r, t};
        pthread_create(&s[t], NULL, race_saver, &args[t]);
    }
    for (int t = 0; t < r->savers; t++) pthread_join(s[t], NULL);
    r->stop = 1;
    pthread_join(g, NULL);
}
