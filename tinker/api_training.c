/* api_training.c: training routes (docs/protocol.md §7.1–7.5). Submits validate fully, then write one
 * operations row (see api_ops.c) and answer {"request_id", "model_id"}; get_info answers
 * directly from the models row. */
#include "common/db.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "core/api_call.h"
#include "core/api_json.h"
#include "tinker/api_ops.h"
#include "service/api_proto.h"
#include "tinker/api_sql.h"
#include "tinker/api_weights.h"
#include "service/fwdbwd.h"
#include "tinker/tinker.h"
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MODEL_ID_MAX 400
#define MODEL_MAX_METADATA 65536   /* bytes of user_metadata as compact JSON */

static int reply_future(api_call *c, const char *request_id, const char *model_id) {
    return api_reply_json(c, 200, json_pack("{s:s, s:s}", "request_id", request_id, "model_id",
                                            model_id));
}

/* ---- create_model (§7.1) ------------------------------------------------------------ */

typedef struct {
    const char *session_id;
    bool has_model_seq_id;
    int64_t model_seq_id;
    const char *base_model;
    int64_t rank, seed;
    bool train_attn, train_mlp, train_unembed;
    char *user_metadata;     /* JSON object text of string values, or NULL; malloc'd */
    const char *optimizer;   /* the family: "adamw" */
} create_model_req;

/* The optimizer families this server runs. Dimuon (SDK ≈0.30, {"type": "dimuon",
 * "version": 1}) is not among them: its update rule is not published, and running
 * another family in its place would train a different model than the one asked for. */
static bool optimizer_implemented(const char *family) { return !strcmp(family, "adamw"); }

/* create_model's optimizer family (OptimizerConfig, {"type": ...}), under the SDK's
 * field name "optimizer_config" or "optimizer" (either; not two different ones).
 * Absent or null: adamw. Anything this server does not run is refused by name. */
static int decode_optimizer_config(const json_t *b, const char **family, char *err, size_t errlen) {
    json_t *oc, *o;
    if (jx_obj(b, "", "optimizer_config", &oc, err, errlen) < 0 || jx_obj(b, "", "optimizer", &o, err, errlen) < 0)
        return -1;
    const char *where = oc ? "optimizer_config" : "optimizer";
    *family = "adamw";
    if (oc && o && !json_equal(oc, o)) {
        snprintf(err, errlen, "optimizer_config and optimizer are one field under two names and differ here; "
                 "send one of them");
        return -1;
    }
    if (!oc) oc = o;
    if (!oc) return 0;
    const char *type;
    if (jx_req_str(oc, where, "type", &type, err, errlen) < 0) return -1;
    if (!optimizer_implemented(type)) {
        snprintf(err, errlen, "%s.type \"%.60s\" is not offered by this server: its optimizers are \"adamw\" "
                 "(the default); create the model without %s or with {\"type\": \"adamw\"}", where, type, where);
        return -1;
    }
    *family = type;
    return 0;
}

