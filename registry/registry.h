/* registry.h: the adapter registry: tinker:// checkpoint paths, checkpoint versions and
 * their provenance, access rules between tenants, the blob locks that keep GC from
 * removing a blob a concurrent save is about to reference, GC itself, signed download
 * tokens and the tar writer of checkpoint archives. Every write to its tables (adapters,
 * adapter_versions, adapter_grants, adapter_aliases, weight_uploads, and the audit rows
 * of what happens to them) goes through here: the api's routes, the executor and the CLI
 * call these functions and run none of the registry's write statements themselves.
 *
 * Access rule (one place: reg_find_readable): a tenant may read a live version (not
 * deleted, not past its TTL) of its own adapters, any public version, and every version
 * of an adapter granted to it. Only the owner may modify (delete, publish, ttl, grant).
 * Everything else reads as "not found". */
#pragma once
#include "registry/blobstore.h"
#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REG_NAME_MAX 128     /* checkpoint name */
#define REG_RUN_MAX 400      /* training run id (= model id, or an imported adapter's name) */
#define REG_PATH_MAX 600
#define REG_META_MAX 16384   /* a checkpoint's user_metadata, bytes of compact JSON */

/* ---- paths (docs/protocol.md §6) ------------------------------------------------------ */

typedef struct {
    char run[REG_RUN_MAX];
    char dir[24];                /* "weights" | "sampler_weights" | "external_weights" */
    char name[REG_NAME_MAX + 1];
} reg_path;

/* Parses "tinker://<run>/<weights|sampler_weights>/<name>". 0, or -1 with err. */
int reg_path_parse(const char *s, reg_path *out, char *err, size_t errlen);
/* Parses a REST checkpoint id "<weights|sampler_weights>/<name>" for run. */
int reg_ckpt_id_parse(const char *run, const char *ckpt_id, reg_path *out, char *err, size_t errlen);
/* A checkpoint name: 1..128 printable ASCII characters, none of / ? # % \ or space. */
bool reg_name_valid(const char *name, char *err, size_t errlen);
/* "tinker://run/dir/name" */
void reg_path_format(const reg_path *p, char *out, size_t n);
/* "training" for weights/, "sampler" for sampler_weights/ (and back). */
const char *reg_kind_of_dir(const char *dir);
const char *reg_dir_of_kind(const char *kind);

/* ---- versions --------------------------------------------------------------------------- */

typedef struct {
    int64_t id, adapter_id, tenant_id;  /* tenant_id: the owner */
    char tinker_path[REG_PATH_MAX];
    reg_path path;
    char kind[16];                      /* "training" | "sampler" | "external" */
    char base_model[256];
    char digest[BLOB_DIGEST_HEX];
    int64_t size_bytes, step;
    int rank;
    bool train_attn, train_mlp, train_unembed;
    bool is_public;
    char time[40];                      /* created_at, ISO 8601 UTC */
    char expires_at[40];                /* "" = never */
    int64_t created_epoch;              /* unix seconds */
    char user_metadata[REG_META_MAX + 1];   /* JSON object text, "" = none */
} reg_version;

/* The Checkpoint JSON of docs/protocol.md §12.1 (with user_metadata and base_model). */
json_t *reg_checkpoint_json(const reg_version *v);
/* Row i of a result whose columns are REG_VERSION_COLS (reg_sql.h). */
void reg_version_of_row(const PGresult *r, int i, reg_version *v);

/* Live version at tinker_path that tenant may read (own, public or granted). 0 found,
 * 404 (err says so) when absent, dead or not readable, -1 database error. */
int reg_find_readable(PGconn *c, int64_t tenant, const char *tinker_path, reg_version *out, char *err,
                      size_t errlen);
/* Same for modifications: the tenant must own it. */
int reg_find_owned(PGconn *c, int64_t tenant, const char *tinker_path, reg_version *out, char *err, size_t errlen);
/* Same without any tenant check (operators, the download route after its token check). */
int reg_find_live(PGconn *c, const char *tinker_path, reg_version *out, char *err, size_t errlen);

/* A new checkpoint version, written inside the executor's commit transaction. */
typedef struct {
    const char *model_id;
    int64_t seq_id;            /* the save operation's seq_id */
    const char *kind;          /* "training" | "sampler" | "external" */
    const char *name;
    const char *digest;
    int64_t size_bytes, step;
    int64_t ttl_seconds;       /* < 0: never expires */
    bool overwrite;
    int64_t key_id;            /* creating API key, 0 if unknown */
} reg_new_version;

