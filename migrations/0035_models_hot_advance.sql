-- 0035: the models waiting for a place are indexed by id instead of by last_request_at
-- (0012). Every claim moves its models' last_request_at (the scheduler serves the least
-- recently served first: scheduler/sched_sql.h, SQL_ADVANCE_MODELS), and PostgreSQL
-- updates a row in place (HOT: no new entry in any index) only when no indexed column
-- changes, a partial index's predicate columns included: with last_request_at in this
-- index every claim wrote a new entry for its model in each of the table's seven indexes.
-- Placement finds its models from the queue (SQL_PLACE_MODELS) and orders those few by
-- last_request_at itself; the index keeps what it is there for, a lookup of the models
-- waiting for a place that does not read the models placed or kept.
DROP INDEX models_unplaced;
CREATE INDEX models_unplaced ON models (id) WHERE status = 'active' AND executor_id IS NULL;
