/* exe_sql.h: every SQL statement of the executor, named. Parameters are always bound.
 * Tables and states: docs/architecture.md ("Data model"). */
#pragma once
#include "common/common_sql.h"
#include "contract/contract.h"

/* ---- start-up ------------------------------------------------------------------------ */

/* $1 name, $2 path, $3 arch, $4 max context, $5 vocab, $6 config.json. The base model
 * this executor serves, so that the api can validate requests against it. */
#define SQL_EXE_BASE_MODEL                                                                    \
    "INSERT INTO base_models (name, path, arch, max_context, vocab_size, config)"             \
    " VALUES ($1, $2, $3, $4, $5, $6::jsonb) ON CONFLICT (name) DO UPDATE SET"                \
    " path = EXCLUDED.path, arch = EXCLUDED.arch, max_context = EXCLUDED.max_context,"        \
    " vocab_size = EXCLUDED.vocab_size, config = EXCLUDED.config"

/* $1 name, $2 hostname, $3 pid, $4 backend, $5 device description, $6 base model, $7 token
 * budget, $8 device index, $9 device memory, $10 adapter memory budget, $11 bytes of a
 * trainable rank-1 adapter on every module (placement) -> id */
#define SQL_EXE_REGISTER                                                                      \
    "INSERT INTO executors (name, hostname, pid, backend, device, base_model, token_budget,"  \
    " device_index, memory_total, memory_budget, adapter_bytes_per_rank)"                     \
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id"

/* $1 hostname, $2 name, $3 this registration -> id, pid of earlier live registrations under
 * the same name on this host (a restarted executor: systemd, loom up) */
#define SQL_EXE_PREVIOUS                                                                      \
    "SELECT id, pid FROM executors WHERE hostname = $1 AND name = $2 AND id <> $3"            \
    " AND NOT gone"
/* $1 executor: a registration whose process is no longer there is gone (its models move
 * at the reaper's next pass instead of after 30 s of silence). */
#define SQL_EXE_MARK_GONE                                                                     \
    "WITH g AS (UPDATE executors SET state = 'gone' WHERE id = $1 AND NOT gone RETURNING id)"        \
    " SELECT pg_notify('" CHAN_EXECUTOR_READY "', id::text) FROM g"

/* $1 application_name: tells this executor's connections apart in pg_stat_activity. */
#define SQL_EXE_APP_NAME "SELECT set_config('application_name', $1, false)"

/* The loop's connection listens on its own channel (CHAN_CYCLE "_<executor id>": the
 * scheduler notifies only the executor a cycle is for), and only while the executor waits
 * for a cycle: PostgreSQL (before 19) signals every listening backend of the database on
 * every NOTIFY, whatever its channel, so a listener costs the database on every
 * notification of the queue; a busy executor needs none (it looks for its next cycle when
 * it is done anyway). docs/architecture.md, "One PostgreSQL, many GPUs". The name is a
 * parameter of exe_listen_sql (executor.c): LISTEN takes no bind parameters. */
#define SQL_EXE_LISTEN_FMT "LISTEN " CHAN_CYCLE "_%lld"
#define SQL_EXE_UNLISTEN "UNLISTEN *"
#define SQL_EXE_NOTIFY_READY "NOTIFY " CHAN_EXECUTOR_READY
/* A submit's hint that built no cycle here (run_own_cycle): the scheduler decides. */
#define SQL_EXE_NOTIFY_QUEUED "NOTIFY " CHAN_OP_QUEUED

/* ---- the loop ------------------------------------------------------------------------ */

/* A cycle's start commits without waiting for the disk: it is derived (the claim says which
 * operations are the cycle's), a crash that loses it leaves the cycle assigned or requeued
 * (rule 4), and the cycle's own commit, which waits, makes it durable with everything
 * before it. */
#define SQL_EXE_ASYNC_COMMIT "SET LOCAL synchronous_commit = off"

