/* http_gate.h: what the api decides about a request from its head alone, before h2o reads
 * its body (docs/architecture.md, "The api's gate").
 *
 * h2o 2.2 reads a request's whole body into memory before a handler sees the request:
 * 32 concurrent 60 MB POSTs without a key took 1.1 GB before the first 401. The gate sits
 * between the socket and h2o's HTTP/1 parser (it is the socket's read callback while a
 * request head is being read, and hands the bytes on to h2o's own callback once it has
 * decided), and for every request:
 *
 * - refuses ambiguous framing (two different Content-Length headers, Content-Length with
 *   Transfer-Encoding, more than one Transfer-Encoding: a request smuggled in the
 *   "body" would otherwise be served as a second request): 400, connection closed;
 * - refuses a declared body over --max-body-mb: 413;
 * - checks the API key (on a database worker) of a request whose body is larger than
 *   GATE_FREE_BODY or chunked, before reading it: 401 without a valid key; a signed
 *   upload link stands for the key (gate_conf.signed_body);
 * - counts the bytes of bodies in flight, per key (--max-inflight-mb-per-key: 429) and in
 *   all (--max-inflight-mb: 503), from the head until the request is answered and its job
 *   freed (gate_hold).
 *
 * A refused request is answered by on_req as usual (JSON body, access log): the gate hands
 * h2o the request's head without its body and a verdict for gate_request. Its body is
 * then read and dropped as it arrives (Content-Length), never kept, so that the client
 * reads the answer; a chunked one closes the connection.
 *
 * All on the loop thread, but for gate_hold_release (any thread). */
#pragma once
#include "core/api_job.h"
#include "core/http_h2o.h"
#include <stddef.h>
#include <stdint.h>

/* Bodies up to this size need no key checked before they are read (they still count). */
#define GATE_FREE_BODY (64 * 1024)

typedef struct {
    size_t max_body;           /* --max-body-mb */
    size_t inflight_total;     /* --max-inflight-mb */
    size_t inflight_per_key;   /* --max-inflight-mb-per-key */
    /* Optional: whether a request may send a large body without a key because its path
     * is a signed link (an adapter upload's PUT, api_upload.c); len is its declared
     * length (0 when chunked). 0 with *key_id, the key the link was made for (the body
     * counts in its share); 1 when it is no such link (the key rule applies); or the HTTP
     * status to refuse it with, and msg. No database: the loop thread calls it. */
    int (*signed_body)(const char *method, size_t mlen, const char *path, size_t plen, size_t len,
                       int64_t *key_id, char *msg, size_t msglen);
    /* Sends an auth job to a database worker from loop L (http_server.c: http_loop_submit);
     * -1 when the workers' queue is full. */
    int (*submit)(http_loop *L, api_job *job);
} gate_conf;

/* Once, before the loops start. */
void gate_init(const gate_conf *conf);

typedef struct gate_loop gate_loop;
/* Per event loop (its thread): auth jobs go through gate_conf.submit and come back to
 * gate_auth_back. */
gate_loop *gate_loop_new(http_loop *L, h2o_evloop_t *evloop, h2o_accept_ctx_t *actx);

/* A connection accepted on gl's listener, in place of h2o_accept (TLS: the handshake,
 * then HTTP/1.1; HTTP/2 is not offered, as h2o 2.2 reads its streams' bodies whole). */
void gate_accept(gate_loop *gl, h2o_socket_t *sock);

/* The body reservation of one request (refcounted: the request, and its job). */
typedef struct gate_hold gate_hold;
gate_hold *gate_hold_ref(gate_hold *h);
void gate_hold_release(gate_hold *h);   /* NULL is fine */

/* The first thing on_req does: 0, the request may go on (*hold: its body's reservation,
 * for its job to take a reference of; NULL when none), or the status to answer instead
 * with msg (and *retry_after > 0: the Retry-After header). Also arranges for the gate to
 * read the connection's next request head. */
int gate_request(h2o_req_t *req, gate_hold **hold, int *retry_after, char *msg, size_t msglen);

/* An auth job (job->gate_auth) came back from its worker. */
void gate_auth_back(api_job *job);

/* Bytes of request bodies in flight now (the /metrics gauge). */
size_t gate_inflight_bytes(void);
