/* http_gate.c: the checks of a request's head before h2o reads its body (see http_gate.h).
 *
 * A connection's states (gate_conn.state):
 *   HEAD     the socket's read callback is gate_on_read; it waits for a complete head
 *   WAIT     the key is at a database worker; the socket is not read meanwhile
 *   PASS     h2o's own read callback has the request (its body, its answer)
 *   REJECT   h2o has the request's head without its body, on_req answers the verdict
 *   DISCARD  the refused request's body arrives and is dropped, then HEAD again
 * After each answer h2o reads the connection's next request: gate_request's dispose hook
 * makes the gate the read callback again (rewrap) before any of its bytes are read; a
 * client that pipelined its next request behind a body is answered and disconnected
 * instead, since those bytes would reach h2o's parser without the gate.
 *
 * The head is parsed with picohttpparser's phr_parse_request, the parser h2o itself reads
 * it with (libh2o exports it; its header is not installed): the gate and h2o agree on
 * every header, so no request can look one way to the gate and another to h2o. */
#include "core/http_gate.h"
#include "common/keys.h"
#include "common/log.h"
#include "common/strbuf.h"
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* picohttpparser (h2o 2.2's lib/common/picohttpparser.c, exported by libh2o). */
struct phr_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};
int phr_parse_request(const char *buf, size_t len, const char **method, size_t *method_len, const char **path,
                      size_t *path_len, int *minor_version, struct phr_header *headers, size_t *num_headers,
                      size_t last_len);

#define HANDSHAKE_MS 10000   /* a TLS handshake that takes longer is dropped (as h2o_accept does) */

/* ---- bytes in flight ---------------------------------------------------------------------- */

static gate_conf g_conf;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static size_t g_total;   /* under g_mu */

/* Per key (executors of bytes): an open-addressed table of the keys with bodies in flight. */
#define KEY_SLOTS 4096
static struct {
    int64_t key_id;   /* 0: free */
    size_t bytes;
} g_keys[KEY_SLOTS];

struct gate_hold {
    atomic_int refs;
    size_t bytes;
    int64_t key_id;   /* 0: counted in the total only */
};

void gate_init(const gate_conf *conf) { g_conf = *conf; }

size_t gate_inflight_bytes(void) {
    pthread_mutex_lock(&g_mu);
    size_t n = g_total;
    pthread_mutex_unlock(&g_mu);
    return n;
}

static size_t *key_bytes(int64_t key_id, bool add) {
    for (unsigned i = 0; i < KEY_SLOTS; i++) {
        unsigned s = (unsigned)(((uint64_t)key_id * 0x9e3779b97f4a7c15ULL >> 40) + i) % KEY_SLOTS;
        if (g_keys[s].key_id == key_id) return &g_keys[s].bytes;
        if (!g_keys[s].key_id) {
            if (!add) return NULL;
            g_keys[s].key_id = key_id;
            g_keys[s].bytes = 0;
            return &g_keys[s].bytes;
        }
    }
    return NULL;
}

/* Removes a key whose count reached 0, keeping the probe chains of the others intact. */
static void key_forget(int64_t key_id) {
    unsigned s = 0;
    bool found = false;
    for (unsigned i = 0; i < KEY_SLOTS && !found; i++) {
        s = (unsigned)(((uint64_t)key_id * 0x9e3779b97f4a7c15ULL >> 40) + i) % KEY_SLOTS;
        if (!g_keys[s].key_id) return;
        found = g_keys[s].key_id == key_id;
    }
    if (!found) return;
    g_keys[s].key_id = 0;
    /* re-insert the rest of the cluster */
    for (unsigned j = (s + 1) % KEY_SLOTS; g_keys[j].key_id; j = (j + 1) % KEY_SLOTS) {
        int64_t k = g_keys[j].key_id;
        size_t b = g_keys[j].bytes;
        g_keys[j].key_id = 0;
        *key_bytes(k, true) = b;
    }
}

/* A reservation of bytes (and key_id's share when not 0): NULL with *status 429 (the key's
 * share is full) or 503 (the total is). */
