/* loom.c: the one `loom` binary; each subcommand is a process role or an admin tool. */
#include "common/log.h"
#include "common/pgcluster.h"
#include "executor/executor.h"
#include "model/mkmodel.h"
#include "scheduler/sched.h"
#include "service/api.h"
#include "cli/adapter.h"
#include "cli/admin.h"
#include "cli/status.h"
#include "cli/tokenize.h"
#include "cli/up.h"
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *help;
} subcommand;

static const subcommand commands[] = {
    {"up", up_main, "run everything on this machine (embedded PostgreSQL, api, scheduler, executor)"},
    {"api", api_main, "HTTP front end (Tinker API)"},
    {"scheduler", sched_main, "builds clock cycles from queued operations"},
    {"executor", exe_main, "runs cycles on one device (backend cpu)"},
    {"migrate", admin_migrate_main, "apply database migrations"},
    {"status", status_main, "operator view: executors and devices, the queue, tenants' usage, recent cycles"},
    {"tenant", admin_tenant_main, "tenant create|list"},
    {"key", admin_key_main, "API key create|list|revoke"},
    {"adapter", adapter_cli_main, "checkpoints: list|show|lineage|export|import|share|publish|delete|gc"},
    {"mkmodel", mkmodel_main, "write a random model in Hugging Face layout"},
    {"tokenize", tokenize_main, "a model directory's tokenizer and chat template on text or JSON lines"},
    {"pg", pgc_main, "start|stop a private PostgreSQL cluster under a data directory"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: loom <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`loom <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (!strcmp(argv[1], commands[i].name)) {
            log_init(commands[i].name);
            return commands[i].main(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "loom: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
