/* api_openai_stream.c: answering an accepted OpenAI request on its event loop (see
 * api_openai.h, docs/protocol.md §18.5, docs/architecture.md "Streaming").
 *
 * Where tokens come from, fastest first:
 *  1. progress lines (CHAN_SAMPLE_PROGRESS) the executor publishes while it decodes: the
 *     LISTEN thread (oai_progress) finds the loop that holds the request in a registry
 *     (request_id -> loop) and posts the line there;
 *  2. the committed result, read by a job the loop sends to a database worker when
 *     NOTIFY loom_op_done names the request, and every 2 s without progress (a lost
 *     notification costs latency, never tokens).
 * Progress is a hint: a line that does not continue what the request has (a gap: a lost
 * notification) stops that choice until the result comes; tokens already sent are
 * checked against the result, and a difference ends the stream with an error.
 *
 * Text: each token's bytes (special tokens skipped, as skip_special_tokens does) are
 * appended to the choice's raw text; what may be sent is the raw text up to the first
 * stop string, less what could still become one (the longest stop string − 1 bytes) and
 * an incomplete UTF-8 sequence at the end, both held back until the next token or the end.
 *
 * Sending: stream=true answers 200 text/event-stream at once and one SSE chunk per token
 * (an h2o generator: one h2o_send in flight, the rest waits in `pending` until h2o asks
 * for more, so a slow reader never blocks the loop; past OAI_MAX_PENDING the stream
 * ends). stream=false answers one JSON body at the end. A client that goes away (h2o
 * disposes the request) cancels its operations: queued ones at once, running ones at
 * their executor's next token. */
#include "openai/api_openai.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strhash.h"
#include "common/strbuf.h"
#include "core/api_metrics.h"
#include "core/api_route.h"
#include "core/http_server.h"
#include <float.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/socket.h>

#define TICK_MS 1000               /* each request looks at its state this often */
#define RECHECK_MS 2000            /* without progress for this long: read the result */
#define KEEPALIVE_MS 15000         /* an SSE comment when nothing was sent for this long */
#define OAI_MAX_PENDING (16u << 20) /* bytes waiting for a slow reader before the stream ends */
#define MAX_LOOPS 256

/* ---- state ------------------------------------------------------------------------------- */

typedef struct {
    int32_t *ids, *top_ids;        /* received tokens, their top alternatives [cap, K] */
    float *lps, *top_lps;
    int n, cap;
    bool done, stopped, gap;
    strbuf raw;                    /* bytes of the non-special tokens */
    size_t raw_sent;               /* bytes of raw turned into text */
    long stop_at;                  /* first stop string in raw, or −1 */
    size_t searched;               /* raw bytes searched for stop strings */
    strbuf text;                   /* the answer's text so far */
    size_t *offsets;               /* [cap] the text offset of each token (completions logprobs) */
    int emitted;                   /* tokens turned into text (and chunks) */
    bool finish_sent;
} oai_choice;

typedef struct oai_loop oai_loop;

typedef struct oai_stream {
    oai_loop *ol;
    h2o_req_t *req;
    api_job *job;                  /* the request's job (access log); job->ext is the spec */
    oai_spec *spec;
    h2o_generator_t gen;
    strbuf pending, inflight;
    bool started, sending, final_sent, finished, observed, aborted;  /* aborted: end with an error */
    oai_choice *ch;
    int nch;
    bool *op_done, *op_notified;   /* per prompt: the result was applied / NOTIFY named it */
    api_job *fetch;                /* the loop's look in flight */
    int next_fetch;
    h2o_timeout_entry_t timer;
    uint64_t last_progress, last_bytes;
    h2o_linklist_t link;           /* in ol->streams */
} oai_stream;

struct oai_loop {
    http_loop *L;
    h2o_evloop_t *ev;
    h2o_multithread_receiver_t progress_rx;
    h2o_timeout_t tick;
    h2o_linklist_t streams;
};

typedef struct {
    h2o_multithread_message_t super;
    char *line;                    /* NULL: re-check every request (progress may be lost) */
} progress_msg;

/* The loops' own jobs run this handler on a database worker (api_h_oai_internal). */
static const api_route internal_route = {"POST", "/v1/(internal)", ROUTE_NO_AUTH | ROUTE_RAW_BODY,
                                         api_h_oai_internal, NULL, .errors = &oai_error_shape};

/* The spec of a job of this extension (job->loop_ext is oai_loop_ext). */
static oai_spec *s_of(const api_job *job) { return job->ext; }

/* ---- the registry: request_id -> loop and stream ---------------------------------------------- */

typedef struct reg_entry {
    char rid[API_REQUEST_ID_MAX];
    oai_loop *ol;
    oai_stream *st;                /* only its loop reads it */
    int op;
    struct reg_entry *next;
} reg_entry;

