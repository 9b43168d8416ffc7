/* api_metrics.c: request counters, the access log and GET /metrics (see api_metrics.h).
 *
 * The text format is Prometheus' 0.0.4 exposition format: one "# HELP" and "# TYPE" line
 * per family, then its samples; label values escape \ " and newline; histograms give
 * cumulative _bucket{le=...} lines ending at +Inf, then _sum and _count. Route labels are
 * the patterns of the route table (api/api_routes.c: "/api/v1/training_runs/{id}"), never raw paths, so the
 * number of series is fixed by the route table and the status codes. */
#include "core/api_metrics.h"
#include "common/clock.h"
#include "core/http_gate.h"
#include "common/common_sql.h"
#include "common/db.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "core/api_route.h"
#include "core/core_sql.h"
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- per-process request counters ----------------------------------------------------- */

#define STATUS_LO 100
#define STATUS_N 500   /* 100..599 */
static const double k_http_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5, 1, 2.5, 5, 10, 30};
#define N_HTTP_BUCKETS (sizeof k_http_buckets / sizeof k_http_buckets[0])

typedef struct {
    _Atomic uint64_t by_status[STATUS_N];
    _Atomic uint64_t bucket[N_HTTP_BUCKETS];   /* not cumulative; summed when written */
    _Atomic uint64_t count;
    _Atomic uint64_t sum_us;
} route_stats;

/* One per route of the table, then the two pseudo-routes. */
enum { PSEUDO_UNMATCHED, PSEUDO_H2O, N_PSEUDO };
static route_stats *g_stats;
static const api_route *g_routes;
static size_t g_nroutes;
static _Atomic long g_in_flight;
static double g_started;

void api_metrics_init(const api_route_table *t) {
    g_routes = t->routes;
    g_nroutes = t->n;
    g_stats = calloc(g_nroutes + N_PSEUDO, sizeof *g_stats);
    if (!g_stats) abort();
    g_started = clock_wall_s();
}

void api_metrics_in_flight(int delta) { atomic_fetch_add(&g_in_flight, delta); }

static size_t stats_index(const api_access *a) {
    if (a->by_h2o) return g_nroutes + PSEUDO_H2O;
    return a->route ? (size_t)(a->route - g_routes) : g_nroutes + PSEUDO_UNMATCHED;
}

/* The label of a route: its pattern with the wildcards named. */
static void route_label(size_t i, char *out, size_t n) {
    if (i == g_nroutes + PSEUDO_UNMATCHED) { snprintf(out, n, "unmatched"); return; }
    if (i == g_nroutes + PSEUDO_H2O) { snprintf(out, n, "h2o"); return; }
    const char *p = g_routes[i].path;
    size_t len = strlen(p);
    if (len >= 2 && p[len - 2] == '/' && (p[len - 1] == '+' || p[len - 1] == '*'))
        snprintf(out, n, "%.*s%s", (int)(len - 1), p, p[len - 1] == '+' ? "{id}" : "{path}");
    else snprintf(out, n, "%s", p);
}

static const char *route_method(size_t i) { return i < g_nroutes ? g_routes[i].method : "other"; }

void api_log_id(const char *client, size_t len, char *out) {
    bool ok = client && len >= 1 && len <= 64;
    for (size_t i = 0; ok && i < len; i++)
        ok = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-", client[i]) && client[i];
    if (ok) {
        memcpy(out, client, len);
        out[len] = 0;
        return;
    }
    unsigned char r[8];
    randombytes_buf(r, sizeof r);
    memcpy(out, "r-", 2);
    sodium_bin2hex(out + 2, API_LOG_ID_MAX - 2, r, sizeof r);
}

