/* up.c: `loom up`. Without DATABASE_URL it creates (or reuses) a private PostgreSQL
 * cluster under the data directory; then it migrates, ensures a default tenant and an
 * API key, generates a small default model if none is given, starts api, scheduler and
 * the executors as child processes (one per GPU the cuda backend finds, else one on the
 * CPU; --backend/--device choose), prints TINKER_BASE_URL / TINKER_API_KEY once all
 * are ready, and on Ctrl-C / SIGTERM stops the children and the cluster it started.
 *
 * Supervision: a child that dies is restarted after a backoff that doubles with each
 * quick death (0.25 s up to 4 s: while one is down every tenant waits; back to the start
 * once a child ran for 10 s), and
 * never given up on: one part failing again and again must not stop the others. An
 * executor that stops heartbeating (stopped, hung on a device) is killed and replaced:
 * the scheduler writes it off after --executor-timeout-s of silence and never schedules
 * it again, so without a new one no work would run. An executor that dies is marked gone at once, so
 * that its models are restored elsewhere (docs/architecture.md, "Durable training
 * state") without waiting for its silence. Everything loom up and its children create is
 * private to the service user (umask 077, data directory 0700). */
#include "cli/up.h"
#include "cli/cli_sql.h"
#include "cli/up_lock.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/db.h"
#include "common/keys.h"
#include "common/log.h"
#include "common/migrate.h"
#include "common/pgcluster.h"
#include "backend/backend.h"
#include "executor/executor.h"
#include "scheduler/sched.h"
#include "api/api.h"
#include "model/mkmodel.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BACKOFF_FIRST_S 0.25
#define BACKOFF_MAX_S 4.0        /* low: while a child is down, every tenant waits */
#define STABLE_S 10.0            /* a child that ran this long (a healthy run) starts its backoff over */
#define MAX_EXECUTORS 64         /* one per GPU at most */
#define WATCH_EVERY_S 2.0        /* how often executor heartbeats are looked at */

typedef struct {
    const char *role;
    pid_t pid;
    char **argv;             /* to restart it */
    bool reads_port;         /* the api: wait for its LOOM_API_LISTENING line */
    double started;          /* monotonic seconds */
    int quick_deaths;        /* deaths in a row within STABLE_S of starting */
    double restart_at;       /* > 0: dead, to be started again at this time */
    int64_t id_floor;        /* executor: rows with a larger id are this child's */
} child;

static volatile sig_atomic_t g_stop;
static void on_signal(int s) { g_stop = 1; }

static pid_t spawn(char *const argv[], int *stdout_pipe) {
    int fds[2] = {-1, -1};
    if (stdout_pipe && pipe(fds) < 0) return -1;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        /* A child dies with `loom up` (kill -9 included): a new `loom up` would otherwise
         * start a second set beside them (it also stops any that outlive this: up_lock.h).
         * The parent may have died before this line: then exit at once. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(0);
        if (stdout_pipe) { dup2(fds[1], 1); close(fds[0]); close(fds[1]); }
        else dup2(2, 1);   /* children log to our stderr; stdout is kept for the two lines */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    if (stdout_pipe) { close(fds[1]); *stdout_pipe = fds[0]; }
    return pid;
}

static int read_port(int fd, int timeout_ms);

/* The devices of backend `name`, counted in a child process: the supervisor itself never
 * initialises a device runtime (the CUDA driver's state does not survive a fork, and
 * every child it starts is forked from it). 0 when the count fails. */
