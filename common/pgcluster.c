/* pgcluster.c: initdb/pg_ctl driven through fork+exec, dropping privileges when root. */
#include "common/pgcluster.h"
#include "common/common_sql.h"
#include "common/db.h"
#include "common/log.h"
#include <errno.h>
#include <glob.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Debian keeps initdb/pg_ctl out of PATH, under /usr/lib/postgresql/<ver>/bin. */
static int find_bindir(char *out, size_t n, char *err, size_t errlen) {
    const char *env = getenv("LOOM_PG_BINDIR");
    if (env && *env) { snprintf(out, n, "%s", env); return 0; }
    glob_t g;
    if (glob("/usr/lib/postgresql/*/bin/initdb", 0, NULL, &g) == 0 && g.gl_pathc > 0) {
        /* the last match in sorted order is the newest major version */
        snprintf(out, n, "%s", g.gl_pathv[g.gl_pathc - 1]);
        globfree(&g);
        char *slash = strrchr(out, '/');
        if (slash) *slash = 0;
        return 0;
    }
    globfree(&g);
    snprintf(err, errlen, "PostgreSQL server programs not found (install package postgresql, "
                          "or set LOOM_PG_BINDIR)");
    return -1;
}

/* ---- memory ------------------------------------------------------------------------- */

/* The memory this machine gives us: physical memory, or less where a cgroup limits it
 * (a container). */
static unsigned long long machine_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    unsigned long long mem = pages > 0 && page > 0 ? (unsigned long long)pages * (unsigned long long)page : 0;
    const char *limits[] = {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        FILE *f = fopen(limits[i], "r");
        if (!f) continue;
        unsigned long long lim;
        if (fscanf(f, "%llu", &lim) == 1 && lim > 0 && (mem == 0 || lim < mem)) mem = lim;   /* "max": none */
        fclose(f);
    }
    return mem;
}

static unsigned long long clamp_mb(unsigned long long v, unsigned long long lo, unsigned long long hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* PostgreSQL's memory for this machine, written at every start to <cluster>/loom-memory.conf
 * (included from postgresql.conf; a setting made with ALTER SYSTEM still wins): the
 * queue's tables and their indexes must stay in shared buffers as history grows, and
 * PostgreSQL's default of 128 MB holds a few hundred thousand operations. An eighth of the
 * memory for shared buffers (128 MB to 8 GB: the executors need the rest for their
 * models), half of it as the planner's guess of the OS cache, and sort and maintenance
 * memory to match. Takes effect when the cluster (re)starts. */
static int write_memory_conf(const char *dir, uid_t uid, gid_t gid, char *err, size_t errlen) {
    unsigned long long mb = machine_memory() >> 20;
    if (mb == 0) mb = 1024;
    unsigned long long shared = clamp_mb(mb / 8, 128, 8192), cache = clamp_mb(mb / 2, 256, 1ULL << 30),
                       work = mb >= 16384 ? 16 : 4, maint = clamp_mb(mb / 32, 64, 1024);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/loom-memory.conf", dir);
    FILE *f = fopen(path, "w");
    if (!f) { snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno)); return -1; }
    fprintf(f, "# Written by loom at every start for a machine of %llu MB (common/pgcluster.c);\n"
               "# ALTER SYSTEM overrides it.\n"
               "shared_buffers = '%lluMB'\neffective_cache_size = '%lluMB'\n"
               "work_mem = '%lluMB'\nmaintenance_work_mem = '%lluMB'\n", mb, shared, cache, work, maint);
    fclose(f);
    if (geteuid() == 0 && chown(path, uid, gid) < 0) {}
    /* postgresql.conf includes it (once); clusters made before this dropped the fixed
     * 128 MB loom wrote into postgresql.auto.conf, which would win over the include. */
    snprintf(path, sizeof path, "%s/postgresql.conf", dir);
    const char *inc = "include_if_exists = 'loom-memory.conf'";
    f = fopen(path, "r");
    bool have = false;
    char line[1024];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, inc, strlen(inc))) have = true;
    if (f) fclose(f);
    if (!have) {
        f = fopen(path, "a");
        if (!f) { snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno)); return -1; }
        fprintf(f, "\n# The memory loom sized for this machine (loom-memory.conf)\n%s\n", inc);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/postgresql.auto.conf", dir);
    f = fopen(path, "r");
    if (f) {
        char *buf = NULL;
        size_t cap = 0, len = 0;
        bool dropped = false;
        while (fgets(line, sizeof line, f)) {
            if (!strcmp(line, "shared_buffers = '128MB'\n")) { dropped = true; continue; }
            size_t n = strlen(line);
            if (len + n + 1 > cap) {
                cap = (len + n + 1) * 2;
                char *nb = realloc(buf, cap);
                if (!nb) { free(buf); fclose(f); snprintf(err, errlen, "out of memory"); return -1; }
                buf = nb;
            }
            memcpy(buf + len, line, n + 1);
            len += n;
        }
        fclose(f);
        if (dropped) {
            f = fopen(path, "w");
            if (f) { fwrite(buf, 1, len, f); fclose(f); }
        }
        free(buf);
    }
    log_info("PostgreSQL memory for %llu MB: shared_buffers %llu MB, effective_cache_size %llu MB, work_mem %llu MB,"
             " maintenance_work_mem %llu MB (%s/loom-memory.conf)", mb, shared, cache, work, maint, dir);
    return 0;
}

