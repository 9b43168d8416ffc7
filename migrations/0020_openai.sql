-- The OpenAI-compatible routes (docs/protocol.md §18).
--
-- Aliases: a name a tenant gives one of its own checkpoints, usable as the `model` of
-- /v1/completions and /v1/chat/completions (and listed by /v1/models). The alias names a
-- tinker path, resolved (and its access checked) at every request, so a deleted
-- checkpoint makes the alias answer 404 and a new save under the path is picked up.
CREATE TABLE adapter_aliases (
    tenant_id    bigint NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    alias        text NOT NULL CHECK (alias ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    tinker_path  text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, alias)
);

-- The sampling sessions behind OpenAI requests: one per tenant and source (a base model,
-- or a checkpoint version), under one session per tenant ("openai-<tenant id>"), so that
-- these requests are ordinary sample operations: scheduled in cycles with the rest,
-- counted in the tenant's usage, requeued like other samples.
CREATE TABLE openai_samplers (
    tenant_id            bigint NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    source               text NOT NULL,     -- 'base:<name>' or 'version:<adapter_versions.id>'
    sampling_session_id  text NOT NULL REFERENCES sampling_sessions(id) ON DELETE CASCADE,
    PRIMARY KEY (tenant_id, source)
);

-- The sampling session of (tenant, source), made on first use. Serialised per tenant so
-- that concurrent first requests agree on one.
CREATE FUNCTION loom_openai_sampler(p_tenant bigint, p_base_model text, p_model_path text,
                                    p_version bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    src text := CASE WHEN p_version IS NULL THEN 'base:' || p_base_model
                     ELSE 'version:' || p_version END;
    sess text := 'openai-' || p_tenant;
    sid text;
    seq integer;
BEGIN
    SELECT sampling_session_id INTO sid FROM openai_samplers WHERE tenant_id = p_tenant AND source = src;
    IF FOUND THEN RETURN sid; END IF;
    PERFORM pg_advisory_xact_lock(hashtext('loom_openai_sampler:' || p_tenant));
    SELECT sampling_session_id INTO sid FROM openai_samplers WHERE tenant_id = p_tenant AND source = src;
    IF FOUND THEN RETURN sid; END IF;
    INSERT INTO sessions (id, tenant_id, tags, sdk_version)
        VALUES (sess, p_tenant, ARRAY['openai'], 'openai-compatible routes')
        ON CONFLICT (id) DO NOTHING;
    SELECT COALESCE(max(s.seq_id) + 1, 0) INTO seq FROM sampling_sessions s WHERE s.session_id = sess;
    sid := sess || ':sample:' || seq;
    INSERT INTO sampling_sessions (id, tenant_id, session_id, seq_id, base_model, model_path, adapter_version_id)
        VALUES (sid, p_tenant, sess, seq, p_base_model, p_model_path, p_version);
    INSERT INTO openai_samplers (tenant_id, source, sampling_session_id) VALUES (p_tenant, src, sid);
    RETURN sid;
END $$;

-- A tenant's OpenAI requests in flight (the per-tenant bound, `loom api --max-streams`).
CREATE INDEX operations_openai_live ON operations (tenant_id)
    WHERE kind = 'sample' AND state IN ('queued', 'claimed') AND payload ? 'progress';
