-- 0041: an executor's idle <-> busy flips are HOT updates.
--
-- executors_live (the registrations not gone, 0007) named `state` in its predicate, and an
-- update that changes a column any index names cannot be HOT: each flip (two a cycle)
-- wrote a new row version elsewhere in the table and new entries into both indexes, and
-- the dead versions stayed until autovacuum took the table (about once a minute): on a
-- busy fleet hundreds of pages a minute, which the claim's and the reaper's reads of the
-- executors then went through (bench/loom_bench.py --parts churn: the claim read 39 -> 60
-- buffers over 3,000 lone operations). The index now names `gone`, computed from `state`,
-- which a flip does not change: the new version stays on its page and the old one is
-- pruned there. Statements that read the live registrations say `NOT gone`.
ALTER TABLE executors ADD COLUMN gone boolean GENERATED ALWAYS AS (state = 'gone') STORED;
DROP INDEX executors_live;
CREATE INDEX executors_live ON executors (id) WHERE NOT gone;
