/* cli_sql.h: every SQL statement of the operator commands and `loom up` (cli/), by
 * name. Parameters are always bound. */
#pragma once
#include "contract/contract.h"
#include "registry/reg_sql.h"

/* ---- loom tenant / loom key (admin.c) --------------------------------------------------- */
/* -> id, name, created_at, active keys */
#define SQL_CLI_TENANTS                                                                         \
    "SELECT t.id, t.name, t.created_at, count(k.id) FILTER (WHERE k.revoked_at IS NULL)"        \
    " FROM tenants t LEFT JOIN api_keys k ON k.tenant_id = t.id GROUP BY t.id ORDER BY t.id"
/* $1 tenant name or NULL -> id, tenant, key prefix, name, scopes, created, expires, last
 * used, state */
#define SQL_CLI_KEYS                                                                            \
    "SELECT k.id, t.name, 'tml-' || k.prefix || '...', coalesce(nullif(k.name, ''), '-'),"      \
    " array_to_string(k.scopes, ','),"                                                           \
    " to_char(k.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'),"                           \
    " coalesce(to_char(k.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'), 'never'),"        \
    " coalesce(to_char(k.last_used_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'), 'never'),"      \
    " CASE WHEN k.revoked_at IS NOT NULL THEN 'revoked'"                                         \
    "      WHEN k.expires_at <= now() THEN 'expired' ELSE 'active' END"                          \
    " FROM api_keys k JOIN tenants t ON t.id = k.tenant_id"                                      \
    " WHERE $1::text IS NULL OR t.name = $1 ORDER BY k.id"
/* $1 key id -> a row when an active key was revoked (and audited) */
#define SQL_CLI_KEY_REVOKE                                                                      \
    "WITH k AS (UPDATE api_keys SET revoked_at = now() WHERE id = $1::bigint"                   \
    " AND revoked_at IS NULL RETURNING id, tenant_id, prefix)"                                   \
    " INSERT INTO audit_log (tenant_id, actor, action, object)"                                  \
    " SELECT tenant_id, 'cli', 'key.revoke', 'tml-' || prefix FROM k RETURNING id"

/* ---- loom adapter (adapter.c) ------------------------------------------------------------ */
/* $1 tenant or NULL, $2 run or NULL, $3 include dead versions */
#define SQL_CLI_LIST                                                                            \
    "SELECT t.name, v.tinker_path, v.kind, v.step, v.size_bytes, v.visibility,"                 \
    " to_char(v.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),"                       \
    " COALESCE(to_char(v.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'), '-'),"        \
    " CASE WHEN v.deleted_at IS NOT NULL THEN 'deleted' WHEN v.expires_at <= now() THEN 'expired' ELSE 'live' END" \
    " FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id JOIN tenants t ON t.id = a.tenant_id" \
    " WHERE ($1::text IS NULL OR t.name = $1) AND ($2::text IS NULL OR a.name = $2)"            \
    " AND ($3::boolean OR " REG_LIVE ") ORDER BY v.created_at, v.id"
/* $1 tinker path -> one version as JSON text, with its grants and provenance */
#define SQL_CLI_SHOW                                                                            \
    "SELECT jsonb_build_object('id', v.id, 'tinker_path', v.tinker_path, 'kind', v.kind, 'tenant', t.name," \
    " 'adapter', a.name, 'step', v.step, 'parent_id', v.parent_id, 'parent_path', p.tinker_path,"  \
    " 'base_model', v.base_model, 'lora_config', v.lora_config, 'blob_digest', v.blob_digest,"   \
    " 'size_bytes', v.size_bytes, 'visibility', v.visibility, 'created_at', v.created_at,"       \
    " 'expires_at', v.expires_at, 'deleted_at', v.deleted_at, 'blob_removed_at', v.blob_removed_at," \
    " 'grants', (SELECT COALESCE(jsonb_agg(gt.name ORDER BY gt.name), '[]') FROM adapter_grants g" \
    "   JOIN tenants gt ON gt.id = g.tenant_id WHERE g.adapter_id = a.id),"                      \
    " 'provenance', v.provenance, 'user_metadata', v.user_metadata)::text"                      \
    " FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id JOIN tenants t ON t.id = a.tenant_id" \
    " LEFT JOIN adapter_versions p ON p.id = v.parent_id"                                         \
    " WHERE v.tinker_path = $1 ORDER BY v.deleted_at IS NULL DESC, v.id DESC LIMIT 1"
