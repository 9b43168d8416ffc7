/* admin.c: `loom migrate`, `loom tenant`, `loom key`. Each talks to PostgreSQL
 * directly (DATABASE_URL or --db) and needs the server secret for keys. */
#include "cli/admin.h"
#include "cli/cli_sql.h"
#include "common/db.h"
#include "common/keys.h"
#include "common/migrate.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *opt(int argc, char **argv, const char *name) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return NULL;
}

const char *admin_conninfo(int argc, char **argv) {
    const char *c = opt(argc, argv, "--db");
    if (!c) c = getenv("DATABASE_URL");
    return c;
}

static PGconn *connect_or_die(int argc, char **argv) {
    const char *ci = admin_conninfo(argc, argv);
    if (!ci) { fprintf(stderr, "loom: set DATABASE_URL or pass --db CONNINFO\n"); exit(2); }
    char err[512];
    PGconn *c = db_connect(ci, 5000, err, sizeof err);
    if (!c) { fprintf(stderr, "loom: cannot connect to database: %s\n", err); exit(1); }
    return c;
}

int admin_migrate_main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--help")) {
        printf("usage: loom migrate [--db CONNINFO]\n");
        return 0;
    }
    PGconn *c = connect_or_die(argc, argv);
    char err[1024];
    int n = migrate_run(c, err, sizeof err);
    PQfinish(c);
    if (n < 0) { fprintf(stderr, "loom migrate: %s\n", err); return 1; }
    printf("migrations applied: %d\n", n);
    return 0;
}

int admin_tenant_main(int argc, char **argv) {
    const char *verb = argc > 1 ? argv[1] : "";
    char err[1024];
    if (!strcmp(verb, "create") && argc > 2 && argv[2][0] != '-') {
        PGconn *c = connect_or_die(argc, argv);
        int64_t id;
        if (keys_tenant_ensure(c, argv[2], &id, err, sizeof err) < 0) {
            fprintf(stderr, "loom tenant: %s\n", err);
            PQfinish(c);
            return 1;
        }
        printf("tenant %s id=%lld\n", argv[2], (long long)id);
        PQfinish(c);
        return 0;
    }
    if (!strcmp(verb, "list")) {
        PGconn *c = connect_or_die(argc, argv);
        PGresult *r = db_query(c, SQL_CLI_TENANTS, 0, NULL, err, sizeof err);
        if (!r) { fprintf(stderr, "loom tenant: %s\n", err); PQfinish(c); return 1; }
        printf("%-6s %-24s %-12s %s\n", "id", "name", "active keys", "created");
        for (int i = 0; i < PQntuples(r); i++)
            printf("%-6s %-24s %-12s %s\n", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 3),
                   PQgetvalue(r, i, 2));
        PQclear(r);
        PQfinish(c);
        return 0;
    }
    fprintf(stderr, "usage: loom tenant create NAME | list   [--db CONNINFO]\n");
    return 2;
}

#define KEY_CREATE_USAGE                                                                    \
    "usage: loom key create --tenant NAME [--name N] [--scopes train,sample,read]\n"        \
    "                       [--expires-in-days D] [--secret-file F] [--db CONNINFO]\n"      \
    "  scopes: train (training submits), sample (sampling), read (reads only; a key with\n" \
    "  only 'read' is read-only). Default: those three. Operator scopes: admin (every\n"   \
    "  tenant in the web console, /metrics), metrics (scraping /metrics only).\n"          \
    "  Default expiry: never.\n"

