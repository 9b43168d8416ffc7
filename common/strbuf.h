/* strbuf.h: a growable, NUL-terminated byte buffer for building text (JSON payloads,
 * messages) without a DOM. Allocation failure aborts: these buffers are small next to
 * the request that caused them, and a process that cannot malloc cannot answer anyway. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *data;   /* NUL-terminated; NULL until the first append */
    size_t len;
    size_t cap;
} strbuf;

void sb_init(strbuf *b, size_t reserve);
void sb_free(strbuf *b);
/* Hands the text to the caller (free() it); the buffer is empty afterwards. */
char *sb_steal(strbuf *b, size_t *len);

void sb_append(strbuf *b, const char *s, size_t n);
void sb_puts(strbuf *b, const char *s);
void sb_putc(strbuf *b, char c);
void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_int(strbuf *b, int64_t v);
/* Text that reads back as exactly the same float / double (short when a short form
 * does). The value must be finite (JSON has no inf/nan). */
void sb_float(strbuf *b, float v);
void sb_double(strbuf *b, double v);
/* As sb_double, but always in a form JSON readers take as a real ("1.0", not "1"), for
 * payload fields whose readers ask for a real. */
void sb_real(strbuf *b, double v);
/* s as a JSON string literal, quotes included; bytes that are not valid UTF-8 become
 * U+FFFD so the output is always valid JSON. */
void sb_json_str(strbuf *b, const char *s);

/* UTF-8 as PostgreSQL and JSON take it: shortest forms, no surrogates, <= U+10FFFF.
 * utf8_seq_len: length of the valid sequence at p (at most avail bytes; ASCII is 1), or
 * 0; its code point in *cp (may be NULL). utf8_valid: all n bytes are valid UTF-8. */
size_t utf8_seq_len(const unsigned char *p, size_t avail, uint32_t *cp);
bool utf8_valid(const char *s, size_t n);
