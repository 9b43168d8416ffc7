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