static int probe_devices(const char *name) {
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        int n = be_backend_device_count(name);
        _exit(n > 200 ? 200 : n);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

/* The largest executors.id now: rows of an executor started after this are above it (so
 * a reused pid never points at an old row). 0 when the database cannot say. */
static int64_t executor_id_floor(PGconn *c) {
    char err[256];
    PGresult *r = db_query(c, SQL_UP_EXECUTOR_FLOOR, 0, NULL, err, sizeof err);
    int64_t id = r ? db_int(r, 0, 0) : 0;
    if (r) PQclear(r);
    return id;
}

/* Starts (or restarts) a child; the api must announce its port within 30 s. */
static int start_child(child *ch, PGconn *c) {
    int out = -1;
    if (!strcmp(ch->role, "executor")) ch->id_floor = executor_id_floor(c);
    ch->pid = spawn(ch->argv, ch->reads_port ? &out : NULL);
    ch->started = clock_mono_s();
    ch->restart_at = 0;
    if (ch->pid < 0) { ch->pid = 0; return -1; }
    if (ch->reads_port) {
        int port = read_port(out, 30000);
        close(out);
        if (port <= 0) return -1;
    }
    return 0;
}

static void note_children(const child *cs, int n) {
    up_lock_child rec[MAX_EXECUTORS + 3];
    for (int i = 0; i < n; i++) rec[i] = (up_lock_child){cs[i].pid, cs[i].role};
    up_lock_note(rec, n);
}

/* A child died: schedule its restart after the backoff. */
static void child_died(child *ch, int status) {
    double ran = clock_mono_s() - ch->started;
    ch->quick_deaths = ran < STABLE_S ? ch->quick_deaths + 1 : 1;
    double delay = BACKOFF_FIRST_S;
    for (int i = 1; i < ch->quick_deaths && delay < BACKOFF_MAX_S; i++) delay *= 2;
    if (delay > BACKOFF_MAX_S) delay = BACKOFF_MAX_S;
    ch->pid = 0;
    ch->restart_at = clock_mono_s() + delay;
    log_warn("%s exited unexpectedly (status %d) after %.1f s; restarting it in %.2f s", ch->role,
             status, ran, delay);
}

/* An executor child died (crash, kill -9): its row says gone at once, so that its models
 * are restored on another executor (or the restarted one) without waiting --executor-timeout-s for the
 * reaper to notice the silence. */
static void executor_died(child *ch, PGconn *c, const char *host) {
    if (PQstatus(c) != CONNECTION_OK) db_reset(c);
    char pid[16], floor[24], err[256];
    snprintf(pid, sizeof pid, "%d", (int)ch->pid);
    snprintf(floor, sizeof floor, "%lld", (long long)ch->id_floor);
    const char *p[3] = {pid, host, floor};
    if (db_exec(c, SQL_UP_EXECUTOR_DIED, 3, p, err, sizeof err) < 0)
        log_warn("executor pid %d: could not mark it gone (the reaper will, after its silence): %s", (int)ch->pid, err);
}

/* The executor child's newest row says it is gone or silent beyond silent_s
 * (--executor-timeout-s, the scheduler's and the api's too): it is stopped or hung, and
 * will never be scheduled again. Kill it; the reaping in the main loop then starts a new
 * one. A database that cannot be asked is no reason to kill, and neither is silence
 * before the database has answered for silent_s (judge_silence false): during an outage
 * no heartbeat can land, and an executor that retried its commit through it needs a
 * moment to reconnect (the reaper waits as long). -1 when the database did not answer. */
static int watch_executor(child *ch, PGconn *c, const char *host, int silent_s, bool judge_silence) {
    if (ch->pid <= 0 || !ch->argv) return 0;
    char pid[16], floor[24], silent[16], err[256];
    snprintf(pid, sizeof pid, "%d", (int)ch->pid);
    snprintf(floor, sizeof floor, "%lld", (long long)ch->id_floor);
    snprintf(silent, sizeof silent, "%d", silent_s);
    const char *p[4] = {pid, host, floor, silent};
    PGresult *r = db_query(c, SQL_UP_EXECUTOR_SILENT, 4, p, err, sizeof err);
    if (!r) return -1;
    if (PQntuples(r) > 0 && (judge_silence || !strcmp(PQgetvalue(r, 0, 1), "gone"))) {
        log_warn("executor %s (pid %d) is %s, silent for %s s: killing it and starting a new one",
                 PQgetvalue(r, 0, 0), (int)ch->pid, PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 2));
        kill(ch->pid, SIGKILL);
    }
    PQclear(r);
    return 0;
}

static void stop_children(child *cs, int n) {
    for (int i = n - 1; i >= 0; i--)
        if (cs[i].pid > 0) kill(cs[i].pid, SIGTERM);
    for (int i = n - 1; i >= 0; i--) {
        if (cs[i].pid <= 0) continue;
        for (int t = 0; t < 100; t++) {   /* 10 s, then SIGKILL */
            if (waitpid(cs[i].pid, NULL, WNOHANG) == cs[i].pid) { cs[i].pid = 0; break; }
            usleep(100 * 1000);
        }
        if (cs[i].pid > 0) { kill(cs[i].pid, SIGKILL); waitpid(cs[i].pid, NULL, 0); cs[i].pid = 0; }
    }
}

