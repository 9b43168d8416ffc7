/* console_sql.h: the read-only statements of the web console (api_console.c) and of
 * `loom status` (cli/status.c). Each answers one JSON text. Tenant statements take the
 * caller's tenant and never show another tenant's rows; the operator statements
 * (SQL_CON_ADMIN_*) show every tenant. Every statement is bounded by what is live (the
 * queue, live executors, a page of runs, a run's own operations, a number of recent
 * cycles), never by the length of history. */
#pragma once
#include "registry/reg_sql.h"

#define CON_ISO(x) "to_char((" x ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* The newest done operation of kind k of model m: its metric named n, as float8. */
#define CON_LAST_METRIC(k, n)                                                                 \
    "(SELECT (o.metrics->>'" n "')::float8 FROM operations o WHERE o.model_id = m.id"          \
    " AND o.kind = '" k "' AND o.state = 'done' ORDER BY o.seq_id DESC LIMIT 1)"

/* The optimizer step of run m now, as its checkpoints count it (Adam's step): step:max of
 * its last optim_step, or, when a load_weights came after that, the step it loaded (the
 * checkpoint's with the optimizer state, 0 without). A run resumed from a checkpoint of
 * step 10 that took 15 steps is at step 25. */
#define CON_RUN_STEP                                                                          \
    "COALESCE((SELECT CASE o.kind WHEN 'optim_step' THEN (o.metrics->>'step:max')::bigint"     \
    " ELSE (SELECT CASE WHEN o.payload->>'optimizer' = 'true' THEN v.step ELSE 0 END"           \
    " FROM adapter_versions v WHERE v.id = (o.payload->>'version_id')::bigint) END"            \
    " FROM operations o WHERE o.model_id = m.id AND o.kind IN ('optim_step','load_weights')"    \
    " AND o.state = 'done' ORDER BY o.seq_id DESC LIMIT 1), 0)"

/* The state of session s for the console: "finished" (its client's ServiceClient.close,
 * with finish_reason), "expired", or "active". */
#define CON_SESSION_STATE(s)                                                                  \
    "CASE WHEN " s ".finished_at IS NOT NULL THEN 'finished' WHEN " s ".expired_at IS NOT NULL" \
    " THEN 'expired' ELSE 'active' END"

/* $1 tenant, $2 limit, $3 offset -> {"runs": [...], "total": N}, newest first. steps: the
 * optimizer step (CON_RUN_STEP); last_loss: loss:sum of the last
 * forward_backward; the run's session: its display name, state and finish reason. */
#define SQL_CON_RUNS                                                                          \
    "SELECT json_build_object('runs', COALESCE((SELECT json_agg(r ORDER BY r.created DESC,"    \
    " r.run_id) FROM (SELECT m.id AS run_id, m.base_model, m.status, m.lora_rank,"              \
    " m.created_at AS created, " CON_ISO("m.created_at") " AS created_at,"                     \
    " " CON_ISO("m.last_request_at") " AS last_request_at,"                                    \
    " " CON_RUN_STEP " AS steps,"                                                              \
    " " CON_LAST_METRIC("forward_backward", "loss:sum") " AS last_loss,"                       \
    " (SELECT count(*) FROM operations o WHERE o.model_id = m.id AND o.state = 'queued')"      \
    " AS queued, m.session_id, ss.display_name AS session_name, " CON_SESSION_STATE("ss")      \
    " AS session_state, ss.finish_reason FROM models m JOIN sessions ss ON ss.id = m.session_id" \
    " WHERE m.tenant_id = $1 ORDER BY m.created_at DESC, m.id LIMIT $2::int OFFSET $3::int) r), '[]')," \
    " 'total', (SELECT count(*) FROM models WHERE tenant_id = $1))::text"

/* The curve of run m: one point per optimizer step (the forward_backward losses that fed
 * it, summed, and the step's gradient norm and learning rate), at the step the optimizer
 * counts (step:max, as CON_RUN_STEP: a resumed run goes on from its checkpoint's step); a
 * step still being accumulated is the last point, the step after CON_RUN_STEP. The newest
 * CON_MAX_POINTS steps. */
