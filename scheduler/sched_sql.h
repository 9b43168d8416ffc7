/* sched_sql.h: every SQL statement of the scheduler, named. Parameters are bound. */
#pragma once
#include "common/common_sql.h"
#include "contract/contract.h"

/* The scheduler's session commits without waiting for the disk (sched.c, listen_all). */
#define SQL_ASYNC_COMMIT "SET synchronous_commit = off"

/* What wakes the scheduler: operations queued, executors ready for a cycle. */
#define SQL_LISTEN_OPS "LISTEN " CHAN_OP_QUEUED
#define SQL_LISTEN_EXECUTORS "LISTEN " CHAN_EXECUTOR_READY

/* The idle executors that are not draining, locked (a second scheduler skips them), the
 * most recently heard from first: a pass builds their cycles in one transaction (cycle.c).
 * Their last cycle's compute in ms (-1: none yet) bounds rule 5's round wait (planner.c). */
#define SQL_LOCK_IDLE_EXECUTORS \
    "SELECT id, base_model, token_budget, coalesce(last_compute_ms, -1) FROM executors" \
    " WHERE state = 'idle' AND NOT gone AND NOT draining" \
    " ORDER BY heartbeat_at DESC FOR UPDATE SKIP LOCKED"
/* $1 executor: the same for one executor (an executor's own pass, sched_build_cycle). Two
 * statements, not one with "$1 = 0 OR id = $1": in some stacks PostgreSQL's plan cache
 * found that one's custom plans cheaper than its generic plan and planned it again at
 * every call (0.08-0.1 ms a pass, 2 of 11 loom_bench --parts statements runs). */
#define SQL_LOCK_IDLE_EXECUTOR \
    "SELECT id, base_model, token_budget, coalesce(last_compute_ms, -1) FROM executors" \
    " WHERE id = $1::bigint AND state = 'idle' AND NOT draining FOR UPDATE SKIP LOCKED"

/* $1 bigint[] executors, $2 text[] their base models, $3 limit, $4 bigint[] tenants held by
 * their rate limit. Models placed on those executors (sched_place) with their next
 * operation queued, of tenants not held, the least recently served first, with what was
 * learned of their pattern (rule 5): pair_p, pair_gap_ms (-1 unknown), tail_fb_at in
 * epoch ms (-1 none); the executor, and last_request_at (their order).
 *
 * The per-model EXISTS tests of the cycle build, placement and gaps end in OFFSET 0: it
 * keeps PostgreSQL from turning them into a join, so each is a lookup of (model_id,
 * seq_id) for the model at hand. As a join, planned before operations had statistics (a
 * fresh install: the generic plan sticks), it read every live operation once per model:
 * 70 ms a pass at 4,000 live operations in loom_bench's tenants part, against 1 ms. */
#define SQL_READY_MODELS_OF(exes, held) \
    "SELECT m.id, m.next_seq, m.tenant_id, m.pair_p, coalesce(m.pair_gap_ms, -1)," \
    " coalesce(extract(epoch FROM m.tail_fb_at) * 1000, -1), m.executor_id, m.last_request_at" \
    " FROM " exes " JOIN models m ON m.executor_id = e.id" \
    " WHERE m.base_model = e.base AND m.status = 'active' AND m.tenant_id <> ALL(" held ")" \
    "   AND EXISTS (SELECT 1 FROM operations o WHERE o.model_id = m.id" \
    "               AND o.state = 'queued' AND o.seq_id = m.next_seq OFFSET 0)" \
    " ORDER BY m.last_request_at LIMIT $3 FOR NO KEY UPDATE OF m SKIP LOCKED"
#define SQL_EXES_LISTED "unnest($1::bigint[], $2::text[]) AS e(id, base)"
#define SQL_LOCK_READY_MODELS SQL_READY_MODELS_OF(SQL_EXES_LISTED, "$4::bigint[]")

/* $1 text[] of model ids. Queued operations of those models, each with the index of its
 * model in $1 (from 0), grouped by that index in its order, in seq order within a model.
 * Read model by model, in the index's order: as a join, once the live index had grown with
 * the entries of dead row versions, PostgreSQL read every live operation of every model in
 * one bitmap scan, which never marks those entries, and fetched each dead row again on
 * every pass until a vacuum (test_bounded_queries, a churn of 6,000 operations: 823 buffers
 * instead of 7). */