/* Reads the api's "LOOM_API_LISTENING port=N" line. */
static int read_port(int fd, int timeout_ms) {
    char buf[512];
    size_t len = 0;
    double t0 = clock_mono_s();
    for (;;) {
        long left = timeout_ms - (long)((clock_mono_s() - t0) * 1000);
        if (left <= 0 || g_stop) return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)left) <= 0) continue;
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n <= 0) return -1;
        len += n;
        buf[len] = 0;
        char *m = strstr(buf, "LOOM_API_LISTENING port=");
        if (m && strchr(m, '\n')) return atoi(m + strlen("LOOM_API_LISTENING port="));
        if (len >= sizeof buf - 1) len = 0;
    }
}

/* Reuses <data>/api-key if it still authenticates, else creates a new key. The file
 * is 0600, like an ssh key: the database itself holds only the keyed hash. */
static int ensure_key(PGconn *c, const char *data_dir, const unsigned char *secret, char key[KEY_MAX_LEN],
                      char *err, size_t errlen) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/api-key", data_dir);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fgets(key, KEY_MAX_LEN, f)) key[strcspn(key, "\r\n")] = 0;
        fclose(f);
        unsigned char h[KEY_HASH_BYTES];
        char hhex[2 * KEY_HASH_BYTES + 3] = "\\x";
        keys_hash(secret, key, h);
        for (int i = 0; i < KEY_HASH_BYTES; i++) sprintf(hhex + 2 + 2 * i, "%02x", h[i]);
        const char *p[1] = {hhex};
        PGresult *r = db_query(c, SQL_UP_KEY_VALID, 1, p, err, errlen);
        int ok = r && PQntuples(r) == 1;
        if (r) PQclear(r);
        if (ok) return 0;
    }
    int64_t tid;
    if (keys_tenant_create(c, "default", &tid, NULL, err, errlen) < 0) return -1;
    if (keys_create(c, secret, tid, "loom up", NULL, NULL, key, err, errlen) < 0) return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, key, strlen(key)) < 0 || write(fd, "\n", 1) < 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

static const opt_spec UP_OPTS[] = {
    {.name = "host", .kind = OPT_STR, .arg = "H", .def = "127.0.0.1", .help = "address the api listens on"},
    {.name = "port", .kind = OPT_INT, .arg = "N", .def = "8000", .lo = 0, .hi = 65535,
     .help = "the api's port; 0 picks a free one (the printed URL tells which)"},
    {.name = "api-threads", .kind = OPT_INT, .arg = "N", .def = "2", .lo = 1, .hi = 256, .help = "api event-loop threads"},
    {.name = "model-dir", .kind = OPT_STR, .arg = "DIR",
     .help = "a Hugging Face model directory (default: a tiny Llama generated in <data-dir>/models)"},
    {.name = "model-name", .kind = OPT_STR, .arg = "NAME",
     .help = "its name for clients (default: loom/tiny-llama, or the directory's name)"},
    {.name = "models", .kind = OPT_STR, .arg = "NAME=DIR,...",
     .help = "several base models at once, each NAME served from its Hugging Face directory DIR"},
    {.name = "executors-per-model", .kind = OPT_INT, .arg = "N", .def = "1", .lo = 1, .hi = 16,
     .help = "executors per base model on the CPU backend (with GPUs: one per GPU, GPUs shared out among the models)"},
    {.name = "gc-every", .kind = OPT_INT, .arg = "S", .def = "3600", .lo = 1, .hi = 31536000,
     .help = "registry garbage collection every S seconds"},
    {0}};

static const cfg_cmd UP_CMD = {
    .cmd = "loom up", .section = "up",
    .about = "Everything on this machine: a private PostgreSQL cluster under the data directory (unless a\n"
             "database is configured), the api, the scheduler, the executors (without --backend: one cuda\n"
             "executor per GPU found, else one cpu executor; --backend cuda without --device: one per GPU)\n"
             "and the registry GC, restarted when they die. Prints DATABASE_URL, TINKER_BASE_URL and TINKER_API_KEY once ready.\n"
             "The api's, scheduler's and executor's options below are passed through to them.",
    .tables = {UP_OPTS, CFG_DATA_DIR, CFG_DB, EXE_OPTS, SCHED_OPTS, SCHED_CLAIM_OPTS, CFG_EXECUTOR_TIMEOUT,
               API_TUNING_OPTS, CFG_SECRET, CFG_BLOBS}};

