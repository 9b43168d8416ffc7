/* dbtest.h: a private PostgreSQL cluster for one C suite (test_scheduler, test_registry_db,
 * test_gc_orphans): started in a new directory under /tmp, migrated, removed at the end;
 * and statements the suite runs on it as text. A cluster that does not start or a
 * statement that fails ends the suite with status 2: an error of the test, not a failed
 * check. */
#pragma once
#include "common/db.h"
#include "common/migrate.h"
#include "common/pgcluster.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char dbt_dir[64];        /* the suite's directory: the cluster lives in dbt_dir/pg */
static char conninfo[1024];
static PGconn *C;               /* the suite's own connection */

static inline void dbt_die(const char *what, const char *detail) {
    fprintf(stderr, "%s: %s\n", what, detail);
    exit(2);
}

/* Starts the cluster in /tmp/<prefix>-XXXXXX, connects C and migrates up to migration
 * `last` (INT_MAX: all; migrate_run_upto). */
static inline void dbt_start_upto(const char *prefix, int last) {
    char err[1024];
    snprintf(dbt_dir, sizeof dbt_dir, "/tmp/%s-XXXXXX", prefix);
    if (!mkdtemp(dbt_dir)) dbt_die("mkdtemp", dbt_dir);
    chmod(dbt_dir, 0755);   /* the cluster may run as another user (pgcluster.h) */
    pgcluster pc;
    if (pgc_start(dbt_dir, &pc, err, sizeof err) < 0) dbt_die("cluster", err);
    snprintf(conninfo, sizeof conninfo, "%s", pc.conninfo);
    C = db_connect(conninfo, 10000, err, sizeof err);
    if (!C) dbt_die("connect", err);
    if (migrate_run_upto(C, last, err, sizeof err) < 0) dbt_die("migrate", err);
}

/* Starts the cluster in /tmp/<prefix>-XXXXXX, connects C and migrates. */
static inline void dbt_start(const char *prefix) { dbt_start_upto(prefix, INT_MAX); }

static inline void dbt_stop(void) {
    char err[1024], cmd[128];
    PQfinish(C);
    pgc_stop(dbt_dir, err, sizeof err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dbt_dir);
    if (system(cmd) != 0) {}
}

static inline void sql(const char *q) {
    char err[512];
    if (db_exec(C, q, 0, NULL, err, sizeof err) < 0) dbt_die(q, err);
}

/* The first cell of q's answer as text ("" without rows); valid until the next call. */
static inline const char *text(const char *q) {
    static char buf[4096];
    char err[512];
    PGresult *r = db_query(C, q, 0, NULL, err, sizeof err);
    if (!r) dbt_die(q, err);
    snprintf(buf, sizeof buf, "%s", PQntuples(r) ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
    return buf;
}

/* The first cell of q's answer as a number; -1 without rows. */
static inline long scalar(const char *q) {
    const char *t = text(q);
    return *t ? atol(t) : -1;
}
