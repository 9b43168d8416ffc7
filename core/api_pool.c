/* api_pool.c: database worker threads (see api_pool.h). */
#include "core/api_pool.h"
#include "common/clock.h"
#include "common/db.h"
#include "common/log.h"
#include "core/api_auth.h"
#include "core/api_body.h"
#include "core/api_call.h"
#include "core/api_json.h"
#include "core/api_route.h"
#include "core/core_sql.h"
#include <malloc.h>
#include <pthread.h>
#include <strings.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct worker {
    api_pool *pool;
    int index;
    PGconn *db;
    pthread_t tid;
    double failed_at;   /* clock_mono_s() of the last failed connection attempt; 0: none since */
} worker;

struct api_pool {
    api_pool_conf conf;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    h2o_linklist_t queue;  /* api_job.msg.link */
    int queued;
    worker *workers;
};

static PGconn *connect_worker(const char *conninfo, int wait_ms, char *err, size_t errlen) {
    PGconn *c = db_connect(conninfo, wait_ms, err, errlen);
    if (!c) return NULL;
    /* every session: a reset (after a pipeline broken by a restart) keeps the timeout */
    static const db_setup_stmt setup[] = {{SQL_WORKER_TIMEOUT, NULL}, {SQL_WORKER_NAME, NULL}};
    if (db_session_setup(c, setup, 2, err, errlen) < 0) {
        db_finish(c);
        return NULL;
    }
    return c;
}

#define RECONNECT_EVERY_MS 1000

/* Makes sure the worker has a usable connection; reconnects after a failure, at most
 * once a second while the database stays away (held long polls come back every
 * second, and each would otherwise try). */
static bool ensure_db(worker *w, char *err, size_t errlen) {
    if (w->db && PQstatus(w->db) == CONNECTION_OK) return true;
    double now = clock_mono_s();
    if (w->failed_at && (now - w->failed_at) * 1000 < RECONNECT_EVERY_MS) {
        snprintf(err, errlen, "database unavailable (reconnecting)");
        return false;
    }
    db_finish(w->db);
    w->db = connect_worker(w->pool->conf.conninfo, 0, err, errlen);
    if (!w->db) {
        w->failed_at = now;   /* db_connect said so, once for the process */
        return false;
    }
    w->failed_at = 0;
    return true;
}

/* The scope a route needs (see ROUTE_READ in api_route.h); 0 = any tenant key. */
static unsigned route_scope(const api_route *r) {
    if (r->flags & ROUTE_ADMIN) return SCOPE_ADMIN;
    if (r->flags & ROUTE_METRICS) return SCOPE_METRICS;
    if (r->flags & ROUTE_SAMPLE) return SCOPE_SAMPLE;
    if ((r->flags & ROUTE_READ) || !strcmp(r->method, "GET")) return 0;
    return SCOPE_TRAIN;
}

static const char *scope_name(unsigned s) {
    return s == SCOPE_TRAIN ? "train" : s == SCOPE_SAMPLE ? "sample" : s == SCOPE_READ ? "read"
           : s == SCOPE_ADMIN ? "admin" : "metrics";
}

/* Whether a key with these scopes may call the route. An admin key may also scrape
 * /metrics; a key with only admin or metrics is an operator's, for no tenant's data. */
static bool scope_allows(unsigned scopes, const api_route *r) {
    unsigned need = route_scope(r), tenant = SCOPE_TRAIN | SCOPE_SAMPLE | SCOPE_READ;
    unsigned have_bits = scopes | (scopes & SCOPE_ADMIN ? SCOPE_METRICS : 0);
    if (r->flags & ROUTE_ANY_KEY) return true;
    if (need == SCOPE_ADMIN || need == SCOPE_METRICS) return have_bits & need;
    return (scopes & tenant) && (!need || (scopes & need));
}

/* 0, or the 403 is answered (scope_allows says no; this says why). */
static int check_scope(api_call *c, const api_route *r) {
    unsigned need = route_scope(r), tenant = SCOPE_TRAIN | SCOPE_SAMPLE | SCOPE_READ;
    if (scope_allows(c->scopes, r)) return 0;
    if (need == SCOPE_ADMIN || need == SCOPE_METRICS) {
        api_error(c, 403, "%s needs an operator key: one with the '%s' scope%s (`loom key create --tenant "
                          "NAME --scopes %s`)", r->path, scope_name(need),
                  need == SCOPE_METRICS ? " or 'admin'" : "", scope_name(need));
        return -1;
    }
    if (!(c->scopes & tenant)) {
        api_error(c, 403, "this API key only has operator scopes (admin, metrics); tenant routes need a "
                          "key with train, sample or read");
        return -1;
    }
    if (!(c->scopes & (SCOPE_TRAIN | SCOPE_SAMPLE))) {
        api_error(c, 403, "this API key is read-only");
        return -1;
    }
    char have[48] = "";
    for (unsigned s = SCOPE_TRAIN; s <= SCOPE_METRICS; s <<= 1)
        if (c->scopes & s) snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s",
                                    *have ? "," : "", scope_name(s));
    api_error(c, 403, "this API key lacks the '%s' scope (it has: %s); create a key with "
                      "`loom key create --scopes %s,...`", scope_name(need), have, scope_name(need));
    return -1;
}

