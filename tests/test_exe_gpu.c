/* test_exe_gpu.c: the executor's GPU figures through NVML loaded at run time: no NVML
 * for the CPU backend or when the library is missing (the executor runs on), and with a
 * library (tests/nvml_shim, LOOM_NVML_LIBRARY) the device the backend index names,
 * following CUDA_VISIBLE_DEVICES by index and by UUID, with figures the library does not
 * support left out. */
#include "executor/exe_obs.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
#define CHECK(cond, msg) do { if (cond) { passed++; printf("ok    %s\n", msg); } \
    else { failed++; printf("FAIL  %s\n", msg); } } while (0)

int main(void) {
    const char *shim = getenv("LOOM_NVML_LIBRARY");
    if (!shim) { printf("LOOM_NVML_LIBRARY is not set (ctest sets it)\n0 passed, 1 failed\n"); return 1; }
    char shim_path[1024];
    snprintf(shim_path, sizeof shim_path, "%s", shim);

    CHECK(exe_gpu_open("cpu", 0) == NULL, "the CPU backend reads no GPU");
    setenv("LOOM_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
    CHECK(exe_gpu_open("cuda", 0) == NULL, "no NVML library: no GPU figures, no failure");
    setenv("LOOM_NVML_LIBRARY", shim_path, 1);

    unsetenv("CUDA_VISIBLE_DEVICES");
    exe_gpu *g = exe_gpu_open("cuda", 0);
    exe_gpu_sample s;
    CHECK(g && !strcmp(exe_gpu_name(g), "Shim GPU 0"), "device 0 by NVML index");
    CHECK(g && exe_gpu_read(g, &s) == 0 && s.utilization == 37 && s.memory_used == (double)(12ull << 30) &&
          s.memory_total == (double)(80ull << 30) && s.temperature == 55 && s.power_watts > 123.45 &&
          s.power_watts < 123.46, "utilisation, memory, temperature and power of device 0");
    exe_gpu_close(g);

    CHECK(exe_gpu_open("cuda", 2) == NULL, "a device NVML does not have: no figures");

    setenv("CUDA_VISIBLE_DEVICES", "1", 1);
    g = exe_gpu_open("cuda", 0);
    CHECK(g && !strcmp(exe_gpu_name(g), "Shim GPU 1"), "CUDA_VISIBLE_DEVICES=1: backend device 0 is NVML device 1");
    CHECK(g && exe_gpu_read(g, &s) == 0 && s.utilization == 81 && s.power_watts < 0,
          "device 1's figures; power not supported is left out");
    exe_gpu_close(g);

    setenv("CUDA_VISIBLE_DEVICES", "0,GPU-00000000-0000-0000-0000-000000000001", 1);
    g = exe_gpu_open("cuda", 1);
    CHECK(g && !strcmp(exe_gpu_name(g), "Shim GPU 1"), "CUDA_VISIBLE_DEVICES by UUID");
    exe_gpu_close(g);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
