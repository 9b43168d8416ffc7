/* api_futures_sql.h: the statements of the per-sampling-session futures routes
 * (api_session_futures.c: retrieve_futures, cancel_future, join_sampling_session;
 * docs/protocol.md §4.4–§4.6, migration 0022). Parameters are always bound. */
#pragma once
#include "common/common_sql.h"
#include "contract/contract.h"

/* The samples of one client of a sampling session: seq_id in [$2, $3), and, for client 0,
 * samples submitted without a seq_id. A CASE, not an OR: with the OR a custom plan for
 * client 0 read the session's unreported samples as two ranges of the index in a bitmap
 * scan, which never marks the entries of dead row versions, and so fetched every sample the
 * session finished since the table's last vacuum on every poll (test_bounded_queries, a
 * churn of 6,000 operations: 874 buffers instead of 145). */
#define SQL_SSF_CLIENT_SAMPLES(o)                                                           \
    "CASE WHEN " o ".seq_id IS NULL THEN $2 = 0 ELSE " o ".seq_id >= $2 AND " o ".seq_id < $3 END"

/* $1 sampling session, $2 tenant -> the park key of its polls ('ss:' || md5(id), the
 * payload of the NOTIFY its finished samples send: migration 0022) and the numbers given so
 * far; takes the session row's lock, which orders the numbering of its completions. It also
 * turns bitmap scans off for the rest of the poll's transaction (SQL_NO_BITMAP_EXPR,
 * common_sql.h): SQL_SSF_POLL's custom plans read a long-lived session's unreported samples
 * in one, and fetched each sample the session finished since the table's last vacuum again
 * on every poll (test_bounded_queries, a churn of 6,000 operations: 874 buffers instead of
 * 145). */
#define SQL_SSF_LOCK                                                                        \
    "SELECT 'ss:' || md5(id), completions_reported, " SQL_NO_BITMAP_EXPR                  \
    " FROM sampling_sessions WHERE id = $1 AND tenant_id = $2 FOR NO KEY UPDATE"
/* $1 sampling session (locked by SQL_SSF_LOCK, which checked the tenant), $2 lo, $3 hi,
 * $4 prev_cursor, $5 limit -> report_seq, request_id, state, result bytes of the client's
 * finished samples after the cursor, oldest number first. Finished samples the session's
 * polls have not numbered yet get the next numbers first (in the order they finished);
 * the first branch of the UNION reads the rows as they were before this statement, the
 * second the ones it numbers. */
#define SQL_SSF_POLL                                                                        \
    "WITH n AS (SELECT o.id, row_number() OVER (ORDER BY o.finished_at, o.id) AS rn"        \
    "   FROM operations o WHERE o.sampling_session_id = $1 AND o.kind = '" OP_SAMPLE "'"   \
    "   AND o.report_seq IS NULL AND o.state IN ('done', 'failed', 'canceled')"             \
    "   AND " SQL_SSF_CLIENT_SAMPLES("o") "),"                                                \
    " base AS (SELECT completions_reported AS b FROM sampling_sessions WHERE id = $1),"     \
    " u AS (UPDATE operations o SET report_seq = base.b + n.rn FROM n, base WHERE o.id = n.id" \
    "   RETURNING o.report_seq, o.request_id, o.state, octet_length(o.result::text) AS bytes)," \
    " c AS (UPDATE sampling_sessions SET completions_reported = completions_reported"       \
    "   + (SELECT count(*) FROM n) WHERE id = $1 AND EXISTS (SELECT 1 FROM n) RETURNING 1)" \
    " SELECT report_seq, request_id, state, COALESCE(bytes, 0) FROM ("                      \
    "  SELECT o.report_seq, o.request_id, o.state, octet_length(o.result::text) AS bytes"  \
    "  FROM operations o WHERE o.sampling_session_id = $1 AND o.report_seq > $4"            \
    "  AND " SQL_SSF_CLIENT_SAMPLES("o")                                                    \
    "  UNION ALL SELECT * FROM u) x ORDER BY report_seq LIMIT $5"

/* $1 request_id, $2 tenant -> kind, state before, canceled now (0/1), notified (0/1). A
 * queued sample is canceled (it never runs) and its waiters woken; a claimed one's
 * executor is told (a streamed sample ends at its next token; others finish). */
#define SQL_SSF_CANCEL                                                                      \
    "WITH o AS (SELECT id, kind, state FROM operations WHERE request_id = $1 AND tenant_id = $2)," \
    " c AS (UPDATE operations x SET state = 'canceled', finished_at = now(), error_category = 'user'," \
    "   error = 'canceled by the client (cancel_future) before it ran' FROM o"              \
    "   WHERE x.id = o.id AND o.kind = '" OP_SAMPLE "' AND x.state = 'queued' RETURNING x.request_id)," \
    " w AS (SELECT pg_notify('" CHAN_OP_DONE "', request_id) FROM c),"                       \
    " k AS (SELECT pg_notify('" CHAN_SAMPLE_CANCEL "', $1) FROM o"                           \
    "   WHERE o.kind = '" OP_SAMPLE "' AND o.state = 'claimed')"                             \
    " SELECT o.kind, o.state, (SELECT count(*) FROM c), (SELECT count(*) FROM w) + (SELECT count(*) FROM k)" \
    " FROM o"

/* $1 sampling session, $2 tenant -> the next client number of the session (1, 2, ...)
 * when its session is live; no row otherwise. */
#define SQL_SSF_JOIN                                                                        \
    "UPDATE sampling_sessions s SET clients_joined = s.clients_joined + 1 FROM sessions ss" \
    " WHERE s.id = $1 AND s.tenant_id = $2 AND ss.id = s.session_id AND ss.expired_at IS NULL" \
    " AND s.clients_joined < 2147483647 RETURNING s.clients_joined"
/* $1 sampling session, $2 tenant -> whether its session expired, clients joined so far */
#define SQL_SSF_SAMPLER_STATE                                                               \
    "SELECT ss.expired_at IS NOT NULL, s.clients_joined FROM sampling_sessions s"           \
    " JOIN sessions ss ON ss.id = s.session_id WHERE s.id = $1 AND s.tenant_id = $2"
