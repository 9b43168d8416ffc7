/* api_futures.c: POST /api/v1/retrieve_future (docs/protocol.md §4.2), the worker side. One look at the
 * operations row: done -> the stored result; failed/canceled -> {"error", "category"};
 * queued/claimed -> the job is parked by its event loop (core/http_server.c), which sends it
 * back here on a NOTIFY on CHAN_OP_DONE or after 1 s, and answers try_again after 25 s,
 * with the queue state and the reason the operation waits. A NOTIFY that carries the
 * result (an executor's, when it is small) is answered from it, without a second look. */
#include "common/db.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "core/api_call.h"
#include "core/api_json.h"
#include "service/api_proto.h"
#include "tinker/api_futures_cache.h"
#include "tinker/api_sql.h"
#include "tinker/tinker.h"
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int reply_failed(api_call *c, const char *error, const char *category) {
    if (!category || (strcmp(category, "user") && strcmp(category, "server") &&
                      strcmp(category, "unknown")))
        category = "server";
    return api_reply_json(c, 200, json_pack("{s:s, s:s}", "error", error, "category", category));
}

/* try_again is the answer the loop sends if the deadline passes while parked. The SDK
 * shows queue_state and queue_state_reason (§4.2): "paused_*" states are logged as
 * warnings on the client, at most once a minute. */
static int reply_pending(api_call *c, const char *queue_state, const char *reason) {
    strbuf b;
    sb_init(&b, 256);
    sb_puts(&b, "{\"type\": \"try_again\", \"request_id\": ");
    sb_json_str(&b, c->job->request_id);
    sb_puts(&b, ", \"queue_state\": ");
    sb_json_str(&b, queue_state);
    sb_puts(&b, ", \"queue_state_reason\": ");
    sb_json_str(&b, reason);
    sb_putc(&b, '}');
    size_t len;
    char *text = sb_steal(&b, &len);
    api_reply_take(c, 200, text, len);
    c->job->park = true;
    return 0;
}

/* Why a queued or claimed operation (row 0 of SQL_FUTURE_GET) has not finished. */
static int reply_waiting(api_call *c, const PGresult *r) {
    char reason[768];
    const char *state = PQgetvalue(r, 0, 0), *model = PQgetvalue(r, 0, 5);
    int64_t samples = db_int(r, 0, 12), limit = c->settings->max_queued_samples;
    if (!strcmp(state, "claimed")) {
        snprintf(reason, sizeof reason, "running (cycle %s)", PQgetvalue(r, 0, 7));
        return reply_pending(c, "active", reason);
    }
    if (!db_bool(r, 0, 9)) {
        snprintf(reason, sizeof reason, "no executor is serving base model %.200s at the moment; "
                 "the operation runs when one is back", PQgetvalue(r, 0, 8));
        return reply_pending(c, "paused_capacity", reason);
    }
    if (!PQgetisnull(r, 0, 15)) {
        /* Its executor hands a snapshot over to the pool as it drains; this one was not
         * (evicted before, or the write to the blob store failed: its log says). */
        const char *holder = PQgetvalue(r, 0, 15);
        snprintf(reason, sizeof reason, "the weights of this sampler are held only by executor %.200s, which is "
                 "draining (it takes no work) and did not hand them over; the sample runs there after `loom executor "
                 "undrain %.200s`, or save weights for the sampler again to sample elsewhere", holder, holder);
        return reply_pending(c, "paused_capacity", reason);
    }
    if (!PQgetisnull(r, 0, 13) && db_int(r, 0, 14) >= db_int(r, 0, 13)) {
        snprintf(reason, sizeof reason, "this tenant's operations claimed %lld tokens in the last minute, its limit "
                 "is %lld tokens per minute; they run as the minute frees up", (long long)db_int(r, 0, 14),
                 (long long)db_int(r, 0, 13));
        return reply_pending(c, "paused_rate_limit", reason);
    }
    if (!PQgetisnull(r, 0, 12) && limit > 0 && samples >= limit) {
        snprintf(reason, sizeof reason, "this tenant has %lld sample operations queued (the limit "
                 "is %lld); they run in turn", (long long)samples, (long long)limit);
        return reply_pending(c, "paused_rate_limit", reason);
    }
    if (db_bool(r, 0, 11)) {
        snprintf(reason, sizeof reason, "waiting for seq_id %s of model %.300s: a model's "
                 "operations run in seq_id order, and a missing seq_id is given up on after a "
                 "while", PQgetvalue(r, 0, 10), model);
        return reply_pending(c, "active", reason);
    }
    if (!PQgetisnull(r, 0, 10) && db_int(r, 0, 6) > db_int(r, 0, 10)) {
        snprintf(reason, sizeof reason, "queued behind seq_id %s of model %.300s",
                 PQgetvalue(r, 0, 10), model);
        return reply_pending(c, "active", reason);
    }
    return reply_pending(c, "active", "queued");
}

