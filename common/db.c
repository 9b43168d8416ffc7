/* db.c: libpq helpers. Errors are returned as values with the server's message. */
#include "common/db.h"
#include "common/clock.h"
#include "common/common_sql.h"
#include "common/log.h"
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static __thread char t_sqlstate[8];
static __thread char t_message[512];   /* the failure's primary message (db_last_message) */

static void set_err(char *err, size_t errlen, const char *msg) {
    if (!err || !errlen) return;
    snprintf(err, errlen, "%s", msg ? msg : "unknown database error");
    size_t n = strlen(err);
    while (n > 0 && (err[n - 1] == '\n' || err[n - 1] == ' ')) err[--n] = 0;
}

/* ---- reaching the server ----------------------------------------------------------------
 * One process has many connections (threads, pools); when the server goes away they all
 * fail and retry together. What is said about it is said once per process: the first
 * failure at once (where, and what is retried), then a line at most every 30 s, then how
 * long it took once a connection succeeds again. */

static const volatile sig_atomic_t *g_stop_flag;
static pthread_mutex_t g_outage_mu = PTHREAD_MUTEX_INITIALIZER;
static time_t g_outage_logged;   /* when the last outage message went out */
static time_t g_down_since;      /* the first failed attempt of this outage; 0: none */

void db_set_stop_flag(const volatile sig_atomic_t *flag) { g_stop_flag = flag; }
static bool stopping(void) { return g_stop_flag && *g_stop_flag; }

int db_outage_level(void) {
    pthread_mutex_lock(&g_outage_mu);
    int level = log_level_every(&g_outage_logged, 30, LOG_WARN_);
    pthread_mutex_unlock(&g_outage_mu);
    return level;
}

void db_describe(const char *conninfo, char *out, size_t n) {
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(conninfo, &perr);
    if (!opts) {
        snprintf(out, n, "database of a conninfo libpq cannot parse");
        if (perr) PQfreemem(perr);
        return;
    }
    const char *db = NULL, *host = NULL, *addr = NULL, *port = NULL, *user = NULL;
    for (PQconninfoOption *o = opts; o->keyword; o++) {
        if (!o->val || !*o->val) continue;
        if (!strcmp(o->keyword, "dbname")) db = o->val;
        else if (!strcmp(o->keyword, "host")) host = o->val;
        else if (!strcmp(o->keyword, "hostaddr")) addr = o->val;
        else if (!strcmp(o->keyword, "port")) port = o->val;
        else if (!strcmp(o->keyword, "user")) user = o->val;
    }
    snprintf(out, n, "database %s on %s%s%s as %s", db ? db : "(libpq's default)",
             host ? host : addr ? addr : "libpq's default host", port ? ":" : "", port ? port : "",
             user ? user : "the OS user");
    PQconninfoFree(opts);
}

static void describe_conn(const PGconn *c, char *out, size_t n) {
    snprintf(out, n, "database %s on %s:%s as %s", PQdb(c), PQhost(c), PQport(c), PQuser(c));
}

/* An attempt failed (where: db_describe's words); left_s > 0: db_connect retries for that
 * long yet, 0: the caller retries in its own time, < 0: no more tries. */
static void note_down(const char *where, const char *err, int left_s) {
    time_t now = time(NULL);
    pthread_mutex_lock(&g_outage_mu);
    bool first = !g_down_since;
    if (first) g_down_since = now;
    long down = (long)(now - g_down_since);
    int level = first ? (g_outage_logged = now, LOG_WARN_) : log_level_every(&g_outage_logged, 30, LOG_WARN_);
    pthread_mutex_unlock(&g_outage_mu);
    if (left_s < 0) level = LOG_DEBUG_;   /* the caller says why it gives up */
    char tail[96];
    if (left_s > 0) snprintf(tail, sizeof tail, "retrying every 0.1 s for up to %d s more (SIGTERM stops)", left_s);
    else snprintf(tail, sizeof tail, "retrying");
    if (first) log_msg(level, "cannot reach the %s: %s; %s", where, err, tail);
    else log_msg(level, "still cannot reach the %s after %ld s: %s; %s", where, down, err, tail);
}

static void note_up(const char *where) {
    pthread_mutex_lock(&g_outage_mu);
    time_t since = g_down_since;
    g_down_since = 0;
    pthread_mutex_unlock(&g_outage_mu);
    if (since) log_info("reached the %s again after %ld s", where, (long)(time(NULL) - since));
}

static void forget_session(const PGconn *c);

static char g_app_name[64];   /* db_set_app_name: fixed before any thread connects */

