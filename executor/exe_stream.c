/* exe_stream.c: the progress publisher (see exe_stream.h).
 *
 * Hand-off between the backend's threads and the publisher: each followed sample has one
 * atomic word, progress = n << 2 | stopped << 1 | done, stored (release) by
 * exe_stream_on_token after the backend wrote token n − 1 and its logprobs; the publisher
 * loads it (acquire) and may then read tokens [published, n) while the backend writes
 * later ones. A retry of a failed batch starts a sample again from n = 1: the publisher
 * sends nothing until it passes what was already sent (samples are reproducible per seed,
 * and the api checks what it got against the committed result).
 *
 * A progress line (one per operation and sample, at most LINE_MAX bytes; a payload joins
 * lines with '\n' up to PAYLOAD_MAX):
 *   {"r": request_id, "s": sample, "o": offset of the first token, "t": [ids],
 *    "l": [logprobs], "k": [[[id, logprob], ...] per token] (top_logprobs only),
 *    "d": "stop" | "length" (the sample ended with the line's last token)}
 */
#include "executor/exe_stream.h"
#include "common/clock.h"
#include "common/db.h"
#include "common/log.h"
#include "common/pgarray.h"
#include "common/strbuf.h"
#include "executor/exe_sql.h"
#include <errno.h>
#include <float.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define STREAM_TICK_MS 20     /* at most one publication per tick: coalesces tokens under load */
#define LINE_MAX 3000         /* bytes of one progress line (a payload holds two or more) */
#define PAYLOAD_MAX 7900      /* PostgreSQL refuses NOTIFY payloads of 8000 bytes and more */
#define RECENT_CANCELS 256    /* cancels remembered for operations not decoding yet */

struct exe_stream_op {
    char request_id[80];
    int num_samples, max_tokens, top_k;
    const int32_t *tokens, *top_ids;
    const float *logprobs, *top_lp;
    _Atomic int *progress;    /* [num_samples] n << 2 | stopped << 1 | done */
    int *published;           /* [num_samples] tokens sent (publisher only) */
    bool *ended;              /* [num_samples] its end was sent */
    atomic_bool canceled;
    exe_stream_op *next;
};

static struct {
    pthread_mutex_t mu;
    bool started;
    int wake_fd;              /* eventfd: new progress or queued lines */
    atomic_bool dirty;        /* set by on_token, cleared by the publisher */
    char **keys, **vals;      /* connection parameters (those of the loop's connection) */
    exe_stream_op *ops;       /* followed operations */
    strbuf queued;            /* final lines of untracked operations, '\n'-separated */
    char recent[RECENT_CANCELS][80];
    int recent_next;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake_fd = -1};

static void wake(void) {
    uint64_t one = 1;
    if (write(g.wake_fd, &one, sizeof one) < 0 && errno != EAGAIN) log_warn("stream: wake: %s", strerror(errno));
}

/* ---- lines ------------------------------------------------------------------------------- */

/* As the committed result prints logprobs (json_dumps with 9 digits, non-finite as
 * ∓FLT_MAX), so that the api reads the same doubles from both. */
static void put_lp(strbuf *b, float x) {
    double v = isfinite(x) ? (double)x : x < 0 ? -FLT_MAX : 0.0;
    sb_printf(b, "%.9g", v);
}

/* Appends the lines of tokens [from, n) of sample s (and its end when ended) to out. */
static void sample_lines(const exe_stream_op *o, int s, int from, int n, bool ended, bool stopped, strbuf *out) {
    int at = from;
    do {
        strbuf b;
        sb_init(&b, 256);
        sb_puts(&b, "{\"r\":");
        sb_json_str(&b, o->request_id);
        sb_printf(&b, ",\"s\":%d,\"o\":%d,\"t\":[", s, at);
        size_t row = (size_t)s * o->max_tokens;
        /* a token takes at most ~32 bytes, plus ~40 per top entry */
        int per_line = (LINE_MAX - 200) / (32 + 40 * o->top_k), end = n - at > per_line ? at + per_line : n;
        for (int k = at; k < end; k++) sb_printf(&b, "%s%d", k > at ? "," : "", o->tokens[row + k]);
        sb_puts(&b, "],\"l\":[");
        for (int k = at; k < end; k++) {
            if (k > at) sb_putc(&b, ',');
            put_lp(&b, o->logprobs[row + k]);
        }
        sb_putc(&b, ']');
        if (o->top_k > 0) {
            sb_puts(&b, ",\"k\":[");
            for (int k = at; k < end; k++) {
                size_t c = (row + k) * o->top_k;
                sb_puts(&b, k > at ? ",[" : "[");
                for (int j = 0, m = 0; j < o->top_k; j++) {
                    if (o->top_ids[c + j] < 0) continue;
                    sb_printf(&b, "%s[%d,", m++ ? "," : "", o->top_ids[c + j]);
                    put_lp(&b, o->top_lp[c + j]);
                    sb_putc(&b, ']');
                }
                sb_putc(&b, ']');
            }
            sb_putc(&b, ']');
        }
        if (ended && end == n) sb_printf(&b, ",\"d\":\"%s\"", stopped ? "stop" : "length");
        sb_puts(&b, "}\n");
        sb_append(out, b.data, b.len);
        sb_free(&b);
        at = end;
    } while (at < n);
}

