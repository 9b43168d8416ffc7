/* api_futures.c: POST /api/v1/retrieve_future (§4.2), the worker side. One look at the
 * operations row: done -> the stored result; failed/canceled -> {"error", "category"};
 * queued/claimed -> the job is parked by its event loop (http_server.c), which sends it
 * back here on a NOTIFY loom_op_done or after 1 s, and answers try_again after 25 s. */
#include "common/db.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "service/api_call.h"
#include "service/api_json.h"
#include "service/api_proto.h"
#include "service/api_sql.h"
#include <stdio.h>
#include <string.h>

static int reply_failed(api_call *c, const char *error, const char *category) {
    if (!category || (strcmp(category, "user") && strcmp(category, "server") &&
                      strcmp(category, "unknown")))
        category = "server";
    return api_reply_json(c, 200, json_pack("{s:s, s:s}", "error", error, "category", category));
}

/* try_again is the answer the loop sends if the deadline passes while parked. */
static int reply_pending(api_call *c) {
    strbuf b;
    sb_init(&b, 128);
    sb_puts(&b, "{\"type\": \"try_again\", \"request_id\": ");
    sb_json_str(&b, c->job->request_id);
    sb_puts(&b, ", \"queue_state\": \"active\"}");
    size_t len;
    char *text = sb_steal(&b, &len);
    api_reply_take(c, 200, text, len);
    c->job->park = true;
    return 0;
}

/* A finished result: protobuf for fwd/bwd and sample results when the client accepts it
 * (§4.2, §14; SDK 0.25 accepts nothing else for them), else the stored JSON. */
static int reply_result(api_call *c, const char *kind, const char *json) {
    bool fwd = !strcmp(kind, "forward_backward") || !strcmp(kind, "forward");
    bool sample = !strcmp(kind, "sample");
    if ((fwd || sample) && proto_accepted(c->job->accept)) {
        uint8_t *buf;
        size_t len;
        int rc = fwd ? proto_encode_fwdbwd_output(json, &buf, &len, c->err, sizeof c->err)
                     : proto_encode_sample_response(json, &buf, &len, c->err, sizeof c->err);
        if (rc == 0) return api_reply_bytes(c, 200, "application/x-protobuf", buf, len);
        log_warn("retrieve_future %s: %s; answering JSON", c->job->request_id, c->err);
    }
    return api_reply_text(c, 200, json);
}

int api_h_retrieve_future(api_call *c) {
    api_job *job = c->job;
    if (!job->recheck) {
        const char *rid;
        if (jx_req_str(c->body, "", "request_id", &rid, c->err, sizeof c->err) < 0)
            return api_error(c, 400, "%s", c->err);
        if (strlen(rid) >= API_REQUEST_ID_MAX)
            return api_error(c, 404, "unknown request_id %.64s...", rid);
        snprintf(job->request_id, sizeof job->request_id, "%s", rid);
        job->tenant_id = c->tenant_id;
    }
    char tid[24];
    snprintf(tid, sizeof tid, "%lld", (long long)job->tenant_id);
    const char *p[2] = {job->request_id, tid};
    PGresult *r = db_query(c->db, SQL_FUTURE_GET, 2, p, c->err, sizeof c->err);
    if (!r && job->recheck) {
        /* A long poll in progress outlives a database hiccup: keep waiting. */
        log_warn("retrieve_future %s: database error, still waiting: %s", job->request_id, c->err);
        return reply_pending(c);
    }
    if (!r) return api_db_error(c, "retrieve_future", c->err);
    if (PQntuples(r) == 0) {
        PQclear(r);
        return api_error(c, 404, "unknown request_id %s", job->request_id);
    }
    const char *state = PQgetvalue(r, 0, 0);
    if (!strcmp(state, "done")) {
        if (PQgetisnull(r, 0, 1)) reply_failed(c, "operation finished without a result", "server");
        else reply_result(c, PQgetvalue(r, 0, 4), PQgetvalue(r, 0, 1));
    } else if (!strcmp(state, "failed") || !strcmp(state, "canceled")) {
        const char *error = PQgetisnull(r, 0, 2) ? NULL : PQgetvalue(r, 0, 2);
        const char *cat = PQgetisnull(r, 0, 3) ? NULL : PQgetvalue(r, 0, 3);
        if (!error) error = !strcmp(state, "canceled") ? "operation was canceled" : "operation failed";
        reply_failed(c, error, cat);
    } else {
        reply_pending(c); /* queued or claimed: the loop parks the request */
    }
    PQclear(r);
    return 0;
}
