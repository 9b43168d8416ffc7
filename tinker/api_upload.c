/* api_upload.c: adapter import over HTTP (docs/protocol.md §12.7; SDK 0.39, experimental):
 *
 *   POST external_weights_upload_start {base_model, lora_config, destination_project_id}
 *     -> {upload_id, urls: {file: signed PUT url}, expires}
 *   PUT  <url> (no key: the link is the credential) with the file's bytes, per file
 *   POST external_weights_upload_finish {upload_id} -> {tinker_path}
 *
 * The files are the pair `loom adapter import` takes (adapter_config.json and
 * adapter_model.safetensors, PEFT or Tinker naming) and go through the same code: the
 * validation and conversion of model/adapter_io.c (adapter_io_import) and the registry's
 * reg_import. A PUT's body never reaches a worker's heap: its event loop checks the
 * link's signature and writes the body to a staged file in the blob store
 * (api_upload_stage, the route's stage hook, called by core/http_server.c), and the
 * worker records it. Bodies are bounded before they are read (h2o refuses a
 * Content-Length over --max-body-mb with 413),
 * adapter_config.json to 1 MiB more. _finish maps the staged files (page cache, not the
 * heap), imports them as tinker://<upload id>/sampler_weights/imported and removes them.
 * An upload not finished within UPLOAD_TTL_S expires: the registry GC drops it and its
 * staged files (reg_gc). Quotas: a tenant has at most UPLOAD_MAX_OPEN open uploads, and
 * the import must fit its checkpoint storage limit. */
#include "tinker/api_upload.h"
#include "common/db.h"
#include "common/log.h"
#include "model/adapter_io.h"
#include "model/model.h"
#include "registry/registry.h"
#include "core/api_json.h"
#include "tinker/api_ops.h"
#include "tinker/api_sql.h"
#include "tinker/api_upload_sql.h"
#include "tinker/api_weights.h"
#include "tinker/api_state.h"
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define UPLOAD_TTL_S 3600          /* an upload's links, and the upload itself, live this long */
#define UPLOAD_MAX_OPEN 4          /* open (unfinished, unexpired) uploads per tenant */
#define UPLOAD_NAME "imported"     /* the checkpoint name of an upload: <upload id>/sampler_weights/imported */
#define UPLOAD_ID_LEN 36           /* "upl-" + 32 hex */

static const size_t FILE_MAX[REG_UPLOAD_NFILES] = {ADAPTER_IMPORT_MAX_CONFIG, ADAPTER_IMPORT_MAX_WEIGHTS};

static bool upload_id_valid(const char *id) {
    if (strlen(id) != UPLOAD_ID_LEN || strncmp(id, "upl-", 4)) return false;
    for (const char *p = id + 4; *p; p++)
        if (!strchr("0123456789abcdef", *p)) return false;
    return true;
}

static int file_index(const char *name) {
    for (int i = 0; i < REG_UPLOAD_NFILES; i++)
        if (!strcmp(name, reg_upload_files[i])) return i;
    return -1;
}

/* A PUT link: "<expires>/<token>/<key id>/<upload id>/<file>", signed like the download
 * links (registry.h: reg_download_sign) over (upload id, file, "upload", expiry, key). */
typedef struct {
    long long expires, key_id;
    char token[REG_TOKEN_HEX + 1], id[UPLOAD_ID_LEN + 1];
    int file;
} put_link;

/* 0, or an HTTP status with msg. Signature, expiry and file name only: what the loop can
 * check without the database. */