void api_observe(const api_access *a) {
    size_t i = stats_index(a);
    route_stats *s = &g_stats[i];
    if (a->status >= STATUS_LO && a->status < STATUS_LO + STATUS_N)
        atomic_fetch_add(&s->by_status[a->status - STATUS_LO], 1);
    double secs = a->seconds > 0 ? a->seconds : 0;
    size_t b = 0;
    while (b < N_HTTP_BUCKETS && secs > k_http_buckets[b]) b++;
    if (b < N_HTTP_BUCKETS) atomic_fetch_add(&s->bucket[b], 1);
    atomic_fetch_add(&s->count, 1);
    atomic_fetch_add(&s->sum_us, (uint64_t)(secs * 1e6));

    int level = a->status >= 500 ? LOG_WARN_ : LOG_INFO_;
    if (!log_enabled(level)) return;
    char route[160];
    route_label(i, route, sizeof route);
    log_field f[8];
    size_t n = 0;
    f[n++] = LOG_S("method", i < g_nroutes ? route_method(i) : a->method);
    f[n++] = LOG_S("route", route);
    f[n++] = LOG_N("status", a->status);
    f[n++] = LOG_S("tenant", a->tenant && *a->tenant ? a->tenant : "-");
    f[n++] = LOG_S("request_id", a->log_id);
    f[n++] = LOG_N("ms", round(secs * 1e4) / 10);
    char reason[512];
    if (a->status >= 400 && a->reason) {
        snprintf(reason, sizeof reason, "%s", a->reason);
        f[n++] = LOG_S("reason", reason);
    }
    log_fields(level, "request", f, n);
}

void api_observe_answer(const api_job *job, int status, double now, const char *body, size_t len) {
    char *detail = NULL;
    /* Error bodies are small objects, Tinker's {"detail": ...} or OpenAI's {"error":
     * {"message": ...}}; anything else has no reason. */
    if (status >= 400 && body && len < 16384) {
        json_t *v = json_loadb(body, len, 0, NULL);
        const char *d = json_string_value(json_object_get(v, "detail"));
        if (!d) d = json_string_value(json_object_get(json_object_get(v, "error"), "message"));
        if (d) detail = strdup(d);
        json_decref(v);
    }
    api_access a = {.route = job->route, .status = status, .tenant = job->tenant_name,
                    .log_id = job->log_id, .seconds = now - job->started, .reason = detail};
    api_observe(&a);
    free(detail);
}

void api_observe_job(const api_job *job, int status, double now) {
    api_observe_answer(job, status, now, job->resp, job->resp ? job->resp_len : 0);
}

/* ---- the exposition format ------------------------------------------------------------- */

static void family(strbuf *b, const char *name, const char *type, const char *help) {
    sb_printf(b, "# HELP %s ", name);
    for (const char *p = help; *p; p++) {
        if (*p == '\\') sb_puts(b, "\\\\");
        else if (*p == '\n') sb_puts(b, "\\n");
        else sb_putc(b, *p);
    }
    sb_printf(b, "\n# TYPE %s %s\n", name, type);
}

static void label_value(strbuf *b, const char *v) {
    for (const char *p = v; *p; p++) {
        if (*p == '\\') sb_puts(b, "\\\\");
        else if (*p == '"') sb_puts(b, "\\\"");
        else if (*p == '\n') sb_puts(b, "\\n");
        else sb_putc(b, *p);
    }
}

/* name{k1="v1",...} value: kv holds n pairs (key, value); NULL values are skipped. */
static void sample(strbuf *b, const char *name, const char *const *kv, int n, double value) {
    sb_puts(b, name);
    int written = 0;
    for (int i = 0; i < n; i++) {
        if (!kv[2 * i + 1]) continue;
        sb_puts(b, written++ ? "," : "{");
        sb_printf(b, "%s=\"", kv[2 * i]);
        label_value(b, kv[2 * i + 1]);
        sb_putc(b, '"');
    }
    if (written) sb_putc(b, '}');
    if (isinf(value)) sb_puts(b, value > 0 ? " +Inf\n" : " -Inf\n");
    else if (isnan(value)) sb_puts(b, " NaN\n");
    else if (value == (double)(int64_t)value && fabs(value) < 9e15) sb_printf(b, " %lld\n", (long long)value);
    else sb_printf(b, " %.17g\n", value);
}

/* "0.005" etc. for le labels: the shortest text that reads back as the bound. */
static void fmt_le(double le, char *out, size_t n) {
    if (isinf(le)) { snprintf(out, n, "+Inf"); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, le);
        if (strtod(out, NULL) == le) return;
    }
}

