-- 0024: mixture-of-experts models (docs/architecture.md, "Mixture of experts"). For an
-- executor serving one, the tokens its forward and forward_backward passes routed to each
-- expert of each sparse layer since it started ([layer][expert], the operator console's
-- per-expert counts); NULL for a dense model or before its first pass.
ALTER TABLE executors ADD COLUMN expert_tokens bigint[];
