/* config.h: how every `loom` subcommand reads its settings, and where the data directory,
 * the database, the server secret and the blob store are. One story for all of them:
 *
 *   1. the command line:  --name VALUE  (or --name=VALUE)
 *   2. the environment, for the shared settings only: DATABASE_URL (db), LOOM_DATA_DIR,
 *      LOOM_SECRET_FILE, LOOM_BLOB_DIR, and LOOM_SECRET (the secret itself, hex)
 *   3. the config file: --config FILE, else $LOOM_CONFIG, else /etc/loom/loom.conf when it
 *      exists; ini syntax, `name = value` with the option's name. Shared settings at the
 *      top; a command's own options in its section: [up], [api], [scheduler], [executor],
 *      [gc] (`loom adapter gc`)
 *   4. the built-in default
 *
 * The database, the secret file and the blob store default to the data directory's
 * (its private PostgreSQL cluster pg/, secret.key, blobs/). Such a derived value counts
 * at the level where the data directory was given: `--data-dir X` on the command line
 * means X's database even when DATABASE_URL is exported (pass --db as well to combine
 * them), while an exported DATABASE_URL beats a data directory from the config file.
 *
 * Parsing is strict: an unknown option, a missing or malformed value, a missing argument
 * is an error that names it, followed by the command's usage (exit status 2); --help
 * prints the usage on stdout (exit status 0). Own parser rather than getopt_long: that
 * one takes abbreviations (--po for --port), and its messages name argv[0], not the
 * subcommand. */
#pragma once
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum { OPT_STR, OPT_INT, OPT_FLAG } opt_kind;

typedef struct {
    const char *name;    /* "max-body-mb": --max-body-mb, and `max-body-mb =` in the file */
    opt_kind kind;
    const char *arg;     /* what the value is, for the usage: "N", "DIR" */
    const char *def;     /* the default as text (NULL: none) */
    long lo, hi;         /* OPT_INT: the accepted range */
    const char *help;
    const char *env;     /* the environment variable, or NULL */
    bool required;
} opt_spec;              /* tables end with an entry whose name is NULL */

/* The shared settings, for commands to list among their tables. */
extern const opt_spec CFG_DB[];        /* db */
extern const opt_spec CFG_DATA_DIR[];  /* data-dir */
extern const opt_spec CFG_SECRET[];    /* secret-file */
extern const opt_spec CFG_BLOBS[];     /* blob-dir */
/* executor-timeout-s: the scheduler writes off an executor silent that long, and the api
 * counts an executor as serving (readiness, futures) only while it beat within it. */
extern const opt_spec CFG_EXECUTOR_TIMEOUT[];

#define CFG_MAX_OPTS 64
#define CFG_MAX_POS 8
#define CFG_MAX_TABLES 12

typedef struct {
    const char *cmd;                 /* "loom key create": messages and usage */
    const char *section;             /* its config file section, or NULL */
    const char *synopsis;            /* after the command in the usage line: "NAME [options]" */
    const char *about;               /* a paragraph after the synopsis (NULL: none) */
    const opt_spec *tables[CFG_MAX_TABLES];   /* NULL-terminated (at most CFG_MAX_TABLES - 1) */
    int min_pos, max_pos;            /* positional arguments */
    const char *pos_name;            /* what they are, for "missing NAME" */
} cfg_cmd;

enum { CFG_DEFAULT = 0, CFG_FILE = 1, CFG_ENV = 2, CFG_FLAG = 3 };

typedef struct {
    const cfg_cmd *cmd;
    int n;
    const opt_spec *spec[CFG_MAX_OPTS];
    const char *val[CFG_MAX_OPTS];   /* NULL: not set and no default */
    int level[CFG_MAX_OPTS];
    char where[CFG_MAX_OPTS][320];   /* "--db", "DATABASE_URL", "/etc/loom/loom.conf [api]" */
    const char *pos[CFG_MAX_POS];
    int npos;
    char file[256];                  /* the config file read, "" if none */
} cfg;

/* Parses argv (argv[0] is the command word) with the config file and the environment
 * into o. Returns true to go on; false when the command is done: *rc is 0 after --help,
 * 2 after an error (message and usage on stderr). */
bool cfg_parse(const cfg_cmd *cmd, int argc, char **argv, cfg *o, int *rc);
void cfg_usage(const cfg_cmd *cmd, bool to_stdout);
/* Prints "loom CMD: <message>" and the usage on stderr; returns 2 (for return). */
int cfg_usage_error(const cfg_cmd *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Values after parsing: the text (or the default; NULL if neither), the number, set? */
const char *cfg_str(const cfg *o, const char *name);
long cfg_int(const cfg *o, const char *name);
bool cfg_flag(const cfg *o, const char *name);
/* Where a value came from ("--port", "LOOM_DATA_DIR", "/etc/loom/loom.conf", "default"). */
const char *cfg_where(const cfg *o, const char *name);
int cfg_level(const cfg *o, const char *name);

/* The data directory, absolute when it exists (/var/lib/loom as root, else ~/.loom by
 * default). */
void cfg_data_dir(const cfg *o, char *out, size_t n);
/* The database: an explicit db, or the data directory's private cluster (see above);
 * true for the latter. from says which, for messages. */
bool cfg_db(const cfg *o, char *out, size_t n, char *from, size_t fromlen);
/* Connects to cfg_db's database; on failure the message says which database and why. */
PGconn *cfg_connect(const cfg *o, int wait_ms, char *err, size_t errlen);
/* The secret file (secret-file, else <data-dir>/secret.key), "" when LOOM_SECRET wins. */
void cfg_secret_file(const cfg *o, char *out, size_t n);
/* Loads the 32-byte server secret (LOOM_SECRET or the secret file; create: write a new
 * file when there is none). */
int cfg_secret(const cfg *o, bool create, unsigned char *out, char *err, size_t errlen);
/* The blob store directory (blob-dir, else <data-dir>/blobs). */
void cfg_blob_dir(const cfg *o, char *out, size_t n);

/* "8G", "512M", "1048576": bytes (K, M, G, T are powers of 1024); 0 if not a size. */
size_t cfg_parse_bytes(const char *s);
