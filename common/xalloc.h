/* xalloc.h: allocation that aborts on failure, for code that builds from input whose size
 * was bounded before (the request decoders of service/): as with strbuf, a process that
 * cannot allocate a bounded request's arrays cannot answer anyway, and a NULL check at
 * every call would only hide the bound. */
#pragma once
#include <stdlib.h>
#include <string.h>

/* calloc(n, size), and one item when n is 0 (a valid pointer to free, never NULL). */
static inline void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) abort();
    return p;
}

static inline char *xstrdup(const char *s) {
    char *p = strdup(s);
    if (!p) abort();
    return p;
}