/* A child's argument vector, built from the settings (strings live as long as the
 * process). */
typedef struct {
    char *v[96];
    int n;
} argvec;

static void av_add(argvec *a, const char *s) {
    if (a->n < (int)(sizeof a->v / sizeof a->v[0]) - 1) a->v[a->n++] = (char *)s;
    a->v[a->n] = NULL;
}

static void av_opt(argvec *a, const char *name, const char *value) {
    char flag[128];
    snprintf(flag, sizeof flag, "--%s", name);
    av_add(a, strdup(flag));
    av_add(a, value);
}

/* The options of table set for up (on its command line, in the environment or in [up]),
 * but for `skip` (NULL-terminated; options up sets itself). */
static void av_pass(argvec *a, const cfg *o, const opt_spec *tab, const char *const *skip) {
    for (const opt_spec *s = tab; s->name; s++) {
        if (cfg_level(o, s->name) == CFG_DEFAULT) continue;
        bool skipped = false;
        for (int i = 0; skip && skip[i]; i++) skipped |= !strcmp(skip[i], s->name);
        if (skipped) continue;
        if (s->kind == OPT_FLAG) {
            char flag[128];
            snprintf(flag, sizeof flag, "--%s", s->name);
            if (cfg_flag(o, s->name)) av_add(a, strdup(flag));
        } else {
            av_opt(a, s->name, cfg_str(o, s->name));
        }
    }
}

/* ---- the base models ----------------------------------------------------------------------- */

#define MAX_MODELS 16

typedef struct {
    char name[256], dir[PATH_MAX];
} up_model;

/* --models "NAME=DIR,NAME=DIR": the count, or -1 with err (a missing '=', an empty part,
 * a repeated name, a directory without a readable config.json). */
static int parse_models(const char *spec, up_model *out, char *err, size_t errlen) {
    int n = 0;
    for (const char *p = spec; *p;) {
        size_t len = strcspn(p, ","), eq = strcspn(p, "=");
        if (eq >= len || eq == 0 || eq + 1 == len) {
            snprintf(err, errlen, "--models takes NAME=DIR[,NAME=DIR...], got '%.*s'", (int)len, p);
            return -1;
        }
        if (n == MAX_MODELS) { snprintf(err, errlen, "--models: at most %d models", MAX_MODELS); return -1; }
        snprintf(out[n].name, sizeof out[n].name, "%.*s", (int)eq, p);
        snprintf(out[n].dir, sizeof out[n].dir, "%.*s", (int)(len - eq - 1), p + eq + 1);
        for (int i = 0; i < n; i++)
            if (!strcmp(out[i].name, out[n].name)) {
                snprintf(err, errlen, "--models: %s is named twice", out[n].name);
                return -1;
            }
        char cfgjson[PATH_MAX + 16];
        snprintf(cfgjson, sizeof cfgjson, "%s/config.json", out[n].dir);
        if (access(cfgjson, R_OK) != 0) {
            snprintf(err, errlen, "--models %s=%s: no readable config.json (%s)", out[n].name, out[n].dir, strerror(errno));
            return -1;
        }
        n++;
        p += len;
        if (*p == ',') p++;
    }
    if (!n) { snprintf(err, errlen, "--models is empty"); return -1; }
    return n;
}

