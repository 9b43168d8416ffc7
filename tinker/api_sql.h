/* api_sql.h: the SQL statements of the Tinker routes (and those the OpenAI routes share
 * with them), by name. Parameters are always bound ($n), never spliced. Tenant scoping
 * lives here: a row of another tenant is simply not found. The HTTP runtime's own (key
 * checks, worker sessions) are in core/core_sql.h, the registry's in registry/reg_sql.h. */
#pragma once
#include "common/common_sql.h"
#include "contract/contract.h"
#include "registry/reg_sql.h"

/* ---- base models -------------------------------------------------------------------- */
#define SQL_BASE_MODELS_LIST "SELECT name, max_context FROM base_models ORDER BY name"
/* $1 name -> max_context, vocab_size */
#define SQL_BASE_MODEL_GET "SELECT max_context, vocab_size FROM base_models WHERE name = $1"
/* $1 name -> its directory (its tokenizer, api_state.c) */
#define SQL_BASE_MODEL_DIR "SELECT path FROM base_models WHERE name = $1"
/* A live executor: not written off, and it beat within $N seconds (--executor-timeout-s,
 * the silence after which the scheduler writes it off). */
#define SQL_EXECUTOR_LIVE(e, secs)                                                          \
    "NOT " e ".gone AND " e ".heartbeat_at > now() - make_interval(secs => " secs "::int)"
/* $1 executor timeout seconds -> every base model with the live executors serving it
 * that take work, and those draining (readiness) */
#define SQL_READY                                                                           \
    "SELECT b.name, count(e.id) FILTER (WHERE NOT e.draining), count(e.id) FILTER (WHERE e.draining)" \
    " FROM base_models b LEFT JOIN executors e ON e.base_model = b.name"                    \
    " AND " SQL_EXECUTOR_LIVE("e", "$1") " GROUP BY b.name ORDER BY b.name"
#define SQL_BASE_MODEL_NAMES                                                                \
    "SELECT COALESCE(string_agg(name, ', ' ORDER BY name), '') FROM base_models"

/* ---- sessions ----------------------------------------------------------------------- */
/* $1 id, $2 tenant, $3 tags (JSON array of strings), $4 user_metadata (JSON or NULL),
 * $5 sdk_version, $6 project_id, $7 display_name */
#define SQL_SESSION_CREATE                                                                  \
    "INSERT INTO sessions (id, tenant_id, tags, user_metadata, sdk_version, project_id,"    \
    " display_name) VALUES ($1, $2, ARRAY(SELECT jsonb_array_elements_text($3::jsonb)),"    \
    " $4::jsonb, $5, $6, $7)"
/* $1 id, $2 tenant -> beats counted (0 or 1), whether it expired, how it finished (NULL:
 * not finished, or not the tenant's session) */
#define SQL_SESSION_HEARTBEAT                                                               \
    "WITH u AS (UPDATE sessions SET last_heartbeat_at = now() WHERE id = $1 AND tenant_id = $2" \
    " AND expired_at IS NULL AND finished_at IS NULL RETURNING 1)"                          \
    " SELECT (SELECT count(*) FROM u), s.expired_at IS NOT NULL, s.finish_reason"           \
    " FROM (SELECT 1) one LEFT JOIN sessions s ON s.id = $1 AND s.tenant_id = $2"
/* A session's SessionStatus (SDK ≈0.38): how its client finished it; active while it
 * neither finished nor expired; NULL once it expired unfinished ("neither finished nor
 * known to be running"). */
#define SQL_SESSION_STATUS(s)                                                               \
    "CASE WHEN " s ".finished_at IS NOT NULL THEN json_build_object('type', 'client_finished'," \
    " 'reason', json_build_object('type', " s ".finish_reason), 'detail', " s ".finish_detail)" \
    " WHEN " s ".expired_at IS NULL THEN json_build_object('type', 'active') END"
/* The answer of sessions/{id}/finish for sessions row s */
#define SQL_SESSION_FINISH_JSON(s)                                                          \
    "json_build_object('session_id', " s ".id, 'reason', " s ".finish_reason, 'detail', "   \
    s ".finish_detail, 'finished_at', " SQL_ISO_TIME(s ".finished_at") ", 'status', "      \
    SQL_SESSION_STATUS(s) ")::text"
/* $1 id, $2 tenant, $3 reason, $4 detail: the first finish of the session wins -> the
 * answer, or no row when it had finished already (or is not the tenant's) */
#define SQL_SESSION_FINISH                                                                  \
    "UPDATE sessions s SET finished_at = now(), finish_reason = $3, finish_detail = $4"     \
    " WHERE s.id = $1 AND s.tenant_id = $2 AND s.finished_at IS NULL"                       \
    " RETURNING " SQL_SESSION_FINISH_JSON("s")
/* $1 id, $2 tenant, $3 project -> a row when the session is the tenant's */
#define SQL_SESSION_SET_PROJECT                                                             \
    "UPDATE sessions SET project_id = $3 WHERE id = $1 AND tenant_id = $2 RETURNING id"
/* $1 id, $2 tenant -> the answer of a later finish (the first one's reason) */
#define SQL_SESSION_FINISHED                                                                \
    "SELECT " SQL_SESSION_FINISH_JSON("s") " FROM sessions s WHERE s.id = $1 AND s.tenant_id = $2"
/* $1 id, $2 tenant -> whether it expired, how its client finished it (NULL: it did not);
 * locks the row */
#define SQL_SESSION_LOCK                                                                    \
    "SELECT expired_at IS NOT NULL, finish_reason FROM sessions WHERE id = $1"              \
    " AND tenant_id = $2 FOR UPDATE"
/* Every submit bound to a session (an operation of one of its models or samplers, a model
 * or sampler created in it) counts as a sign of life of the session, as a heartbeat does:
 * clients without heartbeats keep theirs by working. Written at most every 5 s
 * (SQL_SESSION_TOUCH_EVERY), in the submit's own statement or transaction: the write
 * costs no commit of its own. `session`: an SQL expression for the session's id. */