#define CON_MAX_POINTS "5000"
#define CON_CURVE                                                                             \
    "(SELECT COALESCE(json_agg(json_build_object('step', p.step, 'loss', p.loss, 'tokens',"    \
    " p.tokens, 'grad_norm', p.gn, 'learning_rate', p.lr, 'at', " CON_ISO("p.at") ")"          \
    " ORDER BY p.step), '[]') FROM (SELECT * FROM (SELECT COALESCE(max((s.metrics->>'step:max')" \
    "::bigint) FILTER (WHERE s.kind = 'optim_step'), " CON_RUN_STEP " + 1) AS step,"            \
    " sum((s.metrics->>'loss:sum')::float8) FILTER (WHERE s.kind = 'forward_backward') AS loss," \
    " sum(s.n_tokens) FILTER (WHERE s.kind = 'forward_backward') AS tokens,"                   \
    " max((s.metrics->>'grad_norm:mean')::float8) FILTER (WHERE s.kind = 'optim_step') AS gn,"  \
    " max((s.metrics->>'learning_rate:mean')::float8) FILTER (WHERE s.kind = 'optim_step') AS lr," \
    " max(s.finished_at) AS at FROM (SELECT o.kind, o.n_tokens, o.metrics, o.finished_at,"      \
    " count(*) FILTER (WHERE o.kind = 'optim_step') OVER (ORDER BY o.seq_id ROWS BETWEEN"       \
    " UNBOUNDED PRECEDING AND 1 PRECEDING) AS before FROM operations o WHERE o.model_id = m.id" \
    " AND o.kind IN ('forward_backward','optim_step') AND o.state = 'done') s"                  \
    " GROUP BY COALESCE(s.before, 0)) q"                                                        \
    " ORDER BY q.step DESC LIMIT " CON_MAX_POINTS ") p)"

/* The live checkpoints of run m with their parents (lineage) and provenance. */
#define CON_RUN_CHECKPOINTS                                                                   \
    "(SELECT COALESCE(json_agg(json_build_object('checkpoint_id', CASE v.kind WHEN 'training'" \
    " THEN 'weights/' ELSE 'sampler_weights/' END || v.name, 'kind', v.kind, 'tinker_path',"   \
    " v.tinker_path, 'step', v.step, 'time', " CON_ISO("v.created_at") ", 'size_bytes',"       \
    " v.size_bytes, 'public', v.visibility = 'public', 'expires_at', " CON_ISO("v.expires_at") \
    ", 'parent_path', p.tinker_path, 'last_loss', v.provenance->'loss'->'last', 'tokens',"     \
    " v.provenance->'tokens', 'user_metadata', v.user_metadata) ORDER BY v.id), '[]')"          \
    " FROM adapters a JOIN adapter_versions v"                                                 \
    " ON v.adapter_id = a.id LEFT JOIN adapter_versions p ON p.id = v.parent_id"              \
    " WHERE a.tenant_id = m.tenant_id AND a.name = m.id AND " REG_LIVE ")"

/* $1 run, $2 tenant -> {"run", "session", "operations": {"kind:state": n}, "curve",
 * "checkpoints"}; no row when the run is not the tenant's. */
