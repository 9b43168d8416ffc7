/* nvml_shim.c: a stand-in for the NVIDIA driver's libnvidia-ml.so (two devices with fixed
 * figures) for test_exe_gpu, so that the executor's NVML loading and reading (dlopen,
 * dlsym, device selection by CUDA_VISIBLE_DEVICES) run on machines without a GPU. Same C
 * ABI as NVML for the entry points the executor uses. */
#include <stdio.h>
#include <string.h>

typedef struct { int index; } shim_device;
typedef struct { unsigned int gpu, memory; } shim_utilization;
typedef struct { unsigned long long total, free, used; } shim_memory;

static shim_device devices[2] = {{0}, {1}};
static int inited;

int nvmlInit_v2(void) { inited = 1; return 0; }
int nvmlShutdown(void) { inited = 0; return 0; }

int nvmlDeviceGetHandleByIndex_v2(unsigned int i, shim_device **out) {
    if (!inited || i > 1) return 2;   /* NVML_ERROR_INVALID_ARGUMENT */
    *out = &devices[i];
    return 0;
}

int nvmlDeviceGetHandleByUUID(const char *uuid, shim_device **out) {
    if (!inited) return 1;
    if (!strcmp(uuid, "GPU-00000000-0000-0000-0000-000000000001")) { *out = &devices[1]; return 0; }
    return 6;   /* NVML_ERROR_NOT_FOUND */
}

int nvmlDeviceGetName(shim_device *d, char *name, unsigned int len) {
    snprintf(name, len, "Shim GPU %d", d->index);
    return 0;
}

int nvmlDeviceGetUtilizationRates(shim_device *d, shim_utilization *u) {
    u->gpu = d->index ? 81 : 37;
    u->memory = 10;
    return 0;
}

int nvmlDeviceGetMemoryInfo(shim_device *d, shim_memory *m) {
    m->total = 80ull << 30;
    m->used = d->index ? 40ull << 30 : 12ull << 30;
    m->free = m->total - m->used;
    return 0;
}

int nvmlDeviceGetTemperature(shim_device *d, int sensor, unsigned int *t) {
    *t = sensor == 0 ? 55 + d->index : 0;
    return 0;
}

int nvmlDeviceGetPowerUsage(shim_device *d, unsigned int *mw) {
    if (d->index) return 3;   /* NVML_ERROR_NOT_SUPPORTED: the reader leaves it out */
    *mw = 123456;
    return 0;
}
