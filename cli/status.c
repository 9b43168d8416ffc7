/* status.c: `loom status`: what the web console's operator view shows, in a terminal:
 * executors and their devices, the queue, tenants with their usage, and the newest
 * cycles with the tenants that shared them. It reads PostgreSQL directly (DATABASE_URL
 * or --db) with the console's statements (console/console_sql.h), so it works while the
 * api is down. */
#include "cli/status.h"
#include "cli/cli.h"
#include "common/db.h"
#include "console/console_sql.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const opt_spec STATUS_OPTS[] = {
    {.name = "cycles", .kind = OPT_INT, .arg = "N", .def = "10", .lo = 0, .hi = 500,
     .help = "the newest N cycles and which tenants shared them"},
    {.name = "json", .kind = OPT_FLAG, .help = "print the same as JSON"},
    {0}};
static const cfg_cmd STATUS_CMD = {
    .cmd = "loom status",
    .about = "Executors (device, memory, GPU), the queue, tenants (usage) and the newest cycles, read from\n"
             "PostgreSQL (works while the api is down).",
    .tables = {STATUS_OPTS, CFG_DB, CFG_DATA_DIR}};

static const char *str(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "-";
}

static double dbl(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

/* "1.5 GiB" etc. */
static const char *bytes(double v, char *out, size_t n) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    snprintf(out, n, u ? "%.1f %s" : "%.0f %s", v, units[u]);
    return out;
}

static void print_executors(json_t *exes) {
    printf("EXECUTORS\n%-5s %-12s %-14s %-26s %-16s %-6s %-6s %-24s %-5s %-22s %s\n", "id", "name", "host",
           "device", "base model", "state", "beat", "adapters (used/budget)", "slots", "gpu", "cycle");
    size_t i;
    json_t *e;
    json_array_foreach(exes, i, e) {
        char used[24], budget[24], gpu[40] = "-", device[40], beat[16], cycle[24] = "-";
        snprintf(device, sizeof device, "%s", str(e, "device"));
        snprintf(beat, sizeof beat, "%.1fs", dbl(e, "heartbeat_age_s"));
        if (json_is_number(json_object_get(e, "gpu_utilization"))) {
            char gm[24];
            snprintf(gpu, sizeof gpu, "%.0f%% %s", dbl(e, "gpu_utilization"), bytes(dbl(e, "gpu_memory_used"), gm, sizeof gm));
        }
        if (json_is_integer(json_object_get(e, "cycle")))
            snprintf(cycle, sizeof cycle, "%lld", (long long)json_integer_value(json_object_get(e, "cycle")));
        char mem[56];
        snprintf(mem, sizeof mem, "%s / %s", bytes(dbl(e, "memory_used"), used, sizeof used),
                 bytes(dbl(e, "memory_budget"), budget, sizeof budget));
        printf("%-5lld %-12.12s %-14.14s %-26.26s %-16.16s %-6s %-6s %-24s %-5lld %-22s %s\n",
               (long long)json_integer_value(json_object_get(e, "id")), str(e, "name"), str(e, "host"), device,
               str(e, "base_model"), str(e, "state"), beat, mem,
               (long long)json_integer_value(json_object_get(e, "training_slots")), gpu, cycle);
    }
    if (!json_array_size(exes)) printf("(no executor has registered)\n");
}

static void print_queue(json_t *queue) {
    printf("\nQUEUE\n%-8s %-26s %-20s %-16s %6s %10s\n", "state", "kind", "base model", "tenant", "ops", "oldest");
    size_t i;
    json_t *q;
    json_array_foreach(queue, i, q) {
        char oldest[24];
        snprintf(oldest, sizeof oldest, "%.1fs", dbl(q, "oldest_s"));
        printf("%-8s %-26s %-20.20s %-16.16s %6lld %10s\n", str(q, "state"), str(q, "kind"), str(q, "base_model"),
               str(q, "tenant"), (long long)json_integer_value(json_object_get(q, "n")), oldest);
    }
    if (!json_array_size(queue)) printf("(empty: nothing queued or running)\n");
}

