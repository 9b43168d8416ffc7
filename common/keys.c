/* keys.c: API key generation and hashing; tenant helpers shared by `loom up` and the CLI. */
#include "common/keys.h"
#include "common/common_sql.h"
#include "common/db.h"
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int keys_init(void) { return sodium_init() < 0 ? -1 : 0; }

int keys_parse_secret(const char *hex, const char *what, unsigned char out[KEY_SECRET_BYTES], char *err,
                      size_t errlen) {
    size_t bin_len = 0;
    if (!hex || sodium_hex2bin(out, KEY_SECRET_BYTES, hex, strlen(hex), " \n", &bin_len, NULL) != 0 ||
        bin_len != KEY_SECRET_BYTES) {
        snprintf(err, errlen, "server secret %s must be %d hex characters", what, 2 * KEY_SECRET_BYTES);
        return -1;
    }
    return 0;
}

int keys_load_secret(const char *path, bool create, unsigned char out[KEY_SECRET_BYTES],
                     char *err, size_t errlen) {
    char hex[2 * KEY_SECRET_BYTES + 2];
    FILE *f = fopen(path, "r");
    if (!f) {
        if (!create || errno != ENOENT) {
            snprintf(err, errlen, "no server secret: %s: %s (set LOOM_SECRET, --secret-file or the data "
                     "directory of the api)", path, strerror(errno));
            return -1;
        }
        unsigned char fresh[KEY_SECRET_BYTES];
        randombytes_buf(fresh, sizeof fresh);
        sodium_bin2hex(hex, sizeof hex, fresh, sizeof fresh);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0 || write(fd, hex, 2 * KEY_SECRET_BYTES) != 2 * KEY_SECRET_BYTES || fsync(fd) < 0) {
            snprintf(err, errlen, "cannot write secret %s: %s", path, strerror(errno));
            if (fd >= 0) close(fd);
            return -1;
        }
        close(fd);
    } else {
        size_t n = fread(hex, 1, 2 * KEY_SECRET_BYTES + 1, f);
        fclose(f);
        hex[n] = 0;
    }
    return keys_parse_secret(hex, path, out, err, errlen);
}

void keys_generate(char out[KEY_MAX_LEN]) {
    unsigned char raw[32];
    randombytes_buf(raw, sizeof raw);
    memcpy(out, "tml-", 4);
    sodium_bin2base64(out + 4, KEY_MAX_LEN - 4, raw, sizeof raw,
                      sodium_base64_VARIANT_URLSAFE_NO_PADDING);
}

void keys_hash(const unsigned char secret[KEY_SECRET_BYTES], const char *key,
               unsigned char out[KEY_HASH_BYTES]) {
    crypto_generichash(out, KEY_HASH_BYTES, (const unsigned char *)key, strlen(key), secret,
                       KEY_SECRET_BYTES);
}

int keys_tenant_name_check(const char *name, char *err, size_t errlen) {
    size_t n = strlen(name);
    bool ok = n >= 1 && n <= KEY_TENANT_MAX && isalnum((unsigned char)name[0]);
    for (size_t i = 0; ok && i < n; i++)
        ok = isalnum((unsigned char)name[i]) || name[i] == '-' || name[i] == '_' || name[i] == '.';
    if (!ok)
        snprintf(err, errlen, "invalid tenant name '%.*s%s': 1 to %d letters, digits, '-', '_' or '.', starting "
                 "with a letter or digit", n > 80 ? 80 : (int)n, name, n > 80 ? "..." : "", KEY_TENANT_MAX);
    return ok ? 0 : -1;
}

int keys_tenant_create(PGconn *c, const char *name, int64_t *id, bool *created, char *err, size_t errlen) {
    if (keys_tenant_name_check(name, err, errlen) < 0) return -1;
    const char *p[1] = {name};
    PGresult *r = db_query(c, SQL_TENANT_ENSURE, 1, p, err, errlen);
    if (!r) return -1;
    if (PQntuples(r) < 1) {
        PQclear(r);
        snprintf(err, errlen, "tenant %s could not be created", name);
        return -1;
    }
    *id = db_int(r, 0, 0);
    if (created) *created = db_bool(r, 0, 1);
    PQclear(r);
    return 0;
}

int keys_tenant_find(PGconn *c, const char *name, int64_t *id, char *err, size_t errlen) {
    const char *p[1] = {name};
    PGresult *r = db_query(c, "SELECT id FROM tenants WHERE name = $1", 1, p, err, errlen);
    if (!r) return -1;
    int found = PQntuples(r) > 0;
    if (found) *id = db_int(r, 0, 0);
    else snprintf(err, errlen, "unknown tenant '%s' (`loom tenant list` shows them; `loom tenant create %s` adds it)",
                  name, name);
    PQclear(r);
    return found ? 0 : -1;
}

int keys_create(PGconn *c, const unsigned char secret[KEY_SECRET_BYTES], int64_t tenant_id,
                const char *name, const char *scopes_sql_array, const char *expires_at,
                char out[KEY_MAX_LEN], char *err, size_t errlen) {
    unsigned char h[KEY_HASH_BYTES];
    char hhex[2 * KEY_HASH_BYTES + 3] = "\\x";
    char tid[24], prefix[KEY_PREFIX_LEN + 1];
    keys_generate(out);
    keys_hash(secret, out, h);
    sodium_bin2hex(hhex + 2, sizeof hhex - 2, h, sizeof h);
    snprintf(prefix, sizeof prefix, "%s", out + 4);
    snprintf(tid, sizeof tid, "%lld", (long long)tenant_id);
    const char *p[6] = {tid, prefix, hhex, name, scopes_sql_array, expires_at};
    if (db_begin(c, err, errlen) < 0) return -1;
    PGresult *r = db_query(c, SQL_KEY_INSERT, 6, p, err, errlen);
    if (!r) { db_rollback(c); return -1; }
    PQclear(r);
    if (db_exec(c, SQL_KEY_AUDIT_CREATE, 2, p, err, errlen) < 0) {
        db_rollback(c);
        return -1;
    }
    return db_commit(c, err, errlen);
}
