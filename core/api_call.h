/* api_call.h: what a route handler sees on a database worker thread: the job, the
 * worker's own PostgreSQL connection, the caller's tenant and the parsed body; and the
 * helpers that set the response. Handlers block on libpq freely: they never run on an
 * event loop. */
#pragma once
#include "core/api_job.h"
#include <jansson.h>
#include <stdarg.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Process-wide settings the handlers read (from `loom api` flags). */
typedef struct {
    int64_t max_queued_samples;  /* asample answers 429 above this many queued per tenant */
    size_t max_body;             /* bytes; also the cap on a decompressed body */
    int64_t max_streams;         /* OpenAI requests in flight per tenant (429 above) */
    int64_t openai_max_tokens;   /* the largest max_tokens of an OpenAI request */
    int64_t executor_timeout_s;  /* an executor that beat within this serves its base model */
    double storage_usd_per_gb_month;  /* checkpoint storage price (billing/usage/...), 0 = free */
} api_settings;

/* API key scopes (api_keys.scopes). admin: an operator (every tenant in the console's
 * operator view, /metrics); metrics: may scrape /metrics and nothing else. */
enum { SCOPE_TRAIN = 1, SCOPE_SAMPLE = 2, SCOPE_READ = 4, SCOPE_ADMIN = 8, SCOPE_METRICS = 16 };

typedef struct api_call {
    api_job *job;
    PGconn *db;
    const api_settings *settings;
    int64_t tenant_id;     /* 0 on routes without auth */
    int64_t key_id;
    unsigned scopes;       /* SCOPE_* of the key */
    json_t *body;          /* parsed request object; NULL on ROUTE_RAW_BODY routes and on
                            * protobuf bodies (job->body holds the decoded bytes then) */
    bool proto_body;       /* the body is application/x-protobuf (routes with proto_budget) */
    char err[1024];        /* scratch for messages */
} api_call;

/* Responses; each returns 0 so a handler can `return api_error(...)`. Every error body is
 * {"detail": "..."}. */
int api_reply_json(api_call *c, int status, json_t *v);          /* steals v */
int api_reply_text(api_call *c, int status, const char *json);   /* copies */
int api_reply_take(api_call *c, int status, char *json, size_t len); /* takes malloc'd */
/* A binary body (takes malloc'd bytes) with its Content-Type (a static string). */
int api_reply_bytes(api_call *c, int status, const char *content_type, void *data, size_t len);
int api_error(api_call *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same with the field (param) and a code for a route whose errors take another shape
 * (api_route.h: api_error_shape; OpenAI's, docs/protocol.md §18.1); NULL: none. */
int api_error_v(api_call *c, int status, const char *param, const char *code, const char *fmt, va_list ap);
/* A database failure: logged with `what`, answered 503 (the SDK retries 5xx). On a
 * long-poll route (retrieve_future) the answer is held instead: the loop parks the job
 * and tries it again every second, and sends the 503 only at the long-poll deadline,
 * because the SDK re-polls a 5xx at once (a database outage would otherwise draw
 * thousands of requests a minute from each waiting client). */
int api_db_error(api_call *c, const char *what, const char *err);

/* Runs sql with ($1 id, $2 the caller's tenant): its row when it has one; else NULL with
 * the answer sent: 404 "<noun> <id> not found", or 503 on a database error (logged with
 * what). */
PGresult *api_tenant_row(api_call *c, const char *what, const char *sql, const char *id, const char *noun);
/* Runs a statement whose one cell is the whole JSON answer: 200 with it, 404 with
 * not_found when there is no row, 503 on a database error. */
int api_reply_sql_json(api_call *c, const char *what, const char *sql, int n,
                       const char *const *params, const char *not_found);

/* "%lld" of v, for bound parameters. */
void api_fmt_i64(char out[24], int64_t v);
/* The path suffix of a wildcard route (an id), percent-decoded in place; "" if none. */
const char *api_path_id(api_call *c);
/* Query parameter `name` (decoded, cut to outlen - 1 bytes) into out; 1 if present ("?name"
 * alone is present and empty), 0 if not. */
int api_query_param(api_call *c, const char *name, char *out, size_t outlen);
/* ?limit= (default def_limit, 1 … max_limit) and &offset= (default 0, 0 … 2^31 - 1) of a
 * listing (docs/protocol.md §12.2). 0, or -1 with the 400 answered. */
int api_page_params(api_call *c, int64_t def_limit, int64_t max_limit, int64_t *limit, int64_t *offset);
/* Decodes %XX and '+' in place; returns the new length. */
size_t api_url_decode(char *s);
/* The path suffix and the query string must be UTF-8 once percent-decoded (they end up
 * in SQL parameters and JSON answers). 0, or -1 with the 400 answered. */
int api_check_request_text(api_call *c);
