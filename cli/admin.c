/* admin.c: `loom migrate`, `loom tenant`, `loom key`. Each talks to PostgreSQL directly
 * (the database of common/config.h) and key creation needs the server secret. */
#include "cli/admin.h"
#include "cli/cli.h"
#include "cli/cli_sql.h"
#include "common/db.h"
#include "common/keys.h"
#include "common/migrate.h"
#include "common/pgarray.h"
#include "common/pgcluster.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const cfg_cmd MIGRATE_CMD = {.cmd = "loom migrate", .about = "Applies the database migrations.",
                                    .tables = {CFG_DB, CFG_DATA_DIR}};

int admin_migrate_main(int argc, char **argv) {
    cfg o;
    int rc;
    if (!cfg_parse(&MIGRATE_CMD, argc, argv, &o, &rc)) return rc;
    PGconn *c = cli_connect(&o);
    char err[1024];
    int n = migrate_run(c, err, sizeof err);
    if (n < 0) return cli_fail(&o, c, "%s", err);
    PQfinish(c);
    printf("migrations applied: %d\n", n);
    return 0;
}

/* ---- tenant ---------------------------------------------------------------------------- */

static const cfg_cmd TENANT_CREATE = {.cmd = "loom tenant create", .synopsis = "NAME [options]",
                                      .about = "Creates a tenant (NAME: 1-64 letters, digits, '-', '_', '.').",
                                      .tables = {CFG_DB, CFG_DATA_DIR}, .min_pos = 1, .max_pos = 1,
                                      .pos_name = "NAME"};
static const cfg_cmd TENANT_LIST = {.cmd = "loom tenant list", .about = "Lists tenants and their active keys.",
                                    .tables = {CFG_DB, CFG_DATA_DIR}};

static int tenant_create(const cfg *o) {
    char err[1024];
    const char *name = o->pos[0];
    if (keys_tenant_name_check(name, err, sizeof err) < 0) return cli_fail(o, NULL, "%s", err);
    PGconn *c = cli_connect(o);
    int64_t id;
    bool created;
    if (keys_tenant_create(c, name, &id, &created, err, sizeof err) < 0) return cli_fail(o, c, "%s", err);
    PQfinish(c);
    printf("tenant %s id=%lld%s\n", name, (long long)id, created ? "" : " (exists already)");
    return 0;
}

static int tenant_list(const cfg *o) {
    char err[1024];
    PGconn *c = cli_connect(o);
    PGresult *r = db_query(c, SQL_CLI_TENANTS, 0, NULL, err, sizeof err);
    if (!r) return cli_fail(o, c, "%s", err);
    printf("%-6s %-24s %-12s %s\n", "id", "name", "active keys", "created");
    for (int i = 0; i < PQntuples(r); i++)
        printf("%-6s %-24s %-12s %s\n", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 3),
               PQgetvalue(r, i, 2));
    PQclear(r);
    PQfinish(c);
    return 0;
}

int admin_tenant_main(int argc, char **argv) {
    static const cli_verb verbs[] = {{"create", &TENANT_CREATE, tenant_create, "create a tenant"},
                                     {"list", &TENANT_LIST, tenant_list, "list tenants"},
                                     {"set-limits", &TENANT_SET_LIMITS, tenant_set_limits,
                                      "set a tenant's limits (queued operations, tokens per minute, models, bytes)"},
                                     {0}};
    return cli_dispatch("tenant", "Tenants: who owns sessions, models, checkpoints and keys.", verbs, argc, argv);
}

/* ---- key ------------------------------------------------------------------------------- */

static const opt_spec KEY_CREATE_OPTS[] = {
    {.name = "tenant", .kind = OPT_STR, .arg = "NAME", .required = true, .help = "the key's tenant (it must exist)"},
    {.name = "name", .kind = OPT_STR, .arg = "N", .help = "a label for listings (at most 128 bytes)"},
    {.name = "scopes", .kind = OPT_STR, .arg = "LIST", .def = "train,sample,read",
     .help = "train (training submits), sample (sampling), read (reads; 'read' alone: read-only); operator "
             "scopes: admin (every tenant in the console, /metrics), metrics (scraping /metrics only)"},
    {.name = "expires-in-days", .kind = OPT_INT, .arg = "D", .lo = 1, .hi = 36500, .help = "expiry (default: never)"},
    {0}};
static const opt_spec KEY_LIST_OPTS[] = {
    {.name = "tenant", .kind = OPT_STR, .arg = "NAME", .help = "only this tenant's keys"}, {0}};

