/* api_weights.c: checkpoint routes (see api_weights.h). Submits validate and write one
 * operations row (api_ops.c); the executor does the work (executor/exe_ckpt.c) and the
 * registry (registry/) holds the rules: paths, access between tenants, tokens, tar. */
#include "tinker/api_weights.h"
#include "common/db.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "model/adapter_io.h"
#include "registry/blobstore.h"
#include "registry/registry.h"
#include "registry/reg_sql.h"
#include "tinker/api_sql.h"
#include "core/api_json.h"
#include "tinker/api_ops.h"
#include "tinker/api_state.h"
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <limits.h>
#include <time.h>

#define DOWNLOAD_TTL_S (2 * 3600)   /* signed archive URLs stay valid this long (≥ 1 h, §17.7) */
#define TTL_MAX_S (100LL * 365 * 86400)
#define EXTERNAL_TTL_MAX_S (10LL * 365 * 86400)   /* save_weights_external: 1 hour .. 10 years */
#define CKPT_LIST_MAX_LIMIT 10000      /* ?limit of checkpoint listings (§12.2) */

static int reply_future(api_call *c, const char *request_id, const char *model_id) {
    return api_reply_json(c, 200, json_pack("{s:s, s:s}", "request_id", request_id, "model_id", model_id));
}

static int audit(api_call *c, int64_t tenant, const char *action, const char *object, json_t *details) {
    char *d = details ? json_dumps(details, JSON_COMPACT) : NULL;
    json_decref(details);
    char err[512];
    int rc = reg_audit_key(c->db, tenant, c->key_id, action, object, d, err, sizeof err);
    free(d);
    if (rc < 0) log_error("audit %s %s: %s", action, object, err);
    return rc;
}

/* The Checkpoint objects of a listing's rows (reg_version columns, then the total count);
 * frees the result. */
static json_t *checkpoint_rows_json(PGresult *r, int64_t *total) {
    int n = PQntuples(r);
    *total = n ? db_int(r, 0, REG_VERSION_NCOLS) : 0;
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        reg_version v;
        reg_version_of_row(r, i, &v);
        json_array_append_new(arr, reg_checkpoint_json(&v));
    }
    PQclear(r);
    return arr;
}

/* ---- save_weights / named save_weights_for_sampler (§7.6) ----------------------------- */

/* ttl_seconds: absent/null = never; else an integer >= 1. */
static int decode_ttl(const json_t *b, int64_t *ttl, char *err, size_t errlen) {
    json_t *v = json_object_get(b, "ttl_seconds");
    *ttl = -1;
    if (!v || json_is_null(v)) return 0;
    if (!jx_as_int(v, ttl) || *ttl < 1 || *ttl > TTL_MAX_S) {
        snprintf(err, errlen, "ttl_seconds must be a positive integer number of seconds (or null = never "
                 "expires), got %s", json_is_number(v) ? "a value out of range" : jx_type_name(v));
        return -1;
    }
    return 0;
}

/* save_weights_external's own rules (SaveWeightsExternalRequest): a TTL of 1 hour to 10
 * years, and no age encryption (Loom does not offer it; refused by name). */
static int check_external(api_call *c, int64_t ttl) {
    if (ttl >= 0 && (ttl < 3600 || ttl > EXTERNAL_TTL_MAX_S)) {
        snprintf(c->err, sizeof c->err, "ttl_seconds of save_weights_external must be between 3600 (1 hour) and "
                 "%lld (10 years), or null (never expires); got %lld", (long long)EXTERNAL_TTL_MAX_S, (long long)ttl);
        return -1;
    }
    const json_t *age = json_object_get(c->body, "age_encryption_recipients");
    if (age && !json_is_null(age) && !(json_is_array(age) && json_array_size(age) == 0)) {
        snprintf(c->err, sizeof c->err, "age_encryption_recipients: this server does not encrypt exported files; "
                 "send null, and encrypt the downloaded files yourself");
        return -1;
    }
    return 0;
}

static int submit_save(api_call *c, const char *kind) {
    const char *model_id, *name;
    int64_t seq_id, ttl;
    bool has_seq, overwrite;
    if (op_req_target(c, &model_id, &seq_id, &has_seq) < 0) return 0;
    const char *op_kind = strcmp(kind, "training") ? OP_SAVE_FOR_SAMPLER : OP_SAVE_WEIGHTS;
    char *meta = NULL;   /* the checkpoint's user_metadata (SDK ≈0.33): strings, bounded */
    bool external = !strcmp(kind, "external");
    if (jx_req_str(c->body, "", "path", &name, c->err, sizeof c->err) < 0 ||
        jx_bool(c->body, "", "overwrite", false, &overwrite, c->err, sizeof c->err) < 0 ||
        decode_ttl(c->body, &ttl, c->err, sizeof c->err) < 0 || (external && check_external(c, ttl) < 0) ||
        jx_string_map(c->body, "user_metadata", REG_META_MAX, &meta, c->err, sizeof c->err) < 0)
        return op_reject(c, 400, model_id, has_seq, seq_id, op_kind);
    /* Some clients pass a whole tinker:// path of their own model: take its name. */
    reg_path rp;
    char why[sizeof c->err];
    if (!strncmp(name, "tinker://", 9)) {
        if (reg_path_parse(name, &rp, why, sizeof why) < 0) {
            snprintf(c->err, sizeof c->err, "path: %s", why);
            return free(meta), op_reject(c, 400, model_id, has_seq, seq_id, op_kind);
        }
        if (strcmp(rp.run, model_id) || strcmp(reg_kind_of_dir(rp.dir), kind)) {
            snprintf(c->err, sizeof c->err, "path %.300s does not name a %s checkpoint of model %.200s",
                     name, reg_dir_of_kind(kind), model_id);
            return free(meta), op_reject(c, 400, model_id, has_seq, seq_id, op_kind);
        }
        name = rp.name;
    } else if (!reg_name_valid(name, why, sizeof why)) {
        snprintf(c->err, sizeof c->err, "path: %s", why);
        return free(meta), op_reject(c, 400, model_id, has_seq, seq_id, op_kind);
    }
    op_model_info m;
    int st = op_model_check(c->db, c->tenant_id, model_id, &m, c->err, sizeof c->err);
    if (st == 0) st = op_check_storage(c->db, c->tenant_id, c->err, sizeof c->err);
    if (st != 0) free(meta);
    if (st < 0) return api_db_error(c, kind, c->err);
    if (st > 0) return op_reject(c, st, model_id, has_seq, seq_id, op_kind);

    strbuf pl;
    sb_init(&pl, 256);
    sb_puts(&pl, "{\"path\": ");
    sb_json_str(&pl, name);
    sb_puts(&pl, ", \"ttl_seconds\": ");
    if (ttl < 0) sb_puts(&pl, "null");
    else sb_int(&pl, ttl);
    sb_printf(&pl, ", \"overwrite\": %s, \"key_id\": %lld%s", overwrite ? "true" : "false", (long long)c->key_id,
              external ? ", \"external\": true" : "");
    /* the registry copies it from here into the version row (SQL_REG_VERSION_INSERT) */
    if (meta) {
        sb_puts(&pl, ", \"user_metadata\": ");
        sb_puts(&pl, meta);
    }
    sb_putc(&pl, '}');
    free(meta);
    op_submit_req s = {.tenant_id = c->tenant_id, .model_id = model_id, .kind = op_kind,
                       .has_seq_id = has_seq, .seq_id = seq_id, .payload = pl.data};
    char request_id[API_REQUEST_ID_MAX];
    st = op_submit(c->db, &s, request_id, c->err, sizeof c->err);
    sb_free(&pl);
    if (st < 0) return api_db_error(c, op_kind, c->err);
    if (st > 0) return op_reject(c, st, model_id, has_seq, seq_id, op_kind);
    return reply_future(c, request_id, model_id);
}