/* A finished result: protobuf for fwd/bwd and sample results when the client accepts it
 * (§4.2, §14; SDK 0.25 accepts nothing else for them), else JSON: a fwd/bwd's from its
 * packed result (api_proto.c), any other the stored JSON. */
static int reply_result(api_call *c, const char *kind, const char *json, const uint8_t *bin, size_t bin_len) {
    bool fwd = !strcmp(kind, OP_FORWARD_BACKWARD) || !strcmp(kind, OP_FORWARD);
    if (fwd && bin) return proto_reply_fb_result(c, bin, bin_len);
    if (!strcmp(kind, OP_SAMPLE) && proto_accepted(c->job->accept)) {
        uint8_t *buf;
        size_t len;
        if (proto_encode_sample_response(json, &buf, &len, c->err, sizeof c->err) == 0)
            return api_reply_bytes(c, 200, "application/x-protobuf", buf, len);
        log_warn("retrieve_future %s: %s; answering JSON", c->job->request_id, c->err);
    }
    return api_reply_text(c, 200, json);
}

static int hex_digit(char h) {
    if (h >= '0' && h <= '9') return h - '0';
    if (h >= 'a' && h <= 'f') return h - 'a' + 10;
    return h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
}

/* The result an executor's loom_op_done carried (job->done_note: "request_id\ttenant\t
 * kind\tB<hex>" or "...\tJ<json>", contract.h CHAN_OP_DONE): answered as reply_result
 * answers the row, without reading it back (it was sent with the commit that made it
 * final). 1 answered; 0 the note does not do (another tenant's request_id, a malformed
 * note): the caller reads the row. */
