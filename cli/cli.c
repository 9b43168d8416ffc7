/* cli.c: helpers of the operator commands (cli.h). */
#include "cli/cli.h"
#include "common/db.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void group_usage(FILE *f, const char *group, const char *about, const cli_verb *verbs) {
    fprintf(f, "usage: loom %s <command> [options]\n%s%s", group, about ? about : "", about ? "\n" : "");
    fprintf(f, "commands:\n");
    for (const cli_verb *v = verbs; v->name; v++)
        fprintf(f, "  %s %s\n      %s\n", v->name, v->cmd->synopsis ? v->cmd->synopsis : "[options]", v->help);
    fprintf(f, "`loom %s <command> --help` describes a command's options.\n", group);
}

int cli_dispatch(const char *group, const char *about, const cli_verb *verbs, int argc, char **argv) {
    const char *verb = argc > 1 ? argv[1] : NULL;
    if (verb && (!strcmp(verb, "--help") || !strcmp(verb, "-h") || !strcmp(verb, "help"))) {
        group_usage(stdout, group, about, verbs);
        return 0;
    }
    for (const cli_verb *v = verbs; verb && v->name; v++) {
        if (strcmp(v->name, verb)) continue;
        cfg o;
        int rc;
        if (!cfg_parse(v->cmd, argc - 1, argv + 1, &o, &rc)) return rc;
        return v->run(&o);
    }
    if (verb) fprintf(stderr, "loom %s: unknown command '%s'\n", group, verb);
    else fprintf(stderr, "loom %s: missing command\n", group);
    group_usage(stderr, group, about, verbs);
    return 2;
}

PGconn *cli_connect(const cfg *o) {
    char err[2048];
    PGconn *c = cfg_connect(o, 5000, err, sizeof err);
    if (!c) {
        fprintf(stderr, "%s: %s\n", o->cmd->cmd, err);
        exit(1);
    }
    return c;
}

int cli_fail(const cfg *o, PGconn *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", o->cmd->cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (c) PQfinish(c);
    return 1;
}

/* The shortest "%.*g" text that reads back as x. */
static void shortest(double x, char *out, size_t n) {
    for (int p = 1; p <= 17; p++) {
        snprintf(out, n, "%.*g", p, x);
        if (strtod(out, NULL) == x) break;
    }
    /* A real stays a real when read back: 2 -> 2.0, as jansson writes it. */
    if (!strpbrk(out, ".eEn")) snprintf(out + strlen(out), n - strlen(out), ".0");
}

static int cmp_keys(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Own printer rather than json_dumps: jansson prints reals with %.17g and nothing shorter. */
static void print_value(json_t *j, int depth) {
    char buf[40];
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        size_t n = json_object_size(j), i = 0;
        if (!n) { fputs("{}", stdout); return; }
        const char **keys = malloc(n * sizeof *keys);
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) keys[i++] = k;
        qsort(keys, n, sizeof *keys, cmp_keys);
        fputs("{\n", stdout);
        for (i = 0; i < n; i++) {
            json_t *ks = json_string(keys[i]);
            char *kt = json_dumps(ks, JSON_ENCODE_ANY);
            printf("%*s%s: ", 2 * (depth + 1), "", kt);
            free(kt);
            json_decref(ks);
            print_value(json_object_get(j, keys[i]), depth + 1);
            fputs(i + 1 < n ? ",\n" : "\n", stdout);
        }
        printf("%*s}", 2 * depth, "");
        free(keys);
        return;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if (!n) { fputs("[]", stdout); return; }
        fputs("[\n", stdout);
        for (size_t i = 0; i < n; i++) {
            printf("%*s", 2 * (depth + 1), "");
            print_value(json_array_get(j, i), depth + 1);
            fputs(i + 1 < n ? ",\n" : "\n", stdout);
        }
        printf("%*s]", 2 * depth, "");
        return;
    }
    case JSON_REAL:
        shortest(json_real_value(j), buf, sizeof buf);
        fputs(buf, stdout);
        return;
    default: {
        char *t = json_dumps(j, JSON_ENCODE_ANY);
        fputs(t ? t : "null", stdout);
        free(t);
    }
    }
}

void cli_print_json(json_t *j) {
    print_value(j, 0);
    fputc('\n', stdout);
}