#define SQL_SESSION_TOUCH_EVERY "interval '5 seconds'"
#define SQL_SESSION_TOUCH(session)                                                          \
    "UPDATE sessions SET last_heartbeat_at = now() WHERE id = (" session ")"                \
    " AND expired_at IS NULL AND last_heartbeat_at < now() - " SQL_SESSION_TOUCH_EVERY
/* Three CTEs for a submit's statement: `touch` (the touch above), `held` and `live` (one
 * row: ok, whether the session may take the submit). The check before the submit read the
 * session as not expired; the scheduler may expire it in between only when it had been
 * silent for the whole timeout, so when the touch was due. Then the touch either wrote
 * the row (and holds it: the expiry skips locked sessions) or found it expired meanwhile
 * (it re-reads a row changed under it), or found it touched meanwhile by another submit
 * of the session that held it first: ok is "touched, or touched within 5 s and not
 * expired" as the statement's snapshot saw it (a session that needed no touch: the
 * timeout is well above 5 s, docs/operating.md), or else "not expired" in the row as it
 * is now, read with a lock the expiry skips (`held`: FOR KEY SHARE re-reads a row changed
 * since the snapshot, and keeps it from expiring until the submit commits). Without that
 * last case a submit that lost the touch to another one of the same moment saw the old
 * heartbeat and was refused as expired (tests/concurrent_submits_test.py). `held` is read
 * only when the first two fail (OR stops at the first true). */
#define SQL_SESSION_TOUCH_LIVE(session)                                                     \
    "touch AS (" SQL_SESSION_TOUCH(session) " RETURNING 1),"                                \
    " held AS (SELECT 1 FROM sessions hs WHERE hs.id = (" session ") AND hs.expired_at IS NULL" \
    "   FOR KEY SHARE OF hs),"                                                              \
    " live AS (SELECT EXISTS (SELECT 1 FROM touch) OR EXISTS (SELECT 1 FROM sessions ls"    \
    "   WHERE ls.id = (" session ") AND ls.expired_at IS NULL"                               \
    "   AND ls.last_heartbeat_at >= now() - " SQL_SESSION_TOUCH_EVERY ")"                   \
    "   OR EXISTS (SELECT 1 FROM held) AS ok)"
/* $1 id (locked by SQL_SESSION_LOCK: the caller's) */
#define SQL_SESSION_TOUCH_ID SQL_SESSION_TOUCH("$1")
/* $1 session -> next free model_seq_id */
#define SQL_SESSION_NEXT_MODEL_SEQ                                                          \
    "SELECT COALESCE(max(model_seq_id) + 1, 0) FROM models WHERE session_id = $1"

/* ---- models --------------------------------------------------------------------------- */
/* $1 id .. $11 user_metadata, $12 optimizer family; no row back when (session_id,
 * model_seq_id) exists */
#define SQL_MODEL_INSERT                                                                    \
    "INSERT INTO models (id, tenant_id, session_id, model_seq_id, base_model, lora_rank,"   \
    " lora_seed, train_attn, train_mlp, train_unembed, user_metadata, optimizer)"           \
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, $12)"                    \
    " ON CONFLICT DO NOTHING RETURNING id"
/* $1 model, $2 tenant -> status, vocab_size, max_context, session_id, base_model, whether
 * its session expired, the tenant's queued-operations limit and its operations queued or
 * running (at most the limit), the optimizer family, how its session's client finished
 * it (NULL: it did not). Only reads: the submit that follows touches the session
 * (SQL_OP_SUBMIT, SQL_OP_TOUCH_SESSION). The model is found by its id alone and its tenant
 * checked after (OFFSET 0): with statistics taken when the tenant had few models,
 * PostgreSQL read all of them through models_tenant. */
#define SQL_MODEL_FOR_OP                                                                    \
    "SELECT m.status, b.vocab_size, b.max_context, m.session_id, m.base_model,"            \
    " s.expired_at IS NOT NULL, l.max_queued_ops, CASE WHEN l.max_queued_ops IS NOT NULL THEN" \
    " (SELECT count(*) FROM (SELECT 1 FROM operations q WHERE q.tenant_id = $2"             \
    " AND q.state IN ('queued', 'claimed') LIMIT l.max_queued_ops) q) END, m.optimizer,"   \
    " s.finish_reason"                                                                      \
    " FROM (SELECT * FROM models WHERE id = $1 OFFSET 0) m"                                 \
    " JOIN base_models b ON b.name = m.base_model JOIN sessions s ON s.id = m.session_id"   \
    " LEFT JOIN tenant_limits l ON l.tenant_id = m.tenant_id"                               \
    " WHERE m.tenant_id = $2"
/* $1 model, $2 tenant -> id, lora_rank, base_model, arch, tokenizer_id, train_attn,
 * train_mlp, train_unembed, the base model's config.json */
#define SQL_MODEL_INFO                                                                      \
    "SELECT m.id, m.lora_rank, m.base_model, b.arch,"                                       \
    " COALESCE(b.config->>'tokenizer_id', b.name), m.train_attn, m.train_mlp,"              \
    " m.train_unembed, b.config::text FROM models m"                                        \
    " JOIN base_models b ON b.name = m.base_model WHERE m.id = $1 AND m.tenant_id = $2"
/* $1 base model -> its config.json */
#define SQL_BASE_MODEL_CONFIG "SELECT config::text FROM base_models WHERE name = $1"
#define SQL_MODEL_LOCK "SELECT 1 FROM models WHERE id = $1 FOR UPDATE"
#define SQL_MODEL_NEXT_SEQ                                                                  \
    "SELECT COALESCE(max(seq_id), 0) + 1 FROM operations WHERE model_id = $1"

/* ---- operations (queue + futures) ---------------------------------------------------- */
/* $1 request_id, $2 tenant, $3 model, $4 seq_id, $5 kind, $6 payload, $7 n_tokens, $8
 * payload_bin (binary parameter; NULL but for forward / forward_backward) */
#define SQL_OP_INSERT                                                                       \
    "INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, n_tokens," \
    " payload_bin) VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8::bytea)"                   \
    " ON CONFLICT (model_id, seq_id) DO NOTHING RETURNING request_id"
