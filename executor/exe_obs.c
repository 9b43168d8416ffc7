/* exe_obs.c: the cycle log line and the GPU figures of an executor (see exe_obs.h). */
#include "executor/exe_obs.h"
#include "common/db.h"
#include "common/log.h"
#include "common/strbuf.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the cycle line ------------------------------------------------------------------------ */

#define LINE_MAX_MODELS 16   /* models named in one line; the rest are counted */

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void exe_log_cycle(int64_t cycle, const exe_op *ops, int n, exe_cycle_times t, const char *claim) {
    if (!log_enabled(LOG_INFO_)) return;
    strbuf tenants, models, losses;
    sb_init(&tenants, 64);
    sb_init(&models, 256);
    sb_init(&losses, 256);
    /* The tenants by name with their operations, from what the cycle's start read (no
     * query of its own on the loop's connection). */
    double tokens = 0;
    const char **names = calloc(n ? (size_t)n : 1, sizeof *names);
    for (int i = 0; names && i < n; i++) {
        names[i] = ops[i].tenant_name;
        tokens += (double)ops[i].tokens;
    }
    if (names) qsort(names, (size_t)n, sizeof *names, by_name);
    for (int i = 0, k = 0; names && i < n; i = k) {
        for (k = i; k < n && !strcmp(names[k], names[i]); k++) {}
        sb_printf(&tenants, "%s%s(%d)", i ? "," : "", names[i], k - i);
    }
    free(names);
    /* ops come sorted by model: one entry per model, its forward_backward losses summed */
    int failed = 0, named = 0, more = 0;
    const char *first_error = NULL;
    for (int i = 0; i < n; i++) {
        if (ops[i].category) {
            failed++;
            if (!first_error) first_error = ops[i].error;
        }
        if (!ops[i].model_id[0] || (i > 0 && !strcmp(ops[i].model_id, ops[i - 1].model_id))) continue;
        if (named == LINE_MAX_MODELS) { more++; continue; }
        named++;
        sb_printf(&models, "%s%s", models.len ? "," : "", ops[i].model_id);
        double loss = 0;
        bool has_loss = false;
        for (int j = i; j < n && !strcmp(ops[j].model_id, ops[i].model_id); j++) {
            json_t *l = json_object_get(json_object_get(ops[j].result, "metrics"), "loss:sum");
            if (!strcmp(ops[j].kind, "forward_backward") && json_is_number(l)) {
                loss += json_number_value(l);
                has_loss = true;
            }
        }
        if (has_loss) sb_printf(&losses, "%s%s=%.6g", losses.len ? "," : "", ops[i].model_id, loss);
    }
    if (more) sb_printf(&models, ",+%d more", more);
    log_field f[13];
    size_t k = 0;
#define TENTHS_MS(s) ((double)(long long)((s) * 1e4) / 10)
    f[k++] = LOG_N("cycle", cycle);
    f[k++] = LOG_S("claim", claim);
    f[k++] = LOG_N("ms", TENTHS_MS(t.total));
    f[k++] = LOG_N("start_ms", TENTHS_MS(t.start));
    f[k++] = LOG_N("compute_ms", TENTHS_MS(t.compute));
    f[k++] = LOG_N("commit_ms", TENTHS_MS(t.commit));
#undef TENTHS_MS
    f[k++] = LOG_N("ops", n);
    f[k++] = LOG_N("failed", failed);
    f[k++] = LOG_N("tokens", tokens);
    f[k++] = LOG_S("tenants", tenants.data);
    f[k++] = LOG_S("models", models.data);
    f[k++] = LOG_S("losses", losses.data);
    if (first_error) f[k++] = LOG_S("error", first_error);
    log_fields(LOG_INFO_, "cycle done", f, k);
    sb_free(&tenants);
    sb_free(&models);
    sb_free(&losses);
}

/* ---- NVML ------------------------------------------------------------------------------------
 * The few entry points used, declared here from NVML's stable C ABI (nvml.h is not in
 * Debian main; the driver ships the library). nvmlReturn_t 0 is success. */

typedef struct nvml_device *nvml_device_t;
typedef struct { unsigned int gpu, memory; } nvml_utilization_t;
typedef struct { unsigned long long total, free, used; } nvml_memory_t;

struct exe_gpu {
    void *lib;
    nvml_device_t dev;
    char name[96];
    int (*shutdown)(void);
    int (*utilization)(nvml_device_t, nvml_utilization_t *);
    int (*memory)(nvml_device_t, nvml_memory_t *);
    int (*temperature)(nvml_device_t, int, unsigned int *);
    int (*power)(nvml_device_t, unsigned int *);
};

/* The NVML index (or UUID) of the backend's device index under CUDA_VISIBLE_DEVICES. */
static void nvml_id_of(int device, char *out, size_t n) {
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    snprintf(out, n, "%d", device);
    if (!vis || !*vis) return;
    const char *p = vis;
    for (int i = 0; i < device && p; i++) {
        p = strchr(p, ',');
        if (p) p++;
    }
    if (!p) return;
    size_t len = strcspn(p, ",");
    snprintf(out, n, "%.*s", (int)len, p);
}