static const cfg_cmd KEY_CREATE = {.cmd = "loom key create", .synopsis = "--tenant NAME [options]",
                                   .about = "Creates an API key and prints it (shown only once).",
                                   .tables = {KEY_CREATE_OPTS, CFG_DB, CFG_DATA_DIR, CFG_SECRET}};
static const cfg_cmd KEY_LIST = {.cmd = "loom key list", .about = "Lists API keys (prefixes only).",
                                 .tables = {KEY_LIST_OPTS, CFG_DB, CFG_DATA_DIR}};
static const cfg_cmd KEY_REVOKE = {.cmd = "loom key revoke", .synopsis = "ID [options]",
                                   .about = "Revokes the key with this id (`loom key list` shows ids).",
                                   .tables = {CFG_DB, CFG_DATA_DIR}, .min_pos = 1, .max_pos = 1, .pos_name = "ID"};

/* "train,read" -> a text[] literal of the scopes (free() it). Unknown or repeated names: NULL. */
static char *parse_scopes(const char *list) {
    static const char *const known[] = {"train", "sample", "read", "admin", "metrics"};
    enum { N_KNOWN = sizeof known / sizeof known[0] };
    int seen[N_KNOWN] = {0}, n = 0;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        int k = -1;
        for (int i = 0; i < N_KNOWN; i++)
            if (len == strlen(known[i]) && !strncmp(p, known[i], len)) k = i;
        if (k < 0 || seen[k]) return NULL;
        seen[k] = 1;
        n++;
        p += len;
        if (*p == ',') p++;
    }
    if (!n) return NULL;
    pgarray a;
    pga_init(&a);
    for (int i = 0; i < N_KNOWN; i++)
        if (seen[i]) pga_text(&a, known[i]);
    return pga_end(&a);
}

static int key_create(const cfg *o) {
    char err[1024], expires[40];
    const char *tenant = cfg_str(o, "tenant"), *name = cfg_str(o, "name");
    char *scopes = parse_scopes(cfg_str(o, "scopes"));
    if (!scopes)
        return cfg_usage_error(o->cmd, "--scopes takes a comma-separated list of train, sample, read, admin, metrics (each once), "
                               "got '%s'", cfg_str(o, "scopes"));
    if (name && strlen(name) > 128) {
        free(scopes);
        return cfg_usage_error(o->cmd, "--name is at most 128 bytes");
    }
    if (cfg_str(o, "expires-in-days")) {
        time_t at = time(NULL) + (time_t)cfg_int(o, "expires-in-days") * 86400;
        struct tm tm;
        gmtime_r(&at, &tm);
        strftime(expires, sizeof expires, "%Y-%m-%dT%H:%M:%SZ", &tm);
    }
    unsigned char secret[KEY_SECRET_BYTES];
    if (keys_init() < 0 || cfg_secret(o, false, secret, err, sizeof err) < 0) {
        free(scopes);
        return cli_fail(o, NULL, "%s", err);
    }
    PGconn *c = cli_connect(o);
    int64_t tid;
    char key[KEY_MAX_LEN];
    int rc = keys_tenant_find(c, tenant, &tid, err, sizeof err) < 0 ||
             keys_create(c, secret, tid, name, scopes, cfg_str(o, "expires-in-days") ? expires : NULL, key, err,
                         sizeof err) < 0;
    free(scopes);
    if (rc) return cli_fail(o, c, "%s", err);
    PQfinish(c);
    printf("%s\n", key);
    fprintf(stderr, "store this key now: it is shown only once\n");
    return 0;
}

static int key_list(const cfg *o) {
    char err[1024];
    PGconn *c = cli_connect(o);
    int64_t tid;
    const char *tenant = cfg_str(o, "tenant");
    if (tenant && keys_tenant_find(c, tenant, &tid, err, sizeof err) < 0) return cli_fail(o, c, "%s", err);
    const char *p[1] = {tenant};
    PGresult *r = db_query(c, SQL_CLI_KEYS,
                           1, p, err, sizeof err);
    if (!r) return cli_fail(o, c, "%s", err);
    printf("%-5s %-16s %-16s %-12s %-18s %-16s %-16s %-16s %s\n", "id", "tenant", "key", "name", "scopes",
           "created (UTC)", "expires (UTC)", "last used (UTC)", "state");
    for (int i = 0; i < PQntuples(r); i++)
        printf("%-5s %-16s %-16s %-12s %-18s %-16s %-16s %-16s %s\n", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
               PQgetvalue(r, i, 2), PQgetvalue(r, i, 3), PQgetvalue(r, i, 4), PQgetvalue(r, i, 5),
               PQgetvalue(r, i, 6), PQgetvalue(r, i, 7), PQgetvalue(r, i, 8));
    PQclear(r);
    PQfinish(c);
    return 0;
}

