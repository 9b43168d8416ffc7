/* common_sql.h: every SQL statement of common/ (connections, transactions, tenants and
 * keys, migrations, the embedded cluster), by name. Parameters are always bound. */
#pragma once

/* ---- db.c ------------------------------------------------------------------------------- */
/* Quiet NOTICEs (e.g. "relation already exists, skipping"). */
#define SQL_DB_QUIET "SET client_min_messages = warning"
#define SQL_BEGIN "BEGIN"
#define SQL_COMMIT "COMMIT"
#define SQL_ROLLBACK "ROLLBACK"
/* Notifying outside a durable commit. PostgreSQL queues a transaction's notifications at
 * its commit under one lock of the whole database (its PreCommit_Notify), taken
 * before the commit's WAL flush and released after it, so that notifying transactions
 * commit one at a time, each waiting out the flush of the one before: with a flush of
 * 2 ms (a network volume, a synchronous standby), 16 connections that insert a row each
 * commit 5,900 times a second, and 400 when each also notifies (pgbench on the 2-core
 * machine, the flush emulated by commit_delay). So a durable write that must wake
 * somebody commits without its notification, and the notification follows in a
 * transaction of its own that commits without waiting for the disk (its lock held for
 * microseconds): 4,700 a second. It follows only once the write is committed, so what it
 * announces is final; one lost between the two (the process or the server gone) costs
 * what any lost notification costs, the waiter's next poll.
 * SQL_COMMITS_UNWAITED: a condition (always true) that has its statement's transaction
 * commit without waiting for the disk, for a statement that runs alone in one.
 * $1 channel, $2 payload: such a notification. */
#define SQL_COMMITS_UNWAITED "set_config('synchronous_commit', 'off', true) IS NOT NULL"
#define SQL_NOTIFY_AFTER "SELECT pg_notify($1, $2) WHERE " SQL_COMMITS_UNWAITED
/* The notification a statement left in its session's setting DB_NOTIFY_LEFT (its channel, a
 * newline, its payload; '' for none: the statement computed it from what it read and
 * wrote, as its own pg_notify would have), sent as SQL_NOTIFY_AFTER sends one, and the
 * setting emptied in the same transaction, so that nothing is sent twice. */
#define DB_NOTIFY_LEFT "loom.notify"
#define SQL_NOTIFY_LEFT                                                                       \
    "SELECT pg_notify(split_part(w, E'\\n', 1), substr(w, strpos(w, E'\\n') + 1)),"             \
    " set_config('" DB_NOTIFY_LEFT "', '', false)"                                             \
    " FROM current_setting('" DB_NOTIFY_LEFT "', true) AS w"                                   \
    " WHERE w <> '' AND " SQL_COMMITS_UNWAITED

/* ---- keys.c ----------------------------------------------------------------------------- */
/* $1 name -> id of the tenant, created if needed; whether this statement created it */
#define SQL_TENANT_ENSURE                                                                     \
    "WITH ins AS (INSERT INTO tenants (name) VALUES ($1)"                                     \
    " ON CONFLICT (name) DO NOTHING RETURNING id)"                                             \
    " SELECT id, true FROM ins UNION ALL SELECT id, false FROM tenants WHERE name = $1"
/* $1 tenant, $2 prefix, $3 hash (bytea text), $4 name, $5 scopes (text[] literal or NULL:
 * all), $6 expiry or NULL -> id */
#define SQL_KEY_INSERT                                                                        \
    "INSERT INTO api_keys (tenant_id, prefix, hash, name, scopes, expires_at)"                \
    " VALUES ($1, $2, $3::bytea, $4,"                                                          \
    " COALESCE($5::text[], ARRAY['train','sample','read']), $6::timestamptz)"                 \
    " RETURNING id"
/* $1 tenant, $2 key prefix (the parameters of SQL_KEY_INSERT) */
#define SQL_KEY_AUDIT_CREATE                                                                  \
    "INSERT INTO audit_log (tenant_id, actor, action, object) VALUES ($1, 'cli', 'key.create', $2)"

