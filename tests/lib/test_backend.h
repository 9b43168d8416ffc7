/* test_backend.h — the backend the C tests run on, by name: LOOM_TEST_BACKEND (default
 * "cpu") on device LOOM_TEST_DEVICE (default 0), so that every suite checks whichever
 * backend the build has; plus host copies of adapters for checks and dumps. A backend with
 * no device on this machine (cuda without a GPU) skips the suite: exit status 77. */
#pragma once
#include "backend/backend.h"
#include "model/model.h"
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline const be_backend *test_backend(void)
{
    const char *name = getenv("LOOM_TEST_BACKEND");
    if (!name || !*name) name = "cpu";
    const be_backend *be = be_backend_find(name);
    if (!be) {
        fprintf(stderr, "LOOM_TEST_BACKEND=%s: unknown backend (this build has: %s)\n", name, be_backend_names());
        exit(2);
    }
    if (be->device_count() == 0) {
        printf("LOOM_TEST_BACKEND=%s: no %s device on this machine: skipped\n", name, name);
        exit(77);
    }
    return be;
}

/* True for a backend that computes in bf16 (every backend but the CPU reference, which
 * is fp32 throughout): the suites then hold it to bars that allow bf16 rounding, stated
 * where they are used, instead of the CPU's fp32 bars. */
static inline bool test_backend_bf16(const be_backend *be) { return strcmp(be->name, "cpu") != 0; }

/* dir's model opened on the test backend (threads: CPU threads); *mc its config.
 * NULL with err. */
static inline void *test_backend_open(const be_backend *be, const char *dir, int threads, model_config *mc, char *err,
                                      size_t errlen)
{
    model_files *mf;
    if (model_open(dir, &mf, err, errlen) < 0) return NULL;
    if (mc) *mc = mf->cfg;
    const char *dev = getenv("LOOM_TEST_DEVICE");
    be_backend_opts o = {.device = dev && *dev ? atoi(dev) : 0, .threads = threads};
    void *ctx = be->create(mf, &o, err, errlen);
    model_close(mf);
    return ctx;
}

/* The parts of a on the host (exits on failure: a test cannot go on without them). */
static inline adapter_state test_download(const be_backend *be, void *ctx, const be_adapter *a, unsigned parts)
{
    adapter_state s;
    char err[256];
    if (be_adapter_to_state(be, ctx, a, parts, &s, err, sizeof err) < 0) {
        fprintf(stderr, "adapter download: %s\n", err);
        exit(2);
    }
    return s;
}

static inline void test_upload(const be_backend *be, void *ctx, be_adapter *a, const adapter_state *s, unsigned parts)
{
    char err[256];
    if (be->adapter_upload(ctx, a, s, parts, err, sizeof err) < 0) {
        fprintf(stderr, "adapter upload: %s\n", err);
        exit(2);
    }
}
