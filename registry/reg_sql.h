/* reg_sql.h: every SQL statement of the registry, by name. Parameters are always bound. */
#pragma once
#include "contract/contract.h"
#include "contract/fb_payload.h"

/* A version is live while it is neither deleted nor past its TTL. */
#define REG_LIVE "v.deleted_at IS NULL AND (v.expires_at IS NULL OR v.expires_at > now())"
/* $2 = the reading tenant */
#define REG_READABLE                                                                          \
    "(a.tenant_id = $2 OR v.visibility = 'public' OR EXISTS (SELECT 1 FROM adapter_grants g"  \
    " WHERE g.adapter_id = a.id AND g.tenant_id = $2))"

/* Columns read into a reg_version (registry.c: version_of_row), in this order. */
#define REG_VERSION_COLS                                                                      \
    "v.id, v.adapter_id, a.tenant_id, v.tinker_path, v.kind, v.base_model, v.blob_digest,"    \
    " v.size_bytes, v.step, COALESCE((v.lora_config->>'rank')::int, 0),"                      \
    " COALESCE((v.lora_config->>'train_attn')::boolean, true),"                               \
    " COALESCE((v.lora_config->>'train_mlp')::boolean, true),"                                \
    " COALESCE((v.lora_config->>'train_unembed')::boolean, true),"                            \
    " v.visibility = 'public',"                                                               \
    " to_char(v.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"         \
    " COALESCE(to_char(v.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), ''),"\
    " extract(epoch FROM v.created_at)::bigint, COALESCE(v.user_metadata::text, '')"
/* How many columns REG_VERSION_COLS has (a listing's total count follows them). */
#define REG_VERSION_NCOLS 18
#define REG_FROM " FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id"

/* $1 path, $2 tenant */
#define SQL_REG_FIND_READABLE                                                                 \
    "SELECT " REG_VERSION_COLS REG_FROM " WHERE v.tinker_path = $1 AND " REG_LIVE " AND " REG_READABLE
/* $1 path */
#define SQL_REG_FIND_LIVE "SELECT " REG_VERSION_COLS REG_FROM " WHERE v.tinker_path = $1 AND " REG_LIVE

/* ---- saving a version (inside the executor's commit transaction) ----------------------- */
/* $1 model -> tenant_id */
#define SQL_REG_MODEL_TENANT "SELECT tenant_id FROM models WHERE id = $1"
/* $1 tenant, $2 model id (= adapter name) -> adapter id */
#define SQL_REG_ADAPTER_UPSERT                                                                \
    "INSERT INTO adapters (tenant_id, model_id, name) VALUES ($1, $2, $2)"                    \
    " ON CONFLICT (tenant_id, name) DO UPDATE SET model_id = EXCLUDED.model_id RETURNING id"
/* $1 path -> id, expired */
#define SQL_REG_PATH_LIVE_ROW                                                                 \
    "SELECT id, expires_at IS NOT NULL AND expires_at <= now() FROM adapter_versions"         \
    " WHERE tinker_path = $1 AND deleted_at IS NULL FOR UPDATE"
/* $1 id */
#define SQL_REG_MARK_DELETED "UPDATE adapter_versions SET deleted_at = now() WHERE id = $1"
/* $1 adapter -> id, seq_id of its newest version */
#define SQL_REG_LAST_VERSION                                                                  \
    "SELECT id, COALESCE(seq_id, 0) FROM adapter_versions WHERE adapter_id = $1"              \
    " ORDER BY id DESC LIMIT 1"
/* $1 model, $2 seq -> seq_id, version_id of the newest completed load_weights before seq */
#define SQL_REG_LAST_LOAD                                                                     \
    "SELECT seq_id, COALESCE(payload->>'version_id', '') FROM operations"                     \
    " WHERE model_id = $1 AND kind = '" OP_LOAD_WEIGHTS "' AND state = 'done' AND seq_id < $2"       \
    " ORDER BY seq_id DESC LIMIT 1"
/* $1 model, $2 seq_from, $3 save seq, $4 adapter, $5 kind, $6 name, $7 path, $8 step,
 * $9 parent id or NULL, $10 digest, $11 size, $12 key id or NULL, $13 ttl seconds (< 0
 * never) -> id. Provenance: the completed operations in [seq_from, save seq); its
 * data_digest hashes their packed datums (contract/fb_payload.h: payload_bin from
 * FB_PAYLOAD_DATA_AT, the data without the loss), in seq order, joined by a newline. The
 * user_metadata is the save operation's (the api checked it: string values, bounded). */