static void http_metrics(strbuf *b) {
    size_t total = g_nroutes + N_PSEUDO;
    char route[160], status[8], le[32];
    family(b, "loom_http_requests_total", "counter",
           "HTTP requests this api process answered, by method, route pattern and status.");
    for (size_t i = 0; i < total; i++) {
        route_label(i, route, sizeof route);
        for (int s = 0; s < STATUS_N; s++) {
            uint64_t v = atomic_load(&g_stats[i].by_status[s]);
            if (!v) continue;
            snprintf(status, sizeof status, "%d", s + STATUS_LO);
            const char *kv[] = {"method", route_method(i), "route", route, "status", status};
            sample(b, "loom_http_requests_total", kv, 3, (double)v);
        }
    }
    family(b, "loom_http_request_duration_seconds", "histogram",
           "Time from the start of a request to its answer, by method and route pattern "
           "(retrieve_future long-polls up to 25 s).");
    for (size_t i = 0; i < total; i++) {
        uint64_t count = atomic_load(&g_stats[i].count);
        if (!count) continue;
        route_label(i, route, sizeof route);
        uint64_t cum = 0;
        for (size_t k = 0; k <= N_HTTP_BUCKETS; k++) {
            double bound = k < N_HTTP_BUCKETS ? k_http_buckets[k] : INFINITY;
            cum = k < N_HTTP_BUCKETS ? cum + atomic_load(&g_stats[i].bucket[k]) : count;
            fmt_le(bound, le, sizeof le);
            const char *kv[] = {"method", route_method(i), "route", route, "le", le};
            sample(b, "loom_http_request_duration_seconds_bucket", kv, 3, (double)cum);
        }
        const char *kv[] = {"method", route_method(i), "route", route};
        sample(b, "loom_http_request_duration_seconds_sum", kv, 2, atomic_load(&g_stats[i].sum_us) / 1e6);
        sample(b, "loom_http_request_duration_seconds_count", kv, 2, (double)count);
    }
    family(b, "loom_http_requests_in_flight", "gauge", "Requests this api process is answering now.");
    sample(b, "loom_http_requests_in_flight", NULL, 0, (double)atomic_load(&g_in_flight));
    family(b, "loom_http_request_body_bytes_in_flight", "gauge",
           "Bytes of request bodies this api process holds now (bounded by --max-inflight-mb).");
    sample(b, "loom_http_request_body_bytes_in_flight", NULL, 0, (double)gate_inflight_bytes());
    family(b, "process_start_time_seconds", "gauge", "Start time of this api process, in Unix seconds.");
    sample(b, "process_start_time_seconds", NULL, 0, g_started);
}

/* ---- from PostgreSQL ------------------------------------------------------------------ */

static double num(const PGresult *r, int i, int col) { return strtod(PQgetvalue(r, i, col), NULL); }

static int queue_metrics(PGconn *db, strbuf *b, char *err, size_t errlen) {
    PGresult *r = db_query(db, SQL_M_QUEUE, 0, NULL, err, errlen);
    if (!r) return -1;
    family(b, "loom_queue_operations", "gauge",
           "Operations waiting (queued) or in a cycle (claimed), by kind and base model.");
    for (int i = 0; i < PQntuples(r); i++) {
        const char *kv[] = {"state", PQgetvalue(r, i, 0), "kind", PQgetvalue(r, i, 1), "base_model", PQgetvalue(r, i, 2)};
        sample(b, "loom_queue_operations", kv, 3, num(r, i, 3));
    }
    family(b, "loom_queue_oldest_seconds", "gauge",
           "Age of the oldest operation in that state (0 when there is none).");
    for (int i = 0; i < PQntuples(r); i++) {
        const char *kv[] = {"state", PQgetvalue(r, i, 0), "kind", PQgetvalue(r, i, 1), "base_model", PQgetvalue(r, i, 2)};
        sample(b, "loom_queue_oldest_seconds", kv, 3, num(r, i, 4));
    }
    PQclear(r);
    if (!(r = db_query(db, SQL_M_MODELS, 0, NULL, err, errlen))) return -1;
    family(b, "loom_models_active", "gauge", "Training runs (models) taking operations, by base model.");
    for (int i = 0; i < PQntuples(r); i++) {
        const char *kv[] = {"base_model", PQgetvalue(r, i, 0)};
        sample(b, "loom_models_active", kv, 1, num(r, i, 1));
    }
    family(b, "loom_tenants", "gauge", "Tenants.");
    if (PQntuples(r)) sample(b, "loom_tenants", NULL, 0, num(r, 0, 2));
    PQclear(r);
    return 0;
}

/* Executor gauges: one family per column, samples labelled by executor. */
typedef struct {
    const char *name, *help;
    int col;
    double scale;
} exe_gauge;