exe_gpu *exe_gpu_open(const char *backend, int device) {
    /* The CPU has no NVML figures; the sim's GPU is modelled (a real GPU of the host would
     * put its figures in the row of an executor that does not use it). */
    if (!strcmp(backend, "cpu") || !strcmp(backend, "sim")) return NULL;
    const char *path = getenv("LOOM_NVML_LIBRARY");
    if (!path || !*path) path = "libnvidia-ml.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        log_info("no GPU figures in the executors row: NVML (%s) cannot be loaded: %s", path, dlerror());
        return NULL;
    }
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*by_index)(unsigned int, nvml_device_t *) =
        (int (*)(unsigned int, nvml_device_t *))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*by_uuid)(const char *, nvml_device_t *) =
        (int (*)(const char *, nvml_device_t *))dlsym(lib, "nvmlDeviceGetHandleByUUID");
    int (*get_name)(nvml_device_t, char *, unsigned int) =
        (int (*)(nvml_device_t, char *, unsigned int))dlsym(lib, "nvmlDeviceGetName");
    exe_gpu *g = calloc(1, sizeof *g);
    if (!g) abort();
    g->lib = lib;
    g->shutdown = (int (*)(void))dlsym(lib, "nvmlShutdown");
    g->utilization = (int (*)(nvml_device_t, nvml_utilization_t *))dlsym(lib, "nvmlDeviceGetUtilizationRates");
    g->memory = (int (*)(nvml_device_t, nvml_memory_t *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    g->temperature = (int (*)(nvml_device_t, int, unsigned int *))dlsym(lib, "nvmlDeviceGetTemperature");
    g->power = (int (*)(nvml_device_t, unsigned int *))dlsym(lib, "nvmlDeviceGetPowerUsage");
    char id[128];
    nvml_id_of(device, id, sizeof id);
    int rc = -1;
    if (init && by_index && (rc = init()) == 0) {
        if (!strncmp(id, "GPU-", 4) || !strncmp(id, "MIG-", 4)) rc = by_uuid ? by_uuid(id, &g->dev) : -1;
        else rc = by_index((unsigned)atoi(id), &g->dev);
    }
    if (rc != 0) {
        log_warn("no GPU figures in the executors row: NVML has no device %s (error %d)", id, rc);
        if (init && g->shutdown) g->shutdown();
        dlclose(lib);
        free(g);
        return NULL;
    }
    if (!get_name || get_name(g->dev, g->name, sizeof g->name) != 0) snprintf(g->name, sizeof g->name, "GPU %s", id);
    log_info("GPU figures from NVML: device %s (%s)", id, g->name);
    return g;
}

const char *exe_gpu_name(const exe_gpu *g) { return g->name; }

int exe_gpu_read(exe_gpu *g, exe_gpu_sample *s) {
    nvml_utilization_t u;
    nvml_memory_t m;
    unsigned int t, mw;
    s->utilization = g->utilization && g->utilization(g->dev, &u) == 0 ? u.gpu : -1;
    bool mem = g->memory && g->memory(g->dev, &m) == 0;
    s->memory_used = mem ? (double)m.used : -1;
    s->memory_total = mem ? (double)m.total : -1;
    s->temperature = g->temperature && g->temperature(g->dev, 0 /* NVML_TEMPERATURE_GPU */, &t) == 0 ? t : -1;
    s->power_watts = g->power && g->power(g->dev, &mw) == 0 ? mw / 1000.0 : -1;
    return s->utilization >= 0 || mem ? 0 : -1;
}

#define SQL_OBS_GPU                                                                           \
    "UPDATE executors SET gpu_utilization = $2, gpu_memory_used = $3, gpu_memory_total = $4,"  \
    " gpu_temperature = $5, gpu_power_watts = $6, gpu_sampled_at = now() WHERE id = $1"

int exe_gpu_report(exe_gpu *g, PGconn *c, int64_t executor_id, char *err, size_t errlen) {
    exe_gpu_sample s;
    if (exe_gpu_read(g, &s) < 0) {
        snprintf(err, errlen, "NVML gave no utilisation or memory figure");
        return -1;
    }
    char id[24], v[5][32];
    const double vals[5] = {s.utilization, s.memory_used, s.memory_total, s.temperature, s.power_watts};
    const char *p[6] = {id};
    snprintf(id, sizeof id, "%lld", (long long)executor_id);
    for (int i = 0; i < 5; i++) {
        snprintf(v[i], sizeof v[i], i == 1 || i == 2 ? "%.0f" : "%.3f", vals[i]);
        p[i + 1] = vals[i] < 0 ? NULL : v[i];
    }
    return db_exec(c, SQL_OBS_GPU, 6, p, err, errlen);
}

void exe_gpu_close(exe_gpu *g) {
    if (!g) return;
    if (g->shutdown) g->shutdown();
    dlclose(g->lib);
    free(g);
}
