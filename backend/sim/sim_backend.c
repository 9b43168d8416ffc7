/* sim_backend.c — the simulated executor backend (be_backend_sim, `--backend sim`): it
 * computes next to nothing and takes the time a modelled GPU would (sim_profile.h: an
 * H100 training LoRA on Qwen3-8B by default), so that many executors on one machine load
 * PostgreSQL, the scheduler and the api as a fleet of GPUs would (bench/fleet_bench.py).
 *
 * It keeps the table's contract wherever the executor depends on it:
 *  - adapters are the CPU backend's (cpu_adapter.c: flat host arrays, so uploads,
 *    downloads and copies keep every number: checkpoints, snapshots and loads round-trip);
 *    their device_bytes are those of the modelled model's adapter of the same config, so
 *    the adapter store and placement budget as on the modelled GPU;
 *  - forward_backward, optim_step and sample compute a real, tiny model (below) exactly
 *    and deterministically: every output of a sequence depends only on its tokens and its
 *    adapter, each group's gradient is added on its own, so the backend is batch-invariant
 *    and a replay gives the same bits;
 *  - every call returns no earlier than its modelled time after it began (its own work
 *    counts within it): clock_nanosleep to a deadline, per decode step while sampling, so
 *    that streamed tokens come at the modelled pace.
 * Its results are NOT the CPU backend's (the reference suites do not apply to it); memory:
 * the adapters of the small model the executor opened, and one row of logits.
 *
 * The model. A bigram: after token x the likeliest next token is f(x) = (x + 1) mod V,
 * with logit θ + ln So; the others' logits fall with their distance after it (sim_row).
 * θ is what the adapter has learned: θ = Σ_j d_j·B_j over its lora_B entries, d_j = ±1/√n_B by a hash of j. A fresh
 * adapter (B = 0, PEFT) and the base model have θ = 0, where f(x) has probability 1/4.
 * dlp/dθ = [t = f(x)] − p(f(x)), so the gradient of a group with dℓ/dθ = G is G·d on the
 * lora_B entries (zero on lora_A), and AdamW on it really lowers the loss of text that
 * counts upwards. With a small vocabulary (the fleet bench's model has 256 tokens) a
 * sampled token costs the sim O(V) of its own CPU, well inside the modelled time.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu_adapter.h"
#include "backend/cpu/cpu_choose.h"
#include "backend/sim/sim_profile.h"
#include "common/clock.h"
#include "common/err.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    model_config cfg;         /* the model the executor opened: vocabulary, context, adapter layouts */
    const sim_profile *p;
    double scale;             /* $LOOM_SIM_SCALE: every modelled time is multiplied by it */
    int device;
    float *z, *w;             /* one row of logits (sim_fill) and the choice's scratch */
    uint64_t *keys;
} sim_ctx;

/* ---- time ------------------------------------------------------------------------------ */

/* Sleeps until the monotonic time `until` (seconds), signals or not: a call must not
 * return before its modelled time is over. */
static void sim_sleep_until(double until)
{
    struct timespec t = {.tv_sec = (time_t)until, .tv_nsec = (long)((until - floor(until)) * 1e9)};
    if (t.tv_nsec >= 1000000000L) t.tv_nsec = 999999999L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR) {}
}

/* A call that began at t0 and takes `seconds` of the modelled GPU ends here. */
static void sim_take(const sim_ctx *c, double t0, double seconds)
{
    if (c->scale > 0 && seconds > 0) sim_sleep_until(t0 + seconds * c->scale);
}

/* ---- the model ------------------------------------------------------------------------- */

/* d_j's sign, fixed by the parameter's index. */
static double sim_sign(size_t j)
{
    uint64_t x = (uint64_t)j;
    return rng_splitmix64(&x) & 1 ? 1.0 : -1.0;
}

static size_t sim_count_b(const lora_layout *l)
{
    size_t n = 0;
    for (int i = 0; i < l->num_tensors; i++)
        if (l->tensors[i].is_b) n += (size_t)l->tensors[i].rows * l->tensors[i].cols;
    return n;
}

