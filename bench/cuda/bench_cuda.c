/* bench_cuda.c — a backend's training throughput on real model geometries, through the
 * backend table (--backend, default cuda): forward and forward_backward tokens/s and MFU
 * for Qwen3-0.6B, Llama-3.2-1B and Qwen3-8B shapes (random bf16 weights built in this
 * process: no model files) at 512, 2K, 8K and 32K tokens, LoRA rank 32 on q,k,v,o,gate,
 * up,down; 8 and 32 adapters packed in one pass against one adapter on the same tokens;
 * device memory in use after each row (the workspace never shrinks, so this is the peak
 * so far). Next to each row: the PyTorch + PEFT peer's figures, from a peer.json written by
 * bench/cuda/peft_peer.py on the same GPU (--peer), else the issue's H100 table. Prints
 * figures; never a test.
 *
 *   bench_cuda [--backend NAME] [--device N] [--geo NAME[,NAME...]] [--quick] [--iters K]
 *              [--layers L] [--peer peer.json] [--json out.json] [--decode [--steps N]]
 *
 * --decode: sampling instead of training, through the table's sample (issue: faster than
 * PyTorch + PEFT). Per geometry: decode tok/s of 32 concurrent samples (8 requests of a
 * 128-token prompt × 4 samples, temperature 1, no stop tokens) on 8 adapters (one per
 * request), on one, and on the base model: step = (t(max_tokens 1 + N) − t(max_tokens 1)) / N,
 * N = 128 (8 under --quick, --steps N), with the HBM-bandwidth bound of a step next to it;
 * then time to first token for one 2048-token prompt and for 8 at once (median of 5, 3
 * under --quick). Rows go to --json with "kind": "decode" / "ttft" (training rows: "train").
 *
 * Geometries run in the order given (default: Qwen3-8B, Qwen3-0.6B, Llama-3.2-1B: the
 * issue's MFU and 32K-memory rows first, so that a run stopped at its time limit has them).
 * --quick: one timed pass per row, and only the rows of at most 2K tokens plus the rows the
 * issue compares with PEFT (Qwen3-0.6B 16×512 and 1×8192, Llama-3.2-1B 4×2048, Qwen3-8B
 * 8×512 and 2×2048).
 *
 * --layers L shrinks every geometry to L layers (a smoke run of this program on the CPU
 * backend: bench_cuda --backend cpu --layers 1 --quick). MFU is the issue's and
 * peft_peer.py's convention: 4·N·T for forward+backward (2·N·T forward), N the parameters
 * of every matmul including the output head, plus causal attention 2·d·nq·n(n+1) per layer
 * and sequence forward (three times that for forward+backward), against 989 TFLOP/s.
 */
#include "backend/backend.h"
#include "backend/loss.h"
#include "common/clock.h"
#include "model/model.h"
#include "model/safetensors.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PEAK 989e12

typedef struct {
    const char *name, *arch;
    int V, H, I, L, nq, nkv, d, max_pos;
    bool tie, llama3;
    double theta;
} geo;

static const geo GEOS[] = {
    {"Qwen3-0.6B", "Qwen3ForCausalLM", 151936, 1024, 3072, 28, 16, 8, 128, 40960, true, false, 1e6},
    {"Llama-3.2-1B", "LlamaForCausalLM", 128256, 2048, 8192, 16, 32, 8, 64, 131072, true, true, 5e5},
    {"Qwen3-8B", "Qwen3ForCausalLM", 151936, 4096, 12288, 36, 32, 8, 128, 40960, false, false, 1e6},
};

/* The order geometries run in when --geo does not say. */
static const char *const DEFAULT_ORDER = "Qwen3-8B,Qwen3-0.6B,Llama-3.2-1B";

/* rows: geometry, batch × sequence length, adapters packed (each gets batch/nad sequences),
 * cmp: a row the issue compares with PyTorch + PEFT (kept by --quick) */
typedef struct {
    const char *geo;
    int batch, seq, nad;
    bool cmp;
} row;

static const row ROWS[] = {
    {"Qwen3-0.6B", 1, 512, 1, false},    {"Qwen3-0.6B", 4, 512, 1, false},    {"Qwen3-0.6B", 16, 512, 1, true},
    {"Qwen3-0.6B", 1, 2048, 1, false},   {"Qwen3-0.6B", 1, 8192, 1, true},    {"Qwen3-0.6B", 1, 32768, 1, false},
    {"Qwen3-0.6B", 32, 256, 1, false},   {"Qwen3-0.6B", 32, 256, 8, false},   {"Qwen3-0.6B", 32, 256, 32, false},
    {"Qwen3-0.6B", 8, 512, 1, false},    {"Qwen3-0.6B", 8, 512, 8, false},
    {"Llama-3.2-1B", 1, 512, 1, false},  {"Llama-3.2-1B", 1, 2048, 1, false}, {"Llama-3.2-1B", 4, 2048, 1, true},
    {"Llama-3.2-1B", 1, 8192, 1, false}, {"Llama-3.2-1B", 1, 32768, 1, false},
    {"Qwen3-8B", 1, 512, 1, false},      {"Qwen3-8B", 8, 512, 1, true},       {"Qwen3-8B", 2, 2048, 1, true},
    {"Qwen3-8B", 1, 8192, 1, false},     {"Qwen3-8B", 1, 32768, 1, false},
};

