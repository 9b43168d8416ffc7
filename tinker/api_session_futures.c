/* api_session_futures.c: the sampling routes of SDK 0.26+ that work per sampling session
 * (docs/protocol.md §4.4–§4.6, migration 0022):
 *
 * - POST /api/v1/retrieve_futures: a long poll per (sampling session, client) that
 *   reports which samples finished since a cursor, so the SDK keeps one connection per
 *   sampler instead of one per sample (client/config sample_use_retrieve_futures). The
 *   payload is then fetched with retrieve_future as before. A poll numbers the samples
 *   that finished since it last looked (operations.report_seq, under the sampling
 *   session's row lock), so a commit that lands after a later one is reported with a
 *   later number rather than missed; the cursor is the last number the client saw.
 *   Nothing is waiting: the job is parked on its loop (core/http_server.c) under the key
 *   'ss:' || md5(session), which is the payload of the NOTIFY a finished sample sends.
 * - POST /api/v1/cancel_future: a sample the client abandoned (client/dynamic_config
 *   sample_cancel_enabled).
 * - POST /api/v1/join_sampling_session: a number for a new client of a sampling session
 *   (an unpickled SamplingClient), whose sample seq_ids then lie in their own block of
 *   10^9, so that the (sampling_session_id, seq_id) idempotency key stays one client's. */
#include "common/db.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "tinker/api_session_futures.h"
#include "tinker/api_futures_sql.h"
#include "core/api_json.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLONE_BLOCK 1000000000LL             /* seq_ids of client n: [n * 1e9, (n + 1) * 1e9) */
#define CLONE_MAX (INT64_MAX / CLONE_BLOCK - 1)
#define POLL_MAX_COMPLETIONS 1000            /* completions per answer; the rest come next poll */
#define POLL_HOLD_MAX_MS 25000               /* as retrieve_future (the SDK waits 45 s) */

/* ---- retrieve_futures (§4.4) ------------------------------------------------------------ */

typedef struct {
    char sid[512];
    int64_t clone, cursor;
} poll_target;

/* FuturesRetrieveRequest {target: {type, sampling_session_id, cloned_sampler_id},
 * prev_cursor, timeout}. 0, or -1 with the 400 answered. */
