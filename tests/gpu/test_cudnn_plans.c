/* test_cudnn_plans.c — do cuDNN's own engines take the attention graphs lcu_cudnn_attn.c
 * builds? Asked of the real libcudnn installed on this machine (the loader's search;
 * skipped, 77, where there is none or it is older than 9.8), without a GPU: a device-less
 * context (lcu_cudnn_create_deviceless) plans for an H100 described by hand below, so
 * cuDNN's heuristics and support checks run for sm_90 as on the GPU machine.
 *
 * ctest puts the CUDA toolkit's stub driver first on LD_LIBRARY_PATH (stubs/libcuda.so as
 * libcuda.so.1, see cuda.cmake): the runtime-compiled engines then get as far as compiling
 * their kernels for the graph, and only loading the compiled kernels into the (absent)
 * device fails. A graph counts as taken when its plan finalizes, or when an engine config
 * failed only there (lcd_graph.accepted); a graph the engines do not recognise is refused
 * earlier, by every engine, with CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN and the like.
 *
 * Per graph: the forward and the deterministic backward (engines with cuDNN's
 * NONDETERMINISTIC note are not tried) at the geometries (Qwen3-0.6B 16/8 × 128,
 * Llama-3.2-1B 32/8 × 64, Qwen3-8B 32/8 × 128), MHA and MQA, in the buckets the backend
 * uses (one long sequence, many short ones). Head dims 16 and 32 (the own kernels take
 * them) are reported, not required. Each line gives the engine and its workspace.
 *
 * The backward of one long sequence in head groups (lcu_cudnn_bwd_groups): at 32K rows the
 * deterministic backward's workspace over all heads is over a quarter of an 80 GB card (the
 * default limit, set here as LCU_CUDNN_WORKSPACE_MB since a device-less context has none),
 * so it must be taken in 2 or more groups of heads, each graph over rows of all the heads.
 *
 * What this cannot say: whether the kernels compute the right numbers on packed batches
 * (test_gpu_cudnn_attn, on a GPU), nor how fast they are (bench_cuda_kernels).
 */
#include "backend/cuda/lcu_cudnn.h"
#include "tests/check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* An H100 SXM (80 GB HBM3) in cuDNN's device-property JSON (the fields cuDNN reads for
 * CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION): public figures of the part, sm_90. */
static const char *const h100 =
    "{\"cudnnVersion\": 91900, \"schemaVersion\": 1, \"deviceName\": \"NVIDIA H100 80GB HBM3\", "
    "\"maxGridSize\": [2147483647, 65535, 65535], \"maxBlockSize\": [1024, 1024, 64], \"regsPerBlock\": 65536, "
    "\"multiProcessorCount\": 132, \"warpSize\": 32, \"maxSharedMemoryPerBlock\": 49152, "
    "\"maxSharedMemoryPerBlockOptin\": 232448, \"reservedSharedMemoryPerBlock\": 1024, \"maxRegistersPerSM\": 65536, "
    "\"maxCtasPerSM\": 32, \"maxThreadsPerBlock\": 1024, \"maxThreadsPerSM\": 2048, \"pciDeviceId\": 0, "
    "\"isTccDriver\": 0, \"supportCoopLaunch\": 1, \"totalGlobalMem\": 85017755648, \"smClockRateKHz\": 1980000, "
    "\"memClockRateKHz\": 2619000, \"l2CacheSize\": 52428800, \"cudaDeviceId\": 0, \"deviceVer\": 900, "
    "\"driverVer\": 13000}";

