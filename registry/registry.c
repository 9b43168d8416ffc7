/* registry.c: paths, versions, access, locks, audit and download tokens (registry.h).
 * GC lives in reg_gc.c, the tar writer in reg_tar.c, an owner's changes and the records
 * of adapter uploads in reg_edit.c. */
#include "registry/registry.h"
#include "registry/reg_sql.h"
#include "common/db.h"
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- paths ------------------------------------------------------------------------------ */

bool reg_name_valid(const char *name, char *err, size_t errlen) {
    size_t n = name ? strlen(name) : 0;
    if (n < 1 || n > REG_NAME_MAX) {
        snprintf(err, errlen, "checkpoint name must be 1 to %d characters long", REG_NAME_MAX);
        return false;
    }
    if (!strcmp(name, ".") || !strcmp(name, "..")) {
        snprintf(err, errlen, "checkpoint name may not be '%s'", name);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch <= 0x20 || ch >= 0x7f || strchr("/?#%\\\"'", ch)) {
            snprintf(err, errlen, "checkpoint name \"%.140s\" may contain printable ASCII only, without "
                     "spaces and without / ? # %% \\ or quotes (e.g. \"000020\", \"final\", \"step_100\")", name);
            return false;
        }
    }
    return true;
}

static bool run_valid(const char *run, size_t n) {
    if (n < 1 || n >= REG_RUN_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)run[i];
        if (ch <= 0x20 || ch >= 0x7f || strchr("/?#%\\\"'", ch)) return false;
    }
    return true;
}

const char *reg_kind_of_dir(const char *dir) {
    if (!strcmp(dir, "weights")) return "training";
    if (!strcmp(dir, "sampler_weights")) return "sampler";
    if (!strcmp(dir, "external_weights")) return "external";
    return NULL;
}

const char *reg_dir_of_kind(const char *kind) {
    return !strcmp(kind, "training") ? "weights" : !strcmp(kind, "external") ? "external_weights" : "sampler_weights";
}

int reg_ckpt_id_parse(const char *run, const char *ckpt_id, reg_path *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (!run_valid(run, strlen(run))) {
        snprintf(err, errlen, "invalid training run id \"%.200s\"", run);
        return -1;
    }
    const char *slash = strchr(ckpt_id, '/');
    if (!slash || slash - ckpt_id >= (ptrdiff_t)sizeof out->dir) {
        snprintf(err, errlen, "checkpoint id \"%.200s\" must look like weights/<name>, sampler_weights/<name> or "
                 "external_weights/<name>", ckpt_id);
        return -1;
    }
    memcpy(out->dir, ckpt_id, slash - ckpt_id);
    if (!reg_kind_of_dir(out->dir)) {
        snprintf(err, errlen, "checkpoint kind \"%s\" is none of weights, sampler_weights, external_weights",
                 out->dir);
        return -1;
    }
    if (!reg_name_valid(slash + 1, err, errlen)) return -1;
    snprintf(out->run, sizeof out->run, "%s", run);
    snprintf(out->name, sizeof out->name, "%s", slash + 1);
    return 0;
}

int reg_path_parse(const char *s, reg_path *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const char *pfx = "tinker://";
    if (!s || strncmp(s, pfx, strlen(pfx))) {
        snprintf(err, errlen, "checkpoint path \"%.200s\" must start with tinker:// "
                 "(tinker://<model_id>/weights/<name>)", s ? s : "");
        return -1;
    }
    const char *run = s + strlen(pfx), *slash = strchr(run, '/');
    if (!slash || !run_valid(run, slash - run)) {
        snprintf(err, errlen, "checkpoint path \"%.200s\" must look like tinker://<model_id>/<weights|sampler_weights>/<name>", s);
        return -1;
    }
    char runbuf[REG_RUN_MAX];
    memcpy(runbuf, run, slash - run);
    runbuf[slash - run] = 0;
    return reg_ckpt_id_parse(runbuf, slash + 1, out, err, errlen);
}

void reg_path_format(const reg_path *p, char *out, size_t n) {
    snprintf(out, n, "tinker://%s/%s/%s", p->run, p->dir, p->name);
}

/* ---- versions ----------------------------------------------------------------------------- */

json_t *reg_checkpoint_json(const reg_version *v) {
    char id[REG_NAME_MAX + 32];
    snprintf(id, sizeof id, "%s/%s", v->path.dir, v->path.name);
    json_t *meta = v->user_metadata[0] ? json_loads(v->user_metadata, 0, NULL) : NULL;
    return json_pack("{s:s, s:s, s:s, s:s, s:I, s:b, s:o, s:o, s:s}", "checkpoint_id", id, "checkpoint_type",
                     v->kind, "time", v->time, "tinker_path", v->tinker_path, "size_bytes",
                     (json_int_t)v->size_bytes, "public", v->is_public, "expires_at",
                     v->expires_at[0] ? json_string(v->expires_at) : json_null(), "user_metadata",
                     meta ? meta : json_null(), "base_model", v->base_model);
}