/* $1 executor. Starts its oldest open cycle and reads its operations in ONE statement (a
 * NOTIFY to read, one round trip): an error (a canceled statement, a lost connection)
 * leaves the cycle 'assigned' for the next poll instead of 'running' with nobody reading
 * it; a cycle of its own already 'running' is one whose start it did not see complete,
 * taken again. One row per claimed operation (sample operations have no model and come
 * after the model ops; with the blob of their sampler's snapshot when one was handed
 * over), or one row of NULLs but the cycle id when none is left; no row when the executor
 * has no open cycle. The cycle id is column 15; column 16 is payload_bin (forward /
 * forward_backward: contract/fb_payload.h); 17 and 18 the tenant's name and the
 * operation's tokens (for the cycle's log line, which so needs no query of its own). Run
 * with binary results:
 * payload_bin comes as its bytes, not as hex; every other column is cast to text, which
 * binary results carry as they are, so that it reads as in a text result. */
#define SQL_EXE_START_CYCLE                                                                   \
    "WITH c AS (UPDATE cycles SET state = 'running', started_at = coalesce(started_at, now())" \
    "   WHERE id = (" SQL_EXE_OPEN_CYCLE ") RETURNING id)" SQL_EXE_CYCLE_OPS
#define SQL_EXE_OPEN_CYCLE                                                                    \
    "SELECT id FROM cycles WHERE executor_id = $1 AND state IN ('assigned','running')"        \
    " ORDER BY id LIMIT 1"
/* $1 executor: SQL_EXE_START_CYCLE in the transaction of an executor's own pass, whose
 * claim inserted the cycle running already (SQL_INSERT_CYCLES_CLAIM): its operations read,
 * the same rows, the cycle's row not written again. */
#define SQL_EXE_READ_CYCLE "WITH c AS (" SQL_EXE_OPEN_CYCLE ")" SQL_EXE_CYCLE_OPS
/* The cycle's operations are read through its own index alone (the LATERAL's OFFSET 0): as
 * a join, PostgreSQL combined operations_in_cycle with operations_live, whose claimed
 * entries it read whole in a bitmap scan, the dead versions' since the last vacuum
 * included, at every start (test_bounded_queries, a churn of 6,000 operations: 58-109
 * buffers instead of 49, as the index had grown). */
#define SQL_EXE_CYCLE_OPS                                                                     \
    " SELECT o.id::text, o.request_id, coalesce(o.model_id, ''), o.kind, o.payload::text,"     \
    " m.lora_rank::text, m.lora_seed::text, m.train_attn::text, m.train_mlp::text,"            \
    " m.train_unembed::text, o.seq_id::text, coalesce(o.sampling_session_id, ''),"             \
    " o.tenant_id::text, m.state_seq::text, coalesce(s.snapshot_digest, ''), c.id::text,"      \
    " o.payload_bin, t.name, o.n_tokens::text"                                                 \
    " FROM c LEFT JOIN LATERAL (SELECT x.id, x.request_id, x.model_id, x.kind, x.payload,"     \
    "   x.seq_id, x.sampling_session_id, x.tenant_id, x.payload_bin, x.n_tokens, x.state"      \
    "   FROM operations x WHERE x.cycle_id = c.id OFFSET 0) o ON o.state = 'claimed'"          \
    " LEFT JOIN models m ON m.id = o.model_id"                                                 \
    " LEFT JOIN tenants t ON t.id = o.tenant_id"                                               \
    " LEFT JOIN sampling_sessions s ON s.id = o.sampling_session_id"                           \
    " ORDER BY o.model_id NULLS LAST, o.seq_id, o.id"

/* ---- committing a cycle (one transaction) --------------------------------------------- */