static int reply_from_note(api_call *c, const char *note) {
    const char *t1 = strchr(note, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL,
               *t3 = t2 ? strchr(t2 + 1, '\t') : NULL;
    if (!t3 || (t3[1] != 'B' && t3[1] != 'J')) return 0;
    char tenant[24], kind[32];
    if (t2 - t1 - 1 >= (ptrdiff_t)sizeof tenant || t3 - t2 - 1 >= (ptrdiff_t)sizeof kind) return 0;
    snprintf(tenant, sizeof tenant, "%.*s", (int)(t2 - t1 - 1), t1 + 1);
    snprintf(kind, sizeof kind, "%.*s", (int)(t3 - t2 - 1), t2 + 1);
    if (strtoll(tenant, NULL, 10) != c->job->tenant_id) return 0;   /* the row's 404 */
    const char *data = t3 + 2;
    if (t3[1] == 'J') return reply_result(c, kind, data, NULL, 0), 1;
    if (strcmp(kind, OP_FORWARD_BACKWARD) && strcmp(kind, OP_FORWARD)) return 0;   /* only theirs are packed */
    size_t hex = strlen(data), len = hex / 2;
    uint8_t *bin = malloc(len ? len : 1);
    if (!bin || hex % 2) { free(bin); return 0; }
    for (size_t i = 0; i < len; i++) {
        int hi = hex_digit(data[2 * i]), lo = hex_digit(data[2 * i + 1]);
        if (hi < 0 || lo < 0) { free(bin); return 0; }
        bin[i] = (uint8_t)(hi << 4 | lo);
    }
    reply_result(c, kind, NULL, bin, len);
    free(bin);
    return 1;
}

/* The loop's first look (api_route.first_look): what this api knows without the row
 * (api_futures_cache.h), as the worker's first look below; anything else goes to a
 * worker. */
int api_future_first_look(api_call *c) {
    const char *rid;
    if (jx_req_str(c->body, "", "request_id", &rid, c->err, sizeof c->err) < 0 || strlen(rid) >= API_REQUEST_ID_MAX)
        return 0;
    char *cached = NULL;
    fut_state st = fut_cache_get(rid, c->tenant_id, &cached);
    if (st == FUT_UNKNOWN) return 0;
    api_job *job = c->job;
    snprintf(job->request_id, sizeof job->request_id, "%s", rid);
    job->tenant_id = c->tenant_id;
    job->recheck = true; /* parked: its later looks skip auth and parsing */
    int answered = st == FUT_DONE ? reply_from_note(c, cached)
                                  : (reply_pending(c, "active", "submitted; not finished yet"), 1);
    free(cached);
    return answered;
}

/* The loop's answer from the note (api_route.from_note): no worker, no database. */
int api_future_from_note(api_call *c, const char *note) { return reply_from_note(c, note); }

int api_h_retrieve_future(api_call *c) {
    api_job *job = c->job;
    bool first = !job->recheck;
    if (first) {
        const char *rid;
        if (jx_req_str(c->body, "", "request_id", &rid, c->err, sizeof c->err) < 0)
            return api_error(c, 400, "%s", c->err);
        if (strlen(rid) >= API_REQUEST_ID_MAX)
            return api_error(c, 404, "unknown request_id %.64s...", rid);
        snprintf(job->request_id, sizeof job->request_id, "%s", rid);
        job->tenant_id = c->tenant_id;
        job->recheck = true; /* the loop's later looks skip auth and parsing */
    }
    /* woken by a notification that carried the result */
    char *note = job->done_note;
    job->done_note = NULL;
    int answered = note && reply_from_note(c, note);
    free(note);
    if (answered) return 0;
    /* The first look, at what this api knows without the row (api_futures_cache.h): a
     * result its loom_op_done carried, or an operation submitted here and not finished
     * (parked: the notification answers it, or the loop's re-check reads the row). */
    if (first) {
        char *cached = NULL;
        fut_state st = fut_cache_get(job->request_id, job->tenant_id, &cached);
        answered = st == FUT_DONE && reply_from_note(c, cached);
        free(cached);
        if (answered) return 0;
        if (st == FUT_PENDING) return reply_pending(c, "active", "submitted; not finished yet");
    }
    char tid[24], lim[24], timeout[24];
    api_fmt_i64(tid, job->tenant_id);
    api_fmt_i64(lim, c->settings->max_queued_samples);
    api_fmt_i64(timeout, c->settings->executor_timeout_s);
    const char *p[4] = {job->request_id, tid, lim, timeout};
    PGresult *r = db_query_bin(c->db, SQL_FUTURE_GET, 4, p, NULL, NULL, 1, c->err, sizeof c->err);
    if (!r) {
        /* A long poll outlives a database outage: keep waiting, look again in a second. */
        log_msg(PQstatus(c->db) == CONNECTION_OK ? LOG_WARN_ : db_outage_level(),
                "retrieve_future %s: database error, still waiting: %s", job->request_id, c->err);
        return reply_pending(c, "active", "the database is not reachable at the moment; waiting "
                                          "for it");
    }
    if (PQntuples(r) == 0) {
        PQclear(r);
        return api_error(c, 404, "unknown request_id %s", job->request_id);
    }
    const char *state = PQgetvalue(r, 0, 0);
    if (!strcmp(state, "done")) {
        if (PQgetisnull(r, 0, 1)) reply_failed(c, "operation finished without a result", "server");
        else reply_result(c, PQgetvalue(r, 0, 4), PQgetvalue(r, 0, 1),
                          PQgetisnull(r, 0, 16) ? NULL : (const uint8_t *)PQgetvalue(r, 0, 16),
                          (size_t)PQgetlength(r, 0, 16));
    } else if (!strcmp(state, "failed") || !strcmp(state, "canceled")) {
        const char *error = PQgetisnull(r, 0, 2) ? NULL : PQgetvalue(r, 0, 2);
        const char *cat = PQgetisnull(r, 0, 3) ? NULL : PQgetvalue(r, 0, 3);
        if (!error) error = !strcmp(state, "canceled") ? "operation was canceled" : "operation failed";
        reply_failed(c, error, cat);
    } else {
        reply_waiting(c, r); /* queued or claimed: the loop parks the request */
    }
    PQclear(r);
    return 0;
}