/* The issue's PyTorch + PEFT figures on one H100 (fwd, fwd+bwd tokens/s; 0 = out of memory),
 * shown when no peer.json of this GPU is given. */
typedef struct {
    const char *geo;
    int batch, seq;
    double fwd, fb;
} peer_fig;

static const peer_fig ISSUE[] = {
    {"Qwen3-0.6B", 16, 512, 75578, 29892}, {"Qwen3-0.6B", 1, 8192, 68311, 27085}, {"Qwen3-0.6B", 1, 32768, 0, 0},
    {"Llama-3.2-1B", 4, 2048, 77594, 33888}, {"Qwen3-8B", 8, 512, 17757, 7576}, {"Qwen3-8B", 2, 2048, 17434, 7443},
    {"Qwen3-8B", 1, 8192, 0, 0},
};

static double matmul_params(const geo *g)
{
    double qd = (double)g->nq * g->d, kvd = (double)g->nkv * g->d;
    return (g->H * qd + 2.0 * g->H * kvd + qd * g->H + 3.0 * g->H * g->I) * g->L + (double)g->V * g->H;
}

static double flops(const geo *g, int batch, int n, bool backward)
{
    double T = (double)batch * n, attn = 2.0 * g->d * g->nq * (double)n * (n + 1) * g->L * batch;
    return (backward ? 4 : 2) * matmul_params(g) * T + (backward ? 3 : 1) * attn;
}

/* ---- a model of random bf16 weights, as model_files ------------------------------------ */

typedef struct {
    model_files mf;
    st_tensor *t;
    int nt;
    uint16_t *lin, *norm;
} rand_model;

/* One tensor over a window of the shared random buffers: tensors of one model get
 * different windows, so layers are not copies of each other. */
static const st_tensor *rm_tensor(rand_model *m, const char *name, int64_t rows, int64_t cols, bool is_norm,
                                  size_t window)
{
    st_tensor *t = &m->t[m->nt++];
    t->name = name;
    t->dtype = ST_BF16;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->numel = rows * (cols ? cols : 1);
    t->nbytes = (size_t)t->numel * 2;
    size_t off = (size_t)(m->nt * 4099) % window;
    t->data = (const uint8_t *)((is_norm ? m->norm : m->lin) + off);
    return t;
}

static int rm_build(rand_model *m, const geo *g, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"%s\"], \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, "
             "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
             "\"max_position_embeddings\": %d, \"tie_word_embeddings\": %s, \"rope_theta\": %g, \"rms_norm_eps\": 1e-6, "
             "\"hidden_act\": \"silu\"%s}",
             g->arch, g->V, g->H, g->I, g->L, g->nq, g->nkv, g->d, g->max_pos, g->tie ? "true" : "false", g->theta,
             g->llama3 ? ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0, "
                         "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}" : "");
    if (model_config_parse(cfg, &m->mf.cfg, err, errlen) < 0) return -1;
    const model_config *c = &m->mf.cfg;
    size_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, qd = (size_t)c->num_attention_heads * c->head_dim;
    size_t biggest = V * H > I * H ? V * H : I * H, window = 1 << 20;
    if (qd * H > biggest) biggest = qd * H;
    m->lin = malloc((biggest + window) * 2);
    m->norm = malloc((H + window) * 2);
    m->t = calloc(MODEL_MAX_TENSORS(c), sizeof *m->t);
    m->mf.layers = calloc(c->num_hidden_layers, sizeof *m->mf.layers);
    if (!m->lin || !m->norm || !m->t || !m->mf.layers) { snprintf(err, errlen, "out of host memory"); return -1; }
    /* uniform(−1/√H, 1/√H) linear weights, norms 1 ± 0.05: a cheap xorshift, the values only
     * need to be ordinary (never zeros: they can run faster than real data) */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    float a = (float)(1.0 / sqrt((double)H));
    for (size_t i = 0; i < biggest + window; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        m->lin[i] = st_f32_to_bf16(a * (2.0f * (float)(x >> 40) / (float)(1 << 24) - 1.0f));
    }
    for (size_t i = 0; i < H + window; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        m->norm[i] = st_f32_to_bf16(1.0f + 0.1f * ((float)(x >> 40) / (float)(1 << 24) - 0.5f));
    }
    size_t kvd = (size_t)c->num_key_value_heads * c->head_dim, d = c->head_dim;
    m->mf.embed = rm_tensor(m, "model.embed_tokens.weight", V, H, false, window);
    m->mf.final_norm = rm_tensor(m, "model.norm.weight", H, 0, true, window);
    m->mf.lm_head = c->tie_word_embeddings ? m->mf.embed : rm_tensor(m, "lm_head.weight", V, H, false, window);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        model_layer_tensors *y = &m->mf.layers[l];
        y->attn_norm = rm_tensor(m, "input_layernorm", H, 0, true, window);
        y->wq = rm_tensor(m, "q_proj", qd, H, false, window);
        y->wk = rm_tensor(m, "k_proj", kvd, H, false, window);
        y->wv = rm_tensor(m, "v_proj", kvd, H, false, window);
        y->wo = rm_tensor(m, "o_proj", H, qd, false, window);
        if (c->qk_norm) {
            y->q_norm = rm_tensor(m, "q_norm", d, 0, true, window);
            y->k_norm = rm_tensor(m, "k_norm", d, 0, true, window);
        }
        y->mlp_norm = rm_tensor(m, "post_attention_layernorm", H, 0, true, window);
        y->wgate = rm_tensor(m, "gate_proj", I, H, false, window);
        y->wup = rm_tensor(m, "up_proj", I, H, false, window);
        y->wdown = rm_tensor(m, "down_proj", H, I, false, window);
    }
    return 0;
}