/* What can be checked before anything starts, beyond each option's syntax. */
static int check_up_opts(const cfg *o) {
    char err[1024];
    if (exe_check_opts(o, err, sizeof err) < 0) return cfg_usage_error(&UP_CMD, "%s", err);
    const char *cert = cfg_str(o, "tls-cert"), *key = cfg_str(o, "tls-key"), *mdir = cfg_str(o, "model-dir");
    if ((cert != NULL) != (key != NULL)) return cfg_usage_error(&UP_CMD, "--tls-cert and --tls-key go together");
    const char *files[2] = {cert, key};
    for (int i = 0; i < 2; i++)
        if (files[i] && access(files[i], R_OK) != 0)
            return cfg_usage_error(&UP_CMD, "%s %s: %s", i ? "--tls-key" : "--tls-cert", files[i], strerror(errno));
    char cfgjson[PATH_MAX];
    snprintf(cfgjson, sizeof cfgjson, "%s/config.json", mdir ? mdir : "");
    if (mdir && access(cfgjson, R_OK) != 0)
        return cfg_usage_error(&UP_CMD, "--model-dir %s: no readable config.json (%s)", mdir, strerror(errno));
    if (cfg_str(o, "model-name") && !mdir) return cfg_usage_error(&UP_CMD, "--model-name goes with --model-dir");
    if (cfg_str(o, "models")) {
        if (mdir) return cfg_usage_error(&UP_CMD, "--models names every model: leave --model-dir out");
        up_model ms[MAX_MODELS];
        if (parse_models(cfg_str(o, "models"), ms, err, sizeof err) < 0) return cfg_usage_error(&UP_CMD, "%s", err);
    }
    return 0;
}

