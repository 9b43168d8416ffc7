/* api_auth.c: API key authentication (see api_auth.h). */
#include "core/api_auth.h"
#include "common/clock.h"
#include "common/db.h"
#include "common/log.h"
#include "core/api_call.h"
#include "core/core_sql.h"
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the cache of checked keys --------------------------------------------------------- */

/* One slot per bucket of the keyed hash (uniform: the newest key of a bucket wins), so
 * the cache's size is fixed whatever keys are presented; only keys that passed are kept. */
#define CACHE_SLOTS 1024

typedef struct {
    bool used;
    unsigned char hash[KEY_HASH_BYTES];
    double cached_at;     /* clock_mono_s() */
    double expires_at;    /* the key's own expiry, epoch seconds; 0: never */
    int64_t tenant_id, key_id;
    unsigned scopes;
    char tenant_name[API_TENANT_NAME_MAX];
} cache_slot;

static pthread_mutex_t g_cache_mu = PTHREAD_MUTEX_INITIALIZER;
static cache_slot g_cache[CACHE_SLOTS];
static bool g_cache_on;      /* from the LISTEN thread's first connect on */
static uint64_t g_cache_gen; /* flushes so far: a lookup that raced with one is not kept */

void api_auth_cache_flush(const char *payload, void *arg) {
    (void)payload;
    (void)arg;
    pthread_mutex_lock(&g_cache_mu);
    memset(g_cache, 0, sizeof g_cache);
    g_cache_gen++;
    g_cache_on = true;
    pthread_mutex_unlock(&g_cache_mu);
}

static cache_slot *slot_of(const unsigned char h[KEY_HASH_BYTES]) {
    return &g_cache[((unsigned)h[0] | (unsigned)h[1] << 8) % CACHE_SLOTS];
}

/* The key's cached check: true with the outputs set. *gen: the generation to fill in. */
static bool cache_get(const unsigned char h[KEY_HASH_BYTES], int64_t *tenant_id, int64_t *key_id,
                      unsigned *scopes, char *tenant_name, size_t tn_len, uint64_t *gen) {
    bool hit = false;
    pthread_mutex_lock(&g_cache_mu);
    cache_slot *s = slot_of(h);
    *gen = g_cache_gen;
    if (g_cache_on && s->used && sodium_memcmp(s->hash, h, KEY_HASH_BYTES) == 0 &&
        clock_mono_s() - s->cached_at < API_KEY_CACHE_S && (!s->expires_at || clock_wall_s() < s->expires_at)) {
        *tenant_id = s->tenant_id;
        *key_id = s->key_id;
        *scopes = s->scopes;
        snprintf(tenant_name, tn_len, "%s", s->tenant_name);
        hit = true;
    }
    pthread_mutex_unlock(&g_cache_mu);
    return hit;
}

static void cache_put(const unsigned char h[KEY_HASH_BYTES], uint64_t gen, double expires_at, int64_t tenant_id,
                      int64_t key_id, unsigned scopes, const char *tenant_name) {
    pthread_mutex_lock(&g_cache_mu);
    if (g_cache_on && gen == g_cache_gen) {   /* no change notified since the lookup began */
        cache_slot *s = slot_of(h);
        s->used = true;
        memcpy(s->hash, h, KEY_HASH_BYTES);
        s->cached_at = clock_mono_s();
        s->expires_at = expires_at;
        s->tenant_id = tenant_id;
        s->key_id = key_id;
        s->scopes = scopes;
        snprintf(s->tenant_name, sizeof s->tenant_name, "%s", tenant_name);
    }
    pthread_mutex_unlock(&g_cache_mu);
}

/* ---- the check ------------------------------------------------------------------------ */

