/* db.h: small helpers over libpq's synchronous API, for processes and threads that
 * may block (scheduler, executor, CLI, the api's worker threads; never an h2o loop). */
#pragma once
#include <libpq-fe.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Connects, retrying for up to wait_ms (the server may still be starting). The first
 * failure of an outage is logged at once, naming the server (database, host, port, user:
 * never the password) and what is retried; further failures in this process at most every
 * 30 s (db_outage_level), and the first success after them says how long it took. A
 * connection attempt gives up after 10 s unless the conninfo sets connect_timeout. The
 * wait ends early, with NULL, once the flag of db_set_stop_flag is set (SIGTERM). */
PGconn *db_connect(const char *conninfo, int wait_ms, char *err, size_t errlen);

/* The name every later connection of this process gives PostgreSQL unless its conninfo
 * or its own SET names it (fallback_application_name; pg_stat_activity shows it): "loom
 * scheduler", "loom api", ... (loom.c sets it from the command). */
void db_set_app_name(const char *name);

/* One attempt, said nowhere: for a probe whose failure is an answer (is a server
 * running here?), not an outage. */
PGconn *db_probe(const char *conninfo, char *err, size_t errlen);

/* The process's stop flag (set by its SIGTERM handler): retry loops here end when it is. */
void db_set_stop_flag(const volatile sig_atomic_t *flag);
/* The level for a message of a loop that retries because the database is away: LOG_WARN_
 * when no such message went out in this process for 30 s, else LOG_DEBUG_, so that an
 * outage is a line every 30 s per process, not one per thread and second. */
int db_outage_level(void);
/* "database D on H:P as U" (the password left out), for messages. */
void db_describe(const char *conninfo, char *out, size_t n);

/* ---- sessions --------------------------------------------------------------------------
 * A connection's session state (LISTEN, SET application_name, statement_timeout,
 * synchronous_commit) is lost with the session: after a restart of the server, a
 * PQreset gives a session without it, and a loop that LISTENs then only wakes by its poll
 * interval. Every connection that needs such state declares it once, with
 * db_session_setup; every reconnect of that connection (db_reset, and the reset of a
 * pipeline broken mid-way) runs it again. */

/* Runs the statements (each with at most one parameter, NULL: none) on c now, and
 * remembers them for c's later sessions. 0, or -1 with err. */
typedef struct {
    const char *sql;
    const char *param;
} db_setup_stmt;
int db_session_setup(PGconn *c, const db_setup_stmt *stmts, int n, char *err, size_t errlen);
/* Reconnects c (PQreset) and restores its session (db_session_setup's statements). true
 * when c is usable again; the failure is logged at db_outage_level. */
bool db_reset(PGconn *c);
/* PQfinish, forgetting c's session setup. NULL is fine. */
void db_finish(PGconn *c);

/* Runs a statement with text parameters. Returns the result when its status is
 * COMMAND_OK or TUPLES_OK, else NULL with the server's message in err. */
PGresult *db_query(PGconn *c, const char *sql, int nparams, const char *const *params,
                   char *err, size_t errlen);
/* The same with parameters in binary form where formats[i] is 1 (lengths[i] bytes;
 * formats NULL: all text) and the result in binary form when result_format is 1: a bytea
 * then travels as its bytes, not as hex text (a text column reads as in text form; other
 * types in their binary send formats). */
PGresult *db_query_bin(PGconn *c, const char *sql, int nparams, const char *const *params, const int *lengths,
                       const int *formats, int result_format, char *err, size_t errlen);
/* Same, for statements whose result is not needed. Returns 0 or -1. */
int db_exec(PGconn *c, const char *sql, int nparams, const char *const *params, char *err,
            size_t errlen);

/* One statement of a db_pipeline batch. */
typedef struct {
    const char *sql;
    int nparams;
    const char *const *params;
} db_stmt;

/* Sends n statements at once and reads their results (libpq's pipeline mode): one round
 * trip to the server for all, where db_query would take n. They run in order; a failure
 * makes the server skip the rest of the batch. res[i] gets statement i's result
 * (COMMAND_OK or TUPLES_OK) or NULL for a failed or skipped one (the caller PQclears the
 * non-NULL ones). Returns the number of leading statements that succeeded (n when all
 * did), with the first failure's message in err and its SQLSTATE for db_last_sqlstate.
 * A batch that starts with BEGIN and does not end with COMMIT leaves the transaction
 * open (aborted after a failure: the caller rolls back). Statements are prepared as
 * db_query prepares them, so they may not depend on a table created earlier in the batch. */
int db_pipeline(PGconn *c, const db_stmt *st, int n, PGresult **res, char *err, size_t errlen);
/* The same with binary parameters: bin[i] gives statement i's parameter lengths and
 * formats as db_query_bin takes them (bin NULL, or both NULL: all text), and its
 * result_format (1: binary, as db_query_bin's). */
typedef struct {
    const int *lengths, *formats;
    int result_format;
} db_bin;
int db_pipeline_bin(PGconn *c, const db_stmt *st, const db_bin *bin, int n, PGresult **res, char *err,
                    size_t errlen);

/* A durable write that wakes somebody, without holding every other notifying commit of
 * the database behind its WAL flush (common_sql.h, SQL_NOTIFY_AFTER): sql, one statement
 * that leaves its notification in DB_NOTIFY_LEFT (set_config, not pg_notify), runs in a
 * transaction of its own, committed durably, and the notification follows in another
 * that does not wait for the disk; one round trip. -> sql's result, as db_query_bin's; or
 * NULL on an error (nothing committed, the session out of any transaction). A
 * notification that fails after the commit is logged, not returned. */
PGresult *db_query_bin_notify(PGconn *c, const char *sql, int nparams, const char *const *params,
                              const int *lengths, const int *formats, int result_format, char *err,
                              size_t errlen);
/* COMMIT of the session's open transaction, then a notification on channel with payload
 * (NULL: none) as db_query_bin_notify sends one; one round trip. 0 committed, -1 not (an
 * error, in err; the session out of the transaction). */
int db_commit_notify(PGconn *c, const char *channel, const char *payload, char *err, size_t errlen);
int db_begin(PGconn *c, char *err, size_t errlen);
int db_commit(PGconn *c, char *err, size_t errlen);
void db_rollback(PGconn *c);

/* SQLSTATE of the last failed db_query/db_exec/db_pipeline on this thread ("" if none). */
const char *db_last_sqlstate(void);
/* Its primary message alone (no "ERROR:", detail or context; "" if none): for a message
 * a statement raised on purpose (loom_refuse, migration 0033). */
const char *db_last_message(void);

/* Waits up to timeout_ms for a NOTIFY on c (after LISTEN); returns 1 if one or more
 * arrived (all are drained), 0 on timeout, -1 on a broken connection. */
int db_wait_notify(PGconn *c, int timeout_ms);
/* The same, each notification's payload ("" when none) handed to each(payload, arg), when
 * not NULL (an idle executor tells its submits' hints from the scheduler's cycles);
 * returns how many arrived (0: none in timeout_ms; -1: the connection broke). */
int db_wait_notify_each(PGconn *c, int timeout_ms, void (*each)(const char *payload, void *arg), void *arg);

/* Integer conversions of result cells. */
int64_t db_int(const PGresult *r, int row, int col);
bool db_bool(const PGresult *r, int row, int col);