/* θ of an adapter (0 for the base model). */
static double sim_theta(const be_adapter *ad)
{
    if (!ad) return 0;
    const lora_layout *l = &ad->layout;
    const float *params = ((const cpu_adapter *)ad)->params;
    size_t nb = sim_count_b(l);
    double sum = 0;
    for (int i = 0; i < l->num_tensors; i++) {
        const lora_tensor *t = &l->tensors[i];
        if (!t->is_b) continue;
        for (size_t j = t->offset; j < t->offset + (size_t)t->rows * t->cols; j++) sum += sim_sign(j) * params[j];
    }
    return nb ? sum / sqrt((double)nb) : 0;
}

/* grads += G·d (on the lora_B entries). */
static void sim_add_grad(be_adapter *ad, double G)
{
    const lora_layout *l = &ad->layout;
    float *g = ((cpu_adapter *)ad)->grads;
    double inv = 1.0 / sqrt((double)sim_count_b(l));
    for (int i = 0; i < l->num_tensors; i++) {
        const lora_tensor *t = &l->tensors[i];
        if (!t->is_b) continue;
        for (size_t j = t->offset; j < t->offset + (size_t)t->rows * t->cols; j++)
            g[j] += (float)(G * sim_sign(j) * inv);
    }
}

/* The distribution after token x: f = f(x) has logit zf; the token at distance d = 1 ..
 * V − 1 after it (t = (f + d) mod V) has logit −βd, β = 8/V: distinct logits, so that
 * top-k and top-p cut where a real model's would, and Σ_d exp(−βd) = So in closed form,
 * so that a position costs O(1) whatever the vocabulary. zf = θ + ln So: at θ = 0, f has
 * probability 1/2. */
typedef struct {
    int32_t f;
    long V;
    double beta, zf, lse, pf;
} sim_row;

static sim_row sim_row_of(const sim_ctx *c, int32_t x, double theta)
{
    long V = c->cfg.vocab_size;
    sim_row r = {.f = (int32_t)((x + 1) % V), .V = V, .beta = 4.0 / (double)V};
    double so = exp(-r.beta) * -expm1(-r.beta * (double)(V - 1)) / -expm1(-r.beta), lso = log(so);
    r.zf = (double)(float)(theta + lso - log(3.0));   /* the float the sampler's row holds */
    double m = r.zf > lso ? r.zf : lso;
    r.lse = m + log(exp(r.zf - m) + exp(lso - m));
    r.pf = exp(r.zf - r.lse);
    return r;
}

static double sim_logit(const sim_row *r, int32_t t)
{
    long d = ((long)t - r->f + r->V) % r->V;
    return d == 0 ? r->zf : (double)(float)(-r->beta * (double)d);
}

/* The token of rank i (most likely first): the others by distance, f among them where
 * its logit falls (after the n tokens whose logit −βd is above zf). */
static int32_t sim_ranked(const sim_row *r, long i)
{
    long n = r->zf >= -r->beta ? 0 : (long)ceil(-r->zf / r->beta) - 1;
    if (n > r->V - 1) n = r->V - 1;
    long d = i < n ? i + 1 : i == n ? 0 : i;
    return (int32_t)((r->f + d) % r->V);
}

/* The row of logits in c->z, for the sampler. */
static void sim_fill(sim_ctx *c, const sim_row *r)
{
    for (long t = 0; t < r->V; t++) c->z[t] = (float)sim_logit(r, (int32_t)t);
}

/* ---- the context ----------------------------------------------------------------------- */

static void sim_destroy(void *ctx)
{
    sim_ctx *c = ctx;
    if (!c) return;
    free(c->z);
    free(c->w);
    free(c->keys);
    free(c);
}

