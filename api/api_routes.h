/* api_routes.h: the table of Tinker routes (paths after the optional prefix). Each route
 * is answered either on the event loop (static answers, 501s) or by a database worker
 * running its handler. */
#pragma once
#include "core/api_call.h"
#include <stddef.h>

enum {
    ROUTE_NO_AUTH = 1,    /* no API key needed */
    ROUTE_INLINE = 2,     /* static answer, sent by the loop: `inline_body` */
    ROUTE_TODO = 4,       /* in the protocol, not implemented yet: 501 */
    ROUTE_RAW_BODY = 8,   /* handler reads job->body itself (no JSON parse / 400) */
    ROUTE_LONG_POLL = 16, /* may park (retrieve_future) */
    /* Key scopes. GET routes and ROUTE_READ routes take any key; ROUTE_SAMPLE routes need
     * the 'sample' scope; every other authenticated route (the submits and mutations)
     * needs 'train'. A key without the scope gets 403. */
    ROUTE_READ = 32,
    ROUTE_SAMPLE = 64,
    ROUTE_PROTO_BODY = 128, /* also takes application/x-protobuf bodies (kept as bytes) */
    ROUTE_STATIC = 256,   /* a file of the web console, sent by the loop (api_console.h) */
    ROUTE_ADMIN = 512,    /* operators only: the key needs the 'admin' scope */
    ROUTE_METRICS = 1024, /* /metrics: the key needs the 'metrics' (or 'admin') scope */
    ROUTE_ANY_KEY = 2048, /* any valid key, operator-only keys included (console/whoami) */
    /* Answered even while the database is away: the handler runs with db NULL and no
     * tenant (the key cannot be checked) and must store nothing (telemetry). */
    ROUTE_DB_OPTIONAL = 4096,
    ROUTE_OPENAI = 8192,  /* errors in OpenAI's shape {"error": {...}} (docs/protocol.md §18.1) */
    /* A signed upload (PUT, docs/protocol.md §12.7): the loop checks the link and writes
     * the body to a staged file in the blob store (api_upload_stage) instead of copying
     * it for the worker, which then records it. */
    ROUTE_UPLOAD = 16384,
};

struct api_route {
    const char *method;      /* "GET", "POST", ... */
    const char *path;        /* "/api/v1/create_model"; ending in slash-star: any suffix;
                              * ending in slash-plus: exactly one more path segment */
    unsigned flags;
    int (*run)(api_call *c);
    const char *inline_body; /* for ROUTE_INLINE */
};

/* The client/config answer (a NUL-terminated JSON object). */
extern char api_client_config[512];
/* Its flags of the sampling routes (one place for both forms of the answer). */
#define API_CLIENT_CONFIG_SAMPLE_FLAGS "\"sample_use_retrieve_futures\": true, \"sample_join_sampling_session\": true"

/* The table, for per-route metrics: its size, the route at i, and the index of r. */
size_t api_route_count(void);
const api_route *api_route_at(size_t i);
size_t api_route_index(const api_route *r);

/* Finds the route for method + path (path already without the prefix and query).
 * Returns NULL with *status = 404 (no such path) or 405 (path exists, other method).
 * For wildcard routes, *arg_off is the offset of the suffix in path. */
const api_route *api_route_find(const char *method, size_t mlen, const char *path, size_t plen,
                                int *status, size_t *arg_off);