static int executor_metrics(PGconn *db, strbuf *b, char *err, size_t errlen) {
    PGresult *r = db_query(db, SQL_M_EXECUTORS, 0, NULL, err, errlen);
    if (!r) return -1;
    int n = PQntuples(r);
    family(b, "loom_executor_info", "gauge",
           "Live executor registrations (1 each) with their device's description.");
    for (int i = 0; i < n; i++) {
        const char *kv[] = {"executor", PQgetvalue(r, i, 0), "name", PQgetvalue(r, i, 1),
                            "host", PQgetvalue(r, i, 2), "device", PQgetvalue(r, i, 3),
                            "backend", PQgetvalue(r, i, 4), "base_model", PQgetvalue(r, i, 5),
                            "device_name", PQgetvalue(r, i, 6)};
        sample(b, "loom_executor_info", kv, 7, 1);
    }
    family(b, "loom_executor_up", "gauge",
           "1 while an executor heartbeats (every 3 s; written off after --executor-timeout-s of silence), else 0.");
    for (int i = 0; i < n; i++) {
        const char *kv[] = {"executor", PQgetvalue(r, i, 0), "host", PQgetvalue(r, i, 2), "device",
                            PQgetvalue(r, i, 3), "backend", PQgetvalue(r, i, 4), "base_model", PQgetvalue(r, i, 5)};
        sample(b, "loom_executor_up", kv, 5, num(r, i, 8) < 30 ? 1 : 0);
    }
    family(b, "loom_executor_busy", "gauge", "1 while an executor runs a cycle, else 0.");
    for (int i = 0; i < n; i++) {
        const char *kv[] = {"executor", PQgetvalue(r, i, 0), "host", PQgetvalue(r, i, 2), "device",
                            PQgetvalue(r, i, 3), "backend", PQgetvalue(r, i, 4), "base_model", PQgetvalue(r, i, 5)};
        sample(b, "loom_executor_busy", kv, 5, !strcmp(PQgetvalue(r, i, 7), "busy"));
    }
    static const exe_gauge gauges[] = {
        {"loom_executor_heartbeat_age_seconds", "Seconds since the executor's last heartbeat.", 8, 1},
        {"loom_executor_memory_total_bytes", "Memory of the executor's device.", 9, 1},
        {"loom_executor_memory_budget_bytes", "What the executor's adapters may hold (--memory-budget).", 10, 1},
        {"loom_executor_memory_used_bytes", "What the executor's adapters hold now.", 11, 1},
        {"loom_executor_training_slots", "Training runs whose adapter state lives on the executor.", 12, 1},
        {"loom_executor_sampler_snapshots", "Sampler snapshots held by the executor.", 13, 1},
        {"loom_executor_cached_checkpoints", "Checkpoints the executor keeps loaded for sampling.", 14, 1},
        {"loom_executor_gpu_utilization_ratio", "Fraction of time a kernel ran on the GPU (NVML, last sample).", 15, 0.01},
        {"loom_executor_gpu_memory_used_bytes", "GPU memory in use by all processes (NVML).", 16, 1},
        {"loom_executor_gpu_memory_total_bytes", "GPU memory (NVML).", 17, 1},
        {"loom_executor_gpu_temperature_celsius", "GPU temperature (NVML).", 18, 1},
        {"loom_executor_gpu_power_watts", "GPU power draw (NVML).", 19, 1},
    };
    for (size_t g = 0; g < sizeof gauges / sizeof gauges[0]; g++) {
        const exe_gauge *eg = &gauges[g];
        family(b, eg->name, "gauge", eg->help);
        for (int i = 0; i < n; i++) {
            /* GPU figures only where an executor samples NVML, and only while fresh. */
            if (PQgetisnull(r, i, eg->col) || (eg->col >= 15 && !db_bool(r, i, 20))) continue;
            const char *kv[] = {"executor", PQgetvalue(r, i, 0), "host", PQgetvalue(r, i, 2), "device",
                                PQgetvalue(r, i, 3), "backend", PQgetvalue(r, i, 4), "base_model", PQgetvalue(r, i, 5)};
            sample(b, eg->name, kv, 5, num(r, i, eg->col) * eg->scale);
        }
    }
    PQclear(r);
    return 0;
}

