-- The api's sampling submits (docs/protocol.md §11).
--
-- asample.seq_id de-duplicates resubmitted samples (§11.3). A SamplingClient counts
-- from 0, but an unpickled copy starts at 1e9 * (1 .. 1e9), far beyond integer, so
-- operations.seq_id becomes bigint (model seq_ids stay small; readers use int64).
ALTER TABLE operations ALTER COLUMN seq_id TYPE bigint;

-- Backpressure (§1.5, §11.1): asample counts the tenant's queued sample operations.
CREATE INDEX operations_sample_queued_tenant ON operations (tenant_id)
    WHERE state = 'queued' AND kind = 'sample';
