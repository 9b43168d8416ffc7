/* admin.c: `loom migrate`, `loom tenant`, `loom key`. Each talks to PostgreSQL
 * directly (DATABASE_URL or --db) and needs the server secret for keys. */
#include "cli/admin.h"
#include "common/db.h"
#include "common/keys.h"
#include "common/migrate.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        PGresult *r = db_query(c, "SELECT t.id, t.name, t.created_at, count(k.id) FILTER (WHERE k.revoked_at IS NULL)"
                                  " FROM tenants t LEFT JOIN api_keys k ON k.tenant_id = t.id"
                                  " GROUP BY t.id ORDER BY t.id", 0, NULL, err, sizeof err);
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

int admin_key_main(int argc, char **argv) {
    const char *verb = argc > 1 ? argv[1] : "";
    char err[1024];
    if (!strcmp(verb, "create")) {
        const char *tenant = opt(argc, argv, "--tenant");
        const char *secret_file = opt(argc, argv, "--secret-file");
        if (!tenant) { fprintf(stderr, "usage: loom key create --tenant NAME [--name N] [--secret-file F]\n"); return 2; }
        unsigned char secret[KEY_SECRET_BYTES];
        if (keys_init() < 0 || keys_load_secret(secret_file, false, secret, err, sizeof err) < 0) {
            fprintf(stderr, "loom key: %s\n", err);
            return 1;
        }
        PGconn *c = connect_or_die(argc, argv);
        int64_t tid;
        char key[KEY_MAX_LEN];
        if (keys_tenant_ensure(c, tenant, &tid, err, sizeof err) < 0 ||
            keys_create(c, secret, tid, opt(argc, argv, "--name"), NULL, NULL, key, err, sizeof err) < 0) {
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
        PGresult *r = db_query(c, "SELECT k.id, t.name, 'tml-' || k.prefix || '...', coalesce(k.name,''),"
                                  " array_to_string(k.scopes, ','), k.created_at, coalesce(k.last_used_at::text,'never'),"
                                  " CASE WHEN k.revoked_at IS NOT NULL THEN 'revoked' ELSE 'active' END"
                                  " FROM api_keys k JOIN tenants t ON t.id = k.tenant_id ORDER BY k.id",
                               0, NULL, err, sizeof err);
        if (!r) { fprintf(stderr, "loom key: %s\n", err); PQfinish(c); return 1; }
        for (int i = 0; i < PQntuples(r); i++)
            printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2),
                   PQgetvalue(r, i, 3), PQgetvalue(r, i, 4), PQgetvalue(r, i, 5), PQgetvalue(r, i, 6),
                   PQgetvalue(r, i, 7));
        PQclear(r);
        PQfinish(c);
        return 0;
    }
    if (!strcmp(verb, "revoke") && argc > 2 && argv[2][0] != '-') {
        PGconn *c = connect_or_die(argc, argv);
        const char *p[1] = {argv[2]};
        PGresult *r = db_query(c, "WITH k AS (UPDATE api_keys SET revoked_at = now() WHERE id::text = $1"
                                  " AND revoked_at IS NULL RETURNING id, tenant_id, prefix)"
                                  " INSERT INTO audit_log (tenant_id, actor, action, object)"
                                  " SELECT tenant_id, 'cli', 'key.revoke', 'tml-' || prefix FROM k RETURNING id",
                               1, p, err, sizeof err);
        int n = r ? PQntuples(r) : -1;
        if (r) PQclear(r);
        PQfinish(c);
        if (n < 0) { fprintf(stderr, "loom key: %s\n", err); return 1; }
        if (n == 0) { fprintf(stderr, "loom key: no active key with id %s\n", argv[2]); return 1; }
        printf("revoked key %s\n", argv[2]);
        return 0;
    }
    fprintf(stderr, "usage: loom key create --tenant NAME [--name N] | list | revoke ID   [--db CONNINFO]\n");
    return 2;
}