static void rm_free(rand_model *m)
{
    free(m->lin);
    free(m->norm);
    free(m->t);
    free(m->mf.layers);
}

/* ---- the peer's figures ------------------------------------------------------------------ */

static json_t *peer_json;

/* fwd and fb tokens/s of the peer for this shape: from peer.json, else the issue's table;
 * false when neither has it; *oom when the peer ran out of memory. */
static bool peer_lookup(const char *g, int batch, int seq, double *fwd, double *fb, bool *oom, const char **src)
{
    *oom = false;
    if (peer_json) {
        size_t i;
        json_t *r;
        json_array_foreach(peer_json, i, r) {
            const char *rg = json_string_value(json_object_get(r, "geometry")),
                       *kind = json_string_value(json_object_get(r, "kind"));
            if (!rg || strcmp(rg, g) || (kind && strcmp(kind, "train")) ||
                json_integer_value(json_object_get(r, "batch")) != batch ||
                json_integer_value(json_object_get(r, "seq")) != seq || json_is_true(json_object_get(r, "checkpointing")))
                continue;
            *oom = json_is_true(json_object_get(r, "oom"));
            *fwd = json_number_value(json_object_get(r, "fwd_tok_s"));
            *fb = json_number_value(json_object_get(r, "fb_tok_s"));
            *src = "peer";
            return true;
        }
        return false;
    }
    for (size_t i = 0; i < sizeof ISSUE / sizeof ISSUE[0]; i++)
        if (!strcmp(ISSUE[i].geo, g) && ISSUE[i].batch == batch && ISSUE[i].seq == seq) {
            *fwd = ISSUE[i].fwd;
            *fb = ISSUE[i].fb;
            *oom = ISSUE[i].fb == 0;
            *src = "issue";
            return true;
        }
    return false;
}

/* ---- one row ------------------------------------------------------------------------------ */

typedef struct {
    const be_backend *be;
    void *ctx;
    const geo *g;
    be_adapter *ads[32];
    int nads;
    int iters;
    json_t *out;
    const char *json_out; /* file the rows are written to, or NULL */
} bench;

static double median(double *x, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && x[j] < x[j - 1]; j--) { double t = x[j]; x[j] = x[j - 1]; x[j - 1] = t; }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* Median seconds of `iters` passes (after one warm-up: workspace growth, GEMM plans), or
 * of fewer once the passes so far took 20 s: a slow row (32K tokens on Qwen3-8B) then
 * costs a bounded time, so the rows after it still run inside the call's time limit. */
static double time_pass(bench *b, be_seq *s, int n, bool backward, char *err, size_t errlen)
{
    if (b->be->forward_backward(b->ctx, s, n, backward, err, errlen) != 0) return -1;
    double t[16], spent = 0;
    int k = 0;
    while (k < b->iters && (k == 0 || spent < 20.0)) {
        double t0 = clock_mono_s();
        if (b->be->forward_backward(b->ctx, s, n, backward, err, errlen) != 0) return -1;
        t[k] = clock_mono_s() - t0;
        spent += t[k++];
    }
    return median(t, k);
}

