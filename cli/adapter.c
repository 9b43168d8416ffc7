/* adapter.c: `loom adapter list|show|lineage|export|import|share|publish|delete|gc`.
 * Talks to PostgreSQL directly (--db or DATABASE_URL) and to the blob store (--blob-dir,
 * else <--data-dir>/blobs, else $LOOM_BLOB_DIR, else the `loom up` default data dir).
 * Every security-relevant change (share, publish, delete, import) writes audit_log. */
#include "cli/adapter.h"
#include "cli/admin.h"
#include "common/db.h"
#include "model/adapter_io.h"
#include "model/model.h"
#include "registry/blobstore.h"
#include "registry/registry.h"
#include "cli/cli_sql.h"
#include <jansson.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define USAGE                                                                                       \
    "usage: loom adapter <command> [--db CONNINFO] [--blob-dir DIR | --data-dir DIR]\n"             \
    "  list [--tenant NAME] [--run RUN] [--deleted]   checkpoints (live ones unless --deleted)\n"  \
    "  show PATH                                      one version with its provenance\n"           \
    "  lineage PATH                                   the version's ancestors, nearest first\n"    \
    "  export PATH --out FILE.tar [--format tinker|peft] [--no-head]\n"                             \
    "                                                 the checkpoint archive (docs/protocol.md §17)\n"  \
    "  import DIR|FILE.tar --tenant NAME --base-model NAME --run RUN --name NAME\n"                 \
    "                                                 a PEFT/Tinker adapter as tinker://RUN/sampler_weights/NAME\n" \
    "  share RUN --tenant NAME [--revoke]             grant (or revoke) read access to a run's checkpoints\n" \
    "  publish PATH [--undo]                          make a checkpoint public (or private again)\n" \
    "  delete PATH                                    delete a checkpoint (its blob goes at the next gc)\n" \
    "  gc [--keep-last K] [--run RUN] [--dry-run] [--orphan-grace-s S] [--every S]\n"                \
    "                                                 expire, prune, remove unreferenced blobs, and\n" \
    "                                                 orphan blobs and temp files older than S seconds\n" \
    "                                                 (default 3600; orphans only without --run);\n"   \
    "                                                 --every S: a pass every S seconds until killed\n"

static const char *opt(int argc, char **argv, const char *name) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return NULL;
}

static bool flag(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], name)) return true;
    return false;
}

/* The first argument after the verb that is not an option or an option's value. */
static const char *positional(int argc, char **argv) {
    static const char *const with_value[] = {"--db", "--blob-dir", "--data-dir", "--tenant", "--run", "--out",
                                             "--format", "--base-model", "--name", "--keep-last",
                                             "--orphan-grace-s", "--every", NULL};
    for (int i = 2; i < argc; i++) {
        bool takes = false;
        for (int k = 0; with_value[k]; k++) takes = takes || !strcmp(argv[i], with_value[k]);
        if (takes) { i++; continue; }
        if (argv[i][0] != '-') return argv[i];
    }
    return NULL;
}

static PGconn *connect_db(int argc, char **argv) {
    const char *ci = admin_conninfo(argc, argv);
    if (!ci) { fprintf(stderr, "loom adapter: set DATABASE_URL or pass --db CONNINFO\n"); exit(2); }
    char err[512];
    PGconn *c = db_connect(ci, 5000, err, sizeof err);
    if (!c) { fprintf(stderr, "loom adapter: cannot connect to database: %s\n", err); exit(1); }
    return c;
}

static blobstore *open_blobs(int argc, char **argv) {
    char dir[PATH_MAX], err[512];
    const char *b = opt(argc, argv, "--blob-dir"), *d = opt(argc, argv, "--data-dir"), *env = getenv("LOOM_BLOB_DIR");
    if (b) snprintf(dir, sizeof dir, "%s", b);
    else if (d) snprintf(dir, sizeof dir, "%s/blobs", d);
    else if (env && *env) snprintf(dir, sizeof dir, "%s", env);
    else if (geteuid() == 0) snprintf(dir, sizeof dir, "/var/lib/loom/blobs");
    else snprintf(dir, sizeof dir, "%s/.loom/blobs", getenv("HOME") ? getenv("HOME") : ".");
    blobstore *s = blob_open_dir(dir, err, sizeof err);
    if (!s) { fprintf(stderr, "loom adapter: blob store %s: %s\n", dir, err); exit(1); }
    return s;
}

static int fail(PGconn *c, const char *what, const char *err) {
    fprintf(stderr, "loom adapter %s: %s\n", what, err);
    if (c) PQfinish(c);
    return 1;
}

