/* http_server.h: the h2o side of the api process: N event-loop threads on one port
 * (SO_REUSEPORT), routing, handing jobs to the database workers and answering when they
 * come back, long-poll parking for retrieve_future, JSON bodies for h2o's own errors. */
#pragma once
#include "core/api_pool.h"
#include <stddef.h>

typedef struct {
    const char *host;
    int port;                /* 0 = any free port */
    int nthreads;
    size_t max_body;         /* bytes; larger bodies get 413 */
    size_t inflight_total;   /* bytes of request bodies in flight at most (http_gate.h) */
    size_t inflight_per_key; /* ... of one API key */
    const char *tls_cert, *tls_key;   /* both or neither */
    const char *prefix;      /* "" or "/x/y": optional path prefix before /api/v1 */
    const char *spool_dir;   /* NULL, or where h2o maps the files of large request bodies */
} http_conf;

/* Opens the listeners and starts the loops; returns once every loop is running, with the
 * bound port in *port_out. 0 or -1 with err. */
int http_server_start(const http_conf *conf, api_pool *pool, int *port_out, char *err,
                      size_t errlen);
/* A NOTIFY loom_op_done arrived (any thread): wakes parked futures with this request_id;
 * NULL wakes them all (the LISTEN connection was re-established). */
void http_server_notify(const char *request_id, void *unused);
/* Sends a job the loop made itself (api_openai_stream.c) to a database worker; it comes
 * back to L like a request's. -1 when the workers' queue is full. Loop thread. */
typedef struct http_loop http_loop;
int http_loop_submit(http_loop *L, api_job *job);
/* Waits for the loop threads (they run until the process ends). */
void http_server_join(void);
