/* http_server.c: h2o event loops for the api process (see http_server.h).
 *
 * Threads: each loop owns its listener socket, its h2o context and a multithread queue
 * with two receivers: finished jobs from the workers, and request ids from the LISTEN
 * thread (a loop extension adds its own: the OpenAI routes' progress lines). Nothing here
 * blocks: the database is only reached through api_pool.
 *
 * Routes come from the table in http_conf (api/api_routes.c); what a route room does on
 * the loop comes through the route's hooks (api_route.h) and the loop extensions: this
 * file names no route room.
 *
 * Client gone: every job hands its request a small ref object allocated with
 * h2o_mem_alloc_shared in req->pool; when h2o frees the request, the ref's dispose
 * callback detaches the job (or frees it if parked), so a worker's late answer is dropped. */
#include "core/http_server.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "core/api_json.h"
#include "core/api_metrics.h"
#include "core/http_gate.h"
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <fcntl.h>

#define LONG_POLL_MS 25000  /* answer try_again after this (the SDK's timeout is 45 s) */
#define RECHECK_MS 1000     /* parked futures look at the database at least this often */
#define RECENT_NOTIFY 128   /* notifications remembered per loop to close the park race */

struct http_req_ref {
    api_job *job;           /* NULL once answered */
    h2o_req_t *req;
};

typedef struct {
    h2o_multithread_message_t super;
    bool all;
    char id[API_REQUEST_ID_MAX];
    char *note;   /* malloc'd: the payload, when it carries a result after the id */
} notify_msg;

struct http_loop {
    int index;
    int fd;
    pthread_t tid;
    h2o_evloop_t *evloop;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    h2o_multithread_queue_t *queue;
    h2o_multithread_receiver_t job_receiver;
    h2o_multithread_receiver_t notify_receiver;
    h2o_timeout_t recheck_timeout;
    h2o_linklist_t parked;  /* api_job.parked */
    struct {
        char id[API_REQUEST_ID_MAX];
        uint64_t at;
    } recent[RECENT_NOTIFY];
    int recent_next;
    /* each loop extension's slot in ctx's storage (http_loop_ext: its state for this loop) */
    size_t ext_key[HTTP_MAX_LOOP_EXTS];
    gate_loop *gate;        /* request heads before h2o reads their bodies (http_gate.h) */
};

static struct {
    http_conf conf;
    char prefix[256];
    size_t prefix_len;
    api_pool *pool;
    h2o_globalconf_t globalconf;
    SSL_CTX *ssl_ctx;
    http_loop *loops;
    int nloops;
    h2o_barrier_t ready;
    const http_loop_ext *exts[HTTP_MAX_LOOP_EXTS];
    int nexts;
} g;

/* ---- responses -------------------------------------------------------------------- */

static const char *reason_phrase(int status) {
    switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return status < 400 ? "OK" : "Error";
    }
}

static void send_typed(h2o_req_t *req, int status, const char *content_type, int retry_after,
                       const char *body, size_t len) {
    req->res.status = status;
    req->res.reason = status == 302 ? "Found" : reason_phrase(status);
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, content_type,
                   strlen(content_type));
    if (retry_after > 0) {
        char ra[16];
        int n = snprintf(ra, sizeof ra, "%d", retry_after);
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_RETRY_AFTER, NULL,
                       h2o_strdup(&req->pool, ra, (size_t)n).base, (size_t)n);
    }
    /* 501 is >= 500, which the SDK would retry for minutes; tell it not to. */
    if (status == 501)
        h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-should-retry"), 0, NULL,
                              H2O_STRLIT("false"));
    req->res.content_length = len;
    h2o_send_inline(req, body, len); /* copies body into req->pool */
}

static void send_response(h2o_req_t *req, int status, const char *body, size_t len) {
    send_typed(req, status, "application/json", 0, body, len);
}

/* An error the loop answers takes the shape of its path's routes (api_route_table.shapes:
 * the OpenAI routes' /v1/..., docs/protocol.md §18.1), else {"detail": "..."}. */
static char *error_body(h2o_req_t *req, int status, const char *msg, size_t *len) {
    const char *p = req->path_normalized.base;
    size_t n = req->path_normalized.len;
    if (g.prefix_len && n >= g.prefix_len && !memcmp(p, g.prefix, g.prefix_len)) p += g.prefix_len, n -= g.prefix_len;
    const api_error_shape *shape = api_route_path_shape(g.conf.routes, p, n);
    return shape ? shape->body(status, msg, NULL, NULL, len) : jx_detail(msg, len);
}

static void send_error_retry(h2o_req_t *req, int status, int retry_after, const char *msg) {
    size_t len;
    char *body = error_body(req, status, msg, &len);
    send_typed(req, status, "application/json", retry_after, body, len);
    free(body);
}