#define SQL_LOCK_QUEUED_OPS \
    "SELECT o.id, m.i - 1 AS model_index, o.seq_id, o.kind, o.n_tokens," \
    " extract(epoch FROM clock_timestamp() - o.created_at) * 1000 AS age_ms," \
    " extract(epoch FROM o.created_at) * 1000 AS created_ms" \
    " FROM unnest($1::text[]) WITH ORDINALITY AS m(id, i)" \
    " CROSS JOIN LATERAL (SELECT x.id, x.seq_id, x.kind, x.n_tokens, x.created_at FROM operations x" \
    "   WHERE x.model_id = m.id AND x.state = 'queued' ORDER BY x.seq_id OFFSET 0" \
    "   FOR UPDATE SKIP LOCKED) o" \
    " ORDER BY m.i, o.seq_id"

/* $1 bigint[] executors, $2 text[] their base models, $3 limit, $4 tenants held. Queued
 * sample ops those executors can run: from the base model or a checkpoint (any executor
 * of the base model), from a live-weights snapshot held in one executor's memory (that
 * one: the last column, else 0), or from one a draining executor handed over to the blob
 * store (any executor). Oldest first, with their base model. */
#define SQL_QUEUED_SAMPLES_OF(exes, held) \
    "SELECT o.id, o.n_tokens, o.tenant_id, s.base_model," \
    " CASE WHEN s.source_model_id IS NULL OR s.snapshot_digest IS NOT NULL THEN 0 ELSE s.executor_id END" \
    " FROM " exes " CROSS JOIN operations o JOIN sampling_sessions s ON s.id = o.sampling_session_id" \
    " WHERE o.state = 'queued' AND o.kind = '" OP_SAMPLE "' AND s.base_model = ANY($2::text[])" \
    "   AND o.tenant_id <> ALL(" held ")" \
    "   AND (s.source_model_id IS NULL OR s.executor_id = ANY($1::bigint[]) OR s.snapshot_digest IS NOT NULL)" \
    " ORDER BY o.id LIMIT $3 FOR UPDATE OF o SKIP LOCKED"
#define SQL_LOCK_QUEUED_SAMPLES SQL_QUEUED_SAMPLES_OF("(SELECT 1) AS e", "$4::bigint[]")

/* -> tenants with a rate limit and the tokens they may still claim in this minute (their
 * tokens_per_minute minus what their operations claimed in the last minute). */
#define SQL_TENANT_LEFT                                                                       \
    "l.tokens_per_minute - (SELECT coalesce(sum(o.n_tokens), 0) FROM operations o"            \
    " WHERE o.tenant_id = l.tenant_id AND o.claimed_at > now() - interval '1 minute')"
#define SQL_TENANT_RATE \
    "SELECT l.tenant_id, " SQL_TENANT_LEFT " AS left_tokens FROM tenant_limits l WHERE l.tokens_per_minute IS NOT NULL"
/* SQL_TENANT_RATE in an executor's own pass: the same rows, and the tenants held by their
 * rate limit (nothing left in this minute: plan_held_tenants on those rows) kept for the
 * transaction (loom.held) for the statements after it in the same round trip, which read
 * them as SQL_TENANTS_HELD: the minute's sums worked out once. No limited tenant: not set,
 * read as none. */
#define SQL_TENANT_RATE_KEEP_HELD                                                             \
    "WITH r AS MATERIALIZED (" SQL_TENANT_RATE ")"                                            \
    " SELECT r.tenant_id, r.left_tokens FROM r WHERE set_config('loom.held',"                 \
    " (SELECT coalesce(array_agg(h.tenant_id), '{}') FROM r h WHERE h.left_tokens <= 0)::text, true) IS NOT NULL"
#define SQL_TENANTS_HELD "coalesce(nullif(current_setting('loom.held', true), ''), '{}')::bigint[]"

/* An executor's own pass (sched_opts.only_base) sends its reads in the round trip that
 * locks the executor: $1 bigint[] {the executor}, $2 text[] {its base model}, $3 limit,
 * the held tenants as SQL_TENANT_RATE_KEEP_HELD kept them. Its samples as
 * SQL_LOCK_QUEUED_SAMPLES, and its models as SQL_LOCK_READY_MODELS with their queued
 * operations, both locked, in one statement (SQL_LOCK_READY_OPS_OWN): one row per
 * operation, the columns of SQL_LOCK_QUEUED_OPS but the second (the model's id) and its
 * model's after them (next_seq, tenant, pair_p, pair_gap_ms, tail_fb_at in epoch ms),
 * the models the least recently served first, each one's operations together in seq
 * order. (A ready model whose queued operations another transaction holds has no row:
 * it had nothing to give this pass.) Each reads only while the transaction holds the
 * executor's row, idle (SQL_LOCK_IDLE_EXECUTOR's lock, taken again: a pass of the
 * scheduler's that holds it, or an executor gone busy, makes them read and lock nothing,
 * so that they take nothing from that pass). */