/* The user that owns and runs the cluster: ourselves, or an unprivileged one if root. */
static int cluster_user(uid_t *uid, gid_t *gid, char *name, size_t n, char *err, size_t errlen) {
    if (geteuid() != 0) {
        *uid = geteuid(); *gid = getegid();
        struct passwd *pw = getpwuid(*uid);
        snprintf(name, n, "%s", pw ? pw->pw_name : "loom");
        return 0;
    }
    const char *cands[] = {getenv("LOOM_PG_USER"), "postgres", "nobody"};
    for (int i = 0; i < 3; i++) {
        if (!cands[i] || !*cands[i]) continue;
        struct passwd *pw = getpwnam(cands[i]);
        if (pw) { *uid = pw->pw_uid; *gid = pw->pw_gid; snprintf(name, n, "%s", pw->pw_name); return 0; }
    }
    snprintf(err, errlen, "running as root and no unprivileged user (postgres, nobody) to own the cluster");
    return -1;
}

/* Runs argv as uid/gid, output to logpath (or inherited). Returns the exit status. */
static int run_as(uid_t uid, gid_t gid, char *const argv[], const char *logpath) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (logpath) {
            FILE *f = fopen(logpath, "a");
            if (f) { dup2(fileno(f), 1); dup2(fileno(f), 2); }
        }
        if (geteuid() == 0 && uid != 0) {
            if (setgroups(0, NULL) < 0 || setgid(gid) < 0 || setuid(uid) < 0) _exit(126);
        }
        unsetenv("PGDATA");
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int mkdir_p(const char *path, mode_t mode) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') { *p = 0; if (mkdir(tmp, 0755) < 0 && errno != EEXIST) return -1; *p = '/'; }
    }
    return (mkdir(tmp, mode) < 0 && errno != EEXIST) ? -1 : 0;
}

/* Checks, as the cluster user, that the directory can be reached (root-owned homes
 * such as /root are not traversable by `postgres`). */
static int reachable_by(uid_t uid, gid_t gid, const char *dir) {
    char *argv[] = {"/usr/bin/test", "-w", (char *)dir, NULL};
    return run_as(uid, gid, argv, NULL) == 0;
}

static int abspath(const char *in, char *out, size_t n) {
    if (in[0] == '/') { snprintf(out, n, "%s", in); return 0; }
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) return -1;
    snprintf(out, n, "%s/%s", cwd, in);
    return 0;
}

int pgc_private_dir(const char *data_dir, char *err, size_t errlen) {
    if (mkdir_p(data_dir, 0700) < 0) {
        snprintf(err, errlen, "cannot create data directory %s: %s", data_dir, strerror(errno));
        return -1;
    }
    mode_t mode = 0700;
    if (geteuid() == 0) {
        uid_t uid; gid_t gid;
        char uname[64];
        if (cluster_user(&uid, &gid, uname, sizeof uname, err, errlen) < 0) return -1;
        if (chown(data_dir, 0, gid) < 0) {
            snprintf(err, errlen, "chown %s: %s", data_dir, strerror(errno));
            return -1;
        }
        mode = 0710;
    }
    if (chmod(data_dir, mode) < 0) {
        snprintf(err, errlen, "chmod %s: %s", data_dir, strerror(errno));
        return -1;
    }
    return 0;
}

