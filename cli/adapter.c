/* adapter.c: `loom adapter list|show|lineage|export|import|share|publish|delete|gc`.
 * Talks to PostgreSQL directly and to the blob store, both found as every command finds
 * them (common/config.h). Every security-relevant change (share, publish, delete,
 * import) writes audit_log. */
#include "cli/adapter.h"
#include "cli/cli.h"
#include "cli/cli_sql.h"
#include "common/db.h"
#include "common/keys.h"
#include "model/adapter_io.h"
#include "model/model.h"
#include "registry/blobstore.h"
#include "registry/registry.h"
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DB_OPTS CFG_DB, CFG_DATA_DIR
static const opt_spec LIST_OPTS[] = {
    {.name = "tenant", .kind = OPT_STR, .arg = "NAME", .help = "only this tenant's"},
    {.name = "run", .kind = OPT_STR, .arg = "RUN", .help = "only this run's (its model id)"},
    {.name = "deleted", .kind = OPT_FLAG, .help = "deleted and expired ones too"},
    {0}};
static const opt_spec EXPORT_OPTS[] = {
    {.name = "out", .kind = OPT_STR, .arg = "FILE.tar", .required = true, .help = "where to write the archive"},
    {.name = "format", .kind = OPT_STR, .arg = "tinker|peft", .def = "tinker", .help = "key names (peft: lm_head)"},
    {.name = "no-head", .kind = OPT_FLAG, .help = "leave the output head's LoRA out"},
    {0}};
static const opt_spec IMPORT_OPTS[] = {
    {.name = "tenant", .kind = OPT_STR, .arg = "NAME", .required = true, .help = "the owner (it must exist)"},
    {.name = "base-model", .kind = OPT_STR, .arg = "NAME", .required = true, .help = "a base model executors serve"},
    {.name = "run", .kind = OPT_STR, .arg = "RUN", .required = true, .help = "the run name of the checkpoint path"},
    {.name = "name", .kind = OPT_STR, .arg = "NAME", .required = true, .help = "the checkpoint name"},
    {0}};
static const opt_spec SHARE_OPTS[] = {
    {.name = "tenant", .kind = OPT_STR, .arg = "NAME", .required = true, .help = "who may read the run"},
    {.name = "revoke", .kind = OPT_FLAG, .help = "withdraw the grant instead"},
    {0}};
static const opt_spec PUBLISH_OPTS[] = {{.name = "undo", .kind = OPT_FLAG, .help = "make it private again"}, {0}};
/* `loom adapter gc` reads section [gc] of the config file (the systemd timer's pass). */
static const opt_spec GC_OPTS[] = {
    {.name = "keep-last", .kind = OPT_INT, .arg = "K", .lo = 1, .hi = 1000000,
     .help = "also delete all but the last K versions per run and kind"},
    {.name = "run", .kind = OPT_STR, .arg = "RUN", .help = "only this run (orphan blobs are left alone)"},
    {.name = "dry-run", .kind = OPT_FLAG, .help = "report what would go"},
    {.name = "orphan-grace-s", .kind = OPT_INT, .arg = "S", .def = "3600", .lo = 0, .hi = 3153600000L,
     .help = "orphan blobs and temporary files younger than this stay"},
    {.name = "every", .kind = OPT_INT, .arg = "S", .lo = 1, .hi = 31536000,
     .help = "a pass every S seconds until killed (default: one pass)"},
    {0}};

static const cfg_cmd LIST_CMD = {.cmd = "loom adapter list", .about = "Checkpoints of every tenant (live ones).",
                                 .tables = {LIST_OPTS, DB_OPTS}};
static const cfg_cmd SHOW_CMD = {.cmd = "loom adapter show", .synopsis = "PATH [options]",
                                 .about = "One version (tinker://RUN/KIND/NAME) with its provenance and grants.",
                                 .tables = {DB_OPTS}, .min_pos = 1, .max_pos = 1, .pos_name = "PATH"};
static const cfg_cmd LINEAGE_CMD = {.cmd = "loom adapter lineage", .synopsis = "PATH [options]",
                                    .about = "A version's ancestors, nearest first.",
                                    .tables = {DB_OPTS}, .min_pos = 1, .max_pos = 1, .pos_name = "PATH"};
