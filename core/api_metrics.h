/* api_metrics.h: what the api counts about its own requests (per process), the one
 * access-log line per request, and GET /metrics (Prometheus text format 0.0.4).
 *
 * Two kinds of series (docs/operating.md "Metrics"):
 *  - per api process, counted here in memory: loom_http_* (requests by route pattern and
 *    status, latency by route, in flight). Behind a balancer each api is its own scrape
 *    target; add them up (sum without(instance)).
 *  - of the whole deployment, read from PostgreSQL at scrape time by bounded, indexed
 *    queries (the queue, live executors, the registry) and from the folded event totals
 *    of migrations/0007 (operation latencies, cycles, tokens per tenant). Every api
 *    answers the same values for these; take one (max without(instance)), never a sum. */
#pragma once
#include "core/api_call.h"
#include "core/api_route.h"
#include <stdbool.h>
#include <stddef.h>

/* Sizes the per-route counters (one per route of t, which must outlive the process's
 * requests: every api_access.route is one of its routes); call once before the loops
 * start. */
void api_metrics_init(const api_route_table *t);
/* Starts the thread that folds metric events every 15 s on its own connection, so the
 * event tables stay small when nobody scrapes. 0, or -1 with err. */
int api_metrics_start_folding(const char *conninfo, char *err, size_t errlen);

/* One finished request. */
typedef struct {
    const api_route *route;   /* NULL: no route matched (route="unmatched") */
    bool by_h2o;              /* answered by h2o itself (a body over the limit, a bad request line) */
    const char *method;       /* as sent (printable), for unmatched requests */
    int status;               /* 499: the client went away before the answer */
    const char *tenant;       /* "" before (or without) a key check */
    const char *log_id;       /* X-Request-Id */
    double seconds;
    const char *reason;       /* why a 4xx/5xx (the message the client got), or NULL */
} api_access;

/* Counts the request and writes its access-log line (info; warn for 5xx). Any thread. */
void api_observe(const api_access *a);
/* The same for a job coming back from a worker: the reason is the message of its error body. */
void api_observe_job(const api_job *job, int status, double now);
/* The same for an answer whose body is not job->resp (the OpenAI routes' loop). */
void api_observe_answer(const api_job *job, int status, double now, const char *body, size_t len);
/* Requests being answered now (+1 when one arrives, -1 when it is answered). */
void api_metrics_in_flight(int delta);

/* X-Request-Id of a request: the client's when it is 1-64 characters of [A-Za-z0-9._:-],
 * else a new random one. out holds API_LOG_ID_MAX bytes. */
void api_log_id(const char *client, size_t len, char *out);

int api_h_metrics(api_call *c);
