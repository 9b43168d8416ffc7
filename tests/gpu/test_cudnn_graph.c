/* test_cudnn_graph.c — the cuDNN attention path's host side without a GPU or cuDNN: loads
 * the stand-in libcudnn (tests/cudnn_shim/cudnn_shim.c, its path is argv[1]) through the
 * real loader, builds the forward and backward graphs through the real builder
 * (lcu_cudnn_dry_run: the plan of a bucket, executed with placeholder addresses), and
 * checks what the stand-in saw: every descriptor complete and consistent (the stand-in
 * refuses otherwise), the bound tensors' shapes, strides, types and ragged offsets, the
 * scalars passed by value, the operation counts of each graph, the deterministic engine
 * for the backward, the shape buckets and the plan cache (reuse, refusals remembered,
 * least-recently-used eviction), LCU_CUDNN_EXACT_BATCH, LCU_CUDNN_WORKSPACE_MB and
 * LCU_CUDNN_ANY_ENGINE, the
 * loader's refusals (missing file, a library that is not cuDNN, cuDNN older than 9.6) and
 * the cuDNN 9.0–9.9 form of the backward.
 *
 * Whether cuDNN's engines accept these graphs is for the GPU test (test_gpu_cudnn_attn).
 */
#include "backend/cuda/lcu_cudnn.h"
#include "tests/check.h"

#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *shim_path;

/* the stand-in's inspection functions */
static int (*shim_executions)(void);
static int (*shim_graphs)(void);
static int64_t (*shim_last_engine)(void);
static int (*shim_last_ops)(void);
static bool (*shim_value)(int64_t, float *);
static bool (*shim_tensor)(int64_t, int64_t *, int64_t *, int *, int64_t *);
static int (*shim_count_ops)(int, int);

/* the uids lcu_cudnn_attn.c binds (its enum) */
enum {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV, U_SSUM, U_SEQ_Q, U_SEQ_KV, U_RO_QO, U_RO_KV, U_RO_ST,
    U_SCALE, U_ONE, U_NEGINF_PAD, U_NEGINF_CAUSAL, U_NEGINF_PAD2
};

static void bind_shim(void)
{
    void *h = dlopen(shim_path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
        printf("FAIL the stand-in library is not loaded: %s\n", dlerror());
        exit(1);
    }
    *(void **)&shim_executions = dlsym(h, "shim_cudnn_executions");
    *(void **)&shim_graphs = dlsym(h, "shim_cudnn_graphs");
    *(void **)&shim_last_engine = dlsym(h, "shim_cudnn_last_engine");
    *(void **)&shim_last_ops = dlsym(h, "shim_cudnn_last_ops");
    *(void **)&shim_value = dlsym(h, "shim_cudnn_value");
    *(void **)&shim_tensor = dlsym(h, "shim_cudnn_tensor");
    *(void **)&shim_count_ops = dlsym(h, "shim_cudnn_count_ops");
    if (!shim_executions || !shim_tensor || !shim_count_ops || !shim_value) {
        printf("FAIL the stand-in library lacks its inspection functions\n");
        exit(1);
    }
}

/* A packed batch as the backend describes it; q_start is never read by a dry run. */
typedef struct {
    lcu_attn_desc a;
    int max_len;
} batch;

static batch desc(int nseq, long T, int nq, int nkv, int d, int max_len)
{
    return (batch){{nseq, (const int32_t *)0x100, NULL, NULL, T, nq, nkv, d, (float)(1.0 / sqrt((double)d)), false}, max_len};
}

static int dry(lcu_cudnn *c, const batch *b, bool bwd) { return lcu_cudnn_dry_run(c, &b->a, b->max_len, bwd); }

/* The last graph's bound tensor uid has these dims, strides, type and ragged offsets. */
static void expect_tensor(const char *what, int64_t uid, const int64_t dm[4], const int64_t st[4], int type,
                          int64_t ragged)
{
    int64_t gd[4], gs[4], gr;
    int gt;
    bool found = shim_tensor(uid, gd, gs, &gt, &gr);
    CHECK(found && !memcmp(gd, dm, 32) && !memcmp(gs, st, 32) && gt == type && gr == ragged,
          "%s (uid %lld): dims %lld %lld %lld %lld strides %lld %lld %lld %lld type %d ragged %lld", what,
          (long long)uid, (long long)gd[0], (long long)gd[1], (long long)gd[2], (long long)gd[3], (long long)gs[0],
          (long long)gs[1], (long long)gs[2], (long long)gs[3], found ? gt : -1, found ? (long long)gr : -2LL);
}