void db_set_app_name(const char *name) { snprintf(g_app_name, sizeof g_app_name, "%s", name ? name : ""); }

/* connect_timeout before dbname: a conninfo that sets its own overrides it. Without one,
 * libpq waits for an unreachable host as long as TCP does (minutes). The process's name
 * (db_set_app_name) is the fallback application_name: pg_stat_activity tells Loom's
 * processes apart, and a conninfo or a connection's own SET names it more closely. */
static PGconn *connect_once(const char *conninfo) {
    const char *const kw[] = {"connect_timeout", "fallback_application_name", "dbname", NULL},
                      *const val[] = {"10", g_app_name, conninfo, NULL};   /* "": none */
    return PQconnectdbParams(kw, val, 1);
}

static void session_start(PGconn *c) {
    PQsetErrorVerbosity(c, PQERRORS_DEFAULT);
    PQclear(PQexec(c, SQL_DB_QUIET));
    forget_session(c);   /* a finished connection's setup at this address is not this one's */
}

PGconn *db_probe(const char *conninfo, char *err, size_t errlen) {
    PGconn *c = connect_once(conninfo);
    if (PQstatus(c) == CONNECTION_OK) {
        session_start(c);
        return c;
    }
    set_err(err, errlen, PQerrorMessage(c));
    PQfinish(c);
    return NULL;
}

PGconn *db_connect(const char *conninfo, int wait_ms, char *err, size_t errlen) {
    double start = clock_mono_s();
    char where[512];
    db_describe(conninfo, where, sizeof where);
    for (;;) {
        PGconn *c = connect_once(conninfo);
        if (PQstatus(c) == CONNECTION_OK) {
            session_start(c);
            note_up(where);
            return c;
        }
        set_err(err, errlen, PQerrorMessage(c));
        PQfinish(c);
        long waited = (long)((clock_mono_s() - start) * 1000);
        bool last = waited >= wait_ms || stopping();
        note_down(where, err, last ? (wait_ms > 0 ? -1 : 0) : (int)((wait_ms - waited + 999) / 1000));
        if (last) {
            if (stopping() && err && errlen) {
                size_t l = strlen(err);
                snprintf(err + l, errlen - l, " (stopped while retrying)");
            }
            return NULL;
        }
        usleep(100 * 1000);
    }
}

/* ---- session setup (db.h) ----------------------------------------------------------------- */

typedef struct session {
    const PGconn *c;
    int n;
    db_setup_stmt *st;   /* texts owned */
    struct session *next;
} session;

static pthread_mutex_t g_sessions_mu = PTHREAD_MUTEX_INITIALIZER;
static session *g_sessions;

static void session_free(session *s) {
    for (int i = 0; i < s->n; i++) free((char *)s->st[i].sql), free((char *)s->st[i].param);
    free(s->st);
    free(s);
}

static void forget_session(const PGconn *c) {
    pthread_mutex_lock(&g_sessions_mu);
    for (session **p = &g_sessions; *p; p = &(*p)->next)
        if ((*p)->c == c) {
            session *s = *p;
            *p = s->next;
            session_free(s);
            break;
        }
    pthread_mutex_unlock(&g_sessions_mu);
}

static int run_setup(PGconn *c, const db_setup_stmt *st, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        const char *p[1] = {st[i].param};
        if (db_exec(c, st[i].sql, st[i].param ? 1 : 0, st[i].param ? p : NULL, err, errlen) < 0) return -1;
    }
    return 0;
}

int db_session_setup(PGconn *c, const db_setup_stmt *stmts, int n, char *err, size_t errlen) {
    if (run_setup(c, stmts, n, err, errlen) < 0) return -1;
    session *s = calloc(1, sizeof *s);
    if (s) s->st = calloc(n > 0 ? n : 1, sizeof *s->st);
    if (!s || !s->st) abort();
    s->c = c;
    s->n = n;
    for (int i = 0; i < n; i++) {
        s->st[i].sql = strdup(stmts[i].sql);
        s->st[i].param = stmts[i].param ? strdup(stmts[i].param) : NULL;
        if (!s->st[i].sql || (stmts[i].param && !s->st[i].param)) abort();
    }
    forget_session(c);
    pthread_mutex_lock(&g_sessions_mu);
    s->next = g_sessions;
    g_sessions = s;
    pthread_mutex_unlock(&g_sessions_mu);
    return 0;
}

