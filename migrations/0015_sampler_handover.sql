-- 0015: a draining executor hands its sampler snapshots over to its pool
-- (docs/architecture.md, "Pools and placement").
--
-- A snapshot taken by an unnamed save_weights_for_sampler lives in the memory of the
-- executor that took it (sampling_sessions.executor_id), so its samples run there. When
-- that executor drains, it writes the weights to the registry's blob store (the sampler
-- checkpoint format) and the sampling session names the blob instead of the executor:
-- any executor of the base model then loads it for the session's samples. The registry
-- GC keeps the blob while a sampling session names it; the scheduler lets go of it once
-- the session has expired and none of its samples is pending.
ALTER TABLE sampling_sessions ADD COLUMN snapshot_digest text;
CREATE INDEX sampling_sessions_snapshot_digest ON sampling_sessions (snapshot_digest)
    WHERE snapshot_digest IS NOT NULL;