/* $1 JSON array of the cycle's outcomes [{"id", "state", "result", "error", "category",
 * "applied", "bin_at", "bin_len"}], $2 cycle, $3 the packed results of the cycle's forward
 * / forward_backward operations one after the other (binary parameter;
 * contract/fb_result.h), an outcome's result_bin being bin_len bytes of it from bin_at
 * (1-based; absent: none): every operation's result in one statement, each only while still
 * claimed by this cycle (so a cycle the reaper took back cannot write: the caller checks
 * that every one was written). Each row is looked up by its id and the version found
 * updated (a TID scan, as the claim's): as a join, PostgreSQL combined the cycle's index
 * with the claimed entries of operations_live in a bitmap scan, which read every entry of
 * that index, the dead versions' since the last vacuum included, on every cycle
 * (test_bounded_queries, a churn of 6,000 operations: 305 buffers instead of 182). A
 * version updated by another transaction after this statement's snapshot is skipped (its
 * ctid is no longer the one found): every other writer of a claimed operation (the reaper,
 * session expiry, a failed share) takes it from the cycle, which the condition would refuse
 * anyway. The rows written, with what their events need (a sample's prompt and sampled
 * tokens), as `u` for SQL_EXE_FINISH_EVENTS. */
#define SQL_EXE_FINISH_UPDATE                                                                 \
    "UPDATE operations o SET state = v.state, result = v.result, metrics = v.result->'metrics',"  \
    " error = v.error,"                                                                        \
    " error_category = v.category, finished_at = now(), applied = v.applied,"                 \
    " result_bin = substring($3::bytea FROM v.bin_at FOR v.bin_len)"                         \
    " FROM (SELECT v.*, l.t FROM jsonb_to_recordset($1::jsonb) AS v(id bigint, state text,"   \
    " result jsonb, error text, category text, applied boolean, bin_at integer, bin_len integer)" \
    " CROSS JOIN LATERAL " SQL_OP_VERSION("id", "v.id") " l) v"                                 \
    " WHERE o.ctid = v.t AND o.cycle_id = $2 AND o.state = 'claimed'"                          \
    " RETURNING o.tenant_id, o.model_id, o.kind, o.state, o.n_tokens, o.created_at, o.claimed_at," \
    " o.finished_at, o.sampling_session_id,"                                                   \
    " CASE WHEN o.kind = '" OP_SAMPLE "' AND o.state = 'done' THEN"                           \
    "   coalesce(jsonb_array_length(o.payload->'prompt'), 0)::bigint END AS prompt_tokens,"    \
    " CASE WHEN o.kind = '" OP_SAMPLE "' AND o.state = 'done' THEN"                           \
    "   coalesce((SELECT sum(jsonb_array_length(q->'tokens'))"                                \
    "   FROM jsonb_array_elements(o.result->'sequences') q), 0)::bigint END AS sampled_tokens"

/* The events of the operations `u` made done, written by the statement that made them
 * (migration 0034: no trigger does it for them; a failed one's metric event is the
 * trigger's): the metric event of each (0007's metric_op_event), and the usage of a
 * forward_backward (train), a forward (prefill) and a sample (its prompt's tokens as
 * prefill, its sequences' as sample, under its sampler's source), 0014's rules, each also
 * for the tokens metric (0026's metric_usage_events). */
#define SQL_EXE_FINISH_EVENTS                                                                 \
    " ev AS (INSERT INTO metric_op_events (tenant_id, kind, state, n_tokens, wait_s, run_s, latency_s)" \
    "   SELECT tenant_id, kind, state, n_tokens, extract(epoch FROM claimed_at - created_at),"  \
    "   extract(epoch FROM finished_at - claimed_at), extract(epoch FROM finished_at - created_at)" \
    "   FROM u WHERE state = 'done'),"                                                         \
    " us AS (INSERT INTO usage_events (tenant_id, run, kind, tokens)"                          \
    "   SELECT tenant_id, model_id, CASE WHEN kind = '" OP_FORWARD_BACKWARD "' THEN 'train'"   \
    "   ELSE 'prefill' END, n_tokens FROM u WHERE state = 'done'"                              \
    "   AND kind IN ('" OP_FORWARD_BACKWARD "', '" OP_FORWARD "') AND n_tokens > 0"             \
    "   UNION ALL SELECT u.tenant_id, coalesce(s.source_model_id, s.model_path, 'base:' || s.base_model," \
    "   'sample'), x.kind, x.tokens FROM u LEFT JOIN sampling_sessions s ON s.id = u.sampling_session_id" \
    "   CROSS JOIN LATERAL (VALUES ('prefill', u.prompt_tokens), ('sample', u.sampled_tokens)) AS x(kind, tokens)" \
    "   WHERE u.state = 'done' AND u.kind = '" OP_SAMPLE "' AND x.tokens > 0"                 \
    "   RETURNING tenant_id, kind, tokens),"                                                    \
    " mu AS (INSERT INTO metric_usage_events (tenant_id, kind, tokens) SELECT * FROM us)"

