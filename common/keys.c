/* keys.c: API key generation and hashing; tenant helpers shared by `loom up` and the CLI. */
#include "common/keys.h"
#include "common/common_sql.h"
#include "common/db.h"
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int keys_init(void) { return sodium_init() < 0 ? -1 : 0; }

int keys_load_secret(const char *path, bool create, unsigned char out[KEY_SECRET_BYTES],
                     char *err, size_t errlen) {
    char hex[2 * KEY_SECRET_BYTES + 2];
    const char *env = getenv("LOOM_SECRET");
    if (env && *env) {
        snprintf(hex, sizeof hex, "%s", env);
    } else {
        FILE *f = path ? fopen(path, "r") : NULL;
        if (!f) {
            if (!create || !path) {
                snprintf(err, errlen, "no server secret: set LOOM_SECRET or --secret-file (%s: %s)",
                         path ? path : "-", strerror(errno));
                return -1;
            }
            unsigned char fresh[KEY_SECRET_BYTES];
            randombytes_buf(fresh, sizeof fresh);
            sodium_bin2hex(hex, sizeof hex, fresh, sizeof fresh);
            int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
            if (fd < 0 || write(fd, hex, 2 * KEY_SECRET_BYTES) != 2 * KEY_SECRET_BYTES ||
                fsync(fd) < 0) {
                snprintf(err, errlen, "cannot write secret %s: %s", path, strerror(errno));
                if (fd >= 0) close(fd);
                return -1;
            }
            close(fd);
        } else {
            size_t n = fread(hex, 1, 2 * KEY_SECRET_BYTES, f);
            fclose(f);
            hex[n] = 0;
        }
    }
    size_t bin_len = 0;
    if (sodium_hex2bin(out, KEY_SECRET_BYTES, hex, strlen(hex), " \n", &bin_len, NULL) != 0 ||
        bin_len != KEY_SECRET_BYTES) {
        snprintf(err, errlen, "server secret must be %d hex characters", 2 * KEY_SECRET_BYTES);
        return -1;
    }
    return 0;
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

int keys_tenant_ensure(PGconn *c, const char *name, int64_t *id, char *err, size_t errlen) {
    const char *p[1] = {name};
    PGresult *r = db_query(c, SQL_TENANT_ENSURE, 1, p, err, errlen);
    if (!r) return -1;
    if (PQntuples(r) < 1) {
        PQclear(r);
        snprintf(err, errlen, "tenant %s could not be created", name);
        return -1;
    }
    *id = db_int(r, 0, 0);
    PQclear(r);
    return 0;
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
