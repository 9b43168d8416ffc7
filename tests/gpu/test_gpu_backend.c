/* test_gpu_backend.c — the cuda backend against the cpu backend (the numerical reference),
 * both in this process, through the backend table, on tiny generated models:
 *
 *   llama            untied head, head_dim 16
 *   qwen3            tied head, q/k norm, head_dim 32 (≠ hidden/heads)
 *   qwen2            q/k/v biases
 *   llama_rope3_mqa  llama3 RoPE scaling, one kv head (MQA)
 *   qwen3_moe        Qwen3-MoE: 8 experts, 2 per token, renormalised (cuda_moe.c against
 *                    cpu_moe.c: grouped expert GEMMs, each expert's LoRA)
 *
 * Mixture of experts: the bf16 router logits of the GPU may order two nearly equal experts
 * the other way than the CPU's fp32 ones (a routing flip), and then a token's numbers
 * differ by design. The backends' per-sequence expert counts (be_seq.expert_counts_out)
 * tell where routing agreed: sequences routed differently are left out of the output
 * checks and adapters with such a sequence out of the gradient checks (each printed),
 * as are, packed against alone, sequences the GPU itself routed differently; at least two
 * thirds of the sequences and one adapter must remain.
 *
 * The model files are bf16, so both backends hold the same weights and the differences
 * measure the CUDA backend's bf16 activations only. Per case: log-probs and every loss of
 * a packed batch over three adapters (ranks 4, 8, 2; different modules), a base-only and
 * a forward_only sequence, 2-D cross-entropy and top-k; every LoRA gradient; AdamW state
 * after optim_step (bitwise for the same gradients without clipping); the packed pass
 * against each adapter alone; forward_only and base-only rows touching no gradient;
 * run-to-run bitwise determinism. Then, on llama: sampling (T = 1 sampled log-probs
 * against forward log-probs of the same tokens; greedy against the CPU's greedy unless
 * the two best logits nearly tie; reruns bitwise), a 30-step SFT loss curve against the
 * CPU's, save/load resume bitwise; on qwen3: an F32 file gives the same bits as its bf16
 * rounding (the loader's conversion). After the dense models, on llama still: sampling's
 * prompt-pass extras (target log-probs against the CPU's, the next token's bitwise its
 * logprobs_out; draws mostly the CPU's, scored as targets their own log-probs bitwise).
 * The newest code runs last (the extras, then qwen3_moe), so that a fault there (which
 * ruins the process's CUDA context) cannot cost the dense results, and a run stopped at
 * its time limit has them.
 *
 * Tolerances (bf16 GEMM inputs, fp32 accumulation; estimated by emulating this rounding
 * on tests/ref/torch_ref.py: log-probs rel 7e-4, max |Δ| 1.6e-2; gradients 1e-2 per
 * tensor; the bars below leave 3–5× for the attention's bf16 P and the bf16 dlogits):
 *   log-probs          max |Δ| ≤ 6e-2 and ‖Δ‖/‖ref‖ ≤ 3e-3 per sequence
 *   losses             ‖Δ‖ ≤ 2e-2·‖ref‖ + 1e-2·√n per sequence
 *   top-k              log-probs by rank max |Δ| ≤ 6e-2; ids equal where the CPU's
 *                      neighbours are ≥ 0.15 apart
 *   LoRA gradients     per tensor ‖Δ‖ ≤ 5e-2·max(‖ref‖, 1e-2·‖adapter's ref‖)
 *   AdamW              p, m, v bitwise (same gradients, no clipping); with clipping rel
 *                      1e-6 (the two norms differ in the last bits); norm rel 1e-12
 *   packed vs alone    (cuda only) log-probs max |Δ| ≤ 2e-2, gradients rel 2e-2
 *   sampling           |sampled lp − forward lp| ≤ 2e-2
 *   SFT curve          |NLL_cuda − NLL_cpu| ≤ 0.05 + 0.05·NLL_cpu at every step
 * A failure prints the case, the quantity and where (sequence, loss, adapter, tensor).
 *
 * GPU_BACKEND_UNDER_TEST=cpu puts the CPU backend on both sides: every check must then
 * pass (the F32-file check is cuda's and is skipped). It tests this test without a GPU.
 * GPU_BACKEND_CASES=name,... runs only those parts, in the order above: llama, qwen3,
 * qwen2, llama_rope3_mqa, extras, qwen3_moe (e.g. the dense models in one run and the
 * mixture of experts in another, as bench/cuda/run_on_gpu.sh does).
 */
#include "tests/gpu/gt.h"

#include "backend/backend.h"
#include "model/mkmodel.h"
#include "model/model.h"

#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

/* ---- the two backends on one model ----------------------------------------------------- */

#define NAD 3

typedef struct {
    const be_backend *be;
    void *ctx;
    be_adapter *ads[NAD];
} side;

typedef struct {
    const char *name;
    model_config mc;
    side cpu, gpu;
    char dir[256]; /* the model's directory (a second context on it: check_keep) */
} pair;

typedef struct { int rank; bool attn, mlp, unembed; uint64_t seed; } ad_def;
static const ad_def ADS[NAD] = {{4, true, true, true, 11}, {8, true, false, true, 22}, {2, false, true, false, 33}};

/* A context on the model in dir; NULL with err when the backend refuses it. */
static void *try_open(const be_backend *be, const char *dir, model_config *mc, char *err, size_t errlen)
{
    model_files *mf;
    if (model_open(dir, &mf, err, errlen) < 0) { printf("FATAL model %s: %s\n", dir, err); exit(1); }
    if (mc) *mc = mf->cfg;
    be_backend_opts o = {.device = 0, .threads = 2};
    void *ctx = be->create(mf, &o, err, errlen);
    model_close(mf);
    return ctx;
}

static void *open_ctx(const be_backend *be, const char *dir, model_config *mc)
{
    char err[512];
    void *ctx = try_open(be, dir, mc, err, sizeof err);
    if (!ctx) { printf("FATAL %s backend on %s: %s\n", be->name, dir, err); exit(1); }
    return ctx;
}

static adapter_state download(const side *s, const be_adapter *a, unsigned parts)
{
    adapter_state st;
    char err[256];
    if (be_adapter_to_state(s->be, s->ctx, a, parts, &st, err, sizeof err) < 0) {
        printf("FATAL %s download: %s\n", s->be->name, err);
        exit(1);
    }
    return st;
}

static void upload(const side *s, be_adapter *a, const adapter_state *st, unsigned parts)
{
    char err[256];
    if (s->be->adapter_upload(s->ctx, a, st, parts, err, sizeof err) < 0) {
        printf("FATAL %s upload: %s\n", s->be->name, err);
        exit(1);
    }
}

/* Adapter a of the scenario on one side: PEFT's A, and B ~ N(0, 0.02²) so that every
 * LoRA gradient is nonzero (the same numbers on both sides). */
static be_adapter *make_adapter(const side *s, int a)
{
    char err[256];
    lora_config lc = {ADS[a].rank, ADS[a].seed, ADS[a].attn, ADS[a].mlp, ADS[a].unembed};
    be_adapter *ad = be_adapter_new(s->be, s->ctx, &lc, true, err, sizeof err);
    if (!ad) { printf("FATAL %s adapter: %s\n", s->be->name, err); exit(1); }
    adapter_state h = download(s, ad, ADAPTER_PARAMS);
    rng_state r;
    rng_seed(&r, ADS[a].seed * 7919 + 1);
    for (int t = 1; t < h.layout.num_tensors; t += 2) {
        const lora_tensor *lt = &h.layout.tensors[t];
        for (long k = 0; k < (long)lt->rows * lt->cols; k++) h.params[lt->offset + k] = (float)(0.02 * rng_normal(&r));
    }
    upload(s, ad, &h, ADAPTER_PARAMS);
    adapter_state_free(&h);
    return ad;
}

static void zero_grads(const side *s, be_adapter *a)
{
    adapter_state z = {.layout = a->layout}; /* NULL arrays upload zeros */
    upload(s, a, &z, ADAPTER_GRADS);
}

static char tmpdir[64];

static void write_model(const char *sub, const char *arch, bool llama3, int kv_heads, int max_pos, bool bf16,
                        char *dir, size_t dlen)
{
    char err[512];
    mkmodel_opts o;
    if (mkmodel_defaults(&o, arch, "tiny", err, sizeof err) != 0) { printf("FATAL %s\n", err); exit(1); }
    snprintf(dir, dlen, "%s/%s", tmpdir, sub);
    o.out_dir = dir;
    o.init_std = 0.1; /* 0.02 makes attention nearly uniform in a 64-wide model */
    o.seed = 7;
    o.bf16 = bf16;
    o.rope_llama3 = llama3;
    if (kv_heads) o.kv_heads = kv_heads;
    if (max_pos) o.max_pos = max_pos;
    if (mkmodel_write(&o, err, sizeof err) != 0) { printf("FATAL mkmodel: %s\n", err); exit(1); }
}

/* ---- the scenario batch ------------------------------------------------------------------ */