#define REG_BUCKETS 4096
static reg_entry *g_reg[REG_BUCKETS];
static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static oai_loop *g_loops[MAX_LOOPS];
static int g_nloops;

static unsigned reg_hash(const char *s, size_t n) { return str_hash(s, n) % REG_BUCKETS; }

static void reg_add(const char *rid, oai_loop *ol, oai_stream *st, int op) {
    reg_entry *e = calloc(1, sizeof *e);
    if (!e) abort();
    snprintf(e->rid, sizeof e->rid, "%s", rid);
    e->ol = ol, e->st = st, e->op = op;
    unsigned h = reg_hash(rid, strlen(rid));
    pthread_mutex_lock(&g_reg_mu);
    e->next = g_reg[h];
    g_reg[h] = e;
    pthread_mutex_unlock(&g_reg_mu);
}

static void reg_del(const char *rid) {
    unsigned h = reg_hash(rid, strlen(rid));
    pthread_mutex_lock(&g_reg_mu);
    for (reg_entry **p = &g_reg[h]; *p; p = &(*p)->next)
        if (!strcmp((*p)->rid, rid)) {
            reg_entry *e = *p;
            *p = e->next;
            free(e);
            break;
        }
    pthread_mutex_unlock(&g_reg_mu);
}

/* The entry of rid[0..n) (copied out), or false. */
static bool reg_find(const char *rid, size_t n, reg_entry *out) {
    if (n >= API_REQUEST_ID_MAX) return false;
    unsigned h = reg_hash(rid, n);
    bool found = false;
    pthread_mutex_lock(&g_reg_mu);
    for (reg_entry *e = g_reg[h]; e && !found; e = e->next)
        if (strlen(e->rid) == n && !memcmp(e->rid, rid, n)) *out = *e, found = true;
    pthread_mutex_unlock(&g_reg_mu);
    return found;
}

/* ---- small helpers ----------------------------------------------------------------------------- */

static void put_lp(strbuf *b, double x) { sb_printf(b, "%.9g", x); }

/* A token as the answer shows it: its text (bytes that are not UTF-8 as U+FFFD), or
 * "token_id:N" (return_tokens_as_token_ids); bytes: its raw bytes as a JSON list. */
static void put_token(strbuf *b, const oai_spec *s, int32_t id, bool with_bytes) {
    size_t len = 0;
    const char *p = tok_token_to_piece(s->tok->tok, id, &len);
    if (s->token_ids) {
        sb_printf(b, "\"token_id:%d\"", id);
    } else {
        char *z = strndup(p ? p : "", len);
        sb_json_str(b, z);
        free(z);
    }
    if (!with_bytes) return;
    sb_puts(b, ", \"bytes\": [");
    for (size_t i = 0; i < len; i++) sb_printf(b, "%s%u", i ? ", " : "", (unsigned char)p[i]);
    sb_putc(b, ']');
}

/* Whether p[0..avail) is the start of a UTF-8 sequence that more bytes could complete. */
static bool utf8_incomplete(const unsigned char *p, size_t avail) {
    int need = p[0] >= 0xC2 && p[0] <= 0xDF ? 2 : p[0] >= 0xE0 && p[0] <= 0xEF ? 3 : p[0] >= 0xF0 && p[0] <= 0xF4 ? 4 : 0;
    if (!need || avail >= (size_t)need) return false;
    for (size_t i = 1; i < avail; i++) if ((p[i] & 0xC0) != 0x80) return false;
    return true;
}

/* Appends p[0..len) to out as valid UTF-8 (invalid bytes as U+FFFD); unless final, an
 * incomplete sequence at the end is left. Returns the bytes consumed. */
static size_t utf8_take(strbuf *out, const char *p, size_t len, bool final) {
    size_t i = 0;
    while (i < len) {
        size_t k = utf8_seq_len((const unsigned char *)p + i, len - i, NULL);
        if (k) {
            sb_append(out, p + i, k);
            i += k;
        } else if (!final && utf8_incomplete((const unsigned char *)p + i, len - i)) {
            break;
        } else {
            sb_puts(out, "\xef\xbf\xbd");
            i++;
        }
    }
    return i;
}

/* ---- the answer's JSON ------------------------------------------------------------------------------ */

static void chunk_head(strbuf *b, const oai_spec *s) {
    sb_puts(b, "data: {\"id\": ");
    sb_json_str(b, s->id);
    sb_printf(b, ", \"object\": \"%s\", \"created\": %lld, \"model\": ", s->chat ? "chat.completion.chunk"
                                                                                 : "text_completion",
              (long long)s->created);
    sb_json_str(b, s->model);
    sb_puts(b, ", \"system_fingerprint\": null, \"choices\": [");
}

