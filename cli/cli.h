/* cli.h: what the operator commands share: verbs under a command (`loom key create`),
 * connecting with a message that says which database, failing with a message, JSON
 * printed as people write numbers. */
#pragma once
#include "common/config.h"
#include <jansson.h>
#include <libpq-fe.h>

typedef struct {
    const char *name;            /* "create" */
    const cfg_cmd *cmd;          /* its options and usage */
    int (*run)(const cfg *o);    /* after its options parsed; returns the exit status */
    const char *help;            /* one line for the command's usage */
} cli_verb;

/* `loom GROUP VERB ...`: parses VERB's options and runs it. No verb, an unknown one: the
 * group's usage and 2; --help (or `help`): the usage and 0. verbs end with a NULL name. */
int cli_dispatch(const char *group, const char *about, const cli_verb *verbs, int argc, char **argv);
/* The database of the settings, or exit(1) with "<cmd>: cannot connect ... (which)". */
PGconn *cli_connect(const cfg *o);
/* "<cmd>: <message>" on stderr; closes c (may be NULL); returns 1. */
int cli_fail(const cfg *o, PGconn *c, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* j on stdout, indented, keys sorted, each real in the fewest digits that read back to it
 * (0.9, not jansson's 0.90000000000000002). */
void cli_print_json(json_t *j);
