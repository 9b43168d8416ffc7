-- 0040: the indexes of live operations keep one entry per row version.
--
-- Each operation passes through three row versions (queued, claimed, done) in updates
-- that cannot be HOT, and each dead version's entries stay in the indexes until a vacuum
-- (autovacuum takes a deployment's operations table every few hundred thousand changes).
-- An index scan that steps on an entry whose row is dead to everybody marks it, and no
-- later scan visits that row again; but PostgreSQL keeps the entries of one key together
-- in a posting list (deduplication) and can mark a posting list only once every row in it
-- is dead. The key of operations_live is a tenant and a kind: a busy tenant's posting list
-- holds its live operations and hundreds of finished ones, which every statement that
-- reads the tenant's live operations (a submit's queued-operations limit, retrieve_future,
-- the metrics' queue, the reaper) then fetched from the table again, each time
-- (tests/test_bounded_queries.c, its churn: 545 buffers a submit instead of 13). Entries
-- already merged stay merged until their rows die; none are merged from now on.
ALTER INDEX operations_live SET (deduplicate_items = off);
ALTER INDEX operations_model_live SET (deduplicate_items = off);
