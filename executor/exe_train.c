/* exe_train.c: the training operations of a cycle: create_model (a new LoRA adapter),
 * forward / forward_backward (one packed batch across adapters and losses) and
 * optim_step (AdamW on one adapter). */
#include "executor/exe_train.h"
#include "backend/loss.h"
#include "common/err.h"
#include "common/log.h"
#include "contract/fb_check.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- forward / forward_backward ------------------------------------------------- */

typedef struct {
    exe_op *op;
    int first_seq, nseq;     /* the op's datums in the packed batch */
    bool at_risk;            /* a position may overflow (loss_token_at_risk) */
    bool dropped;            /* failed before the pass: none of its sequences run */
} fb_span;

/* The loss of an op: its name and loss_fn_config over the defaults, checked as the api
 * checked it (contract/fb_check.h). */
static int op_loss(const exe_op *op, loss_spec *out, char *err, size_t errlen) {
    const char *name = json_string_value(json_object_get(op->payload, "loss_fn"));
    loss_kind kind;
    if (loss_kind_parse(name, &kind) < 0) {
        err_set(err, errlen, "unknown loss_fn '%s'", name ? name : "(none)");
        return -1;
    }
    *out = loss_spec_default(kind);
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(op->payload, "loss_fn_config"), key, v)
        if (json_is_number(v)) loss_config_set(out, key, json_number_value(v));
    return fb_check_loss(out, "payload", err, errlen);
}

/* A JSON array as a new int64 (ints) or float array of *n values; *present false when the
 * key is absent. false when it is not an array of numbers (of integers for ints). */
static bool read_array(json_t *a, bool ints, void **out, size_t *n, bool *present) {
    *out = NULL;
    *n = 0;
    *present = a && !json_is_null(a);
    if (!*present) return true;
    if (!json_is_array(a)) return false;
    *n = json_array_size(a);
    *out = malloc((*n ? *n : 1) * (ints ? sizeof(int64_t) : sizeof(float)));
    for (size_t i = 0; i < *n; i++) {
        json_t *e = json_array_get(a, i);
        if (ints ? !json_is_integer(e) : !json_is_number(e)) return false;
        if (ints) ((int64_t *)*out)[i] = json_integer_value(e);
        else ((float *)*out)[i] = (float)json_number_value(e);
    }
    return true;
}

static int32_t *narrow(const int64_t *x, size_t n) {
    int32_t *o = malloc((n ? n : 1) * sizeof *o);
    for (size_t i = 0; i < n; i++) o[i] = (int32_t)x[i];
    return o;
}

static void free_seq(exe_seq *s) {
    free((void *)s->tokens); free((void *)s->targets); free((void *)s->weights);
    free((void *)s->sampler_logprobs); free((void *)s->advantages);
    free(s->logprobs_out); free(s->loss_out); free(s->expert_counts_out);
}

/* One datum of the payload as a sequence of the batch, after the shared check (the
 * executor's defence: a payload that breaks a rule fails its own operation only). */
