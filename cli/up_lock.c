/* up_lock.c: the data directory's lock and the children recorded in it (see up_lock.h).
 *
 * <dir>/up.lock holds an flock(2) for as long as its `loom up` runs, and says who that is:
 *     up 1234 5678901 2025-01-01T12:00:00Z
 *     child 1240 5678950 api
 * (pid, start time in clock ticks since boot from /proc/PID/stat: a pid the kernel gave
 * to another process since is not taken for the child). */
#include "cli/up_lock.h"
#include "common/log.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

static int g_fd = -1;
static char g_head[128];   /* this up's line */

/* Field 22 of /proc/PID/stat: when the process started; 0 when there is no such process. */
static unsigned long long start_ticks(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');   /* the command name may hold spaces and parentheses */
    if (!p) return 0;
    unsigned long long v = 0;
    /* after ")": state (3), then fields 4..22 */
    if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &v) != 1)
        return 0;
    return v;
}

static bool alive_as(pid_t pid, unsigned long long ticks) { return pid > 0 && ticks && start_ticks(pid) == ticks; }

/* Stops the recorded children of the previous holder that still run. */
static void stop_leftovers(const char *text) {
    enum { MAX = 256 };
    pid_t pids[MAX];
    unsigned long long ticks[MAX];
    int n = 0;
    for (const char *l = text; l && *l && n < MAX; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        int pid;
        unsigned long long t;
        char role[64];
        if (sscanf(l, "child %d %llu %63s", &pid, &t, role) != 3 || !alive_as(pid, t)) continue;
        log_warn("a previous `loom up` of this data directory left its %s running (pid %d): stopping it", role, pid);
        kill(pid, SIGTERM);
        kill(pid, SIGCONT);   /* a stopped process acts on SIGTERM only once continued */
        pids[n] = pid, ticks[n++] = t;
    }
    for (int waited = 0; waited < 100; waited++) {   /* 10 s */
        bool any = false;
        for (int i = 0; i < n; i++) any |= alive_as(pids[i], ticks[i]);
        if (!any) return;
        usleep(100 * 1000);
    }
    for (int i = 0; i < n; i++)
        if (alive_as(pids[i], ticks[i])) {
            log_warn("pid %d did not stop within 10 s: killing it", (int)pids[i]);
            kill(pids[i], SIGKILL);
        }
}

int up_lock_take(const char *dir, char *err, size_t errlen) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/up.lock", dir);
    /* O_CLOEXEC: the children do not hold it (a child outliving this process must not
     * keep the next `loom up` out; it is stopped instead). */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char text[16384];
    ssize_t got = pread(fd, text, sizeof text - 1, 0);
    text[got > 0 ? got : 0] = 0;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int pid = 0;
        unsigned long long t;
        char at[64] = "?";
        bool known = sscanf(text, "up %d %llu %63s", &pid, &t, at) == 3;
        if (errno == EWOULDBLOCK && known)
            snprintf(err, errlen, "data directory %s is in use by another `loom up` (pid %d, started %s): stop it "
                     "first (kill -TERM %d), or give this one another --data-dir", dir, pid, at, pid);
        else if (errno == EWOULDBLOCK)
            snprintf(err, errlen, "data directory %s is in use by another `loom up` (%s is locked): stop it first, "
                     "or give this one another --data-dir", dir, path);
        else
            snprintf(err, errlen, "cannot lock %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    g_fd = fd;
    /* Read again under the lock: the previous holder is gone, its record final. */
    got = pread(fd, text, sizeof text - 1, 0);
    text[got > 0 ? got : 0] = 0;
    stop_leftovers(text);
    char at[32];
    time_t now = time(NULL);
    strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    snprintf(g_head, sizeof g_head, "up %d %llu %s\n", (int)getpid(), start_ticks(getpid()), at);
    up_lock_note(NULL, 0);
    return 0;
}

void up_lock_note(const up_lock_child *cs, int n) {
    if (g_fd < 0) return;
    char text[16384];
    size_t len = (size_t)snprintf(text, sizeof text, "%s", g_head);
    for (int i = 0; i < n && len < sizeof text; i++) {
        if (cs[i].pid <= 0) continue;
        char role[64];   /* one word: "adapter gc" is written adapter-gc */
        snprintf(role, sizeof role, "%s", cs[i].role);
        for (char *r = role; *r; r++)
            if (*r == ' ') *r = '-';
        len += (size_t)snprintf(text + len, sizeof text - len, "child %d %llu %s\n", (int)cs[i].pid,
                                start_ticks(cs[i].pid), role);
    }
    if (len >= sizeof text) len = sizeof text - 1;
    if (pwrite(g_fd, text, len, 0) < 0 || ftruncate(g_fd, (off_t)len) < 0)
        log_warn("cannot record the children in up.lock: %s", strerror(errno));
}
