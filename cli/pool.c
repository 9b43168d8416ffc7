/* pool.c: `loom executor drain|undrain NAME|ID`, and `loom executor` itself otherwise.
 * Draining an executor (docs/architecture.md, "Pools and placement") stops new cycles and
 * placements there; the executor hands each model it holds over to its pool (snapshot
 * brought up to date, then placed nowhere), and the scheduler places them on the other
 * executors of the base model as their next operations come; each sampler snapshot it
 * holds goes to the blob store, where any executor of the base model loads it. */
#include "cli/admin.h"
#include "cli/cli.h"
#include "cli/cli_sql.h"
#include "common/db.h"
#include "common/pgarray.h"
#include "executor/executor.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const opt_spec DRAIN_OPTS[] = {
    {.name = "wait", .kind = OPT_INT, .arg = "S", .def = "0", .lo = 0, .hi = 86400,
     .help = "wait up to S seconds for the executor to hold no model and no sampler snapshot (exit 1 if it still does)"},
    {0}};

static const cfg_cmd DRAIN = {.cmd = "loom executor drain", .synopsis = "NAME|ID [options]",
                              .about = "Moves the models and sampler snapshots of the live executor(s) with this name or\n"
                                       "id to the other executors of their base model; it then takes no new work (until undrain).",
                              .tables = {DRAIN_OPTS, CFG_DB, CFG_DATA_DIR}, .min_pos = 1, .max_pos = 1,
                              .pos_name = "NAME|ID"};
static const cfg_cmd UNDRAIN = {.cmd = "loom executor undrain", .synopsis = "NAME|ID [options]",
                                .about = "Lets a drained executor take models and work again.",
                                .tables = {CFG_DB, CFG_DATA_DIR}, .min_pos = 1, .max_pos = 1, .pos_name = "NAME|ID"};

/* Sets draining on the executors named; their ids as a bigint[] literal in *ids (free() it). */
static int set_draining(const cfg *o, PGconn *c, bool on, char **ids) {
    char err[1024];
    const char *p[2] = {o->pos[0], on ? "t" : "f"};
    PGresult *r = db_query(c, SQL_CLI_EXECUTOR_DRAIN, 2, p, err, sizeof err);
    if (!r) return cli_fail(o, c, "%s", err);
    int n = PQntuples(r);
    pgarray a;
    pga_init(&a);
    for (int i = 0; i < n; i++) {
        printf("executor %s (%s on %s, base model %s) %s\n", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
               PQgetvalue(r, i, 2), PQgetvalue(r, i, 3), on ? "draining" : "takes work again");
        pga_int(&a, db_int(r, i, 0));
    }
    *ids = pga_end(&a);
    PQclear(r);
    if (n == 0) {
        free(*ids);
        return cli_fail(o, c, "no live executor has the name or id '%s' (see `loom status`)", o->pos[0]);
    }
    return 0;
}

static int drain(const cfg *o) {
    PGconn *c = cli_connect(o);
    char *ids, err[1024];
    if (set_draining(o, c, true, &ids)) return 1;
    long wait = cfg_int(o, "wait");
    time_t until = time(NULL) + wait;
    const char *p[1] = {ids};
    for (;;) {
        PGresult *r = db_query(c, SQL_CLI_EXECUTOR_MODELS, 1, p, err, sizeof err);
        if (!r) {
            free(ids);
            return cli_fail(o, c, "%s", err);
        }
        long models = (long)db_int(r, 0, 0), samplers = (long)db_int(r, 0, 1);
        PQclear(r);
        if (models == 0 && samplers == 0) {
            printf("drained: no model or sampler snapshot is held there any more\n");
            break;
        }
        if (time(NULL) >= until) {
            printf("%ld model(s) and %ld sampler snapshot(s) still there%s\n", models, samplers,
                   wait ? "" : " (they move as the executor hands them over)");
            free(ids);
            PQfinish(c);
            return wait ? 1 : 0;
        }
        usleep(250 * 1000);
    }
    free(ids);
    PQfinish(c);
    return 0;
}

static int undrain(const cfg *o) {
    PGconn *c = cli_connect(o);
    char *ids;
    if (set_draining(o, c, false, &ids)) return 1;
    free(ids);
    PQfinish(c);
    return 0;
}

int pool_executor_main(int argc, char **argv) {
    static const cli_verb verbs[] = {{"drain", &DRAIN, drain, "move an executor's models to the rest of its pool"},
                                     {"undrain", &UNDRAIN, undrain, "let a drained executor take work again"},
                                     {0}};
    if (argc > 1 && (!strcmp(argv[1], "drain") || !strcmp(argv[1], "undrain")))
        return cli_dispatch("executor", "An executor's place in its pool.", verbs, argc, argv);
    return exe_main(argc, argv);
}
