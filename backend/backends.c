/* backends.c — the backends of this build, found by name (`loom executor --backend`,
 * LOOM_TEST_BACKEND in the tests, `bench_backend --backend`). */
#include "backend/backend.h"

#include <stdio.h>
#include <string.h>

extern const exe_backend exe_backend_cpu;   /* backend/cpu/cpu_backend.c */
#ifdef LOOM_HAVE_CUDA
extern const exe_backend exe_backend_cuda;  /* backend/cuda/cuda_backend.c */
#endif

static const exe_backend *const backends[] = {
    &exe_backend_cpu,
#ifdef LOOM_HAVE_CUDA
    &exe_backend_cuda,
#endif
};

const exe_backend *exe_backend_find(const char *name)
{
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (!strcmp(backends[i]->name, name)) return backends[i];
    return NULL;
}

const char *exe_backend_names(void)
{
    static char names[128];
    if (!names[0])
        for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
            size_t n = strlen(names);
            snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", backends[i]->name);
        }
    return names;
}

int exe_backend_device_count(const char *name)
{
    const exe_backend *be = exe_backend_find(name);
    return be ? be->device_count() : 0;
}