/* The polls parked on the sampler sessions of the cycle's samples are woken after the
 * commit (SQL_EXE_NOTIFY_DONE): the results' statement tells the trigger that wakes them on
 * every other path (migration 0039) to leave them, for its transaction. Set in its main
 * query, which runs before the statement's AFTER triggers fire. */
#define SQL_EXE_SAMPLES_NOTIFIED_AFTER "set_config('loom.samples_notified_after', 'on', true)"

/* The results and their events -> how many operations were written. */
#define SQL_EXE_FINISH_OPS                                                                    \
    "WITH u AS (" SQL_EXE_FINISH_UPDATE ")," SQL_EXE_FINISH_EVENTS                            \
    " SELECT count(*), " SQL_EXE_SAMPLES_NOTIFIED_AFTER " FROM u"

/* SQL_EXE_FINISH_OPS, and $4 the number of operations: fails (SQLSTATE
 * EXE_SQLSTATE_TAKEN_BACK, migration 0033) unless every one was still claimed by the cycle,
 * so that the statements sent after it in the same round trip, the COMMIT included, do not
 * run for a cycle the reaper took back. -> the count. */
#define SQL_EXE_FINISH_OPS_ALL                                                                \
    "WITH u AS (" SQL_EXE_FINISH_UPDATE ")," SQL_EXE_FINISH_EVENTS                            \
    " SELECT CASE WHEN count(*) = $4::bigint THEN count(*) ELSE loom_refuse(($4::bigint - count(*))" \
    " || ' of the ' || $4 || ' operations of cycle ' || $2 || ' are no longer claimed by it (lease expired?)')" \
    " END, " SQL_EXE_SAMPLES_NOTIFIED_AFTER " FROM u"
#define EXE_SQLSTATE_TAKEN_BACK "LM001"

/* models (text[]), the seq_id of each one's last operation in the cycle that changed its
 * state (int[]), as the parameters named: their state_seq (part of SQL_EXE_FINISH_CYCLE). */
#define SQL_EXE_MODEL_STATES_OF(models, seqs)                                                 \
    "UPDATE models m SET state_seq = v.seq FROM unnest(" models "::text[], " seqs "::int[])"  \
    " AS v(id, seq) WHERE m.id = v.id AND m.state_seq < v.seq"

/* A commit hook's work is undone alone when it fails. */
#define SQL_EXE_HOOK_SAVEPOINT "SAVEPOINT op_hook"
#define SQL_EXE_HOOK_ROLLBACK "ROLLBACK TO SAVEPOINT op_hook"
#define SQL_EXE_HOOK_RELEASE "RELEASE SAVEPOINT op_hook"

/* $1 cycle, $2 seconds the executor spent in it before the commit (restore + compute), $3
 * executor, $4 memory used, $5 training slots, $6 snapshots, $7 cached checkpoints, $8 the
 * tokens routed to each expert since start (bigint[][] literal, MoE models; NULL keeps
 * what is there), $9 text[] / $10 int[] the models whose state the cycle changed and the
 * seq_id of the last operation that did (NULL: none; SQL_EXE_MODEL_STATES_OF): the cycle
 * is done, the models' state_seq moved, the executor idle again with what its adapter store
 * holds now (unless written off as gone); one statement. The futures of the cycle's
 * operations are woken after the commit (SQL_EXE_NOTIFY_DONE), and whether work waits is
 * read after it too (SQL_EXE_WORK_WAITS). */