static bool is_proto(const char *content_type) {
    return content_type && !strncasecmp(content_type, "application/x-protobuf", 22);
}

/* Decodes Content-Encoding, then parses JSON unless the route takes a protobuf body and
 * got one. 0, or the 4xx is answered. */
static int read_body(api_call *c, const api_route *r) {
    api_job *job = c->job;
    if (r->flags & ROUTE_RAW_BODY) return 0;
    int st = api_body_decode(job, c->settings->max_body, c->err, sizeof c->err);
    if (st) {
        api_error(c, st, "%s", c->err);
        if (st == 503) job->retry_after = 1;
        return -1;
    }
    if (is_proto(job->content_type)) {
        if (!r->proto_budget) {
            api_error(c, 415, "%s takes a JSON body (Content-Type: application/json); only "
                              "forward_backward also takes application/x-protobuf", r->path);
            return -1;
        }
        /* Its decoding draws from the process's decode budget, as a JSON parse does
         * (api_json.h): reserved before it starts, given back when the job is done. */
        size_t budget = r->proto_budget(job->body_len);
        if (budget > jx_decode_limit()) {
            api_error(c, 413, "request body is too large to decode: its %zu bytes of protobuf may take up to %zu "
                              "MiB, more than this server's limit of %zu MiB (loom api --max-decode-mb)",
                      job->body_len, budget >> 20, jx_decode_limit() >> 20);
            return -1;
        }
        if (!jx_decode_take(budget)) {
            api_error(c, 503, "server busy: other request bodies being decoded hold the memory for it (loom api "
                              "--max-decode-mb %zu); retry shortly", jx_decode_limit() >> 20);
            job->retry_after = 1;
            return -1;
        }
        c->proto_body = true;
        return 0;
    }
    int st400;
    c->body = jx_parse_body(job->body, job->body_len, c->err, sizeof c->err, &st400);
    free(job->body); /* parsed: the text is not needed again (bodies reach 64 MiB) */
    job->body = NULL;
    if (!c->body) {
        api_error(c, st400, "%s", c->err);
        if (st400 == 503) job->retry_after = 1;
        return -1;
    }
    return 0;
}

static void run_job_body(worker *w, api_job *job);

/* A job, then what decoding its body took goes back: its draw of the decode budget, and,
 * after a large body, the freed blocks of its parse tree to the system (glibc keeps them
 * in the thread's heap otherwise: 2.6 GB stayed held after four 33 MB bodies). */
static void run_job(worker *w, api_job *job) {
    size_t body = job->body_len;
    run_job_body(w, job);
    jx_decode_release();
    if (body >= (1u << 20)) malloc_trim(0);
}

static void run_job_body(worker *w, api_job *job) {
    api_call c;
    memset(&c, 0, sizeof c);
    c.job = job;
    c.settings = &w->pool->conf.settings;
    const api_route *r = job->route;
    if (!job->recheck && api_check_request_text(&c) < 0) return;
    if (!ensure_db(w, c.err, sizeof c.err)) {
        if (r->flags & ROUTE_DB_OPTIONAL) r->run(&c);
        else api_db_error(&c, r->path, c.err);
        return;
    }
    c.db = w->db;
    if (!(r->flags & ROUTE_NO_AUTH) && !job->recheck) {
        int rc = api_auth_key(w->db, w->pool->conf.secret, job->api_key, &c.tenant_id, &c.key_id,
                              &c.scopes, job->tenant_name, sizeof job->tenant_name, c.err, sizeof c.err);
        /* The first statement on a connection the server dropped (restart, idle timeout)
         * fails; auth only reads, so reconnect and try once more. */
        if (rc < 0 && PQstatus(w->db) == CONNECTION_BAD && ensure_db(w, c.err, sizeof c.err)) {
            c.db = w->db;
            rc = api_auth_key(w->db, w->pool->conf.secret, job->api_key, &c.tenant_id, &c.key_id,
                              &c.scopes, job->tenant_name, sizeof job->tenant_name, c.err, sizeof c.err);
        }
        if (rc < 0 && (r->flags & ROUTE_DB_OPTIONAL)) {
            c.db = NULL;
            r->run(&c);
            return;
        }
        if (rc < 0) {
            api_db_error(&c, "authentication", c.err);
            return;
        }
        if (rc > 0) {
            api_error(&c, 401, "%s", c.err);
            return;
        }
        if (check_scope(&c, r) < 0) return;
    }
    if (!job->recheck && read_body(&c, r) < 0) return;
    r->run(&c);
    json_decref(c.body);
    PGTransactionStatusType ts = PQtransactionStatus(w->db);
    if (ts == PQTRANS_INTRANS || ts == PQTRANS_INERROR) {
        log_error("%s left a transaction open; rolled back", r->path);
        db_rollback(w->db);
    }
    if (!job->status) api_error(&c, 500, "internal error: %s produced no response", r->path);
}