static int decode_poll(api_call *c, poll_target *t) {
    const json_t *target = json_object_get(c->body, "target");
    const char *sid, *type;
    bool has;
    double hold_s = POLL_HOLD_MAX_MS / 1000.0;
    if (!json_is_object(target))
        return api_error(c, 400, "target: expected an object {\"type\": \"sampling_session\", "
                                 "\"sampling_session_id\": ..., \"cloned_sampler_id\": ...}"), -1;
    if (jx_str(target, "target", "type", &type, c->err, sizeof c->err) < 0 ||
        jx_req_str(target, "target", "sampling_session_id", &sid, c->err, sizeof c->err) < 0 ||
        jx_int(target, "target", "cloned_sampler_id", 0, &t->clone, &has, c->err, sizeof c->err) < 0 ||
        jx_int(c->body, "", "prev_cursor", 0, &t->cursor, &has, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err), -1;
    if (type && strcmp(type, "sampling_session"))
        return api_error(c, 400, "target.type: only \"sampling_session\" targets are polled, got \"%.60s\"", type), -1;
    if (t->clone < 0 || t->clone > CLONE_MAX)
        return api_error(c, 400, "target.cloned_sampler_id must be between 0 and %lld (seq_id // 10^9 of the "
                                 "client's samples)", (long long)CLONE_MAX), -1;
    if (t->cursor < 0) return api_error(c, 400, "prev_cursor must be >= 0 (0: from the beginning)"), -1;
    if (strlen(sid) >= sizeof t->sid)
        return api_error(c, 404, "sampling session %.200s... not found", sid), -1;
    const json_t *to = json_object_get(c->body, "timeout");
    if (to && !json_is_null(to)) {
        if (!json_is_number(to) || !isfinite(json_number_value(to)) || json_number_value(to) < 0)
            return api_error(c, 400, "timeout: expected seconds >= 0 to hold the poll, or null"), -1;
        if (json_number_value(to) < hold_s) hold_s = json_number_value(to);
    }
    snprintf(t->sid, sizeof t->sid, "%s", sid);
    /* hold_ms 0 means the loop's default (api_job.h), so "answer at once" is 1 ms, which
     * api_h_retrieve_futures also reads as "do not park". */
    c->job->hold_ms = hold_s * 1000 < 1 ? 1 : (uint32_t)(hold_s * 1000);
    return 0;
}

/* FuturesRetrieveResponse {completions: [FutureFinished | FutureFailed], cursor}. */
static char *poll_answer(const PGresult *r, int64_t cursor, size_t *len) {
    strbuf b;
    sb_init(&b, 256);
    sb_puts(&b, "{\"completions\": [");
    for (int i = 0; r && i < PQntuples(r); i++) {
        bool done = !strcmp(PQgetvalue(r, i, 2), "done");
        sb_printf(&b, "%s{\"state\": \"%s\", \"request_id\": ", i ? ", " : "", done ? "finished" : "failed");
        sb_json_str(&b, PQgetvalue(r, i, 1));
        if (done) sb_printf(&b, ", \"response_payload_uncompressed_size\": %lld", (long long)db_int(r, i, 3));
        sb_putc(&b, '}');
        cursor = db_int(r, i, 0);
    }
    sb_printf(&b, "], \"cursor\": %lld}", (long long)cursor);
    return sb_steal(&b, len);
}

int api_h_retrieve_futures(api_call *c) {
    api_job *job = c->job;
    poll_target t;
    if (!job->recheck) {
        if (decode_poll(c, &t) < 0) return 0;
        json_t *state = json_pack("{s:s, s:I, s:I}", "sid", t.sid, "clone", (json_int_t)t.clone, "cursor",
                                  (json_int_t)t.cursor);
        free(job->recheck_arg);
        job->recheck_arg = json_dumps(state, JSON_COMPACT);
        json_decref(state);
        job->tenant_id = c->tenant_id;
        job->recheck = true;   /* the loop's later looks skip auth and parsing */
    } else {
        json_t *state = json_loads(job->recheck_arg ? job->recheck_arg : "", 0, NULL);
        const char *sid = json_string_value(json_object_get(state, "sid"));
        snprintf(t.sid, sizeof t.sid, "%s", sid ? sid : "");
        t.clone = json_integer_value(json_object_get(state, "clone"));
        t.cursor = json_integer_value(json_object_get(state, "cursor"));
        json_decref(state);
    }
    char tid[24], lo[24], hi[24], cur[24], lim[24];
    api_fmt_i64(tid, job->tenant_id);
    api_fmt_i64(lo, t.clone * CLONE_BLOCK);
    api_fmt_i64(hi, (t.clone + 1) * CLONE_BLOCK);
    api_fmt_i64(cur, t.cursor);
    api_fmt_i64(lim, POLL_MAX_COMPLETIONS);
    const char *pl[2] = {t.sid, tid};
    const char *pp[5] = {t.sid, lo, hi, cur, lim};
    PGresult *r = NULL;
    if (db_begin(c->db, c->err, sizeof c->err) < 0) goto dberr;
    if (!(r = db_query(c->db, SQL_SSF_LOCK, 2, pl, c->err, sizeof c->err))) goto dberr;
    if (PQntuples(r) == 0) {
        PQclear(r);
        db_rollback(c->db);
        return api_error(c, 404, "sampling session %.300s not found", t.sid);
    }
    snprintf(job->request_id, sizeof job->request_id, "%s", PQgetvalue(r, 0, 0));
    /* A cursor past every number given is not one of this session's (a client that
     * outlived the database it polled): it would hide every completion to come, so it
     * counts as 0 and the client gets all of them again rather than none. */
    if (t.cursor > db_int(r, 0, 1)) api_fmt_i64(cur, 0);
    PQclear(r);
    if (!(r = db_query(c->db, SQL_SSF_POLL, 5, pp, c->err, sizeof c->err))) goto dberr;
    if (db_commit(c->db, c->err, sizeof c->err) < 0) goto dberr;
    size_t len;
    char *text = poll_answer(r, t.cursor, &len);
    api_reply_take(c, 200, text, len);
    /* Nothing new: park until one of the session's samples finishes (or the hold ends,
     * when the loop sends this empty answer). */
    job->park = PQntuples(r) == 0 && job->hold_ms > 1;
    PQclear(r);
    return 0;
dberr:
    if (r) PQclear(r);
    db_rollback(c->db);
    /* Held like retrieve_future through an outage: the empty answer at the deadline. */
    log_warn("retrieve_futures %s: database error, holding the poll: %s", t.sid, c->err);
    size_t n;
    char *empty = poll_answer(NULL, t.cursor, &n);
    api_reply_take(c, 200, empty, n);
    job->park = true;
    return 0;
}

/* ---- cancel_future (§4.5) ---------------------------------------------------------------- */

int api_h_cancel_future(api_call *c) {
    const char *rid;
    if (jx_req_str(c->body, "", "request_id", &rid, c->err, sizeof c->err) < 0) return api_error(c, 400, "%s", c->err);
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *p[2] = {rid, tid};
    PGresult *r = db_query(c->db, SQL_SSF_CANCEL, 2, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "cancel_future", c->err);
    bool found = PQntuples(r) > 0 && !strcmp(PQgetvalue(r, 0, 0), OP_SAMPLE);
    PQclear(r);
    if (!found)
        return api_error(c, 404, "unknown sample request_id %.200s (cancel_future takes the futures of samples)", rid);
    /* Canceled, already final, or running (it finishes, §4.5): 204 in every case. */
    return api_reply_take(c, 204, strdup(""), 0);
}

/* ---- join_sampling_session (§4.6) ------------------------------------------------------ */

int api_h_join_sampling_session(api_call *c) {
    const char *sid;
    if (jx_req_str(c->body, "", "sampling_session_id", &sid, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *p[2] = {sid, tid};
    PGresult *r = db_query(c->db, SQL_SSF_JOIN, 2, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "join_sampling_session", c->err);
    if (PQntuples(r) > 0) {
        int64_t n = db_int(r, 0, 0);
        PQclear(r);
        return api_reply_json(c, 200, json_pack("{s:s, s:I}", "type", "join_sampling_session", "client_counter",
                                                (json_int_t)n));
    }
    PQclear(r);
    if (!(r = db_query(c->db, SQL_SSF_SAMPLER_STATE, 2, p, c->err, sizeof c->err)))
        return api_db_error(c, "join_sampling_session", c->err);
    int st = PQntuples(r) == 0 ? 404 : db_bool(r, 0, 0) ? 400 : 409;
    PQclear(r);
    if (st == 404) return api_error(c, 404, "sampling session %.300s not found", sid);
    if (st == 400)
        return api_error(c, 400, "the session of sampling session %.300s expired (no heartbeat and no request for a "
                                 "while); create a new session and sampler", sid);
    return api_error(c, 409, "sampling session %.300s has had 2^31 - 1 clients join; create a new one", sid);
}