static gate_hold *hold_take(size_t bytes, int64_t key_id, int *status) {
    pthread_mutex_lock(&g_mu);
    size_t *kb = key_id ? key_bytes(key_id, true) : NULL;
    if (key_id && (!kb || *kb + bytes > g_conf.inflight_per_key)) {
        if (kb && !*kb) key_forget(key_id);
        pthread_mutex_unlock(&g_mu);
        *status = 429;
        return NULL;
    }
    if (g_total + bytes > g_conf.inflight_total) {
        if (kb && !*kb) key_forget(key_id);
        pthread_mutex_unlock(&g_mu);
        *status = 503;
        return NULL;
    }
    g_total += bytes;
    if (kb) *kb += bytes;
    pthread_mutex_unlock(&g_mu);
    gate_hold *h = calloc(1, sizeof *h);
    if (!h) abort();
    atomic_init(&h->refs, 1);
    h->bytes = bytes;
    h->key_id = key_id;
    return h;
}

gate_hold *gate_hold_ref(gate_hold *h) {
    if (h) atomic_fetch_add(&h->refs, 1);
    return h;
}

void gate_hold_release(gate_hold *h) {
    if (!h || atomic_fetch_sub(&h->refs, 1) != 1) return;
    pthread_mutex_lock(&g_mu);
    g_total -= h->bytes;
    size_t *kb = h->key_id ? key_bytes(h->key_id, false) : NULL;
    if (kb) {
        *kb -= h->bytes;
        if (!*kb) key_forget(h->key_id);
    }
    pthread_mutex_unlock(&g_mu);
    free(h);
}

/* ---- connections -------------------------------------------------------------------------- */

struct gate_loop {
    http_loop *L;
    h2o_evloop_t *evloop;
    h2o_accept_ctx_t *actx;
    h2o_timeout_t zero;        /* rewrap: runs after the write that ended a request, before any read */
    h2o_timeout_t handshake;
};

enum { G_HEAD, G_WAIT, G_PASS, G_REJECT, G_DISCARD };

typedef struct gate_conn {
    gate_loop *gl;
    h2o_socket_t *sock;
    h2o_socket_cb h2o_read;    /* h2o's HTTP/1 read callback */
    int state;
    bool rewrap_due;           /* the request was answered: gate the next one */
    h2o_timeout_entry_t rewrap;
    api_job *auth;             /* G_WAIT: the key check at a worker */
    /* the request at hand */
    size_t head_len, content_length;   /* content_length SIZE_MAX: chunked */
    gate_hold *hold;
    int status, retry_after;   /* G_REJECT: the verdict */
    bool close;                /* G_REJECT: close after the answer */
    char msg[320];
    size_t discard;            /* the refused body's bytes still to drop */
} gate_conn;

static void gate_on_read(h2o_socket_t *sock, const char *err);

static gate_conn *conn_of(h2o_socket_t *sock);

static void conn_closed(void *p) {
    gate_conn *gc = p;
    if (h2o_timeout_is_linked(&gc->rewrap)) h2o_timeout_unlink(&gc->rewrap);
    if (gc->auth) gc->auth->gate_conn = NULL;   /* freed when it comes back */
    gate_hold_release(gc->hold);
    free(gc);
}

static gate_conn *conn_of(h2o_socket_t *sock) {
    return sock && sock->on_close.cb == conn_closed ? sock->on_close.data : NULL;
}

static bool name_is(const struct phr_header *h, const char *name) {
    return h->name && h->name_len == strlen(name) && !strncasecmp(h->name, name, h->name_len);
}

/* Content-Length's value: digits only (h2o's own rule); SIZE_MAX when it is not that. */
static size_t parse_length(const char *s, size_t n) {
    if (n == 0 || n > 19) return SIZE_MAX;
    size_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return SIZE_MAX;
        v = v * 10 + (size_t)(s[i] - '0');
    }
    return v;
}

/* h2o takes the request from here: the gate lets the bytes through until it is answered. */
static void pass(gate_conn *gc) {
    gc->state = G_PASS;
    h2o_socket_read_start(gc->sock, gc->h2o_read);
    gc->h2o_read(gc->sock, NULL);
}