typedef struct { int ad; loss_kind kind; int n; bool weights, fwd_only; int k, topk; } seq_def;
static const seq_def SEQS[] = {
    {0, LOSS_CROSS_ENTROPY, 7, true, false, 0, 0},
    {1, LOSS_IMPORTANCE_SAMPLING, 13, false, false, 0, 0},
    {0, LOSS_PPO, 1, false, false, 0, 0},
    {2, LOSS_CISPO, 20, false, false, 0, 0},
    {1, LOSS_DRO, 5, false, false, 0, 0},
    {-1, LOSS_CROSS_ENTROPY, 9, true, false, 0, 5},       /* base model only, top-5 */
    {0, LOSS_CROSS_ENTROPY, 150, false, false, 0, 0},     /* three attention tiles */
    {2, LOSS_PPO, 11, false, false, 0, 0},
    {0, LOSS_CROSS_ENTROPY, 6, true, true, 0, 3},         /* forward_only, top-3 */
    {1, LOSS_CROSS_ENTROPY, 3, true, false, 0, 0},
    {0, LOSS_CISPO, 17, false, false, 0, 0},
    {2, LOSS_IMPORTANCE_SAMPLING, 8, false, false, 0, 0},
    {0, LOSS_DRO, 12, false, false, 0, 0},
    {1, LOSS_CROSS_ENTROPY, 9, true, false, 3, 0},        /* 2-D targets */
    {2, LOSS_CROSS_ENTROPY, 66, false, false, 0, 0},      /* one past a tile */
};
#define NSEQ ((int)(sizeof SEQS / sizeof SEQS[0]))
#define KOF(i) (SEQS[i].k > 1 ? SEQS[i].k : 1)

typedef struct {
    int32_t *tok[NSEQ], *tgt[NSEQ];
    float *w[NSEQ], *q[NSEQ], *adv[NSEQ];
} inputs;

typedef struct {
    be_seq s[NSEQ];
    int idx[NSEQ]; /* SEQS index of s[k] */
    int n;
    float *lp[NSEQ], *loss[NSEQ], *tlp[NSEQ];
    int32_t *tid[NSEQ];
    int32_t *cnt[NSEQ]; /* MoE models: each sequence's expert counts */
} batch;

static int g_ncnt; /* the current model's sparse layers × experts (0: dense) */

/* Whether sequence k of a and b (the same sequences) were routed to the same experts. */
static bool same_routing(const batch *a, const batch *b, int k)
{
    return !g_ncnt || !memcmp(a->cnt[k], b->cnt[k], (size_t)g_ncnt * sizeof(int32_t));
}

static void make_inputs(inputs *in, int V)
{
    rng_state r;
    rng_seed(&r, 4242);
    for (int i = 0; i < NSEQ; i++) {
        int n = SEQS[i].n, K = KOF(i);
        in->tok[i] = malloc(n * sizeof(int32_t));
        in->tgt[i] = malloc((size_t)n * K * sizeof(int32_t));
        in->w[i] = malloc((size_t)n * K * sizeof(float));
        in->q[i] = calloc(n, sizeof(float));
        in->adv[i] = calloc(n, sizeof(float));
        for (int t = 0; t < n; t++) in->tok[i][t] = (int32_t)(rng_next(&r) % V);
        for (int t = 0; t < n * K; t++) {
            in->tgt[i][t] = (int32_t)(rng_next(&r) % V);
            in->w[i][t] = rng_uniform(&r) < 0.15 ? 0.0f : (float)rng_normal(&r); /* zero and negative */
        }
    }
}

/* The scenario on side s (only_ad ≥ 0: that adapter's sequences alone; kinds: CE for all
 * when ce_only, to get the log-probs the RL inputs are drawn around). */
static void make_batch(batch *b, const side *s, be_adapter *const *ads, const inputs *in, int only_ad, bool ce_only)
{
    memset(b, 0, sizeof *b);
    for (int i = 0; i < NSEQ; i++) {
        const seq_def *d = &SEQS[i];
        if (only_ad >= 0 && d->ad != only_ad) continue;
        int n = d->n, K = KOF(i), k = b->n++;
        be_seq *q = &b->s[k];
        b->idx[k] = i;
        b->lp[k] = calloc((size_t)n * K, sizeof(float));
        b->loss[k] = calloc(n, sizeof(float));
        *q = (be_seq){.ad = d->ad >= 0 ? ads[d->ad] : NULL, .loss = loss_spec_default(ce_only ? LOSS_CROSS_ENTROPY : d->kind),
                       .n = n, .tokens = in->tok[i], .targets = in->tgt[i], .weights = d->weights ? in->w[i] : NULL,
                       .sampler_logprobs = in->q[i], .advantages = in->adv[i], .logprobs_out = b->lp[k],
                       .loss_out = b->loss[k], .forward_only = d->fwd_only, .k = d->k, .topk = d->topk};
        if (g_ncnt) q->expert_counts_out = b->cnt[k] = calloc(g_ncnt, sizeof(int32_t));
        if (d->topk) {
            b->tid[k] = calloc((size_t)n * d->topk, sizeof(int32_t));
            b->tlp[k] = calloc((size_t)n * d->topk, sizeof(float));
            q->topk_ids_out = b->tid[k];
            q->topk_lp_out = b->tlp[k];
        }
    }
    (void)s;
}

static void free_batch(batch *b)
{
    for (int k = 0; k < b->n; k++) {
        free(b->lp[k]); free(b->loss[k]); free(b->tid[k]); free(b->tlp[k]); free(b->cnt[k]);
    }
}

static void run(const side *s, batch *b, bool backward)
{
    char err[512];
    if (s->be->forward_backward(s->ctx, b->s, b->n, backward, err, sizeof err) != 0) {
        printf("FATAL %s forward_backward: %s\n", s->be->name, err);
        exit(1);
    }
}

/* RL inputs drawn around the CPU's log-probs: q = lp + N(0, 0.3²), A ~ N(0, 1) with the
 * first two positions masked (A = 0; q = −1000 at position 0: the mask must hold). */
static void fill_rl(inputs *in, const batch *ce)
{
    rng_state r;
    rng_seed(&r, 777);
    for (int k = 0; k < ce->n; k++) {
        int i = ce->idx[k], n = SEQS[i].n;
        for (int t = 0; t < n; t++) {
            in->q[i][t] = ce->lp[k][t * KOF(i)] + (float)(0.3 * rng_normal(&r));
            in->adv[i][t] = t < 2 && n > 2 ? 0.0f : (float)rng_normal(&r);
            if (t == 0 && n > 2) in->q[i][t] = -1000.0f;
        }
    }
}

/* ---- comparisons ------------------------------------------------------------------------ */

static double l2(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) { double d = b ? (double)a[i] - b[i] : a[i]; s += d * d; }
    return sqrt(s);
}

/* max |got − ref| and where; a non-finite got counts as infinite */
static double max_abs(const float *got, const float *ref, size_t n, size_t *at)
{
    double m = 0;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double d = isfinite(got[i]) ? fabs((double)got[i] - ref[i]) : INFINITY;
        if (d > m) { m = d; *at = i; }
    }
    return m;
}

static const char *loss_name(int i) { return loss_kind_name(SEQS[i].kind); }

static void cmp_outputs(const char *cs, const batch *g, const batch *c)
{
    int rerouted = 0;
    for (int k = 0; k < c->n; k++) {
        int i = c->idx[k], n = SEQS[i].n, K = KOF(i);
        size_t at;
        if (!same_routing(g, c, k)) {
            printf("  %s seq %d (adapter %d, %d tokens): routed to other experts than on the CPU, not compared\n", cs, i,
                   SEQS[i].ad, n);
            rerouted++;
            continue;
        }
        double m = max_abs(g->lp[k], c->lp[k], (size_t)n * K, &at);
        double rel = l2(g->lp[k], c->lp[k], (size_t)n * K) / fmax(l2(c->lp[k], NULL, (size_t)n * K), 1e-30);
        gt_check(m <= 6e-2 && rel <= 3e-3,
                 "%s logprobs seq %d (%s, adapter %d, %d tokens%s): max |d| %.2e at position %zu (cuda %.6f cpu %.6f), "
                 "rel %.2e", cs, i, loss_name(i), SEQS[i].ad, n, K > 1 ? ", 2-D" : "", m, at / K, g->lp[k][at],
                 c->lp[k][at], rel);
        double dl = l2(g->loss[k], c->loss[k], n), rl = l2(c->loss[k], NULL, n);
        m = max_abs(g->loss[k], c->loss[k], n, &at);
        gt_check(dl <= 2e-2 * rl + 1e-2 * sqrt(n), "%s loss seq %d (%s, adapter %d): ||d|| %.2e vs ||cpu|| %.2e; worst "
                 "position %zu: cuda %.6g cpu %.6g", cs, i, loss_name(i), SEQS[i].ad, dl, rl, at, g->loss[k][at],
                 c->loss[k][at]);
        int tk = SEQS[i].topk;
        if (!tk) continue;
        int bad_ids = 0;
        double worst = 0;
        for (int t = 0; t < n; t++) {
            const float *cl = c->tlp[k] + (long)t * tk, *gl = g->tlp[k] + (long)t * tk;
            for (int j = 0; j < tk; j++) {
                worst = fmax(worst, isfinite(gl[j]) ? fabs(gl[j] - cl[j]) : INFINITY);
                bool apart = (j == 0 || cl[j - 1] - cl[j] >= 0.15) && (j == tk - 1 || cl[j] - cl[j + 1] >= 0.15);
                if (apart && g->tid[k][(long)t * tk + j] != c->tid[k][(long)t * tk + j]) bad_ids++;
            }
        }
        gt_check(worst <= 6e-2 && bad_ids == 0, "%s top-%d seq %d: log-probs by rank max |d| %.2e, %d well-separated ids "
                 "differ", cs, tk, i, worst, bad_ids);
    }
    if (g_ncnt)
        gt_check(3 * rerouted <= c->n, "%s: %d of %d sequences routed as on the CPU (at least two thirds)", cs,
                 c->n - rerouted, c->n);
}

