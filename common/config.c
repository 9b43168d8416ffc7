/* config.c: settings from the command line, the environment and the config file (see
 * config.h for the order), and the shared settings: data directory, database, secret,
 * blob store. The config file is read with inih (Debian's libinih). */
#include "common/config.h"
#include "common/db.h"
#include "common/keys.h"
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CFG_DEFAULT_FILE "/etc/loom/loom.conf"
#define CFG_MAX_VALUE 4096

const opt_spec CFG_DB[] = {
    {.name = "db", .kind = OPT_STR, .arg = "CONNINFO", .env = "DATABASE_URL",
     .help = "PostgreSQL connection string (default: the data directory's private cluster)"},
    {0}};
const opt_spec CFG_DATA_DIR[] = {
    {.name = "data-dir", .kind = OPT_STR, .arg = "DIR", .env = "LOOM_DATA_DIR",
     .help = "data directory (default: /var/lib/loom as root, else ~/.loom)"},
    {0}};
const opt_spec CFG_SECRET[] = {
    {.name = "secret-file", .kind = OPT_STR, .arg = "FILE", .env = "LOOM_SECRET_FILE",
     .help = "server secret for API key hashes (default: <data-dir>/secret.key; $LOOM_SECRET: the secret itself)"},
    {0}};
const opt_spec CFG_BLOBS[] = {
    {.name = "blob-dir", .kind = OPT_STR, .arg = "DIR", .env = "LOOM_BLOB_DIR",
     .help = "registry blob store (default: <data-dir>/blobs)"},
    {0}};
const opt_spec CFG_EXECUTOR_TIMEOUT[] = {
    {.name = "executor-timeout-s", .kind = OPT_INT, .arg = "S", .def = "30", .lo = 2, .hi = 3600,
     .help = "an executor without a heartbeat for S seconds is gone: its models move, and it no longer counts as "
             "serving its base model (executors beat every 3 s)"},
    {0}};
static const opt_spec CFG_COMMON[] = {
    {.name = "config", .kind = OPT_STR, .arg = "FILE", .env = "LOOM_CONFIG",
     .help = "config file (default: " CFG_DEFAULT_FILE " when it exists; /dev/null: none)"},
    {.name = "help", .kind = OPT_FLAG, .help = "this text"},
    {0}};

/* The sections a config file may have; keys of other commands' sections are checked by
 * those commands. */
static const char *const SECTIONS[] = {"", "up", "api", "scheduler", "executor", "gc", NULL};

/* ---- usage ----------------------------------------------------------------------------- */

static void print_opt(FILE *f, const opt_spec *s) {
    char left[64];
    snprintf(left, sizeof left, "--%s%s%s", s->name, s->arg ? " " : "", s->arg ? s->arg : "");
    fprintf(f, "  %-26s %s", left, s->help);
    if (s->def) fprintf(f, " (default %s)", s->def);
    if (s->env) fprintf(f, " [$%s]", s->env);
    fputc('\n', f);
}

void cfg_usage(const cfg_cmd *cmd, bool to_stdout) {
    FILE *f = to_stdout ? stdout : stderr;
    fprintf(f, "usage: %s %s\n", cmd->cmd, cmd->synopsis ? cmd->synopsis : "[options]");
    if (cmd->about) fprintf(f, "%s\n", cmd->about);
    fprintf(f, "options:\n");
    for (int t = 0; t < CFG_MAX_TABLES && cmd->tables[t]; t++)
        for (const opt_spec *s = cmd->tables[t]; s->name; s++) print_opt(f, s);
    for (const opt_spec *s = CFG_COMMON; s->name; s++) print_opt(f, s);
    if (cmd->section)
        fprintf(f, "Each option may also be set in the config file, in section [%s] (`name = value`).\n",
                cmd->section);
}

int cfg_usage_error(const cfg_cmd *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", cmd->cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    cfg_usage(cmd, false);
    return 2;
}

/* ---- values ---------------------------------------------------------------------------- */

static int find(const cfg *o, const char *name) {
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->spec[i]->name, name)) return i;
    return -1;
}

/* Checks a value for its option; NULL if fine, else what is wrong. */
static const char *check_value(const opt_spec *s, const char *v, char *why, size_t n) {
    if (s->kind == OPT_INT) {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < s->lo || x > s->hi) {
            snprintf(why, n, "--%s must be a whole number from %ld to %ld, got '%s'", s->name, s->lo, s->hi, v);
            return why;
        }
    } else if (s->kind == OPT_STR && !*v) {
        snprintf(why, n, "--%s needs a value, got an empty one", s->name);
        return why;
    } else if (strlen(v) > CFG_MAX_VALUE) {
        snprintf(why, n, "--%s: value too long (at most %d bytes)", s->name, CFG_MAX_VALUE);
        return why;
    }
    return NULL;
}