static int key_revoke(const cfg *o) {
    const char *id = o->pos[0];
    char *end;
    long long v = strtoll(id, &end, 10);
    if (!*id || *end || v < 1) return cfg_usage_error(o->cmd, "ID is a key's number (`loom key list`), got '%s'", id);
    char err[1024];
    PGconn *c = cli_connect(o);
    const char *p[1] = {id};
    PGresult *r = db_query(c, SQL_CLI_KEY_REVOKE,
                           1, p, err, sizeof err);
    if (!r) return cli_fail(o, c, "%s", err);
    int n = PQntuples(r);
    PQclear(r);
    if (n == 0) return cli_fail(o, c, "no active key with id %s", id);
    PQfinish(c);
    printf("revoked key %s\n", id);
    return 0;
}

int admin_key_main(int argc, char **argv) {
    static const cli_verb verbs[] = {{"create", &KEY_CREATE, key_create, "create an API key (printed once)"},
                                     {"list", &KEY_LIST, key_list, "list keys"},
                                     {"revoke", &KEY_REVOKE, key_revoke, "revoke a key"},
                                     {0}};
    return cli_dispatch("key", "API keys: `tml-` and 43 random characters; only a keyed hash is stored.", verbs,
                        argc, argv);
}

/* ---- pg -------------------------------------------------------------------------------- */

static const cfg_cmd PG_START = {.cmd = "loom pg start",
                                 .about = "Starts the data directory's private PostgreSQL cluster (created if absent)\n"
                                          "and prints DATABASE_URL=<conninfo>.",
                                 .tables = {CFG_DATA_DIR}};
static const cfg_cmd PG_STOP = {.cmd = "loom pg stop", .about = "Stops the data directory's private cluster.",
                                .tables = {CFG_DATA_DIR}};

static int pg_start(const cfg *o) {
    char dir[PATH_MAX], err[1024];
    cfg_data_dir(o, dir, sizeof dir);
    pgcluster c;
    if (pgc_start(dir, &c, err, sizeof err) < 0) return cli_fail(o, NULL, "%s", err);
    printf("DATABASE_URL=%s\n", c.conninfo);
    return 0;
}

static int pg_stop(const cfg *o) {
    char dir[PATH_MAX], err[1024];
    cfg_data_dir(o, dir, sizeof dir);
    if (pgc_stop(dir, err, sizeof err) < 0) return cli_fail(o, NULL, "%s", err);
    return 0;
}

int admin_pg_main(int argc, char **argv) {
    static const cli_verb verbs[] = {{"start", &PG_START, pg_start, "start the private cluster"},
                                     {"stop", &PG_STOP, pg_stop, "stop it"},
                                     {0}};
    return cli_dispatch("pg", "The private PostgreSQL cluster under a data directory (as `loom up` runs it).", verbs,
                        argc, argv);
}

/* ---- config ---------------------------------------------------------------------------- */

static const cfg_cmd CONFIG_CMD = {
    .cmd = "loom config",
    .about = "Prints where the data directory, database, secret and blob store are, and which setting\n"
             "said so (flag > environment > config file > default; see `loom help`).",
    .tables = {CFG_DATA_DIR, CFG_DB, CFG_SECRET, CFG_BLOBS}};

int admin_config_main(int argc, char **argv) {
    cfg o;
    int rc;
    if (!cfg_parse(&CONFIG_CMD, argc, argv, &o, &rc)) return rc;
    char dir[PATH_MAX], db[4096], from[PATH_MAX + 400], secret[PATH_MAX], blobs[PATH_MAX];
    cfg_data_dir(&o, dir, sizeof dir);
    cfg_db(&o, db, sizeof db, from, sizeof from);
    cfg_secret_file(&o, secret, sizeof secret);
    cfg_blob_dir(&o, blobs, sizeof blobs);
    printf("config file: %s\n", o.file[0] ? o.file : "none");
    printf("data-dir:    %s (%s)\n", dir, cfg_where(&o, "data-dir"));
    printf("db:          %s (%s)\n", db, from);
    printf("secret:      %s\n", secret[0] ? secret : "$LOOM_SECRET");
    printf("blob-dir:    %s\n", blobs);
    return 0;
}
