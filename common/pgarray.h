/* pgarray.h: PostgreSQL array literals, the text form of an array parameter
 * (`$1::bigint[]`, `unnest($1::text[])`): the one builder of them in the tree.
 *
 *     pgarray a;
 *     pga_init(&a);
 *     for (...) pga_int(&a, id);
 *     char *ids = pga_end(&a);   // "{3,5,8}"; free() it
 *
 * Text elements are always double-quoted, with `"` and `\` backslash-escaped, so any
 * text reads back as itself: the empty string, `NULL`, commas, braces, spaces at either
 * end (array syntax would otherwise trim them, take NULL for a null and break on the
 * others). A text value cannot hold a NUL byte and the literal travels as a C string,
 * so an element ends at its first NUL. Bytes are passed through: an element must be
 * valid in the connection's encoding, as any text parameter must. Growth aborts on
 * memory exhaustion, as strbuf does. */
#pragma once
#include "common/strbuf.h"
#include <stddef.h>
#include <stdint.h>

typedef struct {
    strbuf b;
} pgarray;

/* Starts an empty literal ("{"). */
void pga_init(pgarray *a);
void pga_int(pgarray *a, int64_t v);
/* v with a fixed number of decimals ("%.*f"): the precision a real[] column keeps. */
void pga_fixed(pgarray *a, double v, int decimals);
void pga_text(pgarray *a, const char *s);
/* At most n bytes of s (up to its first NUL). */
void pga_textn(pgarray *a, const char *s, size_t n);
/* A sub-array (a row of a bigint[][]): elements between pga_open and pga_close. Every
 * row of a multidimensional array must have as many elements. */
void pga_open(pgarray *a);
void pga_close(pgarray *a);
/* Closes the literal and hands it over (free() it); a is empty afterwards. */
char *pga_end(pgarray *a);