static void run_row(bench *b, const row *r)
{
    const geo *g = b->g;
    int nseq = r->batch, n = r->seq;
    long T = (long)nseq * n;
    char err[512];
    while (b->nads < r->nad) {
        lora_config lc = {32, (uint64_t)b->nads + 1, true, true, false};
        be_adapter *a = be_adapter_new(b->be, b->ctx, &lc, true, err, sizeof err);
        if (!a) { printf("%-13s adapter %d: %s\n", g->name, b->nads, err); return; }
        b->ads[b->nads++] = a;
    }
    int32_t *tok = malloc((T + 1) * sizeof *tok);
    float *lp = malloc(T * sizeof *lp), *loss = malloc(T * sizeof *loss);
    be_seq *s = calloc(nseq, sizeof *s);
    uint64_t x = 88172645463325252ull;
    for (long i = 0; i <= T; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; tok[i] = (int32_t)(x % g->V); }
    for (int i = 0; i < nseq; i++)
        s[i] = (be_seq){.ad = b->ads[i * r->nad / nseq], .loss = loss_spec_default(LOSS_CROSS_ENTROPY), .n = n,
                         .tokens = tok + (long)i * n, .targets = tok + (long)i * n + 1, .logprobs_out = lp + (long)i * n,
                         .loss_out = loss + (long)i * n};
    double tf = time_pass(b, s, nseq, false, err, sizeof err);
    double tb = tf < 0 ? -1 : time_pass(b, s, nseq, true, err, sizeof err);
    be_device_info di;
    b->be->device_info(b->ctx, &di);
    double mem = (double)(di.memory_total - di.memory_free) / 1073741824.0;
    char shape[32];
    snprintf(shape, sizeof shape, "%dx%d", nseq, n);
    json_t *jr = json_pack("{s:s, s:s, s:i, s:i, s:i, s:f}", "kind", "train", "geometry", g->name, "batch", nseq, "seq", n,
                           "adapters", r->nad, "mem_gib", mem);
    if (tb < 0) {
        printf("%-13s %-9s %2d ad | failed: %s\n", g->name, shape, r->nad, err);
        json_object_set_new(jr, "error", json_string(err));
    } else {
        double ff = T / tf, fb = T / tb, mf = flops(g, nseq, n, false) / tf / PEAK, mb = flops(g, nseq, n, true) / tb / PEAK;
        printf("%-13s %-9s %2d ad | fwd %9.0f tok/s MFU %5.1f%% | fwd+bwd %9.0f tok/s MFU %5.1f%% | %5.1f GiB", g->name,
               shape, r->nad, ff, 100 * mf, fb, 100 * mb, mem);
        double pf, pb;
        bool oom;
        const char *src;
        if (r->nad == 1 && peer_lookup(g->name, nseq, n, &pf, &pb, &oom, &src)) {
            if (oom) printf(" | PEFT (%s): out of memory", src);
            else printf(" | PEFT (%s) fwd+bwd %7.0f tok/s: %.2fx (fwd %.2fx)", src, pb, fb / pb, ff / pf);
        }
        printf("\n");
        json_t *figs = json_pack("{s:f, s:f, s:f, s:f}", "fwd_tok_s", ff, "fb_tok_s", fb, "fwd_mfu", mf, "fb_mfu", mb);
        json_object_update(jr, figs);
        json_decref(figs);
    }
    json_array_append_new(b->out, jr);
    /* row by row: a run stopped at its time limit keeps the rows it finished */
    if (b->json_out && json_dump_file(b->out, b->json_out, JSON_INDENT(1)) != 0)
        fprintf(stderr, "cannot write %s\n", b->json_out);
    free(tok);
    free(lp);
    free(loss);
    free(s);
}

/* ---- decode and time to first token (--decode) ------------------------------------------- */

#define DEC_REQS 8         /* requests of a decode row, each on its own adapter in the 8-adapter row */
#define DEC_PER_REQ 4      /* samples per request: 8 × 4 = 32 concurrent samples */
#define DEC_PROMPT 128     /* prompt tokens of each decode request */
#define TTFT_PROMPT 2048   /* prompt tokens of a time-to-first-token request */
#define LORA_RANK 32
#define QUICK_STEPS 8      /* decode steps under --quick (128 otherwise; --steps N sets it) */

/* The issue's peer figures on one H100 (HF generate with one LoRA, Qwen3-8B, batch 32),
 * shown when no peer.json of this GPU is given. */
static const struct { const char *geo; int samples; double tok_s; } ISSUE_DECODE[] = {{"Qwen3-8B", 32, 469}};

/* HBM bandwidth in B/s of the card a be_device_info names (its data sheet), 0 when unknown.
 * GH200 is left unknown: its name holds "H200" but it comes with HBM3 (4.0 TB/s) or HBM3e
 * (4.9 TB/s) under the same name. */
static double hbm_bandwidth(const char *device)
{
    if (strstr(device, "GH200")) return 0;
    if (strstr(device, "H200")) return 4.8e12;
    if (strstr(device, "H100")) {
        if (strstr(device, "PCIe")) return 2.0e12;
        if (strstr(device, "NVL")) return 3.9e12;
        return 3.35e12; /* SXM5, 80 GB HBM3 */
    }
    return 0;
}

