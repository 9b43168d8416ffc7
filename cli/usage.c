/* usage.c: `loom tenant set-limits` and `loom usage` (docs/operating.md "Quotas and usage"). Limits:
 * queued operations (429 at submit), tokens per minute (the scheduler holds the tenant's
 * work: paused_rate_limit), live models (429 at create_model), checkpoint bytes (400 at a
 * save). Usage: tokens per tenant, run and kind from the usage_tokens view's folded
 * totals, checkpoint storage from usage_storage. */
#include "cli/admin.h"
#include "cli/cli.h"
#include "cli/cli_sql.h"
#include "common/db.h"
#include "tinker/api_sql.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- loom tenant set-limits ------------------------------------------------------------------ */

static const opt_spec LIMIT_OPTS[] = {
    {.name = "max-queued-ops", .kind = OPT_INT, .arg = "N", .lo = 0, .hi = 100000000,
     .help = "operations queued or running at once; a submit past it is a 429 (0: no limit)"},
    {.name = "tokens-per-minute", .kind = OPT_INT, .arg = "N", .lo = 0, .hi = 1000000000000L,
     .help = "tokens claimed into cycles per minute; past it the tenant's work waits, its futures say "
             "paused_rate_limit (0: no limit)"},
    {.name = "max-live-models", .kind = OPT_INT, .arg = "N", .lo = 0, .hi = 1000000,
     .help = "active training runs; create_model past it is a 429 (0: no limit)"},
    {.name = "max-checkpoint-bytes", .kind = OPT_STR, .arg = "SIZE",
     .help = "bytes of live checkpoints, e.g. 50G; a save past it is a 400 (0: no limit)"},
    {0}};

const cfg_cmd TENANT_SET_LIMITS = {
    .cmd = "loom tenant set-limits", .synopsis = "NAME [options]",
    .about = "Sets the tenant's limits: the options given change, the others stay; 0 removes a limit.",
    .tables = {LIMIT_OPTS, CFG_DB, CFG_DATA_DIR}, .min_pos = 1, .max_pos = 1, .pos_name = "NAME"};

int tenant_set_limits(const cfg *o) {
    const char *bytes = cfg_str(o, "max-checkpoint-bytes");
    char sbytes[32];
    if (bytes) {
        size_t b = strcmp(bytes, "0") ? cfg_parse_bytes(bytes) : 0;
        if (strcmp(bytes, "0") && !b)
            return cfg_usage_error(o->cmd, "--max-checkpoint-bytes '%s' is not a size in bytes (e.g. 50G, 512M, 0)",
                                   bytes);
        snprintf(sbytes, sizeof sbytes, "%zu", b);
    }
    const char *p[5] = {o->pos[0], cfg_str(o, "max-queued-ops"), cfg_str(o, "tokens-per-minute"),
                        cfg_str(o, "max-live-models"), bytes ? sbytes : NULL};
    char err[1024];
    PGconn *c = cli_connect(o);
    PGresult *r = db_query(c, SQL_CLI_SET_LIMITS, 5, p, err, sizeof err);
    if (!r) return cli_fail(o, c, "%s", err);
    if (PQntuples(r) == 0) { PQclear(r); return cli_fail(o, c, "unknown tenant '%s'", o->pos[0]); }
    printf("tenant %s: max queued operations %s, tokens per minute %s, max live models %s, max checkpoint bytes %s\n",
           o->pos[0], PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 2), PQgetvalue(r, 0, 3));
    PQclear(r);
    PQfinish(c);
    return 0;
}

/* ---- loom usage ------------------------------------------------------------------------------- */

static const opt_spec USAGE_OPTS[] = {
    {.name = "tenant", .kind = OPT_STR, .arg = "NAME", .help = "one tenant, per run (default: every tenant)"},
    {.name = "days", .kind = OPT_INT, .arg = "N", .def = "30", .lo = 1, .hi = 366,
     .help = "the last N days (UTC, today included)"},
    {.name = "json", .kind = OPT_FLAG, .help = "JSON (with --tenant: the answer of GET /api/v1/usage)"},
    {0}};

static const cfg_cmd USAGE_CMD = {
    .cmd = "loom usage",
    .about = "Tokens (train, prefill, sample) and checkpoint storage per tenant, or per run of one tenant,\n"
             "with the work queued now and the limits (loom tenant set-limits).",
    .tables = {USAGE_OPTS, CFG_DB, CFG_DATA_DIR}};