static const cfg_cmd EXPORT_CMD = {.cmd = "loom adapter export", .synopsis = "PATH --out FILE.tar [options]",
                                   .about = "Writes the checkpoint archive (the one downloads give).",
                                   .tables = {EXPORT_OPTS, DB_OPTS, CFG_BLOBS}, .min_pos = 1, .max_pos = 1,
                                   .pos_name = "PATH"};
static const cfg_cmd IMPORT_CMD = {
    .cmd = "loom adapter import", .synopsis = "DIR|ARCHIVE --tenant T --base-model M --run R --name N [options]",
    .about = "Brings a PEFT or Tinker adapter in as tinker://R/sampler_weights/N: a directory, or a tar (plain,\n"
             "gzip, xz, zstd or bzip2) with adapter_config.json and adapter_model.safetensors at its root or\n"
             "in one folder.",
    .tables = {IMPORT_OPTS, DB_OPTS, CFG_BLOBS}, .min_pos = 1, .max_pos = 1, .pos_name = "DIR|ARCHIVE"};
static const cfg_cmd SHARE_CMD = {.cmd = "loom adapter share", .synopsis = "RUN --tenant NAME [options]",
                                  .about = "Grants (or revokes) read access to a run's checkpoints.",
                                  .tables = {SHARE_OPTS, DB_OPTS}, .min_pos = 1, .max_pos = 1, .pos_name = "RUN"};
static const cfg_cmd PUBLISH_CMD = {.cmd = "loom adapter publish", .synopsis = "PATH [options]",
                                    .about = "Makes a checkpoint public (or private again).",
                                    .tables = {PUBLISH_OPTS, DB_OPTS}, .min_pos = 1, .max_pos = 1,
                                    .pos_name = "PATH"};
static const cfg_cmd DELETE_CMD = {.cmd = "loom adapter delete", .synopsis = "PATH [options]",
                                   .about = "Deletes a checkpoint (its blob goes at the next gc).",
                                   .tables = {DB_OPTS}, .min_pos = 1, .max_pos = 1, .pos_name = "PATH"};
static const cfg_cmd GC_CMD = {
    .cmd = "loom adapter gc", .section = "gc",
    .about = "Expires versions past their TTL, prunes (--keep-last), removes blobs no live version uses,\n"
             "and orphan blobs and temporary files older than --orphan-grace-s.",
    .tables = {GC_OPTS, DB_OPTS, CFG_BLOBS}};

static blobstore *open_blobs(const cfg *o) {
    char dir[PATH_MAX], err[512];
    cfg_blob_dir(o, dir, sizeof dir);
    blobstore *s = blob_open_dir(dir, err, sizeof err);
    if (!s) {
        fprintf(stderr, "%s: blob store %s: %s\n", o->cmd->cmd, dir, err);
        exit(1);
    }
    return s;
}