#define SQL_CON_RUN                                                                           \
    "SELECT json_build_object('run', json_build_object('run_id', m.id, 'base_model',"          \
    " m.base_model, 'status', m.status, 'lora_rank', m.lora_rank, 'train_attn', m.train_attn," \
    " 'train_mlp', m.train_mlp, 'train_unembed', m.train_unembed, 'session_id', m.session_id," \
    " 'created_at', " CON_ISO("m.created_at") ", 'last_request_at', "                          \
    CON_ISO("m.last_request_at") ", 'next_seq', m.next_seq, 'step', " CON_RUN_STEP ", 'optimizer', m.optimizer,"         \
    " 'user_metadata', m.user_metadata),"                                                      \
    " 'session', (SELECT json_build_object('session_id', ss.id, 'display_name', ss.display_name," \
    " 'project_id', ss.project_id, 'user_metadata', ss.user_metadata, 'state', "              \
    CON_SESSION_STATE("ss") ", 'finish_reason', ss.finish_reason, 'finish_detail',"            \
    " ss.finish_detail, 'finished_at', " CON_ISO("ss.finished_at") ") FROM sessions ss"        \
    " WHERE ss.id = m.session_id),"                                                            \
    " 'operations', (SELECT COALESCE(json_object_agg(x.k, x.n), '{}') FROM (SELECT o.kind"     \
    " || ':' || o.state AS k, count(*) AS n FROM operations o WHERE o.model_id = m.id"         \
    " GROUP BY 1) x), 'curve', " CON_CURVE ", 'checkpoints', " CON_RUN_CHECKPOINTS ")::text"   \
    " FROM models m WHERE m.id = $1 AND m.tenant_id = $2"

/* $1 limit, $2 tenant -> {"checkpoints": [...]}: the sampler checkpoints the tenant may
 * read (own, shared with it, public), newest first, for the sampling playground. */
#define SQL_CON_CHECKPOINTS                                                                   \
    "SELECT json_build_object('checkpoints', COALESCE((SELECT json_agg(x ORDER BY x.t DESC)"   \
    " FROM (SELECT v.tinker_path, v.base_model, v.step, t.name AS owner, v.created_at AS t,"   \
    " " CON_ISO("v.created_at") " AS time, v.visibility = 'public' AS public"                  \
    " FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id"                         \
    " JOIN tenants t ON t.id = a.tenant_id WHERE v.kind = 'sampler' AND " REG_LIVE             \
    " AND " REG_READABLE " ORDER BY v.created_at DESC LIMIT $1::int) x), '[]'),"               \
    " 'base_models', (SELECT COALESCE(json_agg(b.name ORDER BY b.name), '[]')"                \
    " FROM base_models b))::text"

/* ---- operators --------------------------------------------------------------------------- */

/* The executors an operator sees: the live ones and the 5 newest that are gone. */
#define CON_EXECUTOR_JSON                                                                     \
    "json_build_object('id', e.id, 'name', e.name, 'host', e.hostname, 'pid', e.pid,"          \
    " 'backend', e.backend, 'device', e.device, 'device_index', e.device_index,"               \
    " 'base_model', e.base_model, 'state', e.state, 'token_budget', e.token_budget,"           \
    " 'started_at', " CON_ISO("e.started_at") ", 'heartbeat_age_s',"                           \
    " round(extract(epoch FROM now() - e.heartbeat_at)::numeric, 1), 'memory_total',"          \
    " e.memory_total, 'memory_budget', e.memory_budget, 'memory_used', e.memory_used,"         \
    " 'training_slots', e.training_slots, 'sampler_snapshots', e.sampler_snapshots,"           \
    " 'cached_checkpoints', e.cached_checkpoints, 'gpu_utilization', e.gpu_utilization,"       \
    " 'gpu_memory_used', e.gpu_memory_used, 'gpu_memory_total', e.gpu_memory_total,"           \
    " 'gpu_temperature', e.gpu_temperature, 'gpu_power_watts', e.gpu_power_watts,"             \
    " 'expert_tokens', e.expert_tokens,"                                                       \
    " 'cycle', (SELECT c.id FROM cycles c WHERE c.executor_id = e.id AND c.state IN"           \
    " ('assigned','running') ORDER BY c.id LIMIT 1))"

/* -> {"tenants", "queue", "executors", "now"}. tenants: every tenant with its runs, what it
 * has pending and its tokens by kind (the folded loom_tenant_tokens_total; fold first);
 * queue: queued and claimed operations by state, kind, base model and tenant. */
