-- Sampling sessions and sample operations (docs/protocol.md §3.3, §7.6 unnamed form, §11).
-- A sampling session samples from the base model, from a saved sampler checkpoint
-- (model_path), or from a snapshot of a training model's live weights taken by an
-- unnamed save_weights_for_sampler (source_model_id + source_seq_id). Such a snapshot
-- lives in the memory of the executor that holds the model (executor_id, set when the
-- snapshot is taken), so its sample operations are scheduled there.

CREATE TABLE sampling_sessions (
    id                  text PRIMARY KEY,            -- "<session_id>:sample:<seq_id>"
    tenant_id           bigint NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    session_id          text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq_id              integer NOT NULL,            -- sampling_session_seq_id
    base_model          text NOT NULL REFERENCES base_models(name),
    model_path          text,                        -- tinker://... it was created from, if any
    source_model_id     text REFERENCES models(id) ON DELETE CASCADE,
    source_seq_id       integer,                     -- the snapshot op's seq_id in that model
    adapter_version_id  bigint REFERENCES adapter_versions(id),
    executor_id         bigint REFERENCES executors(id),
    created_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, seq_id)
);
CREATE INDEX sampling_sessions_tenant ON sampling_sessions (tenant_id, created_at);

ALTER TABLE operations ADD COLUMN sampling_session_id text
    REFERENCES sampling_sessions(id) ON DELETE CASCADE;
-- (sampling_session_id, seq_id) de-duplicates resubmitted samples (docs/protocol.md §11.3).
CREATE UNIQUE INDEX operations_sample_seq ON operations (sampling_session_id, seq_id)
    WHERE sampling_session_id IS NOT NULL;
CREATE INDEX operations_sample_queued ON operations (id)
    WHERE state = 'queued' AND kind = 'sample';