/* The session of a tenant's model that takes work, as SQL (`model`, `tenant`: parameters):
 * none when the model is no longer active or its session was finished by its client, so
 * that a submit refuses what changed since its model check (a check remembered for a
 * moment, op_model_check_recent; an unload between the two) */
#define SQL_MODEL_SESSION(model, tenant)                                                    \
    "SELECT m.session_id FROM " SQL_MODEL_BY_ID(model) " m"                                 \
    " WHERE m.tenant_id = " tenant " AND m.status = 'active'"                               \
    " AND (SELECT fs.finished_at IS NULL FROM sessions fs WHERE fs.id = m.session_id)"
/* The model by its id alone, its tenant checked after (docs/architecture.md, "Bounded by
 * the work"): OFFSET 0 keeps PostgreSQL from reaching it through the tenant's index of
 * active models instead, which with statistics from before a tenant opened many models
 * read every one of them on every submit (test_bounded_queries, idle_models_check). */
#define SQL_MODEL_BY_ID(model) "(SELECT * FROM models WHERE id = " model " OFFSET 0)"
/* The same in one statement, its own transaction, touching the model's session
 * (SQL_SESSION_TOUCH_LIVE) and waking whoever builds its cycle: the common submit (an
 * explicit seq_id), one round trip and one durable commit. -> whether the session took it
 * (false: it expired since the model check; nothing inserted), the request_id (NULL:
 * (model, seq_id) was taken), and the wake-up it leaves in DB_NOTIFY_LEFT ('' for none),
 * which db_query_bin_notify sends after the commit, in a transaction that does not wait
 * for the disk (common_sql.h, SQL_NOTIFY_AFTER: a pg_notify here would hold every other
 * notifying commit of the database behind this one's WAL flush). A model placed on an
 * executor that is idle wakes that executor
 * (CYCLE_HINT_QUEUED on its channel), which builds its own cycle without a scheduler
 * round trip. A busy one (not listening: nothing is delivered) looks for waiting work
 * itself when its cycle commits (SQL_EXE_WORK_WAITS), and a scheduler's pass could not
 * give it any before: the hint goes to its channel too, and reaches it when its commit
 * (idle and listening from then) came between this submit's look and its notification,
 * which covers the one case its own look misses (its commit after this look, its look
 * before this commit). A model placed nowhere, or on a draining or gone executor,
 * wakes the scheduler (placement). A forward_backward of a model that usually sends
 * its optim_step right after (pair_p, rule 5) tells the executor so (CYCLE_HINT_PAIR with
 * the model's gap), which holds it for the step, as the scheduler would, without a pass:
 * the step's submit wakes it, and it claims both, or it looks when the hold ends and
 * claims the forward_backward alone. Either hint carries what the executor's pass would
 * read of the operation and its model (contract.h), so that a lone operation, or a held
 * forward_backward and its step, is planned from the hints and claimed in one round trip.
 * The executor
 * wakes the scheduler when it claimed nothing for another reason (a seq gap, work of
 * another executor), and the scheduler's poll covers a lost hint. The model and its
 * session are read once (`src`, materialized: the three CTEs of the touch and the wake-up
 * each read it again otherwise). */
#define SQL_OP_SUBMIT                                                                       \
    "WITH src AS MATERIALIZED (SELECT m.session_id, m.executor_id, m.pair_p,"              \
    "   coalesce(m.pair_gap_ms, -1) AS pair_gap_ms, m.next_seq,"                            \
    "   coalesce(extract(epoch FROM m.tail_fb_at) * 1000, -1) AS tail_ms"                   \
    "   FROM " SQL_MODEL_BY_ID("$3") " m WHERE m.tenant_id = $2 AND m.status = 'active'"     \
    "   AND (SELECT fs.finished_at IS NULL FROM sessions fs WHERE fs.id = m.session_id)),"  \
    " " SQL_SESSION_TOUCH_LIVE("SELECT session_id FROM src") ","                            \
    " ins AS (INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, n_tokens," \
    " payload_bin) SELECT $1, $2::bigint, $3, $4::bigint, $5, $6::jsonb, $7::int, $8::bytea"  \
    " FROM live WHERE live.ok"                                                              \
    " ON CONFLICT (model_id, seq_id) DO NOTHING"                                            \
    " RETURNING request_id, id, seq_id, n_tokens, tenant_id, model_id, kind, created_at)"   \
    " SELECT live.ok, i.request_id, set_config('" DB_NOTIFY_LEFT "', coalesce(i.note, ''), false)" \
    " FROM live LEFT JOIN"                                                                  \
    " (SELECT request_id, coalesce((SELECT '" CHAN_CYCLE "_' || e.id FROM src"              \
    "   JOIN executors e ON e.id = src.executor_id WHERE NOT e.gone AND NOT e.draining),"        \
    "   '" CHAN_OP_QUEUED "') || E'\\n' || (SELECT concat_ws(' ', CASE WHEN ins.kind = '" OP_FORWARD_BACKWARD "'" \
    "   AND src.pair_p > 0.5 THEN '" CYCLE_HINT_PAIR " ' || round(src.pair_gap_ms::numeric, 3)" \
    "   ELSE '" CYCLE_HINT_QUEUED "' END, ins.id, ins.seq_id, src.next_seq, ins.n_tokens,"     \
    "   extract(epoch FROM ins.created_at) * 1000, ins.tenant_id, EXISTS (SELECT 1 FROM"     \
    "   tenant_limits l WHERE l.tenant_id = ins.tenant_id AND l.tokens_per_minute IS NOT NULL)::int," \
    "   src.pair_p, src.pair_gap_ms, src.tail_ms, ins.kind, ins.model_id)"                  \
    "   FROM src) AS note FROM ins) i ON true"
/* $1 model, $2 tenant: the submit's touch in the transaction of a submit that
 * takes more than one statement (op_submit), before it locks the model (the expiry locks
 * the session, then its models) -> whether the session may take it (as above). */
#define SQL_OP_TOUCH_SESSION                                                                \
    "WITH " SQL_SESSION_TOUCH_LIVE(SQL_MODEL_SESSION("$1", "$2")) " SELECT ok FROM live"
