-- 0036: a submit without foreign-key checks (docs/architecture.md, "Bounded by the work").
--
-- Every submit inserts its operation in one statement (SQL_OP_SUBMIT) that reads the
-- tenant's model, active, in its live session, in the same statement (the session held
-- FOR KEY SHARE): the foreign keys operations.tenant_id -> tenants and
-- operations.model_id -> models made PostgreSQL look both rows up again and lock them
-- FOR KEY SHARE, one SPI query each, about half of a lone submit's time (EXPLAIN ANALYZE
-- of the submit, warm: 0.11 and 0.10 ms of 0.4), and every concurrent submit of a tenant
-- locked that tenant's one row (a MultiXact per overlap). Nothing deletes a tenant, a
-- model or an operation, and nothing changes their ids (tenants are disabled, models
-- unloaded or expired, operations stay as history), so the keys guarded nothing the
-- submit does not, and their ON DELETE CASCADE ran for nothing; the columns stay as they
-- were, without the checks. (sampling_session_id keeps its key: a submit of a sample names
-- a session it does not read in the same statement.)
ALTER TABLE operations DROP CONSTRAINT operations_tenant_id_fkey;
ALTER TABLE operations DROP CONSTRAINT operations_model_id_fkey;