static void print_tenants(json_t *tenants) {
    printf("\nTENANTS\n%-20s %6s %7s %8s %5s  %s\n", "name", "runs", "active", "pending", "keys", "tokens used");
    size_t i;
    json_t *t;
    json_array_foreach(tenants, i, t) {
        char tok[256] = "";
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(t, "tokens"), k, v)
            snprintf(tok + strlen(tok), sizeof tok - strlen(tok), "%s%s %.0f", *tok ? ", " : "", k, json_number_value(v));
        printf("%-20.20s %6lld %7lld %8lld %5lld  %s\n", str(t, "name"),
               (long long)json_integer_value(json_object_get(t, "runs")),
               (long long)json_integer_value(json_object_get(t, "active_runs")),
               (long long)json_integer_value(json_object_get(t, "pending")),
               (long long)json_integer_value(json_object_get(t, "keys")), *tok ? tok : "-");
    }
}

static void print_cycles(json_t *cycles) {
    printf("\nRECENT CYCLES (newest first)\n%-8s %-16s %-8s %9s %5s %7s  %s\n", "id", "executor", "state", "ms",
           "ops", "budget", "tenants (ops)");
    size_t i;
    json_t *c;
    json_array_foreach(cycles, i, c) {
        char who[512] = "", ms[24] = "-";
        size_t j;
        json_t *t;
        json_array_foreach(json_object_get(c, "tenants"), j, t)
            snprintf(who + strlen(who), sizeof who - strlen(who), "%s%s(%lld)", *who ? " " : "", str(t, "tenant"),
                     (long long)json_integer_value(json_object_get(t, "ops")));
        if (json_is_number(json_object_get(c, "ms"))) snprintf(ms, sizeof ms, "%.1f", dbl(c, "ms"));
        char exe[40];
        snprintf(exe, sizeof exe, "%s#%lld", str(c, "executor"), (long long)json_integer_value(json_object_get(c, "executor_id")));
        printf("%-8lld %-16.16s %-8s %9s %5lld %7lld  %s\n", (long long)json_integer_value(json_object_get(c, "id")),
               exe, str(c, "state"), ms, (long long)json_integer_value(json_object_get(c, "n_ops")),
               (long long)json_integer_value(json_object_get(c, "n_tokens")), *who ? who : "-");
    }
    if (!json_array_size(cycles)) printf("(no cycle yet)\n");
}

/* The one JSON cell of a statement, parsed; NULL with err. */
static json_t *query_json(PGconn *c, const char *sql, int n, const char *const *p, char *err, size_t errlen) {
    PGresult *r = db_query(c, sql, n, p, err, errlen);
    if (!r) return NULL;
    json_error_t je;
    json_t *v = PQntuples(r) ? json_loads(PQgetvalue(r, 0, 0), 0, &je) : NULL;
    if (!v) snprintf(err, errlen, "unexpected answer: %s", PQntuples(r) ? je.text : "no row");
    PQclear(r);
    return v;
}

int status_main(int argc, char **argv) {
    cfg o;
    int prc = 2;
    if (!cfg_parse(&STATUS_CMD, argc, argv, &o, &prc)) return prc;
    int ncycles = (int)cfg_int(&o, "cycles");
    bool as_json = cfg_flag(&o, "json");
    char err[1024], limit[16];
    PGconn *c = cli_connect(&o);
    snprintf(limit, sizeof limit, "%d", ncycles ? ncycles : 1);
    const char *p[1] = {limit};
    json_t *over = NULL, *cyc = NULL;
    int rc = 1;
    if (db_exec(c, SQL_CON_FOLD, 0, NULL, err, sizeof err) == 0 &&
        (over = query_json(c, SQL_CON_ADMIN_OVERVIEW, 0, NULL, err, sizeof err)) &&
        (cyc = query_json(c, SQL_CON_ADMIN_CYCLES, 1, p, err, sizeof err))) {
        if (!ncycles) json_array_clear(json_object_get(cyc, "cycles"));
        if (as_json) {
            json_object_set(over, "cycles", json_object_get(cyc, "cycles"));
            char *s = json_dumps(over, JSON_INDENT(2));
            printf("%s\n", s);
            free(s);
        } else {
            printf("Loom at %s\n\n", str(over, "now"));
            print_executors(json_object_get(over, "executors"));
            print_queue(json_object_get(over, "queue"));
            print_tenants(json_object_get(over, "tenants"));
            if (ncycles) print_cycles(json_object_get(cyc, "cycles"));
        }
        rc = 0;
    } else {
        fprintf(stderr, "loom status: %s\n", err);
    }
    json_decref(over);
    json_decref(cyc);
    PQfinish(c);
    return rc;
}