/* Whether adapter a's gradient can be compared: every sequence it trains on was routed as
 * on the CPU. */
static bool grads_comparable(const batch *g, const batch *c, int a)
{
    for (int k = 0; k < c->n; k++)
        if (SEQS[c->idx[k]].ad == a && !SEQS[c->idx[k]].fwd_only && !same_routing(g, c, k)) return false;
    return true;
}

/* Every LoRA gradient tensor of adapter a: cuda against cpu. */
static void cmp_grads(const char *cs, const char *what, int a, const adapter_state *g, const adapter_state *c, double tol)
{
    double all = l2(c->grads, NULL, c->layout.num_params), worst = 0;
    int wt = 0;
    for (int t = 0; t < c->layout.num_tensors; t++) {
        const lora_tensor *lt = &c->layout.tensors[t];
        size_t n = (size_t)lt->rows * lt->cols;
        double d = l2(g->grads + lt->offset, c->grads + lt->offset, n);
        double r = d / fmax(l2(c->grads + lt->offset, NULL, n), 1e-2 * all);
        if (!(r <= worst)) { worst = r; wt = t; }
    }
    double glob = l2(g->grads, c->grads, c->layout.num_params) / fmax(all, 1e-30);
    gt_check(all > 0 && worst <= tol, "%s %s adapter %d (rank %d): worst tensor %s rel %.2e (tol %.0e); all %zu "
             "params rel %.2e; ||cpu grad|| %.3g", cs, what, a, ADS[a].rank, c->layout.tensors[wt].name, worst, tol,
             c->layout.num_params, glob, all);
}