static void *sim_create(const model_files *m, const be_backend_opts *o, char *err, size_t errlen)
{
    const char *name = getenv("LOOM_SIM_PROFILE"), *scale = getenv("LOOM_SIM_SCALE");
    if (!name || !*name) name = "h100-qwen3-8b";
    const sim_profile *p = sim_profile_find(name);
    if (!p) {
        err_set(err, errlen, "sim: LOOM_SIM_PROFILE=%s is not a profile (%s)", name, sim_profile_names());
        return NULL;
    }
    double k = 1;
    if (scale && *scale) {
        char *end;
        k = strtod(scale, &end);
        if (*end || !(k >= 0) || !isfinite(k)) {
            err_set(err, errlen, "sim: LOOM_SIM_SCALE=%s is not a number >= 0", scale);
            return NULL;
        }
    }
    if (m->cfg.vocab_size < 2 || o->device < 0) {
        err_set(err, errlen, "sim: needs a vocabulary of at least 2 tokens and a device >= 0");
        return NULL;
    }
    sim_ctx *c = calloc(1, sizeof *c);
    long V = m->cfg.vocab_size;
    if (c) {
        c->z = calloc(V, sizeof *c->z);
        c->w = calloc(V, sizeof *c->w);
        c->keys = calloc(V, sizeof *c->keys);
    }
    if (!c || !c->z || !c->w || !c->keys) {
        sim_destroy(c);
        err_set(err, errlen, "sim: out of memory");
        return NULL;
    }
    c->cfg = m->cfg;
    c->p = p;
    c->scale = k;
    c->device = o->device;
    return c;
}

static void sim_device_info(void *ctx, be_device_info *out)
{
    sim_ctx *c = ctx;
    memset(out, 0, sizeof *out);
    snprintf(out->device, sizeof out->device, "sim:%d %s, %s timing%s", c->device, c->p->gpu, c->p->model,
             c->scale == 1 ? "" : c->scale == 0 ? " x0 (no waiting)" : " scaled");
    out->memory_total = (size_t)c->p->memory_bytes;
    out->memory_free = (size_t)(c->p->memory_bytes - c->p->weights_bytes);
}

/* Each device index is a modelled GPU of its own: as many as an executor's --device allows. */
static int sim_device_count(void) { return 1024; }

/* ---- adapters: the CPU backend's host arrays, the modelled GPU's sizes and transfer times -- */

/* Bytes the modelled adapter of a's config holds in the parts named. */
static double sim_part_bytes(const sim_ctx *c, const be_adapter *a, unsigned parts)
{
    int arrays = !!(parts & ADAPTER_PARAMS) + !!(parts & ADAPTER_GRADS) + 2 * !!(parts & ADAPTER_OPTIM);
    return arrays * 4.0 * sim_lora_params(c->p, &a->layout.cfg);
}

static be_adapter *sim_adapter_alloc(void *ctx, const lora_config *lc, bool trainable, char *err, size_t errlen)
{
    sim_ctx *c = ctx;
    be_adapter *a = cpu_adapter_alloc(&c->cfg, lc, trainable, err, errlen);
    if (a) a->device_bytes = (size_t)sim_part_bytes(c, a, ADAPTER_PARAMS | (trainable ? ADAPTER_GRADS | ADAPTER_OPTIM : 0));
    return a;
}

static void sim_adapter_free(void *ctx, be_adapter *a) { (void)ctx; cpu_adapter_free(a); }

static int sim_upload(void *ctx, be_adapter *a, const adapter_state *src, unsigned parts, char *err, size_t errlen)
{
    double t0 = clock_mono_s();
    int rc = cpu_adapter_upload(a, src, parts, err, errlen);
    if (rc == 0) sim_take(ctx, t0, sim_host_copy_s(((sim_ctx *)ctx)->p, sim_part_bytes(ctx, a, parts)));
    return rc;
}

static int sim_download(void *ctx, const be_adapter *a, adapter_state *dst, unsigned parts, char *err, size_t errlen)
{
    double t0 = clock_mono_s();
    int rc = cpu_adapter_download(a, dst, parts, err, errlen);
    if (rc == 0) sim_take(ctx, t0, sim_host_copy_s(((sim_ctx *)ctx)->p, sim_part_bytes(ctx, a, parts)));
    return rc;
}

static int sim_copy(void *ctx, be_adapter *dst, const be_adapter *src, unsigned parts, char *err, size_t errlen)
{
    double t0 = clock_mono_s();
    int rc = cpu_adapter_copy(dst, src, parts, err, errlen);
    if (rc == 0) sim_take(ctx, t0, sim_device_copy_s(((sim_ctx *)ctx)->p, sim_part_bytes(ctx, src, parts)));
    return rc;
}