static void send_error(h2o_req_t *req, int status, const char *msg) { send_error_retry(req, status, 0, msg); }

/* Printable ASCII copy of a client-supplied string, for messages and logs. */
static void safe_copy(char *out, size_t n, const char *s, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len && o + 1 < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        out[o++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    out[o] = 0;
}

/* ---- the access log ---------------------------------------------------------------- */

static double begun_at(h2o_req_t *req) {
    struct timeval *t = &req->timestamps.request_begin_at;
    return t->tv_sec ? t->tv_sec + t->tv_usec / 1e6 : clock_wall_s();
}

/* The X-Request-Id of req: the one on_req set on the response, else the client's (or a
 * new one when neither is usable). */
static void log_id_of(h2o_req_t *req, char out[API_LOG_ID_MAX]) {
    h2o_headers_t *h = &req->res.headers;
    ssize_t i = h2o_find_header_by_str(h, H2O_STRLIT("x-request-id"), -1);
    if (i < 0) i = h2o_find_header_by_str(h = &req->headers, H2O_STRLIT("x-request-id"), -1);
    api_log_id(i >= 0 ? h->entries[i].value.base : NULL, i >= 0 ? h->entries[i].value.len : 0, out);
}

/* A request answered on the loop (no worker): counted and logged. */
static void observe_inline(h2o_req_t *req, const api_route *r, bool by_h2o, int status, const char *reason) {
    char method[16], id[API_LOG_ID_MAX];
    safe_copy(method, sizeof method, req->method.base, req->method.len);
    log_id_of(req, id);
    api_access a = {.route = r, .by_h2o = by_h2o, .method = method, .status = status, .tenant = "",
                    .log_id = id, .seconds = clock_wall_s() - begun_at(req), .reason = reason};
    api_observe(&a);
}

/* ---- h2o's own errors as JSON (413 above all) -------------------------------------- */

/* h2o answers some errors itself (413 entity too large, 400 bad request line...) with a
 * text/plain body. This output filter replaces such bodies with {"detail": "..."}. */
typedef struct {
    h2o_ostream_t super;
    h2o_iovec_t json;
} json_error_ostream;

static void json_error_do_send(h2o_ostream_t *_self, h2o_req_t *req, h2o_iovec_t *bufs,
                               size_t bufcnt, h2o_send_state_t state) {
    json_error_ostream *self = (json_error_ostream *)_self;
    if (h2o_send_state_is_in_progress(state)) {
        h2o_ostream_send_next(&self->super, req, NULL, 0, state);
        return;
    }
    h2o_ostream_send_next(&self->super, req, &self->json, 1, state);
}

static void json_error_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot) {
    ssize_t ct = h2o_find_header(&req->res.headers, H2O_TOKEN_CONTENT_TYPE, -1);
    bool plain = ct >= 0 && req->res.headers.entries[ct].value.len >= 10 &&
                 !memcmp(req->res.headers.entries[ct].value.base, "text/plain", 10);
    if (req->res.status >= 400 && plain) {
        char msg[256];
        if (req->res.status == 413)
            snprintf(msg, sizeof msg, "request body is larger than this server's limit of %zu MiB "
                                      "(loom api --max-body-mb)", g.conf.max_body >> 20);
        else
            snprintf(msg, sizeof msg, "%s", req->res.reason ? req->res.reason : "request failed");
        observe_inline(req, NULL, true, req->res.status, msg);
        size_t len;
        char *body = error_body(req, req->res.status, msg, &len);
        json_error_ostream *o = (json_error_ostream *)h2o_add_ostream(req, sizeof *o, slot);
        o->super.do_send = json_error_do_send;
        o->json = h2o_strdup(&req->pool, body, len);
        free(body);
        h2o_set_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE,
                       H2O_STRLIT("application/json"), 1);
        req->res.content_length = o->json.len;
        slot = &o->super.next;
    }
    h2o_setup_next_ostream(req, slot);
}

/* ---- jobs --------------------------------------------------------------------------- */

void api_job_free(api_job *job) {
    gate_hold_release(job->hold);
    if (job->ext) job->loop_ext->ext_free(job->ext);
    free(job->body);
    free(job->api_key);
    free(job->accept);
    free(job->content_type);
    free(job->content_encoding);
    free(job->path_arg);
    free(job->query);
    free(job->base_url);
    free(job->location);
    free(job->expires);
    free(job->range);
    free(job->resp_headers);
    free(job->resp);
    free(job->recheck_arg);
    free(job->done_note);
    free(job);
}

static void unpark(api_job *job) {
    if (h2o_timeout_is_linked(&job->timer)) h2o_timeout_unlink(&job->timer);
    if (h2o_linklist_is_linked(&job->parked)) h2o_linklist_unlink(&job->parked);
}

