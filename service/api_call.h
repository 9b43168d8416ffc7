/* api_call.h: what a route handler sees on a database worker thread: the job, the
 * worker's own PostgreSQL connection, the caller's tenant and the parsed body; and the
 * helpers that set the response. Handlers block on libpq freely: they never run on an
 * event loop. */
#pragma once
#include "service/api_job.h"
#include <jansson.h>
#include <libpq-fe.h>
#include <stdint.h>

typedef struct api_call {
    api_job *job;
    PGconn *db;
    int64_t tenant_id;     /* 0 on routes without auth */
    int64_t key_id;
    json_t *body;          /* parsed request object; NULL on ROUTE_RAW_BODY routes */
    char err[1024];        /* scratch for messages */
} api_call;

/* Responses; each returns 0 so a handler can `return api_error(...)`. Every error body is
 * {"detail": "..."}. */
int api_reply_json(api_call *c, int status, json_t *v);          /* steals v */
int api_reply_text(api_call *c, int status, const char *json);   /* copies */
int api_reply_take(api_call *c, int status, char *json, size_t len); /* takes malloc'd */
int api_error(api_call *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A database failure: logged with `what`, answered 503 (the SDK retries 5xx). */
int api_db_error(api_call *c, const char *what, const char *err);

/* Route handlers (api_session.c, api_training.c, api_futures.c). */
int api_h_create_session(api_call *c);
int api_h_session_heartbeat(api_call *c);
int api_h_capabilities(api_call *c);
int api_h_telemetry(api_call *c);
int api_h_create_model(api_call *c);
int api_h_get_info(api_call *c);
int api_h_forward_backward(api_call *c);
int api_h_forward(api_call *c);
int api_h_optim_step(api_call *c);
int api_h_retrieve_future(api_call *c);