/* bf16 elements of one rank-r adapter on all seven modules: r·(in + out) per module and layer. */
static double lora_params(const geo *g, int r)
{
    double qd = (double)g->nq * g->d, kvd = (double)g->nkv * g->d;
    double H = g->H, I = g->I;
    return (double)r * ((H + qd) + 2 * (H + kvd) + (qd + H) + 2 * (H + I) + (I + H)) * g->L;
}

/* Bytes one decode step must read at least: every base weight matrix once (output head
 * included; the embedding rows and the norms are too few to count), the K and V of every
 * sample over its context (ctx tokens, the mean over the measured steps), and the A and B
 * of each distinct adapter in the batch; all bf16. */
static double decode_bytes(const geo *g, int samples, double ctx, int adapters)
{
    double kv = (double)samples * ctx * g->L * g->nkv * g->d * 2;
    return 2.0 * (matmul_params(g) + kv + adapters * lora_params(g, LORA_RANK));
}

/* The peer's figure for this row: the peer.json row of the same kind, geometry, samples or
 * requests, and adapters (want_ad; a decode row of 8 adapters falls back to the peer's one
 * adapter when the peer could not mix adapters in one batch: *peer_ad says which), else
 * the issue's table. Decode: tok/s; ttft: ms; *oom when the peer ran out of memory. */
static bool peer_lookup_dec(const char *kind, const char *g, int n, int prompt, int want_ad, double *fig, int *peer_ad,
                            bool *oom, const char **src)
{
    *oom = false;
    if (peer_json) {
        json_t *best = NULL;
        size_t i;
        json_t *r;
        json_array_foreach(peer_json, i, r) {
            const char *k = json_string_value(json_object_get(r, "kind")),
                       *rg = json_string_value(json_object_get(r, "geometry"));
            if (!k || strcmp(k, kind) || !rg || strcmp(rg, g) || json_object_get(r, "error") ||
                json_integer_value(json_object_get(r, "prompt")) != prompt ||
                json_integer_value(json_object_get(r, !strcmp(kind, "decode") ? "samples" : "requests")) != n)
                continue;
            int ad = (int)json_integer_value(json_object_get(r, "adapters"));
            if (ad == want_ad) { best = r; break; }
            if (ad == 1 && want_ad > 1 && !best) best = r;
        }
        if (!best) return false;
        *fig = json_number_value(json_object_get(best, !strcmp(kind, "decode") ? "tok_s" : "ttft_ms"));
        *peer_ad = (int)json_integer_value(json_object_get(best, "adapters"));
        *oom = json_is_true(json_object_get(best, "oom"));
        *src = "peer";
        return true;
    }
    if (strcmp(kind, "decode") || want_ad < 1) return false;
    for (size_t i = 0; i < sizeof ISSUE_DECODE / sizeof ISSUE_DECODE[0]; i++)
        if (!strcmp(ISSUE_DECODE[i].geo, g) && ISSUE_DECODE[i].samples == n) {
            *fig = ISSUE_DECODE[i].tok_s;
            *peer_ad = 1;
            *src = "issue";
            return true;
        }
    return false;
}

/* nreq requests of prompt tokens each, num samples each; request i on ads[i % nad] (nad 0:
 * the base model); temperature 1, no filters, no stop tokens, so every sample runs to
 * max_tokens. Outputs sized for max_tokens up to cap. */
typedef struct {
    be_sample_req r[DEC_REQS];
    int nreq;
    int32_t *prompt, *tok;
    float *lp;
    int *n_out;
    bool *stopped;
} dec_batch;

static int dec_batch_init(dec_batch *d, bench *b, int nreq, int prompt, int num, int nad, int cap)
{
    memset(d, 0, sizeof *d);
    long S = (long)nreq * num;
    d->nreq = nreq;
    d->prompt = malloc((size_t)nreq * prompt * sizeof *d->prompt);
    d->tok = malloc((size_t)S * cap * sizeof *d->tok);
    d->lp = malloc((size_t)S * cap * sizeof *d->lp);
    d->n_out = malloc(S * sizeof *d->n_out);
    d->stopped = malloc(S * sizeof *d->stopped);
    if (!d->prompt || !d->tok || !d->lp || !d->n_out || !d->stopped) return -1;
    uint64_t x = 0x2545f4914f6cdd1dull ^ (uint64_t)prompt;
    for (long i = 0; i < (long)nreq * prompt; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        d->prompt[i] = (int32_t)(x % b->g->V);
    }
    for (int i = 0; i < nreq; i++)
        d->r[i] = (be_sample_req){.ad = nad ? b->ads[i % nad] : NULL, .n_prompt = prompt,
                                  .prompt = d->prompt + (long)i * prompt, .num_samples = num, .temperature = 1.0,
                                  .top_p = 1.0, .seed = 1000 + (uint64_t)i, .tokens_out = d->tok + (long)i * num * cap,
                                  .logprobs_out = d->lp + (long)i * num * cap, .n_out = d->n_out + (long)i * num,
                                  .stopped_out = d->stopped + (long)i * num};
    return 0;
}

