/* api_call.c: setting a job's response from a handler (see api_call.h). */
#include "core/api_call.h"
#include "common/db.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "core/api_json.h"
#include "core/api_route.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int api_reply_take(api_call *c, int status, char *json, size_t len) {
    api_job *j = c->job;
    free(j->resp);
    j->status = status;
    j->resp = json;
    j->resp_len = len;
    j->resp_type = "application/json";
    return 0;
}

int api_reply_bytes(api_call *c, int status, const char *content_type, void *data, size_t len) {
    api_reply_take(c, status, data, len);
    c->job->resp_type = content_type;
    return 0;
}

void api_fmt_i64(char out[24], int64_t v) { snprintf(out, 24, "%lld", (long long)v); }

PGresult *api_tenant_row(api_call *c, const char *what, const char *sql, const char *id, const char *noun) {
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *p[2] = {id, tid};
    PGresult *r = db_query(c->db, sql, 2, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, what, c->err), NULL;
    if (PQntuples(r) > 0) return r;
    PQclear(r);
    return api_error(c, 404, "%s %.200s not found", noun, id), NULL;
}

int api_reply_sql_json(api_call *c, const char *what, const char *sql, int n,
                       const char *const *params, const char *not_found) {
    PGresult *r = db_query(c->db, sql, n, params, c->err, sizeof c->err);
    if (!r) return api_db_error(c, what, c->err);
    if (PQntuples(r) == 0) {
        PQclear(r);
        return api_error(c, 404, "%s", not_found);
    }
    api_reply_text(c, 200, PQgetvalue(r, 0, 0));
    PQclear(r);
    return 0;
}

int api_reply_text(api_call *c, int status, const char *json) {
    size_t n = strlen(json);
    char *copy = malloc(n + 1);
    if (!copy) abort();
    memcpy(copy, json, n + 1);
    return api_reply_take(c, status, copy, n);
}

int api_reply_json(api_call *c, int status, json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(v);
    if (!s) return api_error(c, 500, "internal error: could not encode the response");
    return api_reply_take(c, status, s, strlen(s));
}

int api_error_v(api_call *c, int status, const char *param, const char *code, const char *fmt, va_list ap) {
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t len;
    const api_route *r = c->job->route;
    char *body = r && r->errors ? r->errors->body(status, msg, param, code, &len) : jx_detail(msg, &len);
    c->job->park = false;
    return api_reply_take(c, status, body, len);
}

int api_error(api_call *c, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    api_error_v(c, status, NULL, NULL, fmt, ap);
    va_end(ap);
    return 0;
}

int api_db_error(api_call *c, const char *what, const char *err) {
    bool hold = c->job->route->flags & ROUTE_LONG_POLL;
    /* While the database is away every request fails so, each client's every second: the
     * outage's message then (db_outage_level), not one per request. */
    bool away = !c->db || PQstatus(c->db) != CONNECTION_OK;
    if (hold) log_msg(away ? db_outage_level() : LOG_WARN_, "%s: database error, holding the request: %s", what, err);
    else log_msg(away ? db_outage_level() : LOG_ERROR_, "%s: database error: %s", what, err);
    api_error(c, 503, "database error during %s; retry shortly", what);
    c->job->park = hold;
    return 0;
}

static int hexval(char ch) {
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
           : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* %XX (never %00) in place; '+' is a space only in query strings. */
static size_t url_decode(char *s, bool plus_is_space) {
    char *o = s;
    for (const char *i = s; *i; i++) {
        int hi, lo;
        if (*i == '%' && (hi = hexval(i[1])) >= 0 && (lo = hexval(i[2])) >= 0 && (hi || lo)) {
            *o++ = (char)(hi * 16 + lo);
            i += 2;
        } else {
            *o++ = plus_is_space && *i == '+' ? ' ' : *i;
        }
    }
    *o = 0;
    return (size_t)(o - s);
}

size_t api_url_decode(char *s) { return url_decode(s, true); }

const char *api_path_id(api_call *c) {
    if (!c->job->path_arg) return "";
    url_decode(c->job->path_arg, false);
    return c->job->path_arg;
}

int api_query_param(api_call *c, const char *name, char *out, size_t outlen) {
    const char *q = c->job->query;
    size_t nlen = strlen(name);
    while (q && *q) {
        const char *end = strchr(q, '&');
        size_t len = end ? (size_t)(end - q) : strlen(q);
        if (len >= nlen && !memcmp(q, name, nlen) && (len == nlen || q[nlen] == '=')) {
            size_t vlen = len > nlen ? len - nlen - 1 : 0;   /* "?name" alone: present, empty */
            if (vlen >= outlen) vlen = outlen - 1;
            memcpy(out, q + len - vlen, vlen);
            out[vlen] = 0;
            api_url_decode(out);
            return 1;
        }
        q = end ? end + 1 : NULL;
    }
    return 0;
}

int api_page_params(api_call *c, int64_t def_limit, int64_t max_limit, int64_t *limit, int64_t *offset) {
    char v[64], *end;
    *limit = def_limit;
    *offset = 0;
    if (api_query_param(c, "limit", v, sizeof v)) {
        *limit = strtoll(v, &end, 10);
        if (!*v || *end || *limit < 1 || *limit > max_limit)
            return api_error(c, 400, "limit must be an integer between 1 and %lld, got \"%s\"", (long long)max_limit,
                             v), -1;
    }
    if (api_query_param(c, "offset", v, sizeof v)) {
        *offset = strtoll(v, &end, 10);
        if (!*v || *end || *offset < 0 || *offset > INT32_MAX)
            return api_error(c, 400, "offset must be an integer between 0 and %d, got \"%s\"", INT32_MAX, v), -1;
    }
    return 0;
}

/* Whether s, percent-decoded, is UTF-8. */
static bool decoded_utf8(const char *s) {
    if (!s) return true;
    char *copy = strdup(s);
    if (!copy) abort();
    size_t n = url_decode(copy, false);
    bool ok = utf8_valid(copy, n);
    free(copy);
    return ok;
}

int api_check_request_text(api_call *c) {
    if (!decoded_utf8(c->job->path_arg))
        return api_error(c, 400, "the request path is not valid UTF-8 once percent-decoded "
                                 "(ids and names are UTF-8 text)"), -1;
    if (!decoded_utf8(c->job->query))
        return api_error(c, 400, "the query string is not valid UTF-8 once percent-decoded"), -1;
    return 0;
}