static int read_datum(exe_state *st, json_t *dj, const loss_spec *ls, const char *where, exe_seq *s, char *err,
                      size_t errlen) {
    static const bool ints[LOSS_N_INPUTS] = {true, false, false, false};
    void *tok = NULL, *in[LOSS_N_INPUTS] = {NULL};
    size_t ntok, len[LOSS_N_INPUTS];
    bool present, has[LOSS_N_INPUTS], ok = read_array(json_object_get(dj, "tokens"), true, &tok, &ntok, &present);
    for (int k = 0; k < LOSS_N_INPUTS; k++) {   /* the api writes only the inputs the loss reads */
        json_t *a = loss_inputs_accepted(ls->kind) & (1u << k) ? json_object_get(dj, loss_input_names[k]) : NULL;
        ok &= read_array(a, ints[k], &in[k], &len[k], &has[k]);
    }
    json_t *kj = json_object_get(dj, "k");
    json_int_t K = kj ? (json_is_integer(kj) ? json_integer_value(kj) : -1) : 1;
    int rc = -1;
    if (!ok || !present || K < 1) {
        err_set(err, errlen, "%s: tokens, k or a loss input is not of the expected type", where);
        goto out;
    }
    fb_view v = {.n_tokens = ntok, .tokens = tok, .targets = in[LOSS_IN_TARGET_TOKENS]};
    for (int k = 0; k < LOSS_N_INPUTS; k++) {
        bool per_target = k == LOSS_IN_TARGET_TOKENS || k == LOSS_IN_WEIGHTS;
        v.in[k] = (fb_view_input){.present = has[k], .dims = per_target && K > 1 ? 2 : 1,
                                   .cols = per_target ? (size_t)K : 1, .values = len[k]};
    }
    fb_check_model m = {.vocab_size = st->model.vocab_size, .max_context = st->model.max_position_embeddings};
    if (fb_check_datum(&m, ls->kind, &v, where, err, errlen) < 0) goto out;
    size_t n = ntok, nk = n * (size_t)K;
    *s = (exe_seq){.loss = *ls, .n = (int)n, .k = (int)K, .tokens = narrow(tok, n),
                   .targets = narrow(in[LOSS_IN_TARGET_TOKENS], nk), .weights = in[LOSS_IN_WEIGHTS],
                   .sampler_logprobs = in[LOSS_IN_LOGPROBS], .advantages = in[LOSS_IN_ADVANTAGES],
                   .logprobs_out = calloc(nk, sizeof(float)), .loss_out = calloc(n, sizeof(float))};
    size_t ncount = (size_t)model_num_moe_layers(&st->model) * st->model.num_experts;
    if (ncount) s->expert_counts_out = calloc(ncount, sizeof(int32_t));
    in[LOSS_IN_WEIGHTS] = in[LOSS_IN_LOGPROBS] = in[LOSS_IN_ADVANTAGES] = NULL;   /* now the sequence's */
    rc = 0;
out:
    free(tok);
    for (int k = 0; k < LOSS_N_INPUTS; k++) free(in[k]);
    return rc;
}

static bool seq_at_risk(const exe_seq *s) {
    int K = s->k > 1 ? s->k : 1;
    for (long q = 0; q < (long)s->n * K; q++)
        if (loss_token_at_risk(&s->loss, s->weights ? s->weights[q] : 1.0f,
                               s->sampler_logprobs ? s->sampler_logprobs[q / K] : 0.0f,
                               s->advantages ? s->advantages[q / K] : 0.0f))
            return true;
    return false;
}

/* Whether the op's outputs are in range: every log-prob and loss finite, and (strict, for
 * the pass without gradients that decides whether an op at risk may run) every
 * |loss| below LIMIT_LOSS. Otherwise why names the first bad position and its inputs. */
static bool span_in_range(const exe_seq *seqs, const fb_span *sp, bool strict, char *why, size_t n) {
    for (int d = 0; d < sp->nseq; d++) {
        const exe_seq *s = &seqs[sp->first_seq + d];
        int K = s->k > 1 ? s->k : 1;
        for (int t = 0; t < s->n; t++) {
            bool bad = !isfinite(s->loss_out[t]) || (strict && !(fabsf(s->loss_out[t]) < LIMIT_LOSS));
            for (int j = 0; j < K; j++) bad |= !isfinite(s->logprobs_out[(long)t * K + j]);
            if (!bad) continue;
            if (!isfinite(s->logprobs_out[(long)t * K]))
                err_set(why, n, "data[%d] position %d: the model's own log-probability there is %g: its weights are "
                        "no longer finite, they diverged under the optimizer settings of its optim_steps (a "
                        "learning_rate or weight_decay too high for it): load a checkpoint from before and train on "
                        "with lower ones", d, t, (double)s->logprobs_out[(long)t * K]);
            else if (loss_needs_rl_inputs(s->loss.kind))
                err_set(why, n, "data[%d] position %d: the loss %g is out of range (it must be finite and below 1e30 "
                        "in magnitude); there the learner's logprob is %g, the sampler's logprob %g and the advantage "
                        "%g: check the logprobs and advantages you sent (the importance ratio exp(logprob - sampler "
                        "logprob) of a sampler logprob far below the model's overflows)", d, t,
                        (double)s->loss_out[t], (double)s->logprobs_out[(long)t * K],
                        (double)s->sampler_logprobs[t], (double)s->advantages[t]);
            else
                err_set(why, n, "data[%d] position %d: the loss %g is out of range (it must be finite and below 1e30 "
                        "in magnitude); the learner's logprob there is %g: check the weights you sent", d, t,
                        (double)s->loss_out[t], (double)s->logprobs_out[(long)t * K]);
            return false;
        }
    }
    return true;
}

