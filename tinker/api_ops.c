/* api_ops.c: operation submission (see api_ops.h). */
#include "tinker/api_ops.h"
#include "common/clock.h"
#include "common/db.h"
#include "common/log.h"
#include "common/strhash.h"
#include "core/api_call.h"
#include "core/api_json.h"
#include "tinker/api_futures_cache.h"
#include "tinker/api_sql.h"
#include "tinker/tinker.h"
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

void op_new_request_id(char out[API_REQUEST_ID_MAX]) {
    unsigned char raw[16];
    randombytes_buf(raw, sizeof raw);
    memcpy(out, "req-", 4);
    sodium_bin2hex(out + 4, API_REQUEST_ID_MAX - 4, raw, sizeof raw);
}

/* The 400 for a submit to a model whose session expired (session: its id, or NULL). */
static void expired_msg(char *err, size_t errlen, const char *model_id, const char *session) {
    snprintf(err, errlen, "model %.200s expired with its session%s%.100s (no heartbeat and no request for a "
             "while) and takes no more operations; its state is saved as tinker://%.200s/weights/"
             SESSION_EXPIRED_CHECKPOINT ": create a new model and load_weights it to continue", model_id,
             session ? " " : "", session ? session : "", model_id);
}

/* The check, and whether the tenant has a queued-operations limit (then it is not remembered). */
static int model_check(PGconn *db, int64_t tenant_id, const char *model_id, op_model_info *out, bool *limited,
                       char *err, size_t errlen);

int op_model_check(PGconn *db, int64_t tenant_id, const char *model_id, op_model_info *out,
                   char *err, size_t errlen) {
    bool limited;
    return model_check(db, tenant_id, model_id, out, &limited, err, errlen);
}

/* ---- checks remembered for a moment (op_model_check_recent) ---------------------------- */

#define RECENT_SLOTS 1024
typedef struct {
    char model_id[OP_NAME_MAX];
    int64_t tenant_id;
    double at;   /* clock_mono_s() of the check; 0: empty */
    op_model_info info;
} recent_check;
static pthread_mutex_t g_recent_mu = PTHREAD_MUTEX_INITIALIZER;
static recent_check g_recent[RECENT_SLOTS];

static recent_check *recent_slot(const char *model_id) {
    return &g_recent[str_hash(model_id, strlen(model_id)) % RECENT_SLOTS];
}

int op_model_check_recent(PGconn *db, int64_t tenant_id, const char *model_id, op_model_info *out, bool *cached,
                          char *err, size_t errlen) {
    *cached = false;
    if (strlen(model_id) < OP_NAME_MAX) {
        pthread_mutex_lock(&g_recent_mu);
        recent_check *r = recent_slot(model_id);
        if (r->at > 0 && clock_mono_s() - r->at < OP_MODEL_RECENT_S && r->tenant_id == tenant_id &&
            !strcmp(r->model_id, model_id)) {
            *out = r->info;
            *cached = true;
        }
        pthread_mutex_unlock(&g_recent_mu);
        if (*cached) return 0;
    }
    bool limited = true;
    double at = clock_mono_s();
    int st = model_check(db, tenant_id, model_id, out, &limited, err, errlen);
    if (st == 0 && !limited && strlen(model_id) < OP_NAME_MAX) {
        pthread_mutex_lock(&g_recent_mu);
        recent_check *r = recent_slot(model_id);
        snprintf(r->model_id, sizeof r->model_id, "%s", model_id);
        r->tenant_id = tenant_id;
        r->at = at;
        r->info = *out;
        pthread_mutex_unlock(&g_recent_mu);
    }
    return st;
}

int op_model_recheck(PGconn *db, int64_t tenant_id, const char *model_id, int status, char *err, size_t errlen) {
    pthread_mutex_lock(&g_recent_mu);
    recent_check *r = recent_slot(model_id);
    if (!strcmp(r->model_id, model_id)) r->at = 0;
    pthread_mutex_unlock(&g_recent_mu);
    op_model_info m;
    char e2[1024];
    bool limited;
    int st = model_check(db, tenant_id, model_id, &m, &limited, e2, sizeof e2);
    if (st == 0) return status;
    snprintf(err, errlen, "%s", e2);
    return st;
}

