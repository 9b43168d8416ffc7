/* api_upload_sql.h: the statements of adapter uploads over HTTP (api_upload.c;
 * docs/protocol.md §12.7, migration 0022). Parameters are always bound. */
#pragma once

/* $1 base model -> its config.json (the geometry the import is checked against) */
#define SQL_UPL_BASE_CONFIG "SELECT config::text FROM base_models WHERE name = $1"
/* $1 tenant, $2 limit -> min(the tenant's open uploads, limit) */
#define SQL_UPL_OPEN_COUNT                                                                  \
    "SELECT count(*) FROM (SELECT 1 FROM weight_uploads WHERE tenant_id = $1"               \
    " AND finished_at IS NULL AND expires_at > now() LIMIT $2) q"
/* $1 id, $2 tenant, $3 key, $4 base model, $5 lora_config (JSON), $6 project, $7 ttl s */
#define SQL_UPL_INSERT                                                                      \
    "INSERT INTO weight_uploads (id, tenant_id, key_id, base_model, lora_config, project_id," \
    " expires_at) VALUES ($1, $2, $3, $4, $5::jsonb, $6, now() + make_interval(secs => $7::int))"
/* $1 id, $2 key id (of the PUT's link) -> the upload's tenant, whether it is open (not
 * finished, not expired), whether the link's key is still valid and the tenant's */
#define SQL_UPL_FOR_PUT                                                                     \
    "SELECT u.tenant_id, u.finished_at IS NULL AND u.expires_at > now(),"                   \
    " EXISTS (SELECT 1 FROM api_keys k WHERE k.id = $2::bigint AND k.tenant_id = u.tenant_id" \
    "  AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()))"        \
    " FROM weight_uploads u WHERE u.id = $1"
/* $1 id, $2 file name, $3 bytes: the file is staged (only while the upload is open) */
#define SQL_UPL_FILE_STAGED                                                                 \
    "UPDATE weight_uploads SET files = files || jsonb_build_object($2::text, $3::bigint)"  \
    " WHERE id = $1 AND finished_at IS NULL AND expires_at > now() RETURNING 1"
/* $1 id, $2 tenant -> base model, lora_config, project, files, open, tinker_path (NULL
 * until finished), expires_at passed */
#define SQL_UPL_GET                                                                         \
    "SELECT base_model, lora_config::text, project_id, files::text,"                        \
    " finished_at IS NULL AND expires_at > now(), tinker_path, expires_at <= now()"         \
    " FROM weight_uploads WHERE id = $1 AND tenant_id = $2"
/* $1 id, $2 tinker path */
#define SQL_UPL_FINISHED                                                                    \
    "UPDATE weight_uploads SET finished_at = now(), tinker_path = $2 WHERE id = $1 AND finished_at IS NULL"
