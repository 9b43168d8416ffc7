/* core_sql.h: the statements the HTTP runtime itself runs on its database workers: the
 * API key check (api_auth.c) and the workers' session settings (api_pool.c). Parameters
 * are always bound. */
#pragma once

/* ---- API keys ---------------------------------------------------------------------- */
/* $1 prefix -> id, tenant_id, hash (hex), revoked, expired, touch_due, train, sample,
 * read, admin, metrics, the tenant's name, when it expires (epoch seconds, 0: never) */
#define SQL_KEY_LOOKUP                                                                      \
    "SELECT k.id, k.tenant_id, encode(k.hash, 'hex'), k.revoked_at IS NOT NULL,"            \
    " k.expires_at IS NOT NULL AND k.expires_at <= now(),"                                  \
    " k.last_used_at IS NULL OR k.last_used_at < now() - interval '1 minute',"              \
    " 'train' = ANY(k.scopes), 'sample' = ANY(k.scopes), 'read' = ANY(k.scopes),"           \
    " 'admin' = ANY(k.scopes), 'metrics' = ANY(k.scopes), t.name,"                          \
    " coalesce(extract(epoch FROM k.expires_at), 0)::float8"                                \
    " FROM api_keys k JOIN tenants t ON t.id = k.tenant_id WHERE k.prefix = $1"
/* $1 key id. At most once a minute per key, also across api processes. */
#define SQL_KEY_TOUCH                                                                       \
    "UPDATE api_keys SET last_used_at = now() WHERE id = $1"                                \
    " AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')"

/* ---- worker connections (api_pool.c) -------------------------------------------------- */
/* A stuck lock must not hold a worker forever; the client retries a 503. */
#define SQL_WORKER_TIMEOUT "SET statement_timeout = '30s'"
#define SQL_WORKER_NAME "SET application_name = 'loom-api'"
