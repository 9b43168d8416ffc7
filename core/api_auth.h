/* api_auth.h: API key check for one request. The key's clear prefix finds the candidate
 * rows; the keyed BLAKE2b hash is compared in constant time. */
#pragma once
#include "common/keys.h"
#include <libpq-fe.h>
#include <stddef.h>
#include <stdint.h>

/* Returns 0 (tenant_id, key_id, scopes (SCOPE_* bits of api_call.h) and the tenant's name
 * set), 1 (rejected: err holds the message for the 401), or -1 (database error in err).
 * key may be NULL (missing). */
int api_auth_key(PGconn *db, const unsigned char secret[KEY_SECRET_BYTES], const char *key,
                 int64_t *tenant_id, int64_t *key_id, unsigned *scopes, char *tenant_name,
                 size_t tn_len, char *err, size_t errlen);
