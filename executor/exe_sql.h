/* exe_sql.h: every SQL statement of the executor, named. Parameters are always bound.
 * Tables and states: docs/architecture.md ("Data model"). */
#pragma once
#include "common/contract.h"

/* ---- start-up ------------------------------------------------------------------------ */

/* $1 name, $2 path, $3 arch, $4 max context, $5 vocab, $6 config.json. The base model
 * this executor serves, so that the api can validate requests against it. */
#define SQL_EXE_BASE_MODEL                                                                    \
    "INSERT INTO base_models (name, path, arch, max_context, vocab_size, config)"             \
    " VALUES ($1, $2, $3, $4, $5, $6::jsonb) ON CONFLICT (name) DO UPDATE SET"                \
    " path = EXCLUDED.path, arch = EXCLUDED.arch, max_context = EXCLUDED.max_context,"        \
    " vocab_size = EXCLUDED.vocab_size, config = EXCLUDED.config"

/* $1 name, $2 hostname, $3 pid, $4 backend, $5 device description, $6 base model, $7 token
 * budget, $8 device index, $9 device memory, $10 adapter memory budget -> id */
#define SQL_EXE_REGISTER                                                                      \
    "INSERT INTO executors (name, hostname, pid, backend, device, base_model, token_budget,"  \
    " device_index, memory_total, memory_budget)"                                             \
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id"

/* $1 application_name: tells this executor's connections apart in pg_stat_activity. */
#define SQL_EXE_APP_NAME "SELECT set_config('application_name', $1, false)"

#define SQL_EXE_LISTEN "LISTEN " CHAN_CYCLE
#define SQL_EXE_NOTIFY_READY "NOTIFY " CHAN_EXECUTOR_READY

/* ---- the loop ------------------------------------------------------------------------ */

/* $1 executor -> the oldest cycle assigned to it. A cycle of its own that is already
 * 'running' while it polls is one whose start it did not see complete (the connection
 * broke after the server marked it): it is taken again. */
#define SQL_EXE_NEXT_CYCLE                                                                    \
    "SELECT id FROM cycles WHERE executor_id = $1 AND state IN ('assigned','running')"        \
    " ORDER BY id LIMIT 1"

/* $1 cycle, $2 executor. Marks the cycle running and reads its operations in ONE
 * statement: an error (a canceled statement, a lost connection) leaves the cycle
 * 'assigned' for the next poll instead of 'running' with nobody reading it. One row per
 * claimed operation (sample operations have no model and come after the model ops), or
 * one row of NULLs when none is left; no row when the cycle is not this executor's to run
 * (the reaper took it back). */
#define SQL_EXE_START_CYCLE                                                                   \
    "WITH c AS (UPDATE cycles SET state = 'running', started_at = coalesce(started_at, now())" \
    "   WHERE id = $1 AND executor_id = $2 AND state IN ('assigned','running') RETURNING id)"  \
    " SELECT o.id, o.request_id, coalesce(o.model_id, ''), o.kind, o.payload::text,"           \
    " m.lora_rank, m.lora_seed, m.train_attn, m.train_mlp, m.train_unembed,"                   \
    " o.seq_id, coalesce(o.sampling_session_id, ''), o.tenant_id"                              \
    " FROM c LEFT JOIN operations o ON o.cycle_id = c.id AND o.state = 'claimed'"              \
    " LEFT JOIN models m ON m.id = o.model_id"                                                 \
    " ORDER BY o.model_id NULLS LAST, o.seq_id, o.id"

/* ---- committing a cycle (one transaction) --------------------------------------------- */

/* $1 op, $2 state, $3 result, $4 error, $5 category, $6 cycle: only while still claimed
 * by this cycle, so a cycle the reaper took back cannot write. */
#define SQL_EXE_FINISH_OP                                                                     \
    "UPDATE operations SET state = $2, result = $3::jsonb, error = $4,"                       \
    " error_category = $5, finished_at = now()"                                               \
    " WHERE id = $1 AND cycle_id = $6 AND state = 'claimed'"