#define V4(a, b, c, d) ((const int64_t[4]){(a), (b), (c), (d)})

static void check_forward(lcu_cudnn *c)
{
    /* 5 sequences (bucket 8), longest 100 rows (bucket 128), GQA 8/2, d 64 */
    batch a = desc(5, 300, 8, 2, 64, 100);
    int e0 = shim_executions();
    CHECK(dry(c, &a, false) == 0, "forward graph builds, plans and runs on the stand-in");
    CHECK(shim_executions() == e0 + 1, "one execution");
    CHECK(shim_last_engine() == 1, "forward: the heuristics' first engine (%lld)", (long long)shim_last_engine());
    const int B = 8, S = 128, H = 8, G = 2, D = 64;
    expect_tensor("Q", U_Q, V4(B, H, S, D), V4(S * H * D, D, H * D, 1), CUDNN_DATA_BFLOAT16, U_RO_QO);
    expect_tensor("Kᵀ", U_K, V4(B, G, D, S), V4(S * G * D, D, 1, G * D), CUDNN_DATA_BFLOAT16, U_RO_KV);
    expect_tensor("V", U_V, V4(B, G, S, D), V4(S * G * D, D, G * D, 1), CUDNN_DATA_BFLOAT16, U_RO_KV);
    expect_tensor("O", U_O, V4(B, H, S, D), V4(S * H * D, D, H * D, 1), CUDNN_DATA_BFLOAT16, U_RO_QO);
    expect_tensor("Stats = lse [rows, nq]", U_STATS, V4(B, H, S, 1), V4(S * H, 1, H, 1), CUDNN_DATA_FLOAT, U_RO_ST);
    expect_tensor("lengths", U_SEQ_Q, V4(B, 1, 1, 1), V4(1, 1, 1, 1), CUDNN_DATA_INT32, -1);
    expect_tensor("ragged offsets", U_RO_QO, V4(B + 1, 1, 1, 1), V4(1, 1, 1, 1), CUDNN_DATA_INT64, -1);
    float v = 0;
    CHECK(shim_value(U_SCALE, &v) && v == a.a.scale, "scale passed by value (%g)", v);
    CHECK(shim_value(U_NEGINF_CAUSAL, &v) && isinf(v) && v < 0, "mask value −inf for cuDNN 9.19 (%g)", v);
    CHECK(shim_count_ops(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, -1) == 2, "forward: 2 matmuls");
    CHECK(shim_count_ops(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, -1) == 2, "forward: 2 reductions (max, sum)");
    CHECK(shim_count_ops(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_POINTWISE_BINARY_SELECT) == 2,
          "forward: 2 masks (padding, causal)");
    CHECK(shim_count_ops(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_POINTWISE_CMP_GE) == 1,
          "forward: the causal comparison row ≥ col");
    CHECK(shim_last_ops() == 20, "forward: 20 operations (%d)", shim_last_ops());
}

static void check_backward(lcu_cudnn *c, int nq, int nkv)
{
    batch a = desc(5, 300, nq, nkv, 64, 100);
    CHECK(dry(c, &a, true) == 0, "backward graph %d/%d heads builds, plans and runs on the stand-in",
          nq, nkv);
    CHECK(shim_last_engine() == 2, "backward: the deterministic engine, not the first one offered (%lld)",
          (long long)shim_last_engine());
    const int B = 8, S = 128, H = nq, G = nkv, D = 64;
    expect_tensor("Q", U_Q, V4(B, H, S, D), V4(S * H * D, D, H * D, 1), CUDNN_DATA_BFLOAT16, U_RO_QO);
    expect_tensor("Kᵀ", U_K, V4(B, G, D, S), V4(S * G * D, D, 1, G * D), CUDNN_DATA_BFLOAT16, U_RO_KV);
    expect_tensor("Vᵀ", U_V, V4(B, G, D, S), V4(S * G * D, D, 1, G * D), CUDNN_DATA_BFLOAT16, U_RO_KV);
    expect_tensor("dO", U_DO, V4(B, H, S, D), V4(S * H * D, D, H * D, 1), CUDNN_DATA_BFLOAT16, U_RO_QO);
    expect_tensor("dQ", U_DQ, V4(B, H, S, D), V4(S * H * D, D, H * D, 1), CUDNN_DATA_BFLOAT16, U_RO_QO);
    expect_tensor("dK", U_DK, V4(B, G, S, D), V4(S * G * D, D, G * D, 1), CUDNN_DATA_BFLOAT16, U_RO_KV);
    expect_tensor("dV", U_DV, V4(B, G, S, D), V4(S * G * D, D, G * D, 1), CUDNN_DATA_BFLOAT16, U_RO_KV);
    expect_tensor("Stats", U_STATS, V4(B, H, S, 1), V4(S * H, 1, H, 1), CUDNN_DATA_FLOAT, U_RO_ST);
    expect_tensor("Δ in the workspace", U_SSUM, V4(B, H, S, 1), V4(S * H, 1, H, 1), CUDNN_DATA_FLOAT, U_RO_ST);
    float v = 0;
    CHECK(shim_value(U_ONE, &v) && v == 1.0f, "the frontend's dropout factor 1 passed by value");
    CHECK(shim_count_ops(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, -1) == 5, "backward: 5 matmuls");
    int red = shim_count_ops(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, -1);
    CHECK(red == (nq == nkv ? 1 : 3), "backward: %d reductions (Δ%s)", red, nq == nkv ? "" : ", dK and dV over the group");
    CHECK(shim_count_ops(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, -1) == 3, "backward: 3 reshapes (Pᵀ, dSᵀ, K)");
    CHECK(shim_count_ops(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_POINTWISE_BINARY_SELECT) == 2,
          "backward: 2 masks");
}

