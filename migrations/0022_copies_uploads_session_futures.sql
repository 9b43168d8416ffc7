-- 0022: copies, external weights, adapter uploads over HTTP, and the per-sampling-session
-- futures of SDK 0.26+ (docs/protocol.md §4.4–§4.6, §7.9, §12.4, §12.5).

-- A checkpoint of a third kind: save_weights_external writes the model's weights (as a
-- sampler checkpoint does) under tinker://<run>/external_weights/<name>, handed out as
-- signed per-file links in the PEFT layout.
ALTER TABLE adapter_versions DROP CONSTRAINT adapter_versions_kind_check;
ALTER TABLE adapter_versions ADD CONSTRAINT adapter_versions_kind_check
    CHECK (kind IN ('training', 'sampler', 'external'));

-- join_sampling_session: every client of a sampling session but its creator (client 0)
-- gets the next number; its sample seq_ids then lie in [n * 1e9, (n + 1) * 1e9), so the
-- (sampling_session_id, seq_id) idempotency key of two clients never collides.
ALTER TABLE sampling_sessions ADD COLUMN clients_joined integer NOT NULL DEFAULT 0;

-- retrieve_futures: a finished sample gets its number in its session's report order when
-- a poll of that session first sees it (report_seq, from completions_reported, under the
-- session row's lock). Numbering at read time, not at commit, means that a commit that
-- lands late only gets a later number: a poller that moved its cursor past a number can
-- never miss a completion, whatever order the executors' transactions commit in.
ALTER TABLE sampling_sessions ADD COLUMN completions_reported bigint NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN report_seq bigint;
-- The samples of a session a poll may still have to number (pending or finished and not
-- numbered yet), and those it reports after a cursor.
CREATE INDEX operations_sample_unreported ON operations (sampling_session_id, seq_id)
    WHERE kind = 'sample' AND report_seq IS NULL;
CREATE INDEX operations_sample_reported ON operations (sampling_session_id, report_seq)
    WHERE report_seq IS NOT NULL;

-- A sample that reaches a final state, by whatever path (an executor's commit, the reaper,
-- session expiry, cancel_future, a withdrawn share), wakes the polls parked on its
-- session: one NOTIFY loom_op_done 'ss:' || md5(session) per session and transaction
-- (PostgreSQL folds identical notifications of one transaction into one).
CREATE FUNCTION loom_sample_finished_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('loom_op_done', 'ss:' || md5(NEW.sampling_session_id));
    RETURN NULL;
END $$;
CREATE TRIGGER operations_sample_finished AFTER UPDATE OF state ON operations
    FOR EACH ROW WHEN (NEW.kind = 'sample' AND NEW.sampling_session_id IS NOT NULL
                       AND NEW.state IN ('done', 'failed', 'canceled')
                       AND OLD.state NOT IN ('done', 'failed', 'canceled'))
    EXECUTE FUNCTION loom_sample_finished_notify();

-- external_weights_upload_start / PUT / _finish: an adapter import over HTTP. The files
-- are staged in the blob store's temporary directory (never held in memory) until
-- _finish validates them (model/adapter_io.c, as `loom adapter import` does) and records
-- the checkpoint; an upload not finished before expires_at is dropped by the registry GC
-- together with its staged files.
CREATE TABLE weight_uploads (
    id             text PRIMARY KEY,                    -- "upl-<32 hex>", also the run name
    tenant_id      bigint NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    key_id         bigint REFERENCES api_keys(id),      -- the key that started it
    base_model     text NOT NULL,
    lora_config    jsonb NOT NULL DEFAULT '{}',         -- what the client declared
    project_id     text,                                -- recorded; Loom has no projects
    files          jsonb NOT NULL DEFAULT '{}',         -- file name -> bytes staged
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    finished_at    timestamptz,
    tinker_path    text                                 -- once finished
);
CREATE INDEX weight_uploads_open ON weight_uploads (tenant_id, expires_at) WHERE finished_at IS NULL;
