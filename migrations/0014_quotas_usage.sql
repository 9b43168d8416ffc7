-- 0014: per-tenant limits and usage (README "Quotas and usage").
--
-- Limits (`loom tenant set-limits`; NULL: no limit):
--   max_queued_ops        operations queued or running at once: a submit past it is a 429
--                         with Retry-After (the SDK backs off and sends it again);
--   tokens_per_minute     tokens claimed into cycles in any minute: past it the scheduler
--                         holds the tenant's work, and its futures answer try_again with
--                         queue_state paused_rate_limit and the reason;
--   max_live_models       active training runs: create_model past it is a 429;
--   max_checkpoint_bytes  bytes of live checkpoints: save_weights past it is a 400.
CREATE TABLE tenant_limits (
    tenant_id             bigint PRIMARY KEY REFERENCES tenants(id) ON DELETE CASCADE,
    max_queued_ops        integer CHECK (max_queued_ops > 0),
    tokens_per_minute     bigint CHECK (tokens_per_minute > 0),
    max_live_models       integer CHECK (max_live_models > 0),
    max_checkpoint_bytes  bigint CHECK (max_checkpoint_bytes > 0),
    updated_at            timestamptz NOT NULL DEFAULT now()
);

-- A tenant's live work, counted at every submit (bounded by the work, not the history).
CREATE INDEX operations_tenant_active ON operations (tenant_id) WHERE state IN ('queued', 'claimed');

-- Usage: every operation that completes appends what it used, per tenant, run and kind:
--   train    tokens of a forward_backward
--   prefill  tokens of a forward, and the prompt tokens of a sample request (prefilled once)
--   sample   tokens a sample request generated
-- run: the training run (model id), or what a sampler samples from (the source model, the
-- checkpoint path, or base:<model>). Appended (no lock shared by concurrent commits),
-- and folded into daily totals by loom_usage_fold() (the scheduler, every 2 s), as the
-- metrics are (0007).
CREATE TABLE usage_events (
    tenant_id  bigint NOT NULL,
    run        text NOT NULL,
    kind       text NOT NULL,
    tokens     bigint NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE usage_daily (
    tenant_id  bigint NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    day        date NOT NULL,
    run        text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('train', 'prefill', 'sample')),
    tokens     bigint NOT NULL,
    PRIMARY KEY (tenant_id, day, run, kind)
);

CREATE FUNCTION usage_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    src text;
BEGIN
    IF NEW.kind = 'forward_backward' AND NEW.n_tokens > 0 THEN
        INSERT INTO usage_events (tenant_id, run, kind, tokens) VALUES (NEW.tenant_id, NEW.model_id, 'train', NEW.n_tokens);
    ELSIF NEW.kind = 'forward' AND NEW.n_tokens > 0 THEN
        INSERT INTO usage_events (tenant_id, run, kind, tokens) VALUES (NEW.tenant_id, NEW.model_id, 'prefill', NEW.n_tokens);
    ELSIF NEW.kind = 'sample' THEN
        SELECT coalesce(s.source_model_id, s.model_path, 'base:' || s.base_model) INTO src
          FROM sampling_sessions s WHERE s.id = NEW.sampling_session_id;
        INSERT INTO usage_events (tenant_id, run, kind, tokens)
        SELECT NEW.tenant_id, coalesce(src, 'sample'), k, n FROM (VALUES
            ('prefill', coalesce(jsonb_array_length(NEW.payload->'prompt'), 0)::bigint),
            ('sample', coalesce((SELECT sum(jsonb_array_length(q->'tokens')) FROM
                                 jsonb_array_elements(NEW.result->'sequences') q), 0)::bigint)) v(k, n)
         WHERE n > 0;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER operations_usage AFTER UPDATE OF state ON operations FOR EACH ROW
    WHEN (NEW.state = 'done' AND OLD.state <> 'done' AND NEW.kind IN ('forward_backward', 'forward', 'sample'))
    EXECUTE FUNCTION usage_event();

-- Moves the events into usage_daily; false when another session is folding.
CREATE FUNCTION loom_usage_fold() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(7340213) THEN
        RETURN false;
    END IF;
    WITH ev AS (DELETE FROM usage_events RETURNING *)
    INSERT INTO usage_daily AS u (tenant_id, day, run, kind, tokens)
    SELECT tenant_id, (at AT TIME ZONE 'UTC')::date, run, kind, sum(tokens) FROM ev GROUP BY 1, 2, 3, 4
    ON CONFLICT (tenant_id, day, run, kind) DO UPDATE SET tokens = u.tokens + EXCLUDED.tokens;
    RETURN true;
END $$;

-- Tokens per tenant, run, kind and day (UTC), folded up to the last 2 s.
CREATE VIEW usage_tokens AS
SELECT t.name AS tenant, u.tenant_id, u.day, u.run, u.kind, u.tokens
  FROM usage_daily u JOIN tenants t ON t.id = u.tenant_id;

-- Checkpoint storage per tenant and run: the live versions (not deleted, not expired) and
-- their bytes (a blob saved twice counts twice: it is the tenant's to delete either way).
CREATE VIEW usage_storage AS
SELECT t.name AS tenant, a.tenant_id, a.name AS run, count(*) AS checkpoints, sum(v.size_bytes) AS bytes
  FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id JOIN tenants t ON t.id = a.tenant_id
 WHERE v.deleted_at IS NULL AND (v.expires_at IS NULL OR v.expires_at > now())
 GROUP BY t.name, a.tenant_id, a.name;

-- Live models per tenant (the live-models limit at create_model), and tokens claimed in the
-- last minute per tenant (the rate limit, for tenants that have one).
CREATE INDEX models_tenant_active ON models (tenant_id) WHERE status = 'active';
CREATE INDEX operations_tenant_claimed ON operations (tenant_id, claimed_at) WHERE claimed_at IS NOT NULL;