static void version_of_row(const PGresult *r, int i, reg_version *v) {
    memset(v, 0, sizeof *v);
    v->id = db_int(r, i, 0);
    v->adapter_id = db_int(r, i, 1);
    v->tenant_id = db_int(r, i, 2);
    snprintf(v->tinker_path, sizeof v->tinker_path, "%s", PQgetvalue(r, i, 3));
    char e[64];
    reg_path_parse(v->tinker_path, &v->path, e, sizeof e);
    snprintf(v->kind, sizeof v->kind, "%s", PQgetvalue(r, i, 4));
    snprintf(v->base_model, sizeof v->base_model, "%s", PQgetvalue(r, i, 5));
    snprintf(v->digest, sizeof v->digest, "%s", PQgetvalue(r, i, 6));
    v->size_bytes = db_int(r, i, 7);
    v->step = db_int(r, i, 8);
    v->rank = (int)db_int(r, i, 9);
    v->train_attn = db_bool(r, i, 10);
    v->train_mlp = db_bool(r, i, 11);
    v->train_unembed = db_bool(r, i, 12);
    v->is_public = db_bool(r, i, 13);
    snprintf(v->time, sizeof v->time, "%s", PQgetvalue(r, i, 14));
    snprintf(v->expires_at, sizeof v->expires_at, "%s", PQgetvalue(r, i, 15));
    v->created_epoch = db_int(r, i, 16);
    /* longer than any the api stores: an operator's own write; shown as none */
    if (PQgetlength(r, i, 17) <= REG_META_MAX) snprintf(v->user_metadata, sizeof v->user_metadata, "%s", PQgetvalue(r, i, 17));
}

/* Exported for the api and the CLI: one row of a query that selects REG_VERSION_COLS. */
void reg_version_of_row(const PGresult *r, int i, reg_version *v) { version_of_row(r, i, v); }

static int find(PGconn *c, const char *sql, int np, const char *const *p, const char *path, reg_version *out,
                char *err, size_t errlen) {
    PGresult *r = db_query(c, sql, np, p, err, errlen);
    if (!r) return -1;
    if (PQntuples(r) == 0) {
        PQclear(r);
        snprintf(err, errlen, "checkpoint %.300s not found", path);
        return 404;
    }
    version_of_row(r, 0, out);
    PQclear(r);
    return 0;
}

int reg_find_readable(PGconn *c, int64_t tenant, const char *path, reg_version *out, char *err, size_t errlen) {
    char t[24];
    snprintf(t, sizeof t, "%lld", (long long)tenant);
    const char *p[2] = {path, t};
    return find(c, SQL_REG_FIND_READABLE, 2, p, path, out, err, errlen);
}

int reg_find_owned(PGconn *c, int64_t tenant, const char *path, reg_version *out, char *err, size_t errlen) {
    int rc = reg_find_readable(c, tenant, path, out, err, errlen);
    if (rc == 0 && out->tenant_id != tenant) {
        snprintf(err, errlen, "checkpoint %.300s belongs to another tenant: it was shared with you for reading "
                 "only", path);
        return 403;
    }
    return rc;
}

int reg_find_live(PGconn *c, const char *path, reg_version *out, char *err, size_t errlen) {
    const char *p[1] = {path};
    return find(c, SQL_REG_FIND_LIVE, 1, p, path, out, err, errlen);
}

static int one_row(PGconn *c, const char *sql, int np, const char *const *p, PGresult **out, char *err,
                   size_t errlen) {
    *out = db_query(c, sql, np, p, err, errlen);
    if (!*out) return -1;
    return PQntuples(*out) > 0;
}