#define SQL_EXE_OWN_LOCKED                                                                    \
    "(SELECT x.id, x.base_model FROM executors x WHERE x.id = ($1::bigint[])[1]"              \
    " AND x.base_model = ($2::text[])[1] AND x.state = 'idle' AND NOT x.draining"             \
    " FOR UPDATE SKIP LOCKED) AS e(id, base)"
#define SQL_LOCK_QUEUED_SAMPLES_OWN SQL_QUEUED_SAMPLES_OF(SQL_EXE_OWN_LOCKED, SQL_TENANTS_HELD)
#define SQL_LOCK_READY_OPS_OWN                                                                \
    "WITH m (id, next_seq, tenant_id, pair_p, gap_ms, tail_ms, executor_id, last_request_at) AS (" \
    SQL_READY_MODELS_OF(SQL_EXE_OWN_LOCKED, SQL_TENANTS_HELD) ")"                            \
    " SELECT o.id, o.model_id, o.seq_id, o.kind, o.n_tokens,"                                 \
    " extract(epoch FROM clock_timestamp() - o.created_at) * 1000 AS age_ms,"                 \
    " extract(epoch FROM o.created_at) * 1000 AS created_ms,"                                 \
    " m.next_seq, m.tenant_id, m.pair_p, m.gap_ms, m.tail_ms"                                 \
    " FROM m JOIN operations o ON o.model_id = m.id WHERE o.state = 'queued'"                 \
    " ORDER BY m.last_request_at, o.model_id, o.seq_id FOR UPDATE OF o SKIP LOCKED"

/* $1 executor, $2 its base model, $3 its token budget, $4 model, $5 its next_seq, $6
 * bigint[] operations: an executor's own pass from submits' hints (cycle.c,
 * sched_build_own_hinted) goes on only while what the hints said still holds, with the
 * rows locked as the full pass locks them (the executor, idle; the model, active, placed
 * there, at that seq_id, its tenant without a rate limit; the operations, every one
 * queued); else it fails (SCHED_SQLSTATE_REFUSED, the rest of its round trip skipped) and
 * the executor runs the full pass. */
#define SQL_OWN_HINT_GUARD                                                                    \
    "SELECT CASE WHEN EXISTS (SELECT 1 FROM executors x WHERE x.id = $1::bigint"              \
    "   AND x.base_model = $2 AND x.token_budget = $3::int AND x.state = 'idle'"              \
    "   AND NOT x.draining FOR UPDATE SKIP LOCKED)"                                           \
    " AND EXISTS (SELECT 1 FROM models m WHERE m.id = $4 AND m.executor_id = $1::bigint"      \
    "   AND m.base_model = $2 AND m.status = 'active' AND m.next_seq = $5::int"               \
    "   AND NOT EXISTS (SELECT 1 FROM tenant_limits l WHERE l.tenant_id = m.tenant_id"        \
    "   AND l.tokens_per_minute IS NOT NULL) FOR NO KEY UPDATE OF m SKIP LOCKED)"             \
    " AND (SELECT count(*) FROM (SELECT 1 FROM operations o WHERE o.id = ANY($6::bigint[])"   \
    "   AND o.model_id = $4 AND o.state = 'queued' FOR UPDATE OF o SKIP LOCKED) q)"           \
    "   = cardinality($6::bigint[])"                                                          \
    " THEN 1 ELSE loom_refuse('the submits'' hints no longer hold') END"
#define SCHED_SQLSTATE_REFUSED "LM001"   /* loom_refuse (migration 0033) */

/* Usage events into the daily totals (migration 0014). */
#define SQL_USAGE_FOLD "SELECT loom_usage_fold()"