/* What is new in o since the last look (under g.mu). final: n_out / stopped are the
 * outputs after the backend returned, instead of the progress words. */
static void op_lines(exe_stream_op *o, const int *n_out, const bool *stopped_out, strbuf *out) {
    for (int s = 0; s < o->num_samples; s++) {
        if (o->ended[s]) continue;
        int n, p = n_out ? 0 : atomic_load_explicit(&o->progress[s], memory_order_acquire);
        bool done, stopped;
        if (n_out) n = n_out[s], done = true, stopped = stopped_out[s];
        else n = p >> 2, done = p & 1, stopped = p & 2;
        if (n < o->published[s] || (n == o->published[s] && !done)) continue;
        sample_lines(o, s, o->published[s], n, done, stopped, out);
        o->published[s] = n;
        o->ended[s] = done;
    }
}

/* ---- the publisher thread --------------------------------------------------------------- */

static PGconn *publisher_connect(void) {
    PGconn *c = PQconnectdbParams((const char *const *)g.keys, (const char *const *)g.vals, 0);
    char err[256];
    static const db_setup_stmt setup[] = {{SQL_EXE_STREAM_ASYNC, NULL}, {SQL_EXE_STREAM_NAME, NULL},
                                          {SQL_EXE_LISTEN_CANCEL, NULL}};
    if (PQstatus(c) != CONNECTION_OK || db_session_setup(c, setup, 3, err, sizeof err) < 0) {
        /* tried every second while the database is away: the outage's rate */
        log_msg(db_outage_level(), "stream: cannot connect the progress publisher: %s", PQerrorMessage(c));
        db_finish(c);
        return NULL;
    }
    return c;
}

/* A cancel for request_id: ends the samples of the followed operation, or is remembered
 * for one that has not started decoding. */
static void on_cancel(const char *request_id) {
    pthread_mutex_lock(&g.mu);
    bool found = false;
    for (exe_stream_op *o = g.ops; o; o = o->next)
        if (!strcmp(o->request_id, request_id)) atomic_store(&o->canceled, true), found = true;
    if (!found) {
        snprintf(g.recent[g.recent_next], sizeof g.recent[0], "%s", request_id);
        g.recent_next = (g.recent_next + 1) % RECENT_CANCELS;
    }
    pthread_mutex_unlock(&g.mu);
    log_info("stream: %s canceled (its client went away)%s", request_id, found ? "" : " before decoding");
}

/* The lines as one text[] literal of payloads, each at most PAYLOAD_MAX bytes of whole
 * lines: a payload is a run of lines as they stand, '\n' between them. */
static char *payload_array(const char *lines, size_t len) {
    pgarray a;
    pga_init(&a);
    size_t i = 0, start = 0, end = 0;
    bool open = false;
    while (i < len) {
        const char *nl = memchr(lines + i, '\n', len - i);
        size_t l = (nl ? (size_t)(nl - lines) : len) - i;
        if (open && end - start + 1 + l > PAYLOAD_MAX) pga_textn(&a, lines + start, end - start), open = false;
        if (!open) start = i, open = true;
        end = i + l;
        i += l + 1;
    }
    if (open) pga_textn(&a, lines + start, end - start);
    return pga_end(&a);
}