int reg_version_insert(PGconn *c, const reg_new_version *v, int64_t *version_id, char *err, size_t errlen) {
    PGresult *r;
    char seq[24], step[24], size[24], key[24], ttl[24], path[REG_PATH_MAX], adapter_id[24], parent[24] = "",
         seq_from[24] = "1";
    snprintf(seq, sizeof seq, "%lld", (long long)v->seq_id);
    snprintf(step, sizeof step, "%lld", (long long)v->step);
    snprintf(size, sizeof size, "%lld", (long long)v->size_bytes);
    snprintf(key, sizeof key, "%lld", (long long)v->key_id);
    snprintf(ttl, sizeof ttl, "%lld", (long long)v->ttl_seconds);
    reg_path rp;
    snprintf(rp.run, sizeof rp.run, "%s", v->model_id);
    snprintf(rp.dir, sizeof rp.dir, "%s", reg_dir_of_kind(v->kind));
    snprintf(rp.name, sizeof rp.name, "%s", v->name);
    reg_path_format(&rp, path, sizeof path);

    const char *pm[1] = {v->model_id};
    int rc = one_row(c, SQL_REG_MODEL_TENANT, 1, pm, &r, err, errlen);
    if (rc <= 0) {
        if (rc == 0) { snprintf(err, errlen, "model %.200s no longer exists", v->model_id); PQclear(r); }
        return -1;
    }
    char tenant[24];
    snprintf(tenant, sizeof tenant, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    const char *pa[2] = {tenant, v->model_id};
    if (one_row(c, SQL_REG_ADAPTER_UPSERT, 2, pa, &r, err, errlen) <= 0) { if (r) PQclear(r); return -1; }
    snprintf(adapter_id, sizeof adapter_id, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);

    /* The name: free, taken (overwrite?), or taken by a version past its TTL (free). */
    const char *pp[1] = {path};
    rc = one_row(c, SQL_REG_PATH_LIVE_ROW, 1, pp, &r, err, errlen);
    if (rc < 0) return -1;
    if (rc > 0) {
        bool expired = db_bool(r, 0, 1);
        char old[24];
        snprintf(old, sizeof old, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
        if (!expired && !v->overwrite) {
            snprintf(err, errlen, "checkpoint %s already exists; save under another name, delete it first, or "
                     "pass overwrite=true", path);
            return 1;
        }
        const char *po[1] = {old};
        if (db_exec(c, SQL_REG_MARK_DELETED, 1, po, err, errlen) < 0) return -1;
    } else {
        PQclear(r);
    }

    /* Parent: this adapter's newest version, or the checkpoint the model last loaded,
     * whichever came later; the provenance range starts after it. */
    int64_t parent_seq = -1;
    const char *pv[1] = {adapter_id};
    if ((rc = one_row(c, SQL_REG_LAST_VERSION, 1, pv, &r, err, errlen)) < 0) return -1;
    if (rc > 0) {
        snprintf(parent, sizeof parent, "%s", PQgetvalue(r, 0, 0));
        parent_seq = db_int(r, 0, 1);
    }
    PQclear(r);
    const char *pl[2] = {v->model_id, seq};
    if ((rc = one_row(c, SQL_REG_LAST_LOAD, 2, pl, &r, err, errlen)) < 0) return -1;
    if (rc > 0 && db_int(r, 0, 0) > parent_seq) {
        parent_seq = db_int(r, 0, 0);
        snprintf(parent, sizeof parent, "%s", PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    if (parent_seq >= 0) snprintf(seq_from, sizeof seq_from, "%lld", (long long)parent_seq + 1);

    const char *pi[13] = {v->model_id, seq_from, seq, adapter_id, v->kind, v->name, path, step,
                          parent[0] ? parent : NULL, v->digest, size, v->key_id > 0 ? key : NULL, ttl};
    if ((rc = one_row(c, SQL_REG_VERSION_INSERT, 13, pi, &r, err, errlen)) <= 0) {
        if (rc == 0) { snprintf(err, errlen, "model %.200s no longer exists", v->model_id); PQclear(r); }
        return -1;
    }
    *version_id = db_int(r, 0, 0);
    PQclear(r);
    return 0;
}

/* ---- imports and copies ----------------------------------------------------------------- */

const char *const reg_upload_files[REG_UPLOAD_NFILES] = {"adapter_config.json", "adapter_model.safetensors"};

void reg_upload_stage_name(const char *upload_id, int i, char out[128]) {
    snprintf(out, 128, "upload-%.80s-%d", upload_id, i);
}

static int run_adapter(PGconn *c, int64_t tenant, const char *run, char id[24], char *err, size_t errlen) {
    char t[24];
    snprintf(t, sizeof t, "%lld", (long long)tenant);
    const char *p[2] = {t, run};
    PGresult *r;
    if (db_exec(c, SQL_REG_RUN_LOCK, 1, p + 1, err, errlen) < 0) return -1;
    int rc = one_row(c, SQL_REG_RUN_ADAPTER, 2, p, &r, err, errlen);
    if (rc <= 0) {
        if (r) PQclear(r);
        if (rc == 0) {
            snprintf(err, errlen, "run name %s is taken by another tenant (a tinker://RUN/... path names one run "
                     "for every tenant); choose another run name", run);
            return 409;
        }
        return -1;
    }
    snprintf(id, 24, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return 0;
}

int reg_import(PGconn *c, blobstore *bs, const reg_import_req *q, const void *blob, size_t len,
               char path[REG_PATH_MAX], char *err, size_t errlen) {
    char ckpt[REG_NAME_MAX + 32];
    reg_path rp;
    snprintf(ckpt, sizeof ckpt, "sampler_weights/%s", q->name);
    if (reg_ckpt_id_parse(q->run, ckpt, &rp, err, errlen) < 0) return -1;
    reg_path_format(&rp, path, REG_PATH_MAX);
    char aid[24], rank[16], size[24], key[24];
    snprintf(rank, sizeof rank, "%d", q->rank);
    snprintf(size, sizeof size, "%lld", (long long)q->size_bytes);
    snprintf(key, sizeof key, "%lld", (long long)q->key_id);
    if (db_begin(c, err, errlen) < 0) return -1;
    /* Under the digest's shared lock: the GC (exclusive) either removed the blob before,
     * and it is stored again here, or sees this version when it looks. */
    if (reg_blob_lock_shared(c, q->digest, err, errlen) < 0) goto fail;
    if (!blob_exists(bs, q->digest)) {
        char dg[BLOB_DIGEST_HEX];
        if (blob_put(bs, blob, len, dg, err, errlen) < 0) goto fail;
    }
    int ra = run_adapter(c, q->tenant_id, q->run, aid, err, errlen);
    if (ra > 0) {
        db_rollback(c);
        return ra;
    }
    if (ra < 0) goto fail;
    const char *pv[13] = {aid, q->name, path, q->base_model, rank, q->train_attn ? "t" : "f",
                          q->train_mlp ? "t" : "f", q->train_unembed ? "t" : "f", q->digest, size, q->source,
                          q->source_config, q->key_id > 0 ? key : NULL};
    PGresult *r = db_query(c, SQL_REG_IMPORT_VERSION, 13, pv, err, errlen);
    if (!r) {
        if (!strcmp(db_last_sqlstate(), "23505")) {
            snprintf(err, errlen, "%s exists already (delete it first, or import under another name)", path);
            db_rollback(c);
            return 409;
        }
        goto fail;
    }
    PQclear(r);
    char details[160];
    snprintf(details, sizeof details, "{\"blob_digest\": \"%s\"}", q->digest);
    if (reg_audit(c, q->tenant_id, q->actor, "checkpoint.import", path, details, err, errlen) < 0 ||
        db_commit(c, err, errlen) < 0)
        goto fail;
    return 0;
fail:
    db_rollback(c);
    return -1;
}

int reg_copy(PGconn *c, const reg_version *src, int64_t tenant, const char *run, int64_t ttl_seconds,
             int64_t key_id, char path[REG_PATH_MAX], char *err, size_t errlen) {
    char ckpt[REG_NAME_MAX + 32], aid[24], sid[24], key[24], ttl[24];
    reg_path rp;
    snprintf(ckpt, sizeof ckpt, "%s/%s", src->path.dir, src->path.name);
    if (reg_ckpt_id_parse(run, ckpt, &rp, err, errlen) < 0) return -1;
    reg_path_format(&rp, path, REG_PATH_MAX);
    snprintf(sid, sizeof sid, "%lld", (long long)src->id);
    const char *pp[1] = {path};
    PGresult *r;
    int rc = one_row(c, SQL_REG_PATH_PARENT, 1, pp, &r, err, errlen);
    if (rc < 0) return -1;
    if (rc > 0) {
        bool same = db_int(r, 0, 0) == src->id && !strcmp(PQgetvalue(r, 0, 1), src->digest);
        PQclear(r);
        if (same) return 0;   /* the copy exists: a retry of the same request */
        snprintf(err, errlen, "%s exists already and is not a copy of %s: copy into another model_seq_id, or "
                 "delete it first", path, src->tinker_path);
        return 409;
    }
    PQclear(r);
    int ra = run_adapter(c, tenant, run, aid, err, errlen);
    if (ra != 0) return ra;
    snprintf(key, sizeof key, "%lld", (long long)key_id);
    snprintf(ttl, sizeof ttl, "%lld", (long long)ttl_seconds);
    const char *pc[5] = {aid, path, sid, key_id > 0 ? key : NULL, ttl};
    rc = one_row(c, SQL_REG_COPY_VERSION, 5, pc, &r, err, errlen);
    if (rc < 0) {
        if (!strcmp(db_last_sqlstate(), "23505")) {
            snprintf(err, errlen, "%s was taken meanwhile; copy into another model_seq_id", path);
            return 409;
        }
        return -1;
    }
    PQclear(r);
    if (rc == 0) {
        snprintf(err, errlen, "checkpoint %.300s was deleted or expired meanwhile", src->tinker_path);
        return 404;
    }
    return 0;
}

/* ---- locks, audit ----------------------------------------------------------------------- */

static int lock(PGconn *c, const char *sql, const char *digest, char *err, size_t errlen) {
    if (!blob_digest_valid(digest)) { snprintf(err, errlen, "invalid blob digest"); return -1; }
    const char *p[1] = {digest};
    return db_exec(c, sql, 1, p, err, errlen);
}

int reg_blob_lock_shared(PGconn *c, const char *digest, char *err, size_t errlen) {
    return lock(c, SQL_REG_BLOB_LOCK_SHARED, digest, err, errlen);
}

int reg_blob_lock(PGconn *c, const char *digest, char *err, size_t errlen) {
    return lock(c, SQL_REG_BLOB_LOCK, digest, err, errlen);
}

int reg_audit(PGconn *c, int64_t tenant, const char *actor, const char *action, const char *object,
              const char *details, char *err, size_t errlen) {
    char t[24];
    snprintf(t, sizeof t, "%lld", (long long)tenant);
    const char *p[5] = {tenant > 0 ? t : NULL, actor, action, object, details};
    return db_exec(c, SQL_REG_AUDIT, 5, p, err, errlen);
}

int reg_audit_key(PGconn *c, int64_t tenant, int64_t key_id, const char *action, const char *object,
                  const char *details, char *err, size_t errlen) {
    char t[24], k[24];
    snprintf(t, sizeof t, "%lld", (long long)tenant);
    snprintf(k, sizeof k, "%lld", (long long)key_id);
    const char *p[5] = {tenant > 0 ? t : NULL, k, action, object, details};
    return db_exec(c, SQL_REG_AUDIT_BY_KEY, 5, p, err, errlen);
}

int reg_fail_unreadable_samples(PGconn *c, int64_t adapter_id, char *err, size_t errlen) {
    char id[24];
    snprintf(id, sizeof id, "%lld", (long long)adapter_id);
    const char *p[1] = {id};
    PGresult *r = db_query(c, SQL_REG_FAIL_UNREADABLE_SAMPLES, 1, p, err, errlen);
    if (!r) return -1;
    int n = PQntuples(r);
    PQclear(r);
    return n;
}

/* ---- download tokens --------------------------------------------------------------------- */

static void token_mac(const unsigned char secret[32], const char *run, const char *ckpt_id, const char *format,
                      int64_t expires, int64_t key_id, unsigned char mac[crypto_auth_BYTES]) {
    unsigned char key[crypto_auth_KEYBYTES];
    /* A key of its own, so a token never doubles as anything else the secret signs. */
    crypto_kdf_derive_from_key(key, sizeof key, 1, "loomdlv1", secret);
    char exp[24], kid[24];
    snprintf(exp, sizeof exp, "%lld", (long long)expires);
    snprintf(kid, sizeof kid, "%lld", (long long)key_id);
    crypto_auth_hmacsha512256_state st;
    crypto_auth_hmacsha512256_init(&st, key, sizeof key);
    const char *parts[] = {"loom-download", run, ckpt_id, format, exp, kid};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        crypto_auth_hmacsha512256_update(&st, (const unsigned char *)parts[i], strlen(parts[i]) + 1);
    crypto_auth_hmacsha512256_final(&st, mac);
    sodium_memzero(key, sizeof key);
}

void reg_download_sign(const unsigned char secret[32], const char *run, const char *ckpt_id, const char *format,
                       int64_t expires, int64_t key_id, char out[REG_TOKEN_HEX]) {
    unsigned char mac[crypto_auth_BYTES];
    token_mac(secret, run, ckpt_id, format, expires, key_id, mac);
    sodium_bin2hex(out, REG_TOKEN_HEX, mac, sizeof mac);
}

bool reg_download_verify(const unsigned char secret[32], const char *run, const char *ckpt_id, const char *format,
                         int64_t expires, int64_t key_id, const char *token) {
    unsigned char mac[crypto_auth_BYTES], got[crypto_auth_BYTES];
    size_t n = 0;
    if (!token || strlen(token) != 2 * crypto_auth_BYTES ||
        sodium_hex2bin(got, sizeof got, token, strlen(token), NULL, &n, NULL) != 0 || n != sizeof got)
        return false;
    token_mac(secret, run, ckpt_id, format, expires, key_id, mac);
    return sodium_memcmp(mac, got, sizeof mac) == 0;
}
