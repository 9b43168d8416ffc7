-- 0006: what an executor holds on its device, written by the executor at registration
-- and after every cycle (docs/architecture.md, "The adapter store"), for operators today
-- and for placement across executors later.
ALTER TABLE executors
    ADD COLUMN device_index       integer NOT NULL DEFAULT 0,   -- --device
    ADD COLUMN memory_total       bigint,                       -- bytes of device memory
    ADD COLUMN memory_budget      bigint,                       -- bytes its adapters may hold
    ADD COLUMN memory_used        bigint  NOT NULL DEFAULT 0,   -- bytes they hold now
    ADD COLUMN training_slots     integer NOT NULL DEFAULT 0,   -- models training here
    ADD COLUMN sampler_snapshots  integer NOT NULL DEFAULT 0,   -- unnamed save_weights_for_sampler
    ADD COLUMN cached_checkpoints integer NOT NULL DEFAULT 0;   -- checkpoints loaded for sampling