static void *publisher_main(void *arg) {
    (void)arg;
    PGconn *c = NULL;
    double last_try = -1e9, last_send = 0;
    for (;;) {
        if (!c && 1e3 * clock_mono_s() - last_try > 1000) {
            last_try = 1e3 * clock_mono_s();
            c = publisher_connect();
        }
        struct pollfd p[2] = {{.fd = g.wake_fd, .events = POLLIN}, {.fd = c ? PQsocket(c) : -1, .events = POLLIN}};
        if (poll(p, 2, 1000) < 0 && errno != EINTR) log_warn("stream: poll: %s", strerror(errno));
        if (p[0].revents & POLLIN) {
            uint64_t v;
            if (read(g.wake_fd, &v, sizeof v) < 0 && errno != EAGAIN) log_warn("stream: read: %s", strerror(errno));
        }
        if (c && (p[1].revents & POLLIN) && !PQconsumeInput(c)) {
            log_msg(db_outage_level(), "stream: connection lost: %s", PQerrorMessage(c));
            db_finish(c);
            c = NULL;
        }
        /* also those that arrived while a publication ran (libpq keeps them) */
        for (PGnotify *n; c && (n = PQnotifies(c)); PQfreemem(n)) on_cancel(n->extra);
        /* one publication per tick at most: the tokens of a tick go out together */
        double wait = last_send + STREAM_TICK_MS - 1e3 * clock_mono_s();
        if (wait > 0) usleep((useconds_t)(wait * 1000));
        atomic_store(&g.dirty, false);
        strbuf lines;
        sb_init(&lines, 1024);
        pthread_mutex_lock(&g.mu);
        sb_append(&lines, g.queued.data, g.queued.len);
        g.queued.len = 0;
        for (exe_stream_op *o = g.ops; o; o = o->next) op_lines(o, NULL, NULL, &lines);
        pthread_mutex_unlock(&g.mu);
        if (lines.len && c) {
            char *arr = payload_array(lines.data, lines.len), err[256];
            const char *params[1] = {arr};
            if (db_exec(c, SQL_EXE_PUBLISH, 1, params, err, sizeof err) < 0) {
                log_warn("stream: publishing progress failed (the api falls back to results): %s", err);
                if (PQstatus(c) != CONNECTION_OK) db_finish(c), c = NULL;
            }
            free(arr);
            last_send = 1e3 * clock_mono_s();
        }
        sb_free(&lines);
    }
    return NULL;
}

/* Starts the publisher with the parameters of the loop's connection (same server,
 * database and credentials). false when it cannot. Under g.mu. */
static bool publisher_start(exe_state *st) {
    if (g.started) return true;
    if (!st->db) return false;
    PQconninfoOption *opts = PQconninfo(st->db);
    if (!opts) return false;
    int n = 0;
    for (PQconninfoOption *o = opts; o->keyword; o++) n += o->val && *o->val;
    g.keys = calloc(n + 1, sizeof *g.keys);
    g.vals = calloc(n + 1, sizeof *g.vals);
    n = 0;
    for (PQconninfoOption *o = opts; o->keyword; o++)
        if (o->val && *o->val) g.keys[n] = strdup(o->keyword), g.vals[n++] = strdup(o->val);
    PQconninfoFree(opts);
    g.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    sb_init(&g.queued, 1024);
    pthread_t t;
    if (g.wake_fd < 0 || pthread_create(&t, NULL, publisher_main, NULL) != 0) {
        log_warn("stream: cannot start the progress publisher");
        return false;
    }
    pthread_detach(t);
    g.started = true;
    return true;
}

/* ---- the executor's side ------------------------------------------------------------------ */

exe_stream_op *exe_stream_track(exe_state *st, const char *request_id, int num_samples, int max_tokens,
                                const int32_t *tokens, const float *logprobs, int top_k, const int32_t *top_ids,
                                const float *top_lp) {
    pthread_mutex_lock(&g.mu);
    if (!publisher_start(st)) {
        pthread_mutex_unlock(&g.mu);
        return NULL;
    }
    exe_stream_op *o = calloc(1, sizeof *o);
    o->progress = calloc(num_samples, sizeof *o->progress);
    o->published = calloc(num_samples, sizeof *o->published);
    o->ended = calloc(num_samples, sizeof *o->ended);
    if (!o->progress || !o->published || !o->ended) abort();
    snprintf(o->request_id, sizeof o->request_id, "%s", request_id);
    o->num_samples = num_samples;
    o->max_tokens = max_tokens;
    o->tokens = tokens;
    o->logprobs = logprobs;
    o->top_k = top_k;
    o->top_ids = top_ids;
    o->top_lp = top_lp;
    for (int i = 0; i < RECENT_CANCELS; i++)
        if (!strcmp(g.recent[i], request_id)) atomic_store(&o->canceled, true);
    o->next = g.ops;
    g.ops = o;
    pthread_mutex_unlock(&g.mu);
    return o;
}

bool exe_stream_on_token(const be_sample_req *r, int sample, int n, bool done) {
    exe_stream_op *o = r->on_token_user;
    int word = n << 2 | (r->stopped_out[sample] ? 2 : 0) | (done ? 1 : 0);
    atomic_store_explicit(&o->progress[sample], word, memory_order_release);
    if (!atomic_exchange(&g.dirty, true)) wake();
    return atomic_load_explicit(&o->canceled, memory_order_relaxed);
}

void exe_stream_untrack(exe_stream_op *o, const int *n_out, const bool *stopped) {
    if (!o) return;
    pthread_mutex_lock(&g.mu);
    if (n_out && !atomic_load(&o->canceled)) op_lines(o, n_out, stopped, &g.queued);
    for (exe_stream_op **p = &g.ops; *p; p = &(*p)->next)
        if (*p == o) {
            *p = o->next;
            break;
        }
    pthread_mutex_unlock(&g.mu);
    wake();
    free(o->progress);
    free(o->published);
    free(o->ended);
    free(o);
}

bool exe_stream_canceled(const exe_stream_op *o) { return o && atomic_load(&o->canceled); }