/* The live version at path (any tenant). */
static int find_path(const cfg *o, PGconn *c, const char *path, reg_version *v) {
    char err[512];
    reg_path rp;
    if (reg_path_parse(path, &rp, err, sizeof err) < 0 || reg_find_live(c, path, v, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", o->cmd->cmd, err);
        return -1;
    }
    return 0;
}

/* ---- list / show / lineage ---------------------------------------------------------------- */


static int cmd_list(const cfg *o) {
    PGconn *c = cli_connect(o);
    char err[512];
    int64_t tid;
    if (cfg_str(o, "tenant") && keys_tenant_find(c, cfg_str(o, "tenant"), &tid, err, sizeof err) < 0)
        return cli_fail(o, c, "%s", err);
    const char *p[3] = {cfg_str(o, "tenant"), cfg_str(o, "run"), cfg_flag(o, "deleted") ? "t" : "f"};
    PGresult *r = db_query(c, SQL_CLI_LIST, 3, p, err, sizeof err);
    if (!r) return cli_fail(o, c, "%s", err);
    printf("%-10s %-8s %8s %10s %-7s %-19s %-19s %-7s %s\n", "tenant", "kind", "step", "bytes", "public", "created",
           "expires", "state", "path");
    for (int i = 0; i < PQntuples(r); i++)
        printf("%-10s %-8s %8s %10s %-7s %-19s %-19s %-7s %s\n", PQgetvalue(r, i, 0), PQgetvalue(r, i, 2),
               PQgetvalue(r, i, 3), PQgetvalue(r, i, 4), strcmp(PQgetvalue(r, i, 5), "public") ? "no" : "yes",
               PQgetvalue(r, i, 6), PQgetvalue(r, i, 7), PQgetvalue(r, i, 8), PQgetvalue(r, i, 1));
    PQclear(r);
    PQfinish(c);
    return 0;
}

static int cmd_show(const cfg *o) {
    const char *path = o->pos[0];
    PGconn *c = cli_connect(o);
    char err[512];
    const char *p[1] = {path};
    PGresult *r = db_query(c, SQL_CLI_SHOW, 1, p, err, sizeof err);
    if (!r) return cli_fail(o, c, "%s", err);
    if (!PQntuples(r)) { PQclear(r); return cli_fail(o, c, "no checkpoint %s", path); }
    json_t *j = json_loads(PQgetvalue(r, 0, 0), 0, NULL);
    cli_print_json(j);
    json_decref(j);
    PQclear(r);
    PQfinish(c);
    return 0;
}

static int cmd_lineage(const cfg *o) {
    const char *path = o->pos[0];
    PGconn *c = cli_connect(o);
    char err[512];
    const char *p[1] = {path};
    PGresult *r = db_query(c, SQL_CLI_LINEAGE, 1, p, err, sizeof err);
    if (!r) return cli_fail(o, c, "%s", err);
    if (!PQntuples(r)) { PQclear(r); return cli_fail(o, c, "no checkpoint %s", path); }
    for (int i = 0; i < PQntuples(r); i++)
        printf("%s%s  %s step %s  ops %s..%s  %s tokens  %s%s\n", i ? "  <- " : "", PQgetvalue(r, i, 1),
               PQgetvalue(r, i, 2), PQgetvalue(r, i, 3), PQgetvalue(r, i, 5), PQgetvalue(r, i, 6),
               PQgetvalue(r, i, 7), PQgetvalue(r, i, 4), PQgetvalue(r, i, 8));
    PQclear(r);
    PQfinish(c);
    return 0;
}

/* ---- export / import ------------------------------------------------------------------- */

static int write_file(const char *path, const void *data, size_t n, char *err, size_t errlen) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) { snprintf(err, errlen, "%s: cannot create", tmp); return -1; }
    bool ok = fwrite(data, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) { unlink(tmp); snprintf(err, errlen, "%s: write failed", path); return -1; }
    return 0;
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(len > 0 ? (size_t)len + 1 : 1);
    if (b && len > 0 && fread(b, 1, (size_t)len, f) != (size_t)len) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[len > 0 ? len : 0] = 0; *n = len > 0 ? (size_t)len : 0; }
    return b;
}

static int cmd_export(const cfg *o) {
    const char *path = o->pos[0], *out = cfg_str(o, "out"), *fmt = cfg_str(o, "format");
    if (strcmp(fmt, "tinker") && strcmp(fmt, "peft"))
        return cfg_usage_error(o->cmd, "--format is tinker or peft, got '%s'", fmt);
    bool peft = !strcmp(fmt, "peft");
    PGconn *c = cli_connect(o);
    reg_version v;
    if (find_path(o, c, path, &v) < 0) { PQfinish(c); return 1; }
    blobstore *bs = open_blobs(o);
    char err[512];
    void *blob;
    size_t n;
    if (blob_get(bs, v.digest, &blob, &n, err, sizeof err) < 0) return cli_fail(o, c, "%s", err);
    adapter_export ex;
    if (adapter_io_export(blob, n, peft ? ADAPTER_EXPORT_PEFT : ADAPTER_EXPORT_TINKER, v.base_model,
                          !cfg_flag(o, "no-head"), &ex, err, sizeof err) < 0)
        return cli_fail(o, c, "%s", err);
    free(blob);
    reg_tar_member m[5];
    for (int i = 0; i < ex.n; i++) m[i] = (reg_tar_member){ex.files[i].name, ex.files[i].data, ex.files[i].len};
    uint8_t *tar;
    size_t tl;
    int rc = reg_tar_build(m, ex.n, v.created_epoch, &tar, &tl, err, sizeof err);
    adapter_export_free(&ex);
    if (rc < 0 || write_file(out, tar, tl, err, sizeof err) < 0) return cli_fail(o, c, "%s", err);
    free(tar);
    char details[128];
    snprintf(details, sizeof details, "{\"format\": \"%s\", \"bytes\": %zu}", peft ? "peft" : "tinker", tl);
    if (reg_audit(c, v.tenant_id, "cli", "checkpoint.export", v.tinker_path, details, err, sizeof err) < 0)
        fprintf(stderr, "%s: audit: %s\n", o->cmd->cmd, err);
    printf("wrote %s (%zu bytes, %s format)\n", out, tl, peft ? "peft" : "tinker");
    PQfinish(c);
    blob_close(bs);
    return 0;
}