/* Chat: one entry of logprobs.content. */
static void chat_logprob(strbuf *b, const oai_spec *s, const oai_choice *c, int i) {
    sb_puts(b, "{\"token\": ");
    put_token(b, s, c->ids[i], true);
    sb_puts(b, ", \"logprob\": ");
    put_lp(b, c->lps[i]);
    sb_puts(b, ", \"top_logprobs\": [");
    for (int k = 0, m = 0; k < s->logprobs; k++) {
        int32_t id = c->top_ids[(size_t)i * s->logprobs + k];
        if (id < 0) continue;
        sb_puts(b, m++ ? ", {\"token\": " : "{\"token\": ");
        put_token(b, s, id, true);
        sb_puts(b, ", \"logprob\": ");
        put_lp(b, c->top_lps[(size_t)i * s->logprobs + k]);
        sb_putc(b, '}');
    }
    sb_puts(b, "]}");
}

/* Completions: logprobs of tokens [from, to) in the legacy shape. */
static void completion_logprobs(strbuf *b, const oai_spec *s, const oai_choice *c, int from, int to) {
    sb_puts(b, "{\"tokens\": [");
    for (int i = from; i < to; i++) {
        if (i > from) sb_puts(b, ", ");
        put_token(b, s, c->ids[i], false);
    }
    sb_puts(b, "], \"token_logprobs\": [");
    for (int i = from; i < to; i++) {
        if (i > from) sb_puts(b, ", ");
        put_lp(b, c->lps[i]);
    }
    sb_puts(b, "], \"top_logprobs\": [");
    for (int i = from; i < to; i++) {
        sb_puts(b, i > from ? ", {" : "{");
        for (int k = 0, m = 0; k < s->logprobs; k++) {
            int32_t id = c->top_ids[(size_t)i * s->logprobs + k];
            if (id < 0) continue;
            if (m++) sb_puts(b, ", ");
            put_token(b, s, id, false);
            sb_puts(b, ": ");
            put_lp(b, c->top_lps[(size_t)i * s->logprobs + k]);
        }
        sb_putc(b, '}');
    }
    sb_puts(b, "], \"text_offset\": [");
    for (int i = from; i < to; i++) sb_printf(b, "%s%zu", i > from ? ", " : "", c->offsets[i]);
    sb_puts(b, "]}");
}

static const char *finish_reason(const oai_choice *c) { return c->stopped || c->stop_at >= 0 ? "stop" : "length"; }

static void usage_json(strbuf *b, const oai_stream *st) {
    long completion = 0;
    for (int i = 0; i < st->nch; i++) completion += st->ch[i].n;
    sb_printf(b, "{\"prompt_tokens\": %d, \"completion_tokens\": %ld, \"total_tokens\": %ld}",
              st->spec->prompt_tokens, completion, st->spec->prompt_tokens + completion);
}

/* ---- sending ----------------------------------------------------------------------------------------- */

static void flush(oai_stream *st) {
    if (!st->started || st->sending || st->final_sent) return;
    if (!st->pending.len && !st->finished) return;
    strbuf t = st->inflight;
    st->inflight = st->pending;
    st->pending = t;
    st->pending.len = 0;
    st->sending = true;
    st->last_bytes = h2o_now(st->ol->ev);
    h2o_iovec_t v = h2o_iovec_init(st->inflight.data, st->inflight.len);
    bool final = st->finished;
    if (final) st->final_sent = true;
    h2o_send(st->req, &v, 1, final ? (st->aborted ? H2O_SEND_STATE_ERROR : H2O_SEND_STATE_FINAL)
                                   : H2O_SEND_STATE_IN_PROGRESS);
}

static void on_proceed(h2o_generator_t *g, h2o_req_t *req) {
    oai_stream *st = H2O_STRUCT_FROM_MEMBER(oai_stream, gen, g);
    st->sending = false;
    st->inflight.len = 0;
    flush(st);
}

static void on_stop(h2o_generator_t *g, h2o_req_t *req) { (void)g, (void)req; /* disposal follows */ }

/* body: the error answered, for the access line's reason (NULL: none). */
static void observe(oai_stream *st, int status, const char *body, size_t len) {
    if (st->observed) return;
    st->observed = true;
    api_metrics_in_flight(-1);
    api_observe_answer(st->job, status, clock_wall_s(), body, len);
}

/* The request is answered (or its stream is complete): nothing more is needed from the
 * executors, the registry or the timer. */
static void settle(oai_stream *st) {
    st->finished = true;
    for (int i = 0; i < st->spec->nprompts; i++) reg_del(st->spec->request_ids[i]);
    if (h2o_timeout_is_linked(&st->timer)) h2o_timeout_unlink(&st->timer);
}

static void send_whole(oai_stream *st, int status, char *body, size_t len) {
    h2o_req_t *req = st->req;
    req->res.status = status;
    req->res.reason = status == 200 ? "OK" : "Error";
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, H2O_STRLIT("application/json"));
    req->res.content_length = len;
    observe(st, status, body, len);
    settle(st);
    h2o_send_inline(req, body, len);
    free(body);
}

