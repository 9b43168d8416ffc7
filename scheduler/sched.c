/* sched.c: `loom scheduler`, the loop. Wakes on NOTIFY (CHAN_OP_QUEUED, CHAN_EXECUTOR_READY)
 * or every poll interval, waits a short gather window so that a forward_backward and the
 * optim_step the client sends right after it land in one cycle, reaps expired leases,
 * then builds a cycle for every idle executor. */
#include "scheduler/sched.h"
#include "scheduler/sched_sql.h"
#include "common/db.h"
#include "common/log.h"
#include "common/migrate.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;
static void on_signal(int s) { g_stop = 1; }

static int listen_all(PGconn *c, char *err, size_t errlen) {
    return db_exec(c, SQL_LISTEN_OPS, 0, NULL, err, errlen) < 0 || db_exec(c, SQL_LISTEN_EXECUTORS, 0, NULL, err, errlen) < 0
               ? -1 : 0;
}

static void usage(void) {
    fprintf(stderr, "usage: loom scheduler --db CONNINFO [--gather-ms 15] [--poll-ms 500] [--lease-s 300]\n"
                    "                      [--pair-hold-ms 100] [--seq-gap-timeout-s 30]\n"
                    "  --seq-gap-timeout-s N  operations that wait longer than N s for a missing seq_id\n"
                    "                         of their model fail with a message naming it\n");
}

int sched_main(int argc, char **argv) {
    const char *db = getenv("DATABASE_URL");
    int gather_ms = 15, poll_ms = 500, gap_timeout_s = 30;
    sched_opts o = {.lease_s = 300, .max_models = 256, .pair_hold_ms = 100};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--db") && v) db = argv[++i];
        else if (!strcmp(a, "--gather-ms") && v) gather_ms = atoi(argv[++i]);
        else if (!strcmp(a, "--poll-ms") && v) poll_ms = atoi(argv[++i]);
        else if (!strcmp(a, "--lease-s") && v) o.lease_s = atoi(argv[++i]);
        else if (!strcmp(a, "--pair-hold-ms") && v) o.pair_hold_ms = atoi(argv[++i]);
        else if (!strcmp(a, "--seq-gap-timeout-s") && v && atoi(v) > 0) gap_timeout_s = atoi(argv[++i]);
        else { usage(); return 2; }
    }
    if (!db) { usage(); return 2; }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    char err[1024];
    PGconn *c = db_connect(db, 30000, err, sizeof err);
    if (!c) { log_error("cannot connect: %s", err); return 1; }
    if (migrate_run(c, err, sizeof err) < 0) { log_error("migrate: %s", err); return 1; }
    if (listen_all(c, err, sizeof err) < 0) {
        log_error("listen: %s", err);
        return 1;
    }
    log_info("scheduler running (gather %d ms, lease %d s, seq gap timeout %d s)", gather_ms, o.lease_s,
             gap_timeout_s);
    time_t last_reap = 0;
    int held = 0;
    while (!g_stop) {
        /* While a model is held for its optim_step, look again soon. */
        int w = db_wait_notify(c, held ? 10 : poll_ms);
        if (w < 0) {
            log_warn("database connection lost; reconnecting");
            PQfinish(c);
            while (!g_stop && !(c = db_connect(db, 5000, err, sizeof err))) log_warn("reconnect: %s", err);
            if (g_stop) break;
            if (listen_all(c, err, sizeof err) < 0) log_warn("listen: %s", err);
            continue;
        }
        if (w > 0 && gather_ms > 0) {
            usleep(gather_ms * 1000);
            db_wait_notify(c, 0);   /* drain what arrived while gathering */
        }
        if (time(NULL) - last_reap >= 2) {
            if (sched_reap(c, err, sizeof err) < 0) log_warn("reap: %s", err);
            if (sched_give_up_gaps(c, gap_timeout_s, err, sizeof err) < 0) log_warn("seq gaps: %s", err);
            last_reap = time(NULL);
        }
        if (sched_skip_settled(c, err, sizeof err) < 0) log_warn("settled operations: %s", err);
        PGresult *r = db_query(c, SQL_IDLE_EXECUTORS, 0, NULL, err, sizeof err);
        if (!r) { log_warn("executors: %s", err); continue; }
        held = 0;
        for (int i = 0; i < PQntuples(r); i++) {
            int64_t cyc;
            if (sched_build_cycle(c, db_int(r, i, 0), &o, &cyc, &held, err, sizeof err) < 0)
                log_warn("cycle for executor %s: %s", PQgetvalue(r, i, 0), err);
        }
        PQclear(r);
    }
    PQfinish(c);
    log_info("scheduler stopped");
    return 0;
}