static bool same_bits(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* A second context of the GPU side on the same model with the environment variable `var`
 * (read at context creation) set to value, restored after. */
static side open_with(const pair *p, const char *var, const char *value)
{
    const char *was = getenv(var);
    char prev[32];
    snprintf(prev, sizeof prev, "%s", was ? was : "");
    setenv(var, value, 1);
    side o = {p->gpu.be, open_ctx(p->gpu.be, p->dir, NULL), {0}};
    if (was) setenv(var, prev, 1);
    else unsetenv(var);
    return o;
}

/* ... with the switch `var` flipped: on_default, whether it is on when unset (LCU_KEEP_ACT,
 * LCU_DECODE_GRAPH) or off; *on_here: whether it is on in the first. */
static bool switch_on(const char *var, bool on_default)
{
    const char *was = getenv(var);
    return was && *was ? strcmp(was, "0") != 0 : on_default;
}

static side open_flipped(const pair *p, const char *var, bool on_default, bool *on_here)
{
    *on_here = switch_on(var, on_default);
    return open_with(p, var, *on_here ? "0" : "1");
}

/* Kept activations (LCU_KEEP_ACT, a dense model on cuda) against the backward's recompute:
 * a second context with the switch flipped runs the same pass from the same adapters and
 * must give the same log-probs, losses and gradients, bit for bit (the kept tensors are
 * what the recompute produces); so must a third that keeps the first layer only
 * (LCU_KEEP_LAYERS=1: what a batch larger than the memory's slots runs, some layers kept
 * and the rest recomputed). ref, gref: this context's pass and gradients. */
static bool keep_same(side *o, const inputs *in, const batch *ref, const adapter_state *gref)
{
    for (int a = 0; a < NAD; a++) o->ads[a] = make_adapter(o, a);
    batch b;
    make_batch(&b, o, o->ads, in, -1, false);
    run(o, &b, true);
    bool same = true;
    for (int k = 0; k < b.n; k++) {
        int i = b.idx[k];
        same &= same_bits(b.lp[k], ref->lp[k], (size_t)SEQS[i].n * KOF(i) * 4) &&
                same_bits(b.loss[k], ref->loss[k], (size_t)SEQS[i].n * 4);
    }
    for (int a = 0; a < NAD; a++) {
        adapter_state g = download(o, o->ads[a], ADAPTER_GRADS);
        same &= same_bits(g.grads, gref[a].grads, g.layout.num_params * 4);
        adapter_state_free(&g);
        o->be->adapter_free(o->ctx, o->ads[a]);
    }
    free_batch(&b);
    o->be->destroy(o->ctx);
    return same;
}

static void check_keep(pair *p, const inputs *in, const batch *ref, const adapter_state *gref)
{
    bool kept_here;
    side o = open_flipped(p, "LCU_KEEP_ACT", true, &kept_here);
    gt_check(keep_same(&o, in, ref, gref), "%s: kept activations (LCU_KEEP_ACT) and the backward's recompute "
             "(LCU_KEEP_ACT=0) give the same log-probs, losses and gradients, bitwise (kept in the %s context)",
             p->name, kept_here ? "first" : "second");
    if (p->mc.num_hidden_layers < 2) return;
    const char *was = getenv("LCU_KEEP_ACT");
    char prev[32];
    snprintf(prev, sizeof prev, "%s", was ? was : "");
    setenv("LCU_KEEP_ACT", "1", 1);
    side o1 = open_with(p, "LCU_KEEP_LAYERS", "1");
    if (was) setenv("LCU_KEEP_ACT", prev, 1);
    else unsetenv("LCU_KEEP_ACT");
    gt_check(keep_same(&o1, in, ref, gref), "%s: the first layer's activations kept and the other %d layers' "
             "recomputed (LCU_KEEP_LAYERS=1) give the same log-probs, losses and gradients, bitwise", p->name,
             p->mc.num_hidden_layers - 1);
}

/* LCU_LORA_FIRST (on by default since the fifth window: the LoRA written first and the base
 * GEMM adding into it wherever the segments cover the pass's rows) against the other order:
 * adapter 0's sequences alone (so that they do) run in a context with the switch flipped and
 * in this one, on LoRA version 1 (auto: one segment) and again on version 3 (LCU_LORA=sgmv3,
 * read per call: its writing expand): the same sums in another order, so log-probs within
 * 2e-2 and gradients within 2e-2 relative, as packed vs alone. */
static void check_lora_first(pair *p, const inputs *in)
{
    bool first_here;
    side o = open_flipped(p, "LCU_LORA_FIRST", true, &first_here);
    const char *flip = first_here ? "LCU_LORA_FIRST=0" : "LCU_LORA_FIRST=1";
    const char *was = getenv("LCU_LORA");
    char prev[32];
    snprintf(prev, sizeof prev, "%s", was ? was : "");
    for (int v3 = 0; v3 < 2; v3++) {
        if (v3) setenv("LCU_LORA", "sgmv3", 1);
        be_adapter *ao[NAD], *ad[NAD];
        for (int j = 0; j < NAD; j++) {
            ao[j] = make_adapter(&o, j);
            ad[j] = make_adapter(&p->gpu, j);
        }
        batch bo, bd;
        make_batch(&bo, &o, ao, in, 0, false);
        make_batch(&bd, &p->gpu, ad, in, 0, false);
        run(&o, &bo, true);
        run(&p->gpu, &bd, true);
        double wl = 0;
        bool bits = true;
        for (int k = 0; k < bo.n; k++) {
            size_t at, n = (size_t)SEQS[bo.idx[k]].n * KOF(bo.idx[k]);
            wl = fmax(wl, max_abs(bo.lp[k], bd.lp[k], n, &at));
            bits &= same_bits(bo.lp[k], bd.lp[k], n * 4);
        }
        adapter_state go = download(&o, ao[0], ADAPTER_GRADS), gd = download(&p->gpu, ad[0], ADAPTER_GRADS);
        size_t np = gd.layout.num_params;
        double rel = l2(go.grads, gd.grads, np) / fmax(l2(gd.grads, NULL, np), 1e-30);
        const char *lv = v3 ? "LoRA version 3" : "LoRA version 1";
        gt_check(bo.n > 0 && wl <= 2e-2 && rel <= 2e-2, "%s: %s (the LoRA first and the GEMM adding into it, or "
                 "the other order) vs here, %s, adapter 0's %d sequences: log-probs max |d| %.2e, gradients rel %.2e",
                 p->name, flip, lv, bo.n, wl, rel);
        printf("  %s %s vs here (%s): %s (log-probs max |d| %.2e, gradients rel %.2e)\n", p->name, flip, lv,
               bits && rel == 0 ? "bitwise equal" : "within rounding", wl, rel);
        adapter_state_free(&go);
        adapter_state_free(&gd);
        free_batch(&bo);
        free_batch(&bd);
        for (int j = 0; j < NAD; j++) {
            o.be->adapter_free(o.ctx, ao[j]);
            p->gpu.be->adapter_free(p->gpu.ctx, ad[j]);
        }
    }
    if (was) setenv("LCU_LORA", prev, 1);
    else unsetenv("LCU_LORA");
    o.be->destroy(o.ctx);
}

/* LCU_DEVICE_MB (cuda): a second context behaves as a card of that size: it reports that
 * total, takes the rest of the device while it lives (the first context sees it gone),
 * still loads, allocates and frees an adapter, and gives the memory back when destroyed;
 * what it cannot be is refused with the variable's name. */
static void check_device_mb(pair *p)
{
    const be_backend *be = p->gpu.be;
    be_device_info d0, d1, d2, dc;
    be->device_info(p->gpu.ctx, &d0);
    size_t used = d0.memory_total - d0.memory_free, cap_mb = (used >> 20) + 2048, cap = cap_mb << 20;
    if (cap + ((size_t)1 << 30) > d0.memory_total) {
        printf("  LCU_DEVICE_MB: not checked (a %.1f GiB card, %.1f GiB in use)\n", d0.memory_total / 1073741824.0,
               used / 1073741824.0);
        return;
    }
    const char *was = getenv("LCU_DEVICE_MB");
    char prev[32], v[32], err[512] = "";
    snprintf(prev, sizeof prev, "%s", was ? was : "");
    snprintf(v, sizeof v, "%zu", cap_mb);
    setenv("LCU_DEVICE_MB", v, 1);
    void *ctx = try_open(be, p->dir, NULL, err, sizeof err);
    gt_check(ctx != NULL, "LCU_DEVICE_MB=%s: a context opens (%s)", v, ctx ? "ok" : err);
    if (ctx) {
        be->device_info(ctx, &dc);
        be->device_info(p->gpu.ctx, &d1);
        gt_check(dc.memory_total == cap && dc.memory_free < cap, "LCU_DEVICE_MB=%s: it reports a %.2f GiB card, %.2f GiB free",
                 v, dc.memory_total / 1073741824.0, dc.memory_free / 1073741824.0);
        gt_check(d0.memory_free - d1.memory_free >= d0.memory_total - cap,
                 "LCU_DEVICE_MB=%s: it holds the rest of the device (free memory %.2f -> %.2f GiB)", v,
                 d0.memory_free / 1073741824.0, d1.memory_free / 1073741824.0);
        side o = {be, ctx, {0}};
        be_adapter *a = make_adapter(&o, 0); /* exits on failure */
        be->adapter_free(ctx, a);
        be->destroy(ctx);
        be->device_info(p->gpu.ctx, &d2);
        gt_check(d2.memory_free + ((size_t)64 << 20) >= d0.memory_free,
                 "LCU_DEVICE_MB=%s: destroying the context gives the memory back (free %.2f GiB, %.2f before)", v,
                 d2.memory_free / 1073741824.0, d0.memory_free / 1073741824.0);
    }
    static const struct { const char *value, *says; } bad[] = {{"12abc", "is not a size in MiB"},
                                                                {"1", "cannot hold back"}};
    for (int i = 0; i < 2; i++) {
        setenv("LCU_DEVICE_MB", bad[i].value, 1);
        err[0] = 0;
        ctx = try_open(be, p->dir, NULL, err, sizeof err);
        gt_check(!ctx && strstr(err, "LCU_DEVICE_MB") && strstr(err, bad[i].says), "LCU_DEVICE_MB=%s is refused: %s",
                 bad[i].value, ctx ? "(opened)" : err);
        if (ctx) be->destroy(ctx);
    }
    if (was) setenv("LCU_DEVICE_MB", prev, 1);
    else unsetenv("LCU_DEVICE_MB");
}

/* ---- per model: outputs, gradients, AdamW, packing, determinism ------------------------ */

static void check_case(pair *p)
{
    const char *cs = p->name;
    int V = p->mc.vocab_size;
    for (int a = 0; a < NAD; a++) {
        p->cpu.ads[a] = make_adapter(&p->cpu, a);
        p->gpu.ads[a] = make_adapter(&p->gpu, a);
    }
    inputs in;
    make_inputs(&in, V);
    batch bc, bg;
    make_batch(&bc, &p->cpu, p->cpu.ads, &in, -1, true);
    run(&p->cpu, &bc, false);
    fill_rl(&in, &bc);
    free_batch(&bc);

    /* forward, then forward_backward: outputs and gradients against the CPU */
    make_batch(&bc, &p->cpu, p->cpu.ads, &in, -1, false);
    make_batch(&bg, &p->gpu, p->gpu.ads, &in, -1, false);
    run(&p->gpu, &bg, false);
    batch bg2;
    make_batch(&bg2, &p->gpu, p->gpu.ads, &in, -1, false);
    run(&p->cpu, &bc, true);
    run(&p->gpu, &bg2, true);
    cmp_outputs(cs, &bg2, &bc);
    bool fwd_same = true;
    for (int k = 0; k < bg.n; k++) {
        int i = bg.idx[k];
        fwd_same &= same_bits(bg.lp[k], bg2.lp[k], (size_t)SEQS[i].n * KOF(i) * 4) &&
                    same_bits(bg.loss[k], bg2.loss[k], (size_t)SEQS[i].n * 4);
    }
    gt_check(fwd_same, "%s: forward and forward_backward give the same log-probs and losses, bitwise", cs);
    adapter_state gc[NAD], gg[NAD];
    int compared = 0;
    for (int a = 0; a < NAD; a++) {
        gc[a] = download(&p->cpu, p->cpu.ads[a], ADAPTER_GRADS);
        gg[a] = download(&p->gpu, p->gpu.ads[a], ADAPTER_GRADS);
        if (!grads_comparable(&bg2, &bc, a)) {
            printf("  %s adapter %d: a sequence was routed to other experts than on the CPU: gradients not compared\n",
                   cs, a);
            continue;
        }
        cmp_grads(cs, "LoRA gradients", a, &gg[a], &gc[a], 5e-2);
        compared++;
    }
    gt_check(compared >= 1, "%s: the gradients of %d adapters compared", cs, compared);

    /* determinism: the same pass again from zero gradients, bitwise */
    for (int a = 0; a < NAD; a++) zero_grads(&p->gpu, p->gpu.ads[a]);
    batch bg3;
    make_batch(&bg3, &p->gpu, p->gpu.ads, &in, -1, false);
    run(&p->gpu, &bg3, true);
    bool det = true;
    for (int k = 0; k < bg3.n; k++) {
        int i = bg3.idx[k];
        det &= same_bits(bg3.lp[k], bg2.lp[k], (size_t)SEQS[i].n * KOF(i) * 4) &&
               same_bits(bg3.loss[k], bg2.loss[k], (size_t)SEQS[i].n * 4);
    }
    for (int a = 0; a < NAD; a++) {
        adapter_state g = download(&p->gpu, p->gpu.ads[a], ADAPTER_GRADS);
        det &= same_bits(g.grads, gg[a].grads, g.layout.num_params * 4);
        adapter_state_free(&g);
    }
    gt_check(det, "%s: a rerun gives the same log-probs, losses and gradients, bitwise", cs);
    free_batch(&bg3);
    if (g_ncnt == 0 && strcmp(p->gpu.be->name, "cuda") == 0) {
        check_keep(p, &in, &bg2, gg);
        check_lora_first(p, &in);
    }

    /* forward_only and base-only rows in a backward pass touch no gradient */
    for (int a = 0; a < NAD; a++) zero_grads(&p->gpu, p->gpu.ads[a]);
    batch fo;
    make_batch(&fo, &p->gpu, p->gpu.ads, &in, -1, false);
    int m = 0;
    for (int k = 0; k < fo.n; k++)
        if (SEQS[fo.idx[k]].fwd_only || SEQS[fo.idx[k]].ad < 0) fo.s[m++] = fo.s[k];
    int keep = fo.n;
    fo.n = m;
    run(&p->gpu, &fo, true);
    fo.n = keep;
    double gsum = 0;
    for (int a = 0; a < NAD; a++) {
        adapter_state g = download(&p->gpu, p->gpu.ads[a], ADAPTER_GRADS);
        gsum += l2(g.grads, NULL, g.layout.num_params);
        adapter_state_free(&g);
    }
    gt_check(m == 2 && gsum == 0, "%s: forward_only and base-only sequences in a backward pass write no gradient "
             "(||g|| %g)", cs, gsum);
    free_batch(&fo);

    /* packed against each adapter alone (cuda), from the same initial state */
    for (int a = 0; a < NAD; a++) {
        be_adapter *solo[NAD];
        for (int j = 0; j < NAD; j++) solo[j] = make_adapter(&p->gpu, j);
        batch sb;
        make_batch(&sb, &p->gpu, solo, &in, a, false);
        run(&p->gpu, &sb, true);
        double wl = 0;
        bool bits = true, rerouted = false;
        for (int k = 0; k < sb.n; k++) {
            int i = sb.idx[k];
            for (int kk = 0; kk < bg2.n; kk++)
                if (bg2.idx[kk] == i) {
                    size_t at, n = (size_t)SEQS[i].n * KOF(i);
                    if (g_ncnt && memcmp(sb.cnt[k], bg2.cnt[kk], (size_t)g_ncnt * sizeof(int32_t))) {
                        rerouted = true; /* the GPU's own GEMMs of other shapes moved a near tie */
                        continue;
                    }
                    wl = fmax(wl, max_abs(sb.lp[k], bg2.lp[kk], n, &at));
                    bits &= same_bits(sb.lp[k], bg2.lp[kk], n * 4);
                }
        }
        adapter_state g = download(&p->gpu, solo[a], ADAPTER_GRADS);
        double rel = l2(g.grads, gg[a].grads, g.layout.num_params) / fmax(l2(gg[a].grads, NULL, g.layout.num_params), 1e-30);
        bits &= same_bits(g.grads, gg[a].grads, g.layout.num_params * 4);
        if (rerouted) {
            printf("  %s adapter %d alone vs packed (cuda): a sequence routed differently, gradients not compared\n", cs,
                   a);
            rel = 0;
            bits = false;
        }
        gt_check(wl <= 2e-2 && rel <= 2e-2, "%s adapter %d alone vs packed (cuda): log-probs max |d| %.2e, gradients rel "
                 "%.2e", cs, a, wl, rel);
        printf("  %s adapter %d alone vs packed (cuda): %s (log-probs max |d| %.2e, gradients rel %.2e)\n", cs, a,
               bits ? "bitwise equal" : "within rounding", wl, rel);
        adapter_state_free(&g);
        free_batch(&sb);
        for (int j = 0; j < NAD; j++) p->gpu.be->adapter_free(p->gpu.ctx, solo[j]);
    }

    /* AdamW: the CPU's gradients on both sides; no clipping: bitwise; clipping: 1e-6 */
    char err[256];
    for (int a = 0; a < NAD; a++) {
        adapter_state st = download(&p->cpu, p->cpu.ads[a], ADAPTER_PARAMS | ADAPTER_GRADS | ADAPTER_OPTIM);
        upload(&p->gpu, p->gpu.ads[a], &st, ADAPTER_PARAMS | ADAPTER_GRADS | ADAPTER_OPTIM);
        for (int step = 0; step < 2; step++) {
            if (step) { /* a second gradient, the same on both sides */
                for (size_t k = 0; k < st.layout.num_params; k++) st.grads[k] = gc[a].grads[(k * 7) % st.layout.num_params];
                upload(&p->cpu, p->cpu.ads[a], &st, ADAPTER_GRADS);
                upload(&p->gpu, p->gpu.ads[a], &st, ADAPTER_GRADS);
            }
            double nc = 0, ng = 0;
            adam_params hp = {1e-3, 0.9, 0.95, 1e-8, step ? 0.1 : 0.0, 0.0};
            if (step) hp.grad_clip_norm = 0.5 * adamw_grad_norm(st.grads, st.layout.num_params); /* clipping */
            int rc = p->cpu.be->optim_step(p->cpu.ctx, p->cpu.ads[a], &hp, &nc, err, sizeof err);
            rc |= p->gpu.be->optim_step(p->gpu.ctx, p->gpu.ads[a], &hp, &ng, err, sizeof err);
            adapter_state sc = download(&p->cpu, p->cpu.ads[a], ADAPTER_PARAMS | ADAPTER_OPTIM);
            adapter_state sg = download(&p->gpu, p->gpu.ads[a], ADAPTER_PARAMS | ADAPTER_OPTIM);
            size_t nb = sc.layout.num_params * 4;
            double coef_c = adamw_clip_coef(nc, hp.grad_clip_norm), coef_g = adamw_clip_coef(ng, hp.grad_clip_norm);
            gt_check(rc == 0 && fabs(ng - nc) <= 1e-12 * nc && sg.step == sc.step, "%s adapter %d AdamW step %d: "
                     "gradient norm cuda %.17g cpu %.17g, steps %lld/%lld", cs, a, step, ng, nc, (long long)sg.step,
                     (long long)sc.step);
            if (coef_c == coef_g) {
                gt_check(same_bits(sg.params, sc.params, nb) && same_bits(sg.m, sc.m, nb) && same_bits(sg.v, sc.v, nb),
                         "%s adapter %d AdamW step %d (clip coefficient %.17g): p, m, v bitwise equal to the CPU's", cs,
                         a, step, coef_c);
            } else {
                double e = l2(sg.params, sc.params, sc.layout.num_params) / l2(sc.params, NULL, sc.layout.num_params);
                double em = l2(sg.m, sc.m, sc.layout.num_params) / fmax(l2(sc.m, NULL, sc.layout.num_params), 1e-30);
                gt_check(e <= 1e-6 && em <= 1e-6, "%s adapter %d AdamW step %d (clip coefficients differ in the last "
                         "bits): p rel %.2e, m rel %.2e", cs, a, step, e, em);
            }
            adapter_state_free(&sc);
            adapter_state_free(&sg);
        }
        adapter_state_free(&st);
    }

    for (int a = 0; a < NAD; a++) {
        adapter_state_free(&gc[a]);
        adapter_state_free(&gg[a]);
        p->cpu.be->adapter_free(p->cpu.ctx, p->cpu.ads[a]);
        p->gpu.be->adapter_free(p->gpu.ctx, p->gpu.ads[a]);
    }
    free_batch(&bc);
    free_batch(&bg);
    free_batch(&bg2);
    for (int i = 0; i < NSEQ; i++) { free(in.tok[i]); free(in.tgt[i]); free(in.w[i]); free(in.q[i]); free(in.adv[i]); }
}

/* ---- sampling ------------------------------------------------------------------------------ */

enum { SMAX = 12, SN = 3 };

typedef struct {
    be_sample_req r;
    int32_t prompt[64], tok[SN * SMAX];
    float lp[SN * SMAX];
    int n[SN];
    bool stopped[SN];
} sreq;

static void sreq_init(sreq *q, be_adapter *ad, int n_prompt, int ns, double temp, uint64_t seed, int V)
{
    memset(q, 0, sizeof *q);
    rng_state r;
    rng_seed(&r, seed * 31 + n_prompt);
    for (int i = 0; i < n_prompt; i++) q->prompt[i] = (int32_t)(rng_next(&r) % V);
    q->r = (be_sample_req){.ad = ad, .n_prompt = n_prompt, .prompt = q->prompt, .num_samples = ns, .max_tokens = SMAX,
                            .temperature = temp, .top_k = -1, .top_p = 1.0, .seed = seed, .tokens_out = q->tok,
                            .logprobs_out = q->lp, .n_out = q->n, .stopped_out = q->stopped};
}

/* g[0..n) = q's requests again, into g's own arrays, the adapted ones on ad (another
 * context's copy of their adapter). */
static void copy_reqs(sreq *g, const sreq *q, int n, be_adapter *ad)
{
    for (int r = 0; r < n; r++) {
        g[r] = q[r];
        g[r].r.ad = q[r].r.ad ? ad : NULL;
        g[r].r.prompt = g[r].prompt;
        g[r].r.tokens_out = g[r].tok;
        g[r].r.logprobs_out = g[r].lp;
        g[r].r.n_out = g[r].n;
        g[r].r.stopped_out = g[r].stopped;
    }
}

static void do_sample(const side *s, sreq *q, int nq)
{
    be_sample_req rs[4];
    char err[512];
    for (int i = 0; i < nq; i++) rs[i] = q[i].r;
    if (s->be->sample(s->ctx, rs, nq, err, sizeof err) != 0) { printf("FATAL %s sample: %s\n", s->be->name, err); exit(1); }
}

/* Forward log-probs (and, with gap, the gap between the two best logits) of prompt +
 * completion at the completion's positions. */
static void forward_lp(const side *s, const sreq *q, int i, float *lp_out, float *gap)
{
    const be_sample_req *r = &q->r;
    int n = r->n_prompt + r->n_out[i] - 1;
    int32_t seq[64 + SMAX];
    memcpy(seq, r->prompt, r->n_prompt * 4);
    memcpy(seq + r->n_prompt, r->tokens_out + i * SMAX, r->n_out[i] * 4);
    float lp[64 + SMAX], loss[64 + SMAX], tlp[2 * (64 + SMAX)];
    int32_t tid[2 * (64 + SMAX)];
    be_seq e = {.ad = r->ad, .loss = loss_spec_default(LOSS_CROSS_ENTROPY), .n = n, .tokens = seq, .targets = seq + 1,
                 .logprobs_out = lp, .loss_out = loss, .topk = 2, .topk_ids_out = tid, .topk_lp_out = tlp};
    char err[512];
    if (s->be->forward_backward(s->ctx, &e, 1, false, err, sizeof err) != 0) { printf("FATAL forward: %s\n", err); exit(1); }
    for (int t = 0; t < r->n_out[i]; t++) {
        int p = r->n_prompt - 1 + t;
        lp_out[t] = p < n ? lp[p] : NAN;
        if (gap) gap[t] = p < n ? tlp[2 * p] - tlp[2 * p + 1] : INFINITY;
    }
}

/* The profiles (LCU_DECODE_PROFILE=2, LCU_TRAIN_PROFILE=1, cuda_prof.c): a context with
 * both on samples q's requests to the same bits as p's context did (its decode passes then
 * run eagerly) and forwards to the same log-probs, and says on stderr the tables of the
 * decode's and the forward's operations. Their stderr is caught in a file, checked and
 * copied to the log. */
static void check_profiles(pair *p, const sreq *q)
{
    const char *cs = p->name;
    char path[96];
    snprintf(path, sizeof path, "%s/profile.err", tmpdir);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (saved < 0 || fd < 0 || dup2(fd, 2) < 0) { printf("FATAL %s: catching stderr\n", path); exit(1); }
    close(fd);
    setenv("LCU_DECODE_PROFILE", "2", 1);
    setenv("LCU_TRAIN_PROFILE", "1", 1);
    side o = {p->gpu.be, open_ctx(p->gpu.be, p->dir, NULL), {0}};
    unsetenv("LCU_DECODE_PROFILE");
    unsetenv("LCU_TRAIN_PROFILE");
    be_adapter *ao = make_adapter(&o, 0);
    static sreq g[3];
    copy_reqs(g, q, 3, ao);
    do_sample(&o, g, 3);
    float fo[SMAX], fp[SMAX];
    forward_lp(&o, &g[0], 0, fo, NULL); /* a forward pass of the profiled context ... */
    forward_lp(&p->gpu, &q[0], 0, fp, NULL); /* ... and of the plain one */
    o.be->adapter_free(o.ctx, ao);
    o.be->destroy(o.ctx); /* says the last training shape's table */
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    bool same = true;
    for (int r = 0; r < 3; r++) same &= same_bits(g[r].tok, q[r].tok, sizeof q[r].tok) && same_bits(g[r].lp, q[r].lp, sizeof q[r].lp);
    same &= same_bits(fo, fp, (size_t)q[0].n[0] * sizeof(float));
    gt_check(same, "%s: profiling (LCU_DECODE_PROFILE=2 LCU_TRAIN_PROFILE=1) changes no sampled token, log-prob or "
             "forward log-prob", cs);
    FILE *f = fopen(path, "r");
    char line[512];
    bool dec = false, dec_attn = false, dec_gemm = false, tr = false, tr_gemm = false, tr_head = false;
    while (f && fgets(line, sizeof line, f)) {
        printf("  | %s", line); /* the tables, for the log */
        dec |= strstr(line, "decode ops, ") != NULL;
        dec_attn |= strstr(line, "decode ops   attention ") != NULL;
        dec_gemm |= strstr(line, "decode ops   q gemm ") || strstr(line, "decode ops   qkv gemm "); /* level 2 fuses q|k|v */
        tr |= strstr(line, "train ops, ") != NULL && strstr(line, "1 pass, the shape's first") != NULL;
        tr_gemm |= strstr(line, "train ops   q gemm ") != NULL;
        tr_head |= strstr(line, "train ops   head ") != NULL;
    }
    if (f) fclose(f);
    gt_check(dec && dec_attn && dec_gemm, "%s: LCU_DECODE_PROFILE=2 says the decode passes' operations (attention, q "
             "(or q|k|v) gemm, ...)", cs);
    gt_check(tr && tr_gemm && tr_head, "%s: LCU_TRAIN_PROFILE=1 says the forward pass's operations (q gemm, head, ...) "
             "when the context goes", cs);
}

/* q's requests sampled in a context opened with var=value, each sample's log-probs against
 * that context's forward pass over the same tokens: the largest gap (INFINITY when a sample
 * came out short). */
static double sample_vs_forward(pair *p, const sreq *q, const char *var, const char *value)
{
    static sreq g[3];
    side o = open_with(p, var, value);
    be_adapter *ad = make_adapter(&o, 0);
    copy_reqs(g, q, 3, ad);
    do_sample(&o, g, 3);
    double worst = 0;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < g[r].r.num_samples; i++) {
            float f[SMAX];
            forward_lp(&o, &g[r], i, f, NULL);
            if (g[r].n[i] != SMAX) worst = INFINITY;
            for (int t = 0; t < g[r].n[i]; t++)
                if (!(fabs(f[t] - g[r].lp[i * SMAX + t]) <= worst)) worst = fabs(f[t] - g[r].lp[i * SMAX + t]);
        }
    o.be->adapter_free(o.ctx, ad);
    o.be->destroy(o.ctx);
    return worst;
}

