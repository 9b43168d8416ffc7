/* cuda_check.c — failures of the CUDA backend (see cuda_check.h). */
#include "backend/cuda/cuda_check.h"
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>

bool cu_sticky(int rc)
{
    /* The errors whose documentation (driver_types.h) says the process is left in an
     * inconsistent state and every later CUDA call returns them: kernel faults, device
     * assertions, watchdog timeouts, uncorrectable ECC/NVLink errors, a lost MPS server. */
    switch (rc) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContained:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice:
        return true;
    default:
        return false;
    }
}

int cu_check(cu_ctx *c, int rc, const char *call, const char *file, int line)
{
    if (rc == 0 && c->sync_debug) rc = (int)cudaStreamSynchronize(c->stream);
    if (rc == 0) return 0;
    /* A refused argument (LCU_EINVAL), a cuBLAS status or a CUDA error such as out of memory
     * or a bad launch configuration fails this call only. The runtime keeps such an error
     * as the thread's last error, which the next kernel launch's check (lcu_launch_status,
     * cudaGetLastError) would report as its own: cleared here. A cuBLAS failure may hide a
     * fault of its own kernels: the stream is asked, and a sticky error there counts. */
    int lost = cu_sticky(rc) ? rc : 0;
    if (!lost) {
        int last = (int)cudaGetLastError();
        int probe = (int)cudaStreamQuery(c->stream); /* cudaErrorNotReady: still busy */
        cudaGetLastError();                           /* nothing of the probe's stays behind */
        lost = cu_sticky(last) ? last : cu_sticky(probe) ? probe : 0;
    }
    /* the first failure of the call, unless a later one lost the device: that one counts */
    if (!c->errmsg[0] || (lost && !c->failed)) {
        /* the call text up to its argument list is enough to find it */
        int n = 0;
        while (call[n] && call[n] != '(' && n < 48) n++;
        char also[160] = "";
        if (lost && lost != rc) snprintf(also, sizeof also, " (and the device reports %s)", lcu_strerror(lost));
        snprintf(c->errmsg, sizeof c->errmsg, "cuda:%d: %s: %.*s failed: %s%s (%s:%d)%s", c->device,
                 c->where[0] ? c->where : "?", n, call, lcu_strerror(rc), also, file, line,
                 !lost || c->sync_debug ? "" : "; LOOM_CUDA_SYNC=1 pins asynchronous faults to their step");
    }
    if (lost) c->failed = true;
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
    /* A call that failed may have left work queued, uploads from the host mirrors included
     * (cuda_ctx.h, cu_buf): this call must not rewrite them before that work is done. After
     * a call that succeeded the stream is idle already, and this costs microseconds. */
    if (!rc) rc = (int)cudaStreamSynchronize(c->stream);
    if (!rc && c->side) rc = (int)cudaStreamSynchronize(c->side); /* LCU_DECODE_SIDE's shrinks write z */
    if (rc) {
        snprintf(c->errmsg, sizeof c->errmsg, "cuda:%d: starting a call: %s", c->device, lcu_strerror(rc));
        if (cu_sticky(rc)) c->failed = true;
        else cudaGetLastError();
        err_set(err, errlen, "%s", c->errmsg);
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