/* A flag's value in the config file: true/false (yes/no, 1/0, on/off). */
static int parse_bool(const char *v) {
    static const char *const yes[] = {"true", "yes", "1", "on"}, *const no[] = {"false", "no", "0", "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, yes[i])) return 1;
        if (!strcasecmp(v, no[i])) return 0;
    }
    return -1;
}

static void set(cfg *o, int i, const char *v, int level, const char *where) {
    o->val[i] = v;
    o->level[i] = level;
    snprintf(o->where[i], sizeof o->where[i], "%s", where);
}

const char *cfg_str(const cfg *o, const char *name) {
    int i = find(o, name);
    return i < 0 ? NULL : o->val[i];
}

long cfg_int(const cfg *o, const char *name) {
    const char *v = cfg_str(o, name);
    return v ? strtol(v, NULL, 10) : 0;
}

bool cfg_flag(const cfg *o, const char *name) {
    const char *v = cfg_str(o, name);
    return v && !strcmp(v, "1");
}

const char *cfg_where(const cfg *o, const char *name) {
    int i = find(o, name);
    return i < 0 || !o->val[i] ? "default" : o->where[i];
}

int cfg_level(const cfg *o, const char *name) {
    int i = find(o, name);
    return i < 0 || !o->val[i] ? CFG_DEFAULT : o->level[i];
}

/* ---- the config file ------------------------------------------------------------------- */

typedef struct {
    cfg *o;
    char msg[512];
} file_ctx;

/* inih calls this for every `name = value`; 0 stops with the line number. Values are
 * kept (strdup) for the life of the process, like argv. */
static int on_entry(void *user, const char *section, const char *name, const char *value) {
    file_ctx *fc = user;
    cfg *o = fc->o;
    bool known = false;
    for (int k = 0; SECTIONS[k]; k++) known = known || !strcmp(section, SECTIONS[k]);
    if (!known) {
        snprintf(fc->msg, sizeof fc->msg, "unknown section [%s] (sections: [up] [api] [scheduler] [executor] [gc])",
                 section);
        return 0;
    }
    bool mine = o->cmd->section && !strcmp(section, o->cmd->section);
    if (*section && !mine) return 1;   /* another command's */
    int i = find(o, name);
    if (!*section) {
        /* The top of the file holds the shared settings, whichever command reads it. */
        bool shared = !strcmp(name, "db") || !strcmp(name, "data-dir") || !strcmp(name, "secret-file") ||
                      !strcmp(name, "blob-dir") || !strcmp(name, "executor-timeout-s");
        if (!shared) {
            snprintf(fc->msg, sizeof fc->msg, "unknown setting '%s' at the top (shared settings: db, data-dir, "
                     "secret-file, blob-dir, executor-timeout-s; a command's own options go in its section)", name);
            return 0;
        }
        if (i < 0) return 1;   /* shared, but not this command's */
    } else if (i < 0 || !strcmp(name, "config") || !strcmp(name, "help")) {
        snprintf(fc->msg, sizeof fc->msg, "unknown setting '%s' in [%s] (see `%s --help`)", name, section, o->cmd->cmd);
        return 0;
    }
    const opt_spec *s = o->spec[i];
    const char *v = value;
    char why[256];
    if (s->kind == OPT_FLAG) {
        int b = parse_bool(value);
        if (b < 0) {
            snprintf(fc->msg, sizeof fc->msg, "%s takes true or false, got '%s'", name, value);
            return 0;
        }
        v = b ? "1" : NULL;
    } else if (check_value(s, value, why, sizeof why)) {
        snprintf(fc->msg, sizeof fc->msg, "%s", why + 2);   /* without the "--" */
        return 0;
    }
    /* Top-level entries come before the first section, so a command's section, read
     * later, overrides them. */
    char where[sizeof o->where[0]];
    snprintf(where, sizeof where, "%s%s%s%s", o->file, *section ? " [" : "", section, *section ? "]" : "");
    set(o, i, v ? strdup(v) : NULL, CFG_FILE, where);
    return 1;
}

