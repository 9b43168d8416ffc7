-- 0012: executor pools (docs/architecture.md, "Pools and placement"). Several executors
-- serve one base model; the scheduler places each model on the live executor of its base
-- model with the most adapter memory free and keeps it there (affinity) until that
-- executor drains, evicts it or is gone.
ALTER TABLE executors
    ADD COLUMN draining boolean NOT NULL DEFAULT false,   -- `loom executor drain`: its models move away
    ADD COLUMN adapter_bytes_per_rank bigint;             -- a trainable adapter of rank 1 on every module
-- The models placed on an executor (placement sums their ranks), and the models waiting
-- for a place: both small, whatever the history.
CREATE INDEX models_placed ON models (executor_id) WHERE status = 'active';
CREATE INDEX models_unplaced ON models (last_request_at) WHERE status = 'active' AND executor_id IS NULL;
