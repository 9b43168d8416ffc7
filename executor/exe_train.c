/* exe_train.c: the training operations of a cycle: create_model (a new LoRA adapter),
 * forward / forward_backward (one packed batch across adapters and losses) and
 * optim_step (AdamW on one adapter). */
#include "executor/exe_train.h"
#include "backend/loss.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "contract/fb_check.h"
#include "contract/fb_payload.h"
#include "contract/fb_result.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- forward / forward_backward ------------------------------------------------- */

typedef struct {
    exe_op *op;
    int first_seq, nseq;     /* the op's datums in the packed batch */
    bool at_risk;            /* a position may overflow (loss_token_at_risk) */
    bool dropped;            /* failed before the pass: none of its sequences run */
} fb_span;

static void free_seq(be_seq *s) {
    free((void *)s->tokens); free((void *)s->targets); free((void *)s->weights);
    free((void *)s->sampler_logprobs); free((void *)s->advantages);
    free(s->logprobs_out); free(s->loss_out); free(s->expert_counts_out);
}

/* One datum of the payload as a sequence of the batch, after the shared check (the
 * executor's defence: a payload that breaks a rule fails its own operation only). The
 * sequence takes over the datum's arrays. */
static int read_datum(exe_state *st, fb_payload_datum *d, const loss_spec *ls, const char *where, be_seq *s,
                      char *err, size_t errlen) {
    unsigned accepted = loss_inputs_accepted(ls->kind);
    for (int k = 0; k < LOSS_N_INPUTS; k++) {   /* the api writes only the inputs the loss reads */
        if (!d->has[k] || accepted & (1u << k)) continue;
        d->has[k] = false;
        free(k == LOSS_IN_TARGET_TOKENS ? (void *)d->targets : (void *)d->f[k]);
        if (k == LOSS_IN_TARGET_TOKENS) d->targets = NULL;
        else d->f[k] = NULL;
    }
    fb_view v = {.n_tokens = d->n, .tokens32 = d->tokens, .targets32 = d->targets};
    for (int k = 0; k < LOSS_N_INPUTS; k++) {
        bool per_target = k == LOSS_IN_TARGET_TOKENS || k == LOSS_IN_WEIGHTS;
        size_t cols = per_target ? d->k : 1;
        v.in[k] = (fb_view_input){.present = d->has[k], .dims = cols > 1 ? 2 : 1, .cols = cols,
                                   .values = d->has[k] ? d->n * cols : 0};
    }
    fb_check_model m = {.vocab_size = st->model.vocab_size, .max_context = st->model.max_position_embeddings};
    if (fb_check_datum(&m, ls->kind, &v, where, err, errlen) < 0) return -1;
    size_t n = d->n, nk = n * d->k;
    *s = (be_seq){.loss = *ls, .n = (int)n, .k = (int)d->k, .tokens = d->tokens, .targets = d->targets,
                   .weights = d->f[LOSS_IN_WEIGHTS], .sampler_logprobs = d->f[LOSS_IN_LOGPROBS],
                   .advantages = d->f[LOSS_IN_ADVANTAGES], .logprobs_out = calloc(nk, sizeof(float)),
                   .loss_out = calloc(n, sizeof(float))};
    size_t ncount = (size_t)model_num_moe_layers(&st->model) * st->model.num_experts;
    if (ncount) s->expert_counts_out = calloc(ncount, sizeof(int32_t));
    memset(d, 0, sizeof *d);   /* now the sequence's */
    return 0;
}

