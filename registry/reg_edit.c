/* reg_edit.c: the registry's writes on behalf of an owner, an operator or an upload
 * (registry.h): deleting, publishing and expiring a version, grants, aliases, and the
 * record of an adapter upload. The api's routes and the CLI call these; neither runs the
 * registry's write statements itself. */
#include "registry/registry.h"
#include "registry/reg_sql.h"
#include "common/db.h"
#include <stdio.h>
#include <stdlib.h>

static void fmt_i64(char out[24], int64_t v) { snprintf(out, 24, "%lld", (long long)v); }

/* ---- adapter uploads --------------------------------------------------------------------- */

int reg_upload_open(PGconn *c, const reg_upload_req *q, char *err, size_t errlen) {
    char t[24], k[24], ttl[24];
    fmt_i64(t, q->tenant_id);
    fmt_i64(k, q->key_id);
    fmt_i64(ttl, q->ttl_seconds);
    const char *p[7] = {q->id, t, q->key_id > 0 ? k : NULL, q->base_model, q->lora_config, q->project, ttl};
    return db_exec(c, SQL_REG_UPLOAD_INSERT, 7, p, err, errlen);
}

int reg_upload_file_staged(PGconn *c, const char *upload_id, int file, int64_t bytes, char *err, size_t errlen) {
    char b[24];
    fmt_i64(b, bytes);
    const char *p[3] = {upload_id, reg_upload_files[file], b};
    PGresult *r = db_query(c, SQL_REG_UPLOAD_FILE_STAGED, 3, p, err, errlen);
    if (!r) return -1;
    int staged = PQntuples(r) > 0;
    PQclear(r);
    return staged;
}

int reg_upload_finished(PGconn *c, const char *upload_id, const char *tinker_path, char *err, size_t errlen) {
    const char *p[2] = {upload_id, tinker_path};
    return db_exec(c, SQL_REG_UPLOAD_FINISHED, 2, p, err, errlen);
}

/* ---- versions ---------------------------------------------------------------------------- */

int reg_version_delete(PGconn *c, int64_t version_id, char *err, size_t errlen) {
    char id[24];
    fmt_i64(id, version_id);
    const char *p[1] = {id};
    return db_exec(c, SQL_REG_MARK_DELETED, 1, p, err, errlen);
}

int reg_version_set_public(PGconn *c, const reg_version *v, bool is_public, char *err, size_t errlen) {
    char id[24];
    fmt_i64(id, v->id);
    const char *p[2] = {id, is_public ? "public" : "private"};
    if (db_exec(c, SQL_REG_SET_VISIBILITY, 2, p, err, errlen) < 0) return -1;
    return !is_public && reg_fail_unreadable_samples(c, v->adapter_id, err, errlen) < 0 ? -1 : 0;
}

int reg_version_set_ttl(PGconn *c, int64_t version_id, int64_t ttl_seconds, char *err, size_t errlen) {
    char id[24], t[24];
    fmt_i64(id, version_id);
    fmt_i64(t, ttl_seconds);
    const char *p[2] = {id, t};
    return db_exec(c, SQL_REG_SET_TTL, 2, p, err, errlen);
}

/* ---- grants and aliases ------------------------------------------------------------------- */

static int grant_stmt(PGconn *c, const char *sql, int64_t adapter_id, int64_t tenant, char *err, size_t errlen) {
    char a[24], t[24];
    fmt_i64(a, adapter_id);
    fmt_i64(t, tenant);
    const char *p[2] = {a, t};
    return db_exec(c, sql, 2, p, err, errlen);
}

int reg_grant(PGconn *c, int64_t adapter_id, int64_t tenant, char *err, size_t errlen) {
    return grant_stmt(c, SQL_REG_GRANT, adapter_id, tenant, err, errlen);
}

int reg_revoke(PGconn *c, int64_t adapter_id, int64_t tenant, char *err, size_t errlen) {
    if (grant_stmt(c, SQL_REG_REVOKE, adapter_id, tenant, err, errlen) < 0) return -1;
    return reg_fail_unreadable_samples(c, adapter_id, err, errlen) < 0 ? -1 : 0;
}

int reg_alias_set(PGconn *c, int64_t tenant, const char *alias, const char *tinker_path, char *err, size_t errlen) {
    char t[24];
    fmt_i64(t, tenant);
    const char *p[3] = {alias, t, tinker_path};
    return db_exec(c, SQL_REG_ALIAS_SET, 3, p, err, errlen);
}

int reg_alias_delete(PGconn *c, int64_t tenant, const char *alias, char *err, size_t errlen) {
    char t[24];
    fmt_i64(t, tenant);
    const char *p[2] = {alias, t};
    PGresult *r = db_query(c, SQL_REG_ALIAS_DELETE, 2, p, err, errlen);
    if (!r) return -1;
    int n = atoi(PQcmdTuples(r));
    PQclear(r);
    return n;
}
