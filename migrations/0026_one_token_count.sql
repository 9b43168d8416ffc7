-- 0026: one count of tokens everywhere (README "Quotas and usage", "Metrics").
--
-- loom_tenant_tokens_total (and the console's operator view and `loom status`, which read
-- it) summed operations.n_tokens: what a cycle reserves for an operation, which for a
-- sample is its prompt plus max_tokens for every sample asked for. `loom usage` and
-- GET /api/v1/usage count what was processed: train (a forward_backward's tokens), prefill
-- (a forward's, and a sample's prompt, prefilled once) and sample (tokens generated). One
-- chat of 34 tokens added 518 to the metric. Now the metric counts usage's tokens, by
-- usage's kinds: every row 0014's trigger appends to usage_events is appended here too,
-- and loom_metrics_fold() adds these rows instead of n_tokens. n_tokens stays what the
-- scheduler budgets cycles and the tokens-per-minute limit with.

-- No usage event may commit unseen between the rebuild below and the trigger.
LOCK TABLE usage_events IN SHARE ROW EXCLUSIVE MODE;

-- Not yet folded into the metric. Appended only, deleted whole by the fold (as 0007's).
CREATE TABLE metric_usage_events (
    tenant_id  bigint NOT NULL,
    kind       text NOT NULL,
    tokens     bigint NOT NULL
);

CREATE FUNCTION metric_usage_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO metric_usage_events SELECT tenant_id, kind, tokens FROM new_rows;
    RETURN NULL;
END $$;
CREATE TRIGGER usage_events_metric AFTER INSERT ON usage_events REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION metric_usage_event();

-- The totals so far, counted as usage counts them (folded days and the events not yet
-- folded), replace the old ones.
DELETE FROM metric_counters WHERE family = 'loom_tenant_tokens_total';
INSERT INTO metric_counters (family, labels, suffix, le, value)
SELECT 'loom_tenant_tokens_total', jsonb_build_object('tenant', t.name, 'kind', u.kind), '', 0, sum(u.tokens)
  FROM (SELECT tenant_id, kind, tokens FROM usage_daily UNION ALL SELECT tenant_id, kind, tokens FROM usage_events) u
  JOIN tenants t ON t.id = u.tenant_id
 GROUP BY t.name, u.kind HAVING sum(u.tokens) > 0;

UPDATE metric_families SET help = 'Tokens a tenant used, by kind: train (forward_backward), prefill (forward, '
    || 'and a sample''s prompt), sample (generated); the same numbers as GET /api/v1/usage.'
 WHERE family = 'loom_tenant_tokens_total';

-- 0007's fold, with the tokens taken from metric_usage_events.
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
               greatest(extract(epoch FROM c.finished_at - c.started_at), 0) AS secs,
               c.n_ops, c.n_tokens,
               (SELECT count(DISTINCT o.tenant_id) FROM operations o WHERE o.cycle_id = c.id) AS tenants
          FROM cev JOIN cycles c ON c.id = cev.cycle_id JOIN executors e ON e.id = c.executor_id),
    obs AS (   -- histogram observations
        SELECT 'loom_operation_wait_seconds' AS family, jsonb_build_object('kind', kind) AS labels,
               wait_s AS v FROM ev WHERE wait_s IS NOT NULL AND state = 'done'
        UNION ALL
        SELECT 'loom_operation_run_seconds', jsonb_build_object('kind', kind), run_s
          FROM ev WHERE run_s IS NOT NULL AND state = 'done'
        UNION ALL
        SELECT 'loom_operation_latency_seconds', jsonb_build_object('kind', kind), latency_s
          FROM ev WHERE latency_s IS NOT NULL AND state = 'done'
        UNION ALL
        SELECT 'loom_cycle_seconds', jsonb_build_object('base_model', base_model), secs
          FROM cy WHERE state = 'done' AND secs IS NOT NULL
        UNION ALL SELECT 'loom_cycle_tokens', jsonb_build_object('base_model', base_model), n_tokens
          FROM cy WHERE state = 'done'
        UNION ALL SELECT 'loom_cycle_operations', jsonb_build_object('base_model', base_model), n_ops
          FROM cy WHERE state = 'done'
        UNION ALL SELECT 'loom_cycle_tenants', jsonb_build_object('base_model', base_model), tenants
          FROM cy WHERE state = 'done'),
    rows AS (
        SELECT o.family, o.labels, 'bucket' AS suffix, b.le, count(*)::float8 AS inc
          FROM obs o JOIN metric_families f ON f.family = o.family
          CROSS JOIN LATERAL unnest(f.buckets || 'Infinity'::float8) AS b(le)
         WHERE o.v <= b.le GROUP BY 1, 2, 4
        UNION ALL SELECT family, labels, 'sum', 0, sum(v) FROM obs GROUP BY 1, 2
        UNION ALL SELECT family, labels, 'count', 0, count(*) FROM obs GROUP BY 1, 2
        UNION ALL
        SELECT 'loom_operations_total', jsonb_build_object('kind', kind, 'state', state), '', 0, count(*)
          FROM ev GROUP BY kind, state
        UNION ALL
        SELECT 'loom_tenant_tokens_total', jsonb_build_object('tenant', t.name, 'kind', uev.kind), '', 0,
               sum(uev.tokens)
          FROM uev JOIN tenants t ON t.id = uev.tenant_id GROUP BY t.name, uev.kind
        UNION ALL
        SELECT 'loom_cycles_total', jsonb_build_object('base_model', base_model, 'state', state), '', 0,
               count(*) FROM cy GROUP BY base_model, state
        UNION ALL
        SELECT 'loom_executor_busy_seconds_total',
               jsonb_build_object('host', hostname, 'device', device_index::text, 'backend', backend), '', 0,
               sum(secs) FROM cy WHERE secs IS NOT NULL GROUP BY hostname, device_index, backend)
    INSERT INTO metric_counters AS m (family, labels, suffix, le, value)
    SELECT family, labels, suffix, le, inc FROM rows
    ON CONFLICT (family, labels, suffix, le) DO UPDATE SET value = m.value + EXCLUDED.value;
    RETURN true;
END $$;
