/* test_db_pipeline.c — db_pipeline (common/db.c), the batch the scheduler's cycle build
 * and the executor's commit send in one round trip, on a private PostgreSQL: results in
 * order, parameters and prepared statements, a failure in the middle (the rest skipped,
 * the transaction left to roll back, the connection usable after), the same batch many
 * times (the prepared path), and a session the server ends under it (no hang, the
 * connection out of pipeline mode and usable again). And a connection's session setup
 * (db_session_setup: LISTEN, application_name) survives every reset: db_reset, and the
 * reset of a batch broken by a server that ended the session (before, the new session
 * had lost its LISTEN, and a loop on it waited out its poll on every cycle). And the
 * durable writes that notify after their commit (db_query_bin_notify, db_commit_notify):
 * the write committed, its notification after it with its payload, none for a statement
 * that leaves none or fails. */
#include "tests/check.h"
#include "common/clock.h"
#include "common/common_sql.h"
#include "tests/dbtest.h"

static void clear_all(PGresult **r, int n) {
    for (int i = 0; i < n; i++) PQclear(r[i]);
}

static void test_ok(void) {
    char err[512];
    const char *p[1] = {"41"};
    db_stmt b[4] = {{"BEGIN", 0, NULL}, {"SELECT $1::int + 1", 1, p}, {"INSERT INTO pipe_t VALUES (7)", 0, NULL},
                    {"COMMIT", 0, NULL}};
    PGresult *r[4];
    int got = db_pipeline(C, b, 4, r, err, sizeof err);
    CHECK(got == 4, "a batch of 4 statements: all 4 succeed (got %d: %s)", got, err);
    CHECK(got == 4 && PQntuples(r[1]) == 1 && !strcmp(PQgetvalue(r[1], 0, 0), "42"),
          "the parameterised SELECT's own result comes back in its place");
    CHECK(got == 4 && !strcmp(PQcmdTuples(r[2]), "1"), "the INSERT's row count comes back in its place");
    clear_all(r, 4);
    CHECK(PQpipelineStatus(C) == PQ_PIPELINE_OFF, "the connection is out of pipeline mode after the batch");
    CHECK(scalar("SELECT count(*) FROM pipe_t WHERE v = 7") == 1, "the batch's COMMIT committed");
    for (int k = 0; k < 50; k++) { /* the second and later runs take the prepared path */
        got = db_pipeline(C, b, 4, r, err, sizeof err);
        clear_all(r, 4);
        if (got != 4) break;
    }
    CHECK(got == 4 && scalar("SELECT count(*) FROM pipe_t WHERE v = 7") == 51, "50 more runs of the batch all commit");
}

static void test_failure(void) {
    char err[512];
    db_stmt b[4] = {{"BEGIN", 0, NULL}, {"INSERT INTO pipe_t VALUES (8)", 0, NULL}, {"SELECT 1 / (v - v) FROM pipe_t", 0, NULL},
                    {"INSERT INTO pipe_t VALUES (9)", 0, NULL}};
    PGresult *r[4];
    int got = db_pipeline(C, b, 4, r, err, sizeof err);
    CHECK(got == 2, "a failure in the 3rd statement: 2 leading successes reported (got %d)", got);
    CHECK(r[0] && r[1] && !r[2] && !r[3], "results for the two that ran, NULL for the failed and the skipped one");
    CHECK(strstr(err, "division by zero") != NULL, "err carries the server's message (%s)", err);
    CHECK(!strcmp(db_last_sqlstate(), "22012"), "db_last_sqlstate gives the failure's SQLSTATE (%s)", db_last_sqlstate());
    clear_all(r, 4);
    CHECK(PQpipelineStatus(C) == PQ_PIPELINE_OFF && PQtransactionStatus(C) == PQTRANS_INERROR,
          "out of pipeline mode, the transaction aborted and left for the caller");
    db_rollback(C);
    CHECK(scalar("SELECT count(*) FROM pipe_t WHERE v IN (8, 9)") == 0, "after the rollback nothing of the batch stayed");
}