/* LCU_DECODE_FUSE (2 by default since the fourth window): level 1 (lcu_decode_qkv, the
 * separate launches' arithmetic in one kernel) samples q's requests to the same bits as
 * level 0 in two contexts opened with them; level 2 (one GEMM for q|k|v and one for
 * gate|up: another GEMM shape may round otherwise) holds its samples to its own forward
 * log-probs, as sampling is held. The default's own samples are check_sampling's. */
static void check_decode_fuse(pair *p, const sreq *q)
{
    static sreq g0[3], g1[3];
    side o0 = open_with(p, "LCU_DECODE_FUSE", "0"), o1 = open_with(p, "LCU_DECODE_FUSE", "1");
    be_adapter *a0 = make_adapter(&o0, 0), *a1 = make_adapter(&o1, 0);
    copy_reqs(g0, q, 3, a0);
    copy_reqs(g1, q, 3, a1);
    do_sample(&o0, g0, 3);
    do_sample(&o1, g1, 3);
    bool same = true;
    for (int r = 0; r < 3; r++)
        same &= same_bits(g1[r].tok, g0[r].tok, sizeof g0[r].tok) && same_bits(g1[r].lp, g0[r].lp, sizeof g0[r].lp);
    gt_check(same, "%s: decode passes with the fused q/k/v kernel (LCU_DECODE_FUSE=1) sample the same tokens and "
             "log-probs as without (=0), bitwise", p->name);
    o0.be->adapter_free(o0.ctx, a0);
    o0.be->destroy(o0.ctx);
    o1.be->adapter_free(o1.ctx, a1);
    o1.be->destroy(o1.ctx);

    double worst = sample_vs_forward(p, q, "LCU_DECODE_FUSE", "2");
    gt_check(worst <= 2e-2, "%s: LCU_DECODE_FUSE=2 (one GEMM for q|k|v, one for gate|up): sampled vs forward "
             "log-probs max |d| %.2e", p->name, worst);
}

