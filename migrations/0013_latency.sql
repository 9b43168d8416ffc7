-- 0013: latency without trade-offs (docs/architecture.md, "Clock cycles", rule 5).
-- cycles.compute_s: the executor's own time in a cycle (restore + backend), so that the
-- latency of an operation splits into queue, dispatch, execution and commit.
ALTER TABLE cycles ADD COLUMN compute_s real;
-- What the scheduler learns of each model, to hold a forward_backward for its optim_step
-- only when that is what the model does: how often the operation after a
-- forward_backward was an optim_step (moving average, from 0.5), the gap between their
-- submits (ms, moving average), and the submit time of the model's last claimed
-- operation when it was a forward_backward (its successor then teaches the pattern).
ALTER TABLE models
    ADD COLUMN pair_p real NOT NULL DEFAULT 0.5,
    ADD COLUMN pair_gap_ms real,
    ADD COLUMN tail_fb_at timestamptz;
-- The reaper's "lease lost" pass looks at cycles expired in the last minute: an index on
-- those, so that it never reads the history of done cycles (tests/test_bounded_queries.c
-- checks every periodic statement's plan).
CREATE INDEX cycles_expired ON cycles (finished_at) WHERE state = 'expired';
