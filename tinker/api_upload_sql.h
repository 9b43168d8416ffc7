/* api_upload_sql.h: the reads of adapter uploads over HTTP (api_upload.c; docs/protocol.md
 * §12.7, migration 0022); the registry records them (registry.h: reg_upload_*).
 * Parameters are always bound. */
#pragma once

/* $1 base model -> its config.json (the geometry the import is checked against) */
#define SQL_UPL_BASE_CONFIG "SELECT config::text FROM base_models WHERE name = $1"
/* $1 tenant, $2 limit -> min(the tenant's open uploads, limit) */
#define SQL_UPL_OPEN_COUNT                                                                  \
    "SELECT count(*) FROM (SELECT 1 FROM weight_uploads WHERE tenant_id = $1"               \
    " AND finished_at IS NULL AND expires_at > now() LIMIT $2) q"
/* $1 id, $2 key id (of the PUT's link) -> the upload's tenant, whether it is open (not
 * finished, not expired), whether the link's key is still valid and the tenant's */
#define SQL_UPL_FOR_PUT                                                                     \
    "SELECT u.tenant_id, u.finished_at IS NULL AND u.expires_at > now(),"                   \
    " EXISTS (SELECT 1 FROM api_keys k WHERE k.id = $2::bigint AND k.tenant_id = u.tenant_id" \
    "  AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()))"        \
    " FROM weight_uploads u WHERE u.id = $1"
/* $1 id, $2 tenant -> base model, lora_config, project, files, open, tinker_path (NULL
 * until finished), expires_at passed */
#define SQL_UPL_GET                                                                         \
    "SELECT base_model, lora_config::text, project_id, files::text,"                        \
    " finished_at IS NULL AND expires_at > now(), tinker_path, expires_at <= now()"         \
    " FROM weight_uploads WHERE id = $1 AND tenant_id = $2"
