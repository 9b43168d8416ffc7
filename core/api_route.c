/* api_route.c: matching a request's method and path against a route table (see
 * api_route.h). */
#include "core/api_route.h"
#include <stdbool.h>
#include <string.h>

/* 0: no match; 1: match (suffix offset in *arg_off for wildcards). A "+" segment inside
 * a pattern ("/sessions/+/finish") is one path segment; the suffix then starts there. */
static int path_matches(const char *pattern, const char *path, size_t plen, size_t *arg_off) {
    size_t n = strlen(pattern);
    const char *mid = strstr(pattern, "/+/");
    if (mid) {
        size_t base = (size_t)(mid - pattern) + 1, tail = n - base - 1;   /* tail: "/finish" */
        if (plen <= base + tail || memcmp(pattern, path, base) != 0 ||
            memcmp(pattern + base + 1, path + plen - tail, tail) != 0 ||
            memchr(path + base, '/', plen - tail - base))
            return 0;
        *arg_off = base;
        return 1;
    }
    if (n >= 2 && pattern[n - 2] == '/' && (pattern[n - 1] == '*' || pattern[n - 1] == '+')) {
        size_t base = n - 1; /* includes the '/' */
        if (plen <= base || memcmp(pattern, path, base) != 0) return 0;
        if (pattern[n - 1] == '+' && memchr(path + base, '/', plen - base)) return 0;
        *arg_off = base;
        return 1;
    }
    *arg_off = 0;
    return plen == n && memcmp(pattern, path, n) == 0;
}

const api_route *api_route_find(const api_route_table *t, const char *method, size_t mlen, const char *path,
                                size_t plen, int *status, size_t *arg_off) {
    bool path_known = false;
    /* HEAD is answered like GET (h2o drops the body). */
    if (mlen == 4 && !memcmp(method, "HEAD", 4)) method = "GET", mlen = 3;
    for (size_t i = 0; i < t->n; i++) {
        const api_route *r = &t->routes[i];
        size_t off;
        if (!path_matches(r->path, path, plen, &off)) continue;
        path_known |= !(r->flags & ROUTE_TODO);
        if (strlen(r->method) == mlen && !memcmp(r->method, method, mlen)) {
            *arg_off = off;
            return r;
        }
    }
    *status = path_known ? 405 : 404;
    return NULL;
}

const api_error_shape *api_route_path_shape(const api_route_table *t, const char *path, size_t plen) {
    for (const api_error_shape *const *s = t->shapes; s && *s; s++) {
        size_t n = strlen((*s)->path_prefix);
        if (plen >= n && !memcmp(path, (*s)->path_prefix, n)) return *s;
    }
    return NULL;
}
