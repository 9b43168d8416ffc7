/* bench_backend.c — a backend's throughput (--backend, default cpu) on a Qwen3-0.6B-shaped
 * model (fewer layers with --layers): forward, forward_backward, optim_step and sampling
 * (prefill and decode separately), in tokens/s and GFLOP/s. On the CPU backend also next
 * to the machine's own single-GEMM rate, and for decode the weight bytes streamed per
 * second next to the machine's memory read rate (decode reads every weight once per
 * step); a device backend brings its own anchors with it. Prints figures; never pass/fail.
 *
 *   bench_backend [--backend NAME] [--device N] [--model DIR] [--layers N] [--tokens T] [--seqs S]
 *                 [--threads N] [--rank R] [--iters K] [--adapters A]
 *                 [--gen G] [--samples K]   (sampling: S prompts of ≤128 tokens, K samples each, G new tokens)
 *                 [--snapshot-every N]
 *   bench_backend --help
 *
 * FLOPs counted are model FLOPs: 2·T·(linear + head weights; a mixture-of-experts layer
 * counts its router and the K experts a token goes to) + causal attention for the
 * forward; the backward adds input gradients of the same GEMMs and twice the attention
 * (LoRA terms and the backward's layer recompute are not counted).
 *
 * Durability (docs/architecture.md, "Durable training state"): what writing the adapter's
 * state (weights, Adam moments) to the registry's blob store at every optimizer step
 * would cost, what restoring it costs, and the price of the alternative Loom takes on a
 * batch-invariant backend: a snapshot every --snapshot-every steps (default 20) plus an
 * exact replay, which needs the CPU backend's own GEMM (next to OpenBLAS's rate).
 */
#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"    /* the CPU anchor: cpu_sgemm on the backend's thread pool */
#include "backend/cpu/cpu_pool.h"
#include "backend/loss.h"
#include "common/clock.h"
#include "model/adapter_io.h"
#include "registry/blobstore.h"
#include "model/mkmodel.h"
#include "model/model.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
        double t0 = clock_mono_s();
        cpu_sgemm(p, false, true, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
        double t = clock_mono_s() - t0;
        dt = t < dt ? t : dt;
    }
    cpu_pool_destroy(p);
    free(a); free(b); free(c);
    return 2.0 * M * N * K / dt / 1e9;
}

/* OpenBLAS's own rate on the anchor's shape, with its own threads. */
static double openblas_rate(int threads)
{
    int M = 512, N = 3072, K = 1024;
    float *a = calloc((size_t)M * K, 4), *b = calloc((size_t)N * K, 4), *c = calloc((size_t)M * N, 4);
    for (long i = 0; i < (long)M * K; i++) a[i] = (float)(i % 7) * 0.1f;
    for (long i = 0; i < (long)N * K; i++) b[i] = (float)(i % 5) * 0.1f;
    openblas_set_num_threads(threads);
    double dt = 1e30;
    for (int r = 0; r < 8; r++) {
        double t0 = clock_mono_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
        double t = clock_mono_s() - t0;
        dt = r && t < dt ? t : dt;
    }
    openblas_set_num_threads(1);
    free(a); free(b); free(c);
    return 2.0 * M * N * K / dt / 1e9;
}

/* The durability figures (see the file's comment), printed; step_s: one forward_backward
 * + optim_step of the batch, the unit they are put in proportion to. */