/* The gate's question (http_gate.h), before a request's body is read: is its key valid?
 * status 200 (key_id set), 401 or 503, with the reason in resp. */
static void run_gate_auth(worker *w, api_job *job) {
    char err[512] = "";
    int64_t tenant, key_id = 0;
    unsigned scopes;
    int rc = -1;
    for (int tries = 0; tries < 2 && rc < 0; tries++) {
        /* the first statement on a connection the server dropped fails: once more */
        if (!ensure_db(w, err, sizeof err)) break;
        rc = api_auth_key(w->db, w->pool->conf.secret, job->api_key, &tenant, &key_id, &scopes, job->tenant_name,
                          sizeof job->tenant_name, err, sizeof err);
        if (rc < 0 && PQstatus(w->db) != CONNECTION_BAD) break;
    }
    job->status = rc == 0 ? 200 : rc > 0 ? 401 : 503;
    job->key_id = key_id;
    job->resp = strdup(err);
    job->resp_len = job->resp ? strlen(job->resp) : 0;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    api_pool *p = w->pool;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (h2o_linklist_is_empty(&p->queue)) pthread_cond_wait(&p->cv, &p->mu);
        api_job *job = H2O_STRUCT_FROM_MEMBER(api_job, msg.link, p->queue.next);
        h2o_linklist_unlink(&job->msg.link);
        p->queued--;
        pthread_mutex_unlock(&p->mu);

        if (job->gate_auth) run_gate_auth(w, job);
        else run_job(w, job);
        h2o_multithread_send_message(job->reply_to, &job->msg);
    }
    return NULL;
}

api_pool *api_pool_start(const api_pool_conf *conf, int connect_wait_ms, char *err, size_t errlen) {
    api_pool *p = calloc(1, sizeof *p);
    if (!p) abort();
    p->conf = *conf;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    h2o_linklist_init_anchor(&p->queue);
    p->workers = calloc((size_t)conf->nworkers, sizeof *p->workers);
    if (!p->workers) abort();
    for (int i = 0; i < conf->nworkers; i++) {
        worker *w = &p->workers[i];
        w->pool = p;
        w->index = i;
        w->db = connect_worker(conf->conninfo, i == 0 ? connect_wait_ms : 5000, err, errlen);
        if (!w->db) return NULL;
    }
    for (int i = 0; i < conf->nworkers; i++) {
        if (pthread_create(&p->workers[i].tid, NULL, worker_main, &p->workers[i]) != 0) {
            snprintf(err, errlen, "cannot start worker thread");
            return NULL;
        }
    }
    return p;
}

/* The largest body the loop parses for a first look: a request that only names what it
 * asks for. */
#define FIRST_LOOK_MAX_BODY 4096

int api_pool_first_look(api_pool *p, api_job *job) {
    const api_route *r = job->route;
    if (!r->first_look || (r->flags & (ROUTE_NO_AUTH | ROUTE_RAW_BODY)) || job->recheck ||
        job->body_len > FIRST_LOOK_MAX_BODY || is_proto(job->content_type) || !api_body_plain(job))
        return 0;
    api_call c;
    memset(&c, 0, sizeof c);
    c.job = job;
    c.settings = &p->conf.settings;
    if (api_check_request_text(&c) < 0) return 1;   /* its 400 is answered */
    if (api_auth_key_cached(p->conf.secret, job->api_key, &c.tenant_id, &c.key_id, &c.scopes, job->tenant_name,
                            sizeof job->tenant_name) < 0 || !scope_allows(c.scopes, r))
        return 0;
    int st400;
    c.body = jx_parse_body(job->body, job->body_len, c.err, sizeof c.err, &st400);
    int answered = c.body && r->first_look(&c);
    json_decref(c.body);
    jx_decode_release();
    if (!answered) {   /* the worker starts from the beginning */
        job->status = 0;
        job->park = false;
        job->recheck = false;
        free(job->resp);
        job->resp = NULL;
        job->resp_len = 0;
    }
    return answered;
}

int api_pool_submit(api_pool *p, api_job *job) {
    pthread_mutex_lock(&p->mu);
    if (p->queued >= p->conf.max_queue) {
        pthread_mutex_unlock(&p->mu);
        return -1;
    }
    h2o_linklist_insert(&p->queue, &job->msg.link);
    p->queued++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}