bool db_reset(PGconn *c) {
    char where[512], err[512];
    describe_conn(c, where, sizeof where);
    PQreset(c);
    if (PQstatus(c) != CONNECTION_OK) {
        set_err(err, sizeof err, PQerrorMessage(c));
        note_down(where, err, 0);
        return false;
    }
    note_up(where);
    PQclear(PQexec(c, SQL_DB_QUIET));
    /* The entry of c is changed only by the thread that uses c (this one): its statements
     * may be read outside the lock. */
    pthread_mutex_lock(&g_sessions_mu);
    session *s = g_sessions;
    while (s && s->c != c) s = s->next;
    pthread_mutex_unlock(&g_sessions_mu);
    if (s && run_setup(c, s->st, s->n, err, sizeof err) < 0) {
        log_warn("the %s was reset, but its session could not be set up again (%s); closing it so that it "
                 "is reset again", where, err);
        /* A session without its LISTENs would wait silently: make the next use fail. */
        shutdown(PQsocket(c), SHUT_RDWR);
        PQconsumeInput(c);
        return false;
    }
    return true;
}

void db_finish(PGconn *c) {
    if (!c) return;
    forget_session(c);
    PQfinish(c);
}

/* ---- prepared statements -----------------------------------------------------------------
 * Every process runs a fixed set of statements (the *_sql.h headers) again and again, and
 * several are joins whose planning costs more than their execution. Each thread keeps,
 * per connection, which statements it has prepared there: the key is the connection and
 * its server process (a reconnect, even at the same address, is a new session without
 * them) and the statement's text. Statements that cannot be prepared (BEGIN, NOTIFY,
 * LISTEN, SET) and texts the table has no room for run unprepared. */

#define STMT_SLOTS 256

typedef struct {
    const PGconn *conn;
    int pid;
    uint64_t hash;
    size_t len;
} stmt_slot;

static __thread stmt_slot t_stmts[STMT_SLOTS];

static uint64_t fnv1a(const char *s, size_t *len) {
    uint64_t h = 1469598103934665603ULL;
    const char *p = s;
    for (; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    *len = (size_t)(p - s);
    return h;
}

static bool preparable(const char *sql) {
    while (*sql == ' ' || *sql == '(') sql++;
    return !strncmp(sql, "SELECT", 6) || !strncmp(sql, "WITH", 4) || !strncmp(sql, "INSERT", 6) ||
           !strncmp(sql, "UPDATE", 6) || !strncmp(sql, "DELETE", 6);
}

/* The name sql is prepared under on c ("" when it runs unprepared), preparing it if needed.
 * A slot of this connection object from an earlier session (PQreset, or a new connection
 * at a freed one's address) is taken over; the session's own slots are never evicted, so
 * the server never holds a statement the table does not know of. */
static void prepared_name(PGconn *c, const char *sql, int nparams, char name[24]) {
    name[0] = 0;
    if (!preparable(sql)) return;
    size_t len;
    uint64_t h = fnv1a(sql, &len);
    int pid = PQbackendPID(c);
    stmt_slot *slot = NULL;
    for (unsigned i = 0; i < STMT_SLOTS; i++) {
        stmt_slot *e = &t_stmts[(h + i) % STMT_SLOTS];
        if (e->conn == c && e->hash == h && e->len == len) {
            if (e->pid == pid) { snprintf(name, 24, "loom_%016llx", (unsigned long long)h); return; }
            slot = e;   /* prepared in an earlier session of this connection */
            break;
        }
        if (!slot && (!e->conn || (e->conn == c && e->pid != pid))) slot = e;
        if (!e->conn) break;
    }
    if (!slot) return;   /* the table is full: run it unprepared */
    snprintf(name, 24, "loom_%016llx", (unsigned long long)h);
    PGresult *r = PQprepare(c, name, sql, nparams, NULL);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok) { name[0] = 0; return; }
    *slot = (stmt_slot){c, pid, h, len};
}

PGresult *db_query(PGconn *c, const char *sql, int nparams, const char *const *params,
                   char *err, size_t errlen) {
    return db_query_bin(c, sql, nparams, params, NULL, NULL, 0, err, errlen);
}

PGresult *db_query_bin(PGconn *c, const char *sql, int nparams, const char *const *params, const int *lengths,
                       const int *formats, int result_format, char *err, size_t errlen) {
    t_sqlstate[0] = t_message[0] = 0;
    char name[24] = "";
    /* Outside a transaction a statement that cannot be prepared (its tables do not exist
     * yet) just runs unprepared; inside one its prepare would abort the transaction just
     * as running it would. */
    if (PQtransactionStatus(c) == PQTRANS_IDLE || PQtransactionStatus(c) == PQTRANS_INTRANS)
        prepared_name(c, sql, nparams, name);
    PGresult *r = name[0] ? PQexecPrepared(c, name, nparams, params, lengths, formats, result_format)
                          : PQexecParams(c, sql, nparams, NULL, params, lengths, formats, result_format);
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return r;
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE), *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    snprintf(t_sqlstate, sizeof t_sqlstate, "%s", state ? state : "");
    snprintf(t_message, sizeof t_message, "%s", primary ? primary : "");
    set_err(err, errlen, r ? PQresultErrorMessage(r) : PQerrorMessage(c));
    if (err && errlen && !err[0]) set_err(err, errlen, PQerrorMessage(c));
    PQclear(r);
    return NULL;
}