static void on_ref_dispose(void *p) {
    http_req_ref *ref = p;
    api_job *job = ref->job;
    if (!job) return;
    job->ref = NULL;
    api_metrics_in_flight(-1);
    api_observe_job(job, 499, clock_wall_s());   /* nginx's "client closed request" */
    if (job->where == JOB_PARKED) {
        unpark(job);
        api_job_free(job);
    }
    /* at a worker: freed when it comes back */
}

/* Large bodies (archive downloads) go out in chunks as the connection asks for more
 * (the generator's proceed), from the worker's buffer, not copied into req->pool. */
#define STREAM_MIN (256 * 1024)
#define STREAM_CHUNK (256 * 1024)
typedef struct {
    h2o_generator_t super;
    char *buf;
    size_t len, off;
} body_stream;

static void body_stream_proceed(h2o_generator_t *self, h2o_req_t *req) {
    body_stream *b = (body_stream *)self;
    size_t n = b->len - b->off < STREAM_CHUNK ? b->len - b->off : STREAM_CHUNK;
    h2o_iovec_t v = h2o_iovec_init(b->buf + b->off, n);
    b->off += n;
    h2o_send(req, &v, 1, b->off == b->len ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
}

static void body_stream_stop(h2o_generator_t *self, h2o_req_t *req) { (void)self, (void)req; }

static void body_stream_dispose(void *p) { free(((body_stream *)p)->buf); }

/* "name: value\n" lines of a worker's extra response headers. */
static void add_resp_headers(h2o_req_t *req, const char *lines) {
    for (const char *l = lines; l && *l;) {
        const char *nl = strchr(l, '\n'), *end = nl ? nl : l + strlen(l), *colon = memchr(l, ':', end - l);
        if (colon && colon > l) {
            const char *v = colon + 1;
            while (v < end && *v == ' ') v++;
            h2o_iovec_t name = h2o_strdup(&req->pool, l, colon - l), val = h2o_strdup(&req->pool, v, end - v);
            h2o_strtolower(name.base, name.len);   /* HTTP/2 wants lower-case names; h2o's tokens are */
            h2o_add_header_by_str(&req->pool, &req->res.headers, name.base, name.len, 1, NULL, val.base, val.len);
        }
        l = nl ? nl + 1 : end;
    }
}

static void finish_job(api_job *job) {
    http_req_ref *ref = job->ref;
    ref->job = NULL;
    job->ref = NULL;
    api_metrics_in_flight(-1);
    api_observe_job(job, job->status, clock_wall_s());
    h2o_req_t *req = ref->req;
    if (job->location)
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_LOCATION, NULL,
                       h2o_strdup(&req->pool, job->location, SIZE_MAX).base, strlen(job->location));
    if (job->expires)
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_EXPIRES, NULL,
                       h2o_strdup(&req->pool, job->expires, SIZE_MAX).base, strlen(job->expires));
    add_resp_headers(req, job->resp_headers);
    if (job->resp && job->resp_len >= STREAM_MIN) {
        body_stream *b = h2o_mem_alloc_shared(&req->pool, sizeof *b, body_stream_dispose);
        *b = (body_stream){.super = {body_stream_proceed, body_stream_stop}, .buf = job->resp, .len = job->resp_len};
        job->resp = NULL;
        req->res.status = job->status;
        req->res.reason = reason_phrase(job->status);
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, job->resp_type ? job->resp_type
                       : "application/json", strlen(job->resp_type ? job->resp_type : "application/json"));
        req->res.content_length = b->len;
        api_job_free(job);
        h2o_start_response(req, &b->super);
        body_stream_proceed(&b->super, req);
        return;
    }
    send_typed(req, job->status, job->resp_type ? job->resp_type : "application/json",
               job->retry_after, job->resp ? job->resp : "{}", job->resp ? job->resp_len : 2);
    api_job_free(job);
}

/* Before a job is answered again (by a worker, or from a note on the loop). */
static void clear_answer(api_job *job) {
    job->status = 0;
    job->park = false;
    job->retry_after = 0;
    job->resp_type = NULL;
}

static void dispatch(http_loop *L, api_job *job) {
    job->where = JOB_AT_WORKER;
    job->dispatched_ms = h2o_now(L->evloop);
    clear_answer(job);
    if (api_pool_submit(g.pool, job) < 0) {
        free(job->resp);
        job->status = 503;
        job->resp = jx_detail("server busy: too many requests waiting for the database; retry "
                              "shortly", &job->resp_len);
        finish_job(job);
    }
}

static void on_recheck_timer(h2o_timeout_entry_t *entry) {
    api_job *job = H2O_STRUCT_FROM_MEMBER(api_job, timer, entry);
    unpark(job);
    dispatch(job->loop, job);
}

