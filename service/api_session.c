/* api_session.c: sessions (§3.1, §3.2), server capabilities (§2.5) and telemetry (§13). */
#include "common/db.h"
#include "common/log.h"
#include "service/api_call.h"
#include "service/api_json.h"
#include "service/api_sql.h"
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A random UUID (version 4): no '/', '?', '#', ':' or spaces, safe in URL paths. */
static void new_session_id(char out[37]) {
    unsigned char b[16];
    char hex[33];
    randombytes_buf(b, sizeof b);
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    sodium_bin2hex(hex, sizeof hex, b, sizeof b);
    snprintf(out, 37, "%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12, hex + 16, hex + 20);
}

int api_h_create_session(api_call *c) {
    json_t *tags, *meta;
    const char *sdk, *project;
    if (jx_arr(c->body, "", "tags", &tags, c->err, sizeof c->err) < 0 ||
        jx_obj(c->body, "", "user_metadata", &meta, c->err, sizeof c->err) < 0 ||
        jx_str(c->body, "", "sdk_version", &sdk, c->err, sizeof c->err) < 0 ||
        jx_str(c->body, "", "project_id", &project, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    for (size_t i = 0; tags && i < json_array_size(tags); i++)
        if (!json_is_string(json_array_get(tags, i)))
            return api_error(c, 400, "tags[%zu]: expected a string, got %s", i,
                             jx_type_name(json_array_get(tags, i)));
    char id[37], tid[24];
    new_session_id(id);
    snprintf(tid, sizeof tid, "%lld", (long long)c->tenant_id);
    char *tags_json = tags ? json_dumps(tags, JSON_COMPACT) : strdup("[]");
    char *meta_json = meta ? json_dumps(meta, JSON_COMPACT) : NULL;
    const char *p[6] = {id, tid, tags_json, meta_json, sdk, project};
    int rc = db_exec(c->db, SQL_SESSION_CREATE, 6, p, c->err, sizeof c->err);
    free(tags_json);
    free(meta_json);
    if (rc < 0) return api_db_error(c, "create_session", c->err);
    json_t *resp = json_pack("{s:s, s:s, s:n, s:n, s:n}", "type", "create_session", "session_id",
                             id, "info_message", "warning_message", "error_message");
    return api_reply_json(c, 200, resp);
}

int api_h_session_heartbeat(api_call *c) {
    const char *sid;
    if (jx_req_str(c->body, "", "session_id", &sid, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    char tid[24];
    snprintf(tid, sizeof tid, "%lld", (long long)c->tenant_id);
    const char *p[2] = {sid, tid};
    PGresult *r = db_query(c->db, SQL_SESSION_HEARTBEAT, 2, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "session_heartbeat", c->err);
    int n = atoi(PQcmdTuples(r));
    PQclear(r);
    if (n == 0) return api_error(c, 404, "session %.200s not found", sid);
    return api_reply_text(c, 200, "{\"type\": \"session_heartbeat\"}");
}

int api_h_capabilities(api_call *c) {
    PGresult *r = db_query(c->db, SQL_BASE_MODELS_LIST, 0, NULL, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "get_server_capabilities", c->err);
    json_t *models = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(models, json_pack("{s:s, s:I}", "model_name", PQgetvalue(r, i, 0),
                                                "max_context_length", (json_int_t)db_int(r, i, 1)));
    PQclear(r);
    return api_reply_json(c, 200, json_pack("{s:o}", "supported_models", models));
}

/* Always 200 {"status": "accepted"}: anything else makes the SDK resend every second. */
int api_h_telemetry(api_call *c) {
    json_t *body = jx_parse_body(c->job->body, c->job->body_len, c->err, sizeof c->err);
    json_t *events = body ? json_object_get(body, "events") : NULL;
    const char *session = body ? json_string_value(json_object_get(body, "session_id")) : NULL;
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        const char *kind = json_string_value(json_object_get(e, "event"));
        const char *sev = json_string_value(json_object_get(e, "severity"));
        bool bad = (kind && !strcmp(kind, "UNHANDLED_EXCEPTION")) ||
                   (sev && (!strcmp(sev, "ERROR") || !strcmp(sev, "CRITICAL")));
        if (!bad) continue;
        const char *msg = json_string_value(json_object_get(e, "error_message"));
        const char *type = json_string_value(json_object_get(e, "error_type"));
        const char *name = json_string_value(json_object_get(e, "event_name"));
        log_warn("client telemetry: session=%.80s %s %s%s%.80s: %.500s", session ? session : "-",
                 kind ? kind : "?", sev ? sev : "?", type || name ? " " : "",
                 type ? type : name ? name : "", msg ? msg : "");
    }
    json_decref(body);
    return api_reply_text(c, 200, "{\"status\": \"accepted\"}");
}
