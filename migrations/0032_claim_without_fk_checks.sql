-- 0032: a claim without foreign-key checks (docs/architecture.md, "Bounded by the work").
--
-- Every claim inserts a cycle and points its operations at it in one statement
-- (SQL_INSERT_CYCLES_CLAIM), for an executor row the same transaction has locked: the
-- foreign keys operations.cycle_id -> cycles and cycles.executor_id -> executors were
-- checked by PostgreSQL for rows that statement had just written or locked, one lookup
-- per claimed operation and one per cycle (about 0.05 ms each on the development machine,
-- a quarter of a lone claim's time: EXPLAIN ANALYZE of the claim, warm). Nothing deletes a
-- cycle or an executor (gone executors and finished cycles stay as history), so the keys
-- guarded nothing the claim does not; the columns stay as they were, without the checks.
ALTER TABLE operations DROP CONSTRAINT operations_cycle_id_fkey;
ALTER TABLE cycles DROP CONSTRAINT cycles_executor_id_fkey;