#define SQL_EXE_FINISH_CYCLE                                                                  \
    "WITH cyc AS (UPDATE cycles SET state = 'done', finished_at = now(), compute_s = $2::real" \
    "   WHERE id = $1::bigint),"                                                              \
    " exe AS (UPDATE executors SET state = 'idle', heartbeat_at = now(), memory_used = $4::bigint," \
    "   last_compute_ms = $2::real * 1000,"                                                   \
    "   training_slots = $5::int, sampler_snapshots = $6::int, cached_checkpoints = $7::int,"  \
    "   expert_tokens = COALESCE($8::bigint[], expert_tokens)"                                \
    "   WHERE id = $3::bigint AND NOT gone),"                                                 \
    " st AS (" SQL_EXE_MODEL_STATES_OF("$9", "$10") ")"                                       \
    " SELECT 1"

/* $1 cycle: after the commit of SQL_EXE_FINISH_CYCLE, in a transaction that does not wait
 * for the disk (as common_sql.h's SQL_NOTIFY_AFTER: notified inside the durable commit, the
 * cycle would hold every other notifying commit of the database, submits included,
 * behind its WAL flush), the futures of the cycle's operations woken, with their results
 * when small (CHAN_OP_DONE in contract.h), and the polls parked on the sampler sessions of
 * its samples (what migration 0022's trigger sends for the other paths): the api sees
 * only committed results. */
#define SQL_EXE_NOTIFY_DONE                                                                   \
    "SELECT pg_notify('" CHAN_OP_DONE "', CASE WHEN o.state = 'done' AND o.result IS NOT NULL"  \
    "   AND CASE WHEN o.result_bin IS NOT NULL THEN 2 * octet_length(o.result_bin)"             \
    "   ELSE octet_length(o.result::text) END <= " OP_DONE_INLINE_MAX                           \
    "   THEN o.request_id || E'\\t' || o.tenant_id || E'\\t' || o.kind || E'\\t' ||"           \
    "   CASE WHEN o.result_bin IS NOT NULL THEN 'B' || encode(o.result_bin, 'hex')"              \
    "   ELSE 'J' || o.result::text END ELSE o.request_id END)"                                  \
    " FROM operations o WHERE o.cycle_id = $1::bigint"                                        \
    " AND " SQL_COMMITS_UNWAITED                                                               \
    " UNION ALL SELECT pg_notify('" CHAN_OP_DONE "', 'ss:' || md5(ss.id)) FROM (SELECT DISTINCT" \
    "   o.sampling_session_id AS id FROM operations o WHERE o.cycle_id = $1::bigint"           \
    "   AND o.kind = '" OP_SAMPLE "' AND o.sampling_session_id IS NOT NULL"                     \
    "   AND o.state IN ('done', 'failed', 'canceled')) ss"

/* $1 executor. Sent with the commit of a cycle (after it, in the same round trip): one
 * row when work this executor, idle again, could be given waits (it arrived while it was
 * busy, so that its submit's hint went to the scheduler, whose pass found it busy): a
 * model placed here whose next operation is queued (what a pass claims for it:
 * SQL_READY_MODELS_OF), or a queued sample (any executor of its base model may take it).
 * The executor then runs its own pass at once (executor.c, g_backlog), without a wake-up
 * of the scheduler and the scheduler's pass, notification and start in between; an empty
 * queue, no row: it listens. Work of models placed elsewhere waits for their own
 * executors, whose commits look for it; models waiting for a place are the scheduler's,
 * woken by their submits. Each model is one lookup of (model_id, seq_id) at its next_seq
 * (OFFSET 0, as there): the index's entries of the operations it ran before, dead until a
 * vacuum, are not walked (an EXISTS over every queued operation walked them: 0.12-0.2 ms
 * per cycle). After the commit, not in it: a submit committed after this statement's
 * snapshot sees the executor idle and wakes it, listening again. */
