/* pgarray.c: PostgreSQL array literals (see pgarray.h). */
#include "common/pgarray.h"
#include <string.h>

/* A separator before every element but the first of its (sub-)array: the last byte is
 * '{' exactly when nothing was written in it yet, as no element ends in '{' (text is
 * quoted). */
static void sep(pgarray *a) {
    if (a->b.data[a->b.len - 1] != '{') sb_putc(&a->b, ',');
}

void pga_init(pgarray *a) {
    sb_init(&a->b, 64);
    sb_putc(&a->b, '{');
}

void pga_int(pgarray *a, int64_t v) {
    sep(a);
    sb_int(&a->b, v);
}

void pga_fixed(pgarray *a, double v, int decimals) {
    sep(a);
    sb_printf(&a->b, "%.*f", decimals, v);
}

void pga_textn(pgarray *a, const char *s, size_t n) {
    sep(a);
    sb_putc(&a->b, '"');
    size_t start = 0, i = 0;
    for (; i < n && s[i]; i++) {
        if (s[i] != '"' && s[i] != '\\') continue;
        sb_append(&a->b, s + start, i - start);
        sb_putc(&a->b, '\\');
        start = i;   /* the quote or backslash itself goes out with the next run */
    }
    sb_append(&a->b, s + start, i - start);
    sb_putc(&a->b, '"');
}

void pga_text(pgarray *a, const char *s) { pga_textn(a, s, strlen(s)); }

void pga_open(pgarray *a) {
    sep(a);
    sb_putc(&a->b, '{');
}

void pga_close(pgarray *a) { sb_putc(&a->b, '}'); }

char *pga_end(pgarray *a) {
    sb_putc(&a->b, '}');
    return sb_steal(&a->b, NULL);
}