static bool notified_since(http_loop *L, const char *id, uint64_t since) {
    for (int i = 0; i < RECENT_NOTIFY; i++)
        if (L->recent[i].at >= since && L->recent[i].id[0] && !strcmp(L->recent[i].id, id))
            return true;
    return false;
}

static void park(http_loop *L, api_job *job) {
    if (notified_since(L, job->request_id, job->dispatched_ms)) {
        dispatch(L, job); /* finished while the worker was looking */
        return;
    }
    job->where = JOB_PARKED;
    h2o_linklist_insert(&L->parked, &job->parked);
    job->timer.cb = on_recheck_timer;
    h2o_timeout_link(L->evloop, &L->recheck_timeout, &job->timer);
}

/* ---- loop extensions ---------------------------------------------------------------- */

int http_loop_ext_add(const http_loop_ext *ext) {
    if (g.nexts == HTTP_MAX_LOOP_EXTS) return -1;
    g.exts[g.nexts++] = ext;
    return 0;
}

/* Extension i's state on loop L (set by loop_main). */
static void *ext_state(http_loop *L, int i) { return *h2o_context_get_storage(&L->ctx, &L->ext_key[i], NULL); }

static int ext_index(const http_loop_ext *ext) {
    for (int i = 0; i < g.nexts; i++)
        if (g.exts[i] == ext) return i;
    return -1;
}

int http_loop_submit(http_loop *L, api_job *job) {
    job->loop = L;
    job->reply_to = &L->job_receiver;
    job->where = JOB_AT_WORKER;
    return api_pool_submit(g.pool, job);
}

/* A job with its answer (a worker's, or the loop's first look): sent, or parked when
 * the answer says to wait (until its long poll's deadline). */
static void job_answered(http_loop *L, api_job *job, uint64_t now) {
    if (job->park) {
        if (!job->deadline_ms) job->deadline_ms = now + (job->hold_ms ? job->hold_ms : LONG_POLL_MS);
        if (now < job->deadline_ms) {
            park(L, job);
            return;
        }
    }
    finish_job(job);
}

static void on_jobs_back(h2o_multithread_receiver_t *receiver, h2o_linklist_t *messages) {
    http_loop *L = H2O_STRUCT_FROM_MEMBER(http_loop, job_receiver, receiver);
    uint64_t now = h2o_now(L->evloop);
    while (!h2o_linklist_is_empty(messages)) {
        api_job *job = H2O_STRUCT_FROM_MEMBER(api_job, msg.link, messages->next);
        h2o_linklist_unlink(&job->msg.link);
        if (job->gate_auth) {   /* the key of a request whose body waits (http_gate.h) */
            gate_auth_back(job);
            continue;
        }
        if (job->loop_ext) {   /* an accepted request a loop extension answers, or its own job */
            h2o_req_t *req = job->ref ? job->ref->req : NULL;
            if (job->ref) job->ref->job = NULL, job->ref = NULL;
            int i = ext_index(job->loop_ext);
            if (i < 0) {   /* api_main registers every extension whose handlers run */
                log_error("%s: a job of a loop extension that is not registered", job->route->path);
                api_job_free(job);
                continue;
            }
            job->loop_ext->job_back(ext_state(L, i), job, req);
            continue;
        }
        if (!job->ref) {
            api_job_free(job); /* the client went away meanwhile */
            continue;
        }
        job_answered(L, job, now);
    }
}

/* A parked job woken by a note that carries its result, answered here when its route can
 * (api_route.from_note): no hop to a worker and back, no statement (the result was sent
 * with the commit that made it final). true when the job was answered (and is freed). */
static bool answer_from_note(api_job *job, const char *note) {
    if (!job->route->from_note) return false;
    api_call c;
    memset(&c, 0, sizeof c);
    c.job = job;
    c.tenant_id = job->tenant_id;
    clear_answer(job);
    if (!job->route->from_note(&c, note) || !job->status) return false;
    finish_job(job);
    return true;
}

static void on_notify(h2o_multithread_receiver_t *receiver, h2o_linklist_t *messages) {
    http_loop *L = H2O_STRUCT_FROM_MEMBER(http_loop, notify_receiver, receiver);
    uint64_t now = h2o_now(L->evloop);
    while (!h2o_linklist_is_empty(messages)) {
        notify_msg *m = H2O_STRUCT_FROM_MEMBER(notify_msg, super.link, messages->next);
        h2o_linklist_unlink(&m->super.link);
        for (int i = 0; i < g.nexts; i++)
            if (g.exts[i]->op_done) g.exts[i]->op_done(ext_state(L, i), m->all ? NULL : m->id);
        if (!m->all) {
            snprintf(L->recent[L->recent_next].id, API_REQUEST_ID_MAX, "%s", m->id);
            L->recent[L->recent_next].at = now;
            L->recent_next = (L->recent_next + 1) % RECENT_NOTIFY;
        }
        h2o_linklist_t *n = L->parked.next;
        while (n != &L->parked) {
            h2o_linklist_t *next = n->next;
            api_job *job = H2O_STRUCT_FROM_MEMBER(api_job, parked, n);
            if (m->all || !strcmp(job->request_id, m->id)) {
                unpark(job);
                if (m->note && answer_from_note(job, m->note)) {
                    n = next;
                    continue;
                }
                free(job->done_note);   /* the worker answers from it instead of the row */
                job->done_note = m->note ? strdup(m->note) : NULL;
                dispatch(L, job);
            }
            n = next;
        }
        free(m->note);
        free(m);
    }
}