/* $1 tinker path -> the version and its ancestors, nearest first */
#define SQL_CLI_LINEAGE                                                                         \
    "WITH me AS (SELECT version_id, ancestors FROM adapter_history WHERE tinker_path = $1"        \
    "  ORDER BY deleted_at IS NULL DESC, version_id DESC LIMIT 1),"                               \
    " chain AS (SELECT me.version_id AS id, 0 AS depth FROM me"                                   \
    "  UNION ALL SELECT a.id, a.ord::int FROM me, unnest(me.ancestors) WITH ORDINALITY AS a(id, ord))" \
    " SELECT c.depth, h.tinker_path, h.kind, h.step, to_char(h.created_at AT TIME ZONE 'UTC',"     \
    "  'YYYY-MM-DD HH24:MI:SS'), COALESCE(h.provenance->>'seq_from', '-'), COALESCE(h.provenance->>'seq_to', '-')," \
    "  COALESCE(h.provenance->>'tokens', '-'), CASE WHEN h.deleted_at IS NULL THEN '' ELSE ' (deleted)' END" \
    " FROM chain c JOIN adapter_history h ON h.version_id = c.id ORDER BY c.depth"
/* $1 name -> id */
#define SQL_CLI_TENANT "SELECT id FROM tenants WHERE name = $1"
/* $1 base model -> its config.json */
#define SQL_CLI_BASE_CONFIG "SELECT config::text FROM base_models WHERE name = $1"
/* $1 run -> adapter id, owner */
#define SQL_CLI_RUN_ADAPTER "SELECT id, tenant_id FROM adapters WHERE name = $1"

/* ---- loom up (up.c) ---------------------------------------------------------------------- */
/* -> the largest executors.id now */
#define SQL_UP_EXECUTOR_FLOOR "SELECT COALESCE(max(id), 0) FROM executors"
/* $1 pid, $2 hostname, $3 id floor, $4 seconds -> id, state, silent seconds of this
 * child's executor row when it is gone or silent for longer than $4 */
#define SQL_UP_EXECUTOR_SILENT                                                                  \
    "SELECT id, state, extract(epoch FROM now() - heartbeat_at)::int FROM executors"            \
    " WHERE pid = $1 AND hostname = $2 AND id > $3 AND (state = 'gone'"                          \
    " OR heartbeat_at < now() - make_interval(secs => $4::int))"                                 \
    " ORDER BY id DESC LIMIT 1"
/* $1 pid, $2 hostname, $3 id floor: the child executor died; its registration is gone at
 * once (the reaper then moves its models without waiting for its silence), and the
 * scheduler is woken to reap. */
#define SQL_UP_EXECUTOR_DIED                                                                    \
    "WITH g AS (UPDATE executors SET state = 'gone' WHERE pid = $1 AND hostname = $2"           \
    " AND id > $3 AND NOT gone RETURNING id)"                                                   \
    " SELECT pg_notify('" CHAN_EXECUTOR_READY "', id::text) FROM g"
/* $1 key hash (bytea text) -> a row while the key is valid */
#define SQL_UP_KEY_VALID                                                                        \
    "SELECT 1 FROM api_keys WHERE hash = $1::bytea AND revoked_at IS NULL"                      \
    " AND (expires_at IS NULL OR expires_at > now())"
/* $1 pid -> a row once that executor is registered and idle */
#define SQL_UP_EXECUTOR_READY "SELECT 1 FROM executors WHERE pid = $1 AND state = 'idle' AND NOT gone"

/* ---- loom executor drain|undrain (pool.c) ------------------------------------------------ */
/* $1 executor id or name, $2 draining -> id, name, host, base model of the live executors
 * it names */
#define SQL_CLI_EXECUTOR_DRAIN                                                                  \
    "UPDATE executors SET draining = $2::boolean WHERE NOT gone"                                \
    " AND (id::text = $1 OR name = $1) RETURNING id, name, hostname, base_model"