/* LCU_DECODE_ATTN (on by default since the fifth window: the KV-cache decode's own
 * attention kernel) flipped: the other kernel's samples held to their forward log-probs (the
 * forward's attention is the training one), as sampling is; the default's are
 * check_sampling's. */
static void check_decode_attn(pair *p, const sreq *q)
{
    bool on_here = switch_on("LCU_DECODE_ATTN", true);
    double worst = sample_vs_forward(p, q, "LCU_DECODE_ATTN", on_here ? "0" : "1");
    gt_check(worst <= 2e-2, "%s: LCU_DECODE_ATTN=%s (%s): sampled vs forward log-probs max |d| %.2e", p->name,
             on_here ? "0" : "1", on_here ? "attention version 1's kernel" : "the decode's own attention kernel", worst);
}

/* LCU_DECODE_SIDE (off unless set: written without a GPU) flipped: a decode layer's LoRA
 * shrinks on a second stream beside its base GEMM, the same kernels with the same
 * arguments: the same tokens and log-probs, bitwise, for requests over two adapters and
 * none (LoRA version 3's segments), eagerly on a shape's first pass and through the
 * decode graph after. */
static void check_decode_side(pair *p)
{
    bool on_here;
    side o = open_flipped(p, "LCU_DECODE_SIDE", false, &on_here);
    int V = p->mc.vocab_size;
    be_adapter *ad[2][2];
    static sreq q[2][3];
    const side *sides[2] = {&p->gpu, &o};
    for (int k = 0; k < 2; k++) {
        for (int a = 0; a < 2; a++) ad[k][a] = make_adapter(sides[k], a);
        sreq_init(&q[k][0], ad[k][0], 5, 3, 1.0, 21, V);
        sreq_init(&q[k][1], ad[k][1], 9, 2, 1.0, 22, V);
        sreq_init(&q[k][2], NULL, 7, 2, 1.0, 23, V);
        do_sample(sides[k], q[k], 3);
    }
    bool same = true;
    for (int r = 0; r < 3; r++)
        same &= same_bits(q[0][r].tok, q[1][r].tok, sizeof q[0][r].tok) &&
                same_bits(q[0][r].lp, q[1][r].lp, sizeof q[0][r].lp);
    gt_check(same, "%s: LCU_DECODE_SIDE=%s (the LoRA's shrinks %s the base GEMM) samples the same tokens and log-probs "
             "over two adapters and none, bitwise", p->name, on_here ? "0" : "1", on_here ? "after" : "beside");
    for (int k = 0; k < 2; k++)
        for (int a = 0; a < 2; a++) sides[k]->be->adapter_free(sides[k]->ctx, ad[k][a]);
    o.be->destroy(o.ctx);
}