void http_server_notify(const char *payload, void *unused) {
    (void)unused;
    size_t idlen = payload ? strcspn(payload, "\t") : 0;
    if (payload && idlen >= API_REQUEST_ID_MAX) return;
    for (int i = 0; i < g.nloops; i++) {
        notify_msg *m = calloc(1, sizeof *m);
        if (!m) abort();
        m->all = payload == NULL;
        if (payload) {
            memcpy(m->id, payload, idlen);
            if (payload[idlen] && !(m->note = strdup(payload))) abort();
        }
        h2o_multithread_send_message(&g.loops[i].notify_receiver, &m->super);
    }
}

/* ---- request handler ----------------------------------------------------------------- */

static char *header_dup(h2o_req_t *req, const h2o_token_t *token, const char *name) {
    ssize_t i = token ? h2o_find_header(&req->headers, token, -1)
                      : h2o_find_header_by_str(&req->headers, name, strlen(name), -1);
    if (i < 0) return NULL;
    h2o_iovec_t v = req->headers.entries[i].value;
    return strndup(v.base, v.len);
}

/* Every value of a header that may come more than once, joined with ", " as RFC 9110
 * §5.3 allows: SDK 0.15-0.22 send two Accept headers on one request (the client's
 * default and the call's own), and the second one decides the answer (docs/protocol.md
 * §12.3). NULL when absent. */
static char *header_join(h2o_req_t *req, const h2o_token_t *token) {
    strbuf b;
    bool any = false;
    sb_init(&b, 64);
    for (ssize_t i = -1; (i = h2o_find_header(&req->headers, token, i)) >= 0;) {
        if (any) sb_puts(&b, ", ");
        sb_append(&b, req->headers.entries[i].value.base, req->headers.entries[i].value.len);
        any = true;
    }
    if (!any) {
        sb_free(&b);
        return NULL;
    }
    return sb_steal(&b, NULL);
}

static char *api_key_of(h2o_req_t *req) {
    char *key = header_dup(req, NULL, "x-api-key");
    if (key) return key;
    char *auth = header_dup(req, H2O_TOKEN_AUTHORIZATION, NULL);
    if (auth && !strncasecmp(auth, "Bearer ", 7)) {
        char *k = strdup(auth + 7 + strspn(auth + 7, " "));
        free(auth);
        return k;
    }
    free(auth);
    return NULL;
}

/* A host[:port] as it may appear in a URL we hand out: letters, digits and . - _ : [ ]
 * (IPv6), nothing that could end the URL or smuggle bytes into a header or JSON. */
static bool host_ok(const char *s, size_t n) {
    if (n == 0 || n > 255) return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:[]", s[i]) || !s[i])
            return false;
    return true;
}

/* "<scheme>://<host><prefix>" as the client addressed us: X-Forwarded-Proto/-Host from a
 * proxy in front, else the connection's scheme and the Host header. A host that is not
 * a plain host name gives "" (the links we hand out are then relative). */
static char *base_url_of(h2o_req_t *req) {
    char *proto = header_dup(req, NULL, "x-forwarded-proto"), *host = header_dup(req, NULL, "x-forwarded-host");
    const char *scheme = req->scheme == &H2O_URL_SCHEME_HTTPS ? "https" : "http";
    if (proto && (!strcmp(proto, "http") || !strcmp(proto, "https"))) scheme = proto;
    const char *h = host ? host : req->authority.base;
    size_t hlen = host ? strlen(host) : req->authority.len;
    strbuf b;
    sb_init(&b, 128);
    if (host_ok(h, hlen)) {
        sb_printf(&b, "%s://", scheme);
        sb_append(&b, h, hlen);
    }
    sb_puts(&b, g.prefix);
    free(proto);
    free(host);
    return sb_steal(&b, NULL);
}

/* A route the loop answers from memory (the web console's files, or the redirect to
 * them), with headers that keep the page to its own files and keep download links out of
 * Referer headers. */
