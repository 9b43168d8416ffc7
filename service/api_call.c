/* api_call.c: setting a job's response from a handler (see api_call.h). */
#include "service/api_call.h"
#include "common/log.h"
#include "service/api_json.h"
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
    j->content_type = "application/json";
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

int api_error(api_call *c, int status, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len;
    char *body = jx_detail(msg, &len);
    c->job->park = false;
    return api_reply_take(c, status, body, len);
}

int api_db_error(api_call *c, const char *what, const char *err) {
    log_error("%s: database error: %s", what, err);
    return api_error(c, 503, "database error during %s; retry shortly", what);
}