/* The live version at path (any tenant). */
static int find_path(PGconn *c, const char *path, reg_version *v, const char *what) {
    char err[512];
    reg_path rp;
    if (reg_path_parse(path, &rp, err, sizeof err) < 0) { fprintf(stderr, "loom adapter %s: %s\n", what, err); return -1; }
    int rc = reg_find_live(c, path, v, err, sizeof err);
    if (rc) { fprintf(stderr, "loom adapter %s: %s\n", what, err); return -1; }
    return 0;
}

/* ---- list / show / lineage ---------------------------------------------------------------- */

static int cmd_list(int argc, char **argv) {
    PGconn *c = connect_db(argc, argv);
    char err[512];
    const char *p[3] = {opt(argc, argv, "--tenant"), opt(argc, argv, "--run"), flag(argc, argv, "--deleted") ? "t" : "f"};
    PGresult *r = db_query(c, SQL_CLI_LIST, 3, p, err, sizeof err);
    if (!r) return fail(c, "list", err);
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

static int cmd_show(int argc, char **argv) {
    const char *path = positional(argc, argv);
    if (!path) { fprintf(stderr, USAGE); return 2; }
    PGconn *c = connect_db(argc, argv);
    char err[512];
    const char *p[1] = {path};
    PGresult *r = db_query(c, SQL_CLI_SHOW, 1, p, err, sizeof err);
    if (!r) return fail(c, "show", err);
    if (!PQntuples(r)) { PQclear(r); return fail(c, "show", "no such checkpoint"); }
    json_t *j = json_loads(PQgetvalue(r, 0, 0), 0, NULL);
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    printf("%s\n", s);
    free(s);
    json_decref(j);
    PQclear(r);
    PQfinish(c);
    return 0;
}

static int cmd_lineage(int argc, char **argv) {
    const char *path = positional(argc, argv);
    if (!path) { fprintf(stderr, USAGE); return 2; }
    PGconn *c = connect_db(argc, argv);
    char err[512];
    const char *p[1] = {path};
    PGresult *r = db_query(c, SQL_CLI_LINEAGE, 1, p, err, sizeof err);
    if (!r) return fail(c, "lineage", err);
    if (!PQntuples(r)) { PQclear(r); return fail(c, "lineage", "no such checkpoint"); }
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

static int cmd_export(int argc, char **argv) {
    const char *path = positional(argc, argv), *out = opt(argc, argv, "--out"), *fmt = opt(argc, argv, "--format");
    if (!path || !out) { fprintf(stderr, USAGE); return 2; }
    if (fmt && strcmp(fmt, "tinker") && strcmp(fmt, "peft")) { fprintf(stderr, "--format is tinker or peft\n"); return 2; }
    PGconn *c = connect_db(argc, argv);
    reg_version v;
    if (find_path(c, path, &v, "export") < 0) { PQfinish(c); return 1; }
    blobstore *bs = open_blobs(argc, argv);
    char err[512];
    void *blob;
    size_t n;
    if (blob_get(bs, v.digest, &blob, &n, err, sizeof err) < 0) return fail(c, "export", err);
    adapter_export ex;
    bool peft = fmt && !strcmp(fmt, "peft");
    if (adapter_io_export(blob, n, peft ? ADAPTER_EXPORT_PEFT : ADAPTER_EXPORT_TINKER, v.base_model,
                          !flag(argc, argv, "--no-head"), &ex, err, sizeof err) < 0)
        return fail(c, "export", err);
    free(blob);
    reg_tar_member m[5];
    for (int i = 0; i < ex.n; i++) m[i] = (reg_tar_member){ex.files[i].name, ex.files[i].data, ex.files[i].len};
    uint8_t *tar;
    size_t tl;
    int rc = reg_tar_build(m, ex.n, v.created_epoch, &tar, &tl, err, sizeof err);
    adapter_export_free(&ex);
    if (rc < 0 || write_file(out, tar, tl, err, sizeof err) < 0) return fail(c, "export", err);
    free(tar);
    char details[128];
    snprintf(details, sizeof details, "{\"format\": \"%s\", \"bytes\": %zu}", peft ? "peft" : "tinker", tl);
    if (reg_audit(c, v.tenant_id, "cli", "checkpoint.export", v.tinker_path, details, err, sizeof err) < 0)
        fprintf(stderr, "loom adapter export: audit: %s\n", err);
    printf("wrote %s (%zu bytes, %s format)\n", out, tl, peft ? "peft" : "tinker");
    PQfinish(c);
    blob_close(bs);
    return 0;
}

static int cmd_import(int argc, char **argv) {
    const char *src = positional(argc, argv), *tenant = opt(argc, argv, "--tenant"),
               *base = opt(argc, argv, "--base-model"), *run = opt(argc, argv, "--run"), *name = opt(argc, argv, "--name");
    if (!src || !tenant || !base || !run || !name) { fprintf(stderr, USAGE); return 2; }
    char err[1024], path[REG_PATH_MAX], ckpt[REG_NAME_MAX + 32];
    reg_path rp;
    snprintf(ckpt, sizeof ckpt, "sampler_weights/%s", name);
    if (reg_ckpt_id_parse(run, ckpt, &rp, err, sizeof err) < 0) return fail(NULL, "import", err);
    reg_path_format(&rp, path, sizeof path);

    /* the two files, from a directory or a tar */
    uint8_t *cfg = NULL, *st = NULL, *tar = NULL;
    size_t cfg_n = 0, st_n = 0, tar_n = 0;
    struct stat sb;
    if (stat(src, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char f[PATH_MAX];
        snprintf(f, sizeof f, "%s/adapter_config.json", src);
        cfg = read_all(f, &cfg_n);
        snprintf(f, sizeof f, "%s/adapter_model.safetensors", src);
        st = read_all(f, &st_n);
    } else if ((tar = read_all(src, &tar_n))) {
        const uint8_t *d;
        size_t dn;
        if (reg_tar_get(tar, tar_n, "adapter_config.json", &d, &dn) == 0) { cfg = malloc(dn + 1); memcpy(cfg, d, dn); cfg[dn] = 0; cfg_n = dn; }
        if (reg_tar_get(tar, tar_n, "adapter_model.safetensors", &d, &dn) == 0) { st = malloc(dn ? dn : 1); memcpy(st, d, dn); st_n = dn; }
    }
    free(tar);
    if (!cfg || !st) return fail(NULL, "import", "need adapter_config.json and adapter_model.safetensors (a directory or a tar)");

    PGconn *c = connect_db(argc, argv);
    const char *pb[1] = {base};
    PGresult *r = db_query(c, SQL_CLI_BASE_CONFIG, 1, pb, err, sizeof err);
    if (!r) return fail(c, "import", err);
    if (!PQntuples(r)) { PQclear(r); return fail(c, "import", "unknown base model (see base_models)"); }
    model_config mc;
    int rc = model_config_parse(PQgetvalue(r, 0, 0), &mc, err, sizeof err);
    PQclear(r);
    if (rc < 0) return fail(c, "import", err);
    uint8_t *blob;
    size_t blen;
    adapter_io_info info;
    if (adapter_io_import(&mc, (const char *)cfg, st, st_n, &blob, &blen, &info, err, sizeof err) < 0)
        return fail(c, "import", err);
    const char *pt[1] = {tenant};
    r = db_query(c, SQL_CLI_TENANT, 1, pt, err, sizeof err);
    if (!r) return fail(c, "import", err);
    if (!PQntuples(r)) { PQclear(r); return fail(c, "import", "unknown tenant"); }
    char tid[24];
    snprintf(tid, sizeof tid, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);

    blobstore *bs = open_blobs(argc, argv);
    char digest[BLOB_DIGEST_HEX], size[24], rank[16];
    if (blob_put(bs, blob, blen, digest, err, sizeof err) < 0) return fail(c, "import", err);
    snprintf(size, sizeof size, "%zu", blen);
    snprintf(rank, sizeof rank, "%d", info.cfg.rank);
    json_t *cj = json_loads((const char *)cfg, 0, NULL);
    char *cjs = json_dumps(cj, JSON_COMPACT);
    json_decref(cj);
    if (db_begin(c, err, sizeof err) < 0 || reg_blob_lock_shared(c, digest, err, sizeof err) < 0) goto dberr;
    if (!blob_exists(bs, digest) && blob_put(bs, blob, blen, digest, err, sizeof err) < 0) goto dberr;
    const char *pa[2] = {tid, run};
    r = db_query(c, SQL_CLI_IMPORT_ADAPTER, 2, pa, err, sizeof err);
    if (!r) goto dberr;
    char aid[24];
    snprintf(aid, sizeof aid, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    const char *pv[12] = {aid, name, path, base, rank, info.cfg.train_attn ? "t" : "f", info.cfg.train_mlp ? "t" : "f",
                          info.cfg.train_unembed ? "t" : "f", digest, size, src, cjs};
    r = db_query(c, SQL_CLI_IMPORT_VERSION, 12, pv, err, sizeof err);
    if (!r) goto dberr;
    PQclear(r);
    char details[160];
    snprintf(details, sizeof details, "{\"blob_digest\": \"%s\"}", digest);
    if (reg_audit(c, atoll(tid), "cli", "checkpoint.import", path, details, err, sizeof err) < 0 ||
        db_commit(c, err, sizeof err) < 0)
        goto dberr;
    printf("imported %s (rank %d,%s%s%s; %zu bytes, blob %s)\n", path, info.cfg.rank, info.cfg.train_attn ? " attn" : "",
           info.cfg.train_mlp ? " mlp" : "", info.cfg.train_unembed ? " head" : "", blen, digest);
    free(cjs); free(blob); free(cfg); free(st);
    blob_close(bs);
    PQfinish(c);
    return 0;
dberr:
    db_rollback(c);
    return fail(c, "import", err);
}

/* ---- share / publish / delete --------------------------------------------------------------- */

static int cmd_share(int argc, char **argv) {
    const char *run = positional(argc, argv), *tenant = opt(argc, argv, "--tenant");
    if (!run || !tenant) { fprintf(stderr, USAGE); return 2; }
    bool revoke = flag(argc, argv, "--revoke");
    PGconn *c = connect_db(argc, argv);
    char err[512];
    const char *pr[1] = {run}, *pt[1] = {tenant};
    PGresult *r = db_query(c, SQL_CLI_RUN_ADAPTER, 1, pr, err, sizeof err);
    if (!r) return fail(c, "share", err);
    if (PQntuples(r) != 1) {
        PQclear(r);
        return fail(c, "share", "no single adapter with that run name (a run has an adapter once it saved a checkpoint)");
    }
    char aid[24], owner[24];
    snprintf(aid, sizeof aid, "%s", PQgetvalue(r, 0, 0));
    snprintf(owner, sizeof owner, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    r = db_query(c, SQL_CLI_TENANT, 1, pt, err, sizeof err);
    if (!r) return fail(c, "share", err);
    if (!PQntuples(r)) { PQclear(r); return fail(c, "share", "unknown tenant"); }
    char tid[24];
    snprintf(tid, sizeof tid, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    if (!strcmp(tid, owner)) return fail(c, "share", "that tenant owns the run already");
    const char *pg[2] = {aid, tid};
    char details[160];
    snprintf(details, sizeof details, "{\"grantee\": \"%s\", \"grantee_id\": %s}", tenant, tid);
    if (db_begin(c, err, sizeof err) < 0 ||
        db_exec(c, revoke ? SQL_CLI_REVOKE : SQL_CLI_GRANT, 2, pg, err, sizeof err) < 0 ||
        (revoke && reg_fail_unreadable_samples(c, atoll(aid), err, sizeof err) < 0) ||
        reg_audit(c, atoll(owner), "cli", revoke ? "adapter.revoke" : "adapter.grant", run, details, err,
                  sizeof err) < 0 ||
        db_commit(c, err, sizeof err) < 0) {
        db_rollback(c);
        return fail(c, "share", err);
    }
    printf("%s read access to %s for tenant %s\n", revoke ? "revoked" : "granted", run, tenant);
    PQfinish(c);
    return 0;
}

static int cmd_publish(int argc, char **argv) {
    const char *path = positional(argc, argv);
    if (!path) { fprintf(stderr, USAGE); return 2; }
    bool undo = flag(argc, argv, "--undo");
    PGconn *c = connect_db(argc, argv);
    reg_version v;
    if (find_path(c, path, &v, "publish") < 0) { PQfinish(c); return 1; }
    char err[512], id[24];
    snprintf(id, sizeof id, "%lld", (long long)v.id);
    const char *p[2] = {id, undo ? "private" : "public"};
    if (db_begin(c, err, sizeof err) < 0 ||
        db_exec(c, SQL_REG_SET_VISIBILITY, 2, p, err, sizeof err) < 0 ||
        (undo && reg_fail_unreadable_samples(c, v.adapter_id, err, sizeof err) < 0) ||
        reg_audit(c, v.tenant_id, "cli", undo ? "checkpoint.unpublish" : "checkpoint.publish", path, NULL, err,
                  sizeof err) < 0 ||
        db_commit(c, err, sizeof err) < 0) {
        db_rollback(c);
        return fail(c, "publish", err);
    }
    printf("%s is now %s\n", path, undo ? "private" : "public");
    PQfinish(c);
    return 0;
}

static int cmd_delete(int argc, char **argv) {
    const char *path = positional(argc, argv);
    if (!path) { fprintf(stderr, USAGE); return 2; }
    PGconn *c = connect_db(argc, argv);
    reg_version v;
    if (find_path(c, path, &v, "delete") < 0) { PQfinish(c); return 1; }
    char err[512], id[24];
    snprintf(id, sizeof id, "%lld", (long long)v.id);
    const char *p[1] = {id};
    if (db_begin(c, err, sizeof err) < 0 || db_exec(c, SQL_REG_MARK_DELETED, 1, p, err, sizeof err) < 0 ||
        reg_audit(c, v.tenant_id, "cli", "checkpoint.delete", path, NULL, err, sizeof err) < 0 ||
        db_commit(c, err, sizeof err) < 0) {
        db_rollback(c);
        return fail(c, "delete", err);
    }
    printf("deleted %s (its blob is removed by the next `loom adapter gc` unless another version uses it)\n", path);
    PQfinish(c);
    return 0;
}

static bool parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    long v = s && *s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static int gc_pass(PGconn *c, blobstore *bs, const reg_gc_opts *o) {
    char err[512];
    reg_gc_stats st;
    if (reg_gc(c, bs, o, &st, err, sizeof err) < 0) {
        fprintf(stderr, "loom adapter gc: %s\n", err);
        return -1;
    }
    printf("%sexpired %d, pruned %d, blobs removed %d (%lld bytes; %d orphans), blobs kept for live versions %d, "
           "young orphans kept %d, stale temp files removed %d\n",
           o->dry_run ? "(dry run) " : "", st.expired, st.pruned, st.blobs_removed, (long long)st.bytes_freed,
           st.orphans_removed, st.blobs_kept, st.orphans_young, st.tmp_removed);
    fflush(stdout);
    return 0;
}

static int cmd_gc(int argc, char **argv) {
    const char *keep = opt(argc, argv, "--keep-last"), *grace = opt(argc, argv, "--orphan-grace-s"),
               *every = opt(argc, argv, "--every");
    reg_gc_opts o = {.run = opt(argc, argv, "--run"), .dry_run = flag(argc, argv, "--dry-run"), .orphan_grace_s = 3600};
    long v;
    if (keep) {
        if (!parse_long(keep, 1, 1000000, &v)) { fprintf(stderr, "--keep-last must be a positive integer\n"); return 2; }
        o.keep_last = (int)v;
    }
    if (grace) {
        if (!parse_long(grace, 0, 100L * 365 * 86400, &v)) { fprintf(stderr, "--orphan-grace-s must be >= 0\n"); return 2; }
        o.orphan_grace_s = v;
    }
    long period = 0;
    if (every && !parse_long(every, 1, 365L * 86400, &period)) { fprintf(stderr, "--every must be >= 1 seconds\n"); return 2; }
    /* Orphans belong to no run, so a pass limited to one run leaves them alone. */
    o.sweep_orphans = !o.run;
    blobstore *bs = open_blobs(argc, argv);
    if (!period) {
        PGconn *c = connect_db(argc, argv);
        int rc = gc_pass(c, bs, &o);
        blob_close(bs);
        PQfinish(c);
        return rc < 0 ? 1 : 0;
    }
    /* Periodic: a fresh connection per pass, so a database restart costs one pass. */
    const char *ci = admin_conninfo(argc, argv);
    if (!ci) { fprintf(stderr, "loom adapter: set DATABASE_URL or pass --db CONNINFO\n"); return 2; }
    for (;;) {
        char err[512];
        PGconn *c = db_connect(ci, 5000, err, sizeof err);
        if (!c) fprintf(stderr, "loom adapter gc: cannot connect to database: %s\n", err);
        else {
            gc_pass(c, bs, &o);
            PQfinish(c);
        }
        sleep((unsigned)period);
    }
}

int adapter_cli_main(int argc, char **argv) {
    const char *verb = argc > 1 ? argv[1] : "";
    if (sodium_init() < 0) { fprintf(stderr, "loom adapter: libsodium initialisation failed\n"); return 1; }
    if (!strcmp(verb, "list")) return cmd_list(argc, argv);
    if (!strcmp(verb, "show")) return cmd_show(argc, argv);
    if (!strcmp(verb, "lineage")) return cmd_lineage(argc, argv);
    if (!strcmp(verb, "export")) return cmd_export(argc, argv);
    if (!strcmp(verb, "import")) return cmd_import(argc, argv);
    if (!strcmp(verb, "share")) return cmd_share(argc, argv);
    if (!strcmp(verb, "publish")) return cmd_publish(argc, argv);
    if (!strcmp(verb, "delete")) return cmd_delete(argc, argv);
    if (!strcmp(verb, "gc")) return cmd_gc(argc, argv);
    bool help = !strcmp(verb, "--help") || !strcmp(verb, "-h") || !strcmp(verb, "help");
    fprintf(help ? stdout : stderr, USAGE);
    return help ? 0 : 2;
}