/* One graph: planned, or taken by an engine up to loading its kernels. */
static void plan(lcu_cudnn *c, const char *geo, int nq, int nkv, int d, int nseq, int len, bool bwd, bool required)
{
    lcu_attn_desc a = {nseq, (const int32_t *)0x100, NULL, NULL, (long)nseq * len, nq, nkv, d,
                       (float)(1.0 / sqrt((double)d)), false};
    int64_t ws = 0, engine = -1;
    int accepted = 0;
    int rc = lcu_cudnn_plan_check(c, &a, len, bwd, &ws, &engine, &accepted);
    char what[200];
    snprintf(what, sizeof what, "%-12s heads %2d/%d x %3d, %3d x %5d rows, %s", geo, nq, nkv, d, nseq, len,
             bwd ? "backward (deterministic)" : "forward");
    bool ok = rc == 0 || accepted > 0;
    if (required)
        CHECK(ok, "%s: %s; engine %lld, workspace %.1f MiB", what,
              rc == 0 ? "plan built" : ok ? "taken (its kernels compiled; loading them needs the GPU)" : "refused",
              (long long)engine, ws / 1048576.0);
    else
        printf("note  %s: %s\n", what, ok ? "taken" : "refused (the own kernels run it)");
}

/* The backward of one sequence of len rows in head groups, within the workspace limit. */
static void groups(lcu_cudnn *c, const char *geo, int nq, int nkv, int d, int len, int min_groups)
{
    lcu_attn_desc a = {1, (const int32_t *)0x100, NULL, NULL, len, nq, nkv, d, (float)(1.0 / sqrt((double)d)), false};
    int64_t ws = 0, engine = -1;
    int accepted = 0, g = 0;
    int rc = lcu_cudnn_bwd_groups(c, &a, len, &g, &ws, &engine, &accepted);
    CHECK((rc == 0 || accepted > 0) && g >= min_groups && ws <= (int64_t)20480 << 20,
          "%-12s heads %2d/%d x %3d, 1 x %5d rows, backward in head groups: %d groups of %d/%d heads, engine %lld, "
          "workspace %.1f MiB (limit 20480)", geo, nq, nkv, d, len, g, g ? nq / g : 0, g ? nkv / g : 0,
          (long long)engine, ws / 1048576.0);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    setenv("LCU_CUDNN_WORKSPACE_MB", "20480", 1); /* a quarter of an 80 GB card, the default on one */
    lcu_cudnn *c = NULL;
    char why[1024];
    if (lcu_cudnn_create_deviceless(&c, h100, why, sizeof why) != 0) {
        printf("test_cudnn_plans: %s: skipped\n", why);
        return 77;
    }
    printf("%s, for an H100 (sm_90)\n", lcu_cudnn_describe(c));
    const struct {
        const char *name;
        int nq, nkv, d;
    } geos[] = {{"Qwen3-0.6B", 16, 8, 128}, {"Llama-3.2-1B", 32, 8, 64}, {"Qwen3-8B", 32, 8, 128},
                {"MHA", 8, 8, 64}, {"MQA", 8, 1, 128}};
    for (size_t i = 0; i < sizeof geos / sizeof geos[0]; i++)
        for (int bwd = 0; bwd < 2; bwd++) {
            plan(c, geos[i].name, geos[i].nq, geos[i].nkv, geos[i].d, 1, 2048, bwd, true);  /* bucket 1 × 2048 */
            plan(c, geos[i].name, geos[i].nq, geos[i].nkv, geos[i].d, 13, 500, bwd, true);  /* bucket 16 × 512 */
        }
    plan(c, "long", 16, 8, 128, 1, 32768, false, true);
    plan(c, "long", 16, 8, 128, 1, 32768, true, true);
    for (int d = 16; d <= 32; d *= 2)
        for (int bwd = 0; bwd < 2; bwd++) plan(c, "small-d", 4, 2, d, 5, 300, bwd, false);
    groups(c, "Qwen3-8B", 32, 8, 128, 32768, 4);   /* 66 GB at once, 16.5 GB in 4 groups */
    groups(c, "Qwen3-0.6B", 16, 8, 128, 32768, 2); /* 34 GB at once */
    groups(c, "Qwen3-8B", 32, 8, 128, 8192, 1);    /* 4.3 GB: all heads at once */
    lcu_cudnn_destroy(c);
    return check_summary();
}