#define SQL_EXE_WORK_WAITS                                                                    \
    "SELECT 1 WHERE EXISTS"                                                                   \
    " (SELECT 1 FROM models m WHERE m.executor_id = $1::bigint AND m.status = 'active'"       \
    "   AND EXISTS (SELECT 1 FROM operations o WHERE o.model_id = m.id"                       \
    "     AND o.state = 'queued' AND o.seq_id = m.next_seq OFFSET 0))"                        \
    " OR EXISTS (SELECT 1 FROM operations o WHERE o.state = 'queued' AND o.kind = '" OP_SAMPLE "')"

/* ---- between cycles ------------------------------------------------------------------ */

/* $1 JSON array of the model ids holding training slots here, $2 executor -> those whose
 * models are no longer active (unloaded, expired, failed) or no longer placed here (moved
 * to another executor): their slots are freed. Each id is looked up by key, one at a time
 * (OFFSET 0 keeps the lookup from being flattened into a join): as a join PostgreSQL
 * guessed 100 ids and read every model ever created, and = ANY of the array read them all
 * too with statistics taken when there were few. */
#define SQL_EXE_INACTIVE_MODELS                                                               \
    "SELECT m.id FROM jsonb_array_elements_text($1::jsonb) AS x(id)"                          \
    " CROSS JOIN LATERAL (SELECT id, status, executor_id FROM models WHERE id = x.id OFFSET 0) m" \
    " WHERE m.status <> 'active' OR m.executor_id IS DISTINCT FROM $2::bigint"

/* $1 model, $2 executor: the model leaves this executor (drain, eviction) when none of its
 * operations is claimed (the scheduler locks the model row while it claims, so no cycle
 * can be building with it); the scheduler is woken to place it again. */
#define SQL_EXE_UNPIN                                                                         \
    "WITH u AS (UPDATE models SET executor_id = NULL WHERE id = $1 AND executor_id = $2::bigint" \
    " AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.model_id = $1 AND o.state = 'claimed')" \
    " RETURNING id) SELECT pg_notify('" CHAN_OP_QUEUED "', id) FROM u"

/* $1 executor, $2 JSON array of the model ids holding training slots here. A draining
 * executor lets go of the models placed on it that it holds no slot for (placed just
 * before the drain, or a slot dropped after a refused commit or a failed restore): their
 * state is their snapshot and the replay, wherever they go next. As SQL_EXE_UNPIN. */
#define SQL_EXE_UNPIN_SLOTLESS                                                                \
    "WITH u AS (UPDATE models m SET executor_id = NULL WHERE m.executor_id = $1::bigint"      \
    " AND m.status = 'active' AND m.id NOT IN (SELECT jsonb_array_elements_text($2::jsonb))"  \
    " AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.model_id = m.id AND o.state = 'claimed')" \
    " RETURNING m.id) SELECT pg_notify('" CHAN_OP_QUEUED "', id) FROM u"

/* $1 executor, $2 memory used, $3 training slots, $4 snapshots, $5 cached checkpoints */
#define SQL_EXE_CAPACITY                                                                      \
    "UPDATE executors SET memory_used = $2, training_slots = $3, sampler_snapshots = $4,"     \
    " cached_checkpoints = $5 WHERE id = $1"

/* ---- heartbeat (its own connection) ---------------------------------------------------- */

/* $1 executor -> 1 while the executor is alive, 0 once the reaper has written it off as
 * gone: then nothing is extended and the executor is fenced (it stops and exits); and
 * whether it is draining (`loom executor drain`). */
#define SQL_EXE_HEARTBEAT                                                                     \
    "WITH me AS (UPDATE executors SET heartbeat_at = now() WHERE id = $1 AND NOT gone"        \
    "   RETURNING id, draining),"                                                             \
    " lease AS (UPDATE cycles SET lease_expires_at = greatest(lease_expires_at,"              \
    "   now() + interval '60 seconds')"                                                       \
    "   WHERE executor_id IN (SELECT id FROM me) AND state IN ('assigned','running'))"        \
    " SELECT count(*), coalesce(bool_or(draining), false) FROM me"