/* A float32 TensorData of shape [n] (k <= 1) or [n, k] (k > 1, x row-major). */
static json_t *tensor_json(const float *x, int n, int k) {
    json_t *data = json_array();
    long total = (long)n * (k > 1 ? k : 1);
    for (long i = 0; i < total; i++) json_array_append_new(data, json_real(x[i]));
    if (k > 1) return json_pack("{s:o, s:s, s:[i, i]}", "data", data, "dtype", "float32", "shape", n, k);
    return json_pack("{s:o, s:s, s:[i]}", "data", data, "dtype", "float32", "shape", n);
}

/* The routing metrics the SDK documents for MoE models (ForwardBackwardOutput.metrics),
 * over the op's tokens, sparse layer by sparse layer: with c_e the tokens expert e got and
 * b = Σ c_e / E the perfectly balanced share, the fraction of experts with c_e > 0 and
 * with c_e > b, (max c_e − b) / b and (min c_e − b) / b; ":mean" averages the layers,
 * e_max_violation:max takes the worst. counts: [layers, E], summed over the op's datums. */
static void moe_metrics(json_t *metrics, const int64_t *counts, int layers, int E) {
    double with = 0, over = 0, maxv = 0, maxv_max = -INFINITY, minv = 0;
    int used = 0;
    for (int l = 0; l < layers; l++) {
        const int64_t *c = counts + (size_t)l * E;
        double total = 0, hi = (double)c[0], lo = (double)c[0];
        int nz = 0, no = 0;
        for (int e = 0; e < E; e++) total += (double)c[e];
        if (total <= 0) continue;
        double bal = total / E;
        for (int e = 0; e < E; e++) {
            nz += c[e] > 0;
            no += (double)c[e] > bal;
            hi = fmax(hi, (double)c[e]);
            lo = fmin(lo, (double)c[e]);
        }
        with += (double)nz / E;
        over += (double)no / E;
        maxv += (hi - bal) / bal;
        maxv_max = fmax(maxv_max, (hi - bal) / bal);
        minv += (lo - bal) / bal;
        used++;
    }
    if (!used) return;
    json_object_set_new(metrics, "e_frac_with_tokens:mean", json_real(with / used));
    json_object_set_new(metrics, "e_frac_oversubscribed:mean", json_real(over / used));
    json_object_set_new(metrics, "e_max_violation:mean", json_real(maxv / used));
    json_object_set_new(metrics, "e_max_violation:max", json_real(maxv_max));
    json_object_set_new(metrics, "e_min_violation:mean", json_real(minv / used));
}

static void set_result(exe_state *st, exe_op *op, const exe_seq *seqs, const fb_span *sp) {
    json_t *outs = json_array();
    double loss_sum = 0;
    int layers = model_num_moe_layers(&st->model), E = st->model.num_experts;
    size_t ncount = (size_t)layers * E;
    int64_t *counts = ncount ? calloc(ncount, sizeof *counts) : NULL;
    for (int k = sp->first_seq; k < sp->first_seq + sp->nseq; k++) {
        const exe_seq *s = &seqs[k];
        for (int t = 0; t < s->n; t++) loss_sum += s->loss_out[t];
        for (size_t i = 0; counts && s->expert_counts_out && i < ncount; i++) counts[i] += s->expert_counts_out[i];
        json_array_append_new(outs, json_pack("{s:o, s:o}", "logprobs", tensor_json(s->logprobs_out, s->n, s->k),
                                              "elementwise_loss", tensor_json(s->loss_out, s->n, 1)));
    }
    op->result = json_pack("{s:s, s:o, s:{s:f}}", "loss_fn_output_type", "ArrayRecord", "loss_fn_outputs", outs,
                           "metrics", "loss:sum", loss_sum);
    if (counts) {
        moe_metrics(json_object_get(op->result, "metrics"), counts, layers, E);
        /* the operator's per-expert counts (executors.expert_tokens), since start */
        if (!st->expert_tokens) st->expert_tokens = calloc(ncount, sizeof *st->expert_tokens);
        for (size_t i = 0; st->expert_tokens && i < ncount; i++) st->expert_tokens[i] += counts[i];
    }
    free(counts);
}

