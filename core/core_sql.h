/* core_sql.h: the statements the HTTP runtime itself runs on its database workers: the
 * API key check (api_auth.c), the workers' session settings (api_pool.c) and the
 * deployment's series of GET /metrics (api_metrics.c). Parameters are always bound. */
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
#define SQL_WORKER_NAME "SET application_name = 'loom api'"

/* ---- GET /metrics, from PostgreSQL (api_metrics.c) ------------------------------------ */
/* Queue depth by state, kind and base model, zeros included so that series do not
 * vanish when the queue empties. The operations_live index bounds it by the queue; each
 * live operation's model or sampler is looked up by key. */
#define SQL_M_QUEUE                                                                          \
    "WITH q AS (SELECT o.state, o.kind, COALESCE((SELECT m.base_model FROM models m"           \
    "  WHERE m.id = o.model_id), (SELECT s.base_model FROM sampling_sessions s"               \
    "  WHERE s.id = o.sampling_session_id)) AS base_model,"                                   \
    "  count(*) AS n, extract(epoch FROM now() - min(o.created_at)) AS oldest"                \
    "  FROM operations o WHERE o.state IN ('queued','claimed') GROUP BY 1, 2, 3)"             \
    " SELECT st, k, b.name, COALESCE(q.n, 0), COALESCE(q.oldest, 0) FROM base_models b"       \
    " CROSS JOIN unnest(ARRAY['queued','claimed']) st CROSS JOIN unnest(ARRAY['create_model',"\
    " 'forward','forward_backward','optim_step','save_weights','save_weights_for_sampler',"   \
    " 'load_weights','unload_model','sample']) k"                                             \
    " LEFT JOIN q ON q.state = st AND q.kind = k AND q.base_model = b.name ORDER BY 3, 1, 2"
#define SQL_M_MODELS                                                                         \
    "SELECT b.name, (SELECT count(*) FROM models m WHERE m.base_model = b.name"               \
    " AND m.status = 'active'), (SELECT count(*) FROM tenants) FROM base_models b ORDER BY 1"
#define SQL_M_EXECUTORS                                                                      \
    "SELECT e.id, e.name, e.hostname, e.device_index, e.backend, e.base_model, e.device,"     \
    " e.state, extract(epoch FROM now() - e.heartbeat_at), e.memory_total, e.memory_budget,"  \
    " e.memory_used, e.training_slots, e.sampler_snapshots, e.cached_checkpoints,"            \
    " e.gpu_utilization, e.gpu_memory_used, e.gpu_memory_total, e.gpu_temperature,"           \
    " e.gpu_power_watts, e.gpu_sampled_at > now() - interval '60 seconds'"                    \
    " FROM executors e WHERE NOT e.gone ORDER BY e.id"
/* Live versions (not deleted; blobs still stored) by kind and owner; stored bytes count
 * each blob once (saving the same bytes twice stores them once). Each live version's
 * adapter and tenant are looked up by key (as a join, PostgreSQL read every adapter ever
 * made, deleted ones included). */
#define SQL_M_REGISTRY                                                                       \
    "SELECT (SELECT t.name FROM tenants t WHERE t.id = x.tenant_id) AS tenant, x.kind, x.n,"  \
    " x.bytes FROM (SELECT (SELECT a.tenant_id FROM adapters a WHERE a.id = v.adapter_id)"    \
    "   AS tenant_id, v.kind, count(*) AS n, COALESCE(sum(v.size_bytes), 0) AS bytes"         \
    "   FROM adapter_versions v WHERE v.deleted_at IS NULL GROUP BY 1, 2) x ORDER BY 1, 2"
#define SQL_M_BLOBS                                                                          \
    "SELECT count(*), COALESCE(sum(s), 0) FROM (SELECT max(size_bytes) AS s FROM"             \
    " adapter_versions WHERE deleted_at IS NULL GROUP BY blob_digest) d"
#define SQL_M_FOLD "SELECT loom_metrics_fold()"
#define SQL_M_COUNTERS                                                                       \
    "SELECT f.family, f.type, f.help, COALESCE(f.buckets::text, ''), c.labels::text,"         \
    " c.suffix, c.le, c.value FROM metric_families f"                                         \
    " LEFT JOIN metric_counters c ON c.family = f.family"                                     \
    " ORDER BY f.family, c.labels::text, c.suffix, c.le"