static int model_check(PGconn *db, int64_t tenant_id, const char *model_id, op_model_info *out, bool *limited,
                       char *err, size_t errlen) {
    char tid[24];
    api_fmt_i64(tid, tenant_id);
    const char *p[2] = {model_id, tid};
    PGresult *r = db_query(db, SQL_MODEL_FOR_OP, 2, p, err, errlen);
    if (!r) return -1;
    if (PQntuples(r) == 0) {
        PQclear(r);
        snprintf(err, errlen, "model %.200s not found (create it with create_model first)",
                 model_id);
        return 404;
    }
    const char *status = PQgetvalue(r, 0, 0);
    if (!strcmp(status, "expired") || (!strcmp(status, "active") && db_bool(r, 0, 5))) {
        expired_msg(err, errlen, model_id, PQgetvalue(r, 0, 3));
        PQclear(r);
        return 400;
    }
    if (!PQgetisnull(r, 0, 9)) {
        api_session_finished_msg(err, errlen, PQgetvalue(r, 0, 3), PQgetvalue(r, 0, 9));
        PQclear(r);
        return 400;
    }
    if (strcmp(status, "active") != 0) {
        snprintf(err, errlen, "model %.200s is %s and takes no more operations", model_id, status);
        PQclear(r);
        return 400;
    }
    if (!PQgetisnull(r, 0, 6) && db_int(r, 0, 7) >= db_int(r, 0, 6)) {
        snprintf(err, errlen, "this tenant has %lld operations queued or running, its limit (loom tenant set-limits "
                 "--max-queued-ops); retry when some have finished", (long long)db_int(r, 0, 6));
        PQclear(r);
        return 429;
    }
    *limited = !PQgetisnull(r, 0, 6);
    out->vocab_size = db_int(r, 0, 1);
    out->max_context = db_int(r, 0, 2);
    snprintf(out->session_id, sizeof out->session_id, "%s", PQgetvalue(r, 0, 3));
    snprintf(out->base_model, sizeof out->base_model, "%s", PQgetvalue(r, 0, 4));
    snprintf(out->optimizer, sizeof out->optimizer, "%s", PQgetvalue(r, 0, 8));
    PQclear(r);
    return 0;
}

/* One of the tenant's limits (SQL returning the limit and the count, no row without a
 * limit): 0 under it, else `status` with err from fmt(limit); -1 database error. */
static int limit_check(PGconn *db, int64_t tenant_id, const char *sql, int status, const char *fmt, char *err,
                       size_t errlen) {
    char tid[24];
    api_fmt_i64(tid, tenant_id);
    const char *p[1] = {tid};
    PGresult *r = db_query(db, sql, 1, p, err, errlen);
    if (!r) return -1;
    int over = PQntuples(r) > 0 && db_int(r, 0, 1) >= db_int(r, 0, 0);
    if (over) snprintf(err, errlen, fmt, (long long)db_int(r, 0, 0), (long long)db_int(r, 0, 1));
    PQclear(r);
    return over ? status : 0;
}

int op_check_live_models(PGconn *db, int64_t tenant_id, char *err, size_t errlen) {
    return limit_check(db, tenant_id, SQL_TENANT_LIVE_MODELS, 429,
                       "this tenant has %lld active models, its limit (%lld counted; loom tenant set-limits "
                       "--max-live-models): unload one (unload_model) or wait for an idle session to expire", err,
                       errlen);
}

int op_check_storage(PGconn *db, int64_t tenant_id, char *err, size_t errlen) {
    return limit_check(db, tenant_id, SQL_TENANT_STORAGE, 400,
                       "this tenant's checkpoints are at its storage limit of %lld bytes (%lld bytes live; loom "
                       "tenant set-limits --max-checkpoint-bytes): delete checkpoints or give them a TTL first", err,
                       errlen);
}