static int decode_create_model(const json_t *b, create_model_req *q, char *err, size_t errlen) {
    json_t *lc;
    bool has_seed;
    if (jx_req_str(b, "", "session_id", &q->session_id, err, errlen) < 0 ||
        jx_int(b, "", "model_seq_id", 0, &q->model_seq_id, &q->has_model_seq_id, err, errlen) < 0 ||
        jx_req_str(b, "", "base_model", &q->base_model, err, errlen) < 0 ||
        jx_obj(b, "", "lora_config", &lc, err, errlen) < 0 ||
        decode_optimizer_config(b, &q->optimizer, err, errlen) < 0)
        return -1;
    json_t *empty = lc ? NULL : json_object();
    const json_t *l = lc ? lc : empty;
    int rc = -1;
    if (jx_int(l, "lora_config", "rank", 32, &q->rank, NULL, err, errlen) < 0 ||
        jx_int(l, "lora_config", "seed", 0, &q->seed, &has_seed, err, errlen) < 0 ||
        jx_bool(l, "lora_config", "train_attn", true, &q->train_attn, err, errlen) < 0 ||
        jx_bool(l, "lora_config", "train_mlp", true, &q->train_mlp, err, errlen) < 0 ||
        jx_bool(l, "lora_config", "train_unembed", true, &q->train_unembed, err, errlen) < 0)
        goto out;
    if (q->has_model_seq_id && (q->model_seq_id < 0 || q->model_seq_id > INT32_MAX)) {
        snprintf(err, errlen, "model_seq_id must be between 0 and %d", INT32_MAX);
        goto out;
    }
    if (q->rank < 1 || q->rank > LIMIT_LORA_RANK) {
        snprintf(err, errlen, "lora_config.rank must be between 1 and %d, got %lld", LIMIT_LORA_RANK,
                 (long long)q->rank);
        goto out;
    }
    if (!q->train_attn && !q->train_mlp && !q->train_unembed) {
        snprintf(err, errlen, "lora_config: at least one of train_attn, train_mlp, train_unembed "
                              "must be true");
        goto out;
    }
    /* SDKs read it back as dict[str, str] (TrainingRun.user_metadata) */
    if (jx_string_map(b, "user_metadata", MODEL_MAX_METADATA, &q->user_metadata, err, errlen) < 0) goto out;
    if (!has_seed) {
        uint64_t s;
        randombytes_buf(&s, sizeof s);
        q->seed = (int64_t)(s & ((UINT64_C(1) << 62) - 1));
    }
    rc = 0;
out:
    json_decref(empty);
    return rc;
}

static int base_model_unknown(api_call *c, const char *name) {
    PGresult *r = db_query(c->db, SQL_BASE_MODEL_NAMES, 0, NULL, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "create_model", c->err);
    const char *names = PQgetvalue(r, 0, 0);
    api_error(c, 400, "unknown base_model \"%.200s\"; this server has: %s", name,
              *names ? names : "(no base models registered)");
    PQclear(r);
    return 0;
}