static bool seq_at_risk(const be_seq *s) {
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
static bool span_in_range(const be_seq *seqs, const fb_span *sp, bool strict, char *why, size_t n) {
    for (int d = 0; d < sp->nseq; d++) {
        const be_seq *s = &seqs[sp->first_seq + d];
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

/* The routing metrics the SDK documents for MoE models (ForwardBackwardOutput.metrics),
 * over the op's tokens, sparse layer by sparse layer: with c_e the tokens expert e got and
 * b = Σ c_e / E the perfectly balanced share, the fraction of experts with c_e > 0 and
 * with c_e > b, (max c_e − b) / b and (min c_e − b) / b; ":mean" averages the layers,
 * e_max_violation:max takes the worst. counts: [layers, E], summed over the op's datums. */
static size_t moe_metrics(fb_metric *m, const int64_t *counts, int layers, int E) {
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
    if (!used) return 0;
    m[0] = (fb_metric){"e_frac_with_tokens:mean", with / used};
    m[1] = (fb_metric){"e_frac_oversubscribed:mean", over / used};
    m[2] = (fb_metric){"e_max_violation:mean", maxv / used};
    m[3] = (fb_metric){"e_max_violation:max", maxv_max};
    m[4] = (fb_metric){"e_min_violation:mean", minv / used};
    return 5;
}

/* The op's result: the packed outputs and metrics (op->result_bin, what the client
 * receives) and their JSON header (op->result); contract/fb_result.h. Neither when the
 * result cannot be encoded (the caller fails the op). */
static void set_result(exe_state *st, exe_op *op, const be_seq *seqs, const fb_span *sp) {
    double loss_sum = 0;
    int layers = model_num_moe_layers(&st->model), E = st->model.num_experts;
    size_t ncount = (size_t)layers * E;
    int64_t *counts = ncount ? calloc(ncount, sizeof *counts) : NULL;
    fb_output *outs = calloc(sp->nseq ? sp->nseq : 1, sizeof *outs);
    for (int d = 0; d < sp->nseq && outs; d++) {
        const be_seq *s = &seqs[sp->first_seq + d];
        for (int t = 0; t < s->n; t++) loss_sum += s->loss_out[t];
        for (size_t i = 0; counts && s->expert_counts_out && i < ncount; i++) counts[i] += s->expert_counts_out[i];
        outs[d] = (fb_output){.n = (size_t)s->n, .k = s->k > 1 ? (size_t)s->k : 1, .logprobs = s->logprobs_out,
                              .loss = s->loss_out};
    }
    fb_metric m[6] = {{"loss:sum", loss_sum}};
    size_t nm = 1;
    if (counts) {
        nm += moe_metrics(m + 1, counts, layers, E);
        /* the operator's per-expert counts (executors.expert_tokens), since start */
        if (!st->expert_tokens) st->expert_tokens = calloc(ncount, sizeof *st->expert_tokens);
        for (size_t i = 0; st->expert_tokens && i < ncount; i++) st->expert_tokens[i] += counts[i];
    }
    if (outs && (op->result_bin = fb_result_encode(m, nm, outs, (size_t)sp->nseq, &op->result_bin_len)))
        op->result = fb_result_header(m, nm);
    free(outs);
    free(counts);
}

/* Runs the sequences of the spans that are not dropped (all of them, or only those at
 * risk) as one packed pass. -1 with err when the backend failed. */
static int run_pass(exe_state *st, be_seq *seqs, fb_span *spans, int nspan, bool at_risk_only, bool backward,
                    char *err, size_t errlen) {
    int cap = 0;
    for (int i = 0; i < nspan; i++) cap += spans[i].nseq;
    be_seq *batch = malloc((cap ? cap : 1) * sizeof *batch);
    int nb = 0;
    long tokens = 0;
    for (int i = 0; i < nspan; i++) {
        if (spans[i].dropped || (at_risk_only && !spans[i].at_risk)) continue;
        for (int k = spans[i].first_seq; k < spans[i].first_seq + spans[i].nseq; k++) {
            batch[nb++] = seqs[k];   /* a copy of the description; the buffers are shared */
            tokens += seqs[k].n;
        }
    }
    double t0 = clock_mono_s();
    int rc = nb ? st->be->forward_backward(st->ctx, batch, nb, backward, err, errlen) : 0;
    double secs = clock_mono_s() - t0;
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
    fb_payload_reader *rd = calloc(nops, sizeof *rd);
    char (*why)[512] = calloc(nops, sizeof *why);
    int cap = 0;
    for (int i = 0; i < nops; i++) {
        if (fb_payload_open(&rd[i], ops[i]->payload_bin, ops[i]->payload_bin_len, why[i], sizeof why[i]) == 0 &&
            fb_check_loss(&rd[i].loss, "payload", why[i], sizeof why[i]) == 0 && rd[i].datums > (size_t)LIMIT_DATA)
            err_set(why[i], sizeof why[i], "%zu datums, more than the %d of a request", rd[i].datums, LIMIT_DATA);
        if (!why[i][0]) cap += (int)rd[i].datums;
    }
    be_seq *seqs = calloc(cap ? cap : 1, sizeof *seqs);
    fb_span *spans = calloc(nops, sizeof *spans);
    int ns = 0, nspan = 0;
    bool any_risk = false;
    for (int i = 0; i < nops; i++) {
        exe_op *op = ops[i];
        be_adapter *ad = exe_op_training_slot(st, op);
        if (!ad) continue;
        int start = ns;
        bool risk = false;
        fb_payload_datum d;
        for (size_t k = 0; !why[i][0]; k++) {
            int got = fb_payload_next(&rd[i], &d, why[i], sizeof why[i]);
            if (got <= 0) break;
            char where[32];
            snprintf(where, sizeof where, "data[%zu]", k);
            int rc = read_datum(st, &d, &rd[i].loss, where, &seqs[ns], why[i], sizeof why[i]);
            fb_payload_datum_free(&d);
            if (rc < 0) break;
            seqs[ns].ad = ad;
            seqs[ns].group = i + 1;   /* each op's gradient on its own (batch invariance) */
            risk |= backward && seq_at_risk(&seqs[ns]);
            ns++;
        }
        if (why[i][0]) {
            for (int k = start; k < ns; k++) free_seq(&seqs[k]);
            ns = start;
            exe_op_fail(op, "user", "malformed %s payload: %s", op->kind, why[i]);
            continue;
        }
        spans[nspan++] = (fb_span){op, start, ns - start, risk, false};
        any_risk |= risk;
    }
    free(rd);
    free(why);
    char err[512] = "", msg[1024];
    if (any_risk) {
        int rc = run_pass(st, seqs, spans, nspan, true, false, err, sizeof err);
        for (int i = 0; i < nspan; i++) {
            fb_span *sp = &spans[i];
            if (!sp->at_risk) continue;
            if (rc < 0) exe_op_fail(sp->op, "server", "backend error: %s", err);
            else if (!span_in_range(seqs, sp, true, msg, sizeof msg))
                exe_op_fail(sp->op, "user", "%s. The operation was not applied: it added no gradient.", msg);
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
        else if (!span_in_range(seqs, sp, false, msg, sizeof msg))
            exe_op_fail(sp->op, "user", "%s.%s", msg, backward ? " Positions whose loss is not finite added no gradient." : "");
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
        be_adapter *ad = be_adapter_new(st->be, st->ctx, &op->lcfg, true, err, sizeof err);
        if (!ad || exe_store_put(&st->store, STORE_TRAINING, op->model_id, ad, false, err, sizeof err) < 0) {
            exe_op_fail(op, "user", "cannot create LoRA adapter: %s", err);
            return;
        }
    }
    op->applied = true;
    op->result = json_pack("{s:s, s:s}", "model_id", op->model_id, "type", OP_CREATE_MODEL);
}

void exe_run_optim(exe_state *st, exe_op *op) {
    be_adapter *ad = exe_op_training_slot(st, op);
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
