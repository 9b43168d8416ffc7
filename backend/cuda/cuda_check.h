/* cuda_check.h — how the CUDA backend's files call the device and report failures.
 *
 * Every CUDA runtime or lcu_* call goes through CU_TRY: on failure it records one message
 * naming the step (c->where: "layer 3 backward", "head rows 512..1024", ...), the call
 * and its file:line, and makes the enclosing function return -1; the table's entry point
 * then hands the message to its caller. A fault inside a pass leaves the adapters' state
 * unknown (gradients half accumulated) and, for most device errors, the CUDA context
 * unusable: the context is marked failed and every later call says so (restart the
 * executor). Out of memory while growing the workspace is not a fault: nothing has
 * started then, and the call fails cleanly.
 *
 * LOOM_CUDA_SYNC=1 (any non-empty value but 0) synchronizes after every call, so that an
 * asynchronous fault (an illegal address in a kernel) is reported at the step that made
 * it rather than at the next synchronizing call. For debugging: it costs throughput.
 */
#ifndef LOOM_BACKEND_CUDA_CHECK_H
#define LOOM_BACKEND_CUDA_CHECK_H

#include "backend/cuda/cuda_ctx.h"

/* 0 when rc is 0 (and, in sync mode, the stream then drains cleanly); else records the
 * failure in c and returns -1. */
int cu_check(cu_ctx *c, int rc, const char *call, const char *file, int line);

#define CU_TRY(c, call)                                                                  \
    do {                                                                                 \
        if (cu_check((c), (int)(call), #call, __FILE__, __LINE__) != 0) return -1;       \
    } while (0)

/* Names the step that runs now (printf format), for failure messages. */
void cu_where(cu_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Starts a table call: makes c's device current, clears the last message; -1 with err when
 * an earlier fault left the context unusable. */
int cu_begin(cu_ctx *c, char *err, size_t errlen);

/* Ends a failed table call: err = the recorded message (or what), returns -1. */
int cu_fail(cu_ctx *c, char *err, size_t errlen, const char *what);

/* Waits for the context's stream: 0, or -1 with the failure recorded. */
int cu_sync(cu_ctx *c);

#endif
