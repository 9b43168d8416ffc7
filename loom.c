/* loom.c: the one `loom` binary; each subcommand is a process role or an admin tool. */
#include "common/db.h"
#include "common/log.h"
#include "executor/executor.h"
#include "model/mkmodel.h"
#include "scheduler/sched.h"
#include "api/api.h"
#include "cli/adapter.h"
#include "cli/admin.h"
#include "cli/status.h"
#include "cli/tokenize.h"
#include "cli/chat.h"
#include "cli/up.h"
#include <stdio.h>
#include <string.h>

#ifndef LOOM_VERSION
#define LOOM_VERSION "unknown"
#endif

typedef struct {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *help;
} subcommand;

static const subcommand commands[] = {
    {"up", up_main, "run everything on this machine (embedded PostgreSQL, api, scheduler, executor)"},
    {"api", api_main, "HTTP front end (Tinker API)"},
    {"scheduler", sched_main, "builds clock cycles from queued operations"},
    {"executor", pool_executor_main, "runs cycles on one device; drain|undrain one"},
    {"migrate", admin_migrate_main, "apply database migrations"},
    {"status", status_main, "operator view: executors and devices, the queue, tenants' usage, recent cycles"},
    {"tenant", admin_tenant_main, "tenants: create|list|set-limits"},
    {"usage", usage_main, "tokens and checkpoint storage per tenant and run, with their limits"},
    {"key", admin_key_main, "API keys: create|list|revoke"},
    {"adapter", adapter_cli_main, "checkpoints: list|show|lineage|export|import|share|publish|delete|gc"},
    {"config", admin_config_main, "where the data directory, database, secret and blob store are"},
    {"mkmodel", mkmodel_main, "write a random model in Hugging Face layout"},
    {"tokenize", tokenize_main, "a model directory's tokenizer and chat template on text or JSON lines"},
    {"chat", chat_main, "a terminal chat with a model of a running server (its OpenAI routes)"},
    {"pg", admin_pg_main, "start|stop a private PostgreSQL cluster under a data directory"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f, "usage: loom <command> [options]\n       loom help [command] | --version\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f,
            "\n`loom <command> --help` describes a command's options. Settings come from, in this order:\n"
            "the command line (--data-dir DIR), the environment (DATABASE_URL, LOOM_DATA_DIR, LOOM_SECRET_FILE,\n"
            "LOOM_SECRET, LOOM_BLOB_DIR, LOOM_CONFIG), the config file (--config FILE, else /etc/loom/loom.conf:\n"
            "`name = value`, shared settings at the top, a command's options in [up], [api], [scheduler],\n"
            "[executor] or [gc]), then defaults. Database, secret and blobs default to the data directory's;\n"
            "--data-dir on the command line means its database even when DATABASE_URL is exported.\n"
            "`loom config` shows what a command would use.\n");
}

static const subcommand *find(const char *name) {
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, commands[i].name)) return &commands[i];
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *a = argv[1];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(a, "--version") || !strcmp(a, "version")) {
        printf("loom %s\n", LOOM_VERSION);
        return 0;
    }
    if (!strcmp(a, "help")) {
        if (argc < 3) { usage(stdout); return 0; }
        const subcommand *c = find(argv[2]);
        if (!c) {
            fprintf(stderr, "loom help: unknown command '%s'\n", argv[2]);
            usage(stderr);
            return 2;
        }
        char *hargv[] = {(char *)c->name, "--help", NULL};
        return c->main(2, hargv);
    }
    const subcommand *c = find(a);
    if (!c) {
        fprintf(stderr, "loom: unknown command '%s'\n", a);
        usage(stderr);
        return 2;
    }
    log_init(c->name);
    /* pg_stat_activity's application_name: "loom executor", "loom adapter gc" (a second
     * word only when it is a subcommand's: lower-case letters, not a path or a value) */
    const char *sub = argc > 2 ? argv[2] : "";
    size_t n = strspn(sub, "abcdefghijklmnopqrstuvwxyz-");
    if (n == 0 || n > 16 || sub[n] || sub[0] == '-') sub = "";
    char app[64];
    snprintf(app, sizeof app, "loom %s%s%s", c->name, *sub ? " " : "", sub);
    db_set_app_name(app);
    return c->main(argc - 1, argv + 1);
}
