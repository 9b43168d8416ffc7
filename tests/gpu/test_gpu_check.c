/* test_gpu_check.c — the CUDA backend's error policy (backend/cuda/cuda_check.c): only a
 * sticky CUDA error marks a context failed; anything else fails the one call.
 *
 * Without a device (these checks run anywhere, then the test is skipped): which codes are
 * sticky; a refused argument and a cuBLAS status leave the context usable and their message
 * carries no LOOM_CUDA_SYNC hint; an illegal address marks it failed, and cu_begin then
 * refuses every call.
 *
 * On the device: a real out-of-memory error through cu_check leaves the context usable and
 * the next kernel launch clean (the runtime's last error is cleared: without that, the
 * launch check would report the allocation's error as its own); then a real fault (a
 * gather reading 2⁴⁰ rows past its source: an illegal address) marks the context failed,
 * and a second context that meets only a cuBLAS failure afterwards is marked failed too,
 * because the stream reports the fault. The fault ruins the process's CUDA context: it
 * comes last.
 */
#include "tests/gpu/gt.h"

#include "backend/cuda/cuda_check.h"

#include <string.h>

#define TRY(c, rc) cu_check((c), (rc), #rc, __FILE__, __LINE__)

static void host_checks(void)
{
    const int sticky[] = {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorMisalignedAddress,
                          cudaErrorIllegalInstruction, cudaErrorAssert, cudaErrorECCUncorrectable};
    const int plain[] = {0, LCU_EINVAL, LCU_ECUBLAS_BASE + 15 /* NOT_SUPPORTED */, cudaErrorMemoryAllocation,
                         cudaErrorInvalidValue, cudaErrorLaunchOutOfResources, cudaErrorInvalidConfiguration};
    for (size_t i = 0; i < sizeof sticky / sizeof sticky[0]; i++)
        gt_check(cu_sticky(sticky[i]), "%s is sticky", lcu_strerror(sticky[i]));
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        gt_check(!cu_sticky(plain[i]), "%s is not sticky", lcu_strerror(plain[i]));

    cu_ctx c;
    memset(&c, 0, sizeof c);
    char err[600];
    cu_where(&c, "layer %d backward", 3);
    gt_check(TRY(&c, LCU_EINVAL) == -1 && !c.failed, "a refused argument fails the call, not the context");
    gt_check(strstr(c.errmsg, "layer 3 backward") && strstr(c.errmsg, "invalid argument") &&
                 !strstr(c.errmsg, "LOOM_CUDA_SYNC"),
             "its message names the step and the error, without the sync hint: %s", c.errmsg);
    c.errmsg[0] = 0;
    gt_check(TRY(&c, LCU_ECUBLAS_BASE + 15) == -1 && !c.failed, "a cuBLAS status fails the call, not the context (%s)",
             c.errmsg);
    c.errmsg[0] = 0;
    gt_check(TRY(&c, cudaErrorMemoryAllocation) == -1 && !c.failed, "out of memory fails the call, not the context");
    c.errmsg[0] = 0;
    gt_check(TRY(&c, cudaErrorIllegalAddress) == -1 && c.failed, "an illegal address marks the context failed");
    gt_check(strstr(c.errmsg, "LOOM_CUDA_SYNC") != NULL, "its message says how to pin it to its step: %s", c.errmsg);
    gt_check(cu_begin(&c, err, sizeof err) == -1 && strstr(err, "failed earlier") && strstr(err, "restart"),
             "every later call is refused: %s", err);
}

int main(void)
{
    host_checks();
    if (gt_failed) return gt_finish(); /* a failure here is one whether or not a device is present */
    gt_init("test_gpu_check");

    cu_ctx c;
    memset(&c, 0, sizeof c);
    GT_CUDA(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
    char err[600];
    float *a = gt_dev_poison(64 * 4);
    lcu_bf16 *b = gt_dev_poison(64 * 2);

    void *huge = NULL;
    int rc = (int)cudaMalloc(&huge, (size_t)1 << 50); /* a petabyte: refused */
    gt_check(rc == cudaErrorMemoryAllocation, "cudaMalloc of 2^50 bytes: %s", lcu_strerror(rc));
    gt_check(TRY(&c, rc) == -1 && !c.failed, "out of memory through cu_check leaves the context usable");
    gt_check(cu_begin(&c, err, sizeof err) == 0, "the next call begins (%s)", err);
    rc = lcu_convert(b, LCU_BF16, a, LCU_F32, 64, c.stream);
    gt_check(rc == 0, "the next kernel launch is clean: %s (not the allocation's error)", lcu_strerror(rc));
    gt_check(TRY(&c, lcu_convert(b, (lcu_dtype)7, a, LCU_F32, 64, c.stream)) == -1 && !c.failed,
             "a refused launch argument leaves the context usable");
    gt_check(TRY(&c, cudaStreamSynchronize(c.stream)) == 0, "and the stream is clean");

    /* the fault, last */
    int64_t far = (int64_t)1 << 40;
    int64_t *idx = gt_dev_copy(&far, sizeof far);
    c.errmsg[0] = 0;
    rc = lcu_copy_rows(a, NULL, a, idx, 1, 64 * 4, c.stream);
    if (rc == 0) rc = (int)cudaStreamSynchronize(c.stream);
    gt_check(cu_sticky(rc), "a gather 2^40 rows out of bounds faults: %s", lcu_strerror(rc));
    gt_check(TRY(&c, rc) == -1 && c.failed, "the fault marks the context failed: %s", c.errmsg);
    gt_check(cu_begin(&c, err, sizeof err) == -1 && strstr(err, "failed earlier"), "later calls are refused: %s", err);

    cu_ctx d;
    memset(&d, 0, sizeof d);
    d.stream = c.stream;
    gt_check(TRY(&d, LCU_ECUBLAS_BASE + 13 /* EXECUTION_FAILED */) == -1 && d.failed,
             "a cuBLAS failure over a faulted device marks its context failed too: %s", d.errmsg);
    return gt_finish();
}