static void test_terminated(void) {
    char err[512];
    PGconn *c = db_connect(conninfo, 10000, err, sizeof err);
    if (!c) dbt_die("connect", err);
    char q[96];
    snprintf(q, sizeof q, "SELECT pg_terminate_backend(%d)", PQbackendPID(c));
    text(q);
    db_stmt b[3] = {{"BEGIN", 0, NULL}, {"SELECT 1", 0, NULL}, {"COMMIT", 0, NULL}};
    PGresult *r[3];
    double t0 = clock_mono_s();
    int got = db_pipeline(c, b, 3, r, err, sizeof err);
    double s = clock_mono_s() - t0;
    clear_all(r, 3);
    CHECK(got == 0 && err[0], "a session the server ended: the batch fails with a message (%s)", err);
    CHECK(s < 10, "... at once, not hanging on results that never come (%.2f s)", s);
    CHECK(PQpipelineStatus(c) == PQ_PIPELINE_OFF, "the connection is out of pipeline mode");
    if (PQstatus(c) != CONNECTION_OK) PQreset(c); /* what the callers do on a broken connection */
    PGresult *ok = db_query(c, "SELECT 5", 0, NULL, err, sizeof err);
    CHECK(ok && !strcmp(PQgetvalue(ok, 0, 0), "5"), "and usable again for ordinary statements (%s)", ok ? "" : err);
    PQclear(ok);
    got = db_pipeline(c, b, 3, r, err, sizeof err);
    clear_all(r, 3);
    CHECK(got == 3, "and for batches (%s)", err);
    PQfinish(c);
}

/* Whether c's session LISTENs on channel and is named app. */
static bool session_is(PGconn *c, const char *channel, const char *app) {
    char err[256];
    PGresult *r = db_query(c, "SELECT (SELECT count(*) FROM pg_listening_channels() ch WHERE ch = $1),"
                              " current_setting('application_name')", 1, &channel, err, sizeof err);
    bool ok = r && !strcmp(PQgetvalue(r, 0, 0), "1") && !strcmp(PQgetvalue(r, 0, 1), app);
    PQclear(r);
    return ok;
}

/* A NOTIFY on channel from another session reaches c within 5 s. */
static bool notified(PGconn *c, const char *channel) {
    char q[96];
    snprintf(q, sizeof q, "NOTIFY %s", channel);
    sql(q);
    return db_wait_notify(c, 5000) == 1;
}

static void test_session_setup(void) {
    char err[512];
    PGconn *c = db_connect(conninfo, 10000, err, sizeof err);
    if (!c) dbt_die("connect", err);
    db_setup_stmt setup[2] = {{"SELECT set_config('application_name', $1, false)", "loom test 7"},
                              {"LISTEN pipe_wake", NULL}};
    CHECK(db_session_setup(c, setup, 2, err, sizeof err) == 0, "db_session_setup runs the statements (%s)", err);
    CHECK(session_is(c, "pipe_wake", "loom test 7") && notified(c, "pipe_wake"),
          "the session listens and is named");
    char q[96];
    snprintf(q, sizeof q, "SELECT pg_terminate_backend(%d)", PQbackendPID(c));
    int pid = PQbackendPID(c);
    text(q);
    PGresult *r = db_query(c, "SELECT 1", 0, NULL, err, sizeof err);   /* finds the session gone */
    PQclear(r);
    CHECK(PQstatus(c) != CONNECTION_OK && db_reset(c), "db_reset reconnects a connection whose session ended");
    CHECK(PQbackendPID(c) != pid && session_is(c, "pipe_wake", "loom test 7") && notified(c, "pipe_wake"),
          "the new session listens and is named again");
    snprintf(q, sizeof q, "SELECT pg_terminate_backend(%d)", PQbackendPID(c));
    pid = PQbackendPID(c);
    text(q);
    db_stmt b[3] = {{"BEGIN", 0, NULL}, {"SELECT 1", 0, NULL}, {"COMMIT", 0, NULL}};
    PGresult *rs[3];
    db_pipeline(c, b, 3, rs, err, sizeof err);   /* broken: the pipeline is abandoned with a reset */
    clear_all(rs, 3);
    if (PQstatus(c) != CONNECTION_OK) db_reset(c);
    CHECK(PQbackendPID(c) != pid && session_is(c, "pipe_wake", "loom test 7") && notified(c, "pipe_wake"),
          "after a batch broken by the session's end: listening and named again");
    db_finish(c);
}