/* Runs the sequences of the spans that are not dropped (all of them, or only those at
 * risk) as one packed pass. -1 with err when the backend failed. */
static int run_pass(exe_state *st, exe_seq *seqs, fb_span *spans, int nspan, bool at_risk_only, bool backward,
                    char *err, size_t errlen) {
    int cap = 0;
    for (int i = 0; i < nspan; i++) cap += spans[i].nseq;
    exe_seq *batch = malloc((cap ? cap : 1) * sizeof *batch);
    int nb = 0;
    long tokens = 0;
    for (int i = 0; i < nspan; i++) {
        if (spans[i].dropped || (at_risk_only && !spans[i].at_risk)) continue;
        for (int k = spans[i].first_seq; k < spans[i].first_seq + spans[i].nseq; k++) {
            batch[nb++] = seqs[k];   /* a copy of the description; the buffers are shared */
            tokens += seqs[k].n;
        }
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = nb ? st->be->forward_backward(st->ctx, batch, nb, backward, err, errlen) : 0;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (nb)
        log_info("%s%s: %d sequences, %ld tokens in %.3f s (%.0f tok/s)", backward ? OP_FORWARD_BACKWARD : OP_FORWARD,
                 at_risk_only ? " (losses at risk, without gradients)" : "", nb, tokens, secs,
                 secs > 0 ? tokens / secs : 0.0);
    free(batch);
    return rc;
}

/* Packs every datum of the given ops into one batch, runs it, and writes results.
 * Operations whose loss may overflow (loss_token_at_risk: e.g. a sampler logprob of −1000)
 * first run without gradients; those whose loss is out of range fail there and never add a
 * gradient, so the accumulators (theirs and every other op's) stay as they were. */
void exe_run_fb_batch(exe_state *st, exe_op **ops, int nops, bool backward) {
    if (nops == 0) return;
    int cap = 0;
    for (int i = 0; i < nops; i++) cap += (int)json_array_size(json_object_get(ops[i]->payload, "data"));
    exe_seq *seqs = calloc(cap ? cap : 1, sizeof *seqs);
    fb_span *spans = calloc(nops, sizeof *spans);
    int ns = 0, nspan = 0;
    bool any_risk = false;
    for (int i = 0; i < nops; i++) {
        exe_op *op = ops[i];
        exe_adapter *ad = exe_op_training_slot(st, op);
        if (!ad) continue;
        loss_spec ls;
        char why[512] = "";
        json_t *data = json_object_get(op->payload, "data");
        int start = ns;
        bool risk = false;
        if (op_loss(op, &ls, why, sizeof why) == 0) {
            for (size_t d = 0; d < json_array_size(data); d++) {
                char where[32];
                snprintf(where, sizeof where, "data[%zu]", d);
                if (read_datum(st, json_array_get(data, d), &ls, where, &seqs[ns], why, sizeof why) < 0) break;
                seqs[ns].ad = ad;
                seqs[ns].group = i + 1;   /* each op's gradient on its own (batch invariance) */
                risk |= backward && seq_at_risk(&seqs[ns]);
                ns++;
            }
        }
        if (why[0]) {
            for (int k = start; k < ns; k++) free_seq(&seqs[k]);
            ns = start;
            exe_op_fail(op, "user", "malformed %s payload: %s", op->kind, why);
            continue;
        }
        spans[nspan++] = (fb_span){op, start, ns - start, risk, false};
        any_risk |= risk;
    }
    char err[512] = "", why[1024];
    if (any_risk) {
        int rc = run_pass(st, seqs, spans, nspan, true, false, err, sizeof err);
        for (int i = 0; i < nspan; i++) {
            fb_span *sp = &spans[i];
            if (!sp->at_risk) continue;
            if (rc < 0) exe_op_fail(sp->op, "server", "backend error: %s", err);
            else if (!span_in_range(seqs, sp, true, why, sizeof why))
                exe_op_fail(sp->op, "user", "%s. The operation was not applied: it added no gradient.", why);
            sp->dropped = sp->op->category != NULL;
        }
    }
    int rc = run_pass(st, seqs, spans, nspan, false, backward, err, sizeof err);
    for (int i = 0; i < nspan; i++) {
        fb_span *sp = &spans[i];
        if (sp->dropped) continue;
        /* Its gradient is in, even when the op then fails for a loss out of range at some
         * positions (those added nothing): a replay must add it again. */
        sp->op->applied = backward && rc == 0;
        if (rc < 0) exe_op_fail(sp->op, "server", "backend error: %s", err);
        else if (!span_in_range(seqs, sp, false, why, sizeof why))
            exe_op_fail(sp->op, "user", "%s.%s", why, backward ? " Positions whose loss is not finite added no gradient." : "");
        else set_result(st, sp->op, seqs, sp);
    }
    for (int k = 0; k < ns; k++) free_seq(&seqs[k]);
    free(seqs);
    free(spans);
}

/* ---- the cycle -------------------------------------------------------------------- */

void exe_run_create(exe_state *st, exe_op *op) {
    if (!exe_store_get(&st->store, STORE_TRAINING, op->model_id)) {
        char err[512] = "";
        exe_adapter *ad = exe_adapter_new(st->be, st->ctx, &op->lcfg, true, err, sizeof err);
        if (!ad || exe_store_put(&st->store, STORE_TRAINING, op->model_id, ad, false, err, sizeof err) < 0) {
            exe_op_fail(op, "user", "cannot create LoRA adapter: %s", err);
            return;
        }
    }
    op->applied = true;
    op->result = json_pack("{s:s, s:s}", "model_id", op->model_id, "type", OP_CREATE_MODEL);
}

void exe_run_optim(exe_state *st, exe_op *op) {
    exe_adapter *ad = exe_op_training_slot(st, op);
    if (!ad) return;
    /* The api refuses every family but AdamW; an operation that names another one, or
     * carries no Adam parameters, is not run as Adam with zeros or defaults. (Payloads
     * queued before the family was recorded name none: they are Adam's.) */
    const char *family = json_string_value(json_object_get(op->payload, "optimizer"));
    json_t *ap = json_object_get(op->payload, "adam_params");
    if ((family && strcmp(family, "adamw") != 0) || !json_is_object(ap)) {
        exe_op_fail(op, "server", "optimizer step: %s%.60s%s is not run by this executor",
                    family ? "the " : "a step without adam_params", family ? family : "",
                    family ? " optimizer" : "");
        return;
    }
    adam_params p = {
        .learning_rate = json_number_value(json_object_get(ap, "learning_rate")),
        .beta1 = json_number_value(json_object_get(ap, "beta1")),
        .beta2 = json_number_value(json_object_get(ap, "beta2")),
        .eps = json_number_value(json_object_get(ap, "eps")),
        .weight_decay = json_number_value(json_object_get(ap, "weight_decay")),
        .grad_clip_norm = json_number_value(json_object_get(ap, "grad_clip_norm")),
    };
    double gnorm = 0;
    char err[512] = "";
    op->applied = true;   /* a step that fails (non-finite gradient) still clears the gradients */
    if (st->be->optim_step(st->ctx, ad, &p, &gnorm, err, sizeof err) < 0) {
        /* Inputs are checked before any backend sees them and positions whose loss is not
         * finite add no gradient: a gradient that is not finite comes from the model's
         * weights, which the client's settings made diverge. */
        if (!isfinite(gnorm))
            exe_op_fail(op, "user", "the gradient is not finite (norm %g): this model's weights diverged under its "
                        "optimizer settings (this step: learning_rate %g, weight_decay %g, grad_clip_norm %g, beta1 %g, "
                        "beta2 %g, eps %g); no step was taken and the gradients were cleared: load a checkpoint from "
                        "before and train on with a lower learning_rate (or weight_decay), or a grad_clip_norm",
                        gnorm, p.learning_rate, p.weight_decay, p.grad_clip_norm, p.beta1, p.beta2, p.eps);
        else
            exe_op_fail(op, "server", "optimizer step failed: %s", err);
        return;
    }
    op->result = json_pack("{s:{s:f, s:f, s:I}, s:s}", "metrics", "grad_norm:mean", isfinite(gnorm) ? gnorm : -1.0,
                           "learning_rate:mean", p.learning_rate, "step:max", (json_int_t)ad->step,
                           "type", OP_OPTIM_STEP);
}