/* Refuses the request at hand without its body. h2o gets its head without the framing
 * headers (so, no body) and on_req answers the verdict (gate_request); the body bytes
 * already read are dropped, the rest too as they arrive when there is a Content-Length
 * (keep-alive), else the connection closes after the answer. */
static void reject(gate_conn *gc, int status, int retry_after, bool close, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void reject(gate_conn *gc, int status, int retry_after, bool close, const char *fmt, ...) {
    h2o_socket_t *sock = gc->sock;
    const char *method, *path;
    size_t mlen, plen, nh = H2O_MAX_HEADERS;
    int minor;
    struct phr_header h[H2O_MAX_HEADERS];
    int len = phr_parse_request(sock->input->bytes, sock->input->size, &method, &mlen, &path, &plen, &minor, h, &nh, 0);
    if (len <= 0) {   /* cannot happen (the head was parsed before): h2o answers it */
        pass(gc);
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(gc->msg, sizeof gc->msg, fmt, ap);
    va_end(ap);
    gc->status = status;
    gc->retry_after = retry_after;
    size_t body_read = sock->input->size - (size_t)len;
    gc->close = close || gc->content_length == SIZE_MAX || body_read > gc->content_length;
    gc->discard = gc->close ? 0 : gc->content_length - body_read;
    strbuf b;
    sb_init(&b, (size_t)len + 64);
    sb_append(&b, method, mlen);
    sb_putc(&b, ' ');
    sb_append(&b, path, plen);
    sb_printf(&b, " HTTP/1.%d\r\n", minor);
    for (size_t i = 0; i < nh; i++) {
        if (!h[i].name || name_is(&h[i], "content-length") || name_is(&h[i], "transfer-encoding") ||
            name_is(&h[i], "expect") || name_is(&h[i], "connection") || name_is(&h[i], "upgrade"))
            continue;
        sb_append(&b, h[i].name, h[i].name_len);
        sb_puts(&b, ": ");
        sb_append(&b, h[i].value, h[i].value_len);
        sb_puts(&b, "\r\n");
    }
    if (gc->close || minor == 0) sb_puts(&b, "connection: close\r\n");
    else sb_puts(&b, "connection: keep-alive\r\n");
    sb_puts(&b, "\r\n");
    h2o_buffer_consume(&sock->input, sock->input->size);
    h2o_iovec_t v = h2o_buffer_reserve(&sock->input, b.len);
    memcpy(v.base, b.data, b.len);
    sock->input->size += b.len;
    gc->head_len = b.len;
    gc->content_length = 0;
    sb_free(&b);
    gc->state = G_REJECT;
    h2o_socket_read_start(sock, gc->h2o_read);
    gc->h2o_read(sock, NULL);
}

/* The body of the request at hand may be read, counted in key_id's share (0: the total
 * only): reserve its bytes and hand it to h2o, or refuse it when the shares are full. */
static void hold_and_pass(gate_conn *gc, int64_t key_id) {
    size_t bytes = gc->content_length == SIZE_MAX ? g_conf.max_body : gc->content_length;
    int st = 0;
    if (!(gc->hold = hold_take(bytes, key_id, &st))) {
        if (st == 429)
            reject(gc, 429, 1, false, "this API key has %zu MiB of request bodies in flight at most (loom api "
                                      "--max-inflight-mb-per-key): retry when some are answered",
                   g_conf.inflight_per_key >> 20);
        else
            reject(gc, 503, 1, false, "server busy: %zu MiB of request bodies are in flight (loom api "
                                      "--max-inflight-mb); retry shortly", g_conf.inflight_total >> 20);
        return;
    }
    pass(gc);
}

/* The key of the request (X-API-Key, or Authorization: Bearer), as api_key_of reads it. */
static bool key_of(const struct phr_header *h, size_t nh, char *out, size_t n) {
    const char *bearer = NULL;
    size_t blen = 0;
    for (size_t i = 0; i < nh; i++) {
        if (name_is(&h[i], "x-api-key")) {
            if (h[i].value_len >= n) return false;
            memcpy(out, h[i].value, h[i].value_len);
            out[h[i].value_len] = 0;
            return true;
        }
        if (name_is(&h[i], "authorization") && h[i].value_len > 7 && !strncasecmp(h[i].value, "Bearer ", 7))
            bearer = h[i].value + 7, blen = h[i].value_len - 7;
    }
    while (blen && *bearer == ' ') bearer++, blen--;
    if (!bearer || !blen || blen >= n) return false;
    memcpy(out, bearer, blen);
    out[blen] = 0;
    return true;
}

/* A complete head is in sock->input: decide. */
static void judge_head(gate_conn *gc, const char *method, size_t mlen, const char *path, size_t plen, int len,
                       const struct phr_header *h, size_t nh) {
    size_t cl = SIZE_MAX;
    int n_cl = 0, n_te = 0;
    bool differing = false, bad_cl = false;
    for (size_t i = 0; i < nh; i++) {
        if (name_is(&h[i], "content-length")) {
            size_t v = parse_length(h[i].value, h[i].value_len);
            bad_cl |= v == SIZE_MAX;
            differing |= n_cl++ && v != cl;
            cl = v;
        } else if (name_is(&h[i], "transfer-encoding")) {
            n_te++;
        }
    }
    gc->head_len = (size_t)len;
    gc->content_length = 0;
    /* Framing two readers could take differently is refused, and the connection closed
     * (RFC 9112 §6.3): the bytes after this head cannot be trusted to start a request. */
    if (differing) {
        reject(gc, 400, 0, true, "the request has Content-Length headers that differ: its framing is ambiguous");
        return;
    }
    if (n_cl && n_te) {
        reject(gc, 400, 0, true, "the request has both Content-Length and Transfer-Encoding: its framing is "
                                 "ambiguous (send one of them)");
        return;
    }
    if (n_te > 1) {
        reject(gc, 400, 0, true, "the request has more than one Transfer-Encoding header");
        return;
    }
    if (bad_cl) {
        reject(gc, 400, 0, true, "the request's Content-Length is not a number of bytes");
        return;
    }
    size_t body = n_te ? g_conf.max_body : n_cl ? cl : 0;
    gc->content_length = n_te ? SIZE_MAX : body;
    if (!n_te && body > g_conf.max_body) {
        reject(gc, 413, 0, true, "request body is larger than this server's limit of %zu MiB (loom api "
                                 "--max-body-mb)", g_conf.max_body >> 20);
        return;
    }
    if (body == 0) {
        pass(gc);
        return;
    }
    if (!n_te && body <= GATE_FREE_BODY) {
        int st;
        if (!(gc->hold = hold_take(body, 0, &st))) {
            reject(gc, 503, 1, false, "server busy: %zu MiB of request bodies are in flight (loom api "
                                      "--max-inflight-mb); retry shortly", g_conf.inflight_total >> 20);
            return;
        }
        pass(gc);
        return;
    }
    /* A large (or chunked) body is read only for a valid key, or a valid signed link. */
    if (g_conf.signed_body) {
        int64_t link_key = 0;
        char why[256];
        int st = g_conf.signed_body(method, mlen, path, plen, n_te ? 0 : body, &link_key, why, sizeof why);
        if (st >= 400) {
            reject(gc, st, 0, false, "%s", why);
            return;
        }
        if (st == 0) {
            hold_and_pass(gc, link_key);
            return;
        }
    }
    char key[KEY_MAX_LEN + 1];
    if (!key_of(h, nh, key, sizeof key)) {
        reject(gc, 401, 0, false, "missing or invalid API key: send it in the X-API-Key header (Loom keys start "
                                  "with tml-); the body was not read");
        return;
    }
    api_job *job = calloc(1, sizeof *job);
    if (!job) abort();
    job->gate_auth = true;
    job->gate_conn = gc;
    job->api_key = strdup(key);
    if (!job->api_key) abort();
    gc->state = G_WAIT;
    gc->auth = job;
    h2o_socket_read_stop(gc->sock);   /* nothing of the body is read while the key is checked */
    if (g_conf.submit(gc->gl->L, job) < 0) {
        gc->auth = NULL;
        api_job_free(job);
        reject(gc, 503, 1, false, "server busy: too many requests waiting for the database; retry shortly");
    }
}

static void on_head_bytes(gate_conn *gc) {
    h2o_socket_t *sock = gc->sock;
    if (gc->state == G_DISCARD) {
        size_t n = sock->input->size < gc->discard ? sock->input->size : gc->discard;
        h2o_buffer_consume(&sock->input, n);
        gc->discard -= n;
        if (gc->discard) return;
        gc->state = G_HEAD;
    }
    if (sock->input->size == 0) return;
    const char *method, *path;
    size_t mlen, plen, nh = H2O_MAX_HEADERS;
    int minor;
    struct phr_header h[H2O_MAX_HEADERS];
    size_t avail = sock->input->size < H2O_MAX_REQLEN ? sock->input->size : H2O_MAX_REQLEN;
    int len = phr_parse_request(sock->input->bytes, avail, &method, &mlen, &path, &plen, &minor, h, &nh, 0);
    if (len == -2 && avail < H2O_MAX_REQLEN) return;   /* more of the head to come */
    if (len < 0) {   /* h2o answers what it cannot parse itself (400, closed) */
        gc->content_length = 0;
        pass(gc);
        return;
    }
    judge_head(gc, method, mlen, path, plen, len, h, nh);
}

static void gate_on_read(h2o_socket_t *sock, const char *err) {
    gate_conn *gc = conn_of(sock);
    if (!gc || err || gc->state == G_PASS || gc->state == G_REJECT) {
        /* h2o's to handle (an error closes the connection, and conn_closed frees gc) */
        if (gc) gc->h2o_read(sock, err);
        return;
    }
    if (gc->state == G_WAIT) return;
    on_head_bytes(gc);
}

void gate_auth_back(api_job *job) {
    gate_conn *gc = job->gate_conn;
    if (!gc) {   /* the connection closed meanwhile */
        api_job_free(job);
        return;
    }
    gc->auth = NULL;
    int status = job->status;
    int64_t key_id = job->key_id;
    char why[256];
    snprintf(why, sizeof why, "%s", job->resp ? job->resp : "");
    api_job_free(job);
    if (status == 401) {
        reject(gc, 401, 0, false, "%s; the body was not read", why);
        return;
    }
    if (status != 200) {
        reject(gc, 503, 1, false, "the API key could not be checked (%s); retry shortly", why);
        return;
    }
    hold_and_pass(gc, key_id);
}

/* The request was answered and h2o reads the next one: the gate reads its head first.
 * Runs after the write that ended the request, before the loop reads again. h2o reads
 * with its own callback only while it waits for a request (else it is closing). */
static void on_rewrap(h2o_timeout_entry_t *entry) {
    gate_conn *gc = H2O_STRUCT_FROM_MEMBER(gate_conn, rewrap, entry);
    if (!gc->rewrap_due || gc->sock->_cb.read != gc->h2o_read) return;
    gc->rewrap_due = false;
    gc->state = gc->discard ? G_DISCARD : G_HEAD;
    h2o_socket_read_start(gc->sock, gate_on_read);
    on_head_bytes(gc);
}

typedef struct {
    gate_conn *gc;
} req_hook;

/* The request's memory goes (answered, or the connection closes). */
static void on_req_dispose(void *p) {
    gate_conn *gc = ((req_hook *)p)->gc;
    gate_hold_release(gc->hold);
    gc->hold = NULL;
    gc->rewrap_due = true;
    if (!h2o_timeout_is_linked(&gc->rewrap)) h2o_timeout_link(gc->gl->evloop, &gc->gl->zero, &gc->rewrap);
}

int gate_request(h2o_req_t *req, gate_hold **hold, int *retry_after, char *msg, size_t msglen) {
    *hold = NULL;
    *retry_after = 0;
    h2o_socket_t *sock = req->conn->callbacks->get_socket ? req->conn->callbacks->get_socket(req->conn) : NULL;
    gate_conn *gc = conn_of(sock);
    if (!gc) return 0;
    req_hook *hook = h2o_mem_alloc_shared(&req->pool, sizeof *hook, on_req_dispose);
    hook->gc = gc;
    /* Bytes beyond this request are a pipelined one that h2o would read without the gate:
     * answer this one and close. */
    size_t end = gc->content_length == SIZE_MAX ? SIZE_MAX : gc->head_len + gc->content_length;
    if (gc->state != G_PASS && gc->state != G_REJECT) {
        log_debug("a request reached the handler without the gate (state %d): its connection closes", gc->state);
        req->http1_is_persistent = 0;
    } else if (end == SIZE_MAX || sock->input->size > end) {
        req->http1_is_persistent = 0;
    }
    if (gc->state == G_REJECT) {
        if (gc->close) req->http1_is_persistent = 0;
        *retry_after = gc->retry_after;
        snprintf(msg, msglen, "%s", gc->msg);
        return gc->status;
    }
    *hold = gc->hold;
    return 0;
}

/* ---- accepting ---------------------------------------------------------------------------- */

static void start_http1(gate_loop *gl, h2o_socket_t *sock, struct timeval connected_at) {
    gate_conn *gc = calloc(1, sizeof *gc);
    if (!gc) abort();
    gc->gl = gl;
    gc->sock = sock;
    gc->rewrap.cb = on_rewrap;
    sock->on_close.cb = conn_closed;
    sock->on_close.data = gc;
    /* What the TLS layer has already decrypted is held back from h2o, which would parse it
     * at once, and handed to the gate first. */
    size_t early = sock->input->size;
    char *copy = early ? malloc(early) : NULL;
    if (early) {
        if (!copy) abort();
        memcpy(copy, sock->input->bytes, early);
        h2o_buffer_consume(&sock->input, early);
    }
    h2o_http1_accept(gl->actx, sock, connected_at);
    gc->h2o_read = sock->_cb.read;
    gc->state = G_HEAD;
    h2o_socket_read_start(sock, gate_on_read);
    if (early) {
        h2o_iovec_t v = h2o_buffer_reserve(&sock->input, early);
        memcpy(v.base, copy, early);
        sock->input->size += early;
        free(copy);
        on_head_bytes(gc);
    }
}

typedef struct {
    gate_loop *gl;
    h2o_socket_t *sock;
    h2o_timeout_entry_t timeout;
    struct timeval connected_at;
} tls_accept;

static void on_handshake_timeout(h2o_timeout_entry_t *entry) {
    tls_accept *a = H2O_STRUCT_FROM_MEMBER(tls_accept, timeout, entry);
    h2o_socket_t *sock = a->sock;
    free(a);
    h2o_socket_close(sock);
}

static void on_handshake(h2o_socket_t *sock, const char *err) {
    tls_accept *a = sock->data;
    sock->data = NULL;
    h2o_timeout_unlink(&a->timeout);
    gate_loop *gl = a->gl;
    struct timeval at = a->connected_at;
    free(a);
    if (err) {
        h2o_socket_close(sock);
        return;
    }
    start_http1(gl, sock, at);
}

void gate_accept(gate_loop *gl, h2o_socket_t *sock) {
    struct timeval at = *h2o_get_timestamp(gl->actx->ctx, NULL, NULL);
    if (!gl->actx->ssl_ctx) {
        start_http1(gl, sock, at);
        return;
    }
    tls_accept *a = calloc(1, sizeof *a);
    if (!a) abort();
    *a = (tls_accept){.gl = gl, .sock = sock, .connected_at = at};
    a->timeout.cb = on_handshake_timeout;
    h2o_timeout_link(gl->evloop, &gl->handshake, &a->timeout);
    sock->data = a;
    h2o_socket_ssl_handshake(sock, gl->actx->ssl_ctx, NULL, on_handshake);
}

gate_loop *gate_loop_new(http_loop *L, h2o_evloop_t *evloop, h2o_accept_ctx_t *actx) {
    gate_loop *gl = calloc(1, sizeof *gl);
    if (!gl) abort();
    gl->L = L;
    gl->evloop = evloop;
    gl->actx = actx;
    h2o_timeout_init(evloop, &gl->zero, 0);
    h2o_timeout_init(evloop, &gl->handshake, HANDSHAKE_MS);
    return gl;
}