int api_h_save_weights(api_call *c) { return submit_save(c, "training"); }
int api_weights_save_for_sampler_named(api_call *c) { return submit_save(c, "sampler"); }
/* The weights of the model, under external_weights/ (§7.9): run by the executor as a
 * named save_weights_for_sampler whose payload says "external". */
int api_h_save_weights_external(api_call *c) { return submit_save(c, "external"); }

/* ---- load_weights (§7.7) ------------------------------------------------------------- */

int api_h_load_weights(api_call *c) {
    const char *model_id, *path;
    int64_t seq_id;
    bool has_seq, optimizer;
    if (json_object_get(c->body, "session_id") && !json_object_get(c->body, "model_id"))
        return api_error(c, 400, "load_weights without model_id (create_model_via_load_weights) is not "
                                 "offered by this server: call create_model, then load_weights");
    if (op_req_target(c, &model_id, &seq_id, &has_seq) < 0) return 0;
#define REJECT(st) op_reject(c, st, model_id, has_seq, seq_id, OP_LOAD_WEIGHTS)
    if (jx_req_str(c->body, "", "path", &path, c->err, sizeof c->err) < 0 ||
        jx_bool(c->body, "", "optimizer", false, &optimizer, c->err, sizeof c->err) < 0)
        return REJECT(400);
    reg_path rp;
    char why[sizeof c->err];
    if (reg_path_parse(path, &rp, why, sizeof why) < 0) {
        snprintf(c->err, sizeof c->err, "path: %s", why);
        return REJECT(400);
    }
    /* A sampler checkpoint (e.g. an imported PEFT adapter) holds weights only: it can start
     * training with fresh Adam state, but has no optimizer state to restore. */
    if (strcmp(rp.dir, "weights") && optimizer) {
        snprintf(c->err, sizeof c->err, "%.300s holds sampler weights only, without optimizer state: load "
                 "it with \"optimizer\": false, or use a training-state checkpoint "
                 "(tinker://<run>/weights/<name>) to restore Adam moments", path);
        return REJECT(400);
    }
    op_model_info m;
    int st = op_model_check(c->db, c->tenant_id, model_id, &m, c->err, sizeof c->err);
    if (st < 0) return api_db_error(c, "load_weights", c->err);
    if (st > 0) return REJECT(st);
    reg_version v;
    st = reg_find_readable(c->db, c->tenant_id, path, &v, c->err, sizeof c->err);
    if (st < 0) return api_db_error(c, "load_weights", c->err);
    if (st > 0) return REJECT(st);

    PGresult *r = api_tenant_row(c, "load_weights", SQL_MODEL_LORA, model_id, "model");
    if (!r) return 0;
    char base[256];
    snprintf(base, sizeof base, "%s", PQgetvalue(r, 0, 0));
    int rank = (int)db_int(r, 0, 1);
    bool ta = db_bool(r, 0, 2), tm = db_bool(r, 0, 3), tu = db_bool(r, 0, 4);
    PQclear(r);
    if (strcmp(base, v.base_model)) {
        snprintf(c->err, sizeof c->err, "checkpoint %.300s was trained on base model %s, model %.200s uses %s",
                 path, v.base_model, model_id, base);
        return REJECT(400);
    }
    if (rank != v.rank || ta != v.train_attn || tm != v.train_mlp || tu != v.train_unembed) {
        snprintf(c->err, sizeof c->err, "checkpoint %.300s has LoRA rank %d (train_attn %s, train_mlp %s, "
                 "train_unembed %s) but model %.200s has rank %d (%s, %s, %s); create the model with the "
                 "checkpoint's lora_config (see weights_info)", path, v.rank,
                 v.train_attn ? "true" : "false", v.train_mlp ? "true" : "false",
                 v.train_unembed ? "true" : "false", model_id, rank, ta ? "true" : "false",
                 tm ? "true" : "false", tu ? "true" : "false");
        return REJECT(400);
    }

    strbuf pl;
    sb_init(&pl, 256);
    sb_puts(&pl, "{\"path\": ");
    sb_json_str(&pl, v.tinker_path);
    sb_printf(&pl, ", \"optimizer\": %s, \"blob_digest\": \"%s\", \"version_id\": %lld}",
              optimizer ? "true" : "false", v.digest, (long long)v.id);
    op_submit_req s = {.tenant_id = c->tenant_id, .model_id = model_id, .kind = OP_LOAD_WEIGHTS,
                       .has_seq_id = has_seq, .seq_id = seq_id, .payload = pl.data};
    char request_id[API_REQUEST_ID_MAX];
    st = op_submit(c->db, &s, request_id, c->err, sizeof c->err);
    sb_free(&pl);
    if (st < 0) return api_db_error(c, "load_weights", c->err);
    if (st > 0) return REJECT(st);
#undef REJECT
    if (v.tenant_id != c->tenant_id)
        audit(c, v.tenant_id, "checkpoint.load_shared", v.tinker_path,
              json_pack("{s:I, s:s}", "by_tenant", (json_int_t)c->tenant_id, "into_model", model_id));
    return reply_future(c, request_id, model_id);
}