/* $1 executor: a clean stop */
#define SQL_EXE_GONE "UPDATE executors SET state = 'gone' WHERE id = $1"

/* ---- sampling (exe_sample.c) ----------------------------------------------------------- */

/* $1 executor, $2 sampling session: the snapshot of the session's weights is here. */
#define SQL_EXE_SNAPSHOT_EXECUTOR "UPDATE sampling_sessions SET executor_id = $1 WHERE id = $2"
/* $1 sampling session, $2 blob digest, $3 executor: a draining executor hands the
 * snapshot it holds over to its pool (the caller holds the digest's shared lock). */
#define SQL_EXE_SNAPSHOT_HAND_OVER                                                            \
    "UPDATE sampling_sessions SET snapshot_digest = $2, executor_id = NULL"                   \
    " WHERE id = $1 AND executor_id = $3::bigint"

/* ---- durable training state (exe_durable.c) -------------------------------------------- */

/* $1 model, $2 its committed state_seq -> the newest snapshot not past it */
#define SQL_EXE_SNAPSHOT_GET                                                                  \
    "SELECT seq_id, step, blob_digest FROM model_snapshots WHERE model_id = $1 AND seq_id <= $2"

/* $1 model, $2 after seq, $3 up to seq (the committed state_seq), $4 limit -> the
 * operations that changed the model's state, in seq order, to replay: seq_id, kind,
 * payload, the loss:sum they reported (a forward_backward's, to check the replay),
 * payload_bin. With binary results, as SQL_EXE_START_CYCLE. */
#define SQL_EXE_REPLAY_OPS                                                                    \
    "SELECT seq_id::text, kind, payload::text, metrics->>'loss:sum', payload_bin FROM operations" \
    " WHERE model_id = $1 AND applied AND seq_id > $2 AND seq_id <= $3"                       \
    " ORDER BY seq_id LIMIT $4"

/* $1 model, $2 seq_id, $3 step, $4 digest, $5 size, $6 executor: the model's snapshot,
 * when the operation it is taken after is committed as applied (a fenced executor's
 * copy, ahead of what was committed, is never recorded) and it is newer than the one
 * recorded. The caller holds the digest's shared lock (registry GC). */
#define SQL_EXE_SNAPSHOT_PUT                                                                  \
    "INSERT INTO model_snapshots (model_id, seq_id, step, blob_digest, size_bytes, executor_id)" \
    " SELECT $1::text, $2::int, $3::bigint, $4::text, $5::bigint, $6::bigint WHERE EXISTS"    \
    " (SELECT 1 FROM operations WHERE model_id = $1::text AND seq_id = $2::int AND applied)"  \
    " ON CONFLICT (model_id) DO UPDATE SET seq_id = EXCLUDED.seq_id, step = EXCLUDED.step,"   \
    " blob_digest = EXCLUDED.blob_digest, size_bytes = EXCLUDED.size_bytes,"                  \
    " executor_id = EXCLUDED.executor_id, created_at = now()"                                 \
    " WHERE model_snapshots.seq_id < EXCLUDED.seq_id"

/* ---- streaming (exe_stream.c): the publisher's own connection ---------------------------- */

/* Progress is a hint the api can do without (it falls back to the committed result), so
 * its notifications need not wait for a WAL flush. */
#define SQL_EXE_STREAM_ASYNC "SET synchronous_commit = off"
#define SQL_EXE_STREAM_NAME "SET application_name = 'loom executor stream'"
#define SQL_EXE_LISTEN_CANCEL "LISTEN " CHAN_SAMPLE_CANCEL
/* $1 text[] of payloads (each at most 8000 bytes, PostgreSQL's limit), in order. */
#define SQL_EXE_PUBLISH "SELECT pg_notify('" CHAN_SAMPLE_PROGRESS "', x) FROM unnest($1::text[]) WITH ORDINALITY AS p(x, i) ORDER BY i"
