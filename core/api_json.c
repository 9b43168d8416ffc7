/* api_json.c: tolerant field access on parsed request bodies (see api_json.h). */
#include "core/api_json.h"
#include "common/strbuf.h"
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* Parsing memory: jansson's allocations while it parses one body are counted against a
 * budget proportional to the body, so that small text that builds a huge tree (millions
 * of empty arrays or objects) fails with a 413 before the memory is taken. Numbers as
 * short as "1," cost about 20 bytes per byte of text; JX_PARSE_FACTOR leaves room.
 * That budget is taken up front from one for the whole process (--max-decode-mb), shared
 * with the zstd decoder's output (jx_decode_take): four 33 MB bodies parsed at once took
 * 2.9 GB. Up front, so that concurrent parses cannot each take part of it and all fail (a
 * body that does not get its budget now answers 503 before any work); what the tree did
 * not use goes back when the parse ends, the rest once the handler is done
 * (jx_decode_release). */
#define JX_PARSE_FACTOR 24
#define JX_PARSE_BASE (1u << 20)
static __thread bool t_limited, t_exceeded;
static __thread size_t t_budget, t_drawn;
static size_t g_decode_limit = SIZE_MAX;
static atomic_size_t g_decode_used;

bool jx_decode_take(size_t n) {
    size_t used = atomic_fetch_add(&g_decode_used, n) + n;
    if (used > g_decode_limit || used < n) {
        atomic_fetch_sub(&g_decode_used, n);
        return false;
    }
    t_drawn += n;
    return true;
}

void jx_decode_release(void) {
    atomic_fetch_sub(&g_decode_used, t_drawn);
    t_drawn = 0;
}

size_t jx_decode_limit(void) { return g_decode_limit; }

static void *budget_malloc(size_t n) {
    if (t_limited) {
        if (n > t_budget) {
            t_exceeded = true;
            return NULL;
        }
        t_budget -= n;
    }
    return malloc(n);
}

void jx_init(size_t decode_limit) {
    g_decode_limit = decode_limit ? decode_limit : SIZE_MAX;
    json_set_alloc_funcs(budget_malloc, free);
}

json_t *jx_parse_body(const char *body, size_t len, char *err, size_t errlen, int *status) {
    size_t i = 0;
    *status = 400;
    while (i < len && (body[i] == ' ' || body[i] == '\n' || body[i] == '\r' || body[i] == '\t')) i++;
    if (i == len) return json_object();
    json_error_t je;
    size_t budget = JX_PARSE_BASE + JX_PARSE_FACTOR * len;
    if (budget > g_decode_limit) budget = g_decode_limit;
    if (!jx_decode_take(budget)) {
        snprintf(err, errlen, "server busy: other request bodies being decoded hold the memory for it (loom api "
                              "--max-decode-mb %zu); retry shortly", g_decode_limit >> 20);
        *status = 503;
        return NULL;
    }
    t_budget = budget;
    t_exceeded = false;
    t_limited = true;
    /* No JSON_ALLOW_NUL: PostgreSQL can store no NUL character (text or jsonb), so a
     * \u0000 anywhere is refused here, once, instead of by each field or the database. */
    json_t *v = json_loadb(body, len, 0, &je);
    t_limited = false;
    /* what the tree did not take goes back at once */
    atomic_fetch_sub(&g_decode_used, t_budget);
    t_drawn -= t_budget;
    if (!v && t_exceeded) {
        snprintf(err, errlen, "request body is too complex: parsing its %zu bytes of JSON would "
                              "take more than %zu MiB of memory (split the request)", len, budget >> 20);
        *status = 413;
        return NULL;
    }
    if (!v) {
        if (strstr(je.text, "\\u0000"))
            snprintf(err, errlen, "malformed JSON in request body at line %d, column %d: strings "
                                  "must not contain \\u0000 (NUL characters)", je.line, je.column);
        else
            snprintf(err, errlen, "malformed JSON in request body at line %d, column %d: %s",
                     je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(v)) {
        snprintf(err, errlen, "request body must be a JSON object, got %s", jx_type_name(v));
        json_decref(v);
        return NULL;
    }
    return v;
}

const char *jx_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

static const char *dot(const char *where) { return where && *where ? "." : ""; }

static int type_err(const char *where, const char *key, const char *want, const json_t *v,
                    char *err, size_t errlen) {
    snprintf(err, errlen, "%s%s%s: expected %s, got %s", where ? where : "", dot(where), key, want,
             jx_type_name(v));
    return -1;
}

bool jx_as_int(const json_t *v, int64_t *out) {
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && d >= -9.2e18 && d <= 9.2e18) {
            *out = (int64_t)d;
            return true;
        }
    }
    return false;
}

