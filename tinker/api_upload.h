/* api_upload.h: adapter import over HTTP (api_upload.c; docs/protocol.md §12.7). */
#pragma once
#include "core/api_call.h"
#include <stddef.h>
#include <stdint.h>

int api_h_upload_start(api_call *c);    /* POST /external_weights_upload_start */
int api_h_upload_finish(api_call *c);   /* POST /external_weights_upload_finish */
int api_h_upload_put(api_call *c);      /* PUT /external_weights_uploads/<signed link> (the worker's half) */

/* The loop's half of a PUT (the route's stage hook, core/api_route.h): checks the link's
 * signature, expiry and file name (no database), and writes the body to the upload's
 * staged file in the blob store, so that no worker holds it. arg: the path after the
 * route's prefix. 0, or an HTTP status with msg (nothing written). */
int api_upload_stage(const char *arg, size_t arglen, const void *body, size_t len, char *msg, size_t msglen);

/* The gate's half (http_gate.h, gate_conf.signed_body): whether a request is a PUT of a
 * valid upload link (path: the whole path, any prefix before /api/v1), so that its body
 * may be read without an API key. 0 with *key_id (the key the link was made for), 1 when
 * it is no upload link, or an HTTP status with msg (bad or expired link, 413 for a
 * declared length over the file's limit; len 0: not declared). */
int api_upload_gate_check(const char *method, size_t mlen, const char *path, size_t plen, size_t len,
                          int64_t *key_id, char *msg, size_t msglen);