/* $1 request_id, $2 tenant, $3 model, $4 seq_id, $5 kind, $6 error, $7 HTTP status: a
 * submit the api refused, kept as a failed operation (payload {"rejected": status}) so
 * that the model's later seq_ids run (the client has used the seq_id up). Only on the
 * tenant's own active model and a free seq_id. When the model waits for just this seq_id
 * it moves past it at once; the scheduler passes over any others (sched_skip_settled). */
#define SQL_OP_RECORD_REJECTED                                                              \
    "WITH ins AS (INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind,"   \
    " payload, state, error, error_category, finished_at)"                                  \
    " SELECT $1, $2, m.id, $4, $5, jsonb_build_object('rejected', $7::int), 'failed', $6,"  \
    " 'user', now() FROM models m"                                                          \
    " WHERE m.id = $3 AND m.tenant_id = $2 AND m.status = 'active'"                         \
    " ON CONFLICT (model_id, seq_id) DO NOTHING RETURNING model_id, seq_id),"               \
    " adv AS (UPDATE models m SET next_seq = m.next_seq + 1 FROM ins"                       \
    "   WHERE m.id = ins.model_id AND m.next_seq = ins.seq_id)"                              \
    " SELECT pg_notify('" CHAN_OP_QUEUED "', '') FROM ins"
/* $1 model, $2 seq_id -> request_id, kind, refused at submit, error */
#define SQL_OP_EXISTING                                                                     \
    "SELECT request_id, kind, payload ? 'rejected', error FROM operations"                  \
    " WHERE model_id = $1 AND seq_id = $2"
/* Tokens the tenant's operations claimed into cycles in the last minute (its rate limit). */
#define SQL_TENANT_TOKENS_LAST_MINUTE(tenant)                                               \
    "(SELECT coalesce(sum(r.n_tokens), 0) FROM operations r WHERE r.tenant_id = " tenant    \
    " AND r.claimed_at > now() - interval '1 minute')"
/* $1 request_id, $2 tenant, $3 the tenant's queued-sample limit, $4 executor timeout
 * seconds -> state, result text, error, error_category, kind, model_id, seq_id, cycle_id,
 * and for a pending operation why it waits: base model, whether a live executor serves
 * it, the model's next_seq, whether no operation exists at next_seq (a gap), the tenant's
 * queued samples (at most $3, for samples), its tokens per minute limit, the tokens
 * claimed in the last minute, and the name of the draining executor that holds the
 * weights of a sample's sampler snapshot (not handed over to the pool); last (16) a
 * forward / forward_backward's packed result (contract/fb_result.h). Run with binary
 * results (db_query_bin): result_bin comes as its bytes; every other column is text,
 * which binary results carry as they are. The operation is found by its request_id alone
 * (unique) and its tenant checked after: OFFSET 0 keeps PostgreSQL from choosing a
 * tenant's index instead, which without statistics read every operation of the tenant. */
#define SQL_FUTURE_GET                                                                      \
    "SELECT o.state, o.result::text, o.error, o.error_category, o.kind, o.model_id,"        \
    " o.seq_id::text, o.cycle_id::text, x.base_model, x.served::text, x.next_seq::text,"    \
    " x.gap::text, x.queued_samples::text, x.tokens_per_minute::text,"                      \
    " x.tokens_last_minute::text, x.holder_draining, o.result_bin"                          \
    " FROM (SELECT * FROM operations WHERE request_id = $1 OFFSET 0) o"                     \
    " LEFT JOIN LATERAL (SELECT COALESCE(m.base_model, s.base_model)"                       \
    "   AS base_model, EXISTS (SELECT 1 FROM executors e WHERE " SQL_EXECUTOR_LIVE("e", "$4") \
    "   AND e.base_model = COALESCE(m.base_model, s.base_model)) AS served, m.next_seq,"   \
    "   m.id IS NOT NULL AND o.seq_id > m.next_seq AND NOT EXISTS (SELECT 1 FROM"           \
    "   operations g WHERE g.model_id = m.id AND g.seq_id = m.next_seq) AS gap,"            \
    "   CASE WHEN o.kind = '" OP_SAMPLE "' THEN (SELECT count(*) FROM (SELECT 1 FROM operations q" \
    "   WHERE q.tenant_id = o.tenant_id AND q.kind = '" OP_SAMPLE "' AND q.state = 'queued'"       \
    "   LIMIT $3) q) END AS queued_samples, l.tokens_per_minute,"                          \
    "   CASE WHEN l.tokens_per_minute IS NOT NULL THEN " SQL_TENANT_TOKENS_LAST_MINUTE("o.tenant_id") \
    "   END AS tokens_last_minute, (SELECT h.name FROM executors h WHERE h.id = s.executor_id" \
    "   AND s.snapshot_digest IS NULL AND h.draining AND NOT h.gone) AS holder_draining"        \
    "   FROM (SELECT 1) one LEFT JOIN models m ON m.id = o.model_id"                        \
    "   LEFT JOIN sampling_sessions s ON s.id = o.sampling_session_id"                      \
    "   LEFT JOIN tenant_limits l ON l.tenant_id = o.tenant_id"                             \
    "   WHERE o.state IN ('queued', 'claimed')) x ON true"                                  \
    " WHERE o.tenant_id = $2"

/* ---- sampling sessions (docs/protocol.md §3.3, §3.4, §7.6 unnamed form) ----------------- */
/* $1 tinker_path, $2 tenant -> version id, base_model, blob_digest, base model served.
 * A checkpoint the tenant may read (the registry's rule, REG_READABLE): its own, public,
 * or granted; live and unexpired. */
#define SQL_CHECKPOINT_READABLE                                                             \
    "SELECT v.id, v.base_model, v.blob_digest, b.name IS NOT NULL" REG_FROM                 \
    " LEFT JOIN base_models b ON b.name = v.base_model"                                     \
    " WHERE v.tinker_path = $1 AND " REG_LIVE " AND " REG_READABLE                          \
    " ORDER BY v.id DESC LIMIT 1"
/* $1 session -> next free sampling_session_seq_id */
#define SQL_SESSION_NEXT_SAMPLING_SEQ                                                       \
    "SELECT COALESCE(max(seq_id) + 1, 0) FROM sampling_sessions WHERE session_id = $1"
