/* exe_obs.h: what an executor tells operators beyond its results: one log line per
 * cycle (tenants, models, losses) and its GPU's figures in its executors row, read
 * through NVML loaded at run time (dlopen), so that one build runs on machines with and
 * without an NVIDIA driver. */
#pragma once
#include "executor/exe_ops.h"
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

/* The cycle's line, after its commit: id, duration, operations (failed ones and the
 * first error), tokens, the tenants that shared it, its models and their losses
 * (loss:sum of their forward_backward operations), and who claimed it (claim: "scheduler";
 * "own", the executor's own pass; "hint", planned from a submit's hint and claimed in one
 * round trip). Everything from the operations as the cycle's start read them: no query. */
/* A cycle's seconds: in all, from setting out to start it (its claim, when the executor's
 * own) until its operations were read; its own work (restore, compute); its results
 * encoded, written and committed. */
typedef struct {
    double total, start, compute, commit;
} exe_cycle_times;
void exe_log_cycle(int64_t cycle, const exe_op *ops, int n, exe_cycle_times t, const char *claim);

/* One GPU as NVML sees it. */
typedef struct exe_gpu exe_gpu;

typedef struct {
    double utilization;      /* percent; < 0 when unknown */
    double memory_used, memory_total;   /* bytes; < 0 when unknown */
    double temperature;      /* Celsius; < 0 when unknown */
    double power_watts;      /* < 0 when unknown */
} exe_gpu_sample;

/* The GPU behind a backend's device index, or NULL (logged) when the backend is the CPU
 * one, or NVML or the device cannot be found. The library is LOOM_NVML_LIBRARY if set,
 * else libnvidia-ml.so.1. The index follows CUDA_VISIBLE_DEVICES (numbers or GPU-UUIDs)
 * when it is set; otherwise NVML's order, which is CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID. */
exe_gpu *exe_gpu_open(const char *backend, int device);
const char *exe_gpu_name(const exe_gpu *g);
int exe_gpu_read(exe_gpu *g, exe_gpu_sample *out);
/* Writes a fresh sample into the executor's row (its heartbeat does, every 3 s). 0 or -1. */
int exe_gpu_report(exe_gpu *g, PGconn *c, int64_t executor_id, char *err, size_t errlen);
void exe_gpu_close(exe_gpu *g);