/* ---- migrate.c -------------------------------------------------------------------------- */
#define SQL_MIGRATIONS_TABLE                                                                  \
    "CREATE TABLE IF NOT EXISTS schema_migrations ("                                          \
    " version integer PRIMARY KEY, name text NOT NULL,"                                       \
    " applied_at timestamptz NOT NULL DEFAULT now())"
#define SQL_MIGRATIONS_PROBE "SELECT 1 FROM schema_migrations LIMIT 1"
/* Transaction-scoped; the key is arbitrary and constant ("loom migrate"). */
#define SQL_MIGRATE_LOCK "SELECT pg_advisory_xact_lock(7340211)"
/* $1 version */
#define SQL_MIGRATION_DONE "SELECT 1 FROM schema_migrations WHERE version = $1"
/* $1 version, $2 name */
#define SQL_MIGRATION_RECORD "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)"
/* The planner's statistics, only ever of tables that hold rows: an empty table analyzed
 * is taken for empty (reltuples 0) until autovacuum analyzes it again, after 50 changed
 * rows and its next pass, whereas one never analyzed is assumed to be at least 10 pages.
 * A generic plan made in that window (the prepared statements of every process) reads
 * the growing table sequentially: the scheduler's ready-models statement took 70 ms
 * instead of 1 in loom_bench's tenants part while a fresh install's operations table
 * filled. */
/* -> after migrations: every table that holds rows (a migration that rewrote or added
 * rows or indexes left their statistics stale), quoted and comma-separated, or NULL */
#define SQL_MIGRATE_WITH_ROWS                                                                 \
    "SELECT string_agg(format('%I', c.relname), ', ') FROM pg_class c"                        \
    " WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'"                      \
    " AND pg_relation_size(c.oid) > 0"
/* -> at every other start: the tables that hold rows but have no column statistics (a
 * cluster restored from a dump: pg_dump carries none), as above, or NULL */
#define SQL_MIGRATE_UNANALYZED                                                                \
    SQL_MIGRATE_WITH_ROWS                                                                     \
    " AND NOT EXISTS (SELECT 1 FROM pg_stats s WHERE s.schemaname = 'public'"                 \
    " AND s.tablename = c.relname)"

/* ---- pgcluster.c ------------------------------------------------------------------------ */
#define SQL_PG_HAS_LOOM_DB "SELECT 1 FROM pg_database WHERE datname = 'loom'"
#define SQL_PG_CREATE_LOOM_DB "CREATE DATABASE loom"

/* Bitmap scans off for the rest of the transaction, for a statement that reads a range of a
 * live index (the queued or unreported operations of a tenant, a model, a sampling session,
 * or all of them). Each operation leaves dead row versions behind (queued, claimed) whose
 * index entries stay until a vacuum, which autovacuum runs on a large operations table only
 * every few hundred thousand changes. An index scan that steps on an entry whose row is
 * dead to everybody marks it, and no scan fetches that row again; a bitmap scan never marks
 * one, and PostgreSQL prefers one exactly when those entries have made the index large:
 * each run of the statement then fetched every row version that range held since the last
 * vacuum (test_bounded_queries, a churn of 6,000 operations: 850-950 buffers instead of
 * 30-150). SQL_NO_BITMAP_EXPR: the same as an expression (its value 'off'), for a statement
 * that runs before it in the transaction anyway. */
#define SQL_NO_BITMAP_EXPR "set_config('enable_bitmapscan', 'off', true)"
#define SQL_NO_BITMAP "SELECT " SQL_NO_BITMAP_EXPR

/* The current version of the operation whose `key` (id or request_id) equals `value`, as
 * its ctid `t`: for an UPDATE that joins it as `o.ctid = t` (a TID scan). Looked up alone
 * (OFFSET 0), not through whichever index of live operations PostgreSQL would otherwise
 * join, whose dead entries a bitmap scan reads on every run. A version another transaction
 * updated after the statement's snapshot no longer has that ctid and is skipped: each user
 * says why every such writer's change would be refused anyway. */
#define SQL_OP_VERSION(key, value) "(SELECT ctid AS t FROM operations WHERE " key " = " value " OFFSET 0)"