/* Q's dims in the last graph (for the buckets). */
static void expect_bucket(lcu_cudnn *c, int nseq, long T, int max_len, int B, int S)
{
    batch a = desc(nseq, T, 4, 4, 32, max_len);
    int64_t d[4] = {0}, s[4];
    int t;
    int64_t r;
    int rc = dry(c, &a, false);
    bool ok = rc == 0 && shim_tensor(U_Q, d, s, &t, &r);
    CHECK(ok && d[0] == B && d[2] == S, "%d sequences, longest %d of %ld rows: bucket %lld × %lld (want %d × %d)",
          nseq, max_len, T, (long long)d[0], (long long)d[2], B, S);
}

static void check_cache(lcu_cudnn *c)
{
    int refused, before = lcu_cudnn_plans(c, &refused), g0 = shim_graphs();
    batch a = desc(7, 350, 8, 2, 64, 120); /* the forward's bucket: 8 × 128 */
    CHECK(dry(c, &a, false) == 0 && lcu_cudnn_plans(c, NULL) == before && shim_graphs() == g0,
          "another batch of the same bucket reuses its plan");
    a = desc(9, 350, 8, 2, 64, 120);
    CHECK(dry(c, &a, false) == 0 && lcu_cudnn_plans(c, NULL) == before + 1,
          "9 sequences: a new bucket, a new plan");
    expect_bucket(c, 1, 64, 64, 1, 64);
    expect_bucket(c, 3, 300, 65, 4, 128);
    expect_bucket(c, 3, 300, 129, 4, 192);
    expect_bucket(c, 3, 300, 193, 4, 256);
    expect_bucket(c, 2, 300, 0, 2, 384); /* longest not given: the total rows bound it */
    expect_bucket(c, 16, 5000, 4097, 16, 6144);

    /* a bucket cuDNN has no engine for: refused once, remembered */
    setenv("SHIM_CUDNN_REFUSE", "1", 1);
    a = desc(3, 300, 16, 16, 128, 100);
    int g1 = shim_graphs();
    CHECK(dry(c, &a, false) == LCU_ENOTSUP, "no engine: LCU_ENOTSUP (the caller runs the own kernels)");
    lcu_cudnn_plans(c, &refused);
    CHECK(refused == 1, "the refusal is kept (%d)", refused);
    CHECK(dry(c, &a, false) == LCU_ENOTSUP && shim_graphs() == g1 + 1,
          "asked again: refused without building the graph again");
    unsetenv("SHIM_CUDNN_REFUSE");

    /* more buckets than the cache holds: the least recently used go, the rest still run */
    int ok = 1;
    for (int i = 0; i < 40; i++) {
        batch x = desc(1 << (i % 14), 1 << 16, 2, 1, 16, 64 << (i / 14));
        ok &= dry(c, &x, i % 2) == 0;
    }
    int n = lcu_cudnn_plans(c, &refused);
    CHECK(ok && n + refused <= 32, "40 more buckets: every one runs, %d plans (+%d refused) kept", n, refused);
    a = desc(5, 300, 8, 2, 64, 100);
    int g2 = shim_graphs();
    CHECK(dry(c, &a, false) == 0 && shim_graphs() == g2 + 1, "an evicted bucket is built again");
}

