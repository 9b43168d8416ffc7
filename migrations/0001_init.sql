-- Loom's first schema: tenants and keys, sessions, training runs (models), the
-- operation queue (which is also the table of futures), clock cycles, executors,
-- checkpoints/adapter versions and the audit log.
-- Immutable once released: later changes go into new numbered files.

CREATE TABLE tenants (
    id          bigserial PRIMARY KEY,
    name        text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 128),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- API keys: "tml-" + random. Only a keyed BLAKE2b hash (server secret) is stored;
-- prefix is the first characters after "tml-", shown in listings to tell keys apart.
CREATE TABLE api_keys (
    id           bigserial PRIMARY KEY,
    tenant_id    bigint NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    prefix       text NOT NULL,
    hash         bytea NOT NULL UNIQUE,
    name         text,
    scopes       text[] NOT NULL DEFAULT ARRAY['train','sample','read'],
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    revoked_at   timestamptz,
    last_used_at timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

-- Base models an executor can serve (name as clients send it in base_model).
CREATE TABLE base_models (
    name         text PRIMARY KEY,
    path         text NOT NULL,
    arch         text NOT NULL,
    max_context  integer NOT NULL,
    vocab_size   integer NOT NULL,
    config       jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sessions (
    id                text PRIMARY KEY,
    tenant_id         bigint NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    tags              text[] NOT NULL DEFAULT '{}',
    user_metadata     jsonb,
    sdk_version       text,
    project_id        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sessions_tenant ON sessions (tenant_id, created_at);

CREATE TABLE executors (
    id              bigserial PRIMARY KEY,
    name            text NOT NULL,
    hostname        text NOT NULL,
    pid             integer NOT NULL,
    backend         text NOT NULL,            -- 'cpu' | 'cuda'
    device          text NOT NULL,
    base_model      text NOT NULL REFERENCES base_models(name),
    state           text NOT NULL DEFAULT 'idle' CHECK (state IN ('idle','busy','gone')),
    token_budget    integer NOT NULL,          -- tokens one cycle may carry
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now()
);

-- A training run ("model" in the Tinker API): one LoRA adapter being trained.
-- next_seq is the next seq_id the scheduler may claim for this model: ops run
-- strictly in seq_id order, out-of-order arrivals wait until the gap is filled.
CREATE TABLE models (
    id               text PRIMARY KEY,          -- "<session_id>:train:<model_seq_id>"
    tenant_id        bigint NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    session_id       text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    model_seq_id     integer NOT NULL,
    base_model       text NOT NULL REFERENCES base_models(name),
    lora_rank        integer NOT NULL CHECK (lora_rank BETWEEN 1 AND 512),
    lora_seed        bigint NOT NULL,
    train_attn       boolean NOT NULL,
    train_mlp        boolean NOT NULL,
    train_unembed    boolean NOT NULL,
    user_metadata    jsonb,
    status           text NOT NULL DEFAULT 'active' CHECK (status IN ('active','unloaded','failed')),
    executor_id      bigint REFERENCES executors(id),
    next_seq         integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    last_request_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, model_seq_id)
);
CREATE INDEX models_tenant ON models (tenant_id, created_at);

-- Clock cycles: the operations one executor ran together.
CREATE TABLE cycles (
    id               bigserial PRIMARY KEY,
    executor_id      bigint NOT NULL REFERENCES executors(id),
    state            text NOT NULL DEFAULT 'assigned'
                     CHECK (state IN ('assigned','running','done','failed','expired')),
    n_ops            integer NOT NULL,
    n_tokens         integer NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    lease_expires_at timestamptz NOT NULL,
    error            text
);
CREATE INDEX cycles_executor_open ON cycles (executor_id, id) WHERE state IN ('assigned','running');

-- The queue and the futures in one table. payload is the validated, normalised
-- request (what the executor reads); result is the exact JSON the client receives.
CREATE TABLE operations (
    id               bigserial PRIMARY KEY,
    request_id       text NOT NULL UNIQUE,
    tenant_id        bigint NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    model_id         text REFERENCES models(id) ON DELETE CASCADE,
    seq_id           integer,
    kind             text NOT NULL CHECK (kind IN ('create_model','forward','forward_backward',
                         'optim_step','save_weights','save_weights_for_sampler','load_weights',
                         'unload_model','sample')),
    payload          jsonb NOT NULL,
    n_tokens         integer NOT NULL DEFAULT 0,
    state            text NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued','claimed','done','failed','canceled')),
    cycle_id         bigint REFERENCES cycles(id),
    attempt          integer NOT NULL DEFAULT 0,
    result           jsonb,
    error            text,
    error_category   text CHECK (error_category IN ('user','server','unknown')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    claimed_at       timestamptz,
    finished_at      timestamptz,
    UNIQUE (model_id, seq_id)
);
CREATE INDEX operations_queued ON operations (model_id, seq_id) WHERE state = 'queued';
CREATE INDEX operations_cycle ON operations (cycle_id);
CREATE INDEX operations_tenant ON operations (tenant_id, created_at);

-- Adapters and their immutable versions (checkpoints). Blobs live in the registry's
-- content-addressed store; rows here are the metadata and the provenance.
CREATE TABLE adapters (
    id            bigserial PRIMARY KEY,
    tenant_id     bigint NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    model_id      text REFERENCES models(id) ON DELETE SET NULL,
    name          text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);

CREATE TABLE adapter_versions (
    id                 bigserial PRIMARY KEY,
    adapter_id         bigint NOT NULL REFERENCES adapters(id) ON DELETE CASCADE,
    kind               text NOT NULL CHECK (kind IN ('training','sampler')),
    name               text NOT NULL,           -- checkpoint name, e.g. "000020"
    tinker_path        text NOT NULL UNIQUE,
    step               bigint NOT NULL,
    parent_id          bigint REFERENCES adapter_versions(id),
    base_model         text NOT NULL,
    lora_config        jsonb NOT NULL,
    blob_digest        text NOT NULL,           -- sha256 hex of the stored blob
    size_bytes         bigint NOT NULL,
    provenance         jsonb NOT NULL DEFAULT '{}',
    visibility         text NOT NULL DEFAULT 'private' CHECK (visibility IN ('private','public')),
    created_by_key     bigint REFERENCES api_keys(id),
    created_at         timestamptz NOT NULL DEFAULT now(),
    expires_at         timestamptz,
    deleted_at         timestamptz
);
CREATE INDEX adapter_versions_digest ON adapter_versions (blob_digest);

CREATE TABLE adapter_grants (
    adapter_id   bigint NOT NULL REFERENCES adapters(id) ON DELETE CASCADE,
    tenant_id    bigint NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    granted_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (adapter_id, tenant_id)
);

-- Append-only record of security-relevant events.
CREATE TABLE audit_log (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    tenant_id   bigint REFERENCES tenants(id),
    actor       text NOT NULL,           -- 'cli', 'key:<prefix>', 'system'
    action      text NOT NULL,
    object      text,
    details     jsonb NOT NULL DEFAULT '{}'
);
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only';
END $$;
CREATE TRIGGER audit_log_no_update BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