/* $1 bigint[] executors, $2 int[] n_ops, $3 int[] n_tokens (one cycle each), $4 lease
 * seconds, $5 bigint[] operation ids, $6 bigint[] the executor of each, $7 whether to
 * notify: the cycles, their operations claimed by them, their executors busy and each one
 * notified on its own channel (executor/exe_sql.h, SQL_EXE_LISTEN_FMT; not an executor
 * that builds and starts its own cycle: every NOTIFY signals every listening backend;
 * its cycle is inserted running, started now, as its start in the same transaction would
 * leave it, and that start only reads it: SQL_EXE_READ_CYCLE, one update of the cycle's
 * row fewer), and $8-$12 the models advanced (SQL_ADVANCE_MODELS_OF's parameters) ->
 * the cycles' ids and executors. The executors are marked busy by their ids ($1), not
 * through the new cycles: a join with them reads the executors table whole in a generic
 * plan (test_bounded_queries). Each claimed operation is found by its id (the primary
 * key, OFFSET 0: a lookup, not a join) and updated at the row version that lookup found
 * (ctid: a TID scan; the pass holds its lock, so no other version can come between):
 * joined with the id list, the generic plan read the queued operations through
 * operations_live, whose entries of every operation queued since the table's last vacuum
 * are there until it, dead, and a bitmap scan never marks them so (plain index scans
 * do): a claim read 60 buffers in the first 500 lone operations and 256 in the sixth
 * 500 (409 after 5,000), where autovacuum comes only after a fifth of the table changed,
 * and reads 49-53 throughout now (loom_bench --parts churn). */
/* Right before SQL_INSERT_CYCLES_CLAIM, in its transaction: the claim's generic plan,
 * always. Its per-id lookups cost more in PostgreSQL's estimate of a generic plan (id
 * lists of unknown length) than in the custom plans of the lists as given, so the plan
 * cache planned it anew on every run: 0.37 ms of planning for 0.18 ms of execution a lone
 * operation (loom_bench --parts statements). test_bounded_queries holds its generic plan
 * (and the start's after it) to the same bounds as the custom one. */
#define SQL_CLAIM_GENERIC "SET LOCAL plan_cache_mode = force_generic_plan"
#define SQL_INSERT_CYCLES_CLAIM \
    "WITH cyc AS (INSERT INTO cycles (executor_id, n_ops, n_tokens, lease_expires_at, state, started_at)" \
    "   SELECT v.e, v.n, v.t, now() + make_interval(secs => $4::int)," \
    "   CASE WHEN $7::boolean THEN 'assigned' ELSE 'running' END, CASE WHEN $7::boolean THEN NULL ELSE now() END" \
    "   FROM unnest($1::bigint[], $2::int[], $3::int[]) AS v(e, n, t) RETURNING id, executor_id)," \
    " claim AS (UPDATE operations o SET state = 'claimed', cycle_id = v.cycle, claimed_at = now()" \
    "   FROM (SELECT l.t, cyc.id AS cycle FROM unnest($5::bigint[], $6::bigint[]) AS x(op, e)" \
    "   JOIN cyc ON cyc.executor_id = x.e" \
    "   CROSS JOIN LATERAL " SQL_OP_VERSION("id", "x.op") " l) v" \
    "   WHERE o.ctid = v.t AND o.state = 'queued')," \
    " busy AS (UPDATE executors e SET state = 'busy' WHERE e.id = ANY($1::bigint[]))," \
    " adv AS (" SQL_ADVANCE_MODELS_OF("$8", "$9", "$10", "$11", "$12") ")" \
    " SELECT cyc.id, cyc.executor_id, CASE WHEN $7::boolean THEN" \
    "   pg_notify('" CHAN_CYCLE "_' || cyc.executor_id, cyc.executor_id::text) END FROM cyc"

/* text[] model ids, int[] next seq, real[] pair_p, real[] pair_gap_ms (-1: unknown),
 * float8[] tail_fb_at in epoch ms (-1: none), as the parameters named: the models the
 * claim took operations of advanced past them, with what the claimed runs taught of each
 * one's pattern (rule 5); part of SQL_INSERT_CYCLES_CLAIM (one statement fewer a pass). */
#define SQL_ADVANCE_MODELS_OF(ids, seqs, p, gap, tail) \
    "UPDATE models m SET next_seq = v.next_seq, last_request_at = now(), pair_p = v.p," \
    " pair_gap_ms = nullif(v.gap, -1), tail_fb_at = CASE WHEN v.tail < 0 THEN NULL" \
    " ELSE to_timestamp(v.tail / 1000) END" \
    " FROM unnest(" ids "::text[], " seqs "::int[], " p "::real[], " gap "::real[], " tail "::float8[])" \
    " AS v(id, next_seq, p, gap, tail) WHERE m.id = v.id"