static void dec_batch_free(dec_batch *d)
{
    free(d->prompt);
    free(d->tok);
    free(d->lp);
    free(d->n_out);
    free(d->stopped);
}

/* Seconds of one sample call with max_tokens each; -1 with err, also when a sample ended before max_tokens (the
 * step arithmetic assumes every sample ran every step). */
static double dec_call(bench *b, dec_batch *d, int max_tokens, char *err, size_t errlen)
{
    for (int i = 0; i < d->nreq; i++) d->r[i].max_tokens = max_tokens;
    double t0 = clock_mono_s();
    if (b->be->sample(b->ctx, d->r, d->nreq, err, errlen) != 0) return -1;
    double t = clock_mono_s() - t0;
    for (int i = 0; i < d->nreq; i++)
        for (int k = 0; k < d->r[i].num_samples; k++)
            if (d->r[i].n_out[k] != max_tokens) {
                snprintf(err, errlen, "request %d sample %d stopped after %d of %d tokens", i, k, d->r[i].n_out[k],
                         max_tokens);
                return -1;
            }
    return t;
}

static double mem_in_use(bench *b, be_device_info *di)
{
    b->be->device_info(b->ctx, di);
    return (double)(di->memory_total - di->memory_free) / 1073741824.0;
}

static void dump_rows(bench *b)
{
    if (b->json_out && json_dump_file(b->out, b->json_out, JSON_INDENT(1)) != 0)
        fprintf(stderr, "cannot write %s\n", b->json_out);
}

/* One decode row: DEC_REQS requests × DEC_PER_REQ samples on nad adapters (0: base). The
 * step time is (t(1 + steps) − t(1)) / steps: the second call does the first's prefill and
 * first pick, then `steps` decode passes of every sample. */
static void decode_row(bench *b, int nad, int steps)
{
    const geo *g = b->g;
    int S = DEC_REQS * DEC_PER_REQ;
    char err[512] = "out of host memory", shape[32];
    snprintf(shape, sizeof shape, "%dx%d", DEC_REQS, DEC_PER_REQ);
    dec_batch d;
    double t1 = -1, tn = -1;
    /* a call of one decode pass first: the plans of this row's adapter segments */
    if (dec_batch_init(&d, b, DEC_REQS, DEC_PROMPT, DEC_PER_REQ, nad, 1 + steps) == 0 &&
        dec_call(b, &d, 2, err, sizeof err) >= 0) {
        t1 = dec_call(b, &d, 1, err, sizeof err);
        if (t1 >= 0) tn = dec_call(b, &d, 1 + steps, err, sizeof err);
    }
    dec_batch_free(&d);
    be_device_info di;
    double mem = mem_in_use(b, &di), bw = hbm_bandwidth(di.device);
    json_t *jr = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:f}", "kind", "decode", "geometry", g->name,
                           "device", di.device, "requests", DEC_REQS, "samples", S, "adapters", nad, "prompt",
                           DEC_PROMPT, "steps", steps, "mem_gib", mem);
    if (tn < 0) {
        printf("%-13s decode %-6s %2d ad | failed: %s\n", g->name, shape, nad, err);
        json_object_set_new(jr, "error", json_string(err));
    } else {
        double step = (tn - t1) / steps, tok_s = S / step;
        /* decode step k (1..steps) attends over prompt + k positions */
        double ctx = DEC_PROMPT + (steps + 1) / 2.0, bytes = decode_bytes(g, S, ctx, nad);
        printf("%-13s decode %-6s %2d ad | step %7.2f ms %8.0f tok/s | ", g->name, shape, nad, 1e3 * step, tok_s);
        json_t *f = json_pack("{s:f, s:f, s:f, s:f, s:f}", "first_ms", 1e3 * t1, "step_ms", 1e3 * step, "tok_s", tok_s,
                              "bound_bytes", bytes, "bandwidth", bw);
        json_object_update(jr, f);
        json_decref(f);
        if (bw > 0) {
            double bound = bytes / bw;
            printf("bound %6.2f ms (%.2f GB at %.2f TB/s): %5.1f%% | ", 1e3 * bound, bytes / 1e9, bw / 1e12,
                   100 * bound / step);
            json_object_set_new(jr, "bound_ms", json_real(1e3 * bound));
            json_object_set_new(jr, "bound_frac", json_real(bound / step));
        } else {
            printf("bound: %.2f GB, bandwidth of this card unknown | ", bytes / 1e9);
        }
        printf("prefill+1st %7.1f ms | %5.1f GiB", 1e3 * t1, mem);
        double pf;
        int pad;
        bool oom;
        const char *src;
        if (peer_lookup_dec("decode", g->name, S, DEC_PROMPT, nad, &pf, &pad, &oom, &src)) {
            if (oom) printf(" | PEFT (%s): out of memory", src);
            else printf(" | PEFT (%s%s) %6.0f tok/s: %.2fx", src, pad != nad ? ", one adapter" : "", pf, tok_s / pf);
        }
        printf("\n");
    }
    json_array_append_new(b->out, jr);
    dump_rows(b);
}

