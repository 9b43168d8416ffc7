/* api_openai_sql.h: the statements of the OpenAI-compatible routes (api_openai.c,
 * api_openai_stream.c; docs/protocol.md §18). Parameters are bound; tenant scoping as in
 * api_sql.h: what the tenant may not read is not found. */
#pragma once
#include "common/common_sql.h"
#include "contract/contract.h"
#include "registry/reg_sql.h"
#include "tinker/api_sql.h"   /* SQL_EXECUTOR_LIVE */

/* $1 base model, $2 executor timeout seconds -> max_context, vocab_size, whether a live
 * executor serves it */
#define SQL_OAI_BASE_MODEL                                                                  \
    "SELECT b.max_context, b.vocab_size, EXISTS (SELECT 1 FROM executors e"                 \
    " WHERE e.base_model = b.name AND " SQL_EXECUTOR_LIVE("e", "$2") ")"                    \
    " FROM base_models b WHERE b.name = $1"
/* $1 alias, $2 tenant -> tinker path */
#define SQL_OAI_ALIAS_GET "SELECT tinker_path FROM adapter_aliases WHERE alias = $1 AND tenant_id = $2"

/* GET /v1/models, $1 tenant: base models, then the sampler checkpoints the tenant may
 * read among its own and the published ones (newest first, at most 1000), then its
 * aliases; one JSON list of OpenAI model objects. */
#define SQL_OAI_MODELS                                                                      \
    "SELECT COALESCE(json_agg(json_build_object('id', m.id, 'object', 'model', 'created',"  \
    " m.created, 'owned_by', m.owned_by, 'root', m.root, 'parent', m.parent,"               \
    " 'max_model_len', m.max_model_len) ORDER BY m.k, m.created DESC), '[]')::text FROM ("  \
    " SELECT 0 AS k, b.name AS id,"                                                         \
    "  extract(epoch FROM b.created_at)::bigint AS created, 'loom' AS owned_by,"            \
    "  b.name AS root, NULL::text AS parent, b.max_context AS max_model_len FROM base_models b" \
    " UNION ALL (SELECT 1, v.tinker_path, extract(epoch FROM v.created_at)::bigint,"        \
    "  CASE WHEN a.tenant_id = $1 THEN t.name ELSE 'public' END, v.tinker_path,"           \
    "  v.base_model, b.max_context" REG_FROM                                                \
    "  JOIN tenants t ON t.id = a.tenant_id JOIN base_models b ON b.name = v.base_model"    \
    "  WHERE v.kind = 'sampler' AND " REG_LIVE                                              \
    "  AND (a.tenant_id = $1 OR v.visibility = 'public')"                                   \
    "  ORDER BY v.id DESC LIMIT 1000)"                                                      \
    " UNION ALL SELECT 2, l.alias, extract(epoch FROM l.created_at)::bigint,"               \
    "  t.name, l.tinker_path, v.base_model, b.max_context FROM adapter_aliases l"           \
    "  JOIN tenants t ON t.id = l.tenant_id"                                                \
    "  JOIN adapter_versions v ON v.tinker_path = l.tinker_path AND " REG_LIVE              \
    "  JOIN base_models b ON b.name = v.base_model WHERE l.tenant_id = $1) m"

/* The request's bound and sampler, in the submit's transaction. $1 tenant. */
#define SQL_OAI_TENANT_LOCK "SELECT pg_advisory_xact_lock(hashtext('loom_openai:' || $1))"
/* $1 tenant, $2 limit -> min(OpenAI requests in flight, limit) */
#define SQL_OAI_LIVE                                                                        \
    "SELECT count(*) FROM (SELECT 1 FROM operations WHERE tenant_id = $1 AND kind = '"     \
    OP_SAMPLE "' AND state IN ('queued', 'claimed') AND payload ? 'progress' LIMIT $2) q"
/* $1 tenant, $2 base model, $3 model path, $4 version id -> sampling session id */
#define SQL_OAI_SAMPLER "SELECT loom_openai_sampler($1, $2, $3, $4::bigint)"

/* ---- the loop's own looks (api_openai_stream.c) ---------------------------------------- */
/* $1 request_id, $2 tenant -> {state, result, error, category} */
#define SQL_OAI_FETCH                                                                       \
    "SELECT json_build_object('state', state, 'result', result, 'error', error,"            \
    " 'category', error_category)::text FROM operations WHERE request_id = $1 AND tenant_id = $2"
/* $1 request_id, $2 tenant: a request whose client went away. Queued: canceled at once;
 * claimed: the executor decoding it is told (it ends its samples at the next token). The
 * row is looked up by its request_id and the version found updated: the generic plan went
 * through the tenant's entries of operations_live instead (test_bounded_queries, a churn of
 * 6,000 operations: up to 1,020 buffers instead of 47). A version another transaction
 * updated after this statement's snapshot is skipped: it is no longer queued (claimed: the
 * executor is told, as for any claimed request; finished: nothing to cancel). */
#define SQL_OAI_CANCEL                                                                      \
    "WITH c AS (UPDATE operations SET state = 'canceled', finished_at = now(),"             \
    " error = 'the client closed the connection', error_category = 'user'"                  \
    " FROM " SQL_OP_VERSION("request_id", "$1") " r"                                        \
    " WHERE operations.ctid = r.t AND tenant_id = $2 AND state = 'queued' RETURNING 1)"      \
    " SELECT pg_notify('" CHAN_SAMPLE_CANCEL "', $1) WHERE NOT EXISTS (SELECT 1 FROM c)"

/* ---- aliases (PUT/DELETE/GET /api/v1/aliases) -------------------------------------------- */
/* $1 tinker path, $2 tenant -> 1 when the tenant owns that live checkpoint */
#define SQL_OAI_OWNED_CHECKPOINT                                                            \
    "SELECT 1" REG_FROM " WHERE v.tinker_path = $1 AND a.tenant_id = $2 AND " REG_LIVE
/* $1 tenant -> {"aliases": [{alias, model_path, created_at}]} */
#define SQL_OAI_ALIASES                                                                     \
    "SELECT json_build_object('aliases', COALESCE(json_agg(json_build_object('alias', alias," \
    " 'model_path', tinker_path, 'created_at', to_char(created_at AT TIME ZONE 'UTC',"      \
    " 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')) ORDER BY alias), '[]'))::text"                   \
    " FROM adapter_aliases WHERE tenant_id = $1"
