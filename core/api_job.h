/* api_job.h: one HTTP request on its way from an event loop to a database worker and
 * back. The loop copies what the worker needs (body, key, Accept) so the worker never
 * touches h2o memory; the worker fills in the response; the job comes back to its loop
 * through h2o_multithread. A retrieve_future that is not ready yet is "parked": the job
 * stays in its loop and is sent to a worker again on a NOTIFY or after 1 s. */
#pragma once
#include "core/http_h2o.h"
#include <stdbool.h>
#include <stdint.h>

typedef struct api_route api_route;
typedef struct http_loop http_loop;
typedef struct http_req_ref http_req_ref;

#define API_REQUEST_ID_MAX 128
#define API_LOG_ID_MAX 72
#define API_TENANT_NAME_MAX 132

enum { JOB_AT_WORKER, JOB_PARKED };

typedef struct api_job {
    h2o_multithread_message_t msg;   /* link in the loop's queue while coming back */
    h2o_multithread_receiver_t *reply_to;
    http_loop *loop;
    const api_route *route;

    /* request, copied out of h2o memory */
    char *body;
    size_t body_len;
    char *api_key;      /* X-API-Key, or the token of "Authorization: Bearer"; NULL if none */
    char *accept;       /* Accept header or NULL */
    char *content_type; /* Content-Type header or NULL */
    char *content_encoding; /* Content-Encoding header or NULL */
    char *path_arg;     /* for wildcard routes: the rest of the path; else NULL */
    char *query;        /* the query string after '?', or NULL */
    char *base_url;     /* "<scheme>://<host><prefix>" as the client reached us (absolute links) */
    char *range;        /* Range header or NULL (archive downloads) */

    /* response, filled by the worker */
    int status;
    char *resp;         /* malloc'd body */
    size_t resp_len;
    const char *resp_type;   /* Content-Type of resp (static string) */
    int retry_after;         /* > 0: send Retry-After with this many seconds */
    char *location;          /* malloc'd Location header (redirects) or NULL */
    char *expires;           /* malloc'd Expires header or NULL */
    char *resp_headers;      /* malloc'd further headers, "name: value\n" each, or NULL */
    bool park;          /* retrieve_future: not ready; resp holds the try_again answer */

    /* retrieve_future long-poll state (set by the worker on the first pass) */
    bool recheck;       /* skip auth and parsing: tenant_id and request_id are known */
    int64_t tenant_id;
    char request_id[API_REQUEST_ID_MAX];   /* also the key a NOTIFY wakes the parked job by */
    char *recheck_arg;  /* malloc'd: what else a long poll's later looks need (retrieve_futures) */
    char *done_note;    /* malloc'd: the loom_op_done payload that woke the parked job, when
                           it carries the result (contract.h, CHAN_OP_DONE), or NULL */
    uint32_t hold_ms;   /* > 0: park at most this long (else the loop's 25 s) */

    /* for the access log and metrics (api_metrics.h) */
    char log_id[API_LOG_ID_MAX];   /* X-Request-Id: the client's, or one made here */
    char tenant_name[API_TENANT_NAME_MAX];  /* set by the worker once the key is checked */
    double started;                /* wall clock (s) when h2o began reading the request */

    /* A job a loop extension answers (http_server.h: http_loop_ext; the OpenAI routes):
     * set by a handler that accepted a request (ext: what its loop needs to answer it,
     * freed with the job by loop_ext->ext_free), or on the extension's own jobs; NULL
     * otherwise. */
    const struct http_loop_ext *loop_ext;
    void *ext;

    /* The gate (http_gate.h). gate_auth: this job only checks api_key, before the body
     * of gate_conn's request is read (the worker sets status 200, 401 or 503, resp the
     * reason, key_id); gate_conn is NULL once that connection closed. hold: the request
     * body's reservation, released with the job. */
    bool gate_auth;
    struct gate_conn *gate_conn;
    int64_t key_id;
    struct gate_hold *hold;

    /* loop-thread-only state */
    http_req_ref *ref;  /* NULL once the client has gone away */
    int where;
    uint64_t deadline_ms;     /* loop clock: answer try_again after this */
    uint64_t dispatched_ms;   /* loop clock when last sent to a worker */
    h2o_timeout_entry_t timer;
    h2o_linklist_t parked;
} api_job;

void api_job_free(api_job *job);