/* 0 with the key's hash in h, or 1 with the 401's message: no key, or not one of ours. */
static int key_hash_of(const unsigned char secret[KEY_SECRET_BYTES], const char *key,
                       unsigned char h[KEY_HASH_BYTES], char *err, size_t errlen) {
    if (!key || !*key) {
        snprintf(err, errlen, "missing API key: send it in the X-API-Key header "
                              "(Loom keys start with tml-)");
        return 1;
    }
    size_t n = strlen(key);
    /* Keys are printable ASCII; anything else is no key of ours (and must not reach SQL,
     * where invalid UTF-8 would be a server error). */
    bool printable = true;
    for (size_t i = 0; i < n; i++) printable &= key[i] > 0x20 && key[i] < 0x7f;
    if (n < 4 + KEY_PREFIX_LEN || n >= KEY_MAX_LEN || strncmp(key, "tml-", 4) != 0 || !printable) {
        snprintf(err, errlen, "invalid API key: Loom keys look like tml-<43 characters>");
        return 1;
    }
    keys_hash(secret, key, h);
    return 0;
}

int api_auth_key_cached(const unsigned char secret[KEY_SECRET_BYTES], const char *key, int64_t *tenant_id,
                        int64_t *key_id, unsigned *scopes, char *tenant_name, size_t tn_len) {
    unsigned char h[KEY_HASH_BYTES];
    char err[160];
    uint64_t gen;
    if (key_hash_of(secret, key, h, err, sizeof err)) return -1;
    return cache_get(h, tenant_id, key_id, scopes, tenant_name, tn_len, &gen) ? 0 : -1;
}

int api_auth_key(PGconn *db, const unsigned char secret[KEY_SECRET_BYTES], const char *key,
                 int64_t *tenant_id, int64_t *key_id, unsigned *scopes, char *tenant_name,
                 size_t tn_len, char *err, size_t errlen) {
    unsigned char h[KEY_HASH_BYTES];
    if (key_hash_of(secret, key, h, err, errlen)) return 1;
    char prefix[KEY_PREFIX_LEN + 1];
    memcpy(prefix, key + 4, KEY_PREFIX_LEN);
    prefix[KEY_PREFIX_LEN] = 0;
    char hex[2 * KEY_HASH_BYTES + 1];
    sodium_bin2hex(hex, sizeof hex, h, KEY_HASH_BYTES);
    uint64_t gen;
    if (cache_get(h, tenant_id, key_id, scopes, tenant_name, tn_len, &gen)) return 0;

    const char *p[1] = {prefix};
    PGresult *r = db_query(db, SQL_KEY_LOOKUP, 1, p, err, errlen);
    if (!r) return -1;
    int found = -1;
    for (int i = 0; i < PQntuples(r); i++) {
        const char *stored = PQgetvalue(r, i, 2);
        if (strlen(stored) == 2 * KEY_HASH_BYTES && sodium_memcmp(stored, hex, 2 * KEY_HASH_BYTES) == 0)
            found = i;
    }
    if (found < 0) {
        PQclear(r);
        snprintf(err, errlen, "invalid API key (unknown key %.*s...)", 4 + KEY_PREFIX_LEN, key);
        return 1;
    }
    int rc = 0;
    if (db_bool(r, found, 3)) {
        snprintf(err, errlen, "API key %s... has been revoked", prefix);
        rc = 1;
    } else if (db_bool(r, found, 4)) {
        snprintf(err, errlen, "API key %s... has expired", prefix);
        rc = 1;
    }
    *key_id = db_int(r, found, 0);
    *tenant_id = db_int(r, found, 1);
    *scopes = (db_bool(r, found, 6) ? SCOPE_TRAIN : 0) | (db_bool(r, found, 7) ? SCOPE_SAMPLE : 0) |
              (db_bool(r, found, 8) ? SCOPE_READ : 0) | (db_bool(r, found, 9) ? SCOPE_ADMIN : 0) |
              (db_bool(r, found, 10) ? SCOPE_METRICS : 0);
    snprintf(tenant_name, tn_len, "%s", PQgetvalue(r, found, 11));
    bool touch = rc == 0 && db_bool(r, found, 5);
    if (rc == 0) cache_put(h, gen, atof(PQgetvalue(r, found, 12)), *tenant_id, *key_id, *scopes, tenant_name);
    PQclear(r);
    if (touch) {
        char id[24], e2[256];
        api_fmt_i64(id, *key_id);
        const char *tp[1] = {id};
        /* Best effort: a failed bookkeeping update must not fail the request. */
        if (db_exec(db, SQL_KEY_TOUCH, 1, tp, e2, sizeof e2) < 0)
            log_warn("api key %s: last_used_at update failed: %s", prefix, e2);
    }
    return rc;
}
