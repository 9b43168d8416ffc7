/* test_learning.c — does training actually learn? Two loops on the tiny Llama through the
 * backend table (LOOM_TEST_BACKEND, default cpu), as a Tinker client would drive them:
 *
 *   SFT: 8 random sequences of 16 tokens, cross_entropy + AdamW; the mean NLL must fall by
 *        more than 90% (memorisation) and greedy sampling must then reproduce them.
 *   RL:  importance-sampling policy gradient on a toy reward (1 when the 12-token
 *        completion contains token X): sample 32 completions with backend->sample, reward,
 *        advantages = reward − mean, forward_backward(importance_sampling) with the
 *        sampler's log-probs, AdamW. The mean reward must rise clearly within 40 steps.
 *        On-policy, the learner's log-probs must equal the sampler's (ratio 1, docs/protocol.md §9.1).
 *        (At lr 2e-2 this loop drives the residual stream to ~5e3 with cancellations, and
 *        fp32 then differs by up to 1e-3 between any two summation orders — the packed
 *        forward itself changes with the sequence length; 1e-2 stays well conditioned.)
 * Prints the curves and "N passed, N failed". */
#include "backend/backend.h"
#include "backend/loss.h"
#include "model/mkmodel.h"
#include "model/rng.h"
#include "tests/lib/test_backend.h"
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const be_backend *be;
static void *ctx;

static be_adapter *new_adapter(int rank, uint64_t seed)
{
    char err[256];
    lora_config c = {.rank = rank, .seed = seed, .train_attn = true, .train_mlp = true, .train_unembed = true};
    be_adapter *a = be_adapter_new(be, ctx, &c, true, err, sizeof err);
    if (!a) { printf("adapter: %s\n", err); exit(1); }
    return a;
}

static void step(be_adapter *a, double lr)
{
    adam_params p = {.learning_rate = lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0, .grad_clip_norm = 0};
    char err[256];
    if (be->optim_step(ctx, a, &p, NULL, err, sizeof err) != 0) printf("optim_step: %s\n", err);
}

/* ---- SFT ------------------------------------------------------------------------------- */

enum { SFT_N = 8, SFT_LEN = 16, SFT_STEPS = 60 };

static void test_sft(void)
{
    rng_state r;
    rng_seed(&r, 2024);
    int32_t seq[SFT_N][SFT_LEN];
    for (int i = 0; i < SFT_N; i++) {
        seq[i][0] = 1; /* BOS */
        for (int t = 1; t < SFT_LEN; t++) seq[i][t] = 3 + (int32_t)(rng_next(&r) % 250);
    }
    be_adapter *a = new_adapter(8, 7);
    float lp[SFT_N][SFT_LEN], loss[SFT_N][SFT_LEN];
    be_seq s[SFT_N];
    for (int i = 0; i < SFT_N; i++)
        s[i] = (be_seq){.ad = a, .loss = loss_spec_default(LOSS_CROSS_ENTROPY), .n = SFT_LEN - 1, .tokens = seq[i],
                         .targets = seq[i] + 1, .logprobs_out = lp[i], .loss_out = loss[i]};
    double first = 0, last = 0;
    char err[256];
    /* lr 1e-2 decayed linearly to 1e-3: at a constant 1e-2 the NLL oscillates (0.19 -> 0.35
     * over the last 10 steps on an H200 in bf16, 0.67 -> 0.86 -> 0.34 on the CPU), and the
     * greedy check below would test where the last step happened to land */
    printf("SFT: %d sequences of %d tokens, LoRA rank 8, AdamW lr 1e-2 decayed to 1e-3\n", SFT_N, SFT_LEN);
    for (int k = 0; k <= SFT_STEPS; k++) { /* the last pass: the NLL of the adapter that samples */
        if (be->forward_backward(ctx, s, SFT_N, k < SFT_STEPS, err, sizeof err) != 0) { printf("fb: %s\n", err); break; }
        double nll = 0;
        for (int i = 0; i < SFT_N; i++) for (int t = 0; t < SFT_LEN - 1; t++) nll -= lp[i][t];
        nll /= SFT_N * (SFT_LEN - 1);
        if (k == 0) first = nll;
        last = nll;
        if (k % 10 == 0) printf("  step %2d  mean NLL %.4f\n", k, nll);
        if (k < SFT_STEPS) step(a, 1e-2 * (1.0 - 0.9 * k / (SFT_STEPS - 1)));
    }
    CHECK(last < 0.1 * first, "SFT memorises: mean NLL %.3f -> %.3f (-%.1f%%) in %d steps", first, last,
          100 * (1 - last / first), SFT_STEPS);
    /* greedy continuation of each sequence's first 4 tokens */
    be_sample_req q[SFT_N];
    int32_t out[SFT_N][SFT_LEN];
    float olp[SFT_N][SFT_LEN];
    int n_out[SFT_N];
    bool stopped[SFT_N];
    for (int i = 0; i < SFT_N; i++)
        q[i] = (be_sample_req){.ad = a, .n_prompt = 4, .prompt = seq[i], .num_samples = 1, .max_tokens = SFT_LEN - 4,
                                .temperature = 0, .top_p = 1, .tokens_out = out[i], .logprobs_out = olp[i],
                                .n_out = &n_out[i], .stopped_out = &stopped[i]};
    int right = 0, total = 0;
    if (be->sample(ctx, q, SFT_N, err, sizeof err) != 0) printf("sample: %s\n", err);
    for (int i = 0; i < SFT_N; i++)
        for (int t = 0; t < n_out[i]; t++, total++) right += out[i][t] == seq[i][4 + t];
    CHECK(right >= 0.9 * SFT_N * (SFT_LEN - 4), "greedy sampling reproduces %d/%d memorised tokens", right,
          SFT_N * (SFT_LEN - 4));
    be->adapter_free(ctx, a);
}