static void send_static(h2o_req_t *req, const api_route *r, const char *path, size_t plen) {
    api_static st;
    r->serve(path, plen, &st);
    static const struct { const char *name, *value; } hdrs[] = {
        {"content-security-policy", "default-src 'self'; img-src 'self' data:; object-src 'none'; "
                                    "base-uri 'none'; frame-ancestors 'none'; form-action 'none'"},
        {"x-content-type-options", "nosniff"},
        {"referrer-policy", "no-referrer"},
        {"x-frame-options", "DENY"},
        {"cache-control", "no-cache"},
    };
    for (size_t i = 0; i < sizeof hdrs / sizeof hdrs[0]; i++)
        h2o_add_header_by_str(&req->pool, &req->res.headers, hdrs[i].name, strlen(hdrs[i].name), 0, NULL,
                              hdrs[i].value, strlen(hdrs[i].value));
    if (st.location)
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_LOCATION, NULL, st.location, strlen(st.location));
    observe_inline(req, r, false, st.status, st.status >= 400 ? st.body : NULL);
    if (st.status >= 400) send_error(req, st.status, st.body);
    else send_typed(req, st.status, st.type, 0, st.body, st.len);
}

static int on_req(h2o_handler_t *self, h2o_req_t *req) {
    http_loop *L = H2O_STRUCT_FROM_MEMBER(http_loop, ctx, req->conn->ctx);
    /* The gate's verdict on the request's head (its body is not read when it refused it). */
    gate_hold *hold;
    int retry_after;
    char gate_msg[400];
    int gate_status = gate_request(req, &hold, &retry_after, gate_msg, sizeof gate_msg);
    const char *path = req->path_normalized.base;
    size_t plen = req->path_normalized.len;
    if (g.prefix_len && plen >= g.prefix_len && !memcmp(path, g.prefix, g.prefix_len) &&
        (plen == g.prefix_len || path[g.prefix_len] == '/')) {
        path += g.prefix_len;
        plen -= g.prefix_len;
    }
    int status = 404;
    size_t arg_off = 0;
    const api_route *r = api_route_find(g.conf.routes, req->method.base, req->method.len, path, plen, &status,
                                        &arg_off);
    char method[16], spath[256], msg[600], log_id[API_LOG_ID_MAX];
    safe_copy(method, sizeof method, req->method.base, req->method.len);
    safe_copy(spath, sizeof spath, req->path_normalized.base, req->path_normalized.len);
    ssize_t xi = h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-request-id"), -1);
    api_log_id(xi >= 0 ? req->headers.entries[xi].value.base : NULL, xi >= 0 ? req->headers.entries[xi].value.len : 0,
               log_id);
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-request-id"), 0, NULL,
                          h2o_strdup(&req->pool, log_id, SIZE_MAX).base, strlen(log_id));
    if (gate_status) {
        observe_inline(req, r, false, gate_status, gate_msg);
        send_error_retry(req, gate_status, retry_after, gate_msg);
        return 0;
    }
    if (!r) {
        if (status == 405)
            snprintf(msg, sizeof msg, "method %s is not allowed on %s", method, spath);
        else
            snprintf(msg, sizeof msg, "no such route: %s %s (the Tinker API is under %s/api/v1/, the web "
                     "console at %s/console)", method, spath, g.prefix, g.prefix);
        observe_inline(req, NULL, false, status, msg);
        send_error(req, status, msg);
        return 0;
    }
    if (r->flags & ROUTE_MISSING) {
        snprintf(msg, sizeof msg, "not implemented in Loom: %s %s (the SDK's %s); README.md, \"Not "
                 "implemented\", lists what Loom does not serve", r->method, spath, r->inline_body);
        observe_inline(req, r, false, 404, msg);
        send_error(req, 404, msg);
        return 0;
    }
    if (r->flags & ROUTE_TODO) {
        snprintf(msg, sizeof msg, "not implemented yet in Loom: %s %s", r->method, r->path);
        observe_inline(req, r, false, 501, msg);
        send_error(req, 501, msg);
        return 0;
    }
    if (r->flags & ROUTE_INLINE) {
        observe_inline(req, r, false, 200, NULL);
        send_response(req, 200, r->inline_body, strlen(r->inline_body));
        return 0;
    }
    if (r->serve) {
        send_static(req, r, path, plen);
        return 0;
    }
    /* A route that stages its body (a signed upload: tinker/api_upload.c): the body goes
     * to a staged file in the blob store (a write into the page cache, at most
     * --max-body-mb), never to a worker's heap; the worker records it. */
    bool staged = false;
    if (r->stage) {
        ssize_t ce = h2o_find_header(&req->headers, H2O_TOKEN_CONTENT_ENCODING, -1);
        int st = 415;
        if (ce >= 0 && !h2o_lcstris(req->headers.entries[ce].value.base, req->headers.entries[ce].value.len,
                                    H2O_STRLIT("identity")))
            snprintf(msg, sizeof msg, "an upload is the file's bytes as they are: no Content-Encoding");
        else
            st = r->stage(path + arg_off, plen - arg_off, req->entity.base ? req->entity.base : "",
                          req->entity.base ? req->entity.len : 0, msg, sizeof msg);
        if (st) {
            observe_inline(req, r, false, st, msg);
            send_error(req, st, msg);
            return 0;
        }
        staged = true;
    }
    api_job *job = calloc(1, sizeof *job);
    if (!job) abort();
    job->loop = L;
    job->reply_to = &L->job_receiver;
    job->route = r;
    job->hold = gate_hold_ref(hold);
    job->body_len = req->entity.base && !staged ? req->entity.len : 0;
    job->body = malloc(job->body_len + 1);
    if (!job->body) abort();
    if (job->body_len) memcpy(job->body, req->entity.base, job->body_len);
    job->body[job->body_len] = 0;
    job->api_key = api_key_of(req);
    job->accept = header_join(req, H2O_TOKEN_ACCEPT);
    job->content_type = header_dup(req, H2O_TOKEN_CONTENT_TYPE, NULL);
    job->content_encoding = header_dup(req, H2O_TOKEN_CONTENT_ENCODING, NULL);
    if (arg_off) job->path_arg = strndup(path + arg_off, plen - arg_off);
    if (req->query_at != SIZE_MAX && req->query_at + 1 <= req->path.len)
        job->query = strndup(req->path.base + req->query_at + 1, req->path.len - req->query_at - 1);
    job->base_url = base_url_of(req);
    job->range = header_dup(req, H2O_TOKEN_RANGE, NULL);
    snprintf(job->log_id, sizeof job->log_id, "%s", log_id);
    job->started = begun_at(req);
    api_metrics_in_flight(1);
    http_req_ref *ref = h2o_mem_alloc_shared(&req->pool, sizeof *ref, on_ref_dispose);
    ref->job = job;
    ref->req = req;
    job->ref = ref;
    /* What the process holds in memory may answer it here (api_pool_first_look): a
     * finished future's result, or a pending one parked at once, without the hop to a
     * worker and back. */
    job->dispatched_ms = h2o_now(L->evloop);
    if (r->first_look && api_pool_first_look(g.pool, job)) {
        job_answered(L, job, job->dispatched_ms);
        return 0;
    }
    dispatch(L, job);
    return 0;
}