/* ---- forward / backward ---------------------------------------------------------------- */

/* One sequence's outputs; returns dℓ/dθ summed over its positions (0 when it adds no
 * gradient). Positions whose dℓ/dlp is not finite add nothing (backend.h). */
static double sim_seq(const sim_ctx *c, be_seq *s, double theta, bool grad, float *z)
{
    int K = s->k > 1 ? s->k : 1;
    double G = 0;
    for (int pos = 0; pos < s->n; pos++) {
        sim_row r = sim_row_of(c, s->tokens[pos], theta);
        double loss = 0, dtheta = 0;
        bool finite = true;
        for (int k = 0; k < K; k++) {
            long q = (long)pos * K + k;
            int32_t t = s->targets[q];
            float lp = (float)(sim_logit(&r, t) - r.lse);
            float w = s->weights ? s->weights[q] : 1.0f;
            float sq = s->sampler_logprobs ? s->sampler_logprobs[pos] : 0.0f;
            float adv = s->advantages ? s->advantages[pos] : 0.0f;
            float l, dlp;
            loss_token(&s->loss, lp, w, sq, adv, &l, &dlp);
            if (s->logprobs_out) s->logprobs_out[q] = lp;
            loss += l;
            finite &= isfinite(dlp);
            dtheta += (double)dlp * ((t == r.f ? 1.0 : 0.0) - r.pf);
        }
        if (s->loss_out) s->loss_out[pos] = (float)loss;
        if (z && be_seq_has_extras(s)) {    /* target_prompt_logprobs, prompt_alt_tokens: from the whole row */
            for (long t = 0; t < r.V; t++) z[t] = (float)sim_logit(&r, (int32_t)t);
            be_prompt_extras(s, pos, z, r.V, r.lse);
        }
        for (int i = 0; i < s->topk; i++) {
            int32_t id = sim_ranked(&r, i);
            s->topk_ids_out[(long)pos * s->topk + i] = id;
            s->topk_lp_out[(long)pos * s->topk + i] = (float)(sim_logit(&r, id) - r.lse);
        }
        if (grad && finite) G += dtheta;
    }
    return G;
}

static int sim_forward_backward(void *ctx, be_seq *seqs, int nseq, bool backward, char *err, size_t errlen)
{
    sim_ctx *c = ctx;
    double t0 = clock_mono_s();
    if (nseq < 0 || (nseq > 0 && !seqs)) { err_set(err, errlen, "bad batch"); return -1; }
    long T = 0;
    bool extras = false;
    for (int i = 0; i < nseq; i++) T += seqs[i].n, extras |= be_seq_has_extras(&seqs[i]);
    float *z = NULL;   /* a whole row of logits, only for the prompt extras */
    if (extras && !(z = malloc((size_t)c->cfg.vocab_size * sizeof *z))) {
        err_set(err, errlen, "out of memory for a row of logits");
        return -1;
    }
    /* A group is a run of consecutive sequences of one adapter and one group: its
     * gradient is summed on its own and added when the run ends, in batch order. */
    const be_adapter *theta_of = NULL;
    double theta = 0, G = 0;
    be_adapter *run_ad = NULL;
    int run_group = 0;
    for (int i = 0; i < nseq; i++) {
        be_seq *s = &seqs[i];
        if (!s->ad || s->ad != theta_of) theta = sim_theta(s->ad), theta_of = s->ad;
        bool grad = backward && s->ad && s->ad->trainable && !s->forward_only;
        if (run_ad && (s->ad != run_ad || s->group != run_group)) {
            sim_add_grad(run_ad, G);
            run_ad = NULL;
        }
        double g = sim_seq(c, s, theta, grad, z);
        if (!grad) continue;
        if (!run_ad) run_ad = s->ad, run_group = s->group, G = 0;
        G += g;
    }
    if (run_ad) sim_add_grad(run_ad, G);
    free(z);
    sim_take(c, t0, sim_fb_s(c->p, T, backward));
    return 0;
}

/* ---- optimizer --------------------------------------------------------------------------- */