void api_adapter_size_json(json_t *obj, const char *config_text, const lora_config *lc) {
    model_config mc;
    char err[256];
    if (!config_text || model_config_parse(config_text, &mc, err, sizeof err) < 0) return;
    size_t n = lora_count_params(&mc, lc);
    json_object_set_new(obj, "lora_parameters", json_integer((json_int_t)n));
    json_object_set_new(obj, "adapter_bytes", json_integer((json_int_t)LORA_TRAINABLE_BYTES(n)));
}

/* ---- weights_info (§12.2) --------------------------------------------------------------- */

int api_h_weights_info(api_call *c) {
    const char *path;
    if (jx_req_str(c->body, "", "tinker_path", &path, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    reg_path rp;
    if (reg_path_parse(path, &rp, c->err, sizeof c->err) < 0) return api_error(c, 400, "tinker_path: %s", c->err);
    reg_version v;
    int st = reg_find_readable(c->db, c->tenant_id, path, &v, c->err, sizeof c->err);
    if (st < 0) return api_db_error(c, "weights_info", c->err);
    if (st > 0) return api_error(c, st, "%s", c->err);
    json_t *info = json_pack("{s:s, s:b, s:i, s:b, s:b, s:b}", "base_model", v.base_model, "is_lora", 1, "lora_rank",
                             v.rank, "train_unembed", v.train_unembed, "train_mlp", v.train_mlp, "train_attn",
                             v.train_attn);
    const char *bp[1] = {v.base_model};
    PGresult *r = db_query(c->db, SQL_BASE_MODEL_CONFIG, 1, bp, c->err, sizeof c->err);
    if (!r) {
        json_decref(info);
        return api_db_error(c, "weights_info", c->err);
    }
    lora_config lc = {.rank = v.rank, .train_attn = v.train_attn, .train_mlp = v.train_mlp,
                      .train_unembed = v.train_unembed};
    if (PQntuples(r)) api_adapter_size_json(info, PQgetvalue(r, 0, 0), &lc);
    PQclear(r);
    return api_reply_json(c, 200, info);
}

/* ---- listings (§12.2) ------------------------------------------------------------------- */

static json_t *cursor(int64_t offset, int64_t limit, int64_t total) {
    return json_pack("{s:I, s:I, s:I}", "offset", (json_int_t)offset, "limit", (json_int_t)limit, "total_count",
                     (json_int_t)total);
}

static int list_run(api_call *c, const char *run) {
    int64_t limit, offset;
    if (api_page_params(c, 1000, CKPT_LIST_MAX_LIMIT, &limit, &offset) < 0) return 0;
    char tid[24], lim[24], off[24];
    api_fmt_i64(tid, c->tenant_id);
    api_fmt_i64(lim, limit);
    api_fmt_i64(off, offset);
    const char *p[4] = {run, tid, lim, off};
    PGresult *r = db_query(c->db, SQL_RUN_CHECKPOINTS, 4, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "list checkpoints", c->err);
    int n = PQntuples(r);
    int64_t total;
    json_t *arr = checkpoint_rows_json(r, &total);
    if (n == 0) {
        const char *po[2] = {run, tid};
        r = db_query(c->db, SQL_RUN_OWNED, 2, po, c->err, sizeof c->err);
        if (!r) { json_decref(arr); return api_db_error(c, "list checkpoints", c->err); }
        int own = PQntuples(r);
        PQclear(r);
        if (!own && offset == 0) {
            json_decref(arr);
            return api_error(c, 404, "training run %.300s not found", run);
        }
    }
    return api_reply_json(c, 200, json_pack("{s:o, s:o}", "checkpoints", arr, "cursor", cursor(offset, limit, total)));
}

int api_h_list_checkpoints(api_call *c) {
    int64_t limit, offset;
    if (api_page_params(c, 100, CKPT_LIST_MAX_LIMIT, &limit, &offset) < 0) return 0;
    char tid[24], lim[24], off[24];
    api_fmt_i64(tid, c->tenant_id);
    api_fmt_i64(lim, limit);
    api_fmt_i64(off, offset);
    const char *p[3] = {tid, lim, off};
    PGresult *r = db_query(c->db, SQL_TENANT_CHECKPOINTS, 3, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "list checkpoints", c->err);
    int n = PQntuples(r);
    int64_t total;
    json_t *arr = checkpoint_rows_json(r, &total);
    if (n == 0 && offset > 0) {
        r = db_query(c->db, SQL_TENANT_CHECKPOINT_COUNT, 1, p, c->err, sizeof c->err);
        if (!r) { json_decref(arr); return api_db_error(c, "list checkpoints", c->err); }
        total = db_int(r, 0, 0);
        PQclear(r);
    }
    return api_reply_json(c, 200, json_pack("{s:o, s:o}", "checkpoints", arr, "cursor", cursor(offset, limit, total)));
}

/* ---- search_checkpoints (SDK 0.39) ------------------------------------------------------ */

#define SEARCH_MAX_LIMIT 200        /* CheckpointSearchRequest.limit: 1 to 200 */
#define SEARCH_DEF_LIMIT 100
#define SEARCH_MAX_LIST 100         /* entries of project_ids and base_models */
#define SEARCH_MAX_OWNERS 10        /* UserSearchOwner.owner_urns: 1 to 10 */
#define SEARCH_MAX_NAME 256         /* bytes of one project id, base model or owner */

/* An optional array of strings (each 1..SEARCH_MAX_NAME bytes, at most max of them) as
 * JSON text (malloc'd; NULL when absent or null). 0, or -1 with err naming the field. */
static int string_list(const json_t *obj, const char *where, const char *key, size_t min, size_t max, char **out,
                       char *err, size_t errlen) {
    json_t *a, *v;
    size_t i;
    *out = NULL;
    if (jx_arr(obj, where, key, &a, err, errlen) < 0) return -1;
    if (!a) return 0;
    if (json_array_size(a) < min || json_array_size(a) > max) {
        snprintf(err, errlen, "%s%s%s has %zu entries; %zu to %zu are accepted", where, *where ? "." : "", key,
                 json_array_size(a), min, max);
        return -1;
    }
    json_array_foreach(a, i, v) {
        if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) > SEARCH_MAX_NAME) {
            snprintf(err, errlen, "%s%s%s[%zu]: expected a string of 1 to %d bytes, got %s", where,
                     *where ? "." : "", key, i, SEARCH_MAX_NAME, json_is_string(v) ? "a longer or empty one"
                     : jx_type_name(v));
            return -1;
        }
    }
    *out = json_dumps(a, JSON_COMPACT);
    return 0;
}