static int parse_link(const char *arg, size_t n, put_link *l, char *msg, size_t msglen) {
    char buf[512], *seg[6];
    if (n >= sizeof buf) return snprintf(msg, msglen, "no such upload link"), 404;
    memcpy(buf, arg, n);
    buf[n] = 0;
    int k = 0;
    for (char *s = buf, *save = NULL, *t; k < 6 && (t = strtok_r(s, "/", &save)); s = NULL) seg[k++] = t;
    char *e1, *e2;
    if (k != 5) return snprintf(msg, msglen, "no such upload link"), 404;
    l->expires = strtoll(seg[0], &e1, 10);
    l->key_id = strtoll(seg[2], &e2, 10);
    l->file = file_index(seg[4]);
    if (*e1 || *e2 || strlen(seg[1]) != REG_TOKEN_HEX - 1 || !upload_id_valid(seg[3]) || l->file < 0)
        return snprintf(msg, msglen, "invalid upload link (the files are %s and %s)", reg_upload_files[0],
                        reg_upload_files[1]), 403;
    snprintf(l->token, sizeof l->token, "%s", seg[1]);
    snprintf(l->id, sizeof l->id, "%s", seg[3]);
    const unsigned char *secret = api_link_secret();
    if (!secret || !reg_download_verify(secret, l->id, seg[4], "upload", l->expires, l->key_id, l->token))
        return snprintf(msg, msglen, "invalid upload link (bad signature)"), 403;
    if (l->expires < (long long)time(NULL))
        return snprintf(msg, msglen, "this upload link has expired; start a new upload"), 403;
    return 0;
}

int api_upload_stage(const char *arg, size_t arglen, const void *body, size_t len, char *msg, size_t msglen) {
    put_link l;
    int st = parse_link(arg, arglen, &l, msg, msglen);
    if (st) return st;
    if (len > FILE_MAX[l.file])
        return snprintf(msg, msglen, "%s: %zu bytes, more than the %zu allowed", reg_upload_files[l.file], len,
                        FILE_MAX[l.file]), 413;
    blobstore *bs = api_blobs();
    if (!bs) return snprintf(msg, msglen, "uploads need the registry blob store (loom api --blob-dir)"), 503;
    char name[128], err[512];
    reg_upload_stage_name(l.id, l.file, name);
    if (blob_stage_put(bs, name, body, len, err, sizeof err) < 0) {
        log_error("upload %s: %s", l.id, err);
        return snprintf(msg, msglen, "the upload could not be stored: %s", err), 507;
    }
    return 0;
}

int api_upload_gate_check(const char *method, size_t mlen, const char *path, size_t plen, size_t len,
                          int64_t *key_id, char *msg, size_t msglen) {
    static const char route[] = "/api/v1/external_weights_uploads/";
    if (mlen != 3 || memcmp(method, "PUT", 3) != 0) return 1;
    const char *q = memchr(path, '?', plen);
    if (q) plen = (size_t)(q - path);
    const char *at = memmem(path, plen, route, sizeof route - 1);
    if (!at) return 1;
    const char *arg = at + sizeof route - 1;
    put_link l;
    int st = parse_link(arg, plen - (size_t)(arg - path), &l, msg, msglen);
    if (st) return st;
    if (len > FILE_MAX[l.file])
        return snprintf(msg, msglen, "%s: %zu bytes, more than the %zu allowed", reg_upload_files[l.file], len,
                        FILE_MAX[l.file]), 413;
    *key_id = l.key_id;
    return 0;
}

/* ---- PUT <link> (the worker's half) ------------------------------------------------------ */

