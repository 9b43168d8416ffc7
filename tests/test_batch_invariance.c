/* test_batch_invariance.c — a tenant's numbers do not depend on its co-tenants, nor on how
 * the scheduler cut its operations into cycles (docs/architecture.md, "Batch invariance").
 * Durable training state rests on this: a model is recovered on another executor by
 * replaying its recorded operations alone, and the replay must give the same bits as the
 * packed cycles that ran them first.
 *
 * On the tiny Llama (untied head), the tiny Qwen3 (tied head, q/k norm) and the tiny
 * Qwen3-MoE (8 experts, 2 per token: each expert's rows are a GEMM of their own, its LoRA
 * per expert and segment, experts side by side on two threads and in turn on one), for adapter X
 * (every module and the head) whose two operations run
 *   - alone, one pass each (the replay),
 *   - packed between other adapters' sequences long enough to move X's rows across the
 *     head's row chunks, with a base-only and a forward-only sequence, both operations in
 *     one pass (as one cycle runs them), and in other compositions,
 *   - on a context with another thread count,
 * its log-probs, losses, gradients and (after AdamW) parameters and moments must be the
 * same bits. The backend is LOOM_TEST_BACKEND; a backend whose table does not promise
 * batch invariance (be_backend.batch_invariant) skips the suite (77).
 *
 * Below the backend, the CPU backend's GEMM (backend/cpu/cpu_gemm.h): a row of op(A)
 * gives the same bits in any position of any M, and every kernel this CPU can run
 * (AVX-512, AVX2, portable C) gives the same bits as the portable one, so executors of
 * one pool on different CPU models agree too. */
#include "backend/backend.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/loss.h"
#include "model/mkmodel.h"
#include "model/rng.h"
#include "tests/lib/test_backend.h"
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAXSEQ = 16, MAXLEN = 320 };

typedef struct {
    int n;
    int32_t tok[MAXLEN + 1];
    float lp[MAXLEN], loss[MAXLEN];
} seqbuf;

static const be_backend *be;

static void fill(seqbuf *s, int n, uint64_t seed, int vocab)
{
    rng_state r;
    rng_seed(&r, seed);
    s->n = n;
    for (int i = 0; i <= n; i++) s->tok[i] = (int32_t)(rng_next(&r) % (uint64_t)(vocab - 2)) + 1;
}

static be_seq seq_of(seqbuf *s, be_adapter *ad, int group, bool fwd_only)
{
    return (be_seq){.ad = ad, .loss = loss_spec_default(LOSS_CROSS_ENTROPY), .n = s->n, .tokens = s->tok,
                     .targets = s->tok + 1, .logprobs_out = s->lp, .loss_out = s->loss, .group = group,
                     .forward_only = fwd_only};
}

static be_adapter *adapter(void *ctx, int rank, uint64_t seed, bool unembed)
{
    char err[256];
    lora_config c = {.rank = rank, .seed = seed, .train_attn = true, .train_mlp = true, .train_unembed = unembed};
    be_adapter *a = be_adapter_new(be, ctx, &c, true, err, sizeof err);
    if (!a) { printf("adapter: %s\n", err); exit(2); }
    /* B starts at zero (PEFT): one step first so that every LoRA gradient is non-zero. */
    return a;
}

static void pass(void *ctx, be_seq *s, int n)
{
    char err[256];
    if (be->forward_backward(ctx, s, n, true, err, sizeof err) != 0) { printf("fb: %s\n", err); exit(2); }
}

static void adam(void *ctx, be_adapter *a)
{
    adam_params p = {.learning_rate = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.01};
    char err[256];
    if (be->optim_step(ctx, a, &p, NULL, err, sizeof err) != 0) { printf("optim: %s\n", err); exit(2); }
}

/* What X's two operations produce: outputs of each sequence, then the state. */
typedef struct {
    float lp[3][MAXLEN], loss[3][MAXLEN];
    adapter_state grads, after;   /* gradients after both ops; every part after AdamW */
} outcome;

static void capture(void *ctx, be_adapter *x, seqbuf *xs, outcome *o)
{
    for (int i = 0; i < 3; i++) {
        memcpy(o->lp[i], xs[i].lp, sizeof o->lp[i]);
        memcpy(o->loss[i], xs[i].loss, sizeof o->loss[i]);
    }
    o->grads = test_download(be, ctx, x, ADAPTER_GRADS);
    adam(ctx, x);
    o->after = test_download(be, ctx, x, ADAPTER_PARAMS | ADAPTER_OPTIM);
}

static bool same_floats(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof *a); }

