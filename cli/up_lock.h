/* up_lock.h: one `loom up` per data directory, and no children left behind by one that
 * was killed. A second `loom up` on a directory in use would start a second api and
 * executors of the same names beside the first, and stopping either would stop the
 * PostgreSQL cluster both use. */
#pragma once
#include <stddef.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;
    const char *role;
} up_lock_child;

/* Takes <dir>/up.lock for this process, held until it exits (the kernel lets go of it
 * even after kill -9). When another `loom up` holds it: -1, with err naming its pid and
 * when it started. Then stops the children that a previous `loom up` of the directory
 * left running (its children die with it, but one that was stopped, or slow to stop,
 * outlives it): SIGTERM, and SIGKILL after 10 s. 0 when taken. */
int up_lock_take(const char *dir, char *err, size_t errlen);

/* Records the running children in the lock file, for the next `loom up` (above). */
void up_lock_note(const up_lock_child *cs, int n);
