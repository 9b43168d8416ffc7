/* api_auth.h: API key check for one request. The key's clear prefix finds the candidate
 * rows; the keyed BLAKE2b hash is compared in constant time. A key that passed is kept
 * for API_KEY_CACHE_S (bounded: one slot per bucket of its hash), so that most requests
 * cost no lookup; a change to a key or its tenant (migration 0031's triggers NOTIFY
 * loom_api_keys) empties the cache at once through the LISTEN thread (api_listen.h),
 * which also empties it after every reconnect (notifications may have been lost). */
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

/* The check from the cache alone, for a thread without a connection (an event loop's
 * first look, api_pool_first_look): 0 (as api_auth_key's 0) when the key passed within
 * API_KEY_CACHE_S and nothing changed since; -1 otherwise (a worker checks it). */
int api_auth_key_cached(const unsigned char secret[KEY_SECRET_BYTES], const char *key, int64_t *tenant_id,
                        int64_t *key_id, unsigned *scopes, char *tenant_name, size_t tn_len);
/* How long a key that passed is believed without a lookup when no notification says
 * otherwise (a revocation is seen at once; this bounds it while the LISTEN connection is
 * down). */
#define API_KEY_CACHE_S 5.0

/* The LISTEN thread's callback for loom_api_keys (any payload; NULL after a reconnect):
 * forgets every cached key. The cache is off until its first call, so a process without
 * the LISTEN thread looks every key up. */
void api_auth_cache_flush(const char *payload, void *arg);