static int registry_metrics(PGconn *db, strbuf *b, char *err, size_t errlen) {
    PGresult *r = db_query(db, SQL_M_REGISTRY, 0, NULL, err, errlen);
    if (!r) return -1;
    family(b, "loom_registry_checkpoints", "gauge",
           "Checkpoint versions whose blobs are stored (not deleted), by owner and kind (training, sampler).");
    for (int i = 0; i < PQntuples(r); i++) {
        const char *kv[] = {"tenant", PQgetvalue(r, i, 0), "kind", PQgetvalue(r, i, 1)};
        sample(b, "loom_registry_checkpoints", kv, 2, num(r, i, 2));
    }
    family(b, "loom_registry_checkpoint_bytes", "gauge",
           "Bytes of those versions, by owner and kind (a blob shared by versions counts for each).");
    for (int i = 0; i < PQntuples(r); i++) {
        const char *kv[] = {"tenant", PQgetvalue(r, i, 0), "kind", PQgetvalue(r, i, 1)};
        sample(b, "loom_registry_checkpoint_bytes", kv, 2, num(r, i, 3));
    }
    PQclear(r);
    if (!(r = db_query(db, SQL_M_BLOBS, 0, NULL, err, errlen))) return -1;
    family(b, "loom_registry_blobs", "gauge", "Distinct blobs the live versions use.");
    sample(b, "loom_registry_blobs", NULL, 0, num(r, 0, 0));
    family(b, "loom_registry_stored_bytes", "gauge", "Bytes in the blob store for them (each blob once).");
    sample(b, "loom_registry_stored_bytes", NULL, 0, num(r, 0, 1));
    PQclear(r);
    return 0;
}

/* Parses "{0.005,0.01,...}" into out (at most cap); returns the count. */
static int parse_buckets(const char *s, double *out, int cap) {
    int n = 0;
    if (*s == '{') s++;
    while (*s && *s != '}' && n < cap) {
        char *end;
        out[n++] = strtod(s, &end);
        s = *end == ',' ? end + 1 : end;
        if (end == s && *s != '}') break;
    }
    return n;
}

/* The labels of a metric_counters row (a JSON object of strings) as key/value pairs. */
static int labels_of(const char *json, json_t **holder, const char **kv, int cap) {
    *holder = json_loads(json, 0, NULL);
    int n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(*holder, k, v) {
        if (n >= cap || !json_is_string(v)) continue;
        kv[2 * n] = k;
        kv[2 * n + 1] = json_string_value(v);
        n++;
    }
    return n;
}

#define MAX_BUCKETS 32
#define MAX_LABELS 6

/* One histogram series: its buckets filled from the rows [i, j) of r (same family and
 * labels; suffix bucket/count/sum). A bound with no row has seen no value at or below it:
 * every row is cumulative, so the missing ones are the leading zeros. */
static void histogram_series(strbuf *b, const char *fam, const PGresult *r, int i, int j,
                             const double *bounds, int nb) {
    json_t *holder;
    const char *kv[2 * (MAX_LABELS + 1)];
    int nl = labels_of(PQgetvalue(r, i, 4), &holder, kv, MAX_LABELS);
    double sum = 0, count = 0;
    char name[128], le[32];
    snprintf(name, sizeof name, "%s_bucket", fam);
    for (int k = 0; k <= nb; k++) {
        double bound = k < nb ? bounds[k] : INFINITY, v = 0;
        for (int x = i; x < j; x++)
            if (!strcmp(PQgetvalue(r, x, 5), "bucket") && num(r, x, 6) == bound) v = num(r, x, 7);
        fmt_le(bound, le, sizeof le);
        kv[2 * nl] = "le";
        kv[2 * nl + 1] = le;
        sample(b, name, kv, nl + 1, v);
    }
    for (int x = i; x < j; x++) {
        if (!strcmp(PQgetvalue(r, x, 5), "sum")) sum = num(r, x, 7);
        if (!strcmp(PQgetvalue(r, x, 5), "count")) count = num(r, x, 7);
    }
    snprintf(name, sizeof name, "%s_sum", fam);
    sample(b, name, kv, nl, sum);
    snprintf(name, sizeof name, "%s_count", fam);
    sample(b, name, kv, nl, count);
    json_decref(holder);
}

