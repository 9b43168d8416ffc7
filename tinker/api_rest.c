/* api_rest.c: REST reads of docs/protocol.md §12.2 that are not checkpoint routes (sessions, training
 * runs) and unload_model (§7.8). Everything is scoped to the caller's tenant: another
 * tenant's id is simply not found (404), and listings only ever show the caller's rows.
 * The JSON objects (TrainingRun, Checkpoint, Cursor) are built by the SQL in api_sql.h. */
#include "common/db.h"
#include "common/log.h"
#include "core/api_call.h"
#include "core/api_json.h"
#include "tinker/api_ops.h"
#include "tinker/api_sql.h"
#include "tinker/tinker.h"
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIST_MAX_LIMIT 1000

/* ?limit=&offset=&access_scope= of a listing. 0, or the 400 is answered. */
static int list_params(api_call *c, int64_t def_limit, char limit[24], char offset[24]) {
    char v[64];
    int64_t lim, off;
    if (api_page_params(c, def_limit, LIST_MAX_LIMIT, &lim, &off) < 0) return -1;
    /* "accessible" would add what others share with this tenant; listings show owned rows
     * only, which both scopes include. */
    if (api_query_param(c, "access_scope", v, sizeof v) && strcmp(v, "owned") != 0 &&
        strcmp(v, "accessible") != 0)
        return api_error(c, 400, "access_scope must be \"owned\" or \"accessible\", got \"%.40s\"",
                         v), -1;
    api_fmt_i64(limit, lim);
    api_fmt_i64(offset, off);
    return 0;
}

/* A listing of the caller's rows: ?limit (default 20) &offset. */
static int list_route(api_call *c, const char *what, const char *sql) {
    char tid[24], limit[24], offset[24];
    if (list_params(c, 20, limit, offset) < 0) return 0;
    api_fmt_i64(tid, c->tenant_id);
    const char *p[3] = {tid, limit, offset};
    return api_reply_sql_json(c, what, sql, 3, p, "nothing to list");
}

/* One of the caller's objects by the id in the path (a row of one cell: the JSON answer). */
static int get_route(api_call *c, const char *what, const char *sql, const char *noun) {
    PGresult *r = api_tenant_row(c, what, sql, api_path_id(c), noun);
    if (!r) return 0;
    api_reply_text(c, 200, PQgetvalue(r, 0, 0));
    PQclear(r);
    return 0;
}

int api_h_list_sessions(api_call *c) { return list_route(c, "sessions", SQL_SESSIONS_LIST); }
int api_h_get_session(api_call *c) { return get_route(c, "sessions", SQL_SESSION_GET, "session"); }
/* ?limit&offset[&project_id]: RestClient.list_training_runs(project_id=...) keeps the runs
 * whose session is in that project. */
int api_h_list_training_runs(api_call *c) {
    /* large enough that a value cut to it still decodes to more than the limit */
    char tid[24], limit[24], offset[24], project[1024];
    if (list_params(c, 20, limit, offset) < 0) return 0;
    bool by_project = api_query_param(c, "project_id", project, sizeof project);
    if (by_project && (!*project || strlen(project) > 256))
        return api_error(c, 400, "project_id must be 1 to 256 bytes");
    api_fmt_i64(tid, c->tenant_id);
    const char *p[4] = {tid, limit, offset, by_project ? project : NULL};
    return api_reply_sql_json(c, "training_runs", SQL_TRAINING_RUNS_LIST, 4, p, "nothing to list");
}
int api_h_get_training_run(api_call *c) {
    return get_route(c, "training_runs", SQL_TRAINING_RUN_GET, "training run");
}

/* ---- unload_model (§7.8) -------------------------------------------------------------- */

/* The model stops taking operations: status 'unloaded'; operations still queued fail with
 * a message; the future of the unload itself is done at once. Repeating it returns the
 * first future. The executor drops the adapter from its memory in its own time. */
int api_h_unload_model(api_call *c) {
    const char *model_id;
    if (jx_req_str(c->body, "", "model_id", &model_id, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    char tid[24], request_id[API_REQUEST_ID_MAX];
    api_fmt_i64(tid, c->tenant_id);
    if (db_begin(c->db, c->err, sizeof c->err) < 0) goto dberr;
    const char *p[2] = {model_id, tid};
    PGresult *r = db_query(c->db, SQL_MODEL_FOR_UNLOAD, 2, p, c->err, sizeof c->err);
    if (!r) goto dberr;
    if (PQntuples(r) == 0) {
        PQclear(r);
        db_rollback(c->db);
        return api_error(c, 404, "model %.200s not found", model_id);
    }
    bool earlier = !PQgetisnull(r, 0, 1);
    if (earlier) snprintf(request_id, sizeof request_id, "%s", PQgetvalue(r, 0, 1));
    bool failed = !strcmp(PQgetvalue(r, 0, 0), "failed");
    PQclear(r);
    if (!earlier && failed) {
        db_rollback(c->db);
        return api_error(c, 400, "model %.200s has failed and holds nothing to unload", model_id);
    }
    if (!earlier) {
        json_t *res = json_pack("{s:s, s:s}", "model_id", model_id, "type", "unload_model");
        char *text = json_dumps(res, JSON_COMPACT);
        json_decref(res);
        op_new_request_id(request_id);
        const char *ip[4] = {request_id, tid, model_id, text};
        const char *mp[1] = {model_id};
        int rc = db_exec(c->db, SQL_UNLOAD_OP_INSERT, 4, ip, c->err, sizeof c->err);
        free(text);
        if (rc < 0 || db_exec(c->db, SQL_MODEL_SET_UNLOADED, 1, mp, c->err, sizeof c->err) < 0 ||
            db_exec(c->db, SQL_MODEL_CANCEL_QUEUED, 1, mp, c->err, sizeof c->err) < 0)
            goto dberr;
    }
    if (db_commit(c->db, c->err, sizeof c->err) < 0) goto dberr;
    if (!earlier) log_info("model %s unloaded", model_id);
    return api_reply_json(c, 200, json_pack("{s:s, s:s}", "request_id", request_id, "model_id",
                                            model_id));
dberr:
    db_rollback(c->db);
    return api_db_error(c, "unload_model", c->err);
}