#define SQL_REG_VERSION_INSERT                                                                \
    "WITH ops AS (SELECT kind, seq_id, n_tokens, payload, payload_bin, result FROM operations" \
    "  WHERE model_id = $1 AND seq_id >= $2 AND seq_id < $3 AND state = 'done'),"            \
    " fb AS (SELECT * FROM ops WHERE kind = '" OP_FORWARD_BACKWARD "'),"                             \
    " agg AS (SELECT"                                                                          \
    "  (SELECT count(*) FROM fb) AS n_fb,"                                                    \
    "  (SELECT COALESCE(sum(n_tokens), 0) FROM fb) AS tokens,"                                \
    "  (SELECT count(*) FROM ops WHERE kind = '" OP_OPTIM_STEP "') AS n_steps,"                      \
    "  (SELECT count(*) FROM ops WHERE kind = '" OP_FORWARD "') AS n_fwd,"                           \
    "  (SELECT COALESCE(jsonb_agg(DISTINCT payload->'adam_params'), '[]') FROM ops"           \
    "    WHERE kind = '" OP_OPTIM_STEP "') AS hp,"                                                    \
    "  (SELECT COALESCE(jsonb_agg(DISTINCT payload->>'loss_fn'), '[]') FROM fb) AS loss_fns," \
    "  (SELECT jsonb_build_object('sum', sum(l), 'first', (array_agg(l ORDER BY seq_id))[1],"  \
    "     'last', (array_agg(l ORDER BY seq_id DESC))[1], 'min', min(l), 'max', max(l))"       \
    "   FROM (SELECT seq_id, (result->'metrics'->>'loss:sum')::float8 AS l FROM fb) x) AS loss,"\
    "  (SELECT encode(sha256(COALESCE(string_agg(substring(payload_bin FROM "               \
    FB_PAYLOAD_DATA_AT_S " + 1), '\\x0a'::bytea ORDER BY seq_id), ''::bytea)), 'hex')"       \
    "   FROM fb) AS data_digest)"                                                             \
    " INSERT INTO adapter_versions (adapter_id, kind, name, tinker_path, step, parent_id,"     \
    "  base_model, lora_config, blob_digest, size_bytes, provenance, created_by_key,"          \
    "  expires_at, seq_id, user_metadata)"                                                     \
    " SELECT $4, $5, $6, $7, $8, $9::bigint, m.base_model,"                                    \
    "  jsonb_build_object('rank', m.lora_rank, 'seed', m.lora_seed, 'lora_alpha', 32,"        \
    "   'train_attn', m.train_attn, 'train_mlp', m.train_mlp, 'train_unembed', m.train_unembed),"\
    "  $10, $11,"                                                                              \
    "  jsonb_build_object('model_id', $1::text, 'seq_from', $2::int, 'seq_to', $3::int - 1,"  \
    "   'save_seq', $3::int, 'parent_id', $9::bigint, 'forward_backward_ops', agg.n_fb,"       \
    "   'forward_ops', agg.n_fwd, 'tokens', agg.tokens, 'optim_steps', agg.n_steps,"           \
    "   'hyperparameters', agg.hp, 'loss_fns', agg.loss_fns, 'loss', agg.loss,"                \
    "   'data_digest', agg.data_digest, 'created_by_key',"                                     \
    "   (SELECT 'tml-' || k.prefix || '...' FROM api_keys k WHERE k.id = $12::bigint)),"       \
    "  $12::bigint,"                                                                           \
    "  CASE WHEN $13::bigint < 0 THEN NULL ELSE now() + make_interval(secs => $13::float8) END,"\
    "  $3::int, (SELECT NULLIF(o.payload->'user_metadata', 'null') FROM operations o"         \
    "   WHERE o.model_id = $1 AND o.seq_id = $3::int)"                                         \
    " FROM models m, agg WHERE m.id = $1 RETURNING id"

/* ---- imports and copies (cli/adapter.c, tinker/api_upload.c, tinker/api_weights_ext.c) --- */
/* $1 tenant, $2 run name -> adapter id (the tenant's run, created when absent) */
/* $1 tenant, $2 run name -> the tenant's adapter of that name (made when new); no row when
 * the name is another tenant's run (a tinker://RUN/... path names one run for everyone).
 * SQL_REG_RUN_LOCK first: the transaction's advisory lock on the name makes two tenants'
 * imports of one new name take turns. */
