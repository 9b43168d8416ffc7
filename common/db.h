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