typedef struct {
    int64_t limit;
    const char *owner;            /* "own" | "accessible" | "user" */
    char *owners, *projects, *meta, *base_models;   /* JSON text or NULL; malloc'd */
    const char *kind;             /* NULL: every kind */
    const char *after_time;       /* the cursor, or NULL */
    char after_id[24];
} search_req;

static void search_req_free(search_req *q) {
    free(q->owners);
    free(q->projects);
    free(q->meta);
    free(q->base_models);
}

/* CheckpointSearchRequest: project_ids, user_metadata, checkpoint_type, owner
 * ({"type": "own" | "accessible"} or {"type": "user", "owner_urns": [...]}), base_models,
 * limit, cursor ({last_created_at, last_checkpoint_uuid} of a previous next_cursor). */
static int decode_search(const json_t *b, search_req *q, char *err, size_t errlen) {
    json_t *owner, *cursor;
    bool has_limit;
    memset(q, 0, sizeof q[0]);
    q->owner = "own";
    if (jx_int(b, "", "limit", SEARCH_DEF_LIMIT, &q->limit, &has_limit, err, errlen) < 0 ||
        jx_str(b, "", "checkpoint_type", &q->kind, err, errlen) < 0 ||
        jx_obj(b, "", "owner", &owner, err, errlen) < 0 || jx_obj(b, "", "cursor", &cursor, err, errlen) < 0 ||
        string_list(b, "", "project_ids", 0, SEARCH_MAX_LIST, &q->projects, err, errlen) < 0 ||
        string_list(b, "", "base_models", 0, SEARCH_MAX_LIST, &q->base_models, err, errlen) < 0 ||
        jx_string_map(b, "user_metadata", REG_META_MAX, &q->meta, err, errlen) < 0)
        return -1;
    if (q->limit < 1 || q->limit > SEARCH_MAX_LIMIT) {
        snprintf(err, errlen, "limit must be 1 to %d, got %lld", SEARCH_MAX_LIMIT, (long long)q->limit);
        return -1;
    }
    if (q->kind && strcmp(q->kind, "training") && strcmp(q->kind, "sampler") && strcmp(q->kind, "external")) {
        snprintf(err, errlen, "checkpoint_type must be \"training\", \"sampler\", \"external\" or null, got \"%.40s\"",
                 q->kind);
        return -1;
    }
    if (q->meta && !strcmp(q->meta, "{}")) {   /* no pair to hold: no filter */
        free(q->meta);
        q->meta = NULL;
    }
    if (owner) {
        if (jx_req_str(owner, "owner", "type", &q->owner, err, errlen) < 0) return -1;
        if (!strcmp(q->owner, "user")) {
            if (string_list(owner, "owner", "owner_urns", 1, SEARCH_MAX_OWNERS, &q->owners, err, errlen) < 0) return -1;
            if (!q->owners) {
                snprintf(err, errlen, "owner.owner_urns is required with owner.type \"user\" (1 to %d tenant names)",
                         SEARCH_MAX_OWNERS);
                return -1;
            }
        } else if (strcmp(q->owner, "own") && strcmp(q->owner, "accessible")) {
            snprintf(err, errlen, "owner.type must be \"own\", \"accessible\" or \"user\", got \"%.40s\"", q->owner);
            return -1;
        }
    }
    if (cursor) {
        const char *id;
        char *end;
        if (jx_req_str(cursor, "cursor", "last_created_at", &q->after_time, err, errlen) < 0 ||
            jx_req_str(cursor, "cursor", "last_checkpoint_uuid", &id, err, errlen) < 0)
            return -1;
        long long v = strtoll(id, &end, 10);
        if (*end || v < 1 || strlen(q->after_time) > 40 || strspn(q->after_time, "0123456789-:.+TZ ") != strlen(q->after_time)) {
            snprintf(err, errlen, "cursor: pass a response's next_cursor back unchanged (this one names no checkpoint "
                     "of this server)");
            return -1;
        }
        snprintf(q->after_id, sizeof q->after_id, "%lld", v);
    }
    return 0;
}

