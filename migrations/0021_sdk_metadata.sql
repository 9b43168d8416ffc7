-- 0021: what SDK 0.26 - 0.39 send and read about sessions, models and checkpoints
-- (docs/protocol.md §3.1, §3.5, §7.1, §7.5, §7.6, §12).
--
-- models.optimizer: the optimizer family chosen at create_model, fixed for the model's
-- life; every optim_step must carry that family's parameters. Only 'adamw' is
-- implemented; a model of another family is refused at create_model, never created.
ALTER TABLE models ADD COLUMN optimizer text NOT NULL DEFAULT 'adamw';

-- Sessions: the display name the SDK sends (ServiceClient(display_name=...)), and how the
-- client said it finished (POST sessions/{id}/finish, ServiceClient.close): the first
-- call wins, later ones read it back. A finished session takes no more heartbeats (410)
-- and no more submits.
ALTER TABLE sessions ADD COLUMN display_name text;
ALTER TABLE sessions ADD COLUMN finished_at timestamptz;
ALTER TABLE sessions ADD COLUMN finish_reason text
    CHECK (finish_reason IN ('success', 'errored', 'interrupted'));
ALTER TABLE sessions ADD COLUMN finish_detail text;
ALTER TABLE sessions ADD CONSTRAINT sessions_finished_with_reason
    CHECK ((finished_at IS NULL) = (finish_reason IS NULL));

-- SDKs read the user_metadata of sessions and training runs as dict[str, str] and
-- refuse anything else; create_session and create_model now refuse other values, and
-- what earlier versions stored is made text here: a JSON null or a non-object becomes
-- NULL, a non-string value its JSON text.
CREATE FUNCTION pg_temp.string_map(m jsonb) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(m) <> 'object' THEN NULL
                ELSE COALESCE((SELECT jsonb_object_agg(e.key, CASE WHEN jsonb_typeof(e.value) = 'string'
                                                                   THEN e.value ELSE to_jsonb(e.value::text) END)
                               FROM jsonb_each(m) e), '{}') END
$$;
UPDATE sessions SET user_metadata = pg_temp.string_map(user_metadata)
    WHERE user_metadata IS NOT NULL AND user_metadata IS DISTINCT FROM pg_temp.string_map(user_metadata);
UPDATE models SET user_metadata = pg_temp.string_map(user_metadata)
    WHERE user_metadata IS NOT NULL AND user_metadata IS DISTINCT FROM pg_temp.string_map(user_metadata);
DROP FUNCTION pg_temp.string_map(jsonb);

-- Checkpoints: the user_metadata of the save that made them (string values), returned in
-- Checkpoint objects and matched exactly by search_checkpoints.
ALTER TABLE adapter_versions ADD COLUMN user_metadata jsonb;
CREATE INDEX adapter_versions_user_metadata ON adapter_versions USING gin (user_metadata jsonb_path_ops)
    WHERE deleted_at IS NULL AND user_metadata IS NOT NULL;
-- search_checkpoints pages newest first by (created_at, id)
CREATE INDEX adapter_versions_live_created ON adapter_versions (created_at DESC, id DESC)
    WHERE deleted_at IS NULL;