#define SQL_REG_RUN_LOCK "SELECT pg_advisory_xact_lock(7340214, hashtext($1))"
#define SQL_REG_RUN_ADAPTER                                                                   \
    "INSERT INTO adapters (tenant_id, name) SELECT $1, $2"                                     \
    " WHERE NOT EXISTS (SELECT 1 FROM adapters WHERE name = $2 AND tenant_id <> $1)"           \
    " AND NOT EXISTS (SELECT 1 FROM models WHERE id = $2 AND tenant_id <> $1)"                 \
    " ON CONFLICT (tenant_id, name) DO UPDATE SET name = EXCLUDED.name RETURNING id"
/* $1 adapter, $2 name, $3 path, $4 base model, $5 rank, $6..$8 train_attn, train_mlp,
 * train_unembed, $9 digest, $10 size, $11 source, $12 its adapter_config.json (JSON text),
 * $13 creating key or NULL -> id; 23505 when a live version holds the path */
#define SQL_REG_IMPORT_VERSION                                                                \
    "INSERT INTO adapter_versions (adapter_id, kind, name, tinker_path, step, base_model, lora_config," \
    " blob_digest, size_bytes, provenance, created_by_key) VALUES ($1, 'sampler', $2, $3, 0, $4,"  \
    " jsonb_build_object('rank', $5::int, 'lora_alpha', 32, 'train_attn', $6::boolean,"       \
    "  'train_mlp', $7::boolean, 'train_unembed', $8::boolean), $9, $10,"                      \
    " jsonb_build_object('imported_from', $11::text, 'source_config', $12::jsonb), $13::bigint) RETURNING id"
/* $1 adapter, $2 path, $3 source version, $4 creating key or NULL, $5 ttl seconds (< 0:
 * never) -> id of the copy: the source's kind, name, step, base model, LoRA config, blob
 * and size; its parent is the source (lineage), and its provenance says where it came
 * from (not the source's own provenance, which is another tenant's business). */
#define SQL_REG_COPY_VERSION                                                                  \
    "INSERT INTO adapter_versions (adapter_id, kind, name, tinker_path, step, parent_id, base_model,"  \
    " lora_config, blob_digest, size_bytes, provenance, created_by_key, expires_at)"          \
    " SELECT $1, v.kind, v.name, $2, v.step, v.id, v.base_model, v.lora_config, v.blob_digest," \
    "  v.size_bytes, jsonb_build_object('copied_from', v.tinker_path, 'source_version_id', v.id," \
    "  'source_tenant_id', a.tenant_id), $4::bigint,"                                          \
    "  CASE WHEN $5::bigint < 0 THEN NULL ELSE now() + make_interval(secs => $5::float8) END"  \
    " FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id WHERE v.id = $3::bigint" \
    " AND " REG_LIVE " RETURNING id"
/* $1 path -> parent id, digest of the live version at path (a copy's retry finds itself) */
#define SQL_REG_PATH_PARENT                                                                   \
    "SELECT COALESCE(parent_id, 0), blob_digest FROM adapter_versions"                        \
    " WHERE tinker_path = $1 AND deleted_at IS NULL AND (expires_at IS NULL OR expires_at > now())"

/* ---- locks ------------------------------------------------------------------------------- */
/* Class 0x4c6f6f6d ("Loom"), object = the digest's first 32 bits. */
#define SQL_REG_BLOB_LOCK_SHARED                                                              \
    "SELECT pg_advisory_xact_lock_shared(1282371437, ('x' || substr($1, 1, 8))::bit(32)::int)"
#define SQL_REG_BLOB_LOCK                                                                     \
    "SELECT pg_advisory_xact_lock(1282371437, ('x' || substr($1, 1, 8))::bit(32)::int)"

/* ---- GC ---------------------------------------------------------------------------------- */
/* -> id, tenant, path of live versions past their TTL; $1 run or NULL */
#define SQL_REG_GC_EXPIRE                                                                     \
    "UPDATE adapter_versions v SET deleted_at = now() FROM adapters a"                        \
    " WHERE a.id = v.adapter_id AND v.deleted_at IS NULL AND v.expires_at <= now()"           \
    " AND ($1::text IS NULL OR a.name = $1) RETURNING v.id, a.tenant_id, v.tinker_path"
