-- 0037: the hot tables' value rules as domains, and operations.metrics a plain column
-- (docs/architecture.md, "Bounded by the work").
--
-- PostgreSQL 15 prepares a table's CHECK constraints again for every statement that
-- writes the table (each one's stored expression parsed, simplified and compiled), and
-- checks all of them on every row written, whatever columns changed; a STORED generated
-- column's expression likewise, computed again on every UPDATE. A lone forward_backward
-- writes operations, cycles, models and executors eight times (`perf` of the executor's
-- PostgreSQL backend: 7 % of its CPU in ExecConstraints, 1 % in ExecInitStoredGenerated).
-- A domain's constraints are prepared once per session (the type cache) and checked only
-- where a value of the domain is written. The rules are the same; each column takes the
-- domain of its values, and the CHECK goes. The columns become the domain's type without a
-- rewrite (a domain without constraints first, its constraint added after, which checks
-- the rows once); the triggers whose WHEN reads a changed column are made again around it,
-- as they were (0007, 0022, 0034).
--
-- operations.metrics (0007: result->'metrics', for the console and the registry) is
-- written by the statements that write result (SQL_EXE_FINISH_UPDATE, SQL_UNLOAD_OP_INSERT)
-- instead of recomputed by every update of the row; the values stay as they are.
CREATE DOMAIN loom_op_state AS text;
CREATE DOMAIN loom_op_kind AS text;
CREATE DOMAIN loom_error_category AS text;
CREATE DOMAIN loom_cycle_state AS text;
CREATE DOMAIN loom_executor_state AS text;
CREATE DOMAIN loom_model_status AS text;
CREATE DOMAIN loom_lora_rank AS integer;

DROP TRIGGER operations_metric_finish ON operations;
DROP TRIGGER operations_metric_insert ON operations;
DROP TRIGGER operations_sample_finished ON operations;
DROP TRIGGER cycles_metric_finish ON cycles;

ALTER TABLE operations DROP CONSTRAINT operations_state_check,
    DROP CONSTRAINT operations_kind_check,
    DROP CONSTRAINT operations_error_category_check,
    ALTER COLUMN state TYPE loom_op_state,
    ALTER COLUMN kind TYPE loom_op_kind,
    ALTER COLUMN error_category TYPE loom_error_category,
    ALTER COLUMN metrics DROP EXPRESSION;
ALTER TABLE cycles DROP CONSTRAINT cycles_state_check, ALTER COLUMN state TYPE loom_cycle_state;
ALTER TABLE executors DROP CONSTRAINT executors_state_check, ALTER COLUMN state TYPE loom_executor_state;
ALTER TABLE models DROP CONSTRAINT models_status_check,
    DROP CONSTRAINT models_lora_rank_check,
    ALTER COLUMN status TYPE loom_model_status,
    ALTER COLUMN lora_rank TYPE loom_lora_rank;

ALTER DOMAIN loom_op_state ADD CONSTRAINT loom_op_state_check
    CHECK (VALUE IN ('queued', 'claimed', 'done', 'failed', 'canceled'));
ALTER DOMAIN loom_op_kind ADD CONSTRAINT loom_op_kind_check
    CHECK (VALUE IN ('create_model', 'forward', 'forward_backward', 'optim_step', 'save_weights',
                     'save_weights_for_sampler', 'load_weights', 'unload_model', 'sample'));
ALTER DOMAIN loom_error_category ADD CONSTRAINT loom_error_category_check
    CHECK (VALUE IN ('user', 'server', 'unknown'));
ALTER DOMAIN loom_cycle_state ADD CONSTRAINT loom_cycle_state_check
    CHECK (VALUE IN ('assigned', 'running', 'done', 'failed', 'expired'));
ALTER DOMAIN loom_executor_state ADD CONSTRAINT loom_executor_state_check
    CHECK (VALUE IN ('idle', 'busy', 'gone'));
ALTER DOMAIN loom_model_status ADD CONSTRAINT loom_model_status_check
    CHECK (VALUE IN ('active', 'unloaded', 'failed', 'expired'));
ALTER DOMAIN loom_lora_rank ADD CONSTRAINT loom_lora_rank_check CHECK (VALUE BETWEEN 1 AND 512);

CREATE TRIGGER operations_metric_insert AFTER INSERT ON operations FOR EACH ROW
    WHEN (NEW.state IN ('done', 'failed', 'canceled')) EXECUTE FUNCTION metric_op_event();
CREATE TRIGGER operations_metric_finish AFTER UPDATE OF state ON operations FOR EACH ROW
    WHEN (NEW.state IN ('failed', 'canceled') AND OLD.state NOT IN ('done', 'failed', 'canceled'))
    EXECUTE FUNCTION metric_op_event();
CREATE TRIGGER operations_sample_finished AFTER UPDATE OF state ON operations FOR EACH ROW
    WHEN (NEW.kind = 'sample' AND NEW.sampling_session_id IS NOT NULL
          AND NEW.state IN ('done', 'failed', 'canceled') AND OLD.state NOT IN ('done', 'failed', 'canceled'))
    EXECUTE FUNCTION loom_sample_finished_notify();
CREATE TRIGGER cycles_metric_finish AFTER UPDATE OF state ON cycles FOR EACH ROW
    WHEN (NEW.state IN ('done', 'failed', 'expired') AND OLD.state NOT IN ('done', 'failed', 'expired'))
    EXECUTE FUNCTION metric_cycle_event();