/* $1 id, $2 tenant, $3 session, $4 seq, $5 base_model, $6 model_path, $7 source_model_id,
 * $8 source_seq_id, $9 adapter_version_id; no row back when (session, seq) is taken */
#define SQL_SAMPLING_SESSION_INSERT                                                         \
    "INSERT INTO sampling_sessions (id, tenant_id, session_id, seq_id, base_model,"         \
    " model_path, source_model_id, source_seq_id, adapter_version_id)"                      \
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING RETURNING id"
/* $1 id, $2 tenant -> id, base_model, model_path, source_model_id, adapter_version_id */
#define SQL_SAMPLING_SESSION_GET                                                            \
    "SELECT id, base_model, model_path, source_model_id, adapter_version_id"                \
    " FROM sampling_sessions WHERE id = $1 AND tenant_id = $2"
/* $1 id, $2 tenant -> vocab_size, max_context, source, blob_digest, checkpoint gone,
 * model_path, checkpoint still readable by the tenant (access is checked again at every
 * sample: an unpublished checkpoint or a revoked share ends another tenant's sampling),
 * whether the sampler's session expired, how its client finished it (NULL: it did not).
 * Only reads: the sample's submit touches that session (SQL_SAMPLE_SUBMIT). */
#define SQL_SAMPLER_FOR_OP                                                                  \
    "SELECT b.vocab_size, b.max_context,"                                                   \
    " CASE WHEN s.source_model_id IS NOT NULL THEN 'snapshot'"                              \
    "      WHEN s.adapter_version_id IS NOT NULL THEN 'checkpoint' ELSE 'base' END,"        \
    " v.blob_digest, NOT (" REG_LIVE "), s.model_path, v.id IS NULL OR " REG_READABLE ","   \
    " ss.expired_at IS NOT NULL, ss.finish_reason"                                          \
    " FROM sampling_sessions s JOIN base_models b ON b.name = s.base_model"                 \
    " JOIN sessions ss ON ss.id = s.session_id"                                             \
    " LEFT JOIN adapter_versions v ON v.id = s.adapter_version_id"                          \
    " LEFT JOIN adapters a ON a.id = v.adapter_id"                                          \
    " WHERE s.id = $1 AND s.tenant_id = $2"

/* ---- sample operations (§11) ------------------------------------------------------- */
/* $1 sampling_session_id, $2 seq_id -> request_id, the num_samples it was submitted with */
#define SQL_SAMPLE_EXISTING                                                                 \
    "SELECT request_id, COALESCE((payload->>'num_samples')::int, 1) FROM operations"         \
    " WHERE sampling_session_id = $1 AND seq_id = $2"
/* $1 tenant, $2 limit -> min(queued sample ops of the tenant, limit) */
#define SQL_TENANT_QUEUED_SAMPLES                                                           \
    "SELECT count(*) FROM (SELECT 1 FROM operations WHERE tenant_id = $1"                   \
    " AND kind = '" OP_SAMPLE "' AND state = 'queued' LIMIT $2) q"
/* $1 request_id, $2 tenant, $3 sampling_session_id, $4 seq_id (NULL: no de-duplication),
 * $5 payload, $6 n_tokens -> request_id when inserted. The caller's commit wakes the
 * scheduler (db_commit_notify). */
#define SQL_SAMPLE_INSERT                                                                   \
    "INSERT INTO operations (request_id, tenant_id, sampling_session_id,"                    \
    " seq_id, kind, payload, n_tokens) VALUES ($1, $2, $3, $4, '" OP_SAMPLE "', $5::jsonb, $6)"    \
    " ON CONFLICT (sampling_session_id, seq_id) WHERE sampling_session_id IS NOT NULL"      \
    " DO NOTHING RETURNING request_id"
/* The same for asample (§11), touching the sampler's session in the same statement
 * (SQL_SESSION_TOUCH_LIVE; the OpenAI routes' own session needs none) -> whether the
 * session took it (false: it expired since the sampler check; nothing inserted), the
 * request_id (NULL: (sampler, seq_id) was taken), and the scheduler's wake-up left in
 * DB_NOTIFY_LEFT for db_query_bin_notify to send after the commit (as SQL_OP_SUBMIT's). */
#define SQL_SAMPLER_SESSION "SELECT session_id FROM sampling_sessions WHERE id = $3 AND tenant_id = $2"
#define SQL_SAMPLE_SUBMIT                                                                   \
    "WITH " SQL_SESSION_TOUCH_LIVE(SQL_SAMPLER_SESSION) ","                                  \
    " ins AS (INSERT INTO operations (request_id, tenant_id, sampling_session_id,"          \
    " seq_id, kind, payload, n_tokens) SELECT $1, $2::bigint, $3, $4::bigint, '" OP_SAMPLE "',"  \
    " $5::jsonb, $6::int FROM live WHERE live.ok"                                           \
    " ON CONFLICT (sampling_session_id, seq_id) WHERE sampling_session_id IS NOT NULL"      \
    " DO NOTHING RETURNING request_id)"                                                     \
    " SELECT live.ok, i.request_id, set_config('" DB_NOTIFY_LEFT "', coalesce(i.note, ''), false)" \
    " FROM live LEFT JOIN (SELECT request_id, '" CHAN_OP_QUEUED "' || E'\\n' AS note FROM ins) i ON true"

/* ---- unload_model (§7.8) ------------------------------------------------------------- */
/* $1 model, $2 tenant -> status, request_id of an earlier unload_model or NULL; locks it */
#define SQL_MODEL_FOR_UNLOAD                                                                \
    "SELECT m.status, (SELECT o.request_id FROM operations o WHERE o.model_id = m.id"       \
    " AND o.kind = '" OP_UNLOAD_MODEL "' ORDER BY o.id LIMIT 1)"                                   \
    " FROM models m WHERE m.id = $1 AND m.tenant_id = $2 FOR UPDATE OF m"
/* $1 request_id, $2 tenant, $3 model, $4 result: a future that is done at once */
#define SQL_UNLOAD_OP_INSERT                                                                \
    "INSERT INTO operations (request_id, tenant_id, model_id, kind, payload, state, result," \
    " metrics, finished_at) VALUES ($1, $2, $3, '" OP_UNLOAD_MODEL "', '{}', 'done', $4::jsonb," \
    " $4::jsonb->'metrics', now())"