static void check_sampling(pair *p)
{
    const char *cs = p->name;
    int V = p->mc.vocab_size;
    be_adapter *ac = make_adapter(&p->cpu, 0), *ag = make_adapter(&p->gpu, 0);
    static sreq q[3], again[3], qc[3];
    sreq_init(&q[0], ag, 5, 3, 1.0, 1, V);
    sreq_init(&q[1], NULL, 9, 2, 1.0, 2, V);
    sreq_init(&q[2], ag, 40, 2, 1.0, 3, V);
    do_sample(&p->gpu, q, 3);
    /* T = 1: the sampled log-probs are the forward log-probs of the same tokens */
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < q[r].r.num_samples; i++) {
            float f[SMAX];
            forward_lp(&p->gpu, &q[r], i, f, NULL);
            double w = 0;
            int wt = 0, n = q[r].n[i];
            for (int t = 0; t < n; t++)
                if (!(fabs(f[t] - q[r].lp[i * SMAX + t]) <= w)) { w = fabs(f[t] - q[r].lp[i * SMAX + t]); wt = t; }
            gt_check(n == SMAX && w <= 2e-2, "%s sample request %d sample %d: %d tokens; sampled vs forward log-prob max "
                     "|d| %.2e at token %d", cs, r, i, n, w, wt);
        }
    /* reruns: the same bits */
    copy_reqs(again, q, 3, ag);
    do_sample(&p->gpu, again, 3);
    bool same = true;
    for (int r = 0; r < 3; r++) same &= same_bits(again[r].tok, q[r].tok, sizeof q[r].tok) && same_bits(again[r].lp, q[r].lp, sizeof q[r].lp);
    gt_check(same, "%s: sampling again with the same seeds gives the same tokens and log-probs, bitwise", cs);
    /* decode passes replayed as a CUDA graph (LCU_DECODE_GRAPH) or run eagerly: a second
     * context with the switch flipped samples the same requests to the same bits */
    if (strcmp(p->gpu.be->name, "cuda") == 0) {
        bool on_here;
        side o = open_flipped(p, "LCU_DECODE_GRAPH", true, &on_here);
        be_adapter *ao = make_adapter(&o, 0);
        static sreq g[3];
        copy_reqs(g, q, 3, ao);
        do_sample(&o, g, 3);
        bool gsame = true;
        for (int r = 0; r < 3; r++)
            gsame &= same_bits(g[r].tok, q[r].tok, sizeof q[r].tok) && same_bits(g[r].lp, q[r].lp, sizeof q[r].lp);
        gt_check(gsame, "%s: decode passes %s a CUDA graph (LCU_DECODE_GRAPH=%s) sample the same tokens and log-probs, "
                 "bitwise", cs, on_here ? "without" : "through", on_here ? "0" : "1");
        o.be->adapter_free(o.ctx, ao);
        o.be->destroy(o.ctx);
    }
    if (strcmp(p->gpu.be->name, "cuda") == 0) {
        check_profiles(p, q);
        check_decode_fuse(p, q);
        check_decode_attn(p, q);
        check_decode_side(p);
    }
    /* alone vs in the batch: the same unless a draw lands within rounding of a boundary */
    sreq_init(&again[0], ag, 5, 3, 1.0, 1, V);
    do_sample(&p->gpu, again, 1);
    printf("  %s sampling: request 0 alone %s in the batch\n", cs,
           same_bits(again[0].tok, q[0].tok, sizeof q[0].tok) ? "equals" : "DIFFERS from (near-boundary draw?)");

    /* greedy: the CPU's tokens, unless the two best logits nearly tie where they part */
    sreq_init(&q[0], ag, 6, 1, 0.0, 4, V);
    sreq_init(&qc[0], ac, 6, 1, 0.0, 4, V);
    sreq_init(&q[1], NULL, 11, 1, 0.0, 5, V);
    sreq_init(&qc[1], NULL, 11, 1, 0.0, 5, V);
    do_sample(&p->gpu, q, 2);
    do_sample(&p->cpu, qc, 2);
    for (int r = 0; r < 2; r++) {
        int t = 0;
        while (t < SMAX && q[r].tok[t] == qc[r].tok[t]) t++;
        float f[SMAX], gap[SMAX];
        if (t < SMAX) forward_lp(&p->cpu, &qc[r], 0, f, gap);
        gt_check(t == SMAX || gap[t] < 5e-2, "%s greedy request %d: %d of %d tokens equal to the CPU's; where they part "
                 "the CPU's two best log-probs are %.3g apart (a near tie, < 5e-2, is allowed)", cs, r, t, SMAX,
                 t < SMAX ? gap[t] : 0.0);
        printf("  %s greedy request %d: %d of %d tokens equal to the CPU's%s\n", cs, r, t, SMAX,
               t < SMAX ? " (then a near tie)" : "");
    }
    p->cpu.be->adapter_free(p->cpu.ctx, ac);
    p->gpu.be->adapter_free(p->gpu.ctx, ag);
}

/* ---- sampling's prompt-pass extras (be_seq score_* / draw_*) --------------------------- */

enum { XN = 40, XK = 6, XS = 3 };

typedef struct {
    int32_t tok[XN + 1], ids[XN * XS], draw[XN * XK];
    int64_t start[XN + 1];
    float lp[XN], loss[XN], slp[XN * XS], dlp[XN * XK];
} xpass;

/* One forward pass over a 41-token prompt asking, at every position, for the log-probs of
 * three ids (the actual next token first) and XK draws at temperature 0.8. */
static void extras_pass(const side *s, be_adapter *ad, xpass *x, const int32_t *score_ids)
{
    rng_state r;
    rng_seed(&r, 77);
    for (int i = 0; i <= XN; i++) x->tok[i] = (int32_t)(rng_next(&r) % 200) + 3;
    for (int i = 0; i <= XN; i++) x->start[i] = (int64_t)i * XS;
    for (int i = 0; i < XN; i++) {
        x->ids[i * XS] = x->tok[i + 1];
        x->ids[i * XS + 1] = (7 * i) % 256;
        x->ids[i * XS + 2] = 255 - i;
    }
    be_seq e = {.ad = ad, .loss = loss_spec_default(LOSS_CROSS_ENTROPY), .n = XN, .tokens = x->tok,
                 .targets = x->tok + 1, .logprobs_out = x->lp, .loss_out = x->loss, .score_start = x->start,
                 .score_ids = score_ids ? score_ids : x->ids, .score_lp_out = x->slp, .draw_k = XK,
                 .draw_temperature = 0.8, .draw_seed = 4242, .draw_ids_out = x->draw, .draw_lp_out = x->dlp};
    char err[512];
    if (s->be->forward_backward(s->ctx, &e, 1, false, err, sizeof err) != 0) { printf("FATAL extras: %s\n", err); exit(1); }
}

static void check_prompt_extras(pair *p)
{
    const char *cs = p->name;
    be_adapter *ac = make_adapter(&p->cpu, 0), *ag = make_adapter(&p->gpu, 0);
    static xpass c, g, g2, gs;
    extras_pass(&p->cpu, ac, &c, NULL);
    extras_pass(&p->gpu, ag, &g, NULL);
    double w = 0;
    bool own = true;
    for (int i = 0; i < XN * XS; i++) w = fmax(w, fabs(g.slp[i] - c.slp[i]));
    for (int i = 0; i < XN; i++) own &= g.slp[i * XS] == g.lp[i];
    gt_check(w <= 6e-2, "%s prompt extras: target log-probs vs the CPU's max |d| %.2e", cs, w);
    gt_check(own, "%s prompt extras: the actual next token's target log-prob is its logprobs_out, bitwise", cs);
    int same = 0;
    for (int i = 0; i < XN * XK; i++) same += g.draw[i] == c.draw[i];
    gt_check(same >= XN * XK * 9 / 10, "%s prompt extras: %d of %d draws equal to the CPU's (same streams; bf16 "
             "logits may move a draw at a boundary)", cs, same, XN * XK);
    /* scored as targets, the draws give their own log-probs, bitwise; again: the same bits */
    extras_pass(&p->gpu, ag, &g2, NULL);
    static int32_t as_ids[XN * XS];
    for (int i = 0; i < XN; i++) for (int j = 0; j < XS; j++) as_ids[i * XS + j] = g.draw[i * XK + j];
    extras_pass(&p->gpu, ag, &gs, as_ids);
    bool self = true;
    for (int i = 0; i < XN; i++) for (int j = 0; j < XS; j++) self &= gs.slp[i * XS + j] == g.dlp[i * XK + j];
    gt_check(self, "%s prompt extras: draws scored as targets give their draw log-probs, bitwise", cs);
    gt_check(same_bits(&g, &g2, sizeof g), "%s prompt extras: a rerun gives the same bits", cs);
    printf("  %s prompt extras: target |d| %.2e, %d/%d draws equal to the CPU's\n", cs, w, same, XN * XK);
    p->cpu.be->adapter_free(p->cpu.ctx, ac);
    p->gpu.be->adapter_free(p->gpu.ctx, ag);
}

/* ---- a 30-step SFT loss curve, and save/load resume -------------------------------------- */

enum { SFT_N = 8, SFT_LEN = 16, SFT_STEPS = 30 };

static double sft_step(const side *s, be_adapter *a, int32_t (*seq)[SFT_LEN], bool step)
{
    float lp[SFT_N][SFT_LEN], loss[SFT_N][SFT_LEN];
    be_seq e[SFT_N];
    for (int i = 0; i < SFT_N; i++)
        e[i] = (be_seq){.ad = a, .loss = loss_spec_default(LOSS_CROSS_ENTROPY), .n = SFT_LEN - 1, .tokens = seq[i],
                         .targets = seq[i] + 1, .logprobs_out = lp[i], .loss_out = loss[i]};
    char err[512];
    if (s->be->forward_backward(s->ctx, e, SFT_N, true, err, sizeof err) != 0) { printf("FATAL fb: %s\n", err); exit(1); }
    double nll = 0;
    for (int i = 0; i < SFT_N; i++) for (int t = 0; t < SFT_LEN - 1; t++) nll -= lp[i][t];
    adam_params hp = {1e-2, 0.9, 0.95, 1e-8, 0.0, 1.0};
    if (step && s->be->optim_step(s->ctx, a, &hp, NULL, err, sizeof err) != 0) { printf("FATAL step: %s\n", err); exit(1); }
    return nll / (SFT_N * (SFT_LEN - 1));
}

static be_adapter *sft_adapter(const side *s)
{
    char err[256];
    lora_config lc = {.rank = 8, .seed = 7, .train_attn = true, .train_mlp = true, .train_unembed = true};
    be_adapter *a = be_adapter_new(s->be, s->ctx, &lc, true, err, sizeof err);
    if (!a) { printf("FATAL adapter: %s\n", err); exit(1); }
    return a;
}