int api_h_upload_put(api_call *c) {
    const char *arg = c->job->path_arg ? c->job->path_arg : "";
    put_link l;
    int st = parse_link(arg, strlen(arg), &l, c->err, sizeof c->err);
    if (st) return api_error(c, st, "%s", c->err);
    blobstore *bs = api_blobs();
    char name[128], k[24], why[512];
    reg_upload_stage_name(l.id, l.file, name);
    api_fmt_i64(k, l.key_id);
    const char *p[2] = {l.id, k};
    PGresult *r = db_query(c->db, SQL_UPL_FOR_PUT, 2, p, c->err, sizeof c->err);
    if (!r) {
        blob_stage_remove(bs, name, why, sizeof why);
        return api_db_error(c, "upload", c->err);
    }
    st = PQntuples(r) == 0 ? 404 : !db_bool(r, 0, 2) ? 403 : !db_bool(r, 0, 1) ? 409 : 0;
    PQclear(r);
    const void *data;
    size_t n = 0;
    if (!st && blob_stage_map(bs, name, FILE_MAX[l.file], &data, &n, why, sizeof why) < 0) st = 500;
    if (!st) {
        blob_stage_unmap(data, n);
        int staged = reg_upload_file_staged(c->db, l.id, l.file, (int64_t)n, c->err, sizeof c->err);
        if (staged < 0) {
            blob_stage_remove(bs, name, why, sizeof why);
            return api_db_error(c, "upload", c->err);
        }
        st = staged ? 0 : 409;
    }
    if (st) blob_stage_remove(bs, name, why, sizeof why);   /* a refused PUT keeps no bytes */
    switch (st) {
    case 0:
        return api_reply_json(c, 200, json_pack("{s:s, s:s, s:I}", "upload_id", l.id, "file",
                                                reg_upload_files[l.file], "size_bytes", (json_int_t)n));
    case 404: return api_error(c, 404, "upload %s not found (it expired and was dropped)", l.id);
    case 403:
        return api_error(c, 403, "the API key this upload link was made for has been revoked or has expired");
    case 409: return api_error(c, 409, "upload %s is finished or has expired; start a new upload", l.id);
    default: return api_error(c, 500, "upload %s: the staged file cannot be read: %s", l.id, why);
    }
}

/* ---- external_weights_upload_start ------------------------------------------------------- */

/* LoraConfig as the client declares it: rank and the module flags, each optional;
 * anything else is 400. The import checks the files against what is given. */
static int check_lora_config(api_call *c, const json_t *lc) {
    if (!lc || json_is_null(lc)) return 0;
    if (!json_is_object(lc)) return api_error(c, 400, "lora_config: expected an object, got %s", jx_type_name(lc)), -1;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)lc, key, v) {
        if (!strcmp(key, "rank")) {
            int64_t rank;
            if (!jx_as_int(v, &rank) || rank < 1 || rank > 4096)
                return api_error(c, 400, "lora_config.rank: expected an integer 1 .. 4096"), -1;
        } else if (!strcmp(key, "train_attn") || !strcmp(key, "train_mlp") || !strcmp(key, "train_unembed")) {
            if (!json_is_boolean(v) && !json_is_null(v))
                return api_error(c, 400, "lora_config.%s: expected true or false", key), -1;
        } else if (strcmp(key, "seed") && strcmp(key, "type")) {
            return api_error(c, 400, "lora_config.%.60s: unknown field (rank, train_attn, train_mlp, train_unembed)",
                             key), -1;
        }
    }
    return 0;
}