/* The config file: --config, $LOOM_CONFIG, or the default one when it exists. */
static int read_file(cfg *o, int argc, char **argv, int *rc) {
    bool uses = o->cmd->section || find(o, "db") >= 0 || find(o, "data-dir") >= 0 || find(o, "blob-dir") >= 0;
    if (!uses) return 0;   /* mkmodel, tokenize: nothing there for them */
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "--config") && i + 1 < argc) path = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9)) path = argv[i] + 9;
    }
    if (!path && getenv("LOOM_CONFIG") && *getenv("LOOM_CONFIG")) path = getenv("LOOM_CONFIG");
    bool given = path != NULL;
    if (!path) {
        if (access(CFG_DEFAULT_FILE, F_OK) != 0) return 0;
        path = CFG_DEFAULT_FILE;
    }
    snprintf(o->file, sizeof o->file, "%s", path);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: config file %s: %s%s\n", o->cmd->cmd, path, strerror(errno),
                given ? "" : " (--config /dev/null reads none)");
        *rc = 2;
        return -1;
    }
    file_ctx fc = {.o = o};
    int line = ini_parse_file(f, on_entry, &fc);
    fclose(f);
    if (line != 0) {
        fprintf(stderr, "%s: %s:%d: %s\n", o->cmd->cmd, path, line,
                fc.msg[0] ? fc.msg : "not `name = value`, a [section] or a comment");
        *rc = 2;
        return -1;
    }
    return 0;
}

/* ---- the command line ------------------------------------------------------------------ */

bool cfg_parse(const cfg_cmd *cmd, int argc, char **argv, cfg *o, int *rc) {
    memset(o, 0, sizeof *o);
    o->cmd = cmd;
    *rc = 2;
    for (int t = 0; t <= CFG_MAX_TABLES; t++) {
        const opt_spec *tab = t < CFG_MAX_TABLES && cmd->tables[t] ? cmd->tables[t] : CFG_COMMON;
        for (const opt_spec *s = tab; s->name && o->n < CFG_MAX_OPTS; s++) {
            o->spec[o->n] = s;
            set(o, o->n, s->def, CFG_DEFAULT, "default");
            o->n++;
        }
        if (tab == CFG_COMMON) break;
    }
    /* --help first: it answers whatever else is wrong. */
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            cfg_usage(cmd, true);
            *rc = 0;
            return false;
        }
    if (read_file(o, argc, argv, rc) < 0) return false;
    for (int i = 0; i < o->n; i++) {
        const char *env = o->spec[i]->env ? getenv(o->spec[i]->env) : NULL;
        if (!env || !*env) continue;
        char why[256];
        if (check_value(o->spec[i], env, why, sizeof why)) {
            fprintf(stderr, "%s: $%s: %s\n", cmd->cmd, o->spec[i]->env, why);
            return false;
        }
        set(o, i, env, CFG_ENV, o->spec[i]->env);
    }
    bool only_pos = false;
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (only_pos || arg[0] != '-' || !arg[1]) {
            if (o->npos >= cmd->max_pos || o->npos >= CFG_MAX_POS) {
                cfg_usage_error(cmd, "unexpected argument '%s'", arg);
                return false;
            }
            o->pos[o->npos++] = arg;
            continue;
        }
        if (!strcmp(arg, "--")) { only_pos = true; continue; }
        if (arg[1] != '-') { cfg_usage_error(cmd, "unknown option '%s'", arg); return false; }
        char name[128];
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1), arg + 2);
        int i = find(o, name);
        if (i < 0 || !strcmp(name, "help")) {
            cfg_usage_error(cmd, "unknown option '--%s'", name);
            return false;
        }
        const opt_spec *s = o->spec[i];
        const char *v;
        if (s->kind == OPT_FLAG) {
            if (eq) { cfg_usage_error(cmd, "--%s takes no value", name); return false; }
            v = "1";
        } else if (eq) {
            v = eq + 1;
        } else if (a + 1 < argc) {
            v = argv[++a];
        } else {
            cfg_usage_error(cmd, "--%s needs a value (%s)", name, s->arg ? s->arg : "a value");
            return false;
        }
        char why[256];
        if (s->kind != OPT_FLAG && check_value(s, v, why, sizeof why)) {
            cfg_usage_error(cmd, "%s", why);
            return false;
        }
        char where[64];
        snprintf(where, sizeof where, "--%s", name);
        set(o, i, v, CFG_FLAG, where);
    }
    if (o->npos < cmd->min_pos) {
        cfg_usage_error(cmd, "missing %s", cmd->pos_name ? cmd->pos_name : "argument");
        return false;
    }
    for (int i = 0; i < o->n; i++)
        if (o->spec[i]->required && !o->val[i]) {
            cfg_usage_error(cmd, "missing --%s %s", o->spec[i]->name, o->spec[i]->arg ? o->spec[i]->arg : "");
            return false;
        }
    *rc = 0;
    return true;
}

/* ---- shared settings ------------------------------------------------------------------- */