#define SQL_CON_ADMIN_OVERVIEW                                                                \
    "WITH pend AS (SELECT o.tenant_id, count(*) AS n FROM operations o"                        \
    " WHERE o.state IN ('queued','claimed') GROUP BY 1)"                                       \
    " SELECT json_build_object('now', " CON_ISO("now()") ","                                    \
    " 'tenants', (SELECT COALESCE(json_agg(x ORDER BY x.name), '[]') FROM (SELECT t.id, t.name," \
    " " CON_ISO("t.created_at") " AS created_at,"                                               \
    " (SELECT count(*) FROM models m WHERE m.tenant_id = t.id) AS runs,"                       \
    " (SELECT count(*) FROM models m WHERE m.tenant_id = t.id AND m.status = 'active') AS active_runs," \
    " COALESCE((SELECT pend.n FROM pend WHERE pend.tenant_id = t.id), 0) AS pending,"           \
    " (SELECT count(*) FROM api_keys k WHERE k.tenant_id"                                       \
    " = t.id AND k.revoked_at IS NULL) AS keys, (SELECT COALESCE(json_object_agg(c.labels->>"  \
    "'kind', c.value), '{}') FROM metric_counters c WHERE c.family = 'loom_tenant_tokens_total'" \
    " AND c.labels->>'tenant' = t.name) AS tokens FROM tenants t) x),"                          \
    " 'queue', (SELECT COALESCE(json_agg(q ORDER BY q.state, q.base_model, q.kind, q.tenant), '[]')" \
    " FROM (SELECT o.state, o.kind, COALESCE(m.base_model, s.base_model) AS base_model,"       \
    " t.name AS tenant, count(*) AS n, round(extract(epoch FROM now() - min(o.created_at))"    \
    "::numeric, 1) AS oldest_s FROM operations o JOIN tenants t ON t.id = o.tenant_id"         \
    " LEFT JOIN models m ON m.id = o.model_id LEFT JOIN sampling_sessions s"                   \
    " ON s.id = o.sampling_session_id WHERE o.state IN ('queued','claimed')"                   \
    " GROUP BY 1, 2, 3, 4) q),"                                                                \
    " 'executors', (SELECT COALESCE(json_agg(x.j ORDER BY x.id DESC), '[]') FROM (SELECT e.id," \
    " " CON_EXECUTOR_JSON " AS j FROM executors e WHERE NOT e.gone UNION ALL"                   \
    " (SELECT e.id, " CON_EXECUTOR_JSON " FROM executors e WHERE e.gone"                       \
    " ORDER BY e.id DESC LIMIT 5)) x))::text"

/* $1 limit -> {"cycles": [...], "now"}: the newest cycles, each with its executor and the
 * tenants that shared it (operations, tokens, models of each). */
#define SQL_CON_ADMIN_CYCLES                                                                  \
    "SELECT json_build_object('now', " CON_ISO("now()") ", 'cycles', COALESCE((SELECT"          \
    " json_agg(x ORDER BY x.id DESC) FROM (SELECT c.id, c.executor_id, e.name AS executor,"    \
    " e.hostname AS host, e.device_index AS device, e.base_model, c.state, c.n_ops, c.n_tokens," \
    " " CON_ISO("c.created_at") " AS created_at, " CON_ISO("c.started_at") " AS started_at,"   \
    " " CON_ISO("c.finished_at") " AS finished_at, round((extract(epoch FROM c.finished_at"    \
    " - c.started_at) * 1000)::numeric, 1) AS ms, (SELECT COALESCE(json_agg(json_build_object(" \
    "'tenant', t.name, 'ops', y.n, 'tokens', y.tok, 'models', y.models, 'kinds', y.kinds)"     \
    " ORDER BY t.name), '[]') FROM (SELECT o.tenant_id, count(*) AS n, sum(o.n_tokens) AS tok," \
    " count(DISTINCT o.model_id) AS models, json_agg(DISTINCT o.kind) AS kinds"                \
    " FROM operations o WHERE o.cycle_id = c.id GROUP BY 1) y JOIN tenants t"                  \
    " ON t.id = y.tenant_id) AS tenants FROM cycles c JOIN executors e"                        \
    " ON e.id = c.executor_id ORDER BY c.id DESC LIMIT $1::int) x), '[]'))::text"

#define SQL_CON_FOLD "SELECT loom_metrics_fold()"