/* Time to first token: nreq requests of TTFT_PROMPT tokens at once, one sample each,
 * max_tokens 1, request i on adapter i; the median of `calls` calls (after the warm-up). */
static void ttft_row(bench *b, int nreq, int calls)
{
    const geo *g = b->g;
    char err[512] = "out of host memory", shape[32];
    snprintf(shape, sizeof shape, "%dx%d", nreq, TTFT_PROMPT);
    dec_batch d;
    double t[16];
    int k = 0;
    if (dec_batch_init(&d, b, nreq, TTFT_PROMPT, 1, nreq < b->nads ? nreq : b->nads, 1) == 0)
        for (; k < calls && k < 16; k++)
            if ((t[k] = dec_call(b, &d, 1, err, sizeof err)) < 0) break;
    dec_batch_free(&d);
    be_device_info di;
    double mem = mem_in_use(b, &di);
    json_t *jr = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:f}", "kind", "ttft", "geometry", g->name, "device",
                           di.device, "requests", nreq, "prompt", TTFT_PROMPT, "adapters", nreq, "mem_gib", mem);
    if (k < calls) {
        printf("%-13s ttft   %-6s %2d ad | failed: %s\n", g->name, shape, nreq, err);
        json_object_set_new(jr, "error", json_string(err));
    } else {
        double ms = 1e3 * median(t, k);
        printf("%-13s ttft   %-6s %2d ad | %7.1f ms (median of %d) | %5.1f GiB", g->name, shape, nreq, ms, k, mem);
        if (nreq > 1) printf(" | %.1f ms per request", ms / nreq);
        double pf;
        int pad;
        bool oom;
        const char *src;
        if (peer_lookup_dec("ttft", g->name, nreq, TTFT_PROMPT, nreq, &pf, &pad, &oom, &src)) {
            if (oom) printf(" | PEFT (%s): out of memory", src);
            else printf(" | PEFT (%s%s) %7.1f ms: %.2fx faster", src, pad != nreq ? ", one adapter" : "", pf, pf / ms);
        }
        printf("\n");
        json_object_set_new(jr, "ttft_ms", json_real(ms));
        json_object_set_new(jr, "calls", json_integer(k));
    }
    json_array_append_new(b->out, jr);
    dump_rows(b);
}

/* Every decode and TTFT row of one geometry, after a warm-up of each shape: GEMM plans for
 * the decode's few rows, the workspace and the KV caches at the size the rows need (a
 * prompt of DEC_PROMPT + steps tokens and 2 new tokens reserves the caches for
 * DEC_PROMPT + 1 + steps positions, one decode pass, at the cost of a prefill). */
static void decode_rows(bench *b, int steps, int calls)
{
    char err[512] = "out of host memory";
    while (b->nads < DEC_REQS) {
        lora_config lc = {LORA_RANK, (uint64_t)b->nads + 1, true, true, false};
        be_adapter *a = be_adapter_new(b->be, b->ctx, &lc, false, err, sizeof err);
        if (!a) { printf("%-13s adapter %d: %s\n", b->g->name, b->nads, err); return; }
        b->ads[b->nads++] = a;
    }
    /* (requests, prompt, samples each, max_tokens) of each warm-up call */
    const int warm[][4] = {
        {DEC_REQS, DEC_PROMPT + steps, DEC_PER_REQ, 2}, {DEC_REQS, TTFT_PROMPT, 1, 1}, {1, TTFT_PROMPT, 1, 1}};
    double t0 = clock_mono_s();
    for (int w = 0; w < 3; w++) {
        dec_batch d;
        int ok = dec_batch_init(&d, b, warm[w][0], warm[w][1], warm[w][2], DEC_REQS, warm[w][3]) == 0 &&
                 dec_call(b, &d, warm[w][3], err, sizeof err) >= 0;
        dec_batch_free(&d);
        if (!ok) { printf("%-13s warm-up failed: %s\n", b->g->name, err); return; }
    }
    printf("%-13s warm-up %.1f s\n", b->g->name, clock_mono_s() - t0);
    decode_row(b, DEC_REQS, steps);
    decode_row(b, 1, steps);
    decode_row(b, 0, steps);
    ttft_row(b, 1, calls);
    ttft_row(b, DEC_REQS, calls);
}