/* $1 run or NULL -> how many live versions are past their TTL (dry run) */
#define SQL_REG_GC_EXPIRE_COUNT                                                               \
    "SELECT count(*) FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id"          \
    " WHERE v.deleted_at IS NULL AND v.expires_at <= now() AND ($1::text IS NULL OR a.name = $1)"
/* $1 version id, $2 'public' | 'private' */
#define SQL_REG_SET_VISIBILITY "UPDATE adapter_versions SET visibility = $2 WHERE id = $1::bigint"
/* $1 adapter id. Sample operations still queued in other tenants' sampling sessions on a
 * version of this adapter that they may no longer read (unpublished, share revoked) fail:
 * access ends for work not yet started too. */
#define SQL_REG_FAIL_UNREADABLE_SAMPLES                                                       \
    "WITH f AS (UPDATE operations o SET state = 'failed', finished_at = now(),"               \
    " error_category = 'user', error = 'access to checkpoint ' || v.tinker_path ||"           \
    " ' was withdrawn (unpublished or unshared) before this sample ran'"                      \
    " FROM sampling_sessions s JOIN adapter_versions v ON v.id = s.adapter_version_id"        \
    " JOIN adapters a ON a.id = v.adapter_id"                                                 \
    " WHERE o.sampling_session_id = s.id AND o.state = 'queued' AND a.id = $1::bigint"        \
    " AND s.tenant_id <> a.tenant_id AND v.visibility <> 'public' AND NOT EXISTS (SELECT 1"   \
    "  FROM adapter_grants g WHERE g.adapter_id = a.id AND g.tenant_id = s.tenant_id)"        \
    " RETURNING o.request_id)"                                                                \
    " SELECT pg_notify('" CHAN_OP_DONE "', request_id) FROM f"
/* $1 keep, $2 run or NULL -> live versions beyond the newest $1 per adapter and kind */
#define SQL_REG_GC_PRUNE_LIST                                                                 \
    "SELECT id, tenant_id, tinker_path FROM (SELECT v.id, a.tenant_id, v.tinker_path,"        \
    "  row_number() OVER (PARTITION BY v.adapter_id, v.kind ORDER BY v.created_at DESC, v.id DESC) AS rn" \
    "  FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id"                        \
    "  WHERE " REG_LIVE " AND ($2::text IS NULL OR a.name = $2)) x WHERE rn > $1::int ORDER BY id"
/* -> distinct digests of dead versions whose blob was not removed yet */
#define SQL_REG_GC_CANDIDATES                                                                 \
    "SELECT DISTINCT v.blob_digest FROM adapter_versions v"                                   \
    " WHERE v.blob_removed_at IS NULL AND NOT (" REG_LIVE ") ORDER BY 1"
/* $1 digest -> live versions using it, models' snapshots (durable training state) and
 * sampler snapshots handed over by draining executors */
#define SQL_REG_GC_LIVE_REFS                                                                  \
    "SELECT (SELECT count(*) FROM adapter_versions v WHERE v.blob_digest = $1 AND " REG_LIVE ")" \
    " + (SELECT count(*) FROM model_snapshots s WHERE s.blob_digest = $1)"                    \
    " + (SELECT count(*) FROM sampling_sessions s WHERE s.snapshot_digest = $1)"
/* $1 digest -> total size of the dead versions' blob (one blob, same size) */
#define SQL_REG_GC_MARK_REMOVED                                                               \
    "UPDATE adapter_versions v SET blob_removed_at = now() WHERE v.blob_digest = $1"          \
    " AND v.blob_removed_at IS NULL AND NOT (" REG_LIVE ") RETURNING v.size_bytes"
/* $1 text[] of digests -> the ones no version row still counts on (no row whose blob was
 * not collected yet) and no model's or sampler's snapshot names: orphans of failed saves,
 * crashes between put and commit, blobs stored again after GC took them, and snapshots
 * replaced by newer ones or let go of; their 1-based positions in $1 */
#define SQL_REG_GC_ORPHANS                                                                    \
    "SELECT u.i FROM unnest($1::text[]) WITH ORDINALITY AS u(d, i) WHERE NOT EXISTS"          \
    " (SELECT 1 FROM adapter_versions v WHERE v.blob_digest = u.d AND v.blob_removed_at IS NULL)" \
    " AND NOT EXISTS (SELECT 1 FROM model_snapshots s WHERE s.blob_digest = u.d)"             \
    " AND NOT EXISTS (SELECT 1 FROM sampling_sessions s WHERE s.snapshot_digest = u.d)"