static void durability(const be_backend *be, void *ctx, be_adapter *ad, double step_s, int every, int iters)
{
    char err[512], dir[64] = "/tmp/loom_bench_blobs_XXXXXX", dg[BLOB_DIGEST_HEX];
    if (!mkdtemp(dir)) { perror("mkdtemp"); return; }
    blobstore *bs = blob_open_dir(dir, err, sizeof err);
    if (!bs) { fprintf(stderr, "%s\n", err); return; }
    double t_dl = 1e30, t_enc = 1e30, t_put = 1e30, t_get = 1e30, t_up = 1e30;
    size_t len = 0;
    for (int it = 0; it < iters; it++) {
        adapter_state host;
        double t0 = clock_mono_s();
        if (be_adapter_to_state(be, ctx, ad, ADAPTER_PARAMS | ADAPTER_OPTIM, &host, err, sizeof err) < 0) break;
        double t1 = clock_mono_s();
        uint8_t *bytes;
        host.params[it] += 1e-3f;   /* another state each time: the store really writes */
        if (adapter_io_encode(&host, true, &bytes, &len, err, sizeof err) < 0) break;
        double t2 = clock_mono_s();
        if (blob_put(bs, bytes, len, dg, err, sizeof err) < 0) break;
        double t3 = clock_mono_s();
        void *back;
        size_t blen;
        if (blob_get(bs, dg, &back, &blen, err, sizeof err) < 0) break;
        int rc = adapter_io_restore(&host, back, blen, true, err, sizeof err);
        double t4 = clock_mono_s();
        if (rc == 0) rc = be->adapter_upload(ctx, ad, &host, ADAPTER_PARAMS | ADAPTER_OPTIM, err, sizeof err);
        double t5 = clock_mono_s();
        free(back);
        free(bytes);
        adapter_state_free(&host);
        if (rc < 0) break;
        t_dl = t1 - t0 < t_dl ? t1 - t0 : t_dl;
        t_enc = t2 - t1 < t_enc ? t2 - t1 : t_enc;
        t_put = t3 - t2 < t_put ? t3 - t2 : t_put;
        t_get = t4 - t3 < t_get ? t4 - t3 : t_get;
        t_up = t5 - t4 < t_up ? t5 - t4 : t_up;
    }
    blob_close(bs);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", dir);
    if (t_dl >= 1e30) { fprintf(stderr, "durability: %s\n", err); return; }
    double w = t_dl + t_enc + t_put;
    printf("durability: the adapter's state (weights + Adam moments) is %.1f MB; one forward_backward + optim_step "
           "of this batch %.3f s\n", len / 1e6, step_s);
    printf("  written every step   %8.4f s per step (%.1f%% of the step): download %.4f, encode %.4f, "
           "sha256 + write + fsync %.4f\n", w, 100 * w / step_s, t_dl, t_enc, t_put);
    printf("  restored             %8.4f s (read + verify + decode %.4f, upload %.4f)\n", t_get + t_up, t_get, t_up);
    printf("  snapshot every %d steps + exact replay: %.4f s per step (%.2f%%, by a writer thread beside the compute);"
           " a recovery replays %d steps on average (%.2f s here)\n", every, w / every, 100 * w / every / step_s,
           every / 2, every / 2.0 * step_s);
}

