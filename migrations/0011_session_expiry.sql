-- 0011: sessions expire (docs/protocol.md §3.2). A session whose client neither sent a
-- heartbeat nor submitted anything for `loom scheduler --session-timeout-s` expires: its
-- queued operations are canceled with a message, each active model's state is saved as
-- the checkpoint weights/session-expired, and the models become 'expired' (their
-- executor frees them).
ALTER TABLE sessions ADD COLUMN expired_at timestamptz;
CREATE INDEX sessions_live_heartbeat ON sessions (last_heartbeat_at) WHERE expired_at IS NULL;
ALTER TABLE models DROP CONSTRAINT models_status_check;
ALTER TABLE models ADD CONSTRAINT models_status_check CHECK (status IN ('active', 'unloaded', 'failed', 'expired'));