static int sim_optim_step(void *ctx, be_adapter *pub, const adam_params *hp, double *grad_norm_out, char *err,
                          size_t errlen)
{
    sim_ctx *c = ctx;
    double t0 = clock_mono_s();
    if (!pub->trainable) { err_set(err, errlen, "sim: optim_step on an adapter that is not trainable"); return -1; }
    if (cpu_adapter_optim_step(cpu_adapter_of(pub), NULL, hp, grad_norm_out, err, errlen) < 0) return -1;
    sim_take(c, t0, sim_optim_s(c->p, sim_lora_params(c->p, &pub->layout.cfg)));
    return 0;
}

/* ---- sampling ---------------------------------------------------------------------------- */

/* The next token of stream s after token x, by the CPU backend's choice arithmetic on the
 * sim's row of logits. */
static void sim_pick(sim_ctx *c, be_sample_stream *s, int32_t x, double theta)
{
    long V = c->cfg.vocab_size;
    sim_row r = sim_row_of(c, x, theta);
    sim_fill(c, &r);
    float lp;
    if (s->req->top_logprobs > 0) be_sample_top(s, c->z, V, c->w, c->keys);
    int32_t tok = cpu_choose_token(s->req, c->z, V, &s->rng, c->w, c->keys, &lp);
    be_sample_record(s, tok, lp, c->cfg.max_position_embeddings);
}

static int sim_sample(void *ctx, be_sample_req *reqs, int nreq, char *err, size_t errlen)
{
    sim_ctx *c = ctx;
    double t = clock_mono_s();
    long T = 0, S = 0;
    for (int r = 0; r < nreq; r++) {
        char why[256];
        if (be_sample_check(&c->cfg, &reqs[r], why, sizeof why) != 0) {
            err_set(err, errlen, "request %d: %s", r, why);
            return -1;
        }
        T += reqs[r].n_prompt;
        S += reqs[r].num_samples;
    }
    if (nreq <= 0) return 0;
    be_sample_stream *st = calloc(S, sizeof *st);
    double *theta = calloc(nreq, sizeof *theta);
    if (!st || !theta) {
        free(st);
        free(theta);
        err_set(err, errlen, "sim: out of memory for %ld samples", S);
        return -1;
    }
    long s = 0;
    for (int r = 0; r < nreq; r++) {
        theta[r] = sim_theta(reqs[r].ad);
        for (int i = 0; i < reqs[r].num_samples; i++, s++) be_sample_stream_init(&st[s], &reqs[r], i);
    }
    /* prefill: the prompts in one pass; each sample's first token follows its prompt */
    t += c->scale * sim_fb_s(c->p, T, false);
    if (c->scale > 0) sim_sleep_until(t);
    for (int r = 0, k = 0; r < nreq; k += reqs[r].num_samples, r++)
        for (int i = 0; i < reqs[r].num_samples; i++)
            if (!st[k + i].done) sim_pick(c, &st[k + i], reqs[r].prompt[reqs[r].n_prompt - 1], theta[r]);
    /* decode: one token per live sample per step, each step at the modelled pace */
    for (;;) {
        int live = 0;
        for (long k = 0; k < S; k++) live += !st[k].done;
        if (!live) break;
        t += c->scale * sim_decode_step_s(c->p, live);
        if (c->scale > 0) sim_sleep_until(t);
        for (int r = 0, k = 0; r < nreq; k += reqs[r].num_samples, r++)
            for (int i = 0; i < reqs[r].num_samples; i++)
                if (!st[k + i].done) sim_pick(c, &st[k + i], st[k + i].last, theta[r]);
    }
    free(st);
    free(theta);
    return 0;
}

const be_backend be_backend_sim = {
    .name = "sim",
    .batch_invariant = true,
    .device_count = sim_device_count,
    .create = sim_create,
    .destroy = sim_destroy,
    .device_info = sim_device_info,
    .adapter_alloc = sim_adapter_alloc,
    .adapter_free = sim_adapter_free,
    .adapter_upload = sim_upload,
    .adapter_download = sim_download,
    .adapter_copy = sim_copy,
    .forward_backward = sim_forward_backward,
    .optim_step = sim_optim_step,
    .sample = sim_sample,
};