/* ---- loops and listeners ----------------------------------------------------------- */

static void on_accept(h2o_socket_t *listener, const char *err) {
    http_loop *L = listener->data;
    if (err) return;
    for (int i = 0; i < 32; i++) {
        h2o_socket_t *sock = h2o_evloop_socket_accept(listener);
        if (!sock) break;
        gate_accept(L->gate, sock);
    }
}

static void *loop_main(void *arg) {
    http_loop *L = arg;
    L->evloop = h2o_evloop_create();
    h2o_context_init(&L->ctx, L->evloop, &g.globalconf);
    L->accept_ctx.ctx = &L->ctx;
    L->accept_ctx.hosts = g.globalconf.hosts;
    L->accept_ctx.ssl_ctx = g.ssl_ctx;
    L->queue = h2o_multithread_create_queue(L->evloop);
    h2o_multithread_register_receiver(L->queue, &L->job_receiver, on_jobs_back);
    h2o_multithread_register_receiver(L->queue, &L->notify_receiver, on_notify);
    h2o_timeout_init(L->evloop, &L->recheck_timeout, RECHECK_MS);
    h2o_linklist_init_anchor(&L->parked);
    for (int i = 0; i < g.nexts; i++) {
        L->ext_key[i] = SIZE_MAX;   /* h2o assigns the next free slot of this loop's context */
        *h2o_context_get_storage(&L->ctx, &L->ext_key[i], NULL) = g.exts[i]->loop_init(L, L->evloop, L->queue);
    }
    L->gate = gate_loop_new(L, L->evloop, &L->accept_ctx);
    h2o_socket_t *sock = h2o_evloop_socket_create(L->evloop, L->fd, H2O_SOCKET_FLAG_DONT_READ);
    sock->data = L;
    h2o_socket_read_start(sock, on_accept);
    h2o_barrier_wait(&g.ready);
    /* epoll_wait fails with EINTR whenever the process is stopped and continued (SIGSTOP
     * and SIGCONT, a debugger attaching, `docker pause`), SA_RESTART or not: that is no
     * reason to stop serving. */
    for (;;) {
        errno = 0;
        if (h2o_evloop_run(L->evloop, INT32_MAX) == 0 || errno == EINTR) continue;
        log_error("event loop %d stopped: %s", L->index, strerror(errno));
        break;
    }
    return NULL;
}