/* The operation failed: an error chunk on a started stream, else an HTTP error. */
static void fail(oai_stream *st, int status, const char *msg) {
    size_t len;
    char *body = oai_error_body(status, msg, NULL, NULL, &len);
    if (!st->started) {
        send_whole(st, status, body, len);
        return;
    }
    sb_puts(&st->pending, "data: ");
    sb_append(&st->pending, body, len);
    sb_puts(&st->pending, "\n\ndata: [DONE]\n\n");
    observe(st, status, body, len);
    free(body);
    settle(st);
    flush(st);
}

/* ---- turning tokens into text --------------------------------------------------------------------- */

/* Looks for the first stop string in the raw bytes added since the last look. */
static void find_stop(const oai_spec *s, oai_choice *c) {
    if (!s->nstop || c->stop_at >= 0) return;
    size_t from = c->searched + 1 > s->stop_max ? c->searched + 1 - s->stop_max : 0;
    for (size_t a = from; a < c->raw.len && c->stop_at < 0; a++)
        for (int k = 0; k < s->nstop; k++)
            if (a + s->stop_len[k] <= c->raw.len && !memcmp(c->raw.data + a, s->stop[k], s->stop_len[k])) {
                c->stop_at = (long)a;
                break;
            }
    c->searched = c->raw.len;
}

/* A chunk for choice index: its text delta and the logprobs of tokens [from, to). */
static void chunk(oai_stream *st, int index, const char *text, size_t len, int from, int to, const char *finish) {
    const oai_spec *s = st->spec;
    const oai_choice *c = &st->ch[index];
    strbuf *b = &st->pending;
    chunk_head(b, s);
    sb_printf(b, "{\"index\": %d, ", index);
    char *t = strndup(text ? text : "", len);
    if (s->chat) {
        if (finish) sb_puts(b, "\"delta\": {}");
        else {
            sb_puts(b, "\"delta\": {\"content\": ");
            sb_json_str(b, t);
            sb_putc(b, '}');
        }
    } else {
        sb_puts(b, "\"text\": ");
        sb_json_str(b, t);
    }
    free(t);
    sb_puts(b, ", \"logprobs\": ");
    if (s->logprobs < 0 || from >= to) {
        sb_puts(b, "null");
    } else if (s->chat) {
        sb_puts(b, "{\"content\": [");
        for (int i = from; i < to; i++) {
            if (i > from) sb_puts(b, ", ");
            chat_logprob(b, s, c, i);
        }
        sb_puts(b, "], \"refusal\": null}");
    } else {
        completion_logprobs(b, s, c, from, to);
    }
    sb_puts(b, ", \"finish_reason\": ");
    if (finish) sb_printf(b, "\"%s\"", finish);
    else sb_puts(b, "null");
    sb_puts(b, "}]}\n\n");
}

/* Turns choice index's new tokens into text (and, streaming, chunks). */
static void advance(oai_stream *st, int index) {
    const oai_spec *s = st->spec;
    oai_choice *c = &st->ch[index];
    while (c->emitted < c->n) {
        int i = c->emitted++;
        if (c->stop_at < 0 && !tok_is_special(s->tok->tok, c->ids[i])) {
            size_t len = 0;
            const char *p = tok_token_to_piece(s->tok->tok, c->ids[i], &len);
            if (p) sb_append(&c->raw, p, len);
            find_stop(s, c);
        }
        bool final = (c->done && c->emitted == c->n) || c->stop_at >= 0;
        size_t limit = c->stop_at >= 0 ? (size_t)c->stop_at : c->raw.len;
        size_t hold = s->stop_max ? s->stop_max - 1 : 0;   /* bytes that may still start a stop string */
        if (!final) limit = limit > hold ? limit - hold : 0;
        if (limit < c->raw_sent) limit = c->raw_sent;
        size_t before = c->text.len;
        c->offsets[i] = before;
        c->raw_sent += utf8_take(&c->text, c->raw.data + c->raw_sent, limit - c->raw_sent, final);
        if (s->stream && (c->text.len > before || s->logprobs >= 0))
            chunk(st, index, c->text.data + before, c->text.len - before, i, i + 1, NULL);
    }
    if (c->done && !c->finish_sent) {
        c->finish_sent = true;
        if (s->stream) chunk(st, index, "", 0, 0, 0, finish_reason(c));
    }
}

static bool all_done(const oai_stream *st) {
    for (int i = 0; i < st->nch; i++) if (!st->ch[i].finish_sent) return false;
    return true;
}