int api_h_search_checkpoints(api_call *c) {
    search_req q;
    if (decode_search(c->body, &q, c->err, sizeof c->err) < 0) {
        search_req_free(&q);
        return api_error(c, 400, "%s", c->err);
    }
    char tid[24], lim[24];
    api_fmt_i64(tid, c->tenant_id);
    api_fmt_i64(lim, q.limit + 1);   /* one more: whether there is a next page */
    /* "Naming a project the caller cannot list is an error": a tenant lists the projects
     * its sessions name. */
    json_t *projects = q.projects ? json_loads(q.projects, 0, NULL) : NULL;
    size_t i;
    json_t *pv;
    json_array_foreach(projects, i, pv) {
        const char *pp[2] = {tid, json_string_value(pv)};
        PGresult *r = db_query(c->db, SQL_TENANT_HAS_PROJECT, 2, pp, c->err, sizeof c->err);
        if (!r) {
            json_decref(projects);
            search_req_free(&q);
            return api_db_error(c, "search_checkpoints", c->err);
        }
        int found = PQntuples(r) > 0;
        PQclear(r);
        if (!found) {
            api_error(c, 400, "project_ids[%zu]: no session of yours names project \"%.200s\"", i, json_string_value(pv));
            json_decref(projects);
            search_req_free(&q);
            return 0;
        }
    }
    json_decref(projects);
    const char *p[10] = {lim, tid, q.owner, q.owners, q.projects, q.meta, q.kind, q.base_models, q.after_time,
                         q.after_time ? q.after_id : NULL};
    PGresult *r = db_query(c->db, SQL_SEARCH_CHECKPOINTS, 10, p, c->err, sizeof c->err);
    search_req_free(&q);
    if (!r) {
        /* a cursor time PostgreSQL cannot read (day 31 of February, ...) */
        if (!strncmp(db_last_sqlstate(), "22", 2))
            return api_error(c, 400, "cursor.last_created_at is not a time: pass a response's next_cursor back unchanged");
        return api_db_error(c, "search_checkpoints", c->err);
    }
    int n = PQntuples(r);
    bool more = n > q.limit;
    if (more) n = (int)q.limit;
    json_t *arr = json_array(), *next = json_null();
    for (int k = 0; k < n; k++) {
        reg_version v;
        reg_version_of_row(r, k, &v);
        json_array_append_new(arr, reg_checkpoint_json(&v));
        if (more && k == n - 1) {   /* the SDK's cursor names a checkpoint by a string id */
            char id[24];
            api_fmt_i64(id, v.id);
            json_decref(next);
            next = json_pack("{s:s, s:s}", "last_created_at", v.time, "last_checkpoint_uuid", id);
        }
    }
    PQclear(r);
    return api_reply_json(c, 200, json_pack("{s:o, s:o}", "checkpoints", arr, "next_cursor", next));
}

/* ---- /training_runs/{run}/checkpoints/... ----------------------------------------------- */

typedef struct {
    char run[REG_RUN_MAX];
    bool has_ckpt;            /* {kind}/{name} present */
    reg_path path;
    char tinker_path[REG_PATH_MAX];
    char action[32];          /* "", "publish", "ttl", "archive", "external_weights_urls" */
} ckpt_route;

/* Splits "{run}/checkpoints[/{kind}/{name}[/{action}]]"; 0 or the 4xx is answered. */
static int parse_route(api_call *c, const char *arg, ckpt_route *o) {
    memset(o, 0, sizeof *o);
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", arg ? arg : "");
    char *seg[6];
    int n = 0;
    for (char *s = buf, *save = NULL, *t; n < 6 && (t = strtok_r(s, "/", &save)); s = NULL) seg[n++] = t;
    if (n < 2 || strcmp(seg[1], "checkpoints") || n == 3 || n > 5)
        return api_error(c, 404, "no such route: %.300s (expected training_runs/{run}/checkpoints"
                                 "[/{weights|sampler_weights|external_weights}/{name}[/publish|/ttl|/archive|"
                                 "/external_weights_urls]])", arg ? arg : ""), -1;
    snprintf(o->run, sizeof o->run, "%s", seg[0]);
    if (n >= 4) {
        char id[512];
        snprintf(id, sizeof id, "%s/%s", seg[2], seg[3]);
        if (reg_ckpt_id_parse(seg[0], id, &o->path, c->err, sizeof c->err) < 0)
            return api_error(c, 400, "%s", c->err), -1;
        o->has_ckpt = true;
        reg_path_format(&o->path, o->tinker_path, sizeof o->tinker_path);
    }
    if (n == 5) {
        if (strcmp(seg[4], "publish") && strcmp(seg[4], "ttl") && strcmp(seg[4], "archive") &&
            strcmp(seg[4], "external_weights_urls"))
            return api_error(c, 404, "no such checkpoint action: %.100s (publish, ttl, archive, "
                                     "external_weights_urls)", seg[4]), -1;
        snprintf(o->action, sizeof o->action, "%s", seg[4]);
    }
    return 0;
}

static void rfc1123(time_t t, char *out, size_t n) {
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, n, "%a, %d %b %Y %H:%M:%S GMT", &tm);
}