/* Creates the model's adapter row if needed, marks a previous live version at the same
 * path deleted (overwrite, or when it has expired), computes the provenance (op range
 * since the parent version, hyper-parameters, loss summary, data digest) and inserts
 * the version. 0 with *version_id; 1 when the name exists and overwrite is false (err
 * says so, nothing written); -1 database error. */
int reg_version_insert(PGconn *c, const reg_new_version *v, int64_t *version_id, char *err, size_t errlen);

/* ---- imports and copies ------------------------------------------------------------------ */

/* An adapter brought in from outside (`loom adapter import`, an HTTP upload): its blob is
 * already in the store (validated and built by model/adapter_io.c: adapter_io_import). */
typedef struct {
    int64_t tenant_id;
    const char *run, *name;     /* -> tinker://<run>/sampler_weights/<name> */
    const char *base_model;
    int rank;
    bool train_attn, train_mlp, train_unembed;
    const char *digest;
    int64_t size_bytes;
    const char *source;         /* provenance imported_from: a file, or "upload:<id>" */
    const char *source_config;  /* the adapter_config.json it came with (JSON text) */
    const char *actor;          /* audit_log actor: "cli", "key:<prefix>" ... */
    int64_t key_id;             /* the creating API key, 0 if none */
} reg_import_req;

/* In one transaction of its own: the digest's shared lock, the blob stored again if GC
 * took it meanwhile (blob, len), the run's adapter, the version and a checkpoint.import
 * audit row. 0 with path; 409 when a live checkpoint holds the path (err says so, nothing
 * written); -1 with err. */
int reg_import(PGconn *c, blobstore *bs, const reg_import_req *q, const void *blob, size_t len,
               char path[REG_PATH_MAX], char *err, size_t errlen);

/* A copy of version src for tenant, as tinker://<run>/<src's kind dir>/<src's name>,
 * inside the caller's transaction: the copy names the same blob (no bytes are written;
 * the GC keeps a blob while any live version names it, so the copy outlives its source),
 * its parent is src and its provenance says where it came from; ttl_seconds < 0: it never
 * expires. The caller holds the digest's shared lock and has checked that the blob is in
 * the store. 0 with path (also when this very copy exists already: a retry); 409 when
 * another live version holds the path; -1 with err. */
int reg_copy(PGconn *c, const reg_version *src, int64_t tenant, const char *run, int64_t ttl_seconds,
             int64_t key_id, char path[REG_PATH_MAX], char *err, size_t errlen);

/* An adapter upload's staged files (docs/protocol.md §12.5): the two files, in this order,
 * and the staged name of file i of upload id (blobstore.h: stage_put). */
#define REG_UPLOAD_NFILES 2
extern const char *const reg_upload_files[REG_UPLOAD_NFILES];
void reg_upload_stage_name(const char *upload_id, int i, char out[128]);

/* The record of an adapter upload over HTTP (weight_uploads), in the order of its life:
 * opened (expires ttl_seconds later unless finished; key_id 0: none), each file staged
 * (bytes of reg_upload_files[file]: 1 recorded, 0 when the upload is no longer open,
 * finished or expired), finished with the checkpoint it became. 0 (or 1) or -1 with err.
 * GC drops the ones never finished (reg_gc). */
typedef struct {
    const char *id;
    int64_t tenant_id, key_id;
    const char *base_model;
    const char *lora_config;    /* JSON object text */
    const char *project;        /* NULL: none */
    int64_t ttl_seconds;
} reg_upload_req;
int reg_upload_open(PGconn *c, const reg_upload_req *q, char *err, size_t errlen);
int reg_upload_file_staged(PGconn *c, const char *upload_id, int file, int64_t bytes, char *err, size_t errlen);
int reg_upload_finished(PGconn *c, const char *upload_id, const char *tinker_path, char *err, size_t errlen);

/* ---- an owner's changes ------------------------------------------------------------------
 * The caller found the version with reg_find_owned (the api: the tenant owns it) or is an
 * operator (the CLI). Each runs in the caller's transaction when one is open. 0 or -1
 * with err. */

/* Marks the version deleted; its blob goes at the next GC unless a live version names it. */
int reg_version_delete(PGconn *c, int64_t version_id, char *err, size_t errlen);
/* Makes v public, or private again; then the samples other tenants queued on its adapter
 * and may no longer run fail too (reg_fail_unreadable_samples): run it in a transaction. */
int reg_version_set_public(PGconn *c, const reg_version *v, bool is_public, char *err, size_t errlen);
/* The version expires ttl_seconds from now (< 0: never). */
int reg_version_set_ttl(PGconn *c, int64_t version_id, int64_t ttl_seconds, char *err, size_t errlen);
/* Lets tenant read every version of the adapter (again: no change). reg_revoke withdraws
 * that, and the samples queued on the adapter that may no longer run fail: run it in a
 * transaction. */