static void keep_payload(const char *payload, void *arg) { snprintf((char *)arg, 64, "%s", payload); }

/* The next notification on l within ms: its payload in got ("" when none came). */
static void next_note(PGconn *l, int ms, char got[64]) {
    got[0] = 0;
    db_wait_notify_each(l, ms, keep_payload, got);
}

/* db_query_bin_notify and db_commit_notify: the write committed durably, its notification
 * after it, in a transaction of its own (common_sql.h, SQL_NOTIFY_AFTER). */
static void test_notify_after(void) {
    char err[512], got[64];
    PGconn *l = db_connect(conninfo, 10000, err, sizeof err);
    if (!l) dbt_die("connect", err);
    PGresult *lr = db_query(l, "LISTEN pipe_note", 0, NULL, err, sizeof err);
    PQclear(lr);
    const char *leave = "INSERT INTO pipe_t VALUES ($1::int) RETURNING v,"
                        " set_config('" DB_NOTIFY_LEFT "', $2, false)";
    const char *p1[2] = {"20", "pipe_note\nhello there"};
    PGresult *r = db_query_bin_notify(C, leave, 2, p1, NULL, NULL, 0, err, sizeof err);
    CHECK(r && PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "20"), "db_query_bin_notify: the statement's own"
          " result comes back (%s)", r ? "" : err);
    PQclear(r);
    CHECK(PQtransactionStatus(C) == PQTRANS_IDLE && scalar("SELECT count(*) FROM pipe_t WHERE v = 20") == 1,
          "its write is committed, the session out of any transaction");
    next_note(l, 5000, got);
    CHECK(!strcmp(got, "hello there"), "the notification it left arrives with its payload (\"%s\")", got);
    CHECK(scalar("SELECT (current_setting('synchronous_commit') = 'on')::int") == 1,
          "the session still commits durably (the notification's setting was its own transaction's)");
    CHECK(scalar("SELECT (current_setting('" DB_NOTIFY_LEFT "') = '')::int") == 1,
          "the notification sent, the setting that held it is empty: nothing is sent twice");
    const char *p2[2] = {"21", ""};
    r = db_query_bin_notify(C, leave, 2, p2, NULL, NULL, 0, err, sizeof err);
    PQclear(r);
    next_note(l, 300, got);
    CHECK(r && !got[0] && scalar("SELECT count(*) FROM pipe_t WHERE v = 21") == 1,
          "a statement that leaves '' commits and notifies nobody");
    const char *failing = "INSERT INTO pipe_t SELECT $1::int / 0 FROM (SELECT set_config('" DB_NOTIFY_LEFT "', $2,"
                          " false)) s";
    const char *p3[2] = {"22", "pipe_note\nnever"};
    r = db_query_bin_notify(C, failing, 2, p3, NULL, NULL, 0, err, sizeof err);
    next_note(l, 300, got);
    CHECK(!r && strstr(err, "division by zero") && PQtransactionStatus(C) == PQTRANS_IDLE && !got[0],
          "a statement that fails: NULL with the server's message, the session out of its transaction, no"
          " notification (%s)", err);
    CHECK(db_begin(C, err, sizeof err) == 0, "BEGIN");
    PGresult *ins = db_query(C, "INSERT INTO pipe_t VALUES (23)", 0, NULL, err, sizeof err);
    PQclear(ins);
    CHECK(db_commit_notify(C, "pipe_note", "bye", err, sizeof err) == 0 && PQtransactionStatus(C) == PQTRANS_IDLE,
          "db_commit_notify commits the open transaction (%s)", err);
    next_note(l, 5000, got);
    CHECK(scalar("SELECT count(*) FROM pipe_t WHERE v = 23") == 1 && !strcmp(got, "bye"),
          "its write is there and its notification arrives (\"%s\")", got);
    db_finish(l);
}

int main(void) {
    dbt_start("loom-pipe");
    sql("CREATE TABLE pipe_t (v int)");
    test_ok();
    test_failure();
    test_terminated();
    test_session_setup();
    test_notify_after();
    dbt_stop();
    return check_summary();
}