/* The whole answer (stream=false). */
static void answer_whole(oai_stream *st) {
    const oai_spec *s = st->spec;
    strbuf b;
    sb_init(&b, 1024);
    sb_puts(&b, "{\"id\": ");
    sb_json_str(&b, s->id);
    sb_printf(&b, ", \"object\": \"%s\", \"created\": %lld, \"model\": ", s->chat ? "chat.completion" : "text_completion",
              (long long)s->created);
    sb_json_str(&b, s->model);
    sb_puts(&b, ", \"system_fingerprint\": null, \"choices\": [");
    for (int i = 0; i < st->nch; i++) {
        const oai_choice *c = &st->ch[i];
        char *t = strndup(c->text.data ? c->text.data : "", c->text.len);
        sb_printf(&b, "%s{\"index\": %d, ", i ? ", " : "", i);
        if (s->chat) {
            sb_puts(&b, "\"message\": {\"role\": \"assistant\", \"content\": ");
            sb_json_str(&b, t);
            sb_puts(&b, ", \"refusal\": null}");
        } else {
            sb_puts(&b, "\"text\": ");
            sb_json_str(&b, t);
        }
        free(t);
        sb_puts(&b, ", \"logprobs\": ");
        if (s->logprobs < 0) {
            sb_puts(&b, "null");
        } else if (s->chat) {
            sb_puts(&b, "{\"content\": [");
            for (int k = 0; k < c->n; k++) {
                if (k) sb_puts(&b, ", ");
                chat_logprob(&b, s, c, k);
            }
            sb_puts(&b, "], \"refusal\": null}");
        } else {
            completion_logprobs(&b, s, c, 0, c->n);
        }
        sb_printf(&b, ", \"finish_reason\": \"%s\"}", finish_reason(c));
    }
    sb_puts(&b, "], \"usage\": ");
    usage_json(&b, st);
    sb_putc(&b, '}');
    size_t len;
    char *body = sb_steal(&b, &len);
    send_whole(st, 200, body, len);
}

/* Everything that can be said now; the end when every choice is done. */
static void progress_made(oai_stream *st) {
    if (st->finished) return;
    for (int i = 0; i < st->nch; i++) advance(st, i);
    if (st->pending.len > OAI_MAX_PENDING) {
        log_warn("openai %s: the client reads too slowly (%zu bytes waiting); ending the stream", st->spec->id,
                 st->pending.len);
        st->aborted = true;
        observe(st, 499, NULL, 0);
        settle(st);
        flush(st);
        return;
    }
    if (!all_done(st)) {
        flush(st);
        return;
    }
    if (!st->spec->stream) {
        answer_whole(st);
        return;
    }
    if (st->spec->include_usage) {
        chunk_head(&st->pending, st->spec);
        sb_puts(&st->pending, "], \"usage\": ");
        usage_json(&st->pending, st);
        sb_puts(&st->pending, "}\n\n");
    }
    sb_puts(&st->pending, "data: [DONE]\n\n");
    observe(st, 200, NULL, 0);
    settle(st);
    flush(st);
}

/* ---- tokens in ------------------------------------------------------------------------------------- */

static void choice_grow(oai_choice *c, int need, int k) {
    if (need <= c->cap) return;
    int cap = c->cap ? c->cap : 16;
    while (cap < need) cap *= 2;
    c->ids = realloc(c->ids, cap * sizeof *c->ids);
    c->lps = realloc(c->lps, cap * sizeof *c->lps);
    c->offsets = realloc(c->offsets, cap * sizeof *c->offsets);
    if (k > 0) {
        c->top_ids = realloc(c->top_ids, (size_t)cap * k * sizeof *c->top_ids);
        c->top_lps = realloc(c->top_lps, (size_t)cap * k * sizeof *c->top_lps);
    }
    if (!c->ids || !c->lps || !c->offsets || (k > 0 && (!c->top_ids || !c->top_lps))) abort();
    c->cap = cap;
}

/* Tokens [offset, offset + count) of a choice (ids, logprobs, tops: per token a list of
 * [id, logprob], or NULL); end: "stop" / "length" when the choice ends with them.
 * authoritative: from the committed result (clears a gap). false: they contradict what
 * was sent already. */
static bool feed(oai_stream *st, oai_choice *c, int offset, const json_t *ids, const json_t *lps, const json_t *tops,
                 const char *end, bool authoritative) {
    int K = st->spec->logprobs > 0 ? st->spec->logprobs : 0;
    if (authoritative) c->gap = false;
    if (c->done || c->gap) return true;
    if (offset > c->n) {   /* progress was lost: wait for the result */
        c->gap = true;
        return true;
    }
    int count = (int)json_array_size(ids);
    for (int j = 0; j < count; j++) {
        int at = offset + j;
        int32_t id = (int32_t)json_integer_value(json_array_get(ids, j));
        if (at < c->n) {
            if (c->ids[at] != id) return false;
            continue;
        }
        choice_grow(c, at + 1, K);
        c->ids[at] = id;
        c->lps[at] = (float)json_number_value(json_array_get(lps, j));
        const json_t *row = tops ? json_array_get(tops, j) : NULL;
        for (int k = 0; k < K; k++) {
            const json_t *e = json_array_get(row, k);
            c->top_ids[(size_t)at * K + k] = e ? (int32_t)json_integer_value(json_array_get(e, 0)) : -1;
            c->top_lps[(size_t)at * K + k] = e ? (float)json_number_value(json_array_get(e, 1)) : 0;
        }
        c->n = at + 1;
    }
    if (end && offset + count == c->n) {
        c->done = true;
        c->stopped = !strcmp(end, "stop");
    }
    return true;
}

