/* api_routes.h: the table of Tinker routes (paths after the optional prefix). Each route
 * is answered either on the event loop (static answers, 501s) or by a database worker
 * running its handler. */
#pragma once
#include "service/api_call.h"
#include <stddef.h>

enum {
    ROUTE_NO_AUTH = 1,    /* no API key needed */
    ROUTE_INLINE = 2,     /* static answer, sent by the loop: `inline_body` */
    ROUTE_TODO = 4,       /* in the spec, not implemented yet: 501 */
    ROUTE_RAW_BODY = 8,   /* handler reads job->body itself (no JSON parse / 400) */
    ROUTE_LONG_POLL = 16, /* may park (retrieve_future) */
};

struct api_route {
    const char *method;      /* "GET", "POST", ... */
    const char *path;        /* "/api/v1/create_model"; ending in slash-star: any suffix */
    unsigned flags;
    int (*run)(api_call *c);
    const char *inline_body; /* for ROUTE_INLINE */
};

/* Finds the route for method + path (path already without the prefix and query).
 * Returns NULL with *status = 404 (no such path) or 405 (path exists, other method).
 * For wildcard routes, *arg_off is the offset of the suffix in path. */
const api_route *api_route_find(const char *method, size_t mlen, const char *path, size_t plen,
                                int *status, size_t *arg_off);
