/* bench_cpu.c — CPU backend throughput on a Qwen3-0.6B-shaped model (fewer layers with
 * --layers): forward, forward_backward and optim_step, in tokens/s and GFLOP/s, next to
 * the machine's own single-GEMM rate as the anchor. Prints figures; never pass/fail.
 *
 *   bench_cpu [--model DIR] [--layers N] [--tokens T] [--seqs S] [--threads N] [--rank R] [--iters K]
 *             [--gen G]   (sampling: S prompts of 128 tokens, G new tokens each)
 *
 * FLOPs counted are model FLOPs: 2·T·(linear + head weights) + causal attention for the
 * forward; the backward adds input gradients of the same GEMMs and twice the attention
 * (LoRA terms and the backward's layer recompute are not counted).
 */
#include "gpu/backend.h"
#include "gpu/cpu/cpu_ops.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/loss.h"
#include "gpu/mkmodel.h"
#include "gpu/model.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void cpu_name(char *out, size_t n)
{
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *p = strchr(line, ':');
            if (p) { snprintf(out, n, "%s", p + 2); out[strcspn(out, "\n")] = 0; }
            break;
        }
    fclose(f);
}

/* Anchor: one big GEMM split over the same pool, as cpu_sgemm runs the model's GEMMs. */
static double gemm_rate(int threads)
{
    int M = 512, N = 3072, K = 1024;
    float *a = calloc((size_t)M * K, 4), *b = calloc((size_t)N * K, 4), *c = calloc((size_t)M * N, 4);
    for (long i = 0; i < (long)M * K; i++) a[i] = (float)(i % 7) * 0.1f;
    for (long i = 0; i < (long)N * K; i++) b[i] = (float)(i % 5) * 0.1f;
    openblas_set_num_threads(1);
    cpu_pool *p = cpu_pool_create(threads);
    cpu_sgemm(p, false, true, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
    double dt = 1e30; /* best of 8: the anchor is the machine's capability, not its noise */
    for (int r = 0; r < 8; r++) {
        double t0 = now();
        cpu_sgemm(p, false, true, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
        double t = now() - t0;
        dt = t < dt ? t : dt;
    }
    cpu_pool_destroy(p);
    free(a); free(b); free(c);
    return 2.0 * M * N * K / dt / 1e9;
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL;
    int layers = 4, tokens = 1024, nseqs = 4, threads = 0, rank = 32, iters = 3, gen = 32;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens")) tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seqs")) nseqs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rank")) rank = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gen")) gen = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nseqs < 1 || tokens < nseqs) { fprintf(stderr, "need tokens >= seqs >= 1\n"); return 2; }
    char err[512], tmpdir[64] = "";
    if (!model_dir) {
        mkmodel_opts o;
        mkmodel_defaults(&o, "qwen3", "qwen3-0.6b", err, sizeof err);
        o.layers = layers;
        snprintf(tmpdir, sizeof tmpdir, "/tmp/loom_bench_XXXXXX");
        if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 2; }
        o.out_dir = tmpdir;
        double t0 = now();
        if (mkmodel_write(&o, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
        printf("mkmodel: %.1f s\n", now() - t0);
        model_dir = tmpdir;
    }
    base_model *m;
    double t0 = now();
    if (model_load(model_dir, &m, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    double t_load = now() - t0;
    const model_config *c = model_get_config(m);
    const exe_backend *be = &exe_backend_cpu;
    void *ctx = be->create(m, threads, err, sizeof err);
    lora_config lc = {rank, 1, true, true, true};
    adapter *ad = adapter_create(m, &lc, err, sizeof err);
    if (!ctx || !ad) { fprintf(stderr, "%s\n", err); return 1; }

    /* nseqs sequences of equal length, cross-entropy, all with the adapter */
    int n = tokens / nseqs;
    exe_seq *seqs = calloc(nseqs, sizeof *seqs);
    int32_t *tok = malloc((size_t)tokens * 4);
    float *lp = malloc((size_t)tokens * 4), *loss = malloc((size_t)tokens * 4);
    for (int i = 0; i < tokens; i++) tok[i] = (int32_t)((i * 7919L) % c->vocab_size);
    for (int s = 0; s < nseqs; s++) {
        seqs[s] = (exe_seq){.ad = ad, .loss = loss_spec_default(LOSS_CROSS_ENTROPY), .n = n, .tokens = tok + s * n,
                            .targets = tok + s * n + 1, .logprobs_out = lp + s * n, .loss_out = loss + s * n};
        if (s == nseqs - 1) seqs[s].n = n - 1; /* targets stay inside the array */
    }
    long T = 0;
    double attn = 0;
    for (int s = 0; s < nseqs; s++) { T += seqs[s].n; attn += (double)seqs[s].n * (seqs[s].n + 1) / 2; }
    double H = c->hidden_size, Im = c->intermediate_size, qd = (double)c->num_attention_heads * c->head_dim,
           kvd = (double)c->num_key_value_heads * c->head_dim, L = c->num_hidden_layers, V = c->vocab_size;
    double lin = L * (2 * H * qd + 2 * H * kvd + 3 * H * Im) + V * H;
    double f_fwd = 2 * T * lin + L * 4 * qd * attn;                   /* QKᵀ and PV */
    double f_fb = f_fwd + 2 * T * lin + L * 8 * qd * attn; /* + dX GEMMs, 4 attention GEMMs */

    be->forward_backward(ctx, seqs, nseqs, true, err, sizeof err); /* warm-up: buffers grow once */
    double best_f = 1e30, best_fb = 1e30, best_opt = 1e30;
    for (int it = 0; it < iters; it++) {
        t0 = now();
        if (be->forward_backward(ctx, seqs, nseqs, false, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        double dt = now() - t0;
        best_f = dt < best_f ? dt : best_f;
        t0 = now();
        be->forward_backward(ctx, seqs, nseqs, true, err, sizeof err);
        dt = now() - t0;
        best_fb = dt < best_fb ? dt : best_fb;
        adam_params hp = {1e-4, 0.9, 0.95, 1e-8, 0.0, 1.0};
        double gn;
        t0 = now();
        be->optim_step(ctx, ad, &hp, &gn, err, sizeof err);
        dt = now() - t0;
        best_opt = dt < best_opt ? dt : best_opt;
    }
    /* sampling: nseqs prompts of 128 tokens (or fewer), gen new tokens each, one sample */
    int plen = tokens / nseqs < 128 ? tokens / nseqs : 128;
    exe_sample_req *rq = calloc(nseqs, sizeof *rq);
    int32_t *stok = malloc((size_t)nseqs * (gen > 0 ? gen : 1) * 4);
    float *slp = malloc((size_t)nseqs * (gen > 0 ? gen : 1) * 4);
    int *sn = calloc(nseqs, sizeof *sn);
    bool *sstop = calloc(nseqs, sizeof *sstop);
    for (int s = 0; s < nseqs; s++)
        rq[s] = (exe_sample_req){.ad = ad, .n_prompt = plen, .prompt = tok + s * n, .num_samples = 1, .max_tokens = gen,
                                 .temperature = 1.0, .top_k = -1, .top_p = 1.0, .seed = (uint64_t)s,
                                 .tokens_out = stok + (long)s * gen, .logprobs_out = slp + (long)s * gen, .n_out = sn + s,
                                 .stopped_out = sstop + s};
    t0 = now();
    if (be->sample(ctx, rq, nseqs, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    double t_sample = now() - t0;
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    double anchor = gemm_rate(threads);
    printf("machine: %s, %d threads; anchor GEMM 512x3072x1024: %.1f GFLOP/s\n", cpu, threads, anchor);
    printf("model: %s %d layers, hidden %d, heads %d/%d x %d, inter %d, vocab %d (load %.1f s)\n", c->architecture,
           c->num_hidden_layers, c->hidden_size, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
           c->intermediate_size, c->vocab_size, t_load);
    printf("batch: %d sequences, %ld tokens; LoRA rank %d on all modules + head (%zu params)\n", nseqs, T, rank,
           adapter_num_params(ad));
    printf("forward          %8.3f s  %9.1f tok/s  %7.1f GFLOP/s  (%.0f%% of anchor)\n", best_f, T / best_f,
           f_fwd / best_f / 1e9, 100 * f_fwd / best_f / 1e9 / anchor);
    printf("forward_backward %8.3f s  %9.1f tok/s  %7.1f GFLOP/s  (%.0f%% of anchor; model FLOPs, recompute not counted)\n",
           best_fb, T / best_fb, f_fb / best_fb / 1e9, 100 * f_fb / best_fb / 1e9 / anchor);
    printf("optim_step       %8.4f s  (%zu params)\n", best_opt, adapter_num_params(ad));
    printf("sample           %8.3f s  %9.1f new tok/s  (%d prompts of %d tokens, %d new tokens each, KV cache)\n",
           t_sample, nseqs * (double)gen / t_sample, nseqs, plen, gen);
    free(rq); free(stok); free(slp); free(sn); free(sstop);
    adapter_free(ad);
    be->destroy(ctx);
    model_free(m);
    free(seqs); free(tok); free(lp); free(loss);
    if (tmpdir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", tmpdir);
    }
    return 0;
}
