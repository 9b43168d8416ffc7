/* api_weights_ext.c: POST /api/v1/copy_weights (docs/protocol.md §7.10), a copy of a
 * checkpoint the caller may read into a run of its own session. Content-addressed: the
 * copy is a new adapter_versions row naming the source's blob (no byte is written), with
 * the source as its parent (lineage); it belongs to the caller, counts towards the
 * caller's storage limit, and outlives the source (the registry GC keeps a blob while any
 * live version names it). */
#include "common/db.h"
#include "registry/registry.h"
#include "core/api_json.h"
#include "tinker/api_ops.h"
#include "tinker/api_sql.h"
#include "tinker/api_weights.h"
#include "tinker/tinker.h"
#include "tinker/api_state.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COPY_TTL_MAX_S (100LL * 365 * 86400)

/* CopyWeightsRequest's optional ttl_seconds: null/absent = never; else 1 .. 100 years. */
static int copy_ttl(api_call *c, int64_t *ttl) {
    const json_t *v = json_object_get(c->body, "ttl_seconds");
    *ttl = -1;
    if (!v || json_is_null(v)) return 0;
    if (!jx_as_int(v, ttl) || *ttl < 1 || *ttl > COPY_TTL_MAX_S)
        return api_error(c, 400, "ttl_seconds must be a positive integer number of seconds (or null: the copy never "
                                 "expires), got %s", json_is_number(v) ? "a value out of range" : jx_type_name(v)), -1;
    return 0;
}

static int audit_copy(api_call *c, int64_t tenant, const char *action, const char *object, json_t *details) {
    char *d = json_dumps(details, JSON_COMPACT);
    json_decref(details);
    int rc = reg_audit_key(c->db, tenant, c->key_id, action, object, d, c->err, sizeof c->err);
    free(d);
    return rc;
}

int api_h_copy_weights(api_call *c) {
    const char *sid, *source;
    int64_t mseq, ttl;
    bool has_mseq;
    if (jx_req_str(c->body, "", "session_id", &sid, c->err, sizeof c->err) < 0 ||
        jx_int(c->body, "", "model_seq_id", 0, &mseq, &has_mseq, c->err, sizeof c->err) < 0 ||
        jx_req_str(c->body, "", "source_path", &source, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    if (!has_mseq || mseq < 0 || mseq > INT32_MAX)
        return api_error(c, 400, "model_seq_id is required: the run slot of the session that will hold the copy, "
                                 "0 .. %d", INT32_MAX);
    if (copy_ttl(c, &ttl) < 0) return 0;
    const json_t *tok = json_object_get(c->body, "weights_access_token");
    if (tok && !json_is_null(tok))
        return api_error(c, 400, "weights_access_token: this server has no access tokens between accounts; the "
                                 "source's owner shares the run with you (`loom adapter share`) or publishes it");
    reg_path sp;
    char why[sizeof c->err];
    if (reg_path_parse(source, &sp, why, sizeof why) < 0) return api_error(c, 400, "source_path: %s", why);
    blobstore *bs = api_blobs();
    if (!bs) return api_error(c, 503, "copy_weights needs the registry blob store (loom api --blob-dir)");

    char run[REG_RUN_MAX], path[REG_PATH_MAX];
    if (snprintf(run, sizeof run, "%s:train:%lld", sid, (long long)mseq) >= (int)sizeof run)
        return api_error(c, 400, "session_id is too long");
    if (db_begin(c->db, c->err, sizeof c->err) < 0) return api_db_error(c, "copy_weights", c->err);
    int st = api_session_lock(c, sid);   /* the caller's live session, or answered */
    if (st < 0) goto dberr;
    if (st > 0) return 0;
    /* The slot of a training model holds its own checkpoints: a copy goes to a free one. */
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *pm[2] = {run, tid};
    PGresult *r = db_query(c->db, SQL_MODEL_LORA, 2, pm, c->err, sizeof c->err);
    if (!r) goto dberr;
    bool is_model = PQntuples(r) > 0;
    PQclear(r);
    if (is_model) {
        db_rollback(c->db);
        return api_error(c, 409, "model_seq_id %lld of session %.200s is the training run %.300s; copy into a free "
                                 "slot", (long long)mseq, sid, run);
    }
    reg_version v;
    st = reg_find_readable(c->db, c->tenant_id, source, &v, c->err, sizeof c->err);
    if (st < 0) goto dberr;
    if (st > 0) goto refuse;
    /* Under the blob's shared lock the GC cannot take it: the blob is there now (or the
     * source died and the GC took it before: then it is not readable any more). */
    if (reg_blob_lock_shared(c->db, v.digest, c->err, sizeof c->err) < 0) goto dberr;
    int64_t vid = v.id;
    st = reg_find_readable(c->db, c->tenant_id, source, &v, c->err, sizeof c->err);
    if (st < 0) goto dberr;
    if (st == 0 && (v.id != vid || !blob_exists(bs, v.digest))) {
        snprintf(c->err, sizeof c->err, "checkpoint %.300s was deleted or saved again while it was copied; retry",
                 source);
        st = 409;
    }
    if (st > 0) goto refuse;
    st = op_check_storage(c->db, c->tenant_id, c->err, sizeof c->err);
    if (st < 0) goto dberr;
    if (st > 0) goto refuse;
    st = reg_copy(c->db, &v, c->tenant_id, run, ttl, c->key_id, path, c->err, sizeof c->err);
    if (st < 0) goto dberr;
    if (st > 0) goto refuse;
    json_t *d = json_pack("{s:s, s:I, s:s}", "source", v.tinker_path, "source_tenant", (json_int_t)v.tenant_id,
                          "blob_digest", v.digest);
    if (audit_copy(c, c->tenant_id, "checkpoint.copy", path, d) < 0) goto dberr;
    if (v.tenant_id != c->tenant_id &&
        audit_copy(c, v.tenant_id, "checkpoint.copied_by_other", v.tinker_path,
                   json_pack("{s:I, s:s}", "by_tenant", (json_int_t)c->tenant_id, "copy", path)) < 0)
        goto dberr;
    if (db_commit(c->db, c->err, sizeof c->err) < 0) goto dberr;
    return api_reply_json(c, 200, json_pack("{s:s}", "tinker_path", path));
refuse:
    db_rollback(c->db);
    return api_error(c, st, "%s", c->err);
dberr:
    db_rollback(c->db);
    return api_db_error(c, "copy_weights", c->err);
}