/* Reads what is left of a pipeline up to its sync; false when the connection broke
 * (two NULLs in a row: nothing more will come). */
static bool pipeline_drain(PGconn *c) {
    bool after_null = false;
    for (;;) {
        PGresult *r = PQgetResult(c);
        if (!r) {
            if (after_null || PQstatus(c) != CONNECTION_OK) return false;
            after_null = true; /* the end of one statement's results */
            continue;
        }
        after_null = false;
        ExecStatusType st = PQresultStatus(r);
        PQclear(r);
        if (st == PGRES_PIPELINE_SYNC) return true;
    }
}

/* Leaves pipeline mode after a broken batch. When libpq refuses (results it will never
 * get are still pending, e.g. the server ended the session), the connection is reset:
 * every other helper here needs one out of pipeline mode, and the transaction is lost
 * with the session anyway. The new session gets the connection's setup (LISTENs and
 * settings) again, as after any reset. */
static void pipeline_abandon(PGconn *c) {
    if (PQpipelineStatus(c) == PQ_PIPELINE_OFF || PQexitPipelineMode(c) == 1) return;
    db_reset(c);
}

int db_pipeline(PGconn *c, const db_stmt *st, int n, PGresult **res, char *err, size_t errlen) {
    return db_pipeline_bin(c, st, NULL, n, res, err, errlen);
}

int db_pipeline_bin(PGconn *c, const db_stmt *st, const db_bin *bin, int n, PGresult **res, char *err,
                    size_t errlen) {
    t_sqlstate[0] = t_message[0] = 0;
    if (err && errlen) err[0] = 0;
    for (int i = 0; i < n; i++) res[i] = NULL;
    /* Prepared before the batch (PQprepare is a round trip of its own, once per
     * connection and statement) while the transaction status still allows it. */
    char (*names)[24] = calloc(n > 0 ? n : 1, sizeof *names);
    if (!names) { set_err(err, errlen, "out of memory"); return 0; }
    if (PQtransactionStatus(c) == PQTRANS_IDLE || PQtransactionStatus(c) == PQTRANS_INTRANS)
        for (int i = 0; i < n; i++) prepared_name(c, st[i].sql, st[i].nparams, names[i]);
    bool sent = PQenterPipelineMode(c) == 1;
    for (int i = 0; sent && i < n; i++) {
        const int *lengths = bin ? bin[i].lengths : NULL, *formats = bin ? bin[i].formats : NULL;
        int rf = bin ? bin[i].result_format : 0;
        sent = (names[i][0] ? PQsendQueryPrepared(c, names[i], st[i].nparams, st[i].params, lengths, formats, rf)
                            : PQsendQueryParams(c, st[i].sql, st[i].nparams, NULL, st[i].params, lengths, formats,
                                                rf)) == 1;
    }
    free(names);
    if (sent) sent = PQpipelineSync(c) == 1;
    int ok = 0;
    bool failed = !sent, broken = !sent;
    if (!sent) set_err(err, errlen, PQerrorMessage(c));
    for (int i = 0; i < n && !broken; i++) {
        PGresult *r = PQgetResult(c);
        if (!r) { broken = true; break; }
        ExecStatusType s = PQresultStatus(r);
        if (!failed && (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK)) {
            res[i] = r;
            ok++;
        } else {
            if (!failed && s != PGRES_PIPELINE_ABORTED) {
                const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE),
                           *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
                snprintf(t_sqlstate, sizeof t_sqlstate, "%s", state ? state : "");
                snprintf(t_message, sizeof t_message, "%s", primary ? primary : "");
                set_err(err, errlen, PQresultErrorMessage(r));
            }
            failed = true;
            PQclear(r);
        }
        PGresult *end = PQgetResult(c); /* NULL: the end of this statement's results */
        if (end) { PQclear(end); broken = true; }
    }
    if (broken || !pipeline_drain(c) || PQexitPipelineMode(c) != 1) {
        for (int i = 0; i < n; i++) { PQclear(res[i]); res[i] = NULL; }
        if (err && errlen && !err[0]) set_err(err, errlen, PQerrorMessage(c));
        if (err && errlen && !err[0]) set_err(err, errlen, "the connection to the database broke");
        pipeline_abandon(c);
        return 0;
    }
    if (failed && err && errlen && !err[0]) set_err(err, errlen, "a statement of the batch was skipped");
    return ok;
}