/* ---- placement (docs/architecture.md, "Pools and placement") ------------------------------ */

/* Models waiting for an executor: active, placed nowhere (new, moved off a gone or
 * draining executor, evicted), their next operation queued. Found from the queue, so the
 * cost follows the work waiting, not the models kept. Locked: one scheduler places each. */
#define SQL_PLACE_MODELS \
    "SELECT m.id, m.base_model, m.lora_rank FROM models m" \
    " WHERE m.id IN (SELECT o.model_id FROM operations o WHERE o.state = 'queued' AND o.model_id IS NOT NULL)" \
    "   AND m.status = 'active' AND m.executor_id IS NULL" \
    "   AND EXISTS (SELECT 1 FROM operations o WHERE o.model_id = m.id AND o.state = 'queued' AND o.seq_id = m.next_seq" \
    "     OFFSET 0)" \
    " ORDER BY m.last_request_at LIMIT 256 FOR NO KEY UPDATE OF m SKIP LOCKED"

/* $1 silence seconds -> live executors that take models: id, base model, adapter memory
 * left (the budget minus what the ranks of the models placed there take), bytes per rank,
 * the budget. */
#define SQL_PLACE_EXECUTORS \
    "SELECT e.id, e.base_model, coalesce(e.memory_budget, 0) - coalesce(e.adapter_bytes_per_rank, 1)" \
    " * coalesce((SELECT sum(m.lora_rank) FROM models m WHERE m.executor_id = e.id AND m.status = 'active'), 0)," \
    " coalesce(e.adapter_bytes_per_rank, 1), greatest(coalesce(e.memory_budget, 1), 1)" \
    " FROM executors e WHERE NOT e.gone AND NOT e.draining" \
    " AND e.heartbeat_at > now() - make_interval(secs => $1::int) ORDER BY e.id"

/* $1 model, $2 executor */
#define SQL_PLACE "UPDATE models SET executor_id = $2 WHERE id = $1 AND executor_id IS NULL"

/* Reaper, in one transaction. $1: whether silence counts (false for a while after the
 * scheduler (re)connects: after a database outage every heartbeat is old, and executors
 * need a moment to reconnect). Executors silent for $2 seconds are gone. */
#define SQL_REAP_EXECUTORS \
    "UPDATE executors SET state = 'gone' WHERE $1::boolean AND NOT gone" \
    " AND heartbeat_at < now() - make_interval(secs => $2::int)"

/* $1 as above. Cycles past their lease (when silence counts), or on a gone executor,
 * expire. The executor of each open cycle is looked up by key (as an EXISTS, PostgreSQL
 * hashed every registration ever made). */
#define SQL_REAP_CYCLES \
    "UPDATE cycles c SET state = 'expired', finished_at = now(), error = 'lease expired'" \
    " WHERE c.state IN ('assigned','running') AND (($1::boolean AND c.lease_expires_at < now())" \
    "   OR (SELECT e.state FROM executors e WHERE e.id = c.executor_id) = 'gone')" \
    " RETURNING id"

/* An executor whose lease ran out (a cycle it held expired in the last minute) is not
 * trusted with more work. */
#define SQL_REAP_LEASE_LOST \
    "UPDATE executors e SET state = 'gone' FROM cycles c" \
    " WHERE c.executor_id = e.id AND c.state = 'expired'" \
    " AND c.finished_at > now() - interval '1 minute' AND NOT e.gone"

/* The operations of models in expired cycles go back to the queue: they never committed,
 * so the state of their model (docs/architecture.md, "Durable training state") does not
 * have them, and they run again wherever the model is restored; the model's next_seq
 * moves back to the first of them. One that was claimed 3 times fails instead (it may be
 * what ends its executors), unapplied. */
