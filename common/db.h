/* db.h: small helpers over libpq's synchronous API, for processes and threads that
 * may block (scheduler, executor, CLI, the api's worker threads; never an h2o loop). */
#pragma once
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Connects, retrying for up to wait_ms (the server may still be starting). */
PGconn *db_connect(const char *conninfo, int wait_ms, char *err, size_t errlen);

/* Runs a statement with text parameters. Returns the result when its status is
 * COMMAND_OK or TUPLES_OK, else NULL with the server's message in err. */
PGresult *db_query(PGconn *c, const char *sql, int nparams, const char *const *params,
                   char *err, size_t errlen);
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

int db_begin(PGconn *c, char *err, size_t errlen);
int db_commit(PGconn *c, char *err, size_t errlen);
void db_rollback(PGconn *c);

/* SQLSTATE of the last failed db_query/db_exec on this thread ("" if none). */
const char *db_last_sqlstate(void);

/* Waits up to timeout_ms for a NOTIFY on c (after LISTEN); returns 1 if one or more
 * arrived (all are drained), 0 on timeout, -1 on a broken connection. */
int db_wait_notify(PGconn *c, int timeout_ms);

/* Integer conversions of result cells. */
int64_t db_int(const PGresult *r, int row, int col);
bool db_bool(const PGresult *r, int row, int col);
