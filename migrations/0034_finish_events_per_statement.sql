-- 0034: the events of an operation that the executor's commit finishes as done (its metric
-- event, 0007, and its usage, 0014) are written by that statement itself, set-based
-- (executor/exe_sql.h, SQL_EXE_FINISH_OPS), instead of by two plpgsql row triggers per
-- operation (and usage_events' statement trigger once per operation, 0026): the commit
-- of a cycle finishes all its operations in one statement, which paid three trigger calls
-- and three single-row INSERTs per operation (about a sixth of that statement's time for
-- a lone forward_backward, and that again for every operation of a bigger cycle). That
-- statement is the only one that makes an operation done (an unload inserts its row done:
-- operations_metric_insert records it); every other end (failed, canceled, by the
-- executor, the reaper, a cancel) still records its metric event through the trigger.
-- That statement is also the only one that appends to usage_events now, so it appends the
-- same rows to metric_usage_events itself too (0026's statement trigger goes). The rows
-- written are the same as before.

-- No operation may finish unseen between the old triggers and the new one.
LOCK TABLE operations, usage_events IN SHARE ROW EXCLUSIVE MODE;

DROP TRIGGER operations_usage ON operations;
DROP FUNCTION usage_event();
DROP TRIGGER usage_events_metric ON usage_events;
DROP FUNCTION metric_usage_event();

DROP TRIGGER operations_metric_finish ON operations;
CREATE TRIGGER operations_metric_finish AFTER UPDATE OF state ON operations FOR EACH ROW
    WHEN (NEW.state IN ('failed', 'canceled') AND OLD.state NOT IN ('done', 'failed', 'canceled'))
    EXECUTE FUNCTION metric_op_event();