/* LCU_CUDNN_EXACT_BATCH and LCU_CUDNN_WORKSPACE_MB, read by lcu_cudnn_create. */
static void check_settings(void)
{
    setenv("LCU_CUDNN_EXACT_BATCH", "1", 1);
    setenv("LCU_CUDNN_WORKSPACE_MB", "8", 1);
    lcu_cudnn *c = NULL;
    char why[256];
    int rc = lcu_cudnn_create(&c, why, sizeof why);
    CHECK(rc == 0, "a second context");
    if (rc) return;
    unsetenv("LCU_CUDNN_EXACT_BATCH");
    unsetenv("LCU_CUDNN_WORKSPACE_MB");
    expect_bucket(c, 5, 300, 100, 5, 128); /* 5 sequences, no padding ones */
    setenv("SHIM_CUDNN_WORKSPACE", "9437184", 1); /* 9 MiB */
    batch a = desc(6, 300, 8, 2, 64, 100);
    int refused;
    /* heads 8/2: all at once, then 2 groups of 4/1 (each as large, here): both refused */
    CHECK(dry(c, &a, true) == LCU_ENOTSUP && lcu_cudnn_plans(c, &refused) >= 1 && refused == 2,
          "a plan whose workspace is over LCU_CUDNN_WORKSPACE_MB is refused, over all heads and in head groups "
          "(%d refused)", refused);
    setenv("SHIM_CUDNN_WORKSPACE", "8388608", 1);
    a = desc(7, 300, 8, 2, 64, 100);
    CHECK(dry(c, &a, true) == 0, "a plan at the limit runs");
    unsetenv("SHIM_CUDNN_WORKSPACE");
    /* a workspace that grows with the heads of a call (the deterministic backward's dP): 12
     * MiB over 8 heads is over the limit, 6 MiB over a group of 4/1 is not: two calls, each
     * over its group's heads of rows of all 8/2 heads, at the group's first head */
    setenv("SHIM_CUDNN_WORKSPACE_PER_HEAD", "1572864", 1); /* 1.5 MiB */
    a = desc(3, 300, 8, 2, 64, 150);
    int e0 = shim_executions();
    CHECK(dry(c, &a, true) == 0 && shim_executions() == e0 + 2, "a backward over the limit runs in 2 head groups "
          "(%d executions)", shim_executions() - e0);
    {
        const int B = 3, S = 192, H = 8, G = 2, D = 64, h = 4, g = 1; /* exact batch: B = 3 */
        expect_tensor("head group: Q", U_Q, V4(B, h, S, D), V4(S * H * D, D, H * D, 1), CUDNN_DATA_BFLOAT16, U_RO_QO);
        expect_tensor("head group: Kt", U_K, V4(B, g, D, S), V4(S * G * D, D, 1, G * D), CUDNN_DATA_BFLOAT16, U_RO_KV);
        expect_tensor("head group: dK", U_DK, V4(B, g, S, D), V4(S * G * D, D, G * D, 1), CUDNN_DATA_BFLOAT16, U_RO_KV);
        expect_tensor("head group: Stats", U_STATS, V4(B, h, S, 1), V4(S * H, 1, H, 1), CUDNN_DATA_FLOAT, U_RO_ST);
        expect_tensor("head group: Δ", U_SSUM, V4(B, h, S, 1), V4(S * H, 1, H, 1), CUDNN_DATA_FLOAT, U_RO_ST);
    }
    unsetenv("SHIM_CUDNN_WORKSPACE_PER_HEAD");
    lcu_cudnn_destroy(c);
    setenv("LCU_CUDNN_ANY_ENGINE", "1", 1);
    rc = lcu_cudnn_create(&c, why, sizeof why);
    unsetenv("LCU_CUDNN_ANY_ENGINE");
    CHECK(rc == 0, "a third context");
    if (rc) return;
    a = desc(5, 300, 8, 2, 64, 100);
    CHECK(dry(c, &a, true) == 0 && shim_last_engine() == 1,
          "LCU_CUDNN_ANY_ENGINE: the backward takes the first engine offered (%lld)", (long long)shim_last_engine());
    lcu_cudnn_destroy(c);
}