static void compare(const char *what, const outcome *ref, const outcome *o, const seqbuf *xs)
{
    bool out_same = true;
    for (int i = 0; i < 3; i++)
        out_same &= same_floats(ref->lp[i], o->lp[i], xs[i].n) && same_floats(ref->loss[i], o->loss[i], xs[i].n);
    size_t n = ref->grads.layout.num_params;
    CHECK(out_same, "%s: X's log-probs and losses are the same bits as alone", what);
    CHECK(same_floats(ref->grads.grads, o->grads.grads, n), "%s: X's gradients are the same bits", what);
    CHECK(same_floats(ref->after.params, o->after.params, n) && same_floats(ref->after.m, o->after.m, n) &&
              same_floats(ref->after.v, o->after.v, n),
          "%s: X's parameters and Adam moments after the step are the same bits", what);
}

static void release(void *ctx, be_adapter **ads, int n, outcome *o)
{
    for (int i = 0; i < n; i++) if (ads[i]) be->adapter_free(ctx, ads[i]);
    if (o) { adapter_state_free(&o->grads); adapter_state_free(&o->after); }
}

/* X (rank 4, every module and the head) after a warm-up step, so that B is not zero. */
static be_adapter *warm_x(void *ctx, seqbuf *warm)
{
    be_adapter *x = adapter(ctx, 4, 11, true);
    be_seq s = seq_of(warm, x, 0, false);
    pass(ctx, &s, 1);
    adam(ctx, x);
    return x;
}

static void suite(const char *arch)
{
    char dir[] = "/tmp/loom-binv-XXXXXX", err[256];
    if (!mkdtemp(dir)) { perror("mkdtemp"); exit(2); }
    mkmodel_opts mo;
    if (mkmodel_defaults(&mo, arch, "tiny", err, sizeof err) != 0) { printf("%s\n", err); exit(2); }
    mo.out_dir = dir;
    mo.seed = 5;
    if (mkmodel_write(&mo, err, sizeof err) != 0) { printf("mkmodel: %s\n", err); exit(2); }
    model_config mc;
    void *ctx2 = test_backend_open(be, dir, 2, &mc, err, sizeof err), *ctx1 = test_backend_open(be, dir, 1, NULL, err, sizeof err);
    if (!ctx2 || !ctx1) { printf("open: %s\n", err); exit(2); }
    printf("%s: vocab %d, %d layers\n", arch, mc.vocab_size, mc.num_hidden_layers);

    /* X's operations: op1 = two sequences, op2 = one; others' sequences around them. */
    seqbuf xs[3], warm, ys[3], zs[2], base, fwd;
    fill(&xs[0], 9, 101, mc.vocab_size);
    fill(&xs[1], 31, 102, mc.vocab_size);
    fill(&xs[2], 17, 103, mc.vocab_size);
    fill(&warm, 12, 100, mc.vocab_size);
    fill(&ys[0], 250, 201, mc.vocab_size);   /* X's rows start past the first head chunk */
    fill(&ys[1], 3, 202, mc.vocab_size);
    fill(&ys[2], 77, 203, mc.vocab_size);
    fill(&zs[0], 40, 301, mc.vocab_size);
    fill(&zs[1], 301, 302, mc.vocab_size);
    fill(&base, 23, 401, mc.vocab_size);
    fill(&fwd, 14, 501, mc.vocab_size);

    /* 1. the replay: X alone, one pass per operation */
    outcome ref, o;
    be_adapter *x = warm_x(ctx2, &warm);
    be_seq op1[2] = {seq_of(&xs[0], x, 1, false), seq_of(&xs[1], x, 1, false)}, op2 = seq_of(&xs[2], x, 2, false);
    pass(ctx2, op1, 2);
    pass(ctx2, &op2, 1);
    capture(ctx2, x, xs, &ref);
    release(ctx2, &x, 1, NULL);

    /* 2. one cycle: both ops packed between Y, a base-only and a forward-only sequence, Z */
    x = warm_x(ctx2, &warm);
    be_adapter *y = adapter(ctx2, 8, 12, true), *z = adapter(ctx2, 2, 13, false), *ads[3] = {x, y, z};
    be_seq b[10] = {seq_of(&ys[0], y, 0, false), seq_of(&ys[1], y, 0, false), seq_of(&base, NULL, 0, false),
                     seq_of(&xs[0], x, 1, false), seq_of(&xs[1], x, 1, false), seq_of(&xs[2], x, 2, false),
                     seq_of(&fwd, y, 0, true),   seq_of(&zs[0], z, 0, false), seq_of(&zs[1], z, 0, false),
                     seq_of(&ys[2], y, 0, false)};
    pass(ctx2, b, 10);
    capture(ctx2, x, xs, &o);
    compare("both ops in one packed cycle", &ref, &o, xs);
    release(ctx2, ads, 3, &o);

    /* 3. two cycles of other compositions: [Z, op1, Y] then [Y, op2] */
    x = warm_x(ctx2, &warm);
    y = adapter(ctx2, 8, 12, true);
    z = adapter(ctx2, 2, 13, false);
    be_adapter *ads3[3] = {x, y, z};
    be_seq c1[4] = {seq_of(&zs[1], z, 0, false), seq_of(&xs[0], x, 7, false), seq_of(&xs[1], x, 7, false),
                     seq_of(&ys[2], y, 0, false)};
    be_seq c2[2] = {seq_of(&ys[0], y, 0, false), seq_of(&xs[2], x, 0, false)};
    pass(ctx2, c1, 4);
    pass(ctx2, c2, 2);
    capture(ctx2, x, xs, &o);
    compare("ops in two cycles with other tenants", &ref, &o, xs);
    release(ctx2, ads3, 3, &o);

    /* 4. another thread count (another executor of the pool) */
    x = warm_x(ctx1, &warm);
    be_seq d[3] = {seq_of(&xs[0], x, 1, false), seq_of(&xs[1], x, 1, false), seq_of(&xs[2], x, 2, false)};
    pass(ctx1, d, 3);
    capture(ctx1, x, xs, &o);
    compare("one thread instead of two, both ops in one pass", &ref, &o, xs);
    release(ctx1, &x, 1, &o);

    adapter_state_free(&ref.grads);
    adapter_state_free(&ref.after);
    be->destroy(ctx1);
    be->destroy(ctx2);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("could not remove %s\n", dir);
}

