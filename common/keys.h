/* keys.h: API keys and tenants. A key is "tml-" + 43 url-safe base64 characters of
 * random bytes; only a keyed BLAKE2b hash (libsodium crypto_generichash with the server
 * secret) is stored, so a stolen database does not yield usable keys, and checking a
 * key costs one hash, not a password KDF. */
#pragma once
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KEY_SECRET_BYTES 32
#define KEY_HASH_BYTES 32
#define KEY_MAX_LEN 128
#define KEY_PREFIX_LEN 8   /* characters after "tml-" kept in clear for listings */

int keys_init(void);       /* sodium_init; 0 or -1 */

/* Reads the 32-byte server secret (hex, 64 chars) from path; if absent and create is
 * true, writes a new random one with mode 0600. Where it is (a file, LOOM_SECRET) is
 * config.c's to say (cfg_secret). */
int keys_load_secret(const char *path, bool create, unsigned char out[KEY_SECRET_BYTES],
                     char *err, size_t errlen);
/* The secret from its hex text; what names it in the message. */
int keys_parse_secret(const char *hex, const char *what, unsigned char out[KEY_SECRET_BYTES], char *err,
                      size_t errlen);

void keys_generate(char out[KEY_MAX_LEN]);
void keys_hash(const unsigned char secret[KEY_SECRET_BYTES], const char *key,
               unsigned char out[KEY_HASH_BYTES]);

#define KEY_TENANT_MAX 64

/* A tenant name: 1 to KEY_TENANT_MAX of [A-Za-z0-9._-], starting alphanumeric (no
 * slashes, spaces or quotes: names appear in paths, URLs and listings). */
int keys_tenant_name_check(const char *name, char *err, size_t errlen);
/* Creates a tenant (or finds it: *created says which, may be NULL). */
int keys_tenant_create(PGconn *c, const char *name, int64_t *id, bool *created, char *err, size_t errlen);
/* The tenant's id; -1 with "unknown tenant ..." (or a database error) in err. */
int keys_tenant_find(PGconn *c, const char *name, int64_t *id, char *err, size_t errlen);

/* Creates a key for tenant_id, stores its hash, writes the audit row, returns the key
 * text in out (shown once). scopes: NULL = default; expires: NULL or an SQL timestamp. */
int keys_create(PGconn *c, const unsigned char secret[KEY_SECRET_BYTES], int64_t tenant_id,
                const char *name, const char *scopes_sql_array, const char *expires_at,
                char out[KEY_MAX_LEN], char *err, size_t errlen);