#define SQL_REQUEUE_MODEL_OPS \
    "WITH r AS (UPDATE operations o SET" \
    "   state = CASE WHEN o.attempt >= 2 THEN 'failed' ELSE 'queued' END," \
    "   attempt = o.attempt + 1, cycle_id = CASE WHEN o.attempt >= 2 THEN o.cycle_id END," \
    "   error = CASE WHEN o.attempt >= 2 THEN 'the executors that ran this operation stopped during it 3 times in" \
    " a row (it may be what stops them); it was not applied' END," \
    "   error_category = CASE WHEN o.attempt >= 2 THEN 'server' END," \
    "   finished_at = CASE WHEN o.attempt >= 2 THEN now() END" \
    " FROM cycles c" \
    " WHERE o.cycle_id = c.id AND c.state = 'expired' AND o.state = 'claimed' AND o.model_id IS NOT NULL" \
    " RETURNING o.model_id, o.seq_id, o.request_id, o.state)," \
    " back AS (UPDATE models m SET next_seq = x.seq FROM (SELECT model_id, min(seq_id) AS seq FROM r" \
    "   WHERE state = 'queued' GROUP BY model_id) x WHERE m.id = x.model_id AND m.next_seq > x.seq RETURNING 1)" \
    " SELECT pg_notify(CASE WHEN state = 'failed' THEN '" CHAN_OP_DONE "' ELSE '" CHAN_OP_QUEUED "' END," \
    "   request_id), (SELECT count(*) FROM back) FROM r"

/* Models whose executor is gone are placed again (their state is restored there). Each
 * placed model's executor is looked up by key, as in SQL_REAP_CYCLES. */
#define SQL_UNPIN_GONE \
    "UPDATE models m SET executor_id = NULL WHERE m.status = 'active' AND m.executor_id IS NOT NULL" \
    " AND (SELECT e.state FROM executors e WHERE e.id = m.executor_id) = 'gone'" \
    " RETURNING m.id"

/* Sample ops of expired cycles that need no in-memory state (base model, checkpoint, a
 * snapshot handed over to the blob store) go back to the queue; after 3 attempts they fail. */
#define SQL_REQUEUE_SAMPLES \
    "WITH r AS (UPDATE operations o SET" \
    "   state = CASE WHEN o.attempt >= 2 THEN 'failed' ELSE 'queued' END," \
    "   attempt = o.attempt + 1, cycle_id = CASE WHEN o.attempt >= 2 THEN o.cycle_id END," \
    "   error = CASE WHEN o.attempt >= 2 THEN 'sampling failed on 3 executors in a row' END," \
    "   error_category = CASE WHEN o.attempt >= 2 THEN 'server' END," \
    "   finished_at = CASE WHEN o.attempt >= 2 THEN now() END" \
    " FROM cycles c, sampling_sessions s" \
    " WHERE o.cycle_id = c.id AND c.state = 'expired' AND o.state = 'claimed' AND o.kind = '" OP_SAMPLE "'" \
    "   AND s.id = o.sampling_session_id AND (s.source_model_id IS NULL OR s.snapshot_digest IS NOT NULL)" \
    " RETURNING o.request_id, o.state)" \
    " SELECT pg_notify(CASE WHEN state = 'failed' THEN '" CHAN_OP_DONE "' ELSE '" CHAN_OP_QUEUED "' END," \
    "   request_id) FROM r"

/* Samples from a snapshot that lived on a gone executor cannot run anywhere. Each live
 * sample's sampler and its executor are looked up by key (as joins, PostgreSQL hashed every
 * sampler ever created). */
#define SQL_FAIL_ORPHANED_SAMPLES \
    "WITH f AS (UPDATE operations o SET state = 'failed', finished_at = now(), error_category = 'server'," \
    "   error = 'the executor holding this sampler''s weights stopped; save weights for the sampler again'" \
    " WHERE o.state IN ('queued','claimed')" \
    "   AND (SELECT e.state FROM executors e WHERE e.id = (SELECT s.executor_id FROM sampling_sessions s" \
    "     WHERE s.id = o.sampling_session_id)) = 'gone'" \
    " RETURNING o.request_id)" \
    " SELECT pg_notify('" CHAN_OP_DONE "', request_id) FROM f"

/* ---- settling seq order ------------------------------------------------------------- */

/* A model's next operation may be settled without ever running: a submit the api refused
 * (recorded as failed, category user, never claimed). next_seq moves past every such
 * operation in a row, so the ones after it run (next_seq is an integer: it stops at its
 * largest value). */
#define SQL_SKIP_SETTLED \
    "WITH RECURSIVE settled (id, seq) AS (" \
    "  SELECT m.id, m.next_seq FROM models m WHERE m.status = 'active' AND EXISTS (SELECT 1" \
    "    FROM operations o WHERE o.model_id = m.id AND o.seq_id = m.next_seq" \
    "    AND o.state IN ('failed','canceled') AND o.cycle_id IS NULL)" \
    "  UNION ALL" \
    "  SELECT s.id, s.seq + 1 FROM settled s WHERE s.seq < 2147483646 AND EXISTS (SELECT 1 FROM operations o" \
    "    WHERE o.model_id = s.id AND o.seq_id = s.seq + 1" \
    "    AND o.state IN ('failed','canceled') AND o.cycle_id IS NULL))" \
    " UPDATE models m SET next_seq = x.seq + 1" \
    " FROM (SELECT id, max(seq) AS seq FROM settled GROUP BY id) x" \
    " WHERE m.id = x.id AND m.next_seq <= x.seq AND x.seq < 2147483647"