static int open_listener(const char *host, int port, int *bound, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res;
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    int rc = getaddrinfo(host, ports, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve --host %s: %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0 ||
        bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, SOMAXCONN) < 0) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", host, port, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

static int setup_tls(const http_conf *conf, char *err, size_t errlen) {
    if (!conf->tls_cert && !conf->tls_key) return 0;
    if (!conf->tls_cert || !conf->tls_key) {
        snprintf(err, errlen, "--tls-cert and --tls-key go together");
        return -1;
    }
    g.ssl_ctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX_set_min_proto_version(g.ssl_ctx, TLS1_2_VERSION);
    if (SSL_CTX_use_certificate_chain_file(g.ssl_ctx, conf->tls_cert) != 1 ||
        SSL_CTX_use_PrivateKey_file(g.ssl_ctx, conf->tls_key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(g.ssl_ctx) != 1) {
        char e[256];
        ERR_error_string_n(ERR_get_error(), e, sizeof e);
        snprintf(err, errlen, "TLS certificate/key (%s, %s): %s", conf->tls_cert, conf->tls_key, e);
        return -1;
    }
    /* HTTP/1.1 only: h2o 2.2 reads each HTTP/2 stream's body whole before a handler sees
     * its headers (up to 100 streams of a connection at once), where the gate cannot check
     * the key or the bytes in flight first. */
    static const h2o_iovec_t http1_only[] = {{H2O_STRLIT("http/1.1")}, {NULL, 0}};
    h2o_ssl_register_alpn_protocols(g.ssl_ctx, http1_only);
    return 0;
}

int http_server_start(const http_conf *conf, api_pool *pool, int *port_out, char *err,
                      size_t errlen) {
    g.conf = *conf;
    g.pool = pool;
    /* prefix: "/x/y" (leading slash, no trailing one), or empty */
    const char *p = conf->prefix ? conf->prefix : "";
    while (*p == '/') p++;
    snprintf(g.prefix, sizeof g.prefix, "%s%s", *p ? "/" : "", p);
    g.prefix_len = strlen(g.prefix);
    while (g.prefix_len && g.prefix[g.prefix_len - 1] == '/') g.prefix[--g.prefix_len] = 0;
    if (setup_tls(conf, err, errlen) < 0) return -1;

    /* h2o keeps a request body of 32 MiB or more in a file it maps; put those files in the
     * blob store's temporary directory (a real disk) rather than /tmp (often RAM). */
    if (conf->spool_dir)
        snprintf(h2o_socket_buffer_mmap_settings.fn_template, sizeof h2o_socket_buffer_mmap_settings.fn_template,
                 "%s/h2o.body.XXXXXX", conf->spool_dir);
    h2o_config_init(&g.globalconf);
    g.globalconf.server_name = h2o_iovec_init(H2O_STRLIT("loom"));
    g.globalconf.max_request_entity_size = conf->max_body;
    g.globalconf.http1.req_timeout = 60000;
    g.globalconf.http1.upgrade_to_http2 = 0;   /* no h2c either (see setup_tls) */
    gate_init(&(gate_conf){.max_body = conf->max_body, .inflight_total = conf->inflight_total,
                           .inflight_per_key = conf->inflight_per_key, .signed_body = conf->signed_body,
                           .submit = http_loop_submit});
    g.globalconf.http2.idle_timeout = 60000;
    h2o_hostconf_t *host = h2o_config_register_host(&g.globalconf,
                                                    h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
    h2o_handler_t *h = h2o_create_handler(path, sizeof *h);
    h->on_req = on_req;
    h2o_filter_t *f = h2o_create_filter(path, sizeof *f);
    f->on_setup_ostream = json_error_setup;
    f = h2o_create_filter(&host->fallback_path, sizeof *f);
    f->on_setup_ostream = json_error_setup;

    g.nloops = conf->nthreads;
    g.loops = calloc((size_t)g.nloops, sizeof *g.loops);
    if (!g.loops) abort();
    int port = conf->port;
    for (int i = 0; i < g.nloops; i++) {
        int bound = 0;
        g.loops[i].index = i;
        g.loops[i].fd = open_listener(conf->host, port, &bound, err, errlen);
        if (g.loops[i].fd < 0) return -1;
        port = bound; /* --port 0: the others join the port the first one got */
    }
    *port_out = port;
    h2o_barrier_init(&g.ready, (size_t)g.nloops + 1);
    for (int i = 0; i < g.nloops; i++) {
        if (pthread_create(&g.loops[i].tid, NULL, loop_main, &g.loops[i]) != 0) {
            snprintf(err, errlen, "cannot start event loop thread");
            return -1;
        }
    }
    h2o_barrier_wait(&g.ready);
    return 0;
}

void http_server_join(void) {
    for (int i = 0; i < g.nloops; i++) pthread_join(g.loops[i].tid, NULL);
}
