/* migrate.h: applies migrations/NNNN_name.sql (compiled into the binary) in order,
 * each in its own transaction under an advisory lock, recorded in schema_migrations. */
#pragma once
#include <libpq-fe.h>
#include <stddef.h>

typedef struct {
    int version;
    const char *name;
    const char *sql;
} loom_migration;

extern const loom_migration loom_migrations[]; /* ends with {0, 0, 0}; generated */

/* Returns the number of migrations applied now (0 if up to date), or -1 with err. */
int migrate_run(PGconn *c, char *err, size_t errlen);
/* The same up to migration `last` (included): for a test that writes rows as an older
 * schema held them, then applies the migration that converts them. */
int migrate_run_upto(PGconn *c, int last, char *err, size_t errlen);
