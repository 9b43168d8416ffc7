/* backends.c — the backends of this build, found by name (`loom executor --backend`,
 * LOOM_TEST_BACKEND in the tests, `bench_backend --backend`).
 *
 * The CPU backend and the simulated GPU (backend/sim/, for fleet benchmarks) are linked in. Device backends are modules loaded on first use
 * (libloom_backend_<name>.so, exporting `be_backend_<name>`), so that the loom binary
 * and its Debian package depend on no vendor library (cuBLAS is no Debian package): a
 * machine without the CUDA libraries runs every other part of Loom, and `--backend cuda`
 * there says why it cannot load. Modules are looked for in $LOOM_BACKEND_DIR, next to the
 * running binary (the build directory), in ../lib/loom beside it, and in the install
 * directory. */
#include "backend/backend.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const be_backend be_backend_cpu;     /* backend/cpu/cpu_backend.c */
extern const be_backend be_backend_sim;     /* backend/sim/sim_backend.c */

#ifndef LOOM_MODULE_DIR
#define LOOM_MODULE_DIR "/usr/lib/loom"
#endif

/* The device backends that may exist as modules. */
static const char *const module_names[] = {"cuda"};
enum { N_MODULES = sizeof module_names / sizeof module_names[0] };

static struct {
    pthread_once_t once;
    const be_backend *be;
    char why[512];   /* why it could not be loaded */
} modules[N_MODULES] = {[0 ... N_MODULES - 1] = {.once = PTHREAD_ONCE_INIT}};
static int loading;  /* the index pthread_once is running for */

static const be_backend *try_load(const char *dir, const char *name, char *why, size_t whylen) {
    char path[PATH_MAX + 64], sym[64];
    snprintf(path, sizeof path, "%s/libloom_backend_%s.so", dir, name);
    if (access(path, F_OK) != 0) return NULL;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, whylen, "%s", dlerror());
        return NULL;
    }
    snprintf(sym, sizeof sym, "be_backend_%s", name);
    const be_backend *be = dlsym(h, sym);
    if (!be) snprintf(why, whylen, "%s has no %s", path, sym);
    return be;
}

static void load_module(void) {
    int i = loading;
    const char *name = module_names[i];
    char exe_dir[PATH_MAX] = "", lib_dir[PATH_MAX + 16] = "";
    ssize_t n = readlink("/proc/self/exe", exe_dir, sizeof exe_dir - 1);
    if (n > 0) {
        exe_dir[n] = 0;
        char *slash = strrchr(exe_dir, '/');
        if (slash) *slash = 0;
        snprintf(lib_dir, sizeof lib_dir, "%s/../lib/loom", exe_dir);
    }
    const char *dirs[] = {getenv("LOOM_BACKEND_DIR"), exe_dir, lib_dir, LOOM_MODULE_DIR};
    snprintf(modules[i].why, sizeof modules[i].why, "libloom_backend_%s.so not found (built where nvcc is present; "
             "LOOM_BACKEND_DIR names its directory)", name);
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0] && !modules[i].be; d++)
        if (dirs[d] && dirs[d][0]) modules[i].be = try_load(dirs[d], name, modules[i].why, sizeof modules[i].why);
}

static const be_backend *module(int i) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);   /* `loading` passes the index to pthread_once's callback */
    loading = i;
    pthread_once(&modules[i].once, load_module);
    pthread_mutex_unlock(&mu);
    return modules[i].be;
}

const be_backend *be_backend_find(const char *name)
{
    if (!strcmp(name, be_backend_cpu.name)) return &be_backend_cpu;
    if (!strcmp(name, be_backend_sim.name)) return &be_backend_sim;
    for (int i = 0; i < N_MODULES; i++)
        if (!strcmp(name, module_names[i])) return module(i);
    return NULL;
}

/* "cpu, sim, cuda" — or "cpu, sim (cuda: <why it cannot load>)". */
const char *be_backend_names(void)
{
    static char names[1024];
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    snprintf(names, sizeof names, "%s, %s", be_backend_cpu.name, be_backend_sim.name);
    for (int i = 0; i < N_MODULES; i++) {
        size_t n = strlen(names);
        if (module(i)) snprintf(names + n, sizeof names - n, ", %s", module_names[i]);
        else snprintf(names + n, sizeof names - n, " (%s: %s)", module_names[i], modules[i].why);
    }
    pthread_mutex_unlock(&mu);
    return names;
}

int be_backend_device_count(const char *name)
{
    const be_backend *be = be_backend_find(name);
    return be ? be->device_count() : 0;
}
