/* pgcluster.h: a private PostgreSQL cluster under a data directory, for `loom up` and
 * for tests. Listens only on a Unix socket inside the cluster directory. initdb and
 * postgres refuse to run as root, so when started as root the cluster belongs to the
 * unprivileged `postgres` user (or `nobody`) and its programs run as that user. */
#pragma once
#include <stddef.h>

typedef struct {
    char dir[512];       /* cluster directory (PGDATA) */
    char conninfo[700];  /* libpq connection string to database "loom" */
} pgcluster;

/* Creates the cluster under <data_dir>/pg if absent, starts it if not running, and
 * creates database "loom". Returns 0 or -1 with err. */
int pgc_start(const char *data_dir, pgcluster *out, char *err, size_t errlen);
/* Makes data_dir private to the service user (created if needed): mode 0700, or, as root,
 * 0710 with the group of the user that runs the cluster (PostgreSQL refuses root), so that
 * user can pass through to its own <data_dir>/pg and nothing else. 0, or -1 with err. */
int pgc_private_dir(const char *data_dir, char *err, size_t errlen);
/* Stops the cluster (fast shutdown). */
int pgc_stop(const char *data_dir, char *err, size_t errlen);