static int folded_metrics(PGconn *db, strbuf *b, char *err, size_t errlen) {
    PGresult *r = db_query(db, SQL_M_COUNTERS, 0, NULL, err, errlen);
    if (!r) return -1;
    int n = PQntuples(r);
    for (int i = 0; i < n;) {
        const char *fam = PQgetvalue(r, i, 0);
        bool hist = !strcmp(PQgetvalue(r, i, 1), "histogram");
        family(b, fam, PQgetvalue(r, i, 1), PQgetvalue(r, i, 2));
        double bounds[MAX_BUCKETS];
        int nb = parse_buckets(PQgetvalue(r, i, 3), bounds, MAX_BUCKETS);
        int f_end = i;
        while (f_end < n && !strcmp(PQgetvalue(r, f_end, 0), fam)) f_end++;
        for (int s = i; s < f_end;) {
            if (PQgetisnull(r, s, 4)) { s++; continue; }   /* a family with no series yet */
            int e = s;
            while (e < f_end && !strcmp(PQgetvalue(r, e, 4), PQgetvalue(r, s, 4))) e++;
            if (hist) {
                histogram_series(b, fam, r, s, e, bounds, nb);
            } else {
                json_t *holder;
                const char *kv[2 * MAX_LABELS];
                int nl = labels_of(PQgetvalue(r, s, 4), &holder, kv, MAX_LABELS);
                sample(b, fam, kv, nl, num(r, s, 7));
                json_decref(holder);
            }
            s = e;
        }
        i = f_end;
    }
    PQclear(r);
    return 0;
}

int api_h_metrics(api_call *c) {
    strbuf b;
    sb_init(&b, 1 << 16);
    http_metrics(&b);
    /* The events since the last fold first (a transaction of its own: a concurrent fold
     * must have committed before it, or this one skips), then the deployment's series
     * from one snapshot of the database, with index scans, which mark the dead versions
     * of live operations they step on (SQL_NO_BITMAP: the queue reads every one). */
    strbuf d;
    sb_init(&d, 1 << 16);
    bool ok = db_exec(c->db, SQL_M_FOLD, 0, NULL, c->err, sizeof c->err) == 0 &&
              db_exec(c->db, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL, c->err, sizeof c->err) == 0 &&
              db_exec(c->db, SQL_NO_BITMAP, 0, NULL, c->err, sizeof c->err) == 0 &&
              folded_metrics(c->db, &d, c->err, sizeof c->err) == 0 &&
              queue_metrics(c->db, &d, c->err, sizeof c->err) == 0 &&
              executor_metrics(c->db, &d, c->err, sizeof c->err) == 0 &&
              registry_metrics(c->db, &d, c->err, sizeof c->err) == 0 &&
              db_commit(c->db, c->err, sizeof c->err) == 0;
    if (!ok) {
        db_rollback(c->db);
        log_warn("/metrics: the database part is left out: %s", c->err);
    } else {
        sb_append(&b, d.data, d.len);
    }
    sb_free(&d);
    family(&b, "loom_database_up", "gauge",
           "1 when this scrape read the deployment's series from PostgreSQL, 0 when it could not.");
    sample(&b, "loom_database_up", NULL, 0, ok);
    size_t len;
    char *text = sb_steal(&b, &len);
    return api_reply_bytes(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
}

/* ---- folding in the background ---------------------------------------------------------- */

#define FOLD_EVERY_S 15

static void *fold_thread(void *arg) {
    const char *conninfo = arg;
    PGconn *db = NULL;
    char err[512];
    for (;;) {
        sleep(FOLD_EVERY_S);
        if (!db || PQstatus(db) != CONNECTION_OK) {
            if (db) PQfinish(db);
            if (!(db = db_connect(conninfo, 0, err, sizeof err))) continue;
            db_exec(db, "SET application_name = 'loom api metrics'", 0, NULL, err, sizeof err);
        }
        PGresult *r = db_query(db, SQL_M_FOLD, 0, NULL, err, sizeof err);
        if (r) PQclear(r);
        else log_msg(PQstatus(db) == CONNECTION_OK ? LOG_WARN_ : db_outage_level(), "folding metric events: %s", err);
    }
    return NULL;
}

int api_metrics_start_folding(const char *conninfo, char *err, size_t errlen) {
    pthread_t t;
    char *copy = strdup(conninfo);
    if (!copy || pthread_create(&t, NULL, fold_thread, copy) != 0) {
        snprintf(err, errlen, "cannot start the metrics folding thread");
        free(copy);
        return -1;
    }
    pthread_detach(t);
    return 0;
}
