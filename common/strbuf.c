/* strbuf.c: growable text buffer (see strbuf.h). */
#include "common/strbuf.h"
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void sb_reserve(strbuf *b, size_t extra) {
    if (b->data && b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        fprintf(stderr, "strbuf: out of memory (%zu bytes)\n", cap);
        abort();
    }
    b->data = p;
    b->cap = cap;
}

void sb_init(strbuf *b, size_t reserve) {
    b->data = NULL;
    b->len = b->cap = 0;
    sb_reserve(b, reserve);
    b->data[0] = 0;
}

void sb_free(strbuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

char *sb_steal(strbuf *b, size_t *len) {
    sb_reserve(b, 0);
    char *p = b->data;
    if (len) *len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

void sb_append(strbuf *b, const char *s, size_t n) {
    sb_reserve(b, n);
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void sb_puts(strbuf *b, const char *s) { sb_append(b, s, strlen(s)); }

void sb_putc(strbuf *b, char c) {
    sb_reserve(b, 1);
    b->data[b->len++] = c;
    b->data[b->len] = 0;
}

void sb_printf(strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    sb_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void sb_int(strbuf *b, int64_t v) {
    char tmp[24];
    char *end = tmp + sizeof tmp, *p = end;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *--p = '-';
    sb_append(b, p, (size_t)(end - p));
}

/* The short form when it reads back as the same value (0, 1, 0.5, 0.1, 1e-4, ...), else
 * the long one, which always does. Literal formats: glibc's "%.*g" takes a slow path. */
void sb_float(strbuf *b, float v) {
    char tmp[40];
    int n = snprintf(tmp, sizeof tmp, "%.6g", (double)v);
    if ((float)strtod(tmp, NULL) != v) n = snprintf(tmp, sizeof tmp, "%.9g", (double)v);
    sb_append(b, tmp, (size_t)n);
}

void sb_double(strbuf *b, double v) {
    char tmp[40];
    int n = snprintf(tmp, sizeof tmp, "%.15g", v);
    if (strtod(tmp, NULL) != v) n = snprintf(tmp, sizeof tmp, "%.17g", v);
    sb_append(b, tmp, (size_t)n);
}

void sb_real(strbuf *b, double v) {
    size_t at = b->len;
    sb_double(b, v);
    if (!strpbrk(b->data + at, ".eEni")) sb_puts(b, ".0");
}

size_t utf8_seq_len(const unsigned char *p, size_t avail, uint32_t *cp_out) {
    size_t n;
    uint32_t min, cp;
    if (p[0] < 0x80) n = 1, cp = p[0], min = 0;
    else if (p[0] >= 0xc2 && p[0] <= 0xdf) n = 2, cp = p[0] & 0x1f, min = 0x80;
    else if (p[0] >= 0xe0 && p[0] <= 0xef) n = 3, cp = p[0] & 0x0f, min = 0x800;
    else if (p[0] >= 0xf0 && p[0] <= 0xf4) n = 4, cp = p[0] & 0x07, min = 0x10000;
    else return 0;
    if (n > avail) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    if (cp_out) *cp_out = cp;
    return n;
}

bool utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq_len(p + i, n - i, NULL);
        if (!k) return false;
        i += k;
    }
    return true;
}

void sb_json_str(strbuf *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    sb_putc(b, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        switch (c) {
        case '"': sb_append(b, "\\\"", 2); break;
        case '\\': sb_append(b, "\\\\", 2); break;
        case '\n': sb_append(b, "\\n", 2); break;
        case '\r': sb_append(b, "\\r", 2); break;
        case '\t': sb_append(b, "\\t", 2); break;
        default:
            if (c < 0x20) {
                char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
                sb_append(b, u, 6);
            } else if (c < 0x80) {
                sb_putc(b, (char)c);
            } else {
                size_t n = utf8_seq_len(p, 4, NULL); /* a NUL ends a short sequence */
                if (n) {
                    sb_append(b, (const char *)p, n);
                    p += n - 1;
                } else {
                    sb_append(b, "\\ufffd", 6); /* keep the output valid UTF-8 */
                }
            }
        }
    }
    sb_putc(b, '"');
}
