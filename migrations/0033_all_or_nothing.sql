-- 0033: a statement that must not take effect unless a condition holds ends its
-- transaction with an error of its own (SQLSTATE LM001, the message given), so that the
-- statements after it in the same round trip, its COMMIT included, do not run: the
-- executor's commit of a cycle sends its results, the cycle's end and the COMMIT together
-- (executor/exe_sql.h, SQL_EXE_FINISH_OPS_ALL), and a cycle the reaper took back must
-- commit nothing. Declared returning bigint so that it fits where a count is expected;
-- it never returns.
CREATE FUNCTION loom_refuse(msg text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'LM001', MESSAGE = msg;
END $$;
