-- 0030: nothing grows with history (docs/architecture.md, "Bounded by the work").
--
-- 1. Fewer indexes on operations. Every change of an operation's state is an update that
--    cannot be HOT (the queue's indexes name `state`), so each index the new row version
--    belongs to gets an entry: 8 at a submit, 8 at the claim, 7 at the commit of a
--    forward_backward before, 5, 7 and 5 now. Which statement uses which index is what
--    tests/test_bounded_queries.c reads from the plans:
--      operations_pkey, _request_id_key, _model_id_seq_id_key   (unchanged)
--      operations_model_live (model_id, seq_id), the live operations of a model: the
--        scheduler's queue (ready models, queued ops, placement) and "none claimed"
--        checks (unpin, drain, session expiry); was operations_queued, queued only
--      operations_live (tenant_id, kind), every live operation by tenant and kind: the
--        queued-ops limit at submit, queued samples, OpenAI requests in flight, the
--        queue in /metrics, GET usage; replaces operations_active (kind),
--        operations_tenant_active (tenant_id), operations_sample_queued_tenant
--        (tenant_id) and operations_openai_live (tenant_id)
--      operations_in_cycle (cycle_id), operations that ran in a cycle (the executor's
--        start and commit, the reaper, the metrics fold); was operations_cycle, which
--        also held every queued operation's NULL
--      operations_tenant_claimed, operations_sample_*   (unchanged)
--    and gone: operations_tenant (tenant_id, created_at), which no statement needs (its
--    only user was retrieve_future, where it was the wrong choice: without statistics
--    PostgreSQL read every operation of the tenant through it), and operations_applied
--    (model_id, seq_id) WHERE applied: a replay reads its seq range through the unique
--    (model_id, seq_id) index.
DROP INDEX operations_tenant, operations_applied, operations_active, operations_tenant_active,
    operations_sample_queued_tenant, operations_openai_live, operations_queued, operations_cycle;
CREATE INDEX operations_model_live ON operations (model_id, seq_id)
    WHERE state IN ('queued', 'claimed') AND model_id IS NOT NULL;
CREATE INDEX operations_live ON operations (tenant_id, kind) WHERE state IN ('queued', 'claimed');
CREATE INDEX operations_in_cycle ON operations (cycle_id) WHERE cycle_id IS NOT NULL;

-- 2. Lookups that read a table of history whole: an API key by its prefix (every request
--    whose key is not cached; revoked keys stay), a run's newest checkpoint (training run
--    listings), a run's checkpoints by the run's name (its unique key leads with the
--    tenant, and a run may be another tenant's, shared), and the blobs the registry GC has
--    yet to remove (every pass).
CREATE INDEX api_keys_prefix ON api_keys (prefix);
CREATE INDEX adapters_model ON adapters (model_id);
CREATE INDEX adapters_name ON adapters (name);
CREATE INDEX adapter_versions_unremoved ON adapter_versions (blob_digest) WHERE blob_removed_at IS NULL;

-- 3. The metrics fold, bounded by the events it folds. 0026's joined every observation
--    with every bucket of its histogram and grouped the product by a jsonb built per row
--    (0.2-1.1 s a fold at 600 operations/s; up to 1.9 s with stale statistics, when
--    PostgreSQL also read the cycles and executors tables whole to join the cycle events).
--    Now each observation is counted once, in the first bucket it falls in (width_bucket),
--    per series (the label's text), and the cumulative buckets are summed from those few
--    counts; a cycle's row, its executor and its tenants are looked up by key, one at a
--    time (OFFSET 0 keeps each LATERAL lookup from being flattened into a join, which
--    PostgreSQL may then hash over the whole table). The same totals as before
--    (tests/test_migrate_0030.c folds the same events with both).
CREATE OR REPLACE FUNCTION loom_metrics_fold() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(7340212) THEN
        RETURN false;
    END IF;
    WITH ev AS (DELETE FROM metric_op_events RETURNING *),
    cev AS (DELETE FROM metric_cycle_events RETURNING cycle_id),
    uev AS (DELETE FROM metric_usage_events RETURNING *),
    cy AS (
        SELECT c.state, e.base_model, e.hostname, e.device_index, e.backend,
               greatest(extract(epoch FROM c.finished_at - c.started_at), 0) AS secs, c.n_ops, c.n_tokens,
               (SELECT count(DISTINCT o.tenant_id) FROM operations o WHERE o.cycle_id = c.id) AS tenants
          FROM cev
         CROSS JOIN LATERAL (SELECT * FROM cycles c WHERE c.id = cev.cycle_id OFFSET 0) c
         CROSS JOIN LATERAL (SELECT * FROM executors e WHERE e.id = c.executor_id OFFSET 0) e),
    obs AS (   -- histogram observations: family, label name, label value, value
        SELECT 'loom_operation_wait_seconds' AS family, 'kind' AS lname, kind AS lval, wait_s AS v
          FROM ev WHERE wait_s IS NOT NULL AND state = 'done'
        UNION ALL SELECT 'loom_operation_run_seconds', 'kind', kind, run_s
          FROM ev WHERE run_s IS NOT NULL AND state = 'done'
        UNION ALL SELECT 'loom_operation_latency_seconds', 'kind', kind, latency_s
          FROM ev WHERE latency_s IS NOT NULL AND state = 'done'
        UNION ALL SELECT 'loom_cycle_seconds', 'base_model', base_model, secs
          FROM cy WHERE state = 'done' AND secs IS NOT NULL
        UNION ALL SELECT 'loom_cycle_tokens', 'base_model', base_model, n_tokens FROM cy WHERE state = 'done'
        UNION ALL SELECT 'loom_cycle_operations', 'base_model', base_model, n_ops FROM cy WHERE state = 'done'
        UNION ALL SELECT 'loom_cycle_tenants', 'base_model', base_model, tenants FROM cy WHERE state = 'done'),
    fam AS (   -- each histogram's bounds, and the same negated in reverse order: width_bucket
               -- over those counts the bounds >= v, so n minus it is the bounds below v
        SELECT f.family, f.buckets, cardinality(f.buckets) AS n,
               ARRAY(SELECT -b FROM unnest(f.buckets) WITH ORDINALITY u(b, i) ORDER BY i DESC) AS neg
          FROM metric_families f WHERE f.type = 'histogram'),
    g AS (     -- per series: the observations whose first bucket is idx + 1 (n + 1: +Inf)
        SELECT o.family, o.lname, o.lval, f.n - width_bucket(-o.v, f.neg) AS idx, count(*) AS k, sum(o.v) AS s
          FROM obs o JOIN fam f ON f.family = o.family GROUP BY 1, 2, 3, 4),
    rows AS (
        SELECT g.family, jsonb_build_object(g.lname, g.lval) AS labels, 'bucket' AS suffix,
               (f.buckets || 'Infinity'::float8)[j] AS le, sum(g.k)::float8 AS inc
          FROM g JOIN fam f ON f.family = g.family CROSS JOIN LATERAL generate_series(g.idx + 1, f.n + 1) j
         GROUP BY 1, 2, 4
        UNION ALL SELECT family, jsonb_build_object(lname, lval), 'sum', 0, sum(s) FROM g GROUP BY 1, 2
        UNION ALL SELECT family, jsonb_build_object(lname, lval), 'count', 0, sum(k) FROM g GROUP BY 1, 2
        UNION ALL
        SELECT 'loom_operations_total', jsonb_build_object('kind', kind, 'state', state), '', 0, n
          FROM (SELECT kind, state, count(*) AS n FROM ev GROUP BY kind, state) x
        UNION ALL
        SELECT 'loom_tenant_tokens_total', jsonb_build_object('tenant', t.name, 'kind', x.kind), '', 0, x.n
          FROM (SELECT tenant_id, kind, sum(tokens) AS n FROM uev GROUP BY tenant_id, kind) x
         CROSS JOIN LATERAL (SELECT name FROM tenants t WHERE t.id = x.tenant_id OFFSET 0) t
        UNION ALL
        SELECT 'loom_cycles_total', jsonb_build_object('base_model', base_model, 'state', state), '', 0, n
          FROM (SELECT base_model, state, count(*) AS n FROM cy GROUP BY base_model, state) x
        UNION ALL
        SELECT 'loom_executor_busy_seconds_total',
               jsonb_build_object('host', hostname, 'device', device_index::text, 'backend', backend), '', 0, n
          FROM (SELECT hostname, device_index, backend, sum(secs) AS n FROM cy WHERE secs IS NOT NULL
                 GROUP BY hostname, device_index, backend) x)
    INSERT INTO metric_counters AS m (family, labels, suffix, le, value)
    SELECT family, labels, suffix, le, inc FROM rows
    ON CONFLICT (family, labels, suffix, le) DO UPDATE SET value = m.value + EXCLUDED.value;
    RETURN true;
END $$;

-- 4. No JIT compilation for Loom's sessions. Its statements are short lookups; PostgreSQL
--    compiles a plan only when it expects it to be expensive, which here happens when its
--    estimates are wrong (no or stale statistics), and then spends 50-200 ms compiling a
--    statement that reads a few buffers (tests/test_bounded_queries.c, "no statistics").
--    A database the migrating role does not own keeps its setting (the operator's).
DO $$
BEGIN
    EXECUTE format('ALTER DATABASE %I SET jit = off', current_database());
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'jit stays as configured: only the owner of database % may change it', current_database();
END $$;