/* One member of an archive into memory, at most max bytes. */
static int read_member(struct archive *ar, struct archive_entry *e, size_t max, uint8_t **out, size_t *n, char *err,
                       size_t errlen) {
    const char *name = archive_entry_pathname(e);
    if (archive_entry_size_is_set(e) && (uint64_t)archive_entry_size(e) > max) {
        snprintf(err, errlen, "%s: %lld bytes, more than the %zu allowed", name, (long long)archive_entry_size(e), max);
        return -1;
    }
    size_t cap = archive_entry_size_is_set(e) ? (size_t)archive_entry_size(e) + 1 : 65536, len = 0;
    uint8_t *b = malloc(cap);
    for (;;) {
        if (!b) { snprintf(err, errlen, "%s: out of memory", name); return -1; }
        if (len + 1 >= cap) {
            uint8_t *nb = cap > max ? NULL : realloc(b, cap * 2);
            if (!nb) {
                free(b);
                snprintf(err, errlen, "%s: more than the %zu bytes allowed, or out of memory", name, max);
                return -1;
            }
            b = nb;
            cap *= 2;
        }
        la_ssize_t got = archive_read_data(ar, b + len, cap - 1 - len);
        if (got < 0) {
            snprintf(err, errlen, "%s: %s", name, archive_error_string(ar));
            free(b);
            return -1;
        }
        if (got == 0) break;
        len += (size_t)got;
        if (len > max) {
            snprintf(err, errlen, "%s: more than the %zu bytes allowed", name, max);
            free(b);
            return -1;
        }
    }
    b[len] = 0;
    *out = b;
    *n = len;
    return 0;
}

/* adapter_config.json and adapter_model.safetensors from an archive libarchive reads (a
 * tar of any flavour, compressed or not), at its root or in one folder: the two must sit
 * side by side, and only one pair may be there. */
static int read_archive(const char *src, uint8_t *files[2], size_t sizes[2], char *err, size_t errlen) {
    static const char *const want[2] = {"adapter_config.json", "adapter_model.safetensors"};
    static const size_t max[2] = {ADAPTER_IMPORT_MAX_CONFIG, ADAPTER_IMPORT_MAX_WEIGHTS};
    char where[2][PATH_MAX] = {"", ""};
    struct archive *ar = archive_read_new();
    archive_read_support_filter_all(ar);
    archive_read_support_format_tar(ar);
    int rc = -1;
    if (archive_read_open_filename(ar, src, 1 << 16) != ARCHIVE_OK) {
        snprintf(err, errlen, "%s: %s", src, archive_error_string(ar));
        goto out;
    }
    struct archive_entry *e;
    int r;
    while ((r = archive_read_next_header(ar, &e)) == ARCHIVE_OK) {
        if (archive_entry_filetype(e) != AE_IFREG) continue;
        const char *path = archive_entry_pathname(e), *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
        for (int k = 0; k < 2; k++) {
            if (strcmp(base, want[k])) continue;
            if (files[k]) {
                snprintf(err, errlen, "%s: more than one %s (%s, %s): which adapter is meant?", src, want[k],
                         where[k], path);
                goto out;
            }
            snprintf(where[k], sizeof where[k], "%s", path);
            if (read_member(ar, e, max[k], &files[k], &sizes[k], err, errlen) < 0) goto out;
        }
    }
    if (r != ARCHIVE_EOF) {
        snprintf(err, errlen, "%s: %s", src, archive_error_string(ar));
        goto out;
    }
    if (!files[0] || !files[1]) {
        snprintf(err, errlen, "%s: need adapter_config.json and adapter_model.safetensors (in a directory, or a tar "
                 "with both at its root or in one folder); missing %s", src, files[0] ? want[1] : want[0]);
        goto out;
    }
    size_t d0 = strlen(where[0]) - strlen(want[0]), d1 = strlen(where[1]) - strlen(want[1]);
    if (d0 != d1 || strncmp(where[0], where[1], d0)) {
        snprintf(err, errlen, "%s: %s and %s are not in the same folder", src, where[0], where[1]);
        goto out;
    }
    rc = 0;
out:
    archive_read_free(ar);
    return rc;
}