/* Adapter uploads (migration 0022) not finished before they expired, or finished: their
 * staged files go (names: upload-<id>-<file index>, tinker/api_upload.c). An unfinished
 * one is deleted after its files; a finished one stays (its files are removed at finish,
 * this only repeats it). -> id of each expired unfinished upload, deleted */
#define SQL_REG_GC_EXPIRED_UPLOADS                                                            \
    "DELETE FROM weight_uploads WHERE finished_at IS NULL AND expires_at <= now() RETURNING id"
#define SQL_REG_GC_EXPIRED_UPLOADS_COUNT                                                      \
    "SELECT count(*) FROM weight_uploads WHERE finished_at IS NULL AND expires_at <= now()"

/* ---- audit ------------------------------------------------------------------------------- */
/* $1 tenant or NULL, $2 actor, $3 action, $4 object, $5 details (JSON or NULL) */
#define SQL_REG_AUDIT                                                                         \
    "INSERT INTO audit_log (tenant_id, actor, action, object, details)"                       \
    " VALUES ($1::bigint, $2, $3, $4, COALESCE($5::jsonb, '{}'))"
/* $1 tenant or NULL, $2 key id, $3 action, $4 object, $5 details (JSON or NULL): an
 * audit row with the calling key as actor ('key:<prefix>'). */
#define SQL_REG_AUDIT_BY_KEY                                                                  \
    "INSERT INTO audit_log (tenant_id, actor, action, object, details)"                       \
    " VALUES ($1::bigint, COALESCE((SELECT 'key:' || prefix FROM api_keys"                    \
    " WHERE id = $2::bigint), 'api'), $3, $4, COALESCE($5::jsonb, '{}'))"

/* ---- an owner's changes (reg_edit.c) ------------------------------------------------------ */
/* $1 version, $2 ttl seconds (< 0: never expires) */
#define SQL_REG_SET_TTL                                                                       \
    "UPDATE adapter_versions SET expires_at = CASE WHEN $2::bigint < 0 THEN NULL"             \
    " ELSE now() + make_interval(secs => $2::float8) END WHERE id = $1::bigint"
/* $1 adapter, $2 tenant */
#define SQL_REG_GRANT                                                                         \
    "INSERT INTO adapter_grants (adapter_id, tenant_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
#define SQL_REG_REVOKE "DELETE FROM adapter_grants WHERE adapter_id = $1 AND tenant_id = $2"
/* $1 alias, $2 tenant, $3 tinker path */
#define SQL_REG_ALIAS_SET                                                                     \
    "INSERT INTO adapter_aliases (alias, tenant_id, tinker_path) VALUES ($1, $2, $3)"         \
    " ON CONFLICT (tenant_id, alias) DO UPDATE SET tinker_path = $3, created_at = now()"
/* $1 alias, $2 tenant */
#define SQL_REG_ALIAS_DELETE "DELETE FROM adapter_aliases WHERE alias = $1 AND tenant_id = $2"

/* ---- adapter uploads (reg_edit.c; docs/protocol.md §12.7, migration 0022) ---------------- */
/* $1 id, $2 tenant, $3 key, $4 base model, $5 lora_config (JSON), $6 project, $7 ttl s */
#define SQL_REG_UPLOAD_INSERT                                                                 \
    "INSERT INTO weight_uploads (id, tenant_id, key_id, base_model, lora_config, project_id,"   \
    " expires_at) VALUES ($1, $2, $3, $4, $5::jsonb, $6, now() + make_interval(secs => $7::int))"
/* $1 id, $2 file name, $3 bytes: the file is staged (only while the upload is open) */
#define SQL_REG_UPLOAD_FILE_STAGED                                                            \
    "UPDATE weight_uploads SET files = files || jsonb_build_object($2::text, $3::bigint)"    \
    " WHERE id = $1 AND finished_at IS NULL AND expires_at > now() RETURNING 1"
/* $1 id, $2 tinker path */
#define SQL_REG_UPLOAD_FINISHED                                                               \
    "UPDATE weight_uploads SET finished_at = now(), tinker_path = $2 WHERE id = $1 AND finished_at IS NULL"