int api_h_upload_start(api_call *c) {
    const char *base, *project;
    if (jx_req_str(c->body, "", "base_model", &base, c->err, sizeof c->err) < 0 ||
        jx_str(c->body, "", "destination_project_id", &project, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    const json_t *lc = json_object_get(c->body, "lora_config");
    if (check_lora_config(c, lc) < 0) return 0;
    blobstore *bs = api_blobs();
    const unsigned char *secret = api_link_secret();
    if (!bs || !secret) return api_error(c, 503, "uploads need the registry blob store (loom api --blob-dir)");
    const char *pb[1] = {base};
    PGresult *r = db_query(c->db, SQL_UPL_BASE_CONFIG, 1, pb, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "external_weights_upload_start", c->err);
    bool known = PQntuples(r) > 0;
    PQclear(r);
    if (!known) return api_error(c, 400, "base_model: unknown base model \"%.200s\" (get_server_capabilities lists "
                                         "the ones this server serves)", base);
    char tid[24], lim[24];
    api_fmt_i64(tid, c->tenant_id);
    api_fmt_i64(lim, UPLOAD_MAX_OPEN);
    const char *po[2] = {tid, lim};
    if (!(r = db_query(c->db, SQL_UPL_OPEN_COUNT, 2, po, c->err, sizeof c->err)))
        return api_db_error(c, "external_weights_upload_start", c->err);
    bool full = db_int(r, 0, 0) >= UPLOAD_MAX_OPEN;
    PQclear(r);
    if (full) {
        c->job->retry_after = 60;
        return api_error(c, 429, "this tenant has %d uploads open (the limit): finish them, or wait until they "
                                 "expire (%d s after their start)", UPLOAD_MAX_OPEN, UPLOAD_TTL_S);
    }
    int st = op_check_storage(c->db, c->tenant_id, c->err, sizeof c->err);
    if (st < 0) return api_db_error(c, "external_weights_upload_start", c->err);
    if (st > 0) return api_error(c, st, "%s", c->err);

    unsigned char rnd[16];
    randombytes_buf(rnd, sizeof rnd);
    char id[UPLOAD_ID_LEN + 1] = "upl-";
    sodium_bin2hex(id + 4, sizeof id - 4, rnd, sizeof rnd);
    char *lcs = lc && json_is_object(lc) ? json_dumps(lc, JSON_COMPACT) : NULL;
    reg_upload_req q = {.id = id, .tenant_id = c->tenant_id, .key_id = c->key_id, .base_model = base,
                        .lora_config = lcs ? lcs : "{}", .project = project, .ttl_seconds = UPLOAD_TTL_S};
    int rc = reg_upload_open(c->db, &q, c->err, sizeof c->err);
    free(lcs);
    if (rc < 0) return api_db_error(c, "external_weights_upload_start", c->err);

    time_t expires = time(NULL) + UPLOAD_TTL_S;
    struct tm tm;
    char exp_iso[32];
    gmtime_r(&expires, &tm);
    strftime(exp_iso, sizeof exp_iso, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *urls = json_object();
    for (int i = 0; i < REG_UPLOAD_NFILES; i++) {
        char token[REG_TOKEN_HEX], url[1536];
        reg_download_sign(secret, id, reg_upload_files[i], "upload", (int64_t)expires, c->key_id, token);
        snprintf(url, sizeof url, "%s/api/v1/external_weights_uploads/%lld/%s/%lld/%s/%s",
                 c->job->base_url ? c->job->base_url : "", (long long)expires, token, (long long)c->key_id, id,
                 reg_upload_files[i]);
        json_object_set_new(urls, reg_upload_files[i], json_string(url));
    }
    return api_reply_json(c, 200, json_pack("{s:s, s:o, s:s, s:s}", "upload_id", id, "urls", urls, "expires", exp_iso,
                                            "method", "PUT"));
}

/* ---- external_weights_upload_finish ------------------------------------------------------ */

/* The client's lora_config against what the files say: each field given must match. */
static int match_lora_config(api_call *c, const char *declared, const adapter_io_info *info) {
    json_t *lc = json_loads(declared, 0, NULL);
    int64_t rank;
    int rc = 0;
    const json_t *rv = json_object_get(lc, "rank");
    if (rv && jx_as_int(rv, &rank) && rank != info->cfg.rank)
        rc = (api_error(c, 400, "lora_config.rank is %lld but the uploaded adapter has rank %d", (long long)rank,
                        info->cfg.rank), -1);
    static const char *const flags[3] = {"train_attn", "train_mlp", "train_unembed"};
    const bool have[3] = {info->cfg.train_attn, info->cfg.train_mlp, info->cfg.train_unembed};
    for (int i = 0; i < 3 && rc == 0; i++) {
        const json_t *f = json_object_get(lc, flags[i]);
        if (json_is_boolean(f) && json_is_true(f) != have[i])
            rc = (api_error(c, 400, "lora_config.%s is %s but the uploaded adapter %s", flags[i],
                            json_is_true(f) ? "true" : "false",
                            have[i] ? "has those modules" : "has none of those modules"), -1);
    }
    json_decref(lc);
    return rc;
}

/* Storage: the import must fit the tenant's checkpoint limit. 0, 400 answered, -1. */
static int fits_storage(api_call *c, size_t blen) {
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *p[1] = {tid};
    PGresult *r = db_query(c->db, SQL_TENANT_STORAGE, 1, p, c->err, sizeof c->err);
    if (!r) return -1;
    int st = 0;
    if (PQntuples(r) > 0 && db_int(r, 0, 1) + (int64_t)blen > db_int(r, 0, 0))
        st = (api_error(c, 400, "the imported adapter (%zu bytes) does not fit this tenant's checkpoint storage "
                                "limit of %lld bytes (%lld bytes live; loom tenant set-limits --max-checkpoint-bytes): "
                                "delete checkpoints first", blen, (long long)db_int(r, 0, 0), (long long)db_int(r, 0, 1)),
              400);
    PQclear(r);
    return st;
}

static void remove_staged(blobstore *bs, const char *id) {
    char name[128], why[512];
    for (int i = 0; i < REG_UPLOAD_NFILES; i++) {
        reg_upload_stage_name(id, i, name);
        if (blob_stage_remove(bs, name, why, sizeof why) < 0) log_warn("upload %s: %s", id, why);
    }
}

int api_h_upload_finish(api_call *c) {
    const char *id;
    if (jx_req_str(c->body, "", "upload_id", &id, c->err, sizeof c->err) < 0) return api_error(c, 400, "%s", c->err);
    if (!upload_id_valid(id)) return api_error(c, 404, "upload %.100s not found", id);
    blobstore *bs = api_blobs();
    if (!bs) return api_error(c, 503, "uploads need the registry blob store (loom api --blob-dir)");
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *p[2] = {id, tid};
    PGresult *r = db_query(c->db, SQL_UPL_GET, 2, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "external_weights_upload_finish", c->err);
    if (PQntuples(r) == 0) {
        PQclear(r);
        return api_error(c, 404, "upload %s not found (unknown, another tenant's, or expired and dropped)", id);
    }
    if (!PQgetisnull(r, 0, 5)) {   /* finished before: a retry */
        json_t *ans = json_pack("{s:s}", "tinker_path", PQgetvalue(r, 0, 5));
        PQclear(r);
        return api_reply_json(c, 200, ans);
    }
    if (!db_bool(r, 0, 4)) {
        PQclear(r);
        return api_error(c, 404, "upload %s has expired (uploads must finish within %d s); start a new one", id,
                         UPLOAD_TTL_S);
    }
    char base[256], *declared = strdup(PQgetvalue(r, 0, 1)), *files = strdup(PQgetvalue(r, 0, 3));
    snprintf(base, sizeof base, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    json_t *fj = json_loads(files, 0, NULL);
    free(files);
    for (int i = 0; i < REG_UPLOAD_NFILES; i++)
        if (!json_object_get(fj, reg_upload_files[i])) {
            json_decref(fj);
            free(declared);
            return api_error(c, 400, "%s was not uploaded: PUT it to its link from external_weights_upload_start "
                                     "first", reg_upload_files[i]);
        }
    json_decref(fj);

    const char *pb[1] = {base};
    model_config mc;
    if (!(r = db_query(c->db, SQL_UPL_BASE_CONFIG, 1, pb, c->err, sizeof c->err))) {
        free(declared);
        return api_db_error(c, "external_weights_upload_finish", c->err);
    }
    int rc = PQntuples(r) ? model_config_parse(PQgetvalue(r, 0, 0), &mc, c->err, sizeof c->err) : -1;
    if (!PQntuples(r)) snprintf(c->err, sizeof c->err, "base model %.200s is no longer served here", base);
    PQclear(r);
    if (rc < 0) {
        free(declared);
        return api_error(c, 400, "%s", c->err);
    }
    /* The staged files, mapped (not read into the heap); the config must end in a NUL for
     * the JSON parser, so it is copied (at most 1 MiB). */
    const void *data[REG_UPLOAD_NFILES] = {NULL, NULL};
    size_t len[REG_UPLOAD_NFILES] = {0, 0};
    char *cfg_text = NULL, why[512];
    uint8_t *blob = NULL;
    size_t blen = 0;
    adapter_io_info info;
    int st = 0;
    for (int i = 0; i < REG_UPLOAD_NFILES && !st; i++) {
        char name[128];
        reg_upload_stage_name(id, i, name);
        if (blob_stage_map(bs, name, FILE_MAX[i], &data[i], &len[i], why, sizeof why) < 0)
            st = (api_error(c, 400, "%s: %s (upload it again)", reg_upload_files[i], why), 400);
    }
    if (!st) {
        cfg_text = malloc(len[0] + 1);
        if (!cfg_text) abort();
        memcpy(cfg_text, data[0], len[0]);
        cfg_text[len[0]] = 0;
        /* the same validation and conversion as `loom adapter import` */
        if (adapter_io_import(&mc, cfg_text, data[1], len[1], &blob, &blen, &info, why, sizeof why) < 0)
            st = (api_error(c, 400, "the uploaded adapter cannot be imported for %s: %s", base, why), 400);
    }
    for (int i = 0; i < REG_UPLOAD_NFILES; i++) blob_stage_unmap(data[i], len[i]);
    if (!st && match_lora_config(c, declared, &info) < 0) st = 400;
    if (!st && (st = fits_storage(c, blen)) < 0) st = (api_db_error(c, "external_weights_upload_finish", c->err), 503);
    char digest[BLOB_DIGEST_HEX], path[REG_PATH_MAX], source[64];
    if (!st && blob_put(bs, blob, blen, digest, why, sizeof why) < 0) {
        log_error("upload %s: %s", id, why);
        st = (api_error(c, 500, "the imported adapter could not be stored: %s", why), 500);
    }
    if (!st) {
        snprintf(source, sizeof source, "upload:%s", id);
        reg_import_req q = {.tenant_id = c->tenant_id, .run = id, .name = UPLOAD_NAME, .base_model = base,
                            .rank = info.cfg.rank, .train_attn = info.cfg.train_attn, .train_mlp = info.cfg.train_mlp,
                            .train_unembed = info.cfg.train_unembed, .digest = digest, .size_bytes = (int64_t)blen,
                            .source = source, .source_config = cfg_text, .actor = "api", .key_id = c->key_id};
        rc = reg_import(c->db, bs, &q, blob, blen, path, c->err, sizeof c->err);
        /* 409: this upload's checkpoint exists already (a concurrent finish, or one whose
         * end was not recorded): its path is the answer, and the upload is finished. */
        if (rc < 0) {
            st = (api_db_error(c, "external_weights_upload_finish", c->err), 503);
        } else {
            if (rc == 409) snprintf(path, sizeof path, "tinker://%s/sampler_weights/%s", id, UPLOAD_NAME);
            if (reg_upload_finished(c->db, id, path, c->err, sizeof c->err) < 0)
                log_error("upload %s: recording its end: %s", id, c->err);
        }
    }
    free(blob);
    free(cfg_text);
    free(declared);
    if (st) return 0;
    remove_staged(bs, id);
    if (rc == 409) {
        log_info("upload %s: its checkpoint %s was there already", id, path);
    } else {
        log_info("upload %s: imported %s (rank %d, %zu bytes)", id, path, info.cfg.rank, blen);
    }
    return api_reply_json(c, 200, json_pack("{s:s}", "tinker_path", path));
}
