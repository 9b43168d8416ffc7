/* api_auth.c: API key authentication (see api_auth.h). */
#include "core/api_auth.h"
#include "common/db.h"
#include "common/log.h"
#include "core/api_call.h"
#include "core/core_sql.h"
#include <sodium.h>
#include <stdio.h>
#include <string.h>

int api_auth_key(PGconn *db, const unsigned char secret[KEY_SECRET_BYTES], const char *key,
                 int64_t *tenant_id, int64_t *key_id, unsigned *scopes, char *tenant_name,
                 size_t tn_len, char *err, size_t errlen) {
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
    char prefix[KEY_PREFIX_LEN + 1];
    memcpy(prefix, key + 4, KEY_PREFIX_LEN);
    prefix[KEY_PREFIX_LEN] = 0;

    unsigned char h[KEY_HASH_BYTES];
    char hex[2 * KEY_HASH_BYTES + 1];
    keys_hash(secret, key, h);
    sodium_bin2hex(hex, sizeof hex, h, sizeof h);

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
