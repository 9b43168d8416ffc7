/* api_sampling.c: sampling routes: create_sampling_session (docs/protocol.md §3.3), GET samplers/{id}
 * (§3.4), the unnamed save_weights_for_sampler (§7.6: a snapshot of the model's live
 * weights plus its sampling session, in one transaction) and asample / sample (§11.1).
 *
 * A sampling session samples from one of three sources, fixed at creation: the base
 * model, a checkpoint (model_path -> adapter_versions), or a snapshot of a training
 * model taken by an unnamed save_weights_for_sampler (source_model_id). Its id is
 * "<session_id>:sample:<sampling_session_seq_id>", idempotent on that pair. */
#include "common/db.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "core/api_call.h"
#include "core/api_json.h"
#include "tinker/api_ops.h"
#include "tinker/api_sql.h"
#include "tinker/api_weights.h"
#include "service/sample_req.h"
#include "tinker/tinker.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLER_ID_MAX 400

static int sampler_id(char out[SAMPLER_ID_MAX], const char *session_id, int64_t seq) {
    return snprintf(out, SAMPLER_ID_MAX, "%s:sample:%lld", session_id, (long long)seq) <
                   SAMPLER_ID_MAX
               ? 0
               : -1;
}

/* ---- create_sampling_session (§3.3) ---------------------------------------------------- */

typedef struct {
    char version_id[24];   /* "" for the base model */
    char base_model[OP_NAME_MAX];
} sampler_source;