int db_exec(PGconn *c, const char *sql, int nparams, const char *const *params, char *err,
            size_t errlen) {
    PGresult *r = db_query(c, sql, nparams, params, err, errlen);
    if (!r) return -1;
    PQclear(r);
    return 0;
}

/* The notification is a hint (whoever waits also polls): one that failed after its write
 * committed is logged, not returned, so that the caller answers for the committed write. */
static void notify_failed(const char *err) { log_warn("a notification after a commit was not sent: %s", err); }

PGresult *db_query_bin_notify(PGconn *c, const char *sql, int nparams, const char *const *params,
                              const int *lengths, const int *formats, int result_format, char *err,
                              size_t errlen) {
    db_stmt b[4] = {{SQL_BEGIN, 0, NULL}, {sql, nparams, params}, {SQL_COMMIT, 0, NULL}, {SQL_NOTIFY_LEFT, 0, NULL}};
    db_bin bin[4] = {{NULL, NULL, 0}, {lengths, formats, result_format}, {NULL, NULL, 0}, {NULL, NULL, 0}};
    PGresult *r[4];
    int got = db_pipeline_bin(c, b, bin, 4, r, err, errlen);
    PGresult *out = got >= 3 ? r[1] : NULL;
    for (int i = 0; i < 4; i++)
        if (r[i] != out) PQclear(r[i]);
    if (got == 3) notify_failed(err);
    if (got >= 3) {
        if (err && errlen) err[0] = 0;
        return out;
    }
    if (PQtransactionStatus(c) != PQTRANS_IDLE) db_rollback(c);
    return NULL;
}

int db_commit_notify(PGconn *c, const char *channel, const char *payload, char *err, size_t errlen) {
    const char *p[2] = {channel, payload ? payload : ""};
    db_stmt b[2] = {{SQL_COMMIT, 0, NULL}, {SQL_NOTIFY_AFTER, 2, p}};
    PGresult *r[2];
    int got = db_pipeline(c, b, 2, r, err, errlen);
    PQclear(r[0]);
    PQclear(r[1]);
    if (got == 1) notify_failed(err);
    if (got < 1) {
        if (PQtransactionStatus(c) != PQTRANS_IDLE) db_rollback(c);
        return -1;
    }
    if (err && errlen) err[0] = 0;
    return 0;
}

int db_begin(PGconn *c, char *err, size_t errlen) { return db_exec(c, SQL_BEGIN, 0, NULL, err, errlen); }
int db_commit(PGconn *c, char *err, size_t errlen) { return db_exec(c, SQL_COMMIT, 0, NULL, err, errlen); }
void db_rollback(PGconn *c) { PQclear(PQexec(c, SQL_ROLLBACK)); }
const char *db_last_sqlstate(void) { return t_sqlstate; }
const char *db_last_message(void) { return t_message; }

/* Takes the notifications libpq has read, each one's payload handed to each (when not
 * NULL): how many. */
static int take_notifies(PGconn *c, void (*each)(const char *payload, void *arg), void *arg) {
    int got = 0;
    PGnotify *n;
    while ((n = PQnotifies(c))) {
        got++;
        if (each) each(n->extra ? n->extra : "", arg);
        PQfreemem(n);
    }
    return got;
}

int db_wait_notify_each(PGconn *c, int timeout_ms, void (*each)(const char *payload, void *arg), void *arg) {
    if (!PQconsumeInput(c)) return -1;
    int got = take_notifies(c, each, arg);
    if (got) return got;
    struct pollfd p = {.fd = PQsocket(c), .events = POLLIN};
    int rc = poll(&p, 1, timeout_ms);
    if (rc < 0 && errno != EINTR) return -1;
    if (rc <= 0) return 0;
    if (!PQconsumeInput(c)) return -1;
    return take_notifies(c, each, arg);
}

int db_wait_notify(PGconn *c, int timeout_ms) {
    int n = db_wait_notify_each(c, timeout_ms, NULL, NULL);
    return n < 0 ? -1 : n > 0;
}

int64_t db_int(const PGresult *r, int row, int col) {
    if (PQgetisnull(r, row, col)) return 0;
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

bool db_bool(const PGresult *r, int row, int col) {
    return !PQgetisnull(r, row, col) && PQgetvalue(r, row, col)[0] == 't';
}
