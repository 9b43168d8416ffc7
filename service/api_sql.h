/* api_sql.h: every SQL statement the api process runs, by name. Parameters are always
 * bound ($n), never spliced. Tenant scoping lives here: a row of another tenant is
 * simply not found. */
#pragma once

/* ---- API keys ---------------------------------------------------------------------- */
/* $1 prefix -> id, tenant_id, hash (hex), revoked, expired, touch_due */
#define SQL_KEY_LOOKUP                                                                      \
    "SELECT id, tenant_id, encode(hash, 'hex'), revoked_at IS NOT NULL,"                    \
    " expires_at IS NOT NULL AND expires_at <= now(),"                                      \
    " last_used_at IS NULL OR last_used_at < now() - interval '1 minute'"                   \
    " FROM api_keys WHERE prefix = $1"
/* $1 key id. At most once a minute per key, also across api processes. */
#define SQL_KEY_TOUCH                                                                       \
    "UPDATE api_keys SET last_used_at = now() WHERE id = $1"                                \
    " AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')"

/* ---- base models -------------------------------------------------------------------- */
#define SQL_BASE_MODELS_LIST "SELECT name, max_context FROM base_models ORDER BY name"
/* $1 name -> max_context, vocab_size */
#define SQL_BASE_MODEL_GET "SELECT max_context, vocab_size FROM base_models WHERE name = $1"
#define SQL_BASE_MODEL_NAMES                                                                \
    "SELECT COALESCE(string_agg(name, ', ' ORDER BY name), '') FROM base_models"

/* ---- sessions ----------------------------------------------------------------------- */
/* $1 id, $2 tenant, $3 tags (JSON array of strings), $4 user_metadata (JSON or NULL),
 * $5 sdk_version, $6 project_id */
#define SQL_SESSION_CREATE                                                                  \
    "INSERT INTO sessions (id, tenant_id, tags, user_metadata, sdk_version, project_id)"    \
    " VALUES ($1, $2, ARRAY(SELECT jsonb_array_elements_text($3::jsonb)), $4::jsonb, $5, $6)"
/* $1 id, $2 tenant */
#define SQL_SESSION_HEARTBEAT                                                               \
    "UPDATE sessions SET last_heartbeat_at = now() WHERE id = $1 AND tenant_id = $2"
#define SQL_SESSION_LOCK "SELECT 1 FROM sessions WHERE id = $1 AND tenant_id = $2 FOR UPDATE"
/* $1 session -> next free model_seq_id */
#define SQL_SESSION_NEXT_MODEL_SEQ                                                          \
    "SELECT COALESCE(max(model_seq_id) + 1, 0) FROM models WHERE session_id = $1"

/* ---- models --------------------------------------------------------------------------- */
/* $1 id .. $11 user_metadata; no row back when (session_id, model_seq_id) exists */
#define SQL_MODEL_INSERT                                                                    \
    "INSERT INTO models (id, tenant_id, session_id, model_seq_id, base_model, lora_rank,"   \
    " lora_seed, train_attn, train_mlp, train_unembed, user_metadata)"                      \
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb)"                         \
    " ON CONFLICT DO NOTHING RETURNING id"
/* $1 model, $2 tenant -> status, vocab_size, max_context */
#define SQL_MODEL_FOR_OP                                                                    \
    "SELECT m.status, b.vocab_size, b.max_context FROM models m"                            \
    " JOIN base_models b ON b.name = m.base_model WHERE m.id = $1 AND m.tenant_id = $2"
/* $1 model, $2 tenant -> id, lora_rank, base_model, arch, tokenizer_id */
#define SQL_MODEL_INFO                                                                      \
    "SELECT m.id, m.lora_rank, m.base_model, b.arch,"                                       \
    " COALESCE(b.config->>'tokenizer_id', b.name) FROM models m"                            \
    " JOIN base_models b ON b.name = m.base_model WHERE m.id = $1 AND m.tenant_id = $2"
#define SQL_MODEL_LOCK "SELECT 1 FROM models WHERE id = $1 FOR UPDATE"
#define SQL_MODEL_NEXT_SEQ                                                                  \
    "SELECT COALESCE(max(seq_id), 0) + 1 FROM operations WHERE model_id = $1"

/* ---- operations (queue + futures) ---------------------------------------------------- */
/* $1 request_id, $2 tenant, $3 model, $4 seq_id, $5 kind, $6 payload, $7 n_tokens */
#define SQL_OP_INSERT                                                                       \
    "INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, n_tokens)" \
    " VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7)"                                           \
    " ON CONFLICT (model_id, seq_id) DO NOTHING RETURNING request_id"
/* $1 model, $2 seq_id -> request_id, kind */
#define SQL_OP_EXISTING "SELECT request_id, kind FROM operations WHERE model_id = $1 AND seq_id = $2"
#define SQL_OP_NOTIFY_QUEUED "NOTIFY loom_op_queued"
/* $1 request_id, $2 tenant -> state, result text, error, error_category */
#define SQL_FUTURE_GET                                                                      \
    "SELECT state, result::text, error, error_category FROM operations"                     \
    " WHERE request_id = $1 AND tenant_id = $2"

#define API_CHANNEL_OP_DONE "loom_op_done"
