-- 0010: durable training state (docs/architecture.md, "Durable training state").
--
-- A model's training state (LoRA weights, AdamW moments, gradients not yet stepped) is
-- recoverable by any executor of its pool: from its latest snapshot (a blob in the
-- registry's store, the training-checkpoint format) plus a replay of the operations
-- that changed the state since, in seq order. Replay is exact because the backend is
-- batch-invariant; a backend that is not has a snapshot written at every step.

-- The operation changed its model's training state (create_model, a forward_backward
-- that added gradient, an optim_step, a load_weights): replayed on recovery.
ALTER TABLE operations ADD COLUMN applied boolean NOT NULL DEFAULT false;
CREATE INDEX operations_applied ON operations (model_id, seq_id) WHERE applied;

-- seq_id of the last committed operation that changed the state (-1: none yet). An
-- executor whose copy says otherwise holds a stale copy and rebuilds it.
ALTER TABLE models ADD COLUMN state_seq integer NOT NULL DEFAULT -1;

-- The latest snapshot of each model: its state after operation seq_id, with no gradient
-- pending (seq_id is that of a create_model, optim_step or load_weights). The blob is
-- kept by the registry GC while a row points at it.
CREATE TABLE model_snapshots (
    model_id     text PRIMARY KEY REFERENCES models(id) ON DELETE CASCADE,
    seq_id       integer NOT NULL,
    step         bigint NOT NULL,
    blob_digest  text NOT NULL,
    size_bytes   bigint NOT NULL,
    executor_id  bigint REFERENCES executors(id),
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX model_snapshots_digest ON model_snapshots (blob_digest);

-- Models active when this runs were trained by executors that recorded no `applied`: the
-- operations that changed their state are the done ones of those kinds.
UPDATE operations o SET applied = true FROM models m
 WHERE m.id = o.model_id AND m.status = 'active' AND o.state = 'done'
   AND o.kind IN ('create_model', 'forward_backward', 'optim_step', 'load_weights');
UPDATE models m SET state_seq = x.seq FROM
  (SELECT model_id, max(seq_id) AS seq FROM operations WHERE applied GROUP BY model_id) x
 WHERE m.id = x.model_id;
