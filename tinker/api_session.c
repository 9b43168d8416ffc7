/* api_session.c: sessions (docs/protocol.md §3.1, §3.2), server capabilities (§2.5) and telemetry (§13). */
#include "common/clock.h"
#include "common/db.h"
#include "common/log.h"
#include "core/api_call.h"
#include "core/api_json.h"
#include "tinker/api_sql.h"
#include "tinker/tinker.h"
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sizes a session stores (bytes). */
#define SESSION_MAX_JSON 65536   /* tags, user_metadata (as compact JSON) */
#define SESSION_MAX_NAME 256     /* sdk_version, project_id, display_name */

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
    json_t *tags;
    const char *sdk, *project, *display;
    if (jx_arr(c->body, "", "tags", &tags, c->err, sizeof c->err) < 0 ||
        jx_str(c->body, "", "sdk_version", &sdk, c->err, sizeof c->err) < 0 ||
        jx_str(c->body, "", "project_id", &project, c->err, sizeof c->err) < 0 ||
        jx_str(c->body, "", "display_name", &display, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    for (size_t i = 0; tags && i < json_array_size(tags); i++)
        if (!json_is_string(json_array_get(tags, i)))
            return api_error(c, 400, "tags[%zu]: expected a string, got %s", i,
                             jx_type_name(json_array_get(tags, i)));
    const struct { const char *name, *value; } names[] = {
        {"sdk_version", sdk}, {"project_id", project}, {"display_name", display}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].value && strlen(names[i].value) > SESSION_MAX_NAME)
            return api_error(c, 400, "%s is %zu bytes; at most %d are stored", names[i].name,
                             strlen(names[i].value), SESSION_MAX_NAME);
    char id[37], tid[24];
    new_session_id(id);
    api_fmt_i64(tid, c->tenant_id);
    /* user_metadata: strings only, since SDKs read it back as dict[str, str] */
    char *meta_json = NULL;
    if (jx_string_map(c->body, "user_metadata", SESSION_MAX_JSON, &meta_json, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    char *tags_json = tags ? jx_dump_bounded(tags, "tags", SESSION_MAX_JSON, c->err, sizeof c->err)
                           : strdup("[]");
    if (!tags_json) {
        free(meta_json);
        return api_error(c, 400, "%s", c->err);
    }
    const char *p[7] = {id, tid, tags_json, meta_json, sdk, project, display};
    int rc = db_exec(c->db, SQL_SESSION_CREATE, 7, p, c->err, sizeof c->err);
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
    char tid[24], finished[16] = "";
    api_fmt_i64(tid, c->tenant_id);
    const char *p[2] = {sid, tid};
    PGresult *r = db_query(c->db, SQL_SESSION_HEARTBEAT, 2, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "session_heartbeat", c->err);
    int64_t n = db_int(r, 0, 0);
    bool expired = !PQgetisnull(r, 0, 1) && db_bool(r, 0, 1);
    if (!PQgetisnull(r, 0, 2)) snprintf(finished, sizeof finished, "%s", PQgetvalue(r, 0, 2));
    PQclear(r);
    /* 410 is what the SDK's heartbeat loop stops on: its client said it is done */
    if (finished[0]) return api_error(c, 410, "session %.200s has finished (%s): it takes no more heartbeats",
                                      sid, finished);
    if (expired) return api_error(c, 404, "session %.200s expired (no heartbeat and no request for a while); "
                                          "create a new session", sid);
    if (n == 0) return api_error(c, 404, "session %.200s not found", sid);
    return api_reply_text(c, 200, "{\"type\": \"session_heartbeat\"}");
}

/* ---- POST sessions/{id}/finish (§3.5) ------------------------------------------------- */

void api_session_finished_msg(char *out, size_t outlen, const char *session_id, const char *reason) {
    snprintf(out, outlen, "session %.200s was finished by its client (%s: ServiceClient.close) and takes no more "
             "requests; create a new ServiceClient", session_id, reason);
}

#define FINISH_MAX_DETAIL 4096   /* bytes of the client's detail text kept */

/* ServiceClient.close(reason, detail): {"reason": {"type": "success" | "errored" |
 * "interrupted"}, "detail": str | null}. The first finish of a session is kept; a later
 * one reads it back unchanged. As the SDK documents, the session is then terminal: its
 * heartbeats are 410 (the SDK's heartbeat loop stops on it) and every request bound to it
 * (create_model, create_sampling_session, a model's or a sampler's submits) is a 400;
 * futures already submitted still run and can be read. With nothing coming in, the
 * session expires after --session-timeout-s like any idle one, which frees its models. */
static int session_finish(api_call *c, const char *sid) {
    json_t *reason;
    const char *type, *detail;
    if (jx_obj(c->body, "", "reason", &reason, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    if (!reason) return api_error(c, 400, "reason is required: {\"type\": \"success\" | \"errored\" | \"interrupted\"}");
    if (jx_req_str(reason, "reason", "type", &type, c->err, sizeof c->err) < 0 ||
        jx_str(c->body, "", "detail", &detail, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    if (strcmp(type, "success") && strcmp(type, "errored") && strcmp(type, "interrupted"))
        return api_error(c, 400, "reason.type must be \"success\", \"errored\" or \"interrupted\", got \"%.60s\"", type);
    if (detail && strlen(detail) > FINISH_MAX_DETAIL)
        return api_error(c, 400, "detail is %zu bytes; at most %d are kept", strlen(detail), FINISH_MAX_DETAIL);
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *p[4] = {sid, tid, type, detail};
    PGresult *r = db_query(c->db, SQL_SESSION_FINISH, 4, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "finish", c->err);
    if (PQntuples(r) == 0) {   /* finished before (its reason is the answer), or not the caller's */
        PQclear(r);
        return api_reply_sql_json(c, "finish", SQL_SESSION_FINISHED, 2, p, "session not found");
    }
    log_info("session %s finished by its client: %s%s%.200s", sid, type, detail ? ": " : "", detail ? detail : "");
    api_reply_text(c, 200, PQgetvalue(r, 0, 0));
    PQclear(r);
    return 0;
}

/* The route's suffix is "{id}/finish" (the route table matched its shape: core/api_route.c). */
int api_h_session_finish(api_call *c) {
    char *arg = (char *)api_path_id(c);
    char *slash = strrchr(arg, '/');
    if (slash) *slash = 0;
    return session_finish(c, arg);
}

/* PUT sessions/{id}/project (RestClient.assign_session_project): moves the caller's session,
 * and with it its runs, samplers and checkpoints (they are counted under their session's
 * project), into project_id. The SDK has no way to clear a project, and neither has this. */
int api_h_session_project(api_call *c) {
    char *arg = (char *)api_path_id(c);
    char *slash = strrchr(arg, '/');
    if (slash) *slash = 0;
    const char *project;
    if (jx_req_str(c->body, "", "project_id", &project, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    if (!*project || strlen(project) > SESSION_MAX_NAME)
        return api_error(c, 400, "project_id must be 1 to %d bytes", SESSION_MAX_NAME);
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *p[3] = {arg, tid, project};
    PGresult *r = db_query(c->db, SQL_SESSION_SET_PROJECT, 3, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "assign_session_project", c->err);
    int found = PQntuples(r) > 0;
    PQclear(r);
    if (!found) return api_error(c, 404, "session %.200s not found", arg);
    return api_reply_json(c, 200, json_pack("{s:s, s:s}", "session_id", arg, "project_id", project));
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

/* Readiness (docs/architecture.md "Health and readiness"): 200 when the database answers and
 * at least one base model has a live executor (one that beat within --executor-timeout-s) that
 * takes work, else 503; the body says which base models are served (a load balancer or an
 * orchestrator reads the status, an operator the body). */
int api_h_readyz(api_call *c) {
    if (!c->db)
        return api_reply_json(c, 503, json_pack("{s:b, s:b, s:[], s:s}", "ready", 0, "database", 0, "base_models",
                                                "detail", "the database is not reachable"));
    char timeout[24];
    api_fmt_i64(timeout, c->settings->executor_timeout_s);
    const char *p[1] = {timeout};
    PGresult *r = db_query(c->db, SQL_READY, 1, p, c->err, sizeof c->err);
    if (!r)
        return api_reply_json(c, 503, json_pack("{s:b, s:b, s:[], s:s}", "ready", 0, "database", 0, "base_models",
                                                "detail", c->err));
    json_t *models = json_array();
    bool any = false;
    for (int i = 0; i < PQntuples(r); i++) {
        int64_t live = db_int(r, i, 1);
        any |= live > 0;
        json_array_append_new(models, json_pack("{s:s, s:b, s:I, s:I}", "name", PQgetvalue(r, i, 0), "ready",
                                                live > 0, "executors", (json_int_t)live, "draining",
                                                (json_int_t)db_int(r, i, 2)));
    }
    PQclear(r);
    return api_reply_json(c, any ? 200 : 503, json_pack("{s:b, s:b, s:o}", "ready", any, "database", 1,
                                                        "base_models", models));
}

/* ---- telemetry (§13) ---------------------------------------------------------------- */

/* The SDK sends a batch every 10 s (at most 100 events). Batches are authenticated like
 * every other request, bounded in size, and rate-limited per tenant with a token bucket,
 * so a key holder cannot flood the log. Every answer is still 200 {"status":
 * "accepted"}: anything else makes the SDK resend the batch every second, forever. */
#define TELEMETRY_MAX_BODY (1u << 20)
#define TELEMETRY_BURST 10.0       /* batches a tenant may send at once */
#define TELEMETRY_PER_S 0.5        /* batches per second, sustained */
#define TELEMETRY_MAX_LINES 5      /* events logged from one batch */
#define TELEMETRY_SLOTS 256
#define TELEMETRY_ACCEPTED "{\"status\": \"accepted\"}"

typedef struct {
    int64_t tenant;
    double tokens, at;
    int64_t dropped;
} telemetry_bucket;

static telemetry_bucket g_tel[TELEMETRY_SLOTS];
static pthread_mutex_t g_tel_mu = PTHREAD_MUTEX_INITIALIZER;

/* Whether the tenant's batch may be logged; *dropped: batches dropped before it. A slot
 * taken by another tenant (hash collision) starts over for the newcomer. */
static bool telemetry_admit(int64_t tenant, int64_t *dropped) {
    double now = clock_mono_s();
    pthread_mutex_lock(&g_tel_mu);
    telemetry_bucket *b = &g_tel[(uint64_t)tenant % TELEMETRY_SLOTS];
    if (b->tenant != tenant) *b = (telemetry_bucket){.tenant = tenant, .tokens = TELEMETRY_BURST, .at = now};
    b->tokens += (now - b->at) * TELEMETRY_PER_S;
    if (b->tokens > TELEMETRY_BURST) b->tokens = TELEMETRY_BURST;
    b->at = now;
    bool ok = b->tokens >= 1.0;
    if (ok) {
        b->tokens -= 1.0;
        *dropped = b->dropped;
        b->dropped = 0;
    } else {
        b->dropped++;
    }
    pthread_mutex_unlock(&g_tel_mu);
    return ok;
}

/* Logs the UNHANDLED_EXCEPTION and ERROR/CRITICAL events of a batch (the log escapes
 * control characters, so no event can forge a line). */
static void telemetry_log(int64_t tenant, const json_t *body) {
    const char *session = json_string_value(json_object_get(body, "session_id"));
    json_t *events = json_object_get(body, "events");
    size_t i, logged = 0, skipped = 0;
    json_t *e;
    json_array_foreach(events, i, e) {
        const char *kind = json_string_value(json_object_get(e, "event"));
        const char *sev = json_string_value(json_object_get(e, "severity"));
        bool bad = (kind && !strcmp(kind, "UNHANDLED_EXCEPTION")) ||
                   (sev && (!strcmp(sev, "ERROR") || !strcmp(sev, "CRITICAL")));
        if (!bad) continue;
        if (logged == TELEMETRY_MAX_LINES) {
            skipped++;
            continue;
        }
        logged++;
        const char *msg = json_string_value(json_object_get(e, "error_message"));
        const char *type = json_string_value(json_object_get(e, "error_type"));
        const char *name = json_string_value(json_object_get(e, "event_name"));
        log_warn("client telemetry: tenant=%lld session=%.80s %.40s %.20s%s%.80s: %.500s",
                 (long long)tenant, session ? session : "-", kind ? kind : "?", sev ? sev : "?",
                 type || name ? " " : "", type ? type : name ? name : "", msg ? msg : "");
    }
    if (skipped)
        log_warn("client telemetry: tenant=%lld: %zu more error events in the batch not logged",
                 (long long)tenant, skipped);
}

int api_h_telemetry(api_call *c) {
    int64_t dropped = 0;
    /* The database is away (ROUTE_DB_OPTIONAL): the key cannot be checked, so the batch is
     * dropped unread; 200 all the same, or the SDK would resend it every second. */
    if (!c->db) return api_reply_text(c, 200, TELEMETRY_ACCEPTED);
    if (telemetry_admit(c->tenant_id, &dropped)) {
        if (dropped)
            log_warn("client telemetry: tenant=%lld: %lld batches dropped (over %.1f a second)",
                     (long long)c->tenant_id, (long long)dropped, TELEMETRY_PER_S);
        if (c->job->body_len > TELEMETRY_MAX_BODY) {
            log_warn("client telemetry: tenant=%lld: a batch of %zu bytes ignored (limit %u)",
                     (long long)c->tenant_id, c->job->body_len, TELEMETRY_MAX_BODY);
        } else {
            int st;
            json_t *body = jx_parse_body(c->job->body, c->job->body_len, c->err, sizeof c->err, &st);
            if (body) telemetry_log(c->tenant_id, body);
            json_decref(body);
        }
    }
    return api_reply_text(c, 200, TELEMETRY_ACCEPTED);
}

int api_session_lock(api_call *c, const char *session_id) {
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *p[2] = {session_id, tid};
    PGresult *r = db_query(c->db, SQL_SESSION_LOCK, 2, p, c->err, sizeof c->err);
    if (!r) return -1;
    int found = PQntuples(r) > 0;
    bool expired = found && db_bool(r, 0, 0);
    char finished[16] = "";
    if (found && !PQgetisnull(r, 0, 1)) snprintf(finished, sizeof finished, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    if (found && !expired && !finished[0]) {
        const char *pt[1] = {session_id};
        return db_exec(c->db, SQL_SESSION_TOUCH_ID, 1, pt, c->err, sizeof c->err) < 0 ? -1 : 0;
    }
    db_rollback(c->db);
    if (finished[0]) {
        api_session_finished_msg(c->err, sizeof c->err, session_id, finished);
        api_error(c, 400, "%s", c->err);
    } else if (expired) api_error(c, 400, "session %.200s expired (no heartbeat and no request for a while); create a "
                                   "new session", session_id);
    else api_error(c, 404, "session %.200s not found (call create_session first)", session_id);
    return 1;
}
