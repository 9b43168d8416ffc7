-- 0007: what operators see (README "Metrics", docs/architecture.md "Observability").
--
-- 1. Executors report their GPU (NVML, read by the executor's heartbeat where a GPU
--    exists; NULL on CPU executors).
-- 2. operations.metrics, and indexes that keep the scrape-time queries of /metrics, the console and
--    `loom status` bounded by what is live (the queue, live executors), never by history.
-- 3. Cumulative metrics (operation latencies, cycles, tokens per tenant) that no single
--    process sees whole: a trigger appends one narrow row per finished operation and per
--    finished cycle to an event table (an INSERT: no lock shared with anyone, so the
--    executors' commits never wait on each other), and loom_metrics_fold() moves those
--    rows into metric_counters, under an advisory lock, so one api at a time folds and
--    every api process reads the same totals. Its cost is the events since the last fold.

ALTER TABLE executors
    ADD COLUMN gpu_utilization   real,          -- percent of time a kernel ran (NVML)
    ADD COLUMN gpu_memory_used   bigint,        -- bytes used on the device, all processes
    ADD COLUMN gpu_memory_total  bigint,
    ADD COLUMN gpu_temperature   real,          -- degrees Celsius
    ADD COLUMN gpu_power_watts   real,
    ADD COLUMN gpu_sampled_at    timestamptz;

-- The metrics of a result (loss:sum, grad_norm:mean, step:max ...) in a column of their
-- own: loss curves read these few bytes, not the whole result (per-token outputs).
ALTER TABLE operations ADD COLUMN metrics jsonb GENERATED ALWAYS AS (result->'metrics') STORED;

CREATE INDEX operations_active ON operations (kind) WHERE state IN ('queued','claimed');
CREATE INDEX executors_live ON executors (id) WHERE state <> 'gone';
CREATE INDEX models_active ON models (base_model) WHERE status = 'active';
CREATE INDEX adapter_versions_live ON adapter_versions (blob_digest) WHERE deleted_at IS NULL;

-- The cumulative metric families: their Prometheus type, help and histogram buckets
-- (the api writes +Inf itself). The api exposes exactly these rows.
CREATE TABLE metric_families (
    family   text PRIMARY KEY,
    type     text NOT NULL CHECK (type IN ('counter','histogram')),
    help     text NOT NULL,
    buckets  float8[]
);
INSERT INTO metric_families VALUES
 ('loom_operations_total', 'counter',
  'Operations that finished, by kind and final state (done, failed, canceled).', NULL),
 ('loom_operation_wait_seconds', 'histogram',
  'Time from submit to claimed into a cycle, per operation kind.',
  '{0.005,0.01,0.025,0.05,0.1,0.25,0.5,1,2.5,5,10,30,60,120,300}'),
 ('loom_operation_run_seconds', 'histogram',
  'Time from claimed to done (the cycle that ran it), per operation kind.',
  '{0.005,0.01,0.025,0.05,0.1,0.25,0.5,1,2.5,5,10,30,60,120,300}'),
 ('loom_operation_latency_seconds', 'histogram',
  'Time from submit to done, per operation kind.',
  '{0.005,0.01,0.025,0.05,0.1,0.25,0.5,1,2.5,5,10,30,60,120,300}'),
 ('loom_tenant_tokens_total', 'counter',
  'Tokens of the operations a tenant completed, by kind.', NULL),
 ('loom_cycles_total', 'counter', 'Clock cycles that ended, by base model and state (done, expired).', NULL),
 ('loom_cycle_seconds', 'histogram', 'Duration of a cycle, started to finished.',
  '{0.005,0.01,0.025,0.05,0.1,0.25,0.5,1,2.5,5,10,30,60,120,300}'),
 ('loom_cycle_tokens', 'histogram', 'Tokens one cycle carried.',
  '{16,64,256,1024,4096,16384,65536,262144}'),
 ('loom_cycle_operations', 'histogram', 'Operations one cycle carried.',
  '{1,2,4,8,16,32,64,128,256,1024}'),
 ('loom_cycle_tenants', 'histogram', 'Tenants whose operations shared one cycle.',
  '{1,2,3,4,6,8,12,16,32}'),
 ('loom_executor_busy_seconds_total', 'counter',
  'Seconds an executor spent in cycles (rate() of it is the device''s busy fraction).', NULL);

-- Folded totals. labels: the series' labels as a JSON object (le excluded); suffix:
-- '' for counters, 'bucket' (cumulative, at le), 'sum' or 'count' for histograms.
CREATE TABLE metric_counters (
    family  text NOT NULL REFERENCES metric_families(family),
    labels  jsonb NOT NULL,
    suffix  text NOT NULL,
    le      float8 NOT NULL DEFAULT 0,
    value   float8 NOT NULL,
    PRIMARY KEY (family, labels, suffix, le)
);

-- Not yet folded. No index, no key: rows are only appended, and deleted whole by the fold.
CREATE TABLE metric_op_events (
    tenant_id  bigint NOT NULL,
    kind       text NOT NULL,
    state      text NOT NULL,
    n_tokens   integer NOT NULL,
    wait_s     float8,
    run_s      float8,
    latency_s  float8
);
CREATE TABLE metric_cycle_events (cycle_id bigint NOT NULL);

CREATE FUNCTION metric_op_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO metric_op_events VALUES (NEW.tenant_id, NEW.kind, NEW.state, NEW.n_tokens,
        extract(epoch FROM NEW.claimed_at - NEW.created_at),
        extract(epoch FROM NEW.finished_at - NEW.claimed_at),
        extract(epoch FROM NEW.finished_at - NEW.created_at));
    RETURN NULL;
END $$;
CREATE TRIGGER operations_metric_insert AFTER INSERT ON operations FOR EACH ROW
    WHEN (NEW.state IN ('done','failed','canceled')) EXECUTE FUNCTION metric_op_event();
CREATE TRIGGER operations_metric_finish AFTER UPDATE OF state ON operations FOR EACH ROW
    WHEN (NEW.state IN ('done','failed','canceled') AND OLD.state NOT IN ('done','failed','canceled'))
    EXECUTE FUNCTION metric_op_event();

CREATE FUNCTION metric_cycle_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO metric_cycle_events VALUES (NEW.id);
    RETURN NULL;
END $$;
CREATE TRIGGER cycles_metric_finish AFTER UPDATE OF state ON cycles FOR EACH ROW
    WHEN (NEW.state IN ('done','failed','expired') AND OLD.state NOT IN ('done','failed','expired'))
    EXECUTE FUNCTION metric_cycle_event();

-- Moves the events into metric_counters. Returns false when another session is folding
-- (its totals include these events once it commits). The one statement deletes exactly
-- the event rows it saw and adds them, in one transaction: every event counts once.
CREATE FUNCTION loom_metrics_fold() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(7340212) THEN
        RETURN false;
    END IF;
    WITH ev AS (DELETE FROM metric_op_events RETURNING *),
    cev AS (DELETE FROM metric_cycle_events RETURNING cycle_id),
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
        SELECT 'loom_tenant_tokens_total', jsonb_build_object('tenant', t.name, 'kind', ev.kind), '', 0,
               sum(ev.n_tokens)
          FROM ev JOIN tenants t ON t.id = ev.tenant_id
         WHERE ev.state = 'done' AND ev.n_tokens > 0 GROUP BY t.name, ev.kind
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