/* A commit hook's work is undone alone when it fails. */
#define SQL_EXE_HOOK_SAVEPOINT "SAVEPOINT op_hook"
#define SQL_EXE_HOOK_ROLLBACK "ROLLBACK TO SAVEPOINT op_hook"
#define SQL_EXE_HOOK_RELEASE "RELEASE SAVEPOINT op_hook"

/* $1 cycle */
#define SQL_EXE_FINISH_CYCLE "UPDATE cycles SET state = 'done', finished_at = now() WHERE id = $1"

/* $1 executor, $2 memory used, $3 training slots, $4 snapshots, $5 cached checkpoints:
 * idle again, with what its adapter store holds now. */
#define SQL_EXE_IDLE                                                                          \
    "UPDATE executors SET state = 'idle', heartbeat_at = now(), memory_used = $2,"            \
    " training_slots = $3, sampler_snapshots = $4, cached_checkpoints = $5"                   \
    " WHERE id = $1 AND state <> 'gone'"

/* $1 cycle: wakes the futures of its operations */
#define SQL_EXE_NOTIFY_DONE "SELECT pg_notify('" CHAN_OP_DONE "', request_id) FROM operations WHERE cycle_id = $1"

/* ---- between cycles ------------------------------------------------------------------ */

/* $1 JSON array of the model ids holding training slots here -> those whose models are
 * no longer active (unloaded, or failed): their slots are freed. */
#define SQL_EXE_INACTIVE_MODELS                                                               \
    "SELECT id FROM models WHERE id IN (SELECT jsonb_array_elements_text($1::jsonb))"          \
    " AND status <> 'active'"

/* $1 executor, $2 memory used, $3 training slots, $4 snapshots, $5 cached checkpoints */
#define SQL_EXE_CAPACITY                                                                      \
    "UPDATE executors SET memory_used = $2, training_slots = $3, sampler_snapshots = $4,"     \
    " cached_checkpoints = $5 WHERE id = $1"

/* ---- heartbeat (its own connection) ---------------------------------------------------- */

/* $1 executor -> 1 while the executor is alive, 0 once the reaper has written it off as
 * gone: then nothing is extended and the executor is fenced (it stops and exits). */
#define SQL_EXE_HEARTBEAT                                                                     \
    "WITH me AS (UPDATE executors SET heartbeat_at = now() WHERE id = $1 AND state <> 'gone'" \
    "   RETURNING id),"                                                                       \
    " lease AS (UPDATE cycles SET lease_expires_at = greatest(lease_expires_at,"              \
    "   now() + interval '60 seconds')"                                                       \
    "   WHERE executor_id IN (SELECT id FROM me) AND state IN ('assigned','running'))"        \
    " SELECT count(*) FROM me"

/* $1 executor: a clean stop */
#define SQL_EXE_GONE "UPDATE executors SET state = 'gone' WHERE id = $1"

/* ---- sampling (exe_sample.c) ----------------------------------------------------------- */

/* $1 executor, $2 sampling session: the snapshot of the session's weights is here. */
#define SQL_EXE_SNAPSHOT_EXECUTOR "UPDATE sampling_sessions SET executor_id = $1 WHERE id = $2"

/* ---- streaming (exe_stream.c): the publisher's own connection ---------------------------- */

/* Progress is a hint the api can do without (it falls back to the committed result), so
 * its notifications need not wait for a WAL flush. */
#define SQL_EXE_STREAM_ASYNC "SET synchronous_commit = off"
#define SQL_EXE_STREAM_NAME "SET application_name = 'loom executor stream'"
#define SQL_EXE_LISTEN_CANCEL "LISTEN " CHAN_SAMPLE_CANCEL
/* $1 text[] of payloads (each at most 8000 bytes, PostgreSQL's limit), in order. */
#define SQL_EXE_PUBLISH "SELECT pg_notify('" CHAN_SAMPLE_PROGRESS "', x) FROM unnest($1::text[]) WITH ORDINALITY AS p(x, i) ORDER BY i"
