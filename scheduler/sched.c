/* sched.c: `loom scheduler`, the loop. Wakes on NOTIFY (CHAN_OP_QUEUED, CHAN_EXECUTOR_READY)
 * or every poll interval (or when a forward_backward's hold for its optim_step ends),
 * reaps expired leases and expires sessions every 2 s, places waiting models, then builds
 * a cycle for every idle executor at once, in one transaction (cycle.c): work that
 * arrives while an executor computes fills its next cycle (an optional --gather-ms waits
 * before building). */
#include "scheduler/sched.h"
#include "scheduler/sched_sql.h"
#include "common/config.h"
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

/* Listens for work, and commits without waiting for the disk: everything the scheduler
 * writes (claims, placements, the reaper's requeues) is derived from durable rows and
 * done again if a crash loses it, and an executor's commit, which is waited for, makes
 * everything written before it durable too. */
static int listen_all(PGconn *c, char *err, size_t errlen) {
    /* every session of c: a reset (a pipeline broken by a server restart) restores them */
    static const db_setup_stmt setup[] = {{SQL_LISTEN_OPS, NULL}, {SQL_LISTEN_EXECUTORS, NULL},
                                          {SQL_ASYNC_COMMIT, NULL}};
    return db_session_setup(c, setup, 3, err, errlen);
}

/* Shared with `loom executor`, which builds the cycle of an operation submitted while it
 * is idle itself (docs/architecture.md, "One forward_backward, end to end"). */
const opt_spec SCHED_CLAIM_OPTS[] = {
    {.name = "gather-ms", .kind = OPT_INT, .arg = "MS", .def = "0", .lo = 0, .hi = 10000,
     .help = "after a wake-up, wait this long for more work before building cycles (0: build at once; work "
             "that arrives while an executor computes fills its next cycle)"},
    {.name = "lease-s", .kind = OPT_INT, .arg = "S", .def = "300", .lo = 10, .hi = 86400,
     .help = "a cycle's lease at creation (the executor's heartbeat extends it)"},
    {.name = "pair-hold-ms", .kind = OPT_INT, .arg = "MS", .def = "100", .lo = 0, .hi = 10000,
     .help = "the longest a forward_backward waits for the optim_step its model usually sends next (learned "
             "per model: about 3 times the gap between its submits)"},
    {0}};

/* All but --db, --executor-timeout-s (CFG_EXECUTOR_TIMEOUT, which the api reads too) and
 * SCHED_CLAIM_OPTS,
 * for `loom up` to take and pass through (cli/up.c). */
const opt_spec SCHED_OPTS[] = {
    {.name = "poll-ms", .kind = OPT_INT, .arg = "MS", .def = "500", .lo = 1, .hi = 60000,
     .help = "look for work at least this often"},
    {.name = "seq-gap-timeout-s", .kind = OPT_INT, .arg = "S", .def = "30", .lo = 1, .hi = 86400,
     .help = "operations waiting longer for a missing seq_id of their model fail, naming it"},
    {.name = "session-timeout-s", .kind = OPT_INT, .arg = "S", .def = "600", .lo = 0, .hi = 31536000,
     .help = "a session with no heartbeat and no request for S seconds expires (0: never)"},
    {0}};

/* A failure on a connection the server dropped repeats on every pass until the loop
 * reconnects: then it is the outage's message, at most every 30 s (db_outage_level). */
static int fail_level(PGconn *c) { return PQstatus(c) == CONNECTION_OK ? LOG_WARN_ : db_outage_level(); }

static const cfg_cmd SCHED_CMD = {.cmd = "loom scheduler", .section = "scheduler",
                                  .about = "Builds clock cycles from queued operations and reaps expired leases.",
                                  .tables = {CFG_DB, SCHED_OPTS, SCHED_CLAIM_OPTS, CFG_EXECUTOR_TIMEOUT, CFG_DATA_DIR}};