int reg_grant(PGconn *c, int64_t adapter_id, int64_t tenant, char *err, size_t errlen);
int reg_revoke(PGconn *c, int64_t adapter_id, int64_t tenant, char *err, size_t errlen);

/* A tenant's alias of one of its checkpoints (the OpenAI routes take it as a model name):
 * set (a new one, or pointed elsewhere), or deleted (1, or 0 when it had none). -1 with err. */
int reg_alias_set(PGconn *c, int64_t tenant, const char *alias, const char *tinker_path, char *err, size_t errlen);
int reg_alias_delete(PGconn *c, int64_t tenant, const char *alias, char *err, size_t errlen);

/* ---- blob locks and GC ---------------------------------------------------------------- */

/* Transaction-scoped advisory locks on one digest: a save takes it shared before it
 * checks the blob and inserts its row; GC takes it exclusive around "no live version
 * references it → remove". So GC never removes a blob a committed or committing version
 * references, and a save that lost its blob to GC notices and stores it again. */
int reg_blob_lock_shared(PGconn *c, const char *digest, char *err, size_t errlen);
int reg_blob_lock(PGconn *c, const char *digest, char *err, size_t errlen);

typedef struct {
    int keep_last;      /* > 0: per run and kind, delete all but the newest keep_last live versions */
    const char *run;    /* NULL: every run */
    bool dry_run;       /* report only */
    /* Also remove orphan blobs (no version row counts on them) and temporary files
     * whose mtime is older than orphan_grace_s, each blob under its exclusive lock. */
    bool sweep_orphans;
    int64_t orphan_grace_s;
} reg_gc_opts;

typedef struct {
    int expired;        /* versions past their TTL, now marked deleted */
    int pruned;         /* versions deleted by keep_last */
    int blobs_removed;
    int blobs_kept;     /* dead versions whose blob a live version still uses */
    int64_t bytes_freed;
    int orphans_removed;   /* orphan blobs removed (also counted in blobs_removed, bytes_freed) */
    int orphans_young;     /* orphan blobs left alone, younger than the grace period */
    int tmp_removed;       /* stale temporary files removed */
    int uploads_expired;   /* adapter uploads not finished in time, dropped with their files */
} reg_gc_stats;

/* One GC pass (no transaction open on c). 0, or -1 with err. The orphan sweep runs
 * after the collection of dead versions' blobs. */
int reg_gc(PGconn *c, blobstore *bs, const reg_gc_opts *o, reg_gc_stats *st, char *err, size_t errlen);

/* After access to an adapter was withdrawn (unpublish, share revoked): fails the sample
 * operations other tenants queued on it and may no longer run. Returns how many, or -1. */
int reg_fail_unreadable_samples(PGconn *c, int64_t adapter_id, char *err, size_t errlen);

/* ---- audit -------------------------------------------------------------------------------- */

/* Appends one audit_log row; details is a JSON object text or NULL. */
int reg_audit(PGconn *c, int64_t tenant, const char *actor, const char *action, const char *object,
              const char *details, char *err, size_t errlen);
/* The same by an API key: the actor is 'key:<its prefix>' ('api' for an unknown key). */
int reg_audit_key(PGconn *c, int64_t tenant, int64_t key_id, const char *action, const char *object,
                  const char *details, char *err, size_t errlen);

/* ---- signed download URLs (docs/protocol.md §17.7) ------------------------------------ */

#define REG_TOKEN_HEX 65
/* HMAC (crypto_auth, key derived from the server secret) over run, checkpoint id,
 * format, expiry (unix seconds) and the id of the API key the link was made for: the
 * download checks again that this key is valid and may still read the checkpoint, so
 * revoking the key, the share or the publication also ends links handed out before. */
void reg_download_sign(const unsigned char secret[32], const char *run, const char *ckpt_id, const char *format,
                       int64_t expires, int64_t key_id, char out[REG_TOKEN_HEX]);
bool reg_download_verify(const unsigned char secret[32], const char *run, const char *ckpt_id, const char *format,
                         int64_t expires, int64_t key_id, const char *token);

/* ---- tar (ustar) ------------------------------------------------------------------------ */

typedef struct {
    const char *name;          /* < 100 ASCII characters, no '/' */
    const uint8_t *data;
    size_t len;
} reg_tar_member;

/* A plain tar of regular files at the root: mode 0644, uid/gid 0, the given mtime.
 * *out is malloc'd. 0, or -1 with err. */
int reg_tar_build(const reg_tar_member *m, int n, int64_t mtime, uint8_t **out, size_t *outlen, char *err,
                  size_t errlen);