static void contradiction(oai_stream *st) {
    log_error("openai %s: the tokens streamed differ from the committed result", st->spec->id);
    fail(st, 500, "the sampled tokens changed while streaming (the operation was run again and gave other tokens); "
                  "retry the request");
}

/* A progress line for operation op of st. */
static void apply_line(oai_stream *st, int op, const json_t *v) {
    int s = (int)json_integer_value(json_object_get(v, "s"));
    if (s < 0 || s >= st->spec->n) return;
    oai_choice *c = &st->ch[op * st->spec->n + s];
    st->last_progress = h2o_now(st->ol->ev);
    if (!feed(st, c, (int)json_integer_value(json_object_get(v, "o")), json_object_get(v, "t"),
              json_object_get(v, "l"), json_object_get(v, "k"), json_string_value(json_object_get(v, "d")), false))
        return contradiction(st);
    progress_made(st);
}

/* The loop's look at operation op came back: {state, result, error, category}. */
static void apply_result(oai_stream *st, int op, const char *text) {
    json_error_t je;
    json_t *v = json_loads(text, 0, &je);
    const char *state = json_string_value(json_object_get(v, "state"));
    if (!state) {
        json_decref(v);
        return;
    }
    if (!strcmp(state, "done")) {
        st->op_done[op] = true;
        const json_t *seqs = json_object_get(json_object_get(v, "result"), "sequences");
        if (json_array_size(seqs) != (size_t)st->spec->n) {
            json_decref(v);
            return fail(st, 500, "the operation finished without a usable result");
        }
        for (int s = 0; s < st->spec->n; s++) {
            const json_t *q = json_array_get(seqs, s);
            if (!feed(st, &st->ch[op * st->spec->n + s], 0, json_object_get(q, "tokens"), json_object_get(q, "logprobs"),
                      json_object_get(q, "top_logprobs"), json_string_value(json_object_get(q, "stop_reason")), true)) {
                json_decref(v);
                return contradiction(st);
            }
            st->ch[op * st->spec->n + s].done = true;   /* the result is the whole sample */
        }
        json_decref(v);
        return progress_made(st);
    }
    if (!strcmp(state, "failed") || !strcmp(state, "canceled")) {
        const char *err = json_string_value(json_object_get(v, "error")), *cat = json_string_value(json_object_get(v, "category"));
        char msg[1200];
        snprintf(msg, sizeof msg, "%s", err ? err : "the completion failed");
        json_decref(v);
        return fail(st, cat && !strcmp(cat, "user") ? 400 : 500, msg);
    }
    json_decref(v);   /* queued or running: wait */
}

/* ---- the loop's looks at the database ------------------------------------------------------------- */

static api_job *internal_job(int kind, const char *rid, int64_t tenant) {
    api_job *j = calloc(1, sizeof *j);
    oai_spec *s = calloc(1, sizeof *s);
    if (!j || !s) abort();
    s->kind = kind;
    s->tenant_id = tenant;
    snprintf(s->fetch_id, sizeof s->fetch_id, "%s", rid);
    j->loop_ext = &oai_loop_ext;
    j->ext = s;
    j->route = &internal_route;
    j->body = calloc(1, 1);
    snprintf(j->log_id, sizeof j->log_id, "openai-%s", kind == OAI_FETCH ? "fetch" : "cancel");
    return j;
}

static void cancel_ops(oai_loop *ol, const oai_spec *s) {
    for (int i = 0; i < s->nprompts; i++) {
        api_job *j = internal_job(OAI_CANCEL, s->request_ids[i], s->tenant_id);
        if (http_loop_submit(ol->L, j) < 0) {
            log_warn("openai: cannot cancel %s (the database workers are busy); it runs to its end", s->request_ids[i]);
            api_job_free(j);
        }
    }
}

/* Reads the state of an operation that NOTIFY named, else (due) of the next one not done. */
static void maybe_fetch(oai_stream *st, bool due) {
    if (st->fetch || st->finished) return;
    int op = -1, np = st->spec->nprompts;
    for (int i = 0; i < np && op < 0; i++) if (st->op_notified[i] && !st->op_done[i]) op = i;
    for (int k = 0; k < np && op < 0 && due; k++) {
        int i = (st->next_fetch + k) % np;
        if (!st->op_done[i]) op = i, st->next_fetch = i + 1;
    }
    if (op < 0) return;
    st->op_notified[op] = false;
    api_job *j = internal_job(OAI_FETCH, st->spec->request_ids[op], st->spec->tenant_id);
    s_of(j)->waiter = st;
    if (http_loop_submit(st->ol->L, j) < 0) {
        api_job_free(j);   /* the workers are busy: the next tick tries again */
        return;
    }
    st->fetch = j;
}