int sched_main(int argc, char **argv) {
    cfg co;
    int rc;
    if (!cfg_parse(&SCHED_CMD, argc, argv, &co, &rc)) return rc;
    int gather_ms = (int)cfg_int(&co, "gather-ms"), poll_ms = (int)cfg_int(&co, "poll-ms"),
        gap_timeout_s = (int)cfg_int(&co, "seq-gap-timeout-s"), session_timeout_s = (int)cfg_int(&co, "session-timeout-s"),
        silence_s = (int)cfg_int(&co, "executor-timeout-s");
    sched_opts o = {.lease_s = (int)cfg_int(&co, "lease-s"), .max_models = 256,
                    .pair_hold_ms = (int)cfg_int(&co, "pair-hold-ms")};
    char db[4096], db_from[4600];
    cfg_db(&co, db, sizeof db, db_from, sizeof db_from);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    db_set_stop_flag(&g_stop);
    char err[1024];
    PGconn *c = db_connect(db, 30000, err, sizeof err);
    if (!c) {
        if (g_stop) return 0;
        log_error("cannot connect to the database (%s): %s", db_from, err);
        return 1;
    }
    if (migrate_run(c, err, sizeof err) < 0) { log_error("migrate: %s", err); return 1; }
    if (listen_all(c, err, sizeof err) < 0) {
        log_error("listen: %s", err);
        return 1;
    }
    log_info("scheduler running (gather %d ms, lease %d s, seq gap timeout %d s)", gather_ms, o.lease_s,
             gap_timeout_s);
    time_t last_reap = 0, connected_at = time(NULL);
    int held = 0, session = PQbackendPID(c);
    while (!g_stop) {
        /* While a model is held for its optim_step, look again when its hold ends. */
        int w = db_wait_notify(c, held > 0 ? held : poll_ms);
        if (w < 0) {
            log_warn("database connection lost; reconnecting");
            db_finish(c);
            c = NULL;
            while (!g_stop && !c) {
                if ((c = db_connect(db, 5000, err, sizeof err)) && listen_all(c, err, sizeof err) < 0) {
                    log_warn("listen: %s", err);
                    db_finish(c);
                    c = NULL;
                }
            }
            if (g_stop) break;
            connected_at = time(NULL);
            session = PQbackendPID(c);
            continue;
        }
        /* A reset of the connection (db_reset, after a broken pipeline) is a new session
         * as much as a reconnect: executors are judged after as long again. */
        if (PQbackendPID(c) != session) {
            session = PQbackendPID(c);
            connected_at = time(NULL);
        }
        if (w > 0 && gather_ms > 0) {
            usleep(gather_ms * 1000);
            db_wait_notify(c, 0);   /* drain what arrived while gathering */
        }
        if (time(NULL) - last_reap >= 2) {
            PGresult *uf = db_query(c, SQL_USAGE_FOLD, 0, NULL, err, sizeof err);
            if (uf) PQclear(uf);
            else log_msg(fail_level(c), "usage: %s", err);
            /* refused submits the api could not pass over at once (rare: out of order) */
            if (sched_skip_settled(c, err, sizeof err) < 0) log_msg(fail_level(c), "settled operations: %s", err);
            /* Silence is judged once executors had as long as the reaper's threshold to
             * heartbeat on this connection's database (after an outage, all are silent). */
            if (sched_reap(c, time(NULL) - connected_at >= silence_s, silence_s, err, sizeof err) < 0)
                log_msg(fail_level(c), "reap: %s", err);
            if (sched_give_up_gaps(c, gap_timeout_s, err, sizeof err) < 0) log_msg(fail_level(c), "seq gaps: %s", err);
            /* Likewise a session is judged silent only after the scheduler has watched for
             * as long as the timeout (heartbeats do not reach a database that is down). */
            if (session_timeout_s > 0 && time(NULL) - connected_at >= session_timeout_s &&
                sched_expire_sessions(c, session_timeout_s, err, sizeof err) < 0)
                log_msg(fail_level(c), "session expiry: %s", err);
            last_reap = time(NULL);
        }
        if (sched_place(c, silence_s, err, sizeof err) < 0) log_msg(fail_level(c), "placement: %s", err);
        /* every idle executor's cycle in one transaction */
        held = 0;
        if (sched_build_cycles(c, 0, &o, NULL, &held, err, sizeof err) < 0) log_msg(fail_level(c), "cycles: %s", err);
    }
    db_finish(c);
    log_info("scheduler stopped");
    return 0;
}
