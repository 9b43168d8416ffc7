/* http_server.h: the h2o side of the api process: N event-loop threads on one port
 * (SO_REUSEPORT), routing (the table in http_conf), handing jobs to the database workers
 * and answering when they come back, long-poll parking for retrieve_future, JSON bodies
 * for h2o's own errors, and the loop extensions of route rooms that answer on the loop. */
#pragma once
#include "core/api_pool.h"
#include "core/api_route.h"
#include "core/http_h2o.h"
#include <stddef.h>
#include <stdint.h>

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
    const api_route_table *routes;
    /* gate_conf.signed_body (http_gate.h): the signed links whose requests need no key
     * for their body (adapter uploads); NULL: none. */
    int (*signed_body)(const char *method, size_t mlen, const char *path, size_t plen, size_t len,
                       int64_t *key_id, char *msg, size_t msglen);
} http_conf;

/* Opens the listeners and starts the loops; returns once every loop is running, with the
 * bound port in *port_out. 0 or -1 with err. */
int http_server_start(const http_conf *conf, api_pool *pool, int *port_out, char *err,
                      size_t errlen);
/* A NOTIFY loom_op_done arrived (any thread): wakes parked futures with this request_id
 * (the payload up to its first tab; the whole payload goes to the woken job as its
 * done_note when there is more); NULL wakes them all (the LISTEN connection was
 * re-established). */
void http_server_notify(const char *payload, void *unused);
/* Sends a job the loop made itself (a loop extension's, http_gate.c's) to a database
 * worker; it comes back to L like a request's. -1 when the workers' queue is full. Loop
 * thread. */
typedef struct http_loop http_loop;
int http_loop_submit(http_loop *L, api_job *job);

/* ---- loop extensions ----------------------------------------------------------------------
 * A route room that answers some of its requests on the event loop itself (openai/: a
 * completion streamed as its tokens arrive) registers here, before http_server_start.
 * Each loop calls loop_init once on its own thread, before it serves, and keeps the
 * state it returns in its h2o context (h2o_context_t's storage, one slot per extension);
 * the loop hands that state back with each call below. */
typedef struct http_loop_ext {
    void *(*loop_init)(http_loop *L, h2o_evloop_t *evloop, h2o_multithread_queue_t *queue);
    /* A job of this extension (job->loop_ext) came back from its worker: an accepted
     * request (req: its h2o request, NULL when the client went away meanwhile) or one of
     * the extension's own jobs. Takes the job. */
    void (*job_back)(void *state, api_job *job, h2o_req_t *req);
    /* NOTIFY loom_op_done for request_id arrived (NULL: some may have been missed). NULL:
     * not wanted. */
    void (*op_done)(void *state, const char *request_id);
    /* Frees a job's ext (api_job_free). */
    void (*ext_free)(void *ext);
} http_loop_ext;
/* 0, or -1 when HTTP_MAX_LOOP_EXTS are registered already. */
#define HTTP_MAX_LOOP_EXTS 4
int http_loop_ext_add(const http_loop_ext *ext);
/* Waits for the loop threads (they run until the process ends). */
void http_server_join(void);