int up_main(int argc, char **argv) {
    cfg o;
    int rc = 2;
    if (!cfg_parse(&UP_CMD, argc, argv, &o, &rc)) return rc;
    if (check_up_opts(&o)) return 2;
    const char *host = cfg_str(&o, "host"), *model_dir = cfg_str(&o, "model-dir"),
               *model_name = cfg_str(&o, "model-name");
    /* The base models: --models, else --model-dir (or the generated tiny model). */
    static up_model models[MAX_MODELS];
    char err[1024];
    int n_models = cfg_str(&o, "models") ? parse_models(cfg_str(&o, "models"), models, err, sizeof err) : 1;
    /* The executors: on the CPU, --executors-per-model of each model; with GPUs (cuda
     * without --device), one per GPU, the GPUs shared out among the models in turn; with
     * --device, that device for each model's executors. No --backend: cuda where it finds
     * GPUs, else cpu. */
    const char *backend = cfg_level(&o, "backend") == CFG_DEFAULT ? NULL : cfg_str(&o, "backend");
    const char *device = cfg_level(&o, "device") == CFG_DEFAULT ? NULL : cfg_str(&o, "device");
    int per_model = (int)cfg_int(&o, "executors-per-model"), n_exec = n_models * per_model,
        gpus = be_backend_find("cuda") && (!backend || !strcmp(backend, "cuda")) ? probe_devices("cuda") : 0;
    if (!backend) backend = gpus > 0 ? "cuda" : "cpu";
    bool per_gpu = !device && !strcmp(backend, "cuda");
    if (per_gpu) {
        if (gpus == 0) return cfg_usage_error(&UP_CMD, "--backend cuda: no CUDA device on this machine");
        if (gpus < n_models)
            return cfg_usage_error(&UP_CMD, "%d base models need at least as many GPUs (found %d)", n_models, gpus);
        n_exec = gpus < MAX_EXECUTORS ? gpus : MAX_EXECUTORS;
    }
    if (n_exec > MAX_EXECUTORS) return cfg_usage_error(&UP_CMD, "at most %d executors", MAX_EXECUTORS);
    log_info("%d %s executor%s for %d base model%s%s%s", n_exec, backend, n_exec > 1 ? "s" : "", n_models,
             n_models > 1 ? "s" : "", device ? " on device " : "", device ? device : "");
    /* stdout carries the three lines below and nothing else: what pg_ctl, mkmodel or a
     * child prints goes to stderr with the log. */
    int out_fd = dup(1);
    FILE *announce = out_fd >= 0 ? fdopen(out_fd, "w") : NULL;
    if (announce) dup2(2, 1);
    else announce = stdout;
    char data_dir[PATH_MAX], absdata[PATH_MAX];
    cfg_data_dir(&o, data_dir, sizeof data_dir);
    /* Keys, the secret, blobs (tenants' weights), the model, logs: for the service user
     * only, in this process and every child (PostgreSQL sets its own modes). */
    umask(077);
    mkdir(data_dir, 0700);
    if (!realpath(data_dir, absdata)) { log_error("data directory %s: %s", data_dir, strerror(errno)); return 1; }
    char conninfo[4096], db_from[PATH_MAX + 400];
    bool own_cluster = cfg_db(&o, conninfo, sizeof conninfo, db_from, sizeof db_from);
    /* Say which database, and which setting was passed over (an exported DATABASE_URL
     * must not surprise anyone). */
    log_info("database: %s", db_from);
    if (own_cluster && cfg_str(&o, "db"))
        log_warn("not using the db from %s: the data directory was given on a stronger level (--data-dir on the "
                 "command line beats the environment); pass --db to combine them", cfg_where(&o, "db"));
    snprintf(data_dir, sizeof data_dir, "%s", absdata);
    if (own_cluster ? pgc_private_dir(data_dir, err, sizeof err) < 0 : chmod(data_dir, 0700) < 0) {
        log_error("data directory %s: %s", data_dir, own_cluster ? err : strerror(errno));
        return 1;
    }
    /* No SA_RESTART: a signal must interrupt waitpid below. */
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    db_set_stop_flag(&g_stop);

    if (up_lock_take(data_dir, err, sizeof err) < 0) {
        log_error("%s", err);
        return 1;
    }
    if (own_cluster) {
        pgcluster pc;
        if (pgc_start(data_dir, &pc, err, sizeof err) < 0) { log_error("%s", err); return 1; }
        snprintf(conninfo, sizeof conninfo, "%s", pc.conninfo);
    }
    rc = 1;
    /* children: the executors first, then the scheduler, the api and the registry GC */
    const int SCH = n_exec, API = n_exec + 1, GC = n_exec + 2, NC = n_exec + 3;
    child cs[MAX_EXECUTORS + 3];
    memset(cs, 0, sizeof cs);
    for (int i = 0; i < n_exec; i++) cs[i].role = "executor";
    cs[SCH].role = "scheduler";
    cs[API].role = "api";
    cs[API].reads_port = true;
    cs[GC].role = "adapter gc";
    PGconn *c = db_connect(conninfo, 30000, err, sizeof err);
    if (!c) { log_error("database: %s", err); goto out; }
    if (migrate_run(c, err, sizeof err) < 0) { log_error("migrate: %s", err); goto out; }

    char secret_path[PATH_MAX], key[KEY_MAX_LEN];
    unsigned char secret[KEY_SECRET_BYTES];
    cfg_secret_file(&o, secret_path, sizeof secret_path);
    if (keys_init() < 0 || cfg_secret(&o, true, secret, err, sizeof err) < 0 ||
        ensure_key(c, data_dir, secret, key, err, sizeof err) < 0) {
        log_error("%s", err);
        goto out;
    }

    char mdir[PATH_MAX];
    if (!cfg_str(&o, "models") && !model_dir) {
        snprintf(mdir, sizeof mdir, "%s/models", data_dir);
        mkdir(mdir, 0755);
        snprintf(mdir, sizeof mdir, "%s/models/tiny-llama", data_dir);
        char cfg[PATH_MAX + 16];
        /* tokenizer_config.json (the chat template) is written last and is missing in
         * models generated by older versions: (re)generate until it is there. */
        snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", mdir);
        struct stat sb;
        if (stat(cfg, &sb) < 0) {
            log_info("generating the default model (tiny Llama, random weights) in %s", mdir);
            char *margv[] = {"mkmodel", "--arch", "llama", "--preset", "tiny", "--seed", "1", "--out", mdir, NULL};
            if (mkmodel_main(9, margv) != 0) { log_error("mkmodel failed"); goto out; }
        }
        model_dir = mdir;
        if (!model_name) model_name = "loom/tiny-llama";
    } else if (model_dir && !model_name) {
        const char *slash = strrchr(model_dir, '/');
        model_name = slash && slash[1] ? slash + 1 : model_dir;
    }
    if (!cfg_str(&o, "models")) {
        snprintf(models[0].name, sizeof models[0].name, "%s", model_name);
        snprintf(models[0].dir, sizeof models[0].dir, "%s", model_dir);
    }

    char blob_dir[PATH_MAX];
    cfg_blob_dir(&o, blob_dir, sizeof blob_dir);
    /* The children read no config file: what they run with is what up was given. */
    static argvec exe[MAX_EXECUTORS];
    char dev_s[MAX_EXECUTORS][16], name_s[MAX_EXECUTORS][32];
    static const char *const per_executor[] = {"backend", "device", NULL};
    /* CPU executors share one RAM: without --memory-budget each would take half of it (an
     * executor's default), so the adapters of two would take it all. Together they take
     * the half: each half of what is available now, over their number. */
    char share_s[32] = "";
    if (!strcmp(backend, "cpu") && n_exec > 1 && !cfg_str(&o, "memory-budget")) {
        FILE *mi = fopen("/proc/meminfo", "r");
        char line[256];
        unsigned long long kb = 0;
        while (mi && fgets(line, sizeof line, mi) && sscanf(line, "MemAvailable: %llu kB", &kb) != 1) {}
        if (mi) fclose(mi);
        if (kb) snprintf(share_s, sizeof share_s, "%llu", (kb << 10) / 2 / (unsigned long long)n_exec);
    }
    for (int i = 0; i < n_exec; i++) {
        argvec *e = &exe[i];
        const up_model *m = &models[per_gpu ? i % n_models : i / per_model];
        snprintf(dev_s[i], sizeof dev_s[i], "%s", device ? device : per_gpu ? "" : "0");
        if (per_gpu) snprintf(dev_s[i], sizeof dev_s[i], "%d", i);
        snprintf(name_s[i], sizeof name_s[i], "up-%d", i);
        av_add(e, "loom"), av_add(e, "executor"), av_opt(e, "config", "/dev/null"), av_opt(e, "db", conninfo);
        av_opt(e, "model-dir", m->dir), av_opt(e, "model-name", m->name), av_opt(e, "blob-dir", blob_dir);
        av_opt(e, "backend", backend), av_opt(e, "device", dev_s[i]), av_opt(e, "name", name_s[i]);
        av_pass(e, &o, EXE_OPTS, per_executor);
        av_pass(e, &o, SCHED_CLAIM_OPTS, NULL);   /* an idle executor builds its own cycle too */
        if (*share_s) av_opt(e, "memory-budget", share_s);
    }
    argvec sch = {0}, api = {0}, gc = {0};
    av_add(&sch, "loom"), av_add(&sch, "scheduler"), av_opt(&sch, "config", "/dev/null"), av_opt(&sch, "db", conninfo);
    av_pass(&sch, &o, SCHED_OPTS, NULL);
    av_pass(&sch, &o, SCHED_CLAIM_OPTS, NULL);
    av_pass(&sch, &o, CFG_EXECUTOR_TIMEOUT, NULL);
    av_add(&api, "loom"), av_add(&api, "api"), av_opt(&api, "config", "/dev/null"), av_opt(&api, "db", conninfo);
    av_opt(&api, "host", host), av_opt(&api, "threads", cfg_str(&o, "api-threads"));
    av_opt(&api, "blob-dir", blob_dir);
    if (secret_path[0]) av_opt(&api, "secret-file", secret_path);   /* else LOOM_SECRET, inherited */
    av_pass(&api, &o, API_TUNING_OPTS, NULL);
    av_pass(&api, &o, CFG_EXECUTOR_TIMEOUT, NULL);
    int port_at = api.n + 1;
    av_opt(&api, "port", cfg_str(&o, "port"));
    av_add(&gc, "loom"), av_add(&gc, "adapter"), av_add(&gc, "gc"), av_opt(&gc, "config", "/dev/null");
    av_opt(&gc, "db", conninfo), av_opt(&gc, "blob-dir", blob_dir), av_opt(&gc, "every", cfg_str(&o, "gc-every"));
    char **sch_argv = sch.v, **api_argv = api.v, **gc_argv = gc.v;
    int api_out = -1;
    int64_t floor0 = executor_id_floor(c);
    bool forked = true;
    for (int i = 0; i < n_exec; i++) {
        cs[i].id_floor = floor0;
        cs[i].argv = exe[i].v;
        forked &= (cs[i].pid = spawn(exe[i].v, NULL)) > 0;
    }
    forked &= (cs[SCH].pid = spawn(sch_argv, NULL)) > 0;
    forked &= (cs[API].pid = spawn(api_argv, &api_out)) > 0;
    note_children(cs, NC);
    if (!forked) { log_error("fork: %s", strerror(errno)); goto out; }
    cs[SCH].argv = sch_argv;
    cs[API].argv = api_argv;
    for (int i = 0; i <= API; i++) cs[i].started = clock_mono_s();
    int api_port = read_port(api_out, 30000);
    if (api_port <= 0) { log_error("the api did not start (see messages above)"); goto out; }
    /* A restarted api must come back on the same port (the printed URL stays valid). */
    char api_port_s[16];
    snprintf(api_port_s, sizeof api_port_s, "%d", api_port);
    api_argv[port_at] = api_port_s;

    /* Ready = every executor registered for this model and is idle. */
    bool ready = true;
    for (int i = 0; i < n_exec && ready; i++) {
        char epid[16];
        snprintf(epid, sizeof epid, "%d", (int)cs[i].pid);
        const char *pp[1] = {epid};
        ready = false;
        for (int t = 0; t < 1200 && !g_stop && !ready; t++) {
            PGresult *r = db_query(c, SQL_UP_EXECUTOR_READY, 1, pp, err, sizeof err);
            ready = r && PQntuples(r) > 0;
            if (r) PQclear(r);
            if (!ready) {
                if (waitpid(cs[i].pid, NULL, WNOHANG) == cs[i].pid) { cs[i].pid = 0; break; }
                usleep(100 * 1000);
            }
        }
        if (!ready) log_error("the executor on %s device %s did not become ready (see messages above)", backend, dev_s[i]);
    }
    if (!ready) goto out;

    /* Registry GC, hourly (expired versions, unreferenced and orphan blobs). */
    cs[GC].argv = gc_argv;
    if (start_child(&cs[GC], c) < 0) child_died(&cs[GC], -1);
    note_children(cs, NC);

    fprintf(announce, "DATABASE_URL=%s\n", conninfo);
    fprintf(announce, "TINKER_BASE_URL=%s://%s:%d\n", cfg_str(&o, "tls-cert") ? "https" : "http", host, api_port);
    fprintf(announce, "TINKER_API_KEY=%s\n", key);
    fflush(announce);
    for (int m = 0; m < n_models; m++)
        log_info("Loom is up: model %s (%s) on %d %s executor%s; Ctrl-C stops it", models[m].name, models[m].dir,
                 per_gpu ? (n_exec - m + n_models - 1) / n_models : per_model, backend,
                 (per_gpu ? (n_exec - m + n_models - 1) / n_models : per_model) > 1 ? "s" : "");

    /* The api's stdout is no longer needed; drain it so a full pipe never blocks it. */
    close(api_out);
    rc = 0;
    char hostname[256] = "localhost";
    gethostname(hostname, sizeof hostname);
    double next_watch = clock_mono_s() + WATCH_EVERY_S, db_answers_since = clock_mono_s();
    int db_session = PQbackendPID(c);
    while (!g_stop) {
        int st;
        pid_t pid;
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
            for (int i = 0; i < NC; i++)
                if (cs[i].pid == pid && !g_stop) {
                    if (i < n_exec) executor_died(&cs[i], c, hostname);
                    child_died(&cs[i], WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
                }
        }
        for (int i = 0; i < NC && !g_stop; i++) {
            if (cs[i].pid || cs[i].restart_at <= 0 || clock_mono_s() < cs[i].restart_at) continue;
            if (start_child(&cs[i], c) < 0) {
                log_warn("%s did not start again; trying later", cs[i].role);
                if (cs[i].pid > 0) kill(cs[i].pid, SIGKILL);   /* reaped above, then retried */
                else child_died(&cs[i], -1);
            } else {
                log_info("%s restarted (pid %d)", cs[i].role, (int)cs[i].pid);
            }
            note_children(cs, NC);
        }
        if (clock_mono_s() >= next_watch) {
            /* Since when the database answers this connection without a break: a failed
             * query or a new session (a reset) starts it over. */
            if (PQstatus(c) != CONNECTION_OK) db_reset(c);
            if (PQstatus(c) != CONNECTION_OK || PQbackendPID(c) != db_session) {
                db_session = PQbackendPID(c);
                db_answers_since = clock_mono_s();
            }
            int silent_s = (int)cfg_int(&o, "executor-timeout-s");
            bool judge = clock_mono_s() - db_answers_since >= silent_s;
            for (int i = 0; i < n_exec; i++)
                if (watch_executor(&cs[i], c, hostname, silent_s, judge) < 0) db_answers_since = clock_mono_s();
            next_watch = clock_mono_s() + WATCH_EVERY_S;
        }
        usleep(100 * 1000);   /* a signal cuts it short */
    }
out:
    stop_children(cs, NC);
    if (c) PQfinish(c);
    if (own_cluster && pgc_stop(data_dir, err, sizeof err) < 0) log_warn("%s", err);
    log_info("stopped");
    return rc;
}