int jx_int(const json_t *obj, const char *where, const char *key, int64_t def, int64_t *out,
           bool *present, char *err, size_t errlen) {
    json_t *v = json_object_get(obj, key);
    if (present) *present = false;
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!jx_as_int(v, out)) return type_err(where, key, "an integer", v, err, errlen);
    if (present) *present = true;
    return 0;
}

int jx_num(const json_t *obj, const char *where, const char *key, double def, double *out,
           char *err, size_t errlen) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return type_err(where, key, "a number", v, err, errlen);
    *out = json_number_value(v);
    if (!isfinite(*out)) {
        snprintf(err, errlen, "%s%s%s: must be a finite number", where, dot(where), key);
        return -1;
    }
    return 0;
}

int jx_bool(const json_t *obj, const char *where, const char *key, bool def, bool *out,
            char *err, size_t errlen) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return type_err(where, key, "true or false", v, err, errlen);
    *out = json_is_true(v);
    return 0;
}

int jx_str(const json_t *obj, const char *where, const char *key, const char **out, char *err,
           size_t errlen) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return type_err(where, key, "a string", v, err, errlen);
    *out = json_string_value(v);
    return 0;
}

int jx_req_str(const json_t *obj, const char *where, const char *key, const char **out,
               char *err, size_t errlen) {
    if (jx_str(obj, where, key, out, err, errlen) < 0) return -1;
    if (!*out || !**out) {
        snprintf(err, errlen, "%s%s%s is required", where, dot(where), key);
        return -1;
    }
    return 0;
}

int jx_obj(const json_t *obj, const char *where, const char *key, json_t **out, char *err,
           size_t errlen) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return type_err(where, key, "an object", v, err, errlen);
    *out = v;
    return 0;
}

int jx_arr(const json_t *obj, const char *where, const char *key, json_t **out, char *err,
           size_t errlen) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return type_err(where, key, "an array", v, err, errlen);
    *out = v;
    return 0;
}

char *jx_detail(const char *msg, size_t *len) {
    strbuf b;
    sb_init(&b, strlen(msg) + 16);
    sb_puts(&b, "{\"detail\": ");
    sb_json_str(&b, msg);
    sb_putc(&b, '}');
    return sb_steal(&b, len);
}

char *jx_dump_bounded(const json_t *v, const char *what, size_t max, char *err, size_t errlen) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s) abort();
    if (strlen(s) > max) {
        snprintf(err, errlen, "%s is %zu bytes as JSON; at most %zu are stored", what, strlen(s), max);
        free(s);
        return NULL;
    }
    return s;
}

int jx_string_map(const json_t *obj, const char *key, size_t max, char **out, char *err, size_t errlen) {
    json_t *m, *v;
    const char *k;
    *out = NULL;
    if (jx_obj(obj, "", key, &m, err, errlen) < 0) return -1;
    if (!m) return 0;
    json_object_foreach(m, k, v) {
        if (!json_is_string(v)) {
            snprintf(err, errlen, "%s.%.100s: expected a string, got %s (%s values are strings)", key, k,
                     jx_type_name(v), key);
            return -1;
        }
    }
    return (*out = jx_dump_bounded(m, key, max, err, errlen)) ? 0 : -1;
}