static int usage_tenant(const cfg *o, PGconn *c, const char *days) {
    char err[1024];
    const char *pn[1] = {cfg_str(o, "tenant")};
    PGresult *r = db_query(c, SQL_CLI_TENANT_ID, 1, pn, err, sizeof err);
    if (!r) return cli_fail(o, c, "%s", err);
    if (PQntuples(r) == 0) { PQclear(r); return cli_fail(o, c, "unknown tenant '%s'", pn[0]); }
    const char *p[2] = {PQgetvalue(r, 0, 0), days};
    PGresult *u = db_query(c, SQL_USAGE, 2, p, err, sizeof err);
    PQclear(r);
    if (!u) return cli_fail(o, c, "%s", err);
    json_error_t je;
    json_t *j = json_loads(PQgetvalue(u, 0, 0), 0, &je);
    PQclear(u);
    if (!j) return cli_fail(o, c, "usage: %s", je.text);
    if (cfg_flag(o, "json")) {
        cli_print_json(j);
    } else {
        json_t *t = json_object_get(j, "tokens"), *st = json_object_get(j, "storage"), *now = json_object_get(j, "now");
        printf("tenant %s, since %s: train %lld, prefill %lld, sample %lld tokens; %lld checkpoints, %lld bytes;"
               " now %lld operations queued or running, %lld active models\n",
               json_string_value(json_object_get(j, "tenant")), json_string_value(json_object_get(j, "since")),
               json_integer_value(json_object_get(t, "train")), json_integer_value(json_object_get(t, "prefill")),
               json_integer_value(json_object_get(t, "sample")), json_integer_value(json_object_get(st, "checkpoints")),
               json_integer_value(json_object_get(st, "bytes")),
               json_integer_value(json_object_get(now, "queued_operations")),
               json_integer_value(json_object_get(now, "active_models")));
        printf("%-64s %12s %12s %12s %6s %14s\n", "run", "train", "prefill", "sample", "ckpts", "bytes");
        size_t i;
        json_t *run;
        json_array_foreach(json_object_get(j, "runs"), i, run)
            printf("%-64s %12lld %12lld %12lld %6lld %14lld\n", json_string_value(json_object_get(run, "run")),
                   json_integer_value(json_object_get(run, "train")), json_integer_value(json_object_get(run, "prefill")),
                   json_integer_value(json_object_get(run, "sample")),
                   json_integer_value(json_object_get(run, "checkpoints")),
                   json_integer_value(json_object_get(run, "storage_bytes")));
    }
    json_decref(j);
    PQfinish(c);
    return 0;
}

int usage_main(int argc, char **argv) {
    cfg o;
    int rc;
    if (!cfg_parse(&USAGE_CMD, argc, argv, &o, &rc)) return rc;
    char err[1024];
    const char *days = cfg_str(&o, "days");
    PGconn *c = cli_connect(&o);
    PGresult *f = db_query(c, SQL_CLI_USAGE_FOLD, 0, NULL, err, sizeof err);   /* up to this moment */
    if (!f) return cli_fail(&o, c, "%s", err);
    PQclear(f);
    if (cfg_str(&o, "tenant")) return usage_tenant(&o, c, days);
    const char *p[1] = {days};
    PGresult *r = db_query(c, SQL_CLI_USAGE_ALL, 1, p, err, sizeof err);
    if (!r) return cli_fail(&o, c, "%s", err);
    json_t *all = json_array();
    if (!cfg_flag(&o, "json"))
        printf("%-24s %12s %12s %12s %6s %14s %7s  %s\n", "tenant", "train", "prefill", "sample", "ckpts", "bytes",
               "queued", "limits (queued/tokens per min/models/bytes)");
    for (int i = 0; i < PQntuples(r); i++) {
        if (cfg_flag(&o, "json"))
            json_array_append_new(all, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:s}", "tenant", PQgetvalue(r, i, 0),
                                                 "train", (json_int_t)db_int(r, i, 1), "prefill",
                                                 (json_int_t)db_int(r, i, 2), "sample", (json_int_t)db_int(r, i, 3),
                                                 "checkpoints", (json_int_t)db_int(r, i, 4), "storage_bytes",
                                                 (json_int_t)db_int(r, i, 5), "queued_operations",
                                                 (json_int_t)db_int(r, i, 6), "limits", PQgetvalue(r, i, 7)));
        else
            printf("%-24s %12s %12s %12s %6s %14s %7s  %s\n", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
                   PQgetvalue(r, i, 2), PQgetvalue(r, i, 3), PQgetvalue(r, i, 4), PQgetvalue(r, i, 5),
                   PQgetvalue(r, i, 6), PQgetvalue(r, i, 7));
    }
    if (cfg_flag(&o, "json")) cli_print_json(all);
    json_decref(all);
    PQclear(r);
    PQfinish(c);
    return 0;
}