static int create_model(api_call *c, create_model_req q) {
    const char *bp[1] = {q.base_model};
    PGresult *r = db_query(c->db, SQL_BASE_MODEL_GET, 1, bp, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "create_model", c->err);
    int known = PQntuples(r) > 0;
    PQclear(r);
    if (!known) return base_model_unknown(c, q.base_model);
    int lim = op_check_live_models(c->db, c->tenant_id, c->err, sizeof c->err);
    if (lim < 0) return api_db_error(c, "create_model", c->err);
    if (lim > 0) {
        c->job->retry_after = 10;
        return api_error(c, lim, "%s", c->err);
    }

    char tid[24], mseq[24], rank[24], seed[24], model_id[MODEL_ID_MAX], request_id[API_REQUEST_ID_MAX];
    api_fmt_i64(tid, c->tenant_id);
    api_fmt_i64(rank, q.rank);
    api_fmt_i64(seed, q.seed);
    if (db_begin(c->db, c->err, sizeof c->err) < 0) return api_db_error(c, "create_model", c->err);
    /* The session row lock also serialises model_seq_id allocation within the session. */
    int locked = api_session_lock(c, q.session_id);
    if (locked < 0) goto dberr;
    if (locked > 0) return 0;
    if (!q.has_model_seq_id) {
        const char *p1[1] = {q.session_id};
        r = db_query(c->db, SQL_SESSION_NEXT_MODEL_SEQ, 1, p1, c->err, sizeof c->err);
        if (!r) goto dberr;
        q.model_seq_id = db_int(r, 0, 0);
        PQclear(r);
    }
    api_fmt_i64(mseq, q.model_seq_id);
    if (snprintf(model_id, sizeof model_id, "%s:train:%s", q.session_id, mseq) >= (int)sizeof model_id) {
        db_rollback(c->db);
        return api_error(c, 400, "session_id is too long");
    }
    const char *mp[12] = {model_id, tid, q.session_id, mseq, q.base_model, rank, seed,
                          q.train_attn ? "t" : "f", q.train_mlp ? "t" : "f",
                          q.train_unembed ? "t" : "f", q.user_metadata, q.optimizer};
    r = db_query(c->db, SQL_MODEL_INSERT, 12, mp, c->err, sizeof c->err);
    if (!r) goto dberr;
    int inserted = PQntuples(r) > 0;
    PQclear(r);
    if (inserted) {
        strbuf pl;
        sb_init(&pl, 256);
        sb_puts(&pl, "{\"base_model\": ");
        sb_json_str(&pl, q.base_model);
        sb_printf(&pl, ", \"lora_config\": {\"rank\": %lld, \"seed\": %lld, \"train_attn\": %s, "
                       "\"train_mlp\": %s, \"train_unembed\": %s}, \"optimizer\": \"%s\"}",
                  (long long)q.rank, (long long)q.seed, q.train_attn ? "true" : "false",
                  q.train_mlp ? "true" : "false", q.train_unembed ? "true" : "false", q.optimizer);
        op_new_request_id(request_id);
        const char *op[8] = {request_id, tid, model_id, "0", OP_CREATE_MODEL, pl.data, "0", NULL};
        r = db_query(c->db, SQL_OP_INSERT, 8, op, c->err, sizeof c->err);
        sb_free(&pl);
        if (!r) goto dberr;
        PQclear(r);
    } else {
        /* A retry of (session_id, model_seq_id): answer with the first future. */
        const char *ep[2] = {model_id, "0"};
        r = db_query(c->db, SQL_OP_EXISTING, 2, ep, c->err, sizeof c->err);
        if (!r) goto dberr;
        if (PQntuples(r) == 0) {
            PQclear(r);
            db_rollback(c->db);
            return api_error(c, 400, "model %.200s exists but has no create_model operation",
                             model_id);
        }
        snprintf(request_id, sizeof request_id, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
    }
    /* A new create_model wakes the scheduler (placement) after the commit. */
    if ((inserted ? db_commit_notify(c->db, CHAN_OP_QUEUED, NULL, c->err, sizeof c->err)
                  : db_commit(c->db, c->err, sizeof c->err)) < 0)
        goto dberr;
    return reply_future(c, request_id, model_id);
dberr:
    db_rollback(c->db);
    return api_db_error(c, "create_model", c->err);
}

int api_h_create_model(api_call *c) {
    create_model_req q;
    memset(&q, 0, sizeof q);
    if (decode_create_model(c->body, &q, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    create_model(c, q);
    free(q.user_metadata);
    return 0;
}

/* ---- get_info (§7.2) ------------------------------------------------------------------ */

int api_h_get_info(api_call *c) {
    const char *model_id;
    if (jx_req_str(c->body, "", "model_id", &model_id, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    PGresult *r = api_tenant_row(c, "get_info", SQL_MODEL_INFO, model_id, "model");
    if (!r) return 0;
    const char *tok = PQgetvalue(r, 0, 4);
    json_t *resp = json_pack("{s:s, s:s, s:b, s:I, s:s, s:{s:s, s:s, s:s}}", "type", "get_info",
                             "model_id", PQgetvalue(r, 0, 0), "is_lora", 1, "lora_rank",
                             (json_int_t)db_int(r, 0, 1), "model_name", PQgetvalue(r, 0, 2),
                             "model_data", "arch", PQgetvalue(r, 0, 3), "model_name",
                             PQgetvalue(r, 0, 2), "tokenizer_id", tok);
    lora_config lc = {.rank = (int)db_int(r, 0, 1), .train_attn = db_bool(r, 0, 5), .train_mlp = db_bool(r, 0, 6),
                      .train_unembed = db_bool(r, 0, 7)};
    api_adapter_size_json(resp, PQgetvalue(r, 0, 8), &lc);
    PQclear(r);
    return api_reply_json(c, 200, resp);
}

/* ---- forward / forward_backward (§7.3, §7.4) ---------------------------------------- */

/* JSON bodies of /forward and /forward_backward, and protobuf ForwardBackwardRequest
 * bodies (§14; forward_only = true makes it a forward) end in the same fb_request. */
static int submit_fwd(api_call *c, bool forward_only) {
    fb_request q;
    double t0 = clock_mono_s();
    int rc;
    if (c->proto_body) {
        rc = proto_decode_fwdbwd((const uint8_t *)c->job->body, c->job->body_len, &q, c->err,
                                 sizeof c->err);
        free(c->job->body);
        c->job->body = NULL;
    } else {
        rc = fb_decode_json(c->body, forward_only, &q, c->err, sizeof c->err);
        /* q owns copies of everything; drop the JSON tree now, it is the largest thing held */
        json_decref(c->body);
        c->body = NULL;
    }
    const char *route = q.forward_only ? OP_FORWARD : OP_FORWARD_BACKWARD;
    if (rc < 0) {
        op_reject(c, 400, q.model_id, q.has_seq_id, q.seq_id, route);
        fb_request_free(&q);
        return 0;
    }
    op_model_info m;
    bool cached;
    int st = op_model_check_recent(c->db, c->tenant_id, q.model_id, &m, &cached, c->err, sizeof c->err);
    if (st == 0 && fb_validate(&q, m.vocab_size, m.max_context, c->err, sizeof c->err) < 0) st = 400;
    if (st != 0) {
        if (st < 0) api_db_error(c, route, c->err);
        else op_reject(c, st, q.model_id, q.has_seq_id, q.seq_id, route);
        fb_request_free(&q);
        return 0;
    }
    double t1 = clock_mono_s();
    fb_payload pl;
    fb_payload_encode(&q, &pl);
    double t2 = clock_mono_s();
    op_submit_req s = {.tenant_id = c->tenant_id, .model_id = q.model_id, .kind = route,
                       .has_seq_id = q.has_seq_id, .seq_id = q.seq_id, .payload = pl.header,
                       .payload_bin = pl.bin, .payload_bin_len = pl.bin_len, .n_tokens = fb_total_tokens(&q)};
    char request_id[API_REQUEST_ID_MAX];
    st = op_submit(c->db, &s, request_id, c->err, sizeof c->err);
    if (st == 400 && cached) st = op_model_recheck(c->db, c->tenant_id, q.model_id, st, c->err, sizeof c->err);
    log_debug("%s: %zu datums, %lld tokens, %zu bytes in, payload %zu bytes: decode+validate "
              "%.3f s, payload %.3f s, insert %.3f s", route, q.n_data, (long long)s.n_tokens,
              c->job->body_len, pl.bin_len, t1 - t0, t2 - t1, clock_mono_s() - t2);
    fb_payload_free(&pl);
    if (st == 0) reply_future(c, request_id, q.model_id);
    else if (st < 0) api_db_error(c, route, c->err);
    else op_reject(c, st, q.model_id, q.has_seq_id, q.seq_id, route);
    fb_request_free(&q);
    return 0;
}

int api_h_forward_backward(api_call *c) { return submit_fwd(c, false); }
int api_h_forward(api_call *c) { return submit_fwd(c, true); }

/* ---- optim_step (§7.5) ---------------------------------------------------------------- */

/* The fields and their defaults; their ranges are optim_param_check's (contract/contract.h). */
static const struct {
    const char *key;
    double def;
} adam_fields[] = {
    {"learning_rate", 1e-4}, {"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-12}, {"weight_decay", 0.0},
    {"grad_clip_norm", 0.0},
};
#define N_ADAM (sizeof adam_fields / sizeof adam_fields[0])

/* Where an optim_step carries its parameters: adam_params (every SDK; Adam), or under
 * the aliases optim_params / optimizer_params (SDK ≈0.30 sends a non-Adam family's as
 * optimizer_params {"type": ...}). One of them at most. *params: the object (NULL when
 * none was sent: Adam's defaults), *where: its field name, *family: "adamw" unless the
 * object names another "type". 0, or -1 with err. */
static int decode_optim_params(const json_t *b, json_t **params, const char **where, const char **family,
                               char *err, size_t errlen) {
    static const char *const keys[] = {"adam_params", "optim_params", "optimizer_params"};
    *params = NULL;
    *where = "adam_params";
    *family = "adamw";
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v;
        if (jx_obj(b, "", keys[i], &v, err, errlen) < 0) return -1;
        if (!v) continue;
        if (*params) {
            snprintf(err, errlen, "%s and %s both carry optimizer parameters (adam_params, optim_params and "
                     "optimizer_params are one field under three names); send one", *where, keys[i]);
            return -1;
        }
        *params = v;
        *where = keys[i];
    }
    json_t *type = json_object_get(*params, "type");
    if (type && !json_is_null(type)) {
        if (!json_is_string(type)) {
            snprintf(err, errlen, "%s.type: expected a string (the optimizer family), got %s", *where,
                     jx_type_name(type));
            return -1;
        }
        *family = json_string_value(type);
    }
    return 0;
}

int api_h_optim_step(api_call *c) {
    const char *model_id;
    int64_t seq_id;
    bool has_seq;
    json_t *ap;
    const char *where, *family;
    if (op_req_target(c, &model_id, &seq_id, &has_seq) < 0) return 0;
    if (decode_optim_params(c->body, &ap, &where, &family, c->err, sizeof c->err) < 0)
        return op_reject(c, 400, model_id, has_seq, seq_id, OP_OPTIM_STEP);
    /* Another family's parameters are never read as Adam's: the model's family decides
     * below, and this server runs Adam only. */
    bool adam = !strcmp(family, "adamw");
    double v[N_ADAM];
    json_t *empty = ap ? NULL : json_object();
    for (size_t i = 0; adam && i < N_ADAM; i++) {
        char why[256];
        if (jx_num(ap ? ap : empty, where, adam_fields[i].key, adam_fields[i].def, &v[i], c->err,
                   sizeof c->err) < 0) {
            json_decref(empty);
            return op_reject(c, 400, model_id, has_seq, seq_id, OP_OPTIM_STEP);
        }
        if (optim_param_check(adam_fields[i].key, v[i], why, sizeof why) < 0) {
            json_decref(empty);
            snprintf(c->err, sizeof c->err, "%s.%s", where, why);
            return op_reject(c, 400, model_id, has_seq, seq_id, OP_OPTIM_STEP);
        }
    }
    json_decref(empty);
    op_model_info m;
    bool cached;
    int st = op_model_check_recent(c->db, c->tenant_id, model_id, &m, &cached, c->err, sizeof c->err);
    if (st < 0) return api_db_error(c, "optim_step", c->err);
    if (st > 0) return op_reject(c, st, model_id, has_seq, seq_id, OP_OPTIM_STEP);
    if (strcmp(family, m.optimizer) != 0) {
        snprintf(c->err, sizeof c->err, "%s is for the %.60s optimizer, but model %.200s uses %s (fixed at "
                 "create_model); send its parameters as adam_params", where, family, model_id, m.optimizer);
        return op_reject(c, 400, model_id, has_seq, seq_id, OP_OPTIM_STEP);
    }
    if (!adam) {   /* a family this server records but does not run: not reachable today */
        snprintf(c->err, sizeof c->err, "the %.60s optimizer is not offered by this server", family);
        return op_reject(c, 400, model_id, has_seq, seq_id, OP_OPTIM_STEP);
    }

    strbuf pl;
    sb_init(&pl, 256);
    sb_puts(&pl, "{\"optimizer\": \"adamw\", \"adam_params\": {");
    for (size_t i = 0; i < N_ADAM; i++) {
        sb_printf(&pl, "%s\"%s\": ", i ? ", " : "", adam_fields[i].key);
        sb_double(&pl, v[i]);
    }
    sb_puts(&pl, "}}");
    op_submit_req s = {.tenant_id = c->tenant_id, .model_id = model_id, .kind = OP_OPTIM_STEP,
                       .has_seq_id = has_seq, .seq_id = seq_id, .payload = pl.data, .n_tokens = 0};
    char request_id[API_REQUEST_ID_MAX];
    st = op_submit(c->db, &s, request_id, c->err, sizeof c->err);
    sb_free(&pl);
    if (st == 400 && cached) st = op_model_recheck(c->db, c->tenant_id, model_id, st, c->err, sizeof c->err);
    if (st < 0) return api_db_error(c, "optim_step", c->err);
    if (st > 0) return op_reject(c, st, model_id, has_seq, seq_id, OP_OPTIM_STEP);
    return reply_future(c, request_id, model_id);
}
