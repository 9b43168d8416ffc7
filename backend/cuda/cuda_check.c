/* cuda_check.c — failures of the CUDA backend (see cuda_check.h). */
#include "backend/cuda/cuda_check.h"
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>

int cu_check(cu_ctx *c, int rc, const char *call, const char *file, int line)
{
    if (rc == 0 && c->sync_debug) rc = (int)cudaStreamSynchronize(c->stream);
    if (rc == 0) return 0;
    if (!c->errmsg[0]) {
        /* the call text up to its argument list is enough to find it */
        int n = 0;
        while (call[n] && call[n] != '(' && n < 48) n++;
        snprintf(c->errmsg, sizeof c->errmsg, "cuda:%d: %s: %.*s failed: %s (%s:%d)%s", c->device,
                 c->where[0] ? c->where : "?", n, call, lcu_strerror(rc), file, line,
                 c->sync_debug ? "" : "; LOOM_CUDA_SYNC=1 pins asynchronous faults to their step");
    }
    c->failed = true;
    return -1;
}

void cu_where(cu_ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->where, sizeof c->where, fmt, ap);
    va_end(ap);
}

int cu_begin(cu_ctx *c, char *err, size_t errlen)
{
    c->where[0] = 0;
    if (c->failed) {
        err_set(err, errlen, "cuda:%d: the device failed earlier (%s); restart the executor", c->device, c->errmsg);
        return -1;
    }
    c->errmsg[0] = 0;
    int rc = (int)cudaSetDevice(c->device);
    if (rc) {
        err_set(err, errlen, "cuda:%d: cudaSetDevice: %s", c->device, lcu_strerror(rc));
        return -1;
    }
    return 0;
}

int cu_fail(cu_ctx *c, char *err, size_t errlen, const char *what)
{
    err_set(err, errlen, "%s", c->errmsg[0] ? c->errmsg : what);
    return -1;
}

int cu_sync(cu_ctx *c)
{
    CU_TRY(c, cudaStreamSynchronize(c->stream));
    return 0;
}