void cfg_data_dir(const cfg *o, char *out, size_t n) {
    const char *d = cfg_str(o, "data-dir");
    char def[PATH_MAX];
    if (!d) {
        const char *home = getenv("HOME");
        if (geteuid() == 0) snprintf(def, sizeof def, "/var/lib/loom");
        else snprintf(def, sizeof def, "%s/.loom", home && *home ? home : ".");
        d = def;
    }
    char abs[PATH_MAX];
    snprintf(out, n, "%s", realpath(d, abs) ? abs : d);
}

/* An explicit setting wins over one derived from the data directory unless the data
 * directory was given at a stronger level (config.h). */
static bool explicit_wins(const cfg *o, const char *name) {
    int lv = cfg_level(o, name);
    return cfg_str(o, name) && lv > CFG_DEFAULT && lv >= cfg_level(o, "data-dir");
}

bool cfg_db(const cfg *o, char *out, size_t n, char *from, size_t fromlen) {
    if (explicit_wins(o, "db")) {
        snprintf(out, n, "%s", cfg_str(o, "db"));
        snprintf(from, fromlen, "db from %s", cfg_where(o, "db"));
        return false;
    }
    char dir[PATH_MAX];
    cfg_data_dir(o, dir, sizeof dir);
    snprintf(out, n, "host=%s/pg port=5432 dbname=loom user=loom", dir);
    snprintf(from, fromlen, "the private cluster of data directory %s, %s%s", dir,
             cfg_str(o, "data-dir") ? "from " : "", cfg_str(o, "data-dir") ? cfg_where(o, "data-dir") : "the default");
    return true;
}

PGconn *cfg_connect(const cfg *o, int wait_ms, char *err, size_t errlen) {
    char ci[CFG_MAX_VALUE + 64], from[PATH_MAX + 400], dir[PATH_MAX], pg[PATH_MAX + 4];
    bool own = cfg_db(o, ci, sizeof ci, from, sizeof from);
    cfg_data_dir(o, dir, sizeof dir);
    snprintf(pg, sizeof pg, "%s/pg", dir);
    struct stat sb;
    if (own && stat(pg, &sb) != 0) {
        snprintf(err, errlen, "no database: none is configured and data directory %s has no private cluster "
                 "(pg/); set DATABASE_URL, --db CONNINFO or db in %s, or give the --data-dir of a `loom up`",
                 dir, o->file[0] ? o->file : CFG_DEFAULT_FILE);
        return NULL;
    }
    char why[512];
    PGconn *c = db_connect(ci, wait_ms, why, sizeof why);
    if (!c)
        snprintf(err, errlen, "cannot connect to the database (%s): %s%s", from, why,
                 own ? "; is `loom up` running? (`loom pg start --data-dir DIR` starts the cluster alone)" : "");
    return c;
}

void cfg_secret_file(const cfg *o, char *out, size_t n) {
    const char *env = getenv("LOOM_SECRET");
    int file_level = cfg_str(o, "secret-file") && cfg_level(o, "secret-file") > CFG_DEFAULT
                         ? cfg_level(o, "secret-file") : cfg_level(o, "data-dir");
    if (env && *env && CFG_ENV >= file_level) { out[0] = 0; return; }
    if (explicit_wins(o, "secret-file")) { snprintf(out, n, "%s", cfg_str(o, "secret-file")); return; }
    char dir[PATH_MAX];
    cfg_data_dir(o, dir, sizeof dir);
    snprintf(out, n, "%s/secret.key", dir);
}

int cfg_secret(const cfg *o, bool create, unsigned char *out, char *err, size_t errlen) {
    char path[PATH_MAX];
    cfg_secret_file(o, path, sizeof path);
    if (!path[0]) return keys_parse_secret(getenv("LOOM_SECRET"), "LOOM_SECRET", out, err, errlen);
    return keys_load_secret(path, create, out, err, errlen);
}

void cfg_blob_dir(const cfg *o, char *out, size_t n) {
    if (explicit_wins(o, "blob-dir")) { snprintf(out, n, "%s", cfg_str(o, "blob-dir")); return; }
    char dir[PATH_MAX];
    cfg_data_dir(o, dir, sizeof dir);
    snprintf(out, n, "%s/blobs", dir);
}

size_t cfg_parse_bytes(const char *s) {
    char *end;
    double v = strtod(s, &end);
    const char *units = "KMGT", *u = *end ? strchr(units, *end) : NULL;
    if (end == s || v <= 0 || (*end && (!u || end[1]))) return 0;
    for (const char *k = units; u && k <= u; k++) v *= 1024;
    return (size_t)v;
}