/* Whether an HTTP/1 client closed its connection. h2o does not read an HTTP/1 connection
 * while it answers a request, so a client that leaves would only be noticed at a failing
 * write; a look at the socket (EOF or a reset, never data: a client sends nothing more
 * before the answer) notices it within a tick. HTTP/2 clients reset the stream, which h2o
 * reads and turns into the request's disposal. */
static bool peer_closed(h2o_req_t *req) {
    if (req->version >= 0x200 || !req->conn->callbacks->get_socket) return false;
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    if (!sock) return false;
    char b;
    ssize_t r = recv(h2o_socket_get_fd(sock), &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* The client left: its operations are canceled and the answer ends (an aborted stream, or
 * an error body nobody reads); h2o then closes the connection and disposes the request. */
static void client_gone(oai_stream *st) {
    cancel_ops(st->ol, st->spec);
    observe(st, 499, NULL, 0);
    if (!st->started) {
        size_t len;
        char *body = oai_error_body(400, "the client closed the connection", NULL, NULL, &len);
        send_whole(st, 400, body, len);
        return;
    }
    st->aborted = true;   /* ends the response with an error: the connection is closed */
    settle(st);
    flush(st);
}

static void on_tick(h2o_timeout_entry_t *e) {
    oai_stream *st = H2O_STRUCT_FROM_MEMBER(oai_stream, timer, e);
    uint64_t now = h2o_now(st->ol->ev);
    if (peer_closed(st->req)) return client_gone(st);
    maybe_fetch(st, now - st->last_progress >= RECHECK_MS);
    if (st->spec->stream && st->started && !st->sending && now - st->last_bytes >= KEEPALIVE_MS) {
        sb_puts(&st->pending, ": keep-alive\n\n");
        flush(st);
    }
    h2o_timeout_link(st->ol->ev, &st->ol->tick, &st->timer);
}

/* ---- a request's life ------------------------------------------------------------------------------ */

static void on_dispose(void *p) {
    oai_stream *st = p;
    if (!st->finished) {
        cancel_ops(st->ol, st->spec);
        settle(st);
    }
    observe(st, 499, NULL, 0);
    if (h2o_linklist_is_linked(&st->link)) h2o_linklist_unlink(&st->link);
    if (st->fetch) s_of(st->fetch)->waiter = NULL;
    for (int i = 0; i < st->nch; i++) {
        oai_choice *c = &st->ch[i];
        free(c->ids), free(c->lps), free(c->top_ids), free(c->top_lps), free(c->offsets);
        sb_free(&c->raw);
        sb_free(&c->text);
    }
    free(st->ch);
    free(st->op_done);
    free(st->op_notified);
    sb_free(&st->pending);
    sb_free(&st->inflight);
    api_job_free(st->job);
}

/* The accepted request: follow its operations, and start the event stream. */
static void start(oai_loop *ol, api_job *job, h2o_req_t *req) {
    oai_stream *st = h2o_mem_alloc_shared(&req->pool, sizeof *st, on_dispose);
    memset(st, 0, sizeof *st);
    st->ol = ol;
    st->req = req;
    st->job = job;
    st->spec = s_of(job);
    st->nch = st->spec->nprompts * st->spec->n;
    st->ch = calloc(st->nch, sizeof *st->ch);
    st->op_done = calloc(st->spec->nprompts, sizeof *st->op_done);
    st->op_notified = calloc(st->spec->nprompts, sizeof *st->op_notified);
    if (!st->ch || !st->op_done || !st->op_notified) abort();
    for (int i = 0; i < st->nch; i++) st->ch[i].stop_at = -1;
    st->last_progress = st->last_bytes = h2o_now(ol->ev);
    h2o_linklist_insert(&ol->streams, &st->link);
    for (int i = 0; i < st->spec->nprompts; i++) reg_add(st->spec->request_ids[i], ol, st, i);
    st->timer.cb = on_tick;
    h2o_timeout_link(ol->ev, &ol->tick, &st->timer);
    if (!st->spec->stream) return;
    req->res.status = 200;
    req->res.reason = "OK";
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, H2O_STRLIT("text/event-stream"));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-cache"));
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-accel-buffering"), 0, NULL, H2O_STRLIT("no"));
    st->gen = (h2o_generator_t){on_proceed, on_stop};
    h2o_start_response(req, &st->gen);
    st->started = true;
    if (st->spec->chat)   /* as OpenAI opens a chat stream: the role, once per choice */
        for (int i = 0; i < st->nch; i++) {
            chunk_head(&st->pending, st->spec);
            sb_printf(&st->pending, "{\"index\": %d, \"delta\": {\"role\": \"assistant\", \"content\": \"\"}, "
                      "\"logprobs\": null, \"finish_reason\": null}]}\n\n", i);
        }
    flush(st);
}

/* http_loop_ext.job_back */
static void oai_job_back(void *state, api_job *job, h2o_req_t *req) {
    oai_loop *ol = state;
    oai_spec *s = s_of(job);
    if (s->kind == OAI_ANSWER) {
        if (req) return start(ol, job, req);
        cancel_ops(ol, s);   /* the client went away while the request was being accepted */
        api_job_free(job);
        return;
    }
    if (s->kind == OAI_FETCH && s->waiter) {
        oai_stream *st = s->waiter;
        st->fetch = NULL;
        int op = -1;
        for (int i = 0; i < st->spec->nprompts; i++) if (!strcmp(st->spec->request_ids[i], s->fetch_id)) op = i;
        if (job->status == 200 && job->resp && op >= 0) apply_result(st, op, job->resp);
        if (!st->finished) maybe_fetch(st, false);
    }
    api_job_free(job);
}

/* http_loop_ext.op_done */
static void oai_op_done(void *state, const char *request_id) {
    oai_loop *ol = state;
    if (!request_id) {
        for (h2o_linklist_t *n = ol->streams.next; n != &ol->streams; n = n->next) {
            oai_stream *st = H2O_STRUCT_FROM_MEMBER(oai_stream, link, n);
            st->last_progress = 0;   /* the next tick reads the results */
        }
        return;
    }
    reg_entry e;
    if (!reg_find(request_id, strlen(request_id), &e) || e.ol != ol) return;
    e.st->op_notified[e.op] = true;
    maybe_fetch(e.st, false);
}

/* ---- progress from the executors ---------------------------------------------------------------------- */

static void on_progress(h2o_multithread_receiver_t *rx, h2o_linklist_t *messages) {
    oai_loop *ol = H2O_STRUCT_FROM_MEMBER(oai_loop, progress_rx, rx);
    while (!h2o_linklist_is_empty(messages)) {
        progress_msg *m = H2O_STRUCT_FROM_MEMBER(progress_msg, super.link, messages->next);
        h2o_linklist_unlink(&m->super.link);
        json_error_t je;
        json_t *v = m->line ? json_loads(m->line, 0, &je) : NULL;
        const char *rid = json_string_value(json_object_get(v, "r"));
        reg_entry e;
        if (!m->line) oai_op_done(ol, NULL);
        else if (rid && reg_find(rid, strlen(rid), &e) && e.ol == ol && !e.st->finished) apply_line(e.st, e.op, v);
        json_decref(v);
        free(m->line);
        free(m);
    }
}

static void post(oai_loop *ol, char *line) {
    progress_msg *m = calloc(1, sizeof *m);
    if (!m) abort();
    m->line = line;
    h2o_multithread_send_message(&ol->progress_rx, &m->super);
}

void oai_progress(const char *payload, void *arg) {
    (void)arg;
    if (!payload) {   /* reconnected: progress may be lost, every request reads its result */
        for (int i = 0; i < g_nloops; i++) post(g_loops[i], NULL);
        return;
    }
    /* Lines start {"r":"<request_id>": only those of requests held here are parsed. */
    for (const char *l = payload; *l;) {
        const char *nl = strchr(l, '\n'), *end = nl ? nl : l + strlen(l);
        reg_entry e;
        if (end - l > 7 && !memcmp(l, "{\"r\":\"", 6)) {
            const char *q = memchr(l + 6, '"', end - l - 6);
            if (q && reg_find(l + 6, q - l - 6, &e)) post(e.ol, strndup(l, end - l));
        }
        l = nl ? nl + 1 : end;
    }
}

/* http_loop_ext.loop_init */
static void *oai_loop_new(http_loop *L, h2o_evloop_t *evloop, h2o_multithread_queue_t *queue) {
    oai_loop *ol = calloc(1, sizeof *ol);
    if (!ol) abort();
    ol->L = L;
    ol->ev = evloop;
    h2o_linklist_init_anchor(&ol->streams);
    h2o_timeout_init(evloop, &ol->tick, TICK_MS);
    h2o_multithread_register_receiver(queue, &ol->progress_rx, on_progress);
    pthread_mutex_lock(&g_reg_mu);
    if (g_nloops < MAX_LOOPS) g_loops[g_nloops++] = ol;
    pthread_mutex_unlock(&g_reg_mu);
    return ol;
}

static void spec_free(void *ext) { oai_spec_free(ext); }

const http_loop_ext oai_loop_ext = {oai_loop_new, oai_job_back, oai_op_done, spec_free};