#define SQL_MODEL_SET_UNLOADED "UPDATE models SET status = 'unloaded' WHERE id = $1"
/* $1 model: operations still queued will never run; their futures fail now. */
#define SQL_MODEL_CANCEL_QUEUED                                                             \
    "WITH c AS (UPDATE operations SET state = 'canceled', finished_at = now(),"             \
    " error_category = 'user', error = 'model ' || model_id || ' was unloaded before this"  \
    " operation ran; create a new model (or load a checkpoint) to continue'"                \
    " WHERE model_id = $1 AND state = 'queued' RETURNING request_id)"                       \
    " SELECT pg_notify('" CHAN_OP_DONE "', request_id) FROM c"

/* ---- REST reads (§12.1, §12.2) ------------------------------------------------------- */
#define SQL_ISO_TIME(x) "to_char((" x ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
/* A Checkpoint object of adapter_versions row av. */
#define SQL_CHECKPOINT_JSON                                                                 \
    "json_build_object('checkpoint_id', CASE av.kind WHEN 'training' THEN 'weights/'"       \
    " ELSE 'sampler_weights/' END || av.name, 'checkpoint_type', av.kind,"                  \
    " 'time', " SQL_ISO_TIME("av.created_at") ", 'tinker_path', av.tinker_path,"            \
    " 'size_bytes', av.size_bytes, 'public', av.visibility = 'public',"                     \
    " 'expires_at', " SQL_ISO_TIME("av.expires_at") ", 'user_metadata', av.user_metadata," \
    " 'base_model', av.base_model)"
/* The newest live Checkpoint of kind k of model m, or NULL. */
#define SQL_LAST_CHECKPOINT(k)                                                              \
    "(SELECT " SQL_CHECKPOINT_JSON " FROM adapter_versions av"                              \
    " JOIN adapters a ON a.id = av.adapter_id WHERE a.model_id = m.id AND av.kind = '" k "'" \
    " AND av.deleted_at IS NULL AND (av.expires_at IS NULL OR av.expires_at > now())"      \
    " ORDER BY av.created_at DESC, av.id DESC LIMIT 1)"
/* A TrainingRun object of models row m (owner: tenants row t). */
#define SQL_TRAINING_RUN_JSON                                                               \
    "json_build_object('training_run_id', m.id, 'base_model', m.base_model,"                \
    " 'model_owner', t.name, 'is_lora', true, 'corrupted', m.status = 'failed',"            \
    " 'lora_rank', m.lora_rank, 'last_request_time', " SQL_ISO_TIME("m.last_request_at") "," \
    " 'last_checkpoint', " SQL_LAST_CHECKPOINT("training") ","                              \
    " 'last_sampler_checkpoint', " SQL_LAST_CHECKPOINT("sampler") ","                       \
    " 'user_metadata', m.user_metadata, 'status', m.status)"
/* Model m's session is in project p (a text parameter; NULL: any project). */
#define SQL_RUN_IN_PROJECT(m, p)                                                            \
    "(" p "::text IS NULL OR EXISTS (SELECT 1 FROM sessions ps WHERE ps.id = " m ".session_id" \
    " AND ps.project_id = " p "::text))"
/* $1 tenant, $2 limit, $3 offset -> the whole response (newest first) */
#define SQL_TRAINING_RUNS_LIST                                                              \
    "SELECT json_build_object('training_runs', COALESCE((SELECT json_agg(r.j ORDER BY"      \
    " r.created_at DESC, r.id) FROM (SELECT m.id, m.created_at, " SQL_TRAINING_RUN_JSON     \
    " AS j FROM models m JOIN tenants t ON t.id = m.tenant_id WHERE m.tenant_id = $1"       \
    " AND " SQL_RUN_IN_PROJECT("m", "$4")                                                   \
    " ORDER BY m.created_at DESC, m.id LIMIT $2::bigint OFFSET $3::bigint) r), '[]'),"      \
    " 'cursor', json_build_object('offset', $3::bigint, 'limit', $2::bigint,"               \
    " 'total_count', (SELECT count(*) FROM models m WHERE m.tenant_id = $1 AND "            \
    SQL_RUN_IN_PROJECT("m", "$4") ")))::text"
/* $1 model, $2 tenant -> TrainingRun */
#define SQL_TRAINING_RUN_GET                                                                \
    "SELECT " SQL_TRAINING_RUN_JSON "::text FROM models m JOIN tenants t"                   \
    " ON t.id = m.tenant_id WHERE m.id = $1 AND m.tenant_id = $2"
/* The live checkpoints of session s's models: a LATERAL row (n, bytes) */
#define SQL_SESSION_CHECKPOINTS(s)                                                          \
    " LEFT JOIN LATERAL (SELECT count(*) AS n, COALESCE(sum(v.size_bytes), 0) AS bytes"     \
    " FROM models m JOIN adapters a ON a.tenant_id = m.tenant_id AND a.name = m.id"         \
    " JOIN adapter_versions v ON v.adapter_id = a.id WHERE m.session_id = " s ".id AND "    \
    REG_LIVE ") ck ON true"
/* The SessionSummary fields (SDK ≈0.38) of sessions row s, owner tenants row t, and the
 * SQL_SESSION_CHECKPOINTS row ck, as json_build_object arguments. project_id is a string
 * in SessionSummary: "" when the session named none. */
#define SQL_SESSION_SUMMARY_FIELDS(s)                                                       \
    "'session_id', " s ".id, 'created_at', " SQL_ISO_TIME(s ".created_at") ","              \
    " 'owner', t.name, 'project_id', COALESCE(" s ".project_id, ''), 'status', "            \
    SQL_SESSION_STATUS(s) ", 'checkpoints_count', ck.n, 'display_name', " s ".display_name," \
    " 'user_metadata', " s ".user_metadata, 'checkpoint_storage_bytes', ck.bytes"
/* $1 tenant, $2 limit, $3 offset -> the whole response (newest first): the ids the SDK
 * reads, and (extension) a SessionSummary of each */