/* model_path -> the checkpoint the tenant may read. 0, an HTTP status with err, or -1. */
static int resolve_model_path(api_call *c, const char *path, sampler_source *src) {
    if (strncmp(path, "tinker://", 9) != 0) {
        snprintf(c->err, sizeof c->err, "model_path must be a tinker:// checkpoint path such as "
                                         "tinker://<run>/sampler_weights/<name>, got \"%.200s\"",
                 path);
        return 400;
    }
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *p[2] = {path, tid};
    PGresult *r = db_query(c->db, SQL_CHECKPOINT_READABLE, 2, p, c->err, sizeof c->err);
    if (!r) return -1;
    int st = 0;
    if (PQntuples(r) == 0) {
        snprintf(c->err, sizeof c->err, "checkpoint %.300s not found (it does not exist, was "
                                         "deleted or has expired, or is not shared with you)",
                 path);
        st = 404;
    } else if (!db_bool(r, 0, 3)) {
        snprintf(c->err, sizeof c->err, "checkpoint %.300s is for base model %.200s, which this "
                                         "server does not serve", path, PQgetvalue(r, 0, 1));
        st = 400;
    } else {
        snprintf(src->version_id, sizeof src->version_id, "%s", PQgetvalue(r, 0, 0));
        snprintf(src->base_model, sizeof src->base_model, "%s", PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    return st;
}

/* base_model must be one this server serves. 0, 400 with err, or -1. */
static int resolve_base_model(api_call *c, const char *name, sampler_source *src) {
    const char *bp[1] = {name};
    PGresult *r = db_query(c->db, SQL_BASE_MODEL_GET, 1, bp, c->err, sizeof c->err);
    if (!r) return -1;
    int known = PQntuples(r) > 0;
    PQclear(r);
    if (known) {
        snprintf(src->base_model, sizeof src->base_model, "%s", name);
        return 0;
    }
    r = db_query(c->db, SQL_BASE_MODEL_NAMES, 0, NULL, c->err, sizeof c->err);
    if (!r) return -1;
    const char *names = PQgetvalue(r, 0, 0);
    snprintf(c->err, sizeof c->err, "unknown base_model \"%.200s\"; this server has: %s", name,
             *names ? names : "(no base models registered)");
    PQclear(r);
    return 400;
}

/* Same source as an existing sampling session? (a retry of the same create) */
static bool same_source(const PGresult *r, const char *model_path, const sampler_source *src) {
    if (!PQgetisnull(r, 0, 3)) return false; /* a snapshot of save_weights_for_sampler */
    if (strcmp(PQgetvalue(r, 0, 1), src->base_model) != 0) return false;
    if (PQgetisnull(r, 0, 2) != (model_path == NULL)) return false;
    return !model_path || !strcmp(PQgetvalue(r, 0, 2), model_path);
}

int api_h_create_sampling_session(api_call *c) {
    const char *sid, *base_model, *model_path;
    int64_t seq;
    bool has_seq;
    if (jx_req_str(c->body, "", "session_id", &sid, c->err, sizeof c->err) < 0 ||
        jx_int(c->body, "", "sampling_session_seq_id", 0, &seq, &has_seq, c->err, sizeof c->err) < 0 ||
        jx_str(c->body, "", "base_model", &base_model, c->err, sizeof c->err) < 0 ||
        jx_str(c->body, "", "model_path", &model_path, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    if (has_seq && (seq < 0 || seq > INT32_MAX))
        return api_error(c, 400, "sampling_session_seq_id must be between 0 and %d", INT32_MAX);
    if (model_path && !*model_path) model_path = NULL;
    if (base_model && !*base_model) base_model = NULL;
    if (!model_path && !base_model)
        return api_error(c, 400, "give base_model (a model name from get_server_capabilities) or "
                                 "model_path (a tinker:// checkpoint path) to sample from");

    sampler_source src;
    memset(&src, 0, sizeof src);
    int st = model_path ? resolve_model_path(c, model_path, &src) : resolve_base_model(c, base_model, &src);
    if (st < 0) return api_db_error(c, "create_sampling_session", c->err);
    if (st > 0) return api_error(c, st, "%s", c->err);
    if (model_path && base_model && strcmp(base_model, src.base_model) != 0)
        return api_error(c, 400, "base_model \"%.200s\" does not match checkpoint %.300s, which is "
                                 "for \"%.200s\"; leave base_model out", base_model, model_path,
                         src.base_model);

    char tid[24], seqs[24], id[SAMPLER_ID_MAX];
    api_fmt_i64(tid, c->tenant_id);
    if (db_begin(c->db, c->err, sizeof c->err) < 0) goto dberr;
    /* The session row lock serialises sampling_session_seq_id allocation. */
    int locked = api_session_lock(c, sid);
    if (locked < 0) goto dberr;
    if (locked > 0) return 0;
    PGresult *r;
    if (!has_seq) {
        const char *p1[1] = {sid};
        r = db_query(c->db, SQL_SESSION_NEXT_SAMPLING_SEQ, 1, p1, c->err, sizeof c->err);
        if (!r) goto dberr;
        seq = db_int(r, 0, 0);
        PQclear(r);
    }
    api_fmt_i64(seqs, seq);
    if (sampler_id(id, sid, seq) < 0) {
        db_rollback(c->db);
        return api_error(c, 400, "session_id is too long");
    }
    const char *ip[9] = {id, tid, sid, seqs, src.base_model, model_path, NULL, NULL,
                         src.version_id[0] ? src.version_id : NULL};
    r = db_query(c->db, SQL_SAMPLING_SESSION_INSERT, 9, ip, c->err, sizeof c->err);
    if (!r) goto dberr;
    int inserted = PQntuples(r) > 0;
    PQclear(r);
    if (!inserted) {
        const char *gp[2] = {id, tid};
        r = db_query(c->db, SQL_SAMPLING_SESSION_GET, 2, gp, c->err, sizeof c->err);
        if (!r) goto dberr;
        bool same = PQntuples(r) > 0 && same_source(r, model_path, &src);
        PQclear(r);
        if (!same) {
            db_rollback(c->db);
            return api_error(c, 400, "sampling_session_seq_id %s of session %.200s is already used "
                                     "by another sampling session; use the next free number",
                             seqs, sid);
        }
    }
    if (db_commit(c->db, c->err, sizeof c->err) < 0) goto dberr;
    return api_reply_json(c, 200, json_pack("{s:s, s:s}", "type", "create_sampling_session",
                                            "sampling_session_id", id));
dberr:
    db_rollback(c->db);
    return api_db_error(c, "create_sampling_session", c->err);
}

/* ---- GET /api/v1/samplers/{id} (§3.4) ------------------------------------------------- */

int api_h_get_sampler(api_call *c) {
    PGresult *r = api_tenant_row(c, "samplers", SQL_SAMPLING_SESSION_GET, api_path_id(c), "sampler");
    if (!r) return 0;
    json_t *resp = json_pack("{s:s, s:s, s:o}", "sampler_id", PQgetvalue(r, 0, 0), "base_model",
                             PQgetvalue(r, 0, 1), "model_path",
                             PQgetisnull(r, 0, 2) ? json_null() : json_string(PQgetvalue(r, 0, 2)));
    PQclear(r);
    return api_reply_json(c, 200, resp);
}

/* ---- save_weights_for_sampler, unnamed form (§7.6) ------------------------------------ */
/* One route for both forms: with a "path" it is a named checkpoint (api_weights.c). */

typedef struct {
    const char *id, *tenant, *session, *seq, *base_model, *model_id;
} snapshot_session;

/* In the submit's transaction: the sampling session of the snapshot. */
static int insert_snapshot_session(PGconn *db, void *arg, const char *op_seq, char *err,
                                   size_t errlen) {
    snapshot_session *s = arg;
    const char *p[9] = {s->id, s->tenant, s->session, s->seq, s->base_model, NULL, s->model_id,
                        op_seq, NULL};
    PGresult *r = db_query(db, SQL_SAMPLING_SESSION_INSERT, 9, p, err, errlen);
    if (!r) return -1;
    int inserted = PQntuples(r) > 0;
    PQclear(r);
    if (inserted) return 0;
    snprintf(err, errlen, "sampling_session_seq_id %s of session %.200s is already used by another "
                          "sampling session; use the next free number", s->seq, s->session);
    return 400;
}

int api_h_save_weights_for_sampler(api_call *c) {
    const json_t *path = json_object_get(c->body, "path");
    if (path && !json_is_null(path)) return api_weights_save_for_sampler_named(c);

    const char *model_id;
    int64_t seq_id, sseq;
    bool has_seq, has_sseq;
    if (jx_req_str(c->body, "", "model_id", &model_id, c->err, sizeof c->err) < 0 ||
        jx_int(c->body, "", "seq_id", 0, &seq_id, &has_seq, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    if (has_seq && (seq_id < 1 || seq_id > INT32_MAX))
        return api_error(c, 400, "seq_id %lld is out of range: operations of a model are numbered "
                                 "from 1 (0 is its create_model)", (long long)seq_id);
#define REJECT(st) op_reject(c, st, model_id, has_seq, seq_id, OP_SAVE_FOR_SAMPLER)
    if (jx_int(c->body, "", "sampling_session_seq_id", 0, &sseq, &has_sseq, c->err, sizeof c->err) < 0)
        return REJECT(400);
    if (has_sseq && (sseq < 0 || sseq > INT32_MAX)) {
        snprintf(c->err, sizeof c->err, "sampling_session_seq_id must be between 0 and %d", INT32_MAX);
        return REJECT(400);
    }
    op_model_info m;
    int st = op_model_check(c->db, c->tenant_id, model_id, &m, c->err, sizeof c->err);
    if (st < 0) return api_db_error(c, "save_weights_for_sampler", c->err);
    if (st > 0) return REJECT(st);
    if (!has_sseq) {
        /* Without a number from the client, take the session's next free one. */
        const char *p1[1] = {m.session_id};
        PGresult *r = db_query(c->db, SQL_SESSION_NEXT_SAMPLING_SEQ, 1, p1, c->err, sizeof c->err);
        if (!r) return api_db_error(c, "save_weights_for_sampler", c->err);
        sseq = db_int(r, 0, 0);
        PQclear(r);
    }
    char tid[24], sseqs[24], id[SAMPLER_ID_MAX];
    api_fmt_i64(tid, c->tenant_id);
    api_fmt_i64(sseqs, sseq);
    if (sampler_id(id, m.session_id, sseq) < 0) {
        snprintf(c->err, sizeof c->err, "session id is too long");
        return REJECT(400);
    }
    strbuf pl;
    sb_init(&pl, 128);
    sb_puts(&pl, "{\"sampling_session_id\": ");
    sb_json_str(&pl, id);
    sb_putc(&pl, '}');
    snapshot_session ss = {id, tid, m.session_id, sseqs, m.base_model, model_id};
    op_submit_req s = {.tenant_id = c->tenant_id, .model_id = model_id,
                       .kind = OP_SAVE_FOR_SAMPLER, .has_seq_id = has_seq, .seq_id = seq_id,
                       .payload = pl.data, .n_tokens = 0, .in_tx = insert_snapshot_session,
                       .in_tx_arg = &ss};
    char request_id[API_REQUEST_ID_MAX];
    st = op_submit(c->db, &s, request_id, c->err, sizeof c->err);
    sb_free(&pl);
    if (st < 0) return api_db_error(c, "save_weights_for_sampler", c->err);
    if (st > 0) return REJECT(st);
#undef REJECT
    return api_reply_json(c, 200, json_pack("{s:s, s:s}", "request_id", request_id, "model_id",
                                            model_id));
}

/* ---- asample / sample (§11.1) ---------------------------------------------------------- */

/* The tenant's queue of samples is over the limit: 429 + Retry-After (the SDK backs off
 * and resubmits the same sample). */
static int over_backpressure(api_call *c, bool *over) {
    char tid[24], lim[24];
    api_fmt_i64(tid, c->tenant_id);
    api_fmt_i64(lim, c->settings->max_queued_samples + 1);
    const char *p[2] = {tid, lim};
    PGresult *r = db_query(c->db, SQL_TENANT_QUEUED_SAMPLES, 2, p, c->err, sizeof c->err);
    if (!r) return -1;
    *over = db_int(r, 0, 0) > c->settings->max_queued_samples;
    PQclear(r);
    return 0;
}

/* 1 with request_id and the num_samples it was submitted with when (sampling session,
 * seq_id) was submitted before, 0 if not. */
static int existing_sample(api_call *c, const sample_req *q, const char *seq,
                           char request_id[API_REQUEST_ID_MAX], int64_t *num_samples) {
    if (!q->has_seq_id) return 0;
    const char *p[2] = {q->sampling_session_id, seq};
    PGresult *r = db_query(c->db, SQL_SAMPLE_EXISTING, 2, p, c->err, sizeof c->err);
    if (!r) return -1;
    int found = PQntuples(r) > 0;
    if (found) {
        snprintf(request_id, API_REQUEST_ID_MAX, "%s", PQgetvalue(r, 0, 0));
        *num_samples = db_int(r, 0, 1);
    }
    PQclear(r);
    return found;
}

/* {"request_id", "sample_sequence_ids": one id per sample, in result order}. SDK >= 0.27
 * refuses a sample result whose submission carried no ids (it stamps them onto the
 * returned sequences); the executor writes the same ids into the result. */
static int reply_sample_future(api_call *c, const char *request_id, int64_t num_samples) {
    json_t *ids = json_array();
    for (int64_t i = 0; i < num_samples && i < LIMIT_NUM_SAMPLES; i++) {
        char id[SAMPLE_SEQUENCE_ID_MAX];
        sample_sequence_id(id, sizeof id, request_id, (int)i);
        json_array_append_new(ids, json_string(id));
    }
    return api_reply_json(c, 200, json_pack("{s:s, s:o}", "request_id", request_id, "sample_sequence_ids", ids));
}

int api_h_asample(api_call *c) {
    sample_req q;
    int rc = sample_decode_json(c->body, &q, c->err, sizeof c->err);
    if (rc < 0) {
        sample_req_free(&q);
        return api_error(c, 400, "%s", c->err);
    }
    char tid[24], seq[24], ntok[24], request_id[API_REQUEST_ID_MAX];
    api_fmt_i64(tid, c->tenant_id);
    api_fmt_i64(seq, q.seq_id);
    const char *p[2] = {q.sampling_session_id, tid};
    PGresult *r = db_query(c->db, SQL_SAMPLER_FOR_OP, 2, p, c->err, sizeof c->err);
    char *payload = NULL;
    if (!r) goto dberr;
    if (PQntuples(r) == 0) {
        api_error(c, 404, "sampling session %.200s not found (create it with "
                          "create_sampling_session or save_weights_for_sampler)",
                  q.sampling_session_id);
        goto out;
    }
    if (db_bool(r, 0, 7)) {
        api_error(c, 400, "the session of sampling session %.200s expired (no heartbeat and no request for a "
                          "while); create a new session and sampler", q.sampling_session_id);
        goto out;
    }
    if (!PQgetisnull(r, 0, 8)) {
        api_error(c, 400, "the session of sampling session %.200s was finished by its client (%s: "
                          "ServiceClient.close) and takes no more requests; create a new ServiceClient",
                  q.sampling_session_id, PQgetvalue(r, 0, 8));
        goto out;
    }
    if (db_bool(r, 0, 4)) {
        api_error(c, 400, "the checkpoint behind sampling session %.200s (%.300s) was deleted or "
                          "has expired; create a new sampling session", q.sampling_session_id,
                  PQgetvalue(r, 0, 5));
        goto out;
    }
    if (!db_bool(r, 0, 6)) {
        api_error(c, 403, "checkpoint %.300s behind sampling session %.200s is no longer shared "
                          "with you (unpublished, or its share was revoked)", PQgetvalue(r, 0, 5),
                  q.sampling_session_id);
        goto out;
    }
    if (sample_validate(&q, db_int(r, 0, 0), db_int(r, 0, 1), c->err, sizeof c->err) < 0) {
        api_error(c, 400, "%s", c->err);
        goto out;
    }
    const char *source = PQgetvalue(r, 0, 2);
    size_t plen;
    payload = sample_payload_json(&q, source, !strcmp(source, "checkpoint") ? PQgetvalue(r, 0, 3)
                                                                            : NULL, &plen);
    PQclear(r);
    r = NULL;

    /* A resubmission returns its first future (and that one's sequence ids), even under
     * backpressure. */
    int64_t first_n = q.p.num_samples;
    int found = existing_sample(c, &q, seq, request_id, &first_n);
    if (found < 0) goto dberr;
    if (found) {
        reply_sample_future(c, request_id, first_n);
        goto out;
    }
    bool over;
    if (over_backpressure(c, &over) < 0) goto dberr;
    if (over) {
        api_error(c, 429, "too many sample requests queued for this tenant (more than %lld); "
                          "retry in a moment", (long long)c->settings->max_queued_samples);
        c->job->retry_after = 1;
        goto out;
    }
    api_fmt_i64(ntok, sample_n_tokens(&q));
    op_new_request_id(request_id);
    const char *ip[6] = {request_id, tid, q.sampling_session_id, q.has_seq_id ? seq : NULL,
                         payload, ntok};
    r = db_query_bin_notify(c->db, SQL_SAMPLE_SUBMIT, 6, ip, NULL, NULL, 0, c->err, sizeof c->err);
    if (!r) goto dberr;
    if (PQntuples(r) == 0 || !db_bool(r, 0, 0)) {
        api_error(c, 400, "the session of sampling session %.200s expired (no heartbeat and no request for a "
                          "while); create a new session and sampler", q.sampling_session_id);
        goto out;
    }
    if (PQgetisnull(r, 0, 1) && (found = existing_sample(c, &q, seq, request_id, &first_n)) <= 0) {
        if (found < 0) goto dberr;
        api_error(c, 503, "sample %s of %.200s vanished during submission; retry", seq,
                  q.sampling_session_id);
        goto out;
    }
    reply_sample_future(c, request_id, first_n);
    goto out;
dberr:
    api_db_error(c, "asample", c->err);
out:
    if (r) PQclear(r);
    free(payload);
    sample_req_free(&q);
    return 0;
}