static void iso8601(time_t t, char *out, size_t n) {
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Whether an Accept value (every Accept header of the request, joined by commas) lists
 * the media type `type` itself, with a q above 0. Wildcards do not count: the question
 * is what the client named. */
static bool accept_names(const char *accept, const char *type) {
    size_t tlen = strlen(type);
    for (const char *p = accept; p && *p;) {
        p += strspn(p, " \t,");
        const char *end = p + strcspn(p, ",");
        const char *semi = memchr(p, ';', (size_t)(end - p));
        const char *tend = semi ? semi : end;
        while (tend > p && (tend[-1] == ' ' || tend[-1] == '\t')) tend--;
        bool named = (size_t)(tend - p) == tlen && !strncasecmp(p, type, tlen);
        /* a parameter q=0 refuses the type */
        for (const char *q = semi; named && q; q = memchr(q + 1, ';', (size_t)(end - q - 1))) {
            const char *v = q + 1 + strspn(q + 1, " \t");
            if ((v[0] == 'q' || v[0] == 'Q') && v[1] == '=') named = strtod(v + 2, NULL) > 0;
        }
        if (named) return true;
        p = end;
    }
    return false;
}

/* GET .../archive: a signed, self-authorising download URL (docs/protocol.md §12.3): as
 * a 200 JSON {url, expires} to a client that names JSON and not gzip in its Accept
 * headers (SDK 0.22.2 and later send only application/json), else as a 302 with the same
 * JSON as its body. SDK 0.15-0.22.1 send two Accept headers, their client's default
 * application/json and the call's application/gzip, and take only the 302 (a 200 makes
 * them raise "API Response types must subclass AsyncAPIResponse"). */
static int archive_url(api_call *c, const ckpt_route *rt) {
    char fmt[32] = "tinker", unembed[8] = "";
    if (api_query_param(c, "format", fmt, sizeof fmt) && strcmp(fmt, "tinker") && strcmp(fmt, "peft"))
        return api_error(c, 400, "format must be tinker (default) or peft, got \"%.30s\"", fmt);
    if (api_query_param(c, "unembed", unembed, sizeof unembed) && !strcmp(unembed, "0")) {
        if (strcmp(fmt, "peft")) return api_error(c, 400, "unembed=0 goes with format=peft");
        snprintf(fmt, sizeof fmt, "peft-nohead");
    }
    char *url, exp_iso[32], exp_http[64];
    if (api_archive_link(c, rt->tinker_path, fmt, &url, exp_iso, exp_http) < 0) return 0;
    json_t *answer = json_pack("{s:s, s:s}", "url", url, "expires", exp_iso);
    if (accept_names(c->job->accept, "application/json") && !accept_names(c->job->accept, "application/gzip")) {
        free(url);
        return api_reply_json(c, 200, answer);
    }
    api_reply_json(c, 302, answer);
    free(c->job->location);
    free(c->job->expires);
    c->job->location = url;
    c->job->expires = strdup(exp_http);
    return 0;
}

/* The signed link to v in fmt (an archive format, or one file of the PEFT layout), valid
 * until expires, bound to the caller's key (malloc'd). */
static char *signed_link(api_call *c, const reg_version *v, const char *fmt, time_t expires) {
    char id[REG_NAME_MAX + 32], token[REG_TOKEN_HEX];
    snprintf(id, sizeof id, "%s/%s", v->path.dir, v->path.name);
    reg_download_sign(api_link_secret(), v->path.run, id, fmt, (int64_t)expires, c->key_id, token);
    strbuf url;
    sb_init(&url, 256);
    sb_printf(&url, "%s/api/v1/checkpoint_archives/%lld/%s/%s/%lld/%s/%s",
              c->job->base_url ? c->job->base_url : "", (long long)expires, fmt, token,
              (long long)c->key_id, v->path.run, id);
    return sb_steal(&url, NULL);
}

int api_archive_link(api_call *c, const char *tinker_path, const char *fmt, char **url_out, char exp_iso[32],
                     char exp_http[64]) {
    reg_version v;
    int st = reg_find_readable(c->db, c->tenant_id, tinker_path, &v, c->err, sizeof c->err);
    if (st < 0) return api_db_error(c, "archive", c->err), -1;
    if (st > 0) return api_error(c, st, "%s", c->err), -1;
    if (!api_link_secret() || !api_blobs())
        return api_error(c, 503, "archive downloads need the registry blob store (loom api --blob-dir)"), -1;
    time_t expires = time(NULL) + DOWNLOAD_TTL_S;
    *url_out = signed_link(c, &v, fmt, expires);
    rfc1123(expires, exp_http, 64);
    iso8601(expires, exp_iso, 32);
    audit(c, v.tenant_id, "checkpoint.download_url", v.tinker_path,
          json_pack("{s:I, s:s, s:s}", "by_tenant", (json_int_t)c->tenant_id, "format", fmt, "expires", exp_iso));
    return 0;
}

/* The two files of the PEFT layout, each a download format of its own (§12.6). */
static const char *const EXTERNAL_FILES[2] = {"adapter_config.json", "adapter_model.safetensors"};

static bool external_file_fmt(const char *fmt) {
    return !strcmp(fmt, EXTERNAL_FILES[0]) || !strcmp(fmt, EXTERNAL_FILES[1]);
}

/* GET .../external_weights/{name}/external_weights_urls (§12.6): one signed link per file
 * of the PEFT layout, as the archive route signs them (bound to the caller's key, access
 * checked again at download). ExternalWeightsUrlsResponse {urls, expires}. */
static int external_urls(api_call *c, const ckpt_route *rt) {
    if (strcmp(rt->path.dir, "external_weights"))
        return api_error(c, 404, "external_weights_urls is for external_weights/<name> checkpoints (made by "
                                 "save_weights_external); for %s/ use .../archive", rt->path.dir);
    reg_version v;
    int st = reg_find_readable(c->db, c->tenant_id, rt->tinker_path, &v, c->err, sizeof c->err);
    if (st < 0) return api_db_error(c, "external_weights_urls", c->err);
    if (st > 0) return api_error(c, st, "%s", c->err);
    if (!api_link_secret() || !api_blobs())
        return api_error(c, 503, "downloads need the registry blob store (loom api --blob-dir)");
    time_t expires = time(NULL) + DOWNLOAD_TTL_S;
    char exp_iso[32];
    iso8601(expires, exp_iso, sizeof exp_iso);
    json_t *urls = json_object();
    for (int i = 0; i < 2; i++) {
        char *u = signed_link(c, &v, EXTERNAL_FILES[i], expires);
        json_object_set_new(urls, EXTERNAL_FILES[i], json_string(u));
        free(u);
    }
    audit(c, v.tenant_id, "checkpoint.download_url", v.tinker_path,
          json_pack("{s:I, s:s, s:s}", "by_tenant", (json_int_t)c->tenant_id, "format", "external", "expires",
                    exp_iso));
    return api_reply_json(c, 200, json_pack("{s:o, s:s}", "urls", urls, "expires", exp_iso));
}

int api_h_run_checkpoints_get(api_call *c) {
    ckpt_route rt;
    if (parse_route(c, c->job->path_arg, &rt) < 0) return 0;
    if (!rt.has_ckpt) return list_run(c, rt.run);
    if (!strcmp(rt.action, "archive")) return archive_url(c, &rt);
    if (!strcmp(rt.action, "external_weights_urls")) return external_urls(c, &rt);
    if (rt.action[0]) return api_error(c, 405, "use POST/DELETE for publish and PUT for ttl");
    reg_version v;
    int st = reg_find_readable(c->db, c->tenant_id, rt.tinker_path, &v, c->err, sizeof c->err);
    if (st < 0) return api_db_error(c, "checkpoint", c->err);
    if (st > 0) return api_error(c, st, "%s", c->err);
    return api_reply_json(c, 200, reg_checkpoint_json(&v));
}

int api_h_models_checkpoints(api_call *c) { return api_h_run_checkpoints_get(c); }

/* The owned checkpoint of a mutation route; 0 or the 4xx is answered. */
static int owned(api_call *c, const ckpt_route *rt, reg_version *v, const char *what) {
    if (!rt->has_ckpt) return api_error(c, 405, "%s needs a checkpoint: training_runs/{run}/checkpoints/{kind}/{name}",
                                        what), -1;
    int st = reg_find_owned(c->db, c->tenant_id, rt->tinker_path, v, c->err, sizeof c->err);
    if (st < 0) return api_db_error(c, what, c->err), -1;
    if (st > 0) return api_error(c, st, "%s", c->err), -1;
    return 0;
}

static int set_visibility(api_call *c, const ckpt_route *rt, bool pub) {
    reg_version v;
    if (owned(c, rt, &v, pub ? "publish" : "unpublish") < 0) return 0;
    if (db_begin(c->db, c->err, sizeof c->err) < 0 || reg_version_set_public(c->db, &v, pub, c->err, sizeof c->err) < 0 ||
        db_commit(c->db, c->err, sizeof c->err) < 0) {
        db_rollback(c->db);
        return api_db_error(c, "publish", c->err);
    }
    audit(c, v.tenant_id, pub ? "checkpoint.publish" : "checkpoint.unpublish", v.tinker_path, NULL);
    return api_reply_json(c, 200, json_pack("{s:s, s:b}", "tinker_path", v.tinker_path, "public", pub));
}

int api_h_run_checkpoints_post(api_call *c) {
    ckpt_route rt;
    if (parse_route(c, c->job->path_arg, &rt) < 0) return 0;
    if (strcmp(rt.action, "publish")) return api_error(c, 405, "POST is for .../publish");
    return set_visibility(c, &rt, true);
}

int api_h_run_checkpoints_put(api_call *c) {
    ckpt_route rt;
    if (parse_route(c, c->job->path_arg, &rt) < 0) return 0;
    if (strcmp(rt.action, "ttl")) return api_error(c, 405, "PUT is for .../ttl");
    int64_t ttl;
    if (decode_ttl(c->body, &ttl, c->err, sizeof c->err) < 0) return api_error(c, 400, "%s", c->err);
    reg_version v;
    if (owned(c, &rt, &v, "ttl") < 0) return 0;
    if (reg_version_set_ttl(c->db, v.id, ttl, c->err, sizeof c->err) < 0) return api_db_error(c, "ttl", c->err);
    reg_find_live(c->db, v.tinker_path, &v, c->err, sizeof c->err);
    return api_reply_json(c, 200, reg_checkpoint_json(&v));
}

int api_h_run_checkpoints_delete(api_call *c) {
    ckpt_route rt;
    if (parse_route(c, c->job->path_arg, &rt) < 0) return 0;
    if (!strcmp(rt.action, "publish")) return set_visibility(c, &rt, false);
    if (rt.action[0]) return api_error(c, 405, "DELETE is for a checkpoint or its .../publish");
    reg_version v;
    if (owned(c, &rt, &v, "delete") < 0) return 0;
    if (reg_version_delete(c->db, v.id, c->err, sizeof c->err) < 0) return api_db_error(c, "delete", c->err);
    audit(c, v.tenant_id, "checkpoint.delete", v.tinker_path, json_pack("{s:s}", "blob_digest", v.digest));
    return api_reply_json(c, 200, json_pack("{s:s, s:b}", "tinker_path", v.tinker_path, "deleted", 1));
}

/* ---- the signed download (§17.7) ------------------------------------------------------- */

/* The archive is rebuilt on every request (blob → export → tar) and is byte-identical
 * each time: the export depends only on the blob, the format and the base model, and the
 * tar writer only on its members and the version's created_at as mtime. So ranges of
 * different requests fit together, with no cache to keep or collect. */

/* One "bytes=" range of a total-byte body: 0 none, or one to ignore (several ranges,
 * another unit, bad syntax: RFC 9110 then serves the whole body); 1 the inclusive range
 * [*a, *b]; -1 unsatisfiable (416). */
static int parse_range(const char *h, size_t total, size_t *a, size_t *b) {
    if (!h) return 0;
    h += strspn(h, " ");
    if (strncasecmp(h, "bytes=", 6)) return 0;
    h += 6;
    if (strchr(h, ',')) return 0;
    h += strspn(h, " ");
    char *end;
    if (*h == '-') {   /* the last n bytes */
        if (h[1] < '0' || h[1] > '9') return 0;
        unsigned long long n = strtoull(h + 1, &end, 10);
        if (*(end + strspn(end, " "))) return 0;
        if (n == 0 || total == 0) return -1;
        *a = n >= total ? 0 : total - (size_t)n;
        *b = total - 1;
        return 1;
    }
    if (*h < '0' || *h > '9') return 0;
    unsigned long long from = strtoull(h, &end, 10), to = ULLONG_MAX;
    if (*end != '-') return 0;
    h = end + 1;
    if (*h >= '0' && *h <= '9') {
        to = strtoull(h, &end, 10);
        h = end;
    }
    if (*(h + strspn(h, " ")) || to < from) return 0;
    if (from >= total) return -1;
    *a = (size_t)from;
    *b = to >= total ? total - 1 : (size_t)to;
    return 1;
}

/* The tenant of the API key a download link was made for, while the key is valid: 0 with
 * *tenant, 403 (answered) or -1. */
static int link_key_tenant(api_call *c, int64_t key_id, int64_t *tenant) {
    char k[24];
    api_fmt_i64(k, key_id);
    const char *p[1] = {k};
    PGresult *r = db_query(c->db, SQL_LINK_KEY_TENANT, 1, p, c->err, sizeof c->err);
    if (!r) return -1;
    int found = PQntuples(r) > 0;
    if (found) *tenant = db_int(r, 0, 0);
    PQclear(r);
    if (!found)
        return api_error(c, 403, "the API key this download link was made for has been revoked or "
                                 "has expired; request a new link with a valid key"), 403;
    return 0;
}

/* "<expires>/<format>/<token>/<key id>/<run>/<kind>/<name>"; honours Range (one range per
 * request) and answers HEAD with the headers of the same request as a GET. The link is
 * checked against what is true now: the key it was made for must be valid and may still
 * read the checkpoint (not deleted, expired, unpublished or unshared since). */
int api_h_checkpoint_download(api_call *c) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", c->job->path_arg ? c->job->path_arg : "");
    char *seg[8];
    int n = 0;
    for (char *s = buf, *save = NULL, *t; n < 8 && (t = strtok_r(s, "/", &save)); s = NULL) seg[n++] = t;
    if (n != 7) return api_error(c, 404, "no such download (request a new link: GET .../archive)");
    char *end, *kend;
    long long expires = strtoll(seg[0], &end, 10), key_id = strtoll(seg[3], &kend, 10);
    const char *fmt = seg[1], *token = seg[2], *run = seg[4];
    char id[512];
    snprintf(id, sizeof id, "%s/%s", seg[5], seg[6]);
    bool one_file = external_file_fmt(fmt);
    if (*end || *kend || (strcmp(fmt, "tinker") && strcmp(fmt, "peft") && strcmp(fmt, "peft-nohead") && !one_file))
        return api_error(c, 403, "invalid download link");
    if (!api_link_secret() || !reg_download_verify(api_link_secret(), run, id, fmt, expires, key_id, token))
        return api_error(c, 403, "invalid download link (bad signature)");
    if (expires < (long long)time(NULL))
        return api_error(c, 403, "this download link has expired; request a new one (GET .../archive)");
    reg_path rp;
    if (reg_ckpt_id_parse(run, id, &rp, c->err, sizeof c->err) < 0) return api_error(c, 404, "%s", c->err);
    char path[REG_PATH_MAX];
    reg_path_format(&rp, path, sizeof path);
    int64_t tenant;
    int st = link_key_tenant(c, key_id, &tenant);
    if (st < 0) return api_db_error(c, "download", c->err);
    if (st > 0) return 0;
    reg_version v;
    st = reg_find_readable(c->db, tenant, path, &v, c->err, sizeof c->err);
    if (st < 0) return api_db_error(c, "download", c->err);
    if (st > 0)
        return api_error(c, 404, "checkpoint %.300s no longer exists or is no longer readable with "
                                 "the key this link was made for (deleted, expired, unpublished or "
                                 "unshared)", path);
    if (!api_blobs()) return api_error(c, 503, "archive downloads need the registry blob store (loom api --blob-dir)");
    void *blob;
    size_t blen;
    if (blob_get(api_blobs(), v.digest, &blob, &blen, c->err, sizeof c->err) < 0) {
        log_error("download %s: %s", path, c->err);
        return api_error(c, 500, "checkpoint %.300s cannot be read: %s", path, c->err);
    }
    adapter_export ex;
    int rc = adapter_io_export(blob, blen, strcmp(fmt, "tinker") ? ADAPTER_EXPORT_PEFT : ADAPTER_EXPORT_TINKER,
                               v.base_model, strcmp(fmt, "peft-nohead") != 0, &ex, c->err, sizeof c->err);
    free(blob);
    if (rc < 0) return api_error(c, 500, "checkpoint %.300s: %s", path, c->err);
    uint8_t *tar = NULL;
    size_t tlen = 0;
    if (one_file) {   /* one file of the PEFT layout (§12.6), as the export makes it */
        for (int i = 0; i < ex.n; i++)
            if (!strcmp(ex.files[i].name, fmt)) {
                tar = ex.files[i].data, tlen = ex.files[i].len;
                ex.files[i].data = NULL;
            }
        rc = tar ? 0 : -1;
        if (!tar) snprintf(c->err, sizeof c->err, "the export of %.300s has no %s", path, fmt);
    } else {
        reg_tar_member m[5];
        for (int i = 0; i < ex.n; i++) m[i] = (reg_tar_member){ex.files[i].name, ex.files[i].data, ex.files[i].len};
        rc = reg_tar_build(m, ex.n, v.created_epoch, &tar, &tlen, c->err, sizeof c->err);
    }
    adapter_export_free(&ex);
    if (rc < 0) return api_error(c, 500, "%s", c->err);

    size_t a = 0, b = tlen ? tlen - 1 : 0;
    int ranged = parse_range(c->job->range, tlen, &a, &b);
    strbuf hdr;
    sb_init(&hdr, 256);
    if (one_file)
        sb_printf(&hdr, "Accept-Ranges: bytes\nContent-Disposition: attachment; filename=\"%s\"\n", fmt);
    else
        sb_printf(&hdr, "Accept-Ranges: bytes\nContent-Disposition: attachment; filename=\"%s-%s%s.tar\"\n",
                  v.path.run, v.path.name, strcmp(fmt, "tinker") ? "-peft" : "");
    if (ranged < 0) {
        free(tar);
        api_error(c, 416, "range %.100s is outside the archive's %zu bytes", c->job->range, tlen);
        sb_printf(&hdr, "Content-Range: bytes */%zu\n", tlen);
        free(c->job->resp_headers);
        c->job->resp_headers = sb_steal(&hdr, NULL);
        return 0;
    }
    /* one audit row per download, not per range: ranges that start after byte 0 are the
     * rest of a download already recorded */
    if (a == 0) {
        json_t *d = json_pack("{s:s, s:I}", "format", fmt, "bytes", (json_int_t)tlen);
        char *ds = json_dumps(d, JSON_COMPACT);
        json_decref(d);
        if (reg_audit(c->db, v.tenant_id, "download-link", "checkpoint.download", path, ds, c->err, sizeof c->err) < 0)
            log_error("audit download: %s", c->err);
        free(ds);
    }
    if (ranged > 0) {
        sb_printf(&hdr, "Content-Range: bytes %zu-%zu/%zu\n", a, b, tlen);
        if (a > 0) memmove(tar, tar + a, b - a + 1);
        tlen = b - a + 1;
    }
    free(c->job->resp_headers);
    c->job->resp_headers = sb_steal(&hdr, NULL);
    return api_reply_bytes(c, ranged > 0 ? 206 : 200,
                           !one_file ? "application/x-tar"
                           : !strcmp(fmt, EXTERNAL_FILES[0]) ? "application/json" : "application/octet-stream",
                           tar, tlen);
}
