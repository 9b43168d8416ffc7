-- 0039: an executor's commit notifies nobody inside its durable transaction.
--
-- PostgreSQL queues a transaction's notifications at its commit under one lock of the
-- whole database, taken before the commit's WAL flush and released after it, so every
-- notifying commit waited out the flush of the one before (common/common_sql.h,
-- SQL_NOTIFY_AFTER). An executor's cycle now wakes its futures after its commit, in a
-- transaction that does not wait for the disk (executor/exe_sql.h, SQL_EXE_NOTIFY_DONE),
-- the polls parked on a sampler's session included; its results' statement says so by
-- setting loom.samples_notified_after for its transaction, and this trigger, which still
-- wakes those polls for every other path that finishes a sample (the reaper, session
-- expiry, cancel_future, a withdrawn share), then leaves them to it.
CREATE OR REPLACE FUNCTION loom_sample_finished_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('loom.samples_notified_after', true) IS DISTINCT FROM 'on' THEN
        PERFORM pg_notify('loom_op_done', 'ss:' || md5(NEW.sampling_session_id));
    END IF;
    RETURN NULL;
END $$;