int main(int argc, char **argv)
{
    const char *backend = "cuda", *order = DEFAULT_ORDER, *peer = NULL, *json_out = NULL;
    int device = 0, iters = 3, layers = 0, steps = 0;
    bool quick = false, decode = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) { quick = true; continue; }
        if (!strcmp(a, "--decode")) { decode = true; continue; }
        if (!v) { fprintf(stderr, "usage: see bench/cuda/bench_cuda.c\n"); return 2; }
        if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--device")) device = atoi(v);
        else if (!strcmp(a, "--geo")) order = v;
        else if (!strcmp(a, "--iters")) iters = atoi(v);
        else if (!strcmp(a, "--layers")) layers = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--peer")) peer = v;
        else if (!strcmp(a, "--json")) json_out = v;
        else { fprintf(stderr, "unknown option %s (see bench/cuda/bench_cuda.c)\n", a); return 2; }
        i++;
    }
    if (iters < 1 || iters > 16) iters = 3;
    /* the geometries asked for, in order (names checked before anything is loaded) */
    const geo *run[16];
    int nrun = 0;
    for (const char *p = order; *p && nrun < 16;) {
        size_t len = strcspn(p, ",");
        const geo *found = NULL;
        for (size_t gi = 0; gi < sizeof GEOS / sizeof GEOS[0]; gi++)
            if (strlen(GEOS[gi].name) == len && !strncmp(GEOS[gi].name, p, len)) found = &GEOS[gi];
        if (!found) {
            fprintf(stderr, "unknown geometry '%.*s' (Qwen3-0.6B, Llama-3.2-1B, Qwen3-8B)\n", (int)len, p);
            return 2;
        }
        run[nrun++] = found;
        p += len + (p[len] == ',');
    }
    if (quick) iters = 1;
    if (steps < 1 || steps > 4096) steps = quick ? QUICK_STEPS : 128;
    const be_backend *be = be_backend_find(backend);
    if (!be) { fprintf(stderr, "unknown backend '%s' (this build has: %s)\n", backend, be_backend_names()); return 2; }
    if (be->device_count() == 0) { /* like the gpu tests and the other benches */
        printf("bench_cuda: no %s device on this machine: skipped\n", backend);
        return 77;
    }
    if (peer) {
        json_error_t je;
        peer_json = json_load_file(peer, 0, &je);
        if (!json_is_array(peer_json)) { fprintf(stderr, "%s: %s\n", peer, je.text); return 2; }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    json_t *out = json_array();
    if (json_out && json_dump_file(out, json_out, 0) != 0) { fprintf(stderr, "cannot write %s\n", json_out); return 2; }
    if (decode)
        printf("bench_cuda --decode: backend %s, LoRA rank 32 on q,k,v,o,gate,up,down; %d requests x %d samples, "
               "prompt %d, temperature 1, no stop tokens;\nstep = (t(1 + %d tokens) - t(1 token)) / %d; TTFT: prompt %d, "
               "max_tokens 1, median of %d; bound = bytes a step reads at least / HBM bandwidth\n(memory = device memory "
               "in use after the row; PEFT: %s)\n", backend, DEC_REQS, DEC_PER_REQ, DEC_PROMPT, steps, steps, TTFT_PROMPT,
               quick ? 3 : 5, peer ? peer : "the issue's H100 figure");
    else
        printf("bench_cuda: backend %s, LoRA rank 32 on q,k,v,o,gate,up,down, cross_entropy over every token, median of %d\n"
               "(MFU against 989 TFLOP/s; memory = device memory in use after the row; PEFT: %s)\n", backend, iters,
               peer ? peer : "the issue's H100 table");
    for (int gi = 0; gi < nrun; gi++) {
        geo g = *run[gi];
        if (layers > 0) g.L = layers;
        char err[512];
        rand_model m;
        double t0 = clock_mono_s();
        if (rm_build(&m, &g, err, sizeof err) < 0) { printf("%s: %s\n", g.name, err); return 1; }
        be_backend_opts o = {.device = device, .threads = 0};
        void *ctx = be->create(&m.mf, &o, err, sizeof err);
        rm_free(&m);
        if (!ctx) { printf("%s: %s\n", g.name, err); return 1; }
        be_device_info di;
        be->device_info(ctx, &di);
        printf("== %s (%d layers; %.0f M matmul parameters) on %s, loaded in %.1f s\n", g.name, g.L,
               matmul_params(&g) / 1e6, di.device, clock_mono_s() - t0);
        bench b = {be, ctx, &g, {0}, 0, iters, out, json_out};
        if (decode) decode_rows(&b, steps, quick ? 3 : 5);
        for (size_t ri = 0; ri < sizeof ROWS / sizeof ROWS[0] && !decode; ri++) {
            const row *r = &ROWS[ri];
            if (strcmp(r->geo, g.name) || (quick && (long)r->batch * r->seq > 2048 && !r->cmp)) continue;
            run_row(&b, r);
        }
        for (int a = 0; a < b.nads; a++) be->adapter_free(ctx, b.ads[a]);
        be->destroy(ctx);
    }
    json_decref(out);
    json_decref(peer_json);
    return 0;
}