/* $1 seconds. A gap that stays open: a model has queued operations after its next_seq,
 * no operation at next_seq, and the oldest waiting one is older than $1 (the client lost
 * a submit, or died between two). The model gives up on the missing seq_id: every
 * operation waiting behind it fails with a message naming it, and next_seq moves past the
 * model's last operation, so what the client sends from then on runs. */
#define SQL_GIVE_UP_GAPS \
    "WITH stuck AS (SELECT m.id, m.next_seq FROM models m" \
    "   WHERE m.status = 'active'" \
    "   AND NOT EXISTS (SELECT 1 FROM operations g WHERE g.model_id = m.id AND g.seq_id = m.next_seq OFFSET 0)" \
    "   AND EXISTS (SELECT 1 FROM operations o WHERE o.model_id = m.id AND o.state = 'queued'" \
    "     AND o.seq_id > m.next_seq AND o.created_at < now() - make_interval(secs => $1::int) OFFSET 0)" \
    "   FOR NO KEY UPDATE OF m SKIP LOCKED)," \
    " failed AS (UPDATE operations o SET state = 'failed', finished_at = now(), error_category = 'user'," \
    "   error = 'seq_id ' || stuck.next_seq || ' of model ' || o.model_id || ' never arrived within '" \
    "     || $1::int || ' s (a submit lost or never sent?), so this operation (seq_id ' || o.seq_id" \
    "     || '), which had to run after it, was not run; operations submitted from now on run'" \
    "   FROM stuck WHERE o.model_id = stuck.id AND o.state = 'queued' AND o.seq_id > stuck.next_seq" \
    "   RETURNING o.request_id)," \
    " moved AS (UPDATE models m SET next_seq = (SELECT LEAST(max(x.seq_id) + 1, 2147483647) FROM operations x" \
    "   WHERE x.model_id = m.id) FROM stuck WHERE m.id = stuck.id RETURNING m.id)" \
    " SELECT pg_notify('" CHAN_OP_DONE "', request_id), (SELECT count(*) FROM moved) FROM failed"

/* An operation that arrives for a seq_id the model has already moved past (the missing
 * one of a gap given up on, sent late) can never run: it fails with a message. The model
 * of each queued operation is looked up by key (as a join, PostgreSQL could read every
 * model ever created). */
#define SQL_FAIL_STRAGGLERS \
    "WITH f AS (UPDATE operations o SET state = 'failed', finished_at = now(), error_category = 'user'," \
    "   error = 'seq_id ' || o.seq_id || ' arrived after model ' || o.model_id || ' had given up" \
    " waiting for it and moved on to seq_id ' || (SELECT m.next_seq FROM models m WHERE m.id = o.model_id)" \
    "   || '; it was not run'" \
    " WHERE o.state = 'queued' AND o.model_id IS NOT NULL" \
    "   AND o.seq_id < (SELECT m.next_seq FROM models m WHERE m.id = o.model_id)" \
    " RETURNING o.request_id)" \
    " SELECT pg_notify('" CHAN_OP_DONE "', request_id) FROM f"

/* ---- session expiry (migration 0011) ---------------------------------------------------- */

/* $1 timeout seconds. Up to 100 sessions silent (no heartbeat, no submit: the api counts
 * both) for longer expire: the queued operations of their models and samplers are
 * canceled, naming the session and the checkpoint; each active model gets a last
 * save_weights (weights/session-expired, kept 7 days) after its other operations, and its
 * next_seq moves to it (a seq_id never sent cannot hold it up). The service's own session
 * per tenant behind the OpenAI routes ("openai-<tenant>", migration 0020; client sessions
 * are UUIDs) has no client to heartbeat it and never expires. */