static void check_refusals(lcu_cudnn *c)
{
    batch a = desc(3, 300, 8, 2, 64, 100);
    int64_t ks[3] = {0};
    a.a.kv_start = ks;
    CHECK(dry(c, &a, false) == LCU_ENOTSUP, "KV-cache layout: LCU_ENOTSUP");
    a = desc(3, 300, 8, 3, 64, 100);
    CHECK(dry(c, &a, false) == LCU_EINVAL, "nq not a multiple of nkv: LCU_EINVAL");
    a = desc(3, 300, 8, 2, 96, 100);
    CHECK(dry(c, &a, false) == LCU_EINVAL, "head_dim 96: LCU_EINVAL (as the own kernels)");
    a = desc(3, 300, 8, 2, 64, 301);
    CHECK(dry(c, &a, false) == LCU_EINVAL, "longest sequence above the total: LCU_EINVAL");
    a = desc(0, 0, 8, 2, 64, 0);
    CHECK(dry(c, &a, true) == 0, "an empty batch: nothing to do");
    CHECK(strstr(lcu_cudnn_strerror(LCU_ENOTSUP), "own kernels") != NULL, "LCU_ENOTSUP explained");
    CHECK(!strcmp(lcu_cudnn_strerror(LCU_ECUDNN_BASE + 3000), "CUDNN_STATUS_SHIM_ERROR"),
          "cuDNN statuses explained by the library");
}

/* In a child process (the loader runs once per process): LOOM_CUDNN_LIBRARY=lib (and the
 * stand-in's version), then lcu_cudnn_create must fail with why containing want, or
 * succeed when want is NULL and pass the pre-9.10 backward checks. Exit status: failures. */
static int child(const char *lib, const char *version, const char *want)
{
    setenv("LOOM_CUDNN_LIBRARY", lib, 1);
    if (version) setenv("SHIM_CUDNN_VERSION", version, 1);
    lcu_cudnn *c = NULL;
    char why[1024] = "";
    int rc = lcu_cudnn_create(&c, why, sizeof why);
    if (want) {
        CHECK(rc == LCU_ENOTSUP && !c && strstr(why, want), "LOOM_CUDNN_LIBRARY=%s%s%s refused: %s", lib,
              version ? " version " : "", version ? version : "", why);
        return check_failed;
    }
    CHECK(rc == 0, "cuDNN %s loads (%s)", version, why);
    if (rc) return check_failed;
    bind_shim();
    batch a = desc(5, 300, 8, 2, 64, 100);
    CHECK(dry(c, &a, true) == 0, "cuDNN %s: the backward graph with the second padding mask", version);
    CHECK(shim_count_ops(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_POINTWISE_BINARY_SELECT) == 3,
          "cuDNN %s: padding masked again after Stats", version);
    float v = 0;
    CHECK(shim_value(U_NEGINF_PAD2, &v) && v == -FLT_MAX, "cuDNN %s: mask value −FLT_MAX (%g)", version, v);
    lcu_cudnn_destroy(c);
    return check_failed;
}

static void in_child(const char *lib, const char *version, const char *want, const char *what)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(child(lib, version, want));
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s", what);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        printf("usage: test_cudnn_graph PATH-OF-libcudnn_shim.so\n");
        return 2;
    }
    shim_path = argv[1];
    in_child("/nonexistent/libcudnn.so.9", NULL, "LOOM_CUDNN_LIBRARY: /nonexistent/libcudnn.so.9",
             "a missing library is named");
    in_child("libm.so.6", NULL, "has no cudnnGetVersion", "a library that is not cuDNN is refused");
    in_child(shim_path, "90500", "9.5.0", "cuDNN 9.5 is refused (ragged GQA backward needs 9.6)");
    in_child(shim_path, "90800", NULL, "cuDNN 9.8: the frontend's pre-9.10 backward graph");

    setenv("LOOM_CUDNN_LIBRARY", shim_path, 1);
    lcu_cudnn *c = NULL;
    char why[1024] = "";
    int rc = lcu_cudnn_create(&c, why, sizeof why);
    CHECK(rc == 0, "the stand-in loads through the loader (%s)", rc ? why : lcu_cudnn_describe(c));
    if (rc) return check_summary();
    CHECK(strstr(lcu_cudnn_describe(c), "cuDNN 9.19.0") && strstr(lcu_cudnn_describe(c), "cudnn_shim"),
          "described as %s", lcu_cudnn_describe(c));
    bind_shim();
    check_forward(c);
    check_backward(c, 8, 2);
    check_backward(c, 4, 4);
    check_cache(c);
    check_refusals(c);
    check_settings();
    lcu_cudnn_destroy(c);
    return check_summary();
}