/* ---- the GEMM ------------------------------------------------------------------------ */

static float *randoms(long n, uint64_t seed)
{
    rng_state r;
    rng_seed(&r, seed);
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (long i = 0; i < n; i++) x[i] = (float)((double)(rng_next(&r) >> 11) / 9007199254740992.0 - 0.5);
    return x;
}

/* C = alpha·op(A)·op(B) + beta·C0 with the kernel in use. */
static float *product(bool ta, bool tb, int M, int N, int K, float alpha, float beta, uint64_t seed)
{
    float *A = randoms((long)M * K, seed), *B = randoms((long)K * N, seed + 1), *C = randoms((long)M * N, seed + 2);
    cpu_gemm(ta, tb, M, N, K, alpha, A, ta ? M : K, B, tb ? K : N, beta, C, N);
    free(A);
    free(B);
    return C;
}

static void gemm_suite(void)
{
    const char *kernels[] = {"avx512", "avx2"};
    static const int shapes[][3] = {{37, 53, 300}, {1, 1, 1}, {13, 70, 7}, {100, 33, 513}, {6, 16, 256}};
    printf("GEMM kernel on this CPU: %s\n", cpu_gemm_kernel());
    for (int k = 0; k < 2; k++) {
        if (!cpu_gemm_use_kernel(kernels[k])) { printf("  (this CPU cannot run the %s kernel)\n", kernels[k]); continue; }
        bool same = true;
        for (int sh = 0; sh < 5; sh++)
            for (int t = 0; t < 4; t++) {
                int M = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2];
                bool ta = t & 1, tb = t & 2;
                float beta = sh % 2 ? 1.0f : 0.0f, alpha = sh == 2 ? 0.5f : 1.0f;
                cpu_gemm_use_kernel(kernels[k]);
                float *x = product(ta, tb, M, N, K, alpha, beta, 1000 + sh);
                cpu_gemm_use_kernel("generic");
                float *y = product(ta, tb, M, N, K, alpha, beta, 1000 + sh);
                same &= !memcmp(x, y, (size_t)M * N * sizeof(float));
                free(x);
                free(y);
            }
        CHECK(same, "the %s kernel gives the portable kernel's bits (5 shapes x 4 transposes)", kernels[k]);
    }
    if (!cpu_gemm_use_kernel("avx512") && !cpu_gemm_use_kernel("avx2")) cpu_gemm_use_kernel("generic");
    /* one row of A in every position of M = 1..40 and 300 (x Wᵀ as the linear layers) */
    int N = 70, K = 300;
    float *W = randoms((long)N * K, 7), *A = randoms(300L * K, 8), *C = malloc(300L * N * sizeof *C), ref[70];
    bool same = true;
    for (int M = 1; M <= 300; M = M < 40 ? M + 1 : 301)
        for (int pos = 0; pos < M; pos += M < 40 ? 1 : 37) {
            float *A2 = randoms((long)M * K, 100 + M);
            memcpy(A2 + (long)pos * K, A, K * sizeof(float));
            cpu_gemm(false, true, M, N, K, 1.0f, A2, K, W, K, 0.0f, C, N);
            if (M == 1) memcpy(ref, C, sizeof ref);
            else same &= !memcmp(ref, C + (long)pos * N, sizeof ref);
            free(A2);
        }
    CHECK(same, "a row's product is the same bits in every position of every M (kernel %s)", cpu_gemm_kernel());
    free(W);
    free(A);
    free(C);
}

int main(void)
{
    be = test_backend();
    if (!be->batch_invariant) {
        printf("backend %s does not promise batch invariance: skipped\n", be->name);
        return 77;
    }
    suite("llama");
    suite("qwen3");
    suite("qwen3_moe");
    if (!strcmp(be->name, "cpu")) gemm_suite();
    return check_summary();
}