/* "train,read" -> "{train,read}" (a text[] literal). Unknown or repeated names: -1. */
static int parse_scopes(const char *list, char *out, size_t outlen) {
    static const char *const known[] = {"train", "sample", "read", "admin", "metrics"};
    enum { N_KNOWN = sizeof known / sizeof known[0] };
    int seen[N_KNOWN] = {0}, n = 0;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        int k = -1;
        for (int i = 0; i < N_KNOWN; i++)
            if (len == strlen(known[i]) && !strncmp(p, known[i], len)) k = i;
        if (k < 0 || seen[k]) {
            fprintf(stderr, "loom key: --scopes takes a comma-separated list of train, sample, "
                            "read, admin, metrics (each once), got '%s'\n", list);
            return -1;
        }
        seen[k] = 1;
        n++;
        p += len;
        if (*p == ',') p++;
    }
    if (!n) {
        fprintf(stderr, "loom key: --scopes needs at least one of train, sample, read, admin, metrics\n");
        return -1;
    }
    snprintf(out, outlen, "{");
    for (int i = 0; i < N_KNOWN; i++)
        if (seen[i]) snprintf(out + strlen(out), outlen - strlen(out), "%s%s", strlen(out) > 1 ? "," : "", known[i]);
    snprintf(out + strlen(out), outlen - strlen(out), "}");
    return 0;
}

int admin_key_main(int argc, char **argv) {
    const char *verb = argc > 1 ? argv[1] : "";
    char err[1024];
    if (!strcmp(verb, "create")) {
        const char *tenant = opt(argc, argv, "--tenant");
        const char *secret_file = opt(argc, argv, "--secret-file");
        const char *scopes_arg = opt(argc, argv, "--scopes");
        const char *days_arg = opt(argc, argv, "--expires-in-days");
        if (!tenant) { fprintf(stderr, KEY_CREATE_USAGE); return 2; }
        char scopes[64], expires[40];
        if (scopes_arg && parse_scopes(scopes_arg, scopes, sizeof scopes) < 0) return 2;
        if (days_arg) {
            char *end;
            long days = strtol(days_arg, &end, 10);
            if (!*days_arg || *end || days < 1 || days > 36500) {
                fprintf(stderr, "loom key: --expires-in-days must be a whole number of days between 1 "
                                "and 36500, got '%s'\n", days_arg);
                return 2;
            }
            time_t at = time(NULL) + (time_t)days * 86400;
            struct tm tm;
            gmtime_r(&at, &tm);
            strftime(expires, sizeof expires, "%Y-%m-%dT%H:%M:%SZ", &tm);
        }
        unsigned char secret[KEY_SECRET_BYTES];
        if (keys_init() < 0 || keys_load_secret(secret_file, false, secret, err, sizeof err) < 0) {
            fprintf(stderr, "loom key: %s\n", err);
            return 1;
        }
        PGconn *c = connect_or_die(argc, argv);
        int64_t tid;
        char key[KEY_MAX_LEN];
        if (keys_tenant_ensure(c, tenant, &tid, err, sizeof err) < 0 ||
            keys_create(c, secret, tid, opt(argc, argv, "--name"), scopes_arg ? scopes : NULL,
                        days_arg ? expires : NULL, key, err, sizeof err) < 0) {
            fprintf(stderr, "loom key: %s\n", err);
            PQfinish(c);
            return 1;
        }
        PQfinish(c);
        printf("%s\n", key);
        fprintf(stderr, "store this key now: it is shown only once\n");
        return 0;
    }
    if (!strcmp(verb, "list")) {
        PGconn *c = connect_or_die(argc, argv);
        const char *tenant = opt(argc, argv, "--tenant");
        const char *p[1] = {tenant};
        PGresult *r = db_query(c, SQL_CLI_KEYS, 1, p, err, sizeof err);
        if (!r) { fprintf(stderr, "loom key: %s\n", err); PQfinish(c); return 1; }
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
    if (!strcmp(verb, "revoke") && argc > 2 && argv[2][0] != '-') {
        PGconn *c = connect_or_die(argc, argv);
        const char *p[1] = {argv[2]};
        PGresult *r = db_query(c, SQL_CLI_KEY_REVOKE, 1, p, err, sizeof err);
        int n = r ? PQntuples(r) : -1;
        if (r) PQclear(r);
        PQfinish(c);
        if (n < 0) { fprintf(stderr, "loom key: %s\n", err); return 1; }
        if (n == 0) { fprintf(stderr, "loom key: no active key with id %s\n", argv[2]); return 1; }
        printf("revoked key %s\n", argv[2]);
        return 0;
    }
    fprintf(stderr, KEY_CREATE_USAGE "       loom key list [--tenant NAME] | revoke ID   [--db CONNINFO]\n");
    return 2;
}