static void check_training(pair *p)
{
    const char *cs = p->name;
    int32_t seq[SFT_N][SFT_LEN];
    rng_state r;
    rng_seed(&r, 2024);
    for (int i = 0; i < SFT_N; i++) {
        seq[i][0] = 1;
        for (int t = 1; t < SFT_LEN; t++) seq[i][t] = 3 + (int32_t)(rng_next(&r) % 250);
    }
    be_adapter *ac = sft_adapter(&p->cpu), *ag = sft_adapter(&p->gpu);
    double worst = 0, first_c = 0, last_c = 0, last_g = 0;
    int wk = 0;
    printf("  %s SFT (8 x 16 tokens, rank 8, AdamW lr 1e-2): step, mean NLL cpu, cuda\n", cs);
    for (int k = 0; k < SFT_STEPS; k++) {
        double c = sft_step(&p->cpu, ac, seq, true), g = sft_step(&p->gpu, ag, seq, true);
        double e = fabs(g - c) / (0.05 + 0.05 * c);
        if (!(e <= worst)) { worst = e; wk = k; }
        if (k == 0) first_c = c;
        last_c = c;
        last_g = g;
        if (k % 5 == 0 || k == SFT_STEPS - 1) printf("    %2d  %.4f  %.4f\n", k, c, g);
    }
    gt_check(worst <= 1.0, "%s SFT curve: cuda within 0.05 + 5%% of the CPU's NLL at every step (worst step %d: %.2f of "
             "the bar)", cs, wk, worst);
    gt_check(last_g < 0.5 * first_c, "%s SFT: cuda NLL falls (%.3f -> %.3f; cpu -> %.3f)", cs, first_c, last_g, last_c);

    /* save/load: the full state into a fresh adapter; both continue identically, bitwise */
    sft_step(&p->gpu, ag, seq, false); /* gradients pending in the saved state */
    adapter_state st = download(&p->gpu, ag, ADAPTER_PARAMS | ADAPTER_GRADS | ADAPTER_OPTIM);
    char err[256];
    be_adapter *bg = be_adapter_from_state(p->gpu.be, p->gpu.ctx, &st, true, err, sizeof err);
    if (!bg) { printf("FATAL from_state: %s\n", err); exit(1); }
    bool same = true;
    for (int k = 0; k < 3; k++) {
        adam_params hp = {1e-2, 0.9, 0.95, 1e-8, 0.01, 1.0};
        same &= p->gpu.be->optim_step(p->gpu.ctx, ag, &hp, NULL, err, sizeof err) == 0;
        same &= p->gpu.be->optim_step(p->gpu.ctx, bg, &hp, NULL, err, sizeof err) == 0;
        same &= sft_step(&p->gpu, ag, seq, false) == sft_step(&p->gpu, bg, seq, false);
    }
    adapter_state x = download(&p->gpu, ag, ADAPTER_PARAMS | ADAPTER_GRADS | ADAPTER_OPTIM);
    adapter_state y = download(&p->gpu, bg, ADAPTER_PARAMS | ADAPTER_GRADS | ADAPTER_OPTIM);
    size_t nb = x.layout.num_params * 4;
    same &= same_bits(x.params, y.params, nb) && same_bits(x.grads, y.grads, nb) && same_bits(x.m, y.m, nb) &&
            same_bits(x.v, y.v, nb) && x.step == y.step;
    gt_check(same, "%s save/load: a resumed adapter continues bitwise like the original (steps %lld/%lld)", cs,
             (long long)x.step, (long long)y.step);
    adapter_state_free(&st);
    adapter_state_free(&x);
    adapter_state_free(&y);
    p->cpu.be->adapter_free(p->cpu.ctx, ac);
    p->gpu.be->adapter_free(p->gpu.ctx, ag);
    p->gpu.be->adapter_free(p->gpu.ctx, bg);
}

/* ---- the F32 file: the loader's rounding equals the bf16 file's ------------------------- */

static void check_f32_file(pair *p, const char *f32_dir)
{
    side f = {p->gpu.be, open_ctx(p->gpu.be, f32_dir, NULL), {0}};
    inputs in;
    make_inputs(&in, p->mc.vocab_size);
    be_adapter *a1[NAD], *a2[NAD];
    for (int a = 0; a < NAD; a++) {
        a1[a] = make_adapter(&p->gpu, a);
        a2[a] = make_adapter(&f, a);
    }
    batch b1, b2;
    make_batch(&b1, &p->gpu, a1, &in, -1, true);
    make_batch(&b2, &f, a2, &in, -1, true);
    run(&p->gpu, &b1, false);
    run(&f, &b2, false);
    bool same = true;
    for (int k = 0; k < b1.n; k++) same &= same_bits(b1.lp[k], b2.lp[k], (size_t)SEQS[b1.idx[k]].n * KOF(b1.idx[k]) * 4);
    gt_check(same, "%s: the F32 model file gives the same log-probs as its bf16 rounding, bitwise", p->name);
    free_batch(&b1);
    free_batch(&b2);
    for (int a = 0; a < NAD; a++) {
        p->gpu.be->adapter_free(p->gpu.ctx, a1[a]);
        f.be->adapter_free(f.ctx, a2[a]);
    }
    f.be->destroy(f.ctx);
    for (int i = 0; i < NSEQ; i++) { free(in.tok[i]); free(in.tgt[i]); free(in.w[i]); free(in.q[i]); free(in.adv[i]); }
}

static const char *g_cases; /* GPU_BACKEND_CASES, NULL = all */

static bool want(const char *name)
{
    if (!g_cases) return true;
    size_t n = strlen(name);
    for (const char *p = g_cases; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, name, n)) return true;
        p += len + (p[len] == ',');
    }
    return false;
}

int main(void)
{
    const char *under = getenv("GPU_BACKEND_UNDER_TEST");
    under = under && *under ? under : "cuda";
    g_cases = getenv("GPU_BACKEND_CASES");
    if (g_cases && !*g_cases) g_cases = NULL;
    if (strcmp(under, "cpu") != 0) gt_init("test_gpu_backend");
    const be_backend *cpu = be_backend_find("cpu"), *cuda = be_backend_find(under);
    if (!cuda) { printf("FATAL this build has no %s backend (%s)\n", under, be_backend_names()); return 1; }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/loom_gpu_backend_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    static const struct { const char *name, *arch; bool llama3; int kv_heads, max_pos; } cases[] = {
        {"llama", "llama", false, 0, 0},
        {"qwen3", "qwen3", false, 0, 0},
        {"qwen2", "qwen2", false, 0, 0},
        {"llama_rope3_mqa", "llama", true, 1, 512},
        {"qwen3_moe", "qwen3_moe", false, 0, 0},
    };
    for (const char *p = g_cases; p && *p;) { /* every name asked for exists */
        size_t len = strcspn(p, ",");
        bool known = len == 6 && !strncmp(p, "extras", 6);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            known |= strlen(cases[i].name) == len && !strncmp(p, cases[i].name, len);
        if (!known) {
            printf("FATAL GPU_BACKEND_CASES: no part '%.*s' (llama, qwen3, qwen2, llama_rope3_mqa, extras, qwen3_moe)\n",
                   (int)len, p);
            return 1;
        }
        p += len + (p[len] == ',');
    }
    pair llama = {0}; /* kept open for the extras, which run after the dense cases */
    bool llama_open = false, printed_device = false;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (llama_open && !strcmp(cases[i].arch, "qwen3_moe")) {
            printf("== %s: sampling's prompt-pass extras\n", llama.name);
            g_ncnt = 0;
            check_prompt_extras(&llama);
            cpu->destroy(llama.cpu.ctx);
            cuda->destroy(llama.gpu.ctx);
            llama_open = false;
        }
        bool run = want(cases[i].name), keep = i == 0 && want("extras");
        if (!run && !keep) continue;
        char dir[256];
        write_model(cases[i].name, cases[i].arch, cases[i].llama3, cases[i].kv_heads, cases[i].max_pos, true, dir,
                    sizeof dir);
        pair p = {.name = cases[i].name, .cpu = {cpu, NULL, {0}}, .gpu = {cuda, NULL, {0}}};
        snprintf(p.dir, sizeof p.dir, "%s", dir);
        p.cpu.ctx = open_ctx(cpu, dir, &p.mc);
        p.gpu.ctx = open_ctx(cuda, dir, NULL);
        g_ncnt = model_num_moe_layers(&p.mc) * p.mc.num_experts;
        if (!printed_device) {
            be_device_info di;
            cuda->device_info(p.gpu.ctx, &di);
            printf("  device: %s, %.1f GiB, %.1f GiB free\n", di.device, di.memory_total / 1073741824.0,
                   di.memory_free / 1073741824.0);
            printed_device = true;
        }
        if (run) {
            printf("== %s\n", p.name);
            check_case(&p);
        }
        if (run && i == 0) {
            check_sampling(&p);
            check_training(&p);
            if (!strcmp(under, "cuda")) check_device_mb(&p);
        }
        if (run && i == 1 && strcmp(under, "cpu") != 0) {
            char f32[256];
            write_model("qwen3_f32", "qwen3", false, 0, 0, false, f32, sizeof f32);
            check_f32_file(&p, f32);
        }
        if (i == 0) {
            llama = p;
            llama_open = true;
            continue;
        }
        cpu->destroy(p.cpu.ctx);
        cuda->destroy(p.gpu.ctx);
    }
    if (llama_open) {
        printf("== %s: sampling's prompt-pass extras\n", llama.name);
        g_ncnt = 0;
        check_prompt_extras(&llama);
        cpu->destroy(llama.cpu.ctx);
        cuda->destroy(llama.gpu.ctx);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) printf("could not remove %s\n", tmpdir);
    return gt_finish();
}
