/* api_json.h: reading request bodies as docs/protocol.md §1.2 describes: absent or explicit
 * null means "the default", unknown fields are ignored, a value of the wrong type is a
 * 400 whose message names the field (`where.key`) and what was expected. */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Installs jansson's allocator that bounds the memory a parse may take; call once,
 * before any thread uses jansson (the api process). decode_limit: bytes that decoding
 * (parse trees, zstd output) may take in all threads at once (0: no limit). */
void jx_init(size_t decode_limit);
/* Parses a request body. An empty body reads as {}. Anything but an object is an error;
 * malformed JSON (\u0000 included: nothing stored may hold a NUL) reports jansson's line
 * and column. NULL on error, message in err and the HTTP status in *status: 400, 413
 * when the tree would take more memory than its size allows, or 503 when the decode
 * budget of the process is taken by other requests now (see api_json.c). */
json_t *jx_parse_body(const char *body, size_t len, char *err, size_t errlen, int *status);
/* The decode budget: n more bytes for this thread's request (false: not available now),
 * and everything this thread drew given back (after its request's tree is freed). */
bool jx_decode_take(size_t n);
void jx_decode_release(void);
size_t jx_decode_limit(void);

/* v as compact JSON text (malloc'd) for storing, or NULL with err when it is longer than
 * max bytes (`what` names the field). */
char *jx_dump_bounded(const json_t *v, const char *what, size_t max, char *err, size_t errlen);

/* The field `key` of obj as a user_metadata map (SDKs read it back as dict[str, str]):
 * absent or null gives *out = NULL; else an object whose values are all strings, at most
 * max bytes as compact JSON, returned as that JSON (malloc'd). -1 with err naming the
 * field ("user_metadata.seed: expected a string, got an integer") otherwise. */
int jx_string_map(const json_t *obj, const char *key, size_t max, char **out, char *err, size_t errlen);

/* "a string", "an integer", ... for messages. */
const char *jx_type_name(const json_t *v);

/* Field getters: return 0 (out set, default when absent/null) or -1 (err set).
 * `where` is the path of obj in the request ("" for the top level). */
int jx_int(const json_t *obj, const char *where, const char *key, int64_t def, int64_t *out,
           bool *present, char *err, size_t errlen);
int jx_num(const json_t *obj, const char *where, const char *key, double def, double *out,
           char *err, size_t errlen);
int jx_bool(const json_t *obj, const char *where, const char *key, bool def, bool *out,
            char *err, size_t errlen);
/* *out = NULL when absent/null. */
int jx_str(const json_t *obj, const char *where, const char *key, const char **out, char *err,
           size_t errlen);
int jx_obj(const json_t *obj, const char *where, const char *key, json_t **out, char *err,
           size_t errlen);
int jx_arr(const json_t *obj, const char *where, const char *key, json_t **out, char *err,
           size_t errlen);
/* As jx_str, but absent/null/empty is an error "<where.key> is required". */
int jx_req_str(const json_t *obj, const char *where, const char *key, const char **out,
               char *err, size_t errlen);

/* A JSON number as an exact int64 (integers, or reals with an integral value). */
bool jx_as_int(const json_t *v, int64_t *out);

/* {"detail": msg} as a malloc'd string. */
char *jx_detail(const char *msg, size_t *len);