/* ---- RL -------------------------------------------------------------------------------- */

enum { RL_SAMPLES = 32, RL_GEN = 12, RL_STEPS = 40, RL_X = 42 };

static void test_rl(void)
{
    be_adapter *a = new_adapter(8, 11);
    const int32_t prompt[] = {1, 10, 20, 30};
    const int np = 4, n = np + RL_GEN - 1;
    int32_t toks[RL_SAMPLES][RL_GEN];
    float slp[RL_SAMPLES][RL_GEN];
    int n_out[RL_SAMPLES];
    bool stopped[RL_SAMPLES];
    int32_t x[RL_SAMPLES][np + RL_GEN], tg[RL_SAMPLES][np + RL_GEN];
    float q[RL_SAMPLES][np + RL_GEN], adv[RL_SAMPLES][np + RL_GEN], lp[RL_SAMPLES][np + RL_GEN],
          loss[RL_SAMPLES][np + RL_GEN];
    be_seq s[RL_SAMPLES];
    char err[256];
    double early = 0, late = 0, worst_ratio = 0;
    printf("RL: importance_sampling, reward 1 when the %d-token completion contains token %d; %d samples/step, "
           "AdamW lr 1e-2\n", RL_GEN, RL_X, RL_SAMPLES);
    for (int k = 0; k < RL_STEPS; k++) {
        be_sample_req req = {.ad = a, .n_prompt = np, .prompt = prompt, .num_samples = RL_SAMPLES,
                              .max_tokens = RL_GEN, .temperature = 1, .top_p = 1, .seed = 1000 + k,
                              .tokens_out = &toks[0][0], .logprobs_out = &slp[0][0], .n_out = n_out,
                              .stopped_out = stopped};
        if (be->sample(ctx, &req, 1, err, sizeof err) != 0) { printf("sample: %s\n", err); break; }
        double reward[RL_SAMPLES], mean = 0;
        for (int i = 0; i < RL_SAMPLES; i++) {
            reward[i] = 0;
            for (int t = 0; t < n_out[i]; t++) reward[i] = toks[i][t] == RL_X ? 1 : reward[i];
            mean += reward[i] / RL_SAMPLES;
        }
        if (k < 5) early += mean / 5;
        if (k >= RL_STEPS - 5) late += mean / 5;
        if (k % 5 == 0 || k == RL_STEPS - 1) printf("  step %2d  mean reward %.3f\n", k, mean);
        /* one datum per sample: input prompt + completion[:-1], targets shifted by one;
         * the prompt's positions carry advantage 0 (masked) */
        int ns = 0;
        for (int i = 0; i < RL_SAMPLES; i++) {
            int m = np + n_out[i] - 1;
            if (n_out[i] == 0) continue;
            for (int t = 0; t < m; t++) {
                x[i][t] = t < np ? prompt[t] : toks[i][t - np];
                tg[i][t] = t + 1 < np ? prompt[t + 1] : toks[i][t + 1 - np];
                bool gen = t + 1 >= np;
                q[i][t] = gen ? slp[i][t + 1 - np] : 0;
                adv[i][t] = gen ? (float)(reward[i] - mean) : 0;
            }
            s[ns++] = (be_seq){.ad = a, .loss = loss_spec_default(LOSS_IMPORTANCE_SAMPLING), .n = m, .tokens = x[i],
                                .targets = tg[i], .sampler_logprobs = q[i], .advantages = adv[i],
                                .logprobs_out = lp[i], .loss_out = loss[i]};
        }
        if (be->forward_backward(ctx, s, ns, true, err, sizeof err) != 0) { printf("fb: %s\n", err); break; }
        for (int i = 0; i < ns; i++)
            for (int t = np - 1; t < s[i].n; t++) worst_ratio = fmax(worst_ratio, fabs(lp[i][t] - q[i][t]));
        step(a, 1e-2);
    }
    (void)n;
    /* fp32 (cpu): 1e-4; bf16 backends: sampling and training passes run GEMMs of other
     * shapes, whose bf16 roundings differ (test_gpu_backend measures it): 2e-2 */
    double bar = test_backend_bf16(be) ? 2e-2 : 1e-4;
    CHECK(worst_ratio < bar, "on-policy importance ratios are 1: max |learner lp - sampler lp| = %.2e", worst_ratio);
    CHECK(late > early + 0.3 && late > 0.5, "RL raises the mean reward: %.3f (first 5 steps) -> %.3f (last 5)", early,
          late);
    be->adapter_free(ctx, a);
}

int main(void)
{
    char dir[] = "/tmp/loom-learn-XXXXXX", err[512];
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    mkmodel_opts o;
    mkmodel_defaults(&o, "llama", "tiny", err, sizeof err);
    o.out_dir = dir;
    be = test_backend();
    if (mkmodel_write(&o, err, sizeof err) != 0 || !(ctx = test_backend_open(be, dir, 2, NULL, err, sizeof err))) {
        printf("model: %s\n", err);
        return 1;
    }
    test_sft();
    test_rl();
    be->destroy(ctx);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) {}
    return check_summary();
}