/* The two files from a directory, or from an archive. */
static int read_adapter(const char *src, uint8_t *files[2], size_t sizes[2], char *err, size_t errlen) {
    struct stat sb;
    if (stat(src, &sb) < 0) {
        snprintf(err, errlen, "%s: %s", src, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) return read_archive(src, files, sizes, err, errlen);
    static const char *const want[2] = {"adapter_config.json", "adapter_model.safetensors"};
    for (int k = 0; k < 2; k++) {
        char f[PATH_MAX];
        snprintf(f, sizeof f, "%s/%s", src, want[k]);
        if (!(files[k] = read_all(f, &sizes[k]))) {
            snprintf(err, errlen, "%s: %s", f, strerror(errno));
            return -1;
        }
    }
    return 0;
}

static int cmd_import(const cfg *o) {
    const char *src = o->pos[0], *tenant = cfg_str(o, "tenant"), *base = cfg_str(o, "base-model"),
               *run = cfg_str(o, "run"), *name = cfg_str(o, "name");
    char err[1024], path[REG_PATH_MAX], ckpt[REG_NAME_MAX + 32];
    reg_path rp;
    snprintf(ckpt, sizeof ckpt, "sampler_weights/%s", name);
    if (reg_ckpt_id_parse(run, ckpt, &rp, err, sizeof err) < 0) return cli_fail(o, NULL, "%s", err);

    uint8_t *files[2] = {NULL, NULL};
    size_t sizes[2] = {0, 0};
    if (read_adapter(src, files, sizes, err, sizeof err) < 0) {
        free(files[0]);
        free(files[1]);
        return cli_fail(o, NULL, "%s", err);
    }
    uint8_t *cfgj = files[0], *st = files[1];
    size_t st_n = sizes[1];

    PGconn *c = cli_connect(o);
    const char *pb[1] = {base};
    PGresult *r = db_query(c, SQL_CLI_BASE_CONFIG, 1, pb, err, sizeof err);
    if (!r) return cli_fail(o, c, "%s", err);
    if (!PQntuples(r)) {
        PQclear(r);
        return cli_fail(o, c, "unknown base model '%s' (the models executors serve: SELECT name FROM base_models)", base);
    }
    model_config mc;
    int rc = model_config_parse(PQgetvalue(r, 0, 0), &mc, err, sizeof err);
    PQclear(r);
    if (rc < 0) return cli_fail(o, c, "%s", err);
    uint8_t *blob;
    size_t blen;
    adapter_io_info info;
    if (adapter_io_import(&mc, (const char *)cfgj, st, st_n, &blob, &blen, &info, err, sizeof err) < 0)
        return cli_fail(o, c, "%s", err);
    int64_t tid_n;
    if (keys_tenant_find(c, tenant, &tid_n, err, sizeof err) < 0) return cli_fail(o, c, "%s", err);

    blobstore *bs = open_blobs(o);
    char digest[BLOB_DIGEST_HEX];
    if (blob_put(bs, blob, blen, digest, err, sizeof err) < 0) return cli_fail(o, c, "%s", err);
    reg_import_req q = {.tenant_id = tid_n, .run = run, .name = name, .base_model = base, .rank = info.cfg.rank,
                        .train_attn = info.cfg.train_attn, .train_mlp = info.cfg.train_mlp,
                        .train_unembed = info.cfg.train_unembed, .digest = digest, .size_bytes = (int64_t)blen,
                        .source = src, .source_config = (const char *)cfgj, .actor = "cli"};
    rc = reg_import(c, bs, &q, blob, blen, path, err, sizeof err);
    if (rc == 409 && strstr(err, "exists already")) snprintf(err + strlen(err), sizeof err - strlen(err), " (`loom adapter delete %s`)", path);
    if (rc != 0) return cli_fail(o, c, "%s", err);
    printf("imported %s (rank %d,%s%s%s; %zu bytes, blob %s)\n", path, info.cfg.rank, info.cfg.train_attn ? " attn" : "",
           info.cfg.train_mlp ? " mlp" : "", info.cfg.train_unembed ? " head" : "", blen, digest);
    free(blob); free(cfgj); free(st);
    blob_close(bs);
    PQfinish(c);
    return 0;
}

/* ---- share / publish / delete --------------------------------------------------------------- */

static int cmd_share(const cfg *o) {
    const char *run = o->pos[0], *tenant = cfg_str(o, "tenant");
    bool revoke = cfg_flag(o, "revoke");
    PGconn *c = cli_connect(o);
    char err[512];
    const char *pr[1] = {run};
    PGresult *r = db_query(c, SQL_CLI_RUN_ADAPTER, 1, pr, err, sizeof err);
    if (!r) return cli_fail(o, c, "%s", err);
    if (PQntuples(r) != 1) {
        PQclear(r);
        return cli_fail(o, c, "no single adapter with run name %s (a run has an adapter once it saved a checkpoint)",
                        run);
    }
    char aid[24], owner[24];
    snprintf(aid, sizeof aid, "%s", PQgetvalue(r, 0, 0));
    snprintf(owner, sizeof owner, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    int64_t tid_n;
    if (keys_tenant_find(c, tenant, &tid_n, err, sizeof err) < 0) return cli_fail(o, c, "%s", err);
    char tid[24];
    snprintf(tid, sizeof tid, "%lld", (long long)tid_n);
    if (!strcmp(tid, owner)) return cli_fail(o, c, "tenant %s owns %s already", tenant, run);
    char details[160];
    snprintf(details, sizeof details, "{\"grantee\": \"%s\", \"grantee_id\": %s}", tenant, tid);
    if (db_begin(c, err, sizeof err) < 0 ||
        (revoke ? reg_revoke : reg_grant)(c, atoll(aid), tid_n, err, sizeof err) < 0 ||
        reg_audit(c, atoll(owner), "cli", revoke ? "adapter.revoke" : "adapter.grant", run, details, err,
                  sizeof err) < 0 ||
        db_commit(c, err, sizeof err) < 0) {
        db_rollback(c);
        return cli_fail(o, c, "%s", err);
    }
    printf("%s read access to %s for tenant %s\n", revoke ? "revoked" : "granted", run, tenant);
    PQfinish(c);
    return 0;
}

static int cmd_publish(const cfg *o) {
    const char *path = o->pos[0];
    bool undo = cfg_flag(o, "undo");
    PGconn *c = cli_connect(o);
    reg_version v;
    if (find_path(o, c, path, &v) < 0) { PQfinish(c); return 1; }
    char err[512];
    if (db_begin(c, err, sizeof err) < 0 || reg_version_set_public(c, &v, !undo, err, sizeof err) < 0 ||
        reg_audit(c, v.tenant_id, "cli", undo ? "checkpoint.unpublish" : "checkpoint.publish", path, NULL, err,
                  sizeof err) < 0 ||
        db_commit(c, err, sizeof err) < 0) {
        db_rollback(c);
        return cli_fail(o, c, "%s", err);
    }
    printf("%s is now %s\n", path, undo ? "private" : "public");
    PQfinish(c);
    return 0;
}

static int cmd_delete(const cfg *o) {
    const char *path = o->pos[0];
    PGconn *c = cli_connect(o);
    reg_version v;
    if (find_path(o, c, path, &v) < 0) { PQfinish(c); return 1; }
    char err[512];
    if (db_begin(c, err, sizeof err) < 0 || reg_version_delete(c, v.id, err, sizeof err) < 0 ||
        reg_audit(c, v.tenant_id, "cli", "checkpoint.delete", path, NULL, err, sizeof err) < 0 ||
        db_commit(c, err, sizeof err) < 0) {
        db_rollback(c);
        return cli_fail(o, c, "%s", err);
    }
    printf("deleted %s (its blob is removed by the next `loom adapter gc` unless another version uses it)\n", path);
    PQfinish(c);
    return 0;
}

static int gc_pass(PGconn *c, blobstore *bs, const reg_gc_opts *o) {
    char err[512];
    reg_gc_stats st;
    if (reg_gc(c, bs, o, &st, err, sizeof err) < 0) {
        fprintf(stderr, "loom adapter gc: %s\n", err);
        return -1;
    }
    printf("%sexpired %d, pruned %d, blobs removed %d (%lld bytes; %d orphans), blobs kept for live versions %d, "
           "young orphans kept %d, stale temp files removed %d, expired uploads dropped %d\n",
           o->dry_run ? "(dry run) " : "", st.expired, st.pruned, st.blobs_removed, (long long)st.bytes_freed,
           st.orphans_removed, st.blobs_kept, st.orphans_young, st.tmp_removed, st.uploads_expired);
    fflush(stdout);
    return 0;
}

static int cmd_gc(const cfg *co) {
    reg_gc_opts o = {.run = cfg_str(co, "run"), .dry_run = cfg_flag(co, "dry-run"),
                     .keep_last = (int)cfg_int(co, "keep-last"), .orphan_grace_s = cfg_int(co, "orphan-grace-s")};
    long period = cfg_int(co, "every");
    /* Orphans belong to no run, so a pass limited to one run leaves them alone. */
    o.sweep_orphans = !o.run;
    blobstore *bs = open_blobs(co);
    if (!period) {
        PGconn *c = cli_connect(co);
        int rc = gc_pass(c, bs, &o);
        blob_close(bs);
        PQfinish(c);
        return rc < 0 ? 1 : 0;
    }
    /* Periodic: a fresh connection per pass, so a database restart costs one pass. */
    for (;;) {
        char err[2048];
        PGconn *c = cfg_connect(co, 5000, err, sizeof err);
        if (!c) fprintf(stderr, "loom adapter gc: %s\n", err);
        else {
            gc_pass(c, bs, &o);
            PQfinish(c);
        }
        sleep((unsigned)period);
    }
}

int adapter_cli_main(int argc, char **argv) {
    static const cli_verb verbs[] = {
        {"list", &LIST_CMD, cmd_list, "checkpoints (live ones unless --deleted)"},
        {"show", &SHOW_CMD, cmd_show, "one version with its provenance"},
        {"lineage", &LINEAGE_CMD, cmd_lineage, "the version's ancestors, nearest first"},
        {"export", &EXPORT_CMD, cmd_export, "the checkpoint archive of a version"},
        {"import", &IMPORT_CMD, cmd_import, "a PEFT/Tinker adapter as tinker://RUN/sampler_weights/NAME"},
        {"share", &SHARE_CMD, cmd_share, "grant (or revoke) read access to a run's checkpoints"},
        {"publish", &PUBLISH_CMD, cmd_publish, "make a checkpoint public (or private again)"},
        {"delete", &DELETE_CMD, cmd_delete, "delete a checkpoint (its blob goes at the next gc)"},
        {"gc", &GC_CMD, cmd_gc, "expire, prune, remove unreferenced and orphan blobs"},
        {0}};
    if (sodium_init() < 0) { fprintf(stderr, "loom adapter: libsodium initialisation failed\n"); return 1; }
    return cli_dispatch("adapter", "Checkpoints in the adapter registry.", verbs, argc, argv);
}