int pgc_start(const char *data_dir, pgcluster *out, char *err, size_t errlen) {
    char bindir[PATH_MAX], uname[64], absdir[PATH_MAX];
    uid_t uid; gid_t gid;
    if (find_bindir(bindir, sizeof bindir, err, errlen) < 0) return -1;
    if (cluster_user(&uid, &gid, uname, sizeof uname, err, errlen) < 0) return -1;
    if (abspath(data_dir, absdir, sizeof absdir) < 0 || mkdir_p(absdir, 0755) < 0) {
        snprintf(err, errlen, "cannot create data directory %s: %s", data_dir, strerror(errno));
        return -1;
    }
    snprintf(out->dir, sizeof out->dir, "%s/pg", absdir);
    if (strlen(out->dir) > 90) {   /* the socket path must fit in sun_path (108 bytes) */
        snprintf(err, errlen, "data directory path too long for a Unix socket: %s", absdir);
        return -1;
    }
    char pgver[PATH_MAX + 16], logpath[PATH_MAX + 16];
    snprintf(pgver, sizeof pgver, "%s/PG_VERSION", out->dir);
    snprintf(logpath, sizeof logpath, "%s/../postgres.log", out->dir);
    struct stat st;
    if (stat(pgver, &st) < 0) {
        if (mkdir(out->dir, 0700) < 0 && errno != EEXIST) {
            snprintf(err, errlen, "cannot create %s: %s", out->dir, strerror(errno));
            return -1;
        }
        if (geteuid() == 0 && chown(out->dir, uid, gid) < 0) {
            snprintf(err, errlen, "chown %s: %s", out->dir, strerror(errno));
            return -1;
        }
        if (geteuid() == 0 && !reachable_by(uid, gid, out->dir)) {
            snprintf(err, errlen, "running as root: user %s cannot reach %s (a parent directory is "
                     "private, e.g. /root); choose --data-dir under /var/lib or /tmp", uname, out->dir);
            return -1;
        }
        if (geteuid() == 0) {   /* the log file sits beside the cluster and must be writable */
            FILE *f = fopen(logpath, "a");
            if (f) { fclose(f); if (chown(logpath, uid, gid) < 0) {} }
        }
        char initdb[PATH_MAX + 16];
        snprintf(initdb, sizeof initdb, "%s/initdb", bindir);
        char *argv[] = {initdb, "-D", out->dir, "-U", "loom", "--auth=trust", "-E", "UTF8",
                        "--locale=C", "--no-instructions", NULL};
        log_info("creating PostgreSQL cluster in %s (as user %s)", out->dir, uname);
        if (run_as(uid, gid, argv, logpath) != 0) {
            snprintf(err, errlen, "initdb failed; see %s", logpath);
            return -1;
        }
        /* Private socket only; the memory is sized at every start (write_memory_conf). */
        char conf[PATH_MAX + 32];
        snprintf(conf, sizeof conf, "%s/postgresql.auto.conf", out->dir);
        FILE *f = fopen(conf, "a");
        if (!f) { snprintf(err, errlen, "cannot write %s", conf); return -1; }
        fprintf(f, "listen_addresses = ''\nunix_socket_directories = '%s'\n"
                   "max_connections = 200\nfsync = on\n", out->dir);
        fclose(f);
        if (geteuid() == 0 && chown(conf, uid, gid) < 0) {}
    }
    snprintf(out->conninfo, sizeof out->conninfo, "host=%s port=5432 dbname=loom user=loom", out->dir);
    char pmpid[PATH_MAX + 16];
    snprintf(pmpid, sizeof pmpid, "%s/postmaster.pid", out->dir);
    char admin[800];
    snprintf(admin, sizeof admin, "host=%s port=5432 dbname=postgres user=loom", out->dir);
    PGconn *probe = NULL;
    if (stat(pmpid, &st) == 0) probe = db_probe(admin, err, errlen);   /* a stale pid file is no outage */
    if (!probe) {
        if (write_memory_conf(out->dir, uid, gid, err, errlen) < 0) return -1;
        char pgctl[PATH_MAX + 16];
        snprintf(pgctl, sizeof pgctl, "%s/pg_ctl", bindir);
        char *argv[] = {pgctl, "-D", out->dir, "-l", logpath, "-w", "-t", "60", "start", NULL};
        if (run_as(uid, gid, argv, NULL) != 0) {
            snprintf(err, errlen, "pg_ctl start failed; see %s", logpath);
            return -1;
        }
        probe = db_connect(admin, 10000, err, errlen);
        if (!probe) return -1;
    }
    PGresult *r = db_query(probe, SQL_PG_HAS_LOOM_DB, 0, NULL, err, errlen);
    int have = r && PQntuples(r) > 0;
    if (r) PQclear(r);
    if (!have && db_exec(probe, SQL_PG_CREATE_LOOM_DB, 0, NULL, err, errlen) < 0 &&
        strcmp(db_last_sqlstate(), "42P04") != 0) {   /* 42P04: created meanwhile by another */
        PQfinish(probe);
        return -1;
    }
    PQfinish(probe);
    return 0;
}

int pgc_stop(const char *data_dir, char *err, size_t errlen) {
    char bindir[PATH_MAX], uname[64], absdir[PATH_MAX], dir[PATH_MAX + 8], pgctl[PATH_MAX + 16];
    uid_t uid; gid_t gid;
    if (find_bindir(bindir, sizeof bindir, err, errlen) < 0) return -1;
    if (cluster_user(&uid, &gid, uname, sizeof uname, err, errlen) < 0) return -1;
    if (abspath(data_dir, absdir, sizeof absdir) < 0) return -1;
    snprintf(dir, sizeof dir, "%s/pg", absdir);
    snprintf(pgctl, sizeof pgctl, "%s/pg_ctl", bindir);
    char *argv[] = {pgctl, "-D", dir, "-m", "fast", "-w", "stop", NULL};
    if (run_as(uid, gid, argv, "/dev/null") != 0) {
        snprintf(err, errlen, "pg_ctl stop failed for %s (not running?)", dir);
        return -1;
    }
    return 0;
}