#define SQL_EXPIRE_SESSIONS \
    "WITH s AS (UPDATE sessions SET expired_at = now() WHERE id = ANY(ARRAY(SELECT id FROM sessions" \
    "   WHERE expired_at IS NULL AND last_heartbeat_at < now() - make_interval(secs => $1::int)" \
    "   AND id NOT LIKE 'openai-%'" \
    "   ORDER BY last_heartbeat_at LIMIT 100 FOR UPDATE SKIP LOCKED)) RETURNING id)," \
    " m AS (SELECT mm.id, mm.tenant_id, mm.session_id, (SELECT coalesce(max(x.seq_id), 0) + 1" \
    "   FROM operations x WHERE x.model_id = mm.id) AS save_seq FROM models mm JOIN s ON s.id = mm.session_id" \
    "   WHERE mm.status = 'active')," \
    " adv AS (UPDATE models mm SET next_seq = m.save_seq FROM m WHERE mm.id = m.id)," \
    " c AS (UPDATE operations o SET state = 'canceled', finished_at = now(), error_category = 'user'," \
    "   error = 'session ' || m.session_id || ' expired (no heartbeat and no request for ' || $1::int" \
    "     || ' s) before this operation ran; the model''s state is saved as tinker://' || m.id" \
    "     || '/weights/" SESSION_EXPIRED_CHECKPOINT ": create a new model and load_weights it to continue'" \
    "   FROM m WHERE o.model_id = m.id AND o.state = 'queued' RETURNING o.request_id)," \
    " cs AS (UPDATE operations o SET state = 'canceled', finished_at = now(), error_category = 'user'," \
    "   error = 'session ' || ss.session_id || ' expired (no heartbeat and no request for ' || $1::int" \
    "     || ' s) before this sample ran'" \
    "   FROM s CROSS JOIN LATERAL (SELECT ss.id, ss.session_id FROM sampling_sessions ss" \
    "     WHERE ss.session_id = s.id OFFSET 0) ss" \
    "   WHERE o.sampling_session_id = ss.id AND o.state = 'queued' RETURNING o.request_id)," \
    " sv AS (INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload)" \
    "   SELECT 'req-' || md5(m.id || clock_timestamp()::text), m.tenant_id, m.id, m.save_seq, '" OP_SAVE_WEIGHTS "'," \
    "   jsonb_build_object('path', '" SESSION_EXPIRED_CHECKPOINT "', 'overwrite', true, 'ttl_seconds', 604800)" \
    "   FROM m ON CONFLICT DO NOTHING RETURNING request_id)" \
    " SELECT pg_notify('" CHAN_OP_DONE "', request_id) FROM c" \
    " UNION ALL SELECT pg_notify('" CHAN_OP_DONE "', request_id) FROM cs" \
    " UNION ALL SELECT pg_notify('" CHAN_OP_QUEUED "', request_id) FROM sv"

/* Active models of expired sessions with nothing pending (their last save done or
 * failed) become 'expired': their executors free them. Each active model's session is
 * looked up by key (as a join, PostgreSQL read every session ever opened), and its live
 * operations model by model (OFFSET 0: as an anti-join, PostgreSQL read every live
 * operation in a bitmap scan, which never marks dead entries). */
#define SQL_EXPIRE_MODELS \
    "UPDATE models m SET status = 'expired'" \
    " WHERE m.status = 'active' AND (SELECT s.expired_at FROM sessions s WHERE s.id = m.session_id) IS NOT NULL" \
    " AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.model_id = m.id AND o.state IN ('queued', 'claimed')" \
    "   OFFSET 0)"
/* Sampler snapshots handed over to the blob store by a draining executor are let go of
 * once their session has expired and none of their samples is pending; the registry GC
 * then removes their blobs. The session is looked up by key, as above. */
#define SQL_DROP_EXPIRED_SAMPLER_SNAPSHOTS \
    "UPDATE sampling_sessions s SET snapshot_digest = NULL" \
    " WHERE s.snapshot_digest IS NOT NULL" \
    " AND (SELECT ss.expired_at FROM sessions ss WHERE ss.id = s.session_id) IS NOT NULL" \
    " AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.sampling_session_id = s.id" \
    "   AND o.state IN ('queued', 'claimed'))"
/* Snapshots of models that are no longer active (unloaded, expired, failed) are dropped;
 * the registry GC then removes their blobs. Each snapshot's model is looked up by key (as
 * a join, PostgreSQL could hash every model ever created). */
#define SQL_DROP_INACTIVE_SNAPSHOTS \
    "DELETE FROM model_snapshots ms" \
    " WHERE (SELECT m.status FROM models m WHERE m.id = ms.model_id) <> 'active'"