/* $1 bigint[] executors -> active models still placed on them, and the sampler snapshots
 * they still hold (as they last recorded) */
#define SQL_CLI_EXECUTOR_MODELS                                                                 \
    "SELECT (SELECT count(*) FROM models WHERE executor_id = ANY($1::bigint[]) AND status = 'active'),"  \
    " (SELECT coalesce(sum(sampler_snapshots), 0) FROM executors WHERE id = ANY($1::bigint[]))"

/* ---- limits and usage (usage.c) ------------------------------------------------------------ */
/* $1 tenant name, $2 max queued ops, $3 tokens per minute, $4 max live models, $5 max
 * checkpoint bytes: NULL leaves a limit as it is, 0 removes it -> the tenant's limits now */
#define SQL_CLI_SET_LIMITS                                                                      \
    "INSERT INTO tenant_limits AS l (tenant_id, max_queued_ops, tokens_per_minute, max_live_models," \
    " max_checkpoint_bytes) SELECT t.id, nullif($2::int, 0), nullif($3::bigint, 0), nullif($4::int, 0)," \
    " nullif($5::bigint, 0) FROM tenants t WHERE t.name = $1"                                   \
    " ON CONFLICT (tenant_id) DO UPDATE SET"                                                     \
    " max_queued_ops = CASE WHEN $2 IS NULL THEN l.max_queued_ops ELSE nullif($2::int, 0) END,"  \
    " tokens_per_minute = CASE WHEN $3 IS NULL THEN l.tokens_per_minute ELSE nullif($3::bigint, 0) END," \
    " max_live_models = CASE WHEN $4 IS NULL THEN l.max_live_models ELSE nullif($4::int, 0) END," \
    " max_checkpoint_bytes = CASE WHEN $5 IS NULL THEN l.max_checkpoint_bytes"                   \
    "   ELSE nullif($5::bigint, 0) END, updated_at = now()"                                      \
    " RETURNING coalesce(max_queued_ops::text, '-'), coalesce(tokens_per_minute::text, '-'),"    \
    " coalesce(max_live_models::text, '-'), coalesce(max_checkpoint_bytes::text, '-')"
#define SQL_CLI_USAGE_FOLD "SELECT loom_usage_fold()"
/* $1 tenant name -> its id */
#define SQL_CLI_TENANT_ID "SELECT id FROM tenants WHERE name = $1"
/* $1 days -> per tenant: train, prefill, sample tokens over the last $1 days (UTC, today
 * included), live checkpoints and their bytes, operations queued or running, limits */
#define SQL_CLI_USAGE_ALL                                                                       \
    "SELECT t.name, coalesce(u.train, 0), coalesce(u.prefill, 0), coalesce(u.sample, 0),"        \
    " coalesce(st.checkpoints, 0), coalesce(st.bytes, 0),"                                        \
    " (SELECT count(*) FROM operations q WHERE q.tenant_id = t.id AND q.state IN ('queued', 'claimed')),"  \
    " coalesce(l.max_queued_ops::text, '-') || '/' || coalesce(l.tokens_per_minute::text, '-') || '/'"   \
    " || coalesce(l.max_live_models::text, '-') || '/' || coalesce(l.max_checkpoint_bytes::text, '-')" \
    " FROM tenants t LEFT JOIN tenant_limits l ON l.tenant_id = t.id"                            \
    " LEFT JOIN (SELECT tenant_id, sum(tokens) FILTER (WHERE kind = 'train') AS train,"          \
    "   sum(tokens) FILTER (WHERE kind = 'prefill') AS prefill, sum(tokens) FILTER (WHERE kind = 'sample') AS sample" \
    "   FROM usage_daily WHERE day > (now() AT TIME ZONE 'UTC')::date - $1::int GROUP BY tenant_id) u" \
    "   ON u.tenant_id = t.id"                                                                    \
    " LEFT JOIN (SELECT tenant_id, sum(checkpoints) AS checkpoints, sum(bytes) AS bytes FROM usage_storage" \
    "   GROUP BY tenant_id) st ON st.tenant_id = t.id ORDER BY t.name"
