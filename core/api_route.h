/* api_route.h: what the HTTP runtime knows of a route: its method and path pattern, how
 * it is answered (flags, and the hooks its route room sets on it), and a table of routes,
 * matched by api_route_find. The table itself is the api's (api/api_routes.c): core/
 * names no route room, each room hands it what it needs through these fields. */
#pragma once
#include <stddef.h>

typedef struct api_call api_call;   /* api_call.h: what a handler sees */
typedef struct api_route api_route;

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
    ROUTE_ADMIN = 512,    /* operators only: the key needs the 'admin' scope */
    ROUTE_METRICS = 1024, /* /metrics: the key needs the 'metrics' (or 'admin') scope */
    ROUTE_ANY_KEY = 2048, /* any valid key, operator-only keys included (console/whoami) */
    /* Answered even while the database is away: the handler runs with db NULL and no
     * tenant (the key cannot be checked) and must store nothing (telemetry). */
    ROUTE_DB_OPTIONAL = 4096,
    /* A route of the SDK that Loom does not serve (README.md, "Not implemented"): 404 that
     * says so and names the SDK method, in `inline_body`. A 4xx, not 501: the SDK retries
     * a 5xx for minutes, and a 404 it raises at once. */
    ROUTE_MISSING = 8192,
};

/* How a set of routes words its errors, when not as {"detail": "..."} (jx_detail): the
 * OpenAI routes answer in OpenAI's shape (docs/protocol.md §18.1). body is malloc'd;
 * param and code may be NULL. */
typedef struct api_error_shape {
    /* Requests under this path (after the optional prefix) that no route answers, or that
     * the loop refuses before a worker sees them (the gate, h2o's own errors), get this
     * shape too. */
    const char *path_prefix;
    char *(*body)(int status, const char *msg, const char *param, const char *code, size_t *len);
} api_error_shape;

/* An answer the loop makes from memory, without a worker (a route's serve hook). */
typedef struct {
    int status;             /* 200, 302 (location) or 404 (body is the message) */
    const char *type;       /* Content-Type */
    const char *body;
    size_t len;
    const char *location;
} api_static;

struct api_route {
    const char *method;      /* "GET", "POST", ... */
    const char *path;        /* "/api/v1/create_model"; ending in slash-star: any suffix;
                              * ending in slash-plus: exactly one more path segment */
    unsigned flags;
    int (*run)(api_call *c);
    const char *inline_body; /* for ROUTE_INLINE */

    /* Hooks its route room sets; NULL: none. */
    /* its errors in this shape (docs/protocol.md §18.1) */
    const api_error_shape *errors;
    /* answered by the loop (path: the whole path after the prefix): the web console's files */
    void (*serve)(const char *path, size_t plen, api_static *out);
    /* a body the loop stores itself instead of copying it for the worker (a signed upload's
     * PUT, docs/protocol.md §12.7; arg: the path after the route's prefix): 0, or an HTTP
     * status with msg (nothing stored) */
    int (*stage)(const char *arg, size_t arglen, const void *body, size_t len, char *msg, size_t msglen);
    /* also takes application/x-protobuf bodies (kept as bytes for the handler): the most
     * that decoding len bytes of one may take, drawn from the decode budget (api_json.h) */
    size_t (*proto_budget)(size_t len);
    /* a parked long poll woken by a notification that carried its result (job->done_note,
     * contract.h CHAN_OP_DONE) is answered from it by the loop itself, without a worker or
     * the database (c->db is NULL, c->job->tenant_id and request_id are set): 1 answered
     * (the job holds its response), 0 not (a worker answers it, reading the row) */
    int (*from_note)(api_call *c, const char *note);
    /* the loop's own first look at a new request (api_pool_first_look: c->db is NULL; the
     * key passed from the cache, c->tenant_id, c->scopes and c->body are set): 1 answered
     * from memory (the job holds its response; with job->park set the loop parks it, and
     * the job then needs no auth or parsing again: job->recheck), 0 not (a worker takes
     * the request as it came) */
    int (*first_look)(api_call *c);
};

/* A route table: the routes in matching order (the first match wins), and the error
 * shapes of the paths no route answers (NULL-terminated, or NULL). */
typedef struct {
    const api_route *routes;
    size_t n;
    const api_error_shape *const *shapes;
} api_route_table;

/* Finds the route for method + path (path already without the prefix and query).
 * Returns NULL with *status = 404 (no such path) or 405 (path exists, other method).
 * For wildcard routes, *arg_off is the offset of the suffix in path. */
const api_route *api_route_find(const api_route_table *t, const char *method, size_t mlen, const char *path,
                                size_t plen, int *status, size_t *arg_off);
/* The error shape of a path no route answers (its shape's path_prefix), or NULL. */
const api_error_shape *api_route_path_shape(const api_route_table *t, const char *path, size_t plen);