/* Inside the transaction: the request_id already stored for (model, seq). 1 found, 0 none. */
static int existing_op(PGconn *db, const char *model_id, const char *seq, const char *kind,
                       char request_id[API_REQUEST_ID_MAX], int *kind_conflict, char *err,
                       size_t errlen) {
    const char *p[2] = {model_id, seq};
    PGresult *r = db_query(db, SQL_OP_EXISTING, 2, p, err, errlen);
    if (!r) return -1;
    int found = PQntuples(r) > 0;
    if (found) {
        snprintf(request_id, API_REQUEST_ID_MAX, "%s", PQgetvalue(r, 0, 0));
        *kind_conflict = strcmp(PQgetvalue(r, 0, 1), kind) != 0 || db_bool(r, 0, 2);
        if (db_bool(r, 0, 2))
            snprintf(err, errlen, "seq_id %s of model %.200s was already used by a %s request "
                                  "that was refused (%.300s); each operation of a model needs its "
                                  "own seq_id", seq, model_id, PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 3));
        else if (*kind_conflict)
            snprintf(err, errlen, "seq_id %s of model %.200s was already used by a %s request; "
                                  "each operation of a model needs its own seq_id", seq, model_id,
                     PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    return found;
}

/* The common submit: an explicit seq_id and nothing else to write: one statement, which
 * also touches the model's session. 1 when (model, seq_id) was taken (the caller looks at
 * what took it), 0 inserted, 400 the session expired since the model check, -1 error. */
static int submit_one(PGconn *db, const op_submit_req *q, const char *fresh, const char *tid, const char *ntok,
                      char request_id[API_REQUEST_ID_MAX], char *err, size_t errlen) {
    char seq[24];
    api_fmt_i64(seq, q->seq_id);
    const char *p[8] = {fresh, tid, q->model_id, seq, q->kind, q->payload, ntok, (const char *)q->payload_bin};
    const int len[8] = {[7] = (int)q->payload_bin_len}, fmt[8] = {[7] = 1};
    PGresult *r = db_query_bin_notify(db, SQL_OP_SUBMIT, 8, p, len, fmt, 0, err, errlen);
    if (!r) return -1;
    bool live = PQntuples(r) > 0 && db_bool(r, 0, 0), inserted = live && !PQgetisnull(r, 0, 1);
    PQclear(r);
    if (!live) {
        expired_msg(err, errlen, q->model_id, NULL);
        return 400;
    }
    if (!inserted) return 1;
    snprintf(request_id, API_REQUEST_ID_MAX, "%s", fresh);
    fut_cache_submitted(request_id, q->tenant_id);
    return 0;
}

/* Inside the submit's transaction, first: touches the model's session. 0, 400 (expired
 * since the model check), -1 error. */
static int touch_session(PGconn *db, const char *model_id, const char *tid, char *err, size_t errlen) {
    const char *p[2] = {model_id, tid};
    PGresult *r = db_query(db, SQL_OP_TOUCH_SESSION, 2, p, err, errlen);
    if (!r) return -1;
    bool live = PQntuples(r) > 0 && db_bool(r, 0, 0);
    PQclear(r);
    if (live) return 0;
    expired_msg(err, errlen, model_id, NULL);
    return 400;
}

int op_submit(PGconn *db, const op_submit_req *q, char request_id[API_REQUEST_ID_MAX], char *err,
              size_t errlen) {
    char tid[24], seq[24], ntok[24], fresh[API_REQUEST_ID_MAX];
    api_fmt_i64(tid, q->tenant_id);
    api_fmt_i64(ntok, q->n_tokens);
    op_new_request_id(fresh);
    if (q->has_seq_id && !q->in_tx) {
        int rc = submit_one(db, q, fresh, tid, ntok, request_id, err, errlen);
        if (rc != 1) return rc;
        /* taken: the same op resubmitted (its first future), or a conflict (below) */
    }
    if (db_begin(db, err, errlen) < 0) return -1;
    int touched = touch_session(db, q->model_id, tid, err, errlen);
    if (touched < 0) goto fail;
    if (touched > 0) {
        db_rollback(db);
        return touched;
    }
    const char *mp[1] = {q->model_id};
    if (!q->has_seq_id && db_exec(db, SQL_MODEL_LOCK, 1, mp, err, errlen) < 0) goto fail;
    /* With an allocated seq_id, a conflict can only come from a client that mixes explicit
     * and absent seq_ids; take the next one then. */
    for (int attempt = 0; attempt < 100; attempt++) {
        if (q->has_seq_id) {
            api_fmt_i64(seq, q->seq_id);
        } else {
            PGresult *r = db_query(db, SQL_MODEL_NEXT_SEQ, 1, mp, err, errlen);
            if (!r) goto fail;
            int64_t next = db_int(r, 0, 0) + attempt;
            PQclear(r);
            if (next > INT32_MAX) {
                db_rollback(db);
                snprintf(err, errlen, "model %.200s has no seq_id left to allocate (seq_id %d is "
                                      "taken); send seq_id explicitly or use a new model",
                         q->model_id, INT32_MAX);
                return 400;
            }
            api_fmt_i64(seq, next);
        }
        const char *p[8] = {fresh, tid, q->model_id, seq, q->kind, q->payload, ntok, (const char *)q->payload_bin};
        const int len[8] = {[7] = (int)q->payload_bin_len}, fmt[8] = {[7] = 1};
        PGresult *r = db_query_bin(db, SQL_OP_INSERT, 8, p, len, fmt, 0, err, errlen);
        if (!r) goto fail;
        int inserted = PQntuples(r) > 0;
        PQclear(r);
        if (inserted) {
            if (q->in_tx) {
                int st = q->in_tx(db, q->in_tx_arg, seq, err, errlen);
                if (st < 0) goto fail;
                if (st > 0) {
                    db_rollback(db);
                    return st;
                }
            }
            /* models.last_request_at is left alone: the scheduler orders models by it as
             * "last served" and sets it itself. */
            if (db_commit_notify(db, CHAN_OP_QUEUED, NULL, err, errlen) < 0) return -1;
            snprintf(request_id, API_REQUEST_ID_MAX, "%s", fresh);
            fut_cache_submitted(request_id, q->tenant_id);
            return 0;
        }
        int conflict = 0;
        int found = existing_op(db, q->model_id, seq, q->kind, request_id, &conflict, err, errlen);
        if (found < 0) goto fail;
        if (found && q->has_seq_id) {
            if (db_commit(db, err, errlen) < 0) goto fail;
            return conflict ? 400 : 0;
        }
        /* allocated seq_id taken meanwhile (or the row vanished): try the next one */
    }
    snprintf(err, errlen, "could not allocate a seq_id for model %.200s", q->model_id);
fail:
    db_rollback(db);
    return -1;
}

int op_reject(api_call *c, int status, const char *model_id, bool has_seq_id, int64_t seq_id,
              const char *kind) {
    char msg[sizeof c->err];
    snprintf(msg, sizeof msg, "%s", c->err);
    api_error(c, status, "%s", msg);
    /* A 429 is a limit for now: the SDK backs off and sends the same seq_id again, so it
     * is not recorded. */
    if (status == 429) {
        c->job->retry_after = 1;
        return 0;
    }
    if (!model_id || !has_seq_id || seq_id < 1 || seq_id > INT32_MAX || status < 400 || status >= 500)
        return 0;
    char rid[API_REQUEST_ID_MAX], tid[24], seq[24], st[24], error[sizeof msg + 64], err[512];
    op_new_request_id(rid);
    api_fmt_i64(tid, c->tenant_id);
    api_fmt_i64(seq, seq_id);
    api_fmt_i64(st, status);
    snprintf(error, sizeof error, "rejected when submitted (HTTP %d): %s", status, msg);
    const char *p[7] = {rid, tid, model_id, seq, kind, error, st};
    if (db_exec(c->db, SQL_OP_RECORD_REJECTED, 7, p, err, sizeof err) < 0)
        log_warn("%s %s seq %s: recording the rejected submit failed: %s", kind, model_id, seq, err);
    return 0;
}

int op_req_target(api_call *c, const char **model_id, int64_t *seq_id, bool *has_seq_id) {
    if (jx_req_str(c->body, "", "model_id", model_id, c->err, sizeof c->err) < 0 ||
        jx_int(c->body, "", "seq_id", 0, seq_id, has_seq_id, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err), -1;
    if (*has_seq_id && (*seq_id < 1 || *seq_id > INT32_MAX))
        return api_error(c, 400, "seq_id %lld is out of range: operations of a model are numbered from 1 (0 is "
                                 "its create_model)", (long long)*seq_id), -1;
    return 0;
}