/* Anchor for decode: the best of a few sequential reads of a buffer far larger than cache. */
static double read_rate(void)
{
    size_t n = (size_t)64 << 20; /* 256 MB of floats */
    float *a = malloc(n * sizeof *a);
    if (!a) return 0;
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 7);
    double best = 1e30, sink = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = clock_mono_s(), acc = 0;
        for (size_t i = 0; i < n; i += 4) acc += a[i] + a[i + 1] + a[i + 2] + a[i + 3];
        double dt = clock_mono_s() - t0;
        sink += acc;
        best = dt < best ? dt : best;
    }
    free(a);
    return sink == -1 ? 0 : n * sizeof(float) / best / 1e9;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_backend [--backend NAME] [--device N] [--model DIR] [--layers N] [--tokens T] [--seqs S]\n"
               "                     [--threads N] [--rank R] [--iters K] [--gen G] [--samples K]\n"
               "  --backend NAME one of: %s (default cpu); --device N its device (default 0)\n"
               "  --model DIR   an HF model directory (default: a generated Qwen3-0.6B shape, --layers layers)\n"
               "  --layers N    layers of the generated model (default 4)\n"
               "  --tokens T    tokens of the training batch (default 1024), in --seqs S sequences (default 4)\n"
               "  --threads N   worker threads (default: all CPUs)\n"
               "  --rank R      LoRA rank, all modules + head (default 32)\n"
               "  --adapters A  A adapters, sequence s trained by adapter s mod A (default 1): the\n"
               "                cost of many tenants in one pass against one adapter on the same tokens\n"
               "  --iters K     timed repetitions, best kept (default 3)\n"
               "  --gen G       new tokens per sample (default 32)\n"
               "  --samples K   samples per prompt (default 1; RL-style sampling uses many)\n"
               "  --snapshot-every N  steps between snapshots, for the durability figures (default 20)\n",
               be_backend_names());
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *backend = "cpu";
    int device = 0, layers = 4, tokens = 1024, nseqs = 4, threads = 0, rank = 32, iters = 3, gen = 32, nsamples = 1, nad = 1,
        every = 20;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
    if (argc % 2 == 0) { usage(stderr); return 2; }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "--device")) device = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens")) tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seqs")) nseqs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rank")) rank = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--adapters")) nad = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gen")) gen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--samples")) nsamples = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--snapshot-every")) every = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); usage(stderr); return 2; }
    }
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nseqs < 1 || tokens < nseqs) { fprintf(stderr, "need tokens >= seqs >= 1\n"); return 2; }
    if (nad < 1 || nad > nseqs) { fprintf(stderr, "need 1 <= adapters <= seqs\n"); return 2; }
    if (gen < 2 || nsamples < 1) { fprintf(stderr, "need --gen >= 2 and --samples >= 1\n"); return 2; }
    const be_backend *be = be_backend_find(backend);
    if (!be) { fprintf(stderr, "unknown backend '%s' (this build has: %s)\n", backend, be_backend_names()); return 2; }
    bool on_cpu = !strcmp(be->name, "cpu");
    char err[512], tmpdir[64] = "";
    if (!model_dir) {
        mkmodel_opts o;
        mkmodel_defaults(&o, "qwen3", "qwen3-0.6b", err, sizeof err);
        o.layers = layers;
        snprintf(tmpdir, sizeof tmpdir, "/tmp/loom_bench_XXXXXX");
        if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 2; }
        o.out_dir = tmpdir;
        double t0 = clock_mono_s();
        if (mkmodel_write(&o, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
        printf("mkmodel: %.1f s\n", clock_mono_s() - t0);
        model_dir = tmpdir;
    }
    model_files *m;
    double t0 = clock_mono_s();
    if (model_open(model_dir, &m, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    const model_config mcfg = m->cfg, *c = &mcfg;
    be_backend_opts bo = {.device = device, .threads = threads};
    void *ctx = be->create(m, &bo, err, sizeof err);
    model_close(m);
    double t_load = clock_mono_s() - t0;
    if (!ctx) { fprintf(stderr, "%s\n", err); return 1; }
    be_device_info dev;
    be->device_info(ctx, &dev);
    lora_config lc = {rank, 1, true, true, true};
    be_adapter **ads = calloc(nad, sizeof *ads);
    for (int a = 0; a < nad; a++) {
        lc.seed = 1 + (uint64_t)a;
        if (!(ads[a] = be_adapter_new(be, ctx, &lc, true, err, sizeof err))) { fprintf(stderr, "%s\n", err); return 1; }
    }
    be_adapter *ad = ads[0];
    size_t ad_params = ad->layout.num_params;

    /* nseqs sequences of equal length, cross-entropy, all with the adapter */
    int n = tokens / nseqs;
    be_seq *seqs = calloc(nseqs, sizeof *seqs);
    int32_t *tok = malloc((size_t)tokens * 4);
    float *lp = malloc((size_t)tokens * 4), *loss = malloc((size_t)tokens * 4);
    for (int i = 0; i < tokens; i++) tok[i] = (int32_t)((i * 7919L) % c->vocab_size);
    for (int s = 0; s < nseqs; s++) {
        seqs[s] = (be_seq){.ad = ads[s % nad], .loss = loss_spec_default(LOSS_CROSS_ENTROPY), .n = n, .tokens = tok + s * n,
                            .targets = tok + s * n + 1, .logprobs_out = lp + s * n, .loss_out = loss + s * n};
        if (s == nseqs - 1) seqs[s].n = n - 1; /* targets stay inside the array */
    }
    long T = 0;
    double attn = 0;
    for (int s = 0; s < nseqs; s++) { T += seqs[s].n; attn += (double)seqs[s].n * (seqs[s].n + 1) / 2; }
    double H = c->hidden_size, Im = c->intermediate_size, qd = (double)c->num_attention_heads * c->head_dim,
           kvd = (double)c->num_key_value_heads * c->head_dim, L = c->num_hidden_layers, V = c->vocab_size;
    double lin = L * (2 * H * qd + 2 * H * kvd) + V * H;
    for (int l = 0; l < c->num_hidden_layers; l++) /* a token's MLP: a sparse layer's router + its K experts */
        lin += model_layer_moe(c, l) ? c->num_experts * H + 3.0 * c->num_experts_per_tok * H * c->moe_intermediate_size
                                     : 3 * H * Im;
    double f_fwd = 2 * T * lin + L * 4 * qd * attn;                   /* QKᵀ and PV */
    double f_fb = f_fwd + 2 * T * lin + L * 8 * qd * attn; /* + dX GEMMs, 4 attention GEMMs */

    be->forward_backward(ctx, seqs, nseqs, true, err, sizeof err); /* warm-up: buffers grow once */
    double best_f = 1e30, best_fb = 1e30, best_opt = 1e30;
    for (int it = 0; it < iters; it++) {
        t0 = clock_mono_s();
        if (be->forward_backward(ctx, seqs, nseqs, false, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        double dt = clock_mono_s() - t0;
        best_f = dt < best_f ? dt : best_f;
        t0 = clock_mono_s();
        be->forward_backward(ctx, seqs, nseqs, true, err, sizeof err);
        dt = clock_mono_s() - t0;
        best_fb = dt < best_fb ? dt : best_fb;
        adam_params hp = {1e-4, 0.9, 0.95, 1e-8, 0.0, 1.0};
        double gn;
        t0 = clock_mono_s();
        for (int a = 0; a < nad; a++) be->optim_step(ctx, ads[a], &hp, &gn, err, sizeof err);
        dt = clock_mono_s() - t0;
        best_opt = dt < best_opt ? dt : best_opt;
    }
    /* sampling: nseqs prompts of 128 tokens (or fewer), nsamples samples of gen new tokens
     * each, no stop tokens; first with max_tokens 1 (prefill + one pick), then in full: the
     * difference is the decode of gen − 1 tokens per sample. */
    int plen = tokens / nseqs < 128 ? tokens / nseqs : 128, S = nseqs * nsamples;
    be_sample_req *rq = calloc(nseqs, sizeof *rq);
    int32_t *stok = malloc((size_t)S * gen * 4);
    float *slp = malloc((size_t)S * gen * 4);
    int *sn = calloc(S, sizeof *sn);
    bool *sstop = calloc(S, sizeof *sstop);
    double t_prefill = 1e30, t_sample = 1e30;
    for (int it = 0; it < iters; it++)
        for (int full = 0; full < 2; full++) {
            for (int s = 0; s < nseqs; s++)
                rq[s] = (be_sample_req){.ad = ad, .n_prompt = plen, .prompt = tok + s * n, .num_samples = nsamples,
                                         .max_tokens = full ? gen : 1, .temperature = 1.0, .top_k = -1, .top_p = 1.0,
                                         .seed = (uint64_t)s, .tokens_out = stok + (long)s * nsamples * gen,
                                         .logprobs_out = slp + (long)s * nsamples * gen, .n_out = sn + s * nsamples,
                                         .stopped_out = sstop + s * nsamples};
            t0 = clock_mono_s();
            if (be->sample(ctx, rq, nseqs, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
            double dt = clock_mono_s() - t0;
            if (full) t_sample = dt < t_sample ? dt : t_sample;
            else t_prefill = dt < t_prefill ? dt : t_prefill;
        }
    long new_tok = 0;
    for (int k = 0; k < S; k++) new_tok += sn[k];
    double t_decode = t_sample - t_prefill, dec_tok = (double)new_tok - S;  /* tokens after the first of each sample */
    /* per decode step: every weight once (+ the adapter), attention over the cache */
    double wbytes = 4.0 * (L * (H * qd * 2 + H * kvd * 2 + 3 * H * Im) + V * H) + 4.0 * ad_params; /* fp32 (cpu) */
    double steps = gen - 1, ctx_avg = plen + gen / 2.0;
    double f_dec = dec_tok * (2 * lin + L * 4 * qd * ctx_avg);
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    double anchor = on_cpu ? gemm_rate(threads) : 0;
    if (on_cpu)
        printf("machine: %s, %d threads; anchor GEMM 512x3072x1024: %.1f GFLOP/s (the backend's batch-invariant GEMM;"
               " OpenBLAS: %.1f)\n", cpu, threads, anchor, openblas_rate(threads));
    printf("backend: %s on %s\n", be->name, dev.device);
    printf("model: %s %d layers, hidden %d, heads %d/%d x %d, inter %d, vocab %d (load %.1f s)\n", c->architecture,
           c->num_hidden_layers, c->hidden_size, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
           c->intermediate_size, c->vocab_size, t_load);
    printf("batch: %d sequences, %ld tokens; LoRA rank %d on all modules + head (%zu params)\n", nseqs, T, rank,
           ad_params);
    printf("forward          %8.3f s  %9.1f tok/s  %7.1f GFLOP/s", best_f, T / best_f, f_fwd / best_f / 1e9);
    if (on_cpu) printf("  (%.0f%% of anchor)", 100 * f_fwd / best_f / 1e9 / anchor);
    printf("\nforward_backward %8.3f s  %9.1f tok/s  %7.1f GFLOP/s", best_fb, T / best_fb, f_fb / best_fb / 1e9);
    if (on_cpu) printf("  (%.0f%% of anchor)", 100 * f_fb / best_fb / 1e9 / anchor);
    printf("  (model FLOPs, recompute not counted)\n");
    printf("optim_step       %8.4f s  (%zu params)\n", best_opt, ad_params);
    double bw = on_cpu ? read_rate() : 0;
    printf("sample           %8.3f s  %9.1f new tok/s  (%d prompts of %d tokens x %d samples, %d new tokens each, KV cache)\n",
           t_sample, new_tok / t_sample, nseqs, plen, nsamples, gen);
    printf("  prefill        %8.3f s  %9.1f prompt tok/s  (+ the first token of each sample)\n", t_prefill,
           nseqs * (double)plen / t_prefill);
    printf("  decode         %8.3f s  %9.1f tok/s  %.1f steps/s x %d streams  %7.1f GFLOP/s", t_decode,
           dec_tok / t_decode, steps / t_decode, S, f_dec / t_decode / 1e9);
    if (on_cpu) printf("  (%.0f%% of anchor)", 100 * f_dec / t_decode / 1e9 / anchor);
    printf("\n");
    if (on_cpu)
        printf("  decode weights %8.1f GB/s streamed (%.0f MB per step)  vs memory read %.1f GB/s (%.0f%%)\n",
               steps * wbytes / t_decode / 1e9, wbytes / 1e6, bw, bw > 0 ? 100 * steps * wbytes / t_decode / 1e9 / bw : 0);
    durability(be, ctx, ad, best_fb + best_opt, every, iters);
    free(rq); free(stok); free(slp); free(sn); free(sstop);
    for (int a = 0; a < nad; a++) be->adapter_free(ctx, ads[a]);
    free(ads);
    be->destroy(ctx);
    free(seqs); free(tok); free(lp); free(loss);
    if (tmpdir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", tmpdir);
    }
    return 0;
}