#define SQL_SESSIONS_LIST                                                                   \
    "SELECT json_build_object('sessions', COALESCE((SELECT json_agg(x.id ORDER BY"          \
    " x.created_at DESC, x.id) FROM (SELECT id, created_at FROM sessions"                   \
    " WHERE tenant_id = $1 ORDER BY created_at DESC, id LIMIT $2::bigint"                   \
    " OFFSET $3::bigint) x), '[]'), 'session_summaries', COALESCE((SELECT json_agg("        \
    " json_build_object(" SQL_SESSION_SUMMARY_FIELDS("s") ") ORDER BY s.created_at DESC, s.id)" \
    " FROM (SELECT * FROM sessions WHERE tenant_id = $1 ORDER BY created_at DESC, id"       \
    " LIMIT $2::bigint OFFSET $3::bigint) s JOIN tenants t ON t.id = s.tenant_id"           \
    SQL_SESSION_CHECKPOINTS("s") "), '[]'), 'cursor', json_build_object('offset', $3::bigint," \
    " 'limit', $2::bigint, 'total_count',"                                                  \
    " (SELECT count(*) FROM sessions WHERE tenant_id = $1)))::text"
/* $1 session, $2 tenant -> GetSessionResponse {"training_run_ids", "sampler_ids",
 * "user_metadata"} and the session's SessionSummary fields */
#define SQL_SESSION_GET                                                                     \
    "SELECT json_build_object(" SQL_SESSION_SUMMARY_FIELDS("s") ", 'training_run_ids',"     \
    " COALESCE((SELECT json_agg(m.id ORDER BY m.model_seq_id) FROM models m"                \
    " WHERE m.session_id = s.id), '[]'), 'sampler_ids', COALESCE((SELECT json_agg(x.id"     \
    " ORDER BY x.seq_id) FROM sampling_sessions x WHERE x.session_id = s.id), '[]'),"       \
    " 'finished_at', " SQL_ISO_TIME("s.finished_at") ")::text"                               \
    " FROM sessions s JOIN tenants t ON t.id = s.tenant_id" SQL_SESSION_CHECKPOINTS("s")   \
    " WHERE s.id = $1 AND s.tenant_id = $2"

/* ---- checkpoints and the registry (api_weights.c; REG_* from registry/reg_sql.h) ----- */
/* $1 model, $2 tenant -> base_model, lora_rank, train_attn, train_mlp, train_unembed */
#define SQL_MODEL_LORA                                                                      \
    "SELECT base_model, lora_rank, train_attn, train_mlp, train_unembed FROM models"        \
    " WHERE id = $1 AND tenant_id = $2"
/* $1 run, $2 tenant, $3 limit, $4 offset -> the readable live versions of the run
 * (REG_VERSION_COLS, then the total count), oldest first */
#define SQL_RUN_CHECKPOINTS                                                                 \
    "SELECT " REG_VERSION_COLS ", count(*) OVER ()" REG_FROM                                \
    " WHERE a.name = $1 AND " REG_LIVE " AND " REG_READABLE                                 \
    " ORDER BY v.created_at, v.id LIMIT $3 OFFSET $4"
/* $1 model, $2 tenant -> a row if the tenant owns the run */
#define SQL_RUN_OWNED "SELECT 1 FROM models WHERE id = $1 AND tenant_id = $2"
/* $1 tenant, $2 limit, $3 offset -> the tenant's live versions (REG_VERSION_COLS, then
 * the total count), newest first */
#define SQL_TENANT_CHECKPOINTS                                                              \
    "SELECT " REG_VERSION_COLS ", count(*) OVER ()" REG_FROM                                \
    " WHERE a.tenant_id = $1 AND " REG_LIVE " ORDER BY v.created_at DESC, v.id DESC"        \
    " LIMIT $2 OFFSET $3"
/* $1 tenant -> how many live versions it has */
#define SQL_TENANT_CHECKPOINT_COUNT "SELECT count(*)" REG_FROM " WHERE a.tenant_id = $1 AND " REG_LIVE
/* search_checkpoints (SDK 0.39): $1 page size + 1, $2 the caller's tenant, $3 owner
 * ('own' | 'accessible' | 'user'), $4 owner tenant names (JSON array, for 'user'),
 * $5 project ids (JSON array or NULL), $6 user_metadata that must be contained (JSON
 * object or NULL), $7 kind or NULL, $8 base models (JSON array or NULL), $9 and $10 the
 * cursor (created_at, version id) or NULL -> REG_VERSION_COLS of the live versions the
 * caller may read (own; 'accessible' and 'user' add public and shared ones), newest
 * first, from after the cursor. A checkpoint's project is its model's session's. */
#define SQL_SEARCH_CHECKPOINTS                                                              \
    "SELECT " REG_VERSION_COLS REG_FROM " JOIN tenants ot ON ot.id = a.tenant_id"           \
    " LEFT JOIN models m ON m.tenant_id = a.tenant_id AND m.id = a.name"                    \
    " LEFT JOIN sessions ss ON ss.id = m.session_id WHERE " REG_LIVE                        \
    " AND CASE WHEN $3 = 'own' THEN a.tenant_id = $2 ELSE " REG_READABLE " END"             \
    " AND ($3 <> 'user' OR ot.name IN (SELECT jsonb_array_elements_text($4::jsonb)))"      \
    " AND ($5::jsonb IS NULL OR ss.project_id IN (SELECT jsonb_array_elements_text($5::jsonb)))" \
    " AND ($6::jsonb IS NULL OR v.user_metadata @> $6::jsonb)"                              \
    " AND ($7::text IS NULL OR v.kind = $7)"                                                \
    " AND ($8::jsonb IS NULL OR v.base_model IN (SELECT jsonb_array_elements_text($8::jsonb)))" \
    " AND ($9::timestamptz IS NULL OR (v.created_at, v.id) < ($9::timestamptz, $10::bigint))" \
    " ORDER BY v.created_at DESC, v.id DESC LIMIT $1::int"
