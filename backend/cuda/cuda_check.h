/* cuda_check.h — how the CUDA backend's files call the device and report failures.
 *
 * Every CUDA runtime or lcu_* call goes through CU_TRY: on failure it records one message
 * naming the step (c->where: "layer 3 backward", "head rows 512..1024", ...), the call
 * and its file:line, and makes the enclosing function return -1; the table's entry point
 * then hands the message to its caller.
 *
 * Only a sticky CUDA error (cu_sticky: an illegal or misaligned address, a launch failure,
 * ... after which every CUDA call of the process returns the same error) marks the context
 * failed, so that every later call says so (restart the executor). Anything else (a
 * refused argument, a cuBLAS status such as NOT_SUPPORTED, out of memory, a launch the
 * device refused) fails the call that met it and no other: the runtime's last error is
 * cleared, and the next call starts clean. A pass that fails after it began adding
 * gradients clears its adapters' gradients (cuda_backend.c), and an optimizer step that
 * fails after AdamW ran marks the context failed: neither leaves a half-applied state.
 *
 * LOOM_CUDA_SYNC=1 (any non-empty value but 0) synchronizes after every call, so that an
 * asynchronous fault (an illegal address in a kernel) is reported at the step that made
 * it rather than at the next synchronizing call. For debugging: it costs throughput.
 */
#ifndef LOOM_BACKEND_CUDA_CHECK_H
#define LOOM_BACKEND_CUDA_CHECK_H

#include "backend/cuda/cuda_ctx.h"

/* Whether a CUDA error code leaves the process's CUDA context unusable (driver_types.h:
 * "the process must be terminated and relaunched"). */
bool cu_sticky(int rc);

/* 0 when rc is 0 (and, in sync mode, the stream then drains cleanly); else records the
 * failure in c (marking c failed when rc, or what the stream reports then, is sticky) and
 * returns -1. */
int cu_check(cu_ctx *c, int rc, const char *call, const char *file, int line);

#define CU_TRY(c, call)                                                                  \
    do {                                                                                 \
        if (cu_check((c), (int)(call), #call, __FILE__, __LINE__) != 0) return -1;       \
    } while (0)

/* Names the step that runs now (printf format), for failure messages. */
void cu_where(cu_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Starts a table call: makes c's device current, waits until its stream is idle (work a
 * failed call left queued), clears the last message; -1 with err when an earlier fault
 * left the context unusable. */
int cu_begin(cu_ctx *c, char *err, size_t errlen);

/* Ends a failed table call: err = the recorded message (or what), returns -1. */
int cu_fail(cu_ctx *c, char *err, size_t errlen, const char *what);

/* Waits for the context's stream: 0, or -1 with the failure recorded. */
int cu_sync(cu_ctx *c);

#endif