/* $1 tenant, $2 project id -> a row when one of the tenant's sessions names the project */
#define SQL_TENANT_HAS_PROJECT "SELECT 1 FROM sessions WHERE tenant_id = $1 AND project_id = $2 LIMIT 1"
/* $1 key id -> its tenant, if the key is neither revoked nor expired */
#define SQL_LINK_KEY_TENANT                                                                 \
    "SELECT tenant_id FROM api_keys WHERE id = $1::bigint AND revoked_at IS NULL"           \
    " AND (expires_at IS NULL OR expires_at > now())"

/* ---- limits and usage (migration 0014) ----------------------------------------------- */
/* $1 tenant -> its live-models limit and active models (at most the limit) */
#define SQL_TENANT_LIVE_MODELS                                                              \
    "SELECT l.max_live_models, (SELECT count(*) FROM (SELECT 1 FROM models m WHERE"         \
    " m.tenant_id = $1 AND m.status = 'active' LIMIT l.max_live_models) q)"                 \
    " FROM tenant_limits l WHERE l.tenant_id = $1 AND l.max_live_models IS NOT NULL"
/* $1 tenant -> its checkpoint storage limit and the bytes of its live checkpoints */
#define SQL_TENANT_STORAGE                                                                  \
    "SELECT l.max_checkpoint_bytes, (SELECT coalesce(sum(v.size_bytes), 0)" REG_FROM        \
    " WHERE a.tenant_id = $1 AND " REG_LIVE ") FROM tenant_limits l"                        \
    " WHERE l.tenant_id = $1 AND l.max_checkpoint_bytes IS NOT NULL"
/* $1 tenant, $2 project id or NULL -> per project of the checkpoints' sessions (NULL:
 * no session names one, or an imported adapter): the tenant's name, live checkpoints,
 * their bytes (billing/usage/checkpoints/current) */
#define SQL_CHECKPOINT_STORAGE_CURRENT                                                      \
    "SELECT ss.project_id, (SELECT name FROM tenants WHERE id = $1), count(*),"             \
    " COALESCE(sum(v.size_bytes), 0)" REG_FROM                                              \
    " LEFT JOIN models m ON m.tenant_id = a.tenant_id AND m.id = a.name"                    \
    " LEFT JOIN sessions ss ON ss.id = m.session_id"                                        \
    " WHERE a.tenant_id = $1 AND " REG_LIVE " AND ($2::text IS NULL OR ss.project_id = $2)" \
    " GROUP BY ss.project_id ORDER BY ss.project_id NULLS FIRST"
/* $1 tenant, $2 days -> the whole GET /api/v1/usage answer: tokens per kind and per run
 * over the last $2 days (UTC, today included), checkpoint storage, live work, limits.
 * Storage goes from the live versions to their adapters by key: the tenant's adapters
 * include every run it ever saved. The live work is counted in the index's order, which
 * keeps PostgreSQL to an index scan (a bitmap scan never marks the entries of dead row
 * versions: docs/architecture.md, "Bounded by the work"). */
#define SQL_USAGE                                                                           \
    "WITH u AS (SELECT run, kind, sum(tokens) AS tokens FROM usage_daily WHERE tenant_id = $1" \
    "   AND day > (now() AT TIME ZONE 'UTC')::date - $2::int GROUP BY run, kind),"          \
    " st AS (SELECT a.name AS run, count(*) AS checkpoints, sum(v.size_bytes) AS bytes"    \
    "   FROM adapter_versions v CROSS JOIN LATERAL (SELECT id, name, tenant_id FROM adapters" \
    "   WHERE id = v.adapter_id OFFSET 0) a"                                                 \
    "   WHERE a.tenant_id = $1 AND " REG_LIVE " GROUP BY a.name)"                           \
    " SELECT json_build_object('tenant', t.name, 'days', $2::int, 'since',"                 \
    " to_char((now() AT TIME ZONE 'UTC')::date - $2::int + 1, 'YYYY-MM-DD'),"               \
    " 'tokens', json_build_object('train', coalesce((SELECT sum(tokens) FROM u WHERE kind = 'train'), 0)," \
    "   'prefill', coalesce((SELECT sum(tokens) FROM u WHERE kind = 'prefill'), 0),"        \
    "   'sample', coalesce((SELECT sum(tokens) FROM u WHERE kind = 'sample'), 0)),"         \
    " 'storage', json_build_object('checkpoints', coalesce((SELECT sum(checkpoints) FROM st), 0)," \
    "   'bytes', coalesce((SELECT sum(bytes) FROM st), 0)),"                               \
    " 'runs', coalesce((SELECT json_agg(json_build_object('run', r.run,"                    \
    "   'train', coalesce((SELECT tokens FROM u WHERE u.run = r.run AND kind = 'train'), 0)," \
    "   'prefill', coalesce((SELECT tokens FROM u WHERE u.run = r.run AND kind = 'prefill'), 0)," \
    "   'sample', coalesce((SELECT tokens FROM u WHERE u.run = r.run AND kind = 'sample'), 0)," \
    "   'checkpoints', coalesce((SELECT checkpoints FROM st WHERE st.run = r.run), 0),"     \
    "   'storage_bytes', coalesce((SELECT bytes FROM st WHERE st.run = r.run), 0)) ORDER BY r.run)" \
    "   FROM (SELECT run FROM u UNION SELECT run FROM st) r), '[]'),"                       \
    " 'now', json_build_object('queued_operations', (SELECT count(*) FROM (SELECT 1 FROM"   \
    "   operations q WHERE q.tenant_id = $1 AND q.state IN ('queued', 'claimed')"           \
    "   ORDER BY q.tenant_id, q.kind) q),"                                                  \
    "   'active_models', (SELECT count(*) FROM models m WHERE m.tenant_id = $1 AND m.status = 'active')," \
    "   'tokens_last_minute', " SQL_TENANT_TOKENS_LAST_MINUTE("$1") "),"                    \
    " 'limits', json_build_object('max_queued_ops', l.max_queued_ops, 'tokens_per_minute',"  \
    "   l.tokens_per_minute, 'max_live_models', l.max_live_models, 'max_checkpoint_bytes',"  \
    "   l.max_checkpoint_bytes))::text"                                                     \
    " FROM tenants t LEFT JOIN tenant_limits l ON l.tenant_id = t.id WHERE t.id = $1"
