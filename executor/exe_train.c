/* exe_train.c: the training operations of a cycle: create_model (a new LoRA adapter),
 * forward / forward_backward (one packed batch across adapters and losses) and
 * optim_step (AdamW on one adapter). */
#include "executor/exe_train.h"
#include "backend/loss.h"
#include "common/err.h"
#include "common/log.h"
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the one validation of a sequence -------------------------------------------- */

int exe_seq_check(const model_config *mc, const exe_seq *s, char *err, size_t errlen)
{
    if (s->n < 0) { err_set(err, errlen, "negative length"); return -1; }
    if (s->n == 0) return 0;
    if (!s->tokens || !s->targets) { err_set(err, errlen, "missing tokens or target_tokens"); return -1; }
    if (s->n > mc->max_position_embeddings) {
        err_set(err, errlen, "%d tokens exceed the model's context of %d", s->n, mc->max_position_embeddings);
        return -1;
    }
    if ((unsigned)s->loss.kind > LOSS_DRO) { err_set(err, errlen, "unknown loss"); return -1; }
    int K = s->k > 1 ? s->k : 1;
    if (s->k < 0 || s->k > EXE_MAX_K || (K > 1 && s->loss.kind != LOSS_CROSS_ENTROPY)) {
        err_set(err, errlen, "2-D target_tokens (k = %d) need cross_entropy and k <= %d", s->k, EXE_MAX_K);
        return -1;
    }
    if (loss_needs_rl_inputs(s->loss.kind) && (!s->sampler_logprobs || !s->advantages)) {
        err_set(err, errlen, "loss %s needs logprobs and advantages", loss_kind_name(s->loss.kind));
        return -1;
    }
    if ((s->loss.kind == LOSS_PPO || s->loss.kind == LOSS_CISPO) && !(s->loss.clip_low <= s->loss.clip_high)) {
        err_set(err, errlen, "clip_low_threshold %g > clip_high_threshold %g", s->loss.clip_low, s->loss.clip_high);
        return -1;
    }
    if (s->topk < 0 || s->topk > EXE_MAX_TOPK || s->topk > mc->vocab_size || (s->topk > 0 && (!s->topk_ids_out || !s->topk_lp_out))) {
        err_set(err, errlen, "topk %d outside 0..%d or without output buffers", s->topk, EXE_MAX_TOPK);
        return -1;
    }
    for (int t = 0; t < s->n; t++)
        if (s->tokens[t] < 0 || s->tokens[t] >= mc->vocab_size) {
            err_set(err, errlen, "position %d: token id outside [0, %d)", t, mc->vocab_size);
            return -1;
        }
    for (long t = 0; t < (long)s->n * K; t++)
        if (s->targets[t] < 0 || s->targets[t] >= mc->vocab_size) {
            err_set(err, errlen, "target %ld: token id outside [0, %d)", t, mc->vocab_size);
            return -1;
        }
    return 0;
}

/* ---- forward / forward_backward ------------------------------------------------- */

typedef struct {
    exe_op *op;
    int first_seq, nseq;     /* the op's datums in the packed batch */
} fb_span;

/* The loss of an op: its name and the overrides of loss_fn_config (backend/loss.h defaults). */
static bool parse_loss(const char *name, json_t *cfg, loss_spec *out) {
    loss_kind kind;
    if (loss_kind_parse(name, &kind) != 0) return false;
    *out = loss_spec_default(kind);
    json_t *v;
    if ((v = json_object_get(cfg, "clip_low_threshold")) && json_is_number(v)) out->clip_low = json_number_value(v);
    if ((v = json_object_get(cfg, "clip_high_threshold")) && json_is_number(v)) out->clip_high = json_number_value(v);
    if ((v = json_object_get(cfg, "beta")) && json_is_number(v)) out->beta = json_number_value(v);
    return true;
}

/* Copies a JSON number array of length n into a new buffer; NULL if absent. */
static float *f32_array(json_t *a, int n) {
    if (!json_is_array(a) || (int)json_array_size(a) != n) return NULL;
    float *o = malloc((n ? n : 1) * sizeof *o);
    for (int i = 0; i < n; i++) o[i] = (float)json_number_value(json_array_get(a, i));
    return o;
}

static int32_t *i32_array(json_t *a, int n) {
    if (!json_is_array(a) || (int)json_array_size(a) != n) return NULL;
    int32_t *o = malloc((n ? n : 1) * sizeof *o);
    for (int i = 0; i < n; i++) o[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return o;
}

/* A float32 TensorData of shape [n] (k <= 1) or [n, k] (k > 1, x row-major). */
static json_t *tensor_json(const float *x, int n, int k) {
    json_t *data = json_array();
    long total = (long)n * (k > 1 ? k : 1);
    for (long i = 0; i < total; i++) {
        double v = x[i];
        if (isnan(v)) v = 0;          /* guarded below: a NaN fails the op */
        if (isinf(v)) v = v < 0 ? -FLT_MAX : FLT_MAX;
        json_array_append_new(data, json_real(v));
    }
    if (k > 1) return json_pack("{s:o, s:s, s:[i, i]}", "data", data, "dtype", "float32", "shape", n, k);
    return json_pack("{s:o, s:s, s:[i]}", "data", data, "dtype", "float32", "shape", n);
}

static void free_seq(exe_seq *s) {
    free((void *)s->tokens); free((void *)s->targets); free((void *)s->weights);
    free((void *)s->sampler_logprobs); free((void *)s->advantages);
    free(s->logprobs_out); free(s->loss_out);
}

/* Packs every datum of the given ops into one batch, runs it, and writes results. */
void exe_run_fb_batch(exe_state *st, exe_op **ops, int nops, bool backward) {
    if (nops == 0) return;
    int cap = 0;
    for (int i = 0; i < nops; i++) cap += (int)json_array_size(json_object_get(ops[i]->payload, "data"));
    exe_seq *seqs = calloc(cap ? cap : 1, sizeof *seqs);
    fb_span *spans = calloc(nops, sizeof *spans);
    int ns = 0, nspan = 0;
    for (int i = 0; i < nops; i++) {
        exe_op *op = ops[i];
        exe_adapter *ad = exe_op_training_slot(st, op);
        if (!ad) continue;
        loss_spec ls;
        json_t *p = op->payload;
        const char *lname = json_string_value(json_object_get(p, "loss_fn"));
        if (!lname || !parse_loss(lname, json_object_get(p, "loss_fn_config"), &ls)) {
            exe_op_fail(op, "user", "unknown loss_fn '%s'", lname ? lname : "(none)");
            continue;
        }
        json_t *data = json_object_get(p, "data");
        int start = ns;
        char why[256] = "";
        for (size_t d = 0; d < json_array_size(data) && !why[0]; d++) {
            json_t *dj = json_array_get(data, d);
            int n = (int)json_array_size(json_object_get(dj, "tokens"));
            /* 2-D cross_entropy (spec §8): "k" targets per position, [n, k] row-major */
            json_t *kj = json_object_get(dj, "k");
            json_int_t k = kj ? (json_is_integer(kj) ? json_integer_value(kj) : -1) : 1;
            if (k < 1 || k > EXE_MAX_K) {
                snprintf(why, sizeof why, "data[%zu]: k = %lld outside 1..%d", d, (long long)k, EXE_MAX_K);
                break;
            }
            int nk = n * (int)k;
            exe_seq *s = &seqs[ns++];
            s->ad = ad;
            s->loss = ls;
            s->n = n;
            s->k = (int)k;
            s->tokens = i32_array(json_object_get(dj, "tokens"), n);
            s->targets = i32_array(json_object_get(dj, "target_tokens"), nk);
            s->weights = f32_array(json_object_get(dj, "weights"), nk);
            s->sampler_logprobs = f32_array(json_object_get(dj, "logprobs"), n);
            s->advantages = f32_array(json_object_get(dj, "advantages"), n);
            s->logprobs_out = calloc(nk ? nk : 1, sizeof(float)); /* [n, k] */
            s->loss_out = calloc(n ? n : 1, sizeof(float));       /* [n] */
            char e[200];
            if (exe_seq_check(&st->model, s, e, sizeof e) < 0) snprintf(why, sizeof why, "data[%zu]: %s", d, e);
        }
        if (why[0]) {
            for (int k = start; k < ns; k++) free_seq(&seqs[k]);
            memset(&seqs[start], 0, (ns - start) * sizeof *seqs);
            ns = start;
            exe_op_fail(op, "user", "malformed datum for %s: %s", lname, why);
            continue;
        }
        spans[nspan++] = (fb_span){op, start, ns - start};
    }
    if (ns > 0) {
        char err[512] = "";
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = st->be->forward_backward(st->ctx, seqs, ns, backward, err, sizeof err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long tokens = 0;
        for (int k = 0; k < ns; k++) tokens += seqs[k].n;
        double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        log_info("%s: %d sequences, %ld tokens in %.3f s (%.0f tok/s)", backward ? "forward_backward" : "forward",
                 ns, tokens, secs, secs > 0 ? tokens / secs : 0.0);
        for (int i = 0; i < nspan; i++) {
            exe_op *op = spans[i].op;
            if (rc < 0) { exe_op_fail(op, "server", "backend error: %s", err); continue; }
            json_t *outs = json_array();
            double loss_sum = 0;
            bool nonfinite = false;
            for (int k = spans[i].first_seq; k < spans[i].first_seq + spans[i].nseq; k++) {
                exe_seq *s = &seqs[k];
                int K = s->k > 1 ? s->k : 1;
                for (int t = 0; t < s->n; t++) {
                    loss_sum += s->loss_out[t];
                    if (isnan(s->loss_out[t])) nonfinite = true;
                }
                for (long t = 0; t < (long)s->n * K; t++)
                    if (isnan(s->logprobs_out[t])) nonfinite = true;
                json_array_append_new(outs, json_pack("{s:o, s:o}", "logprobs", tensor_json(s->logprobs_out, s->n, K),
                                                      "elementwise_loss", tensor_json(s->loss_out, s->n, 1)));
            }
            if (nonfinite) {
                json_decref(outs);
                exe_op_fail(op, "user", "the loss is not a number (NaN): check loss inputs (e.g. huge advantages or "
                        "sampler logprobs far from the model's)");
                continue;
            }
            op->result = json_pack("{s:s, s:o, s:{s:f}}", "loss_fn_output_type", "ArrayRecord",
                                   "loss_fn_outputs", outs, "metrics", "loss:sum", loss_sum);
        }
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
    op->result = json_pack("{s:s, s:s}", "model_id", op->model_id, "type", "create_model");
}

void exe_run_optim(exe_state *st, exe_op *op) {
    exe_adapter *ad = exe_op_training_slot(st, op);
    if (!ad) return;
    json_t *ap = json_object_get(op->payload, "adam_params");
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
    if (st->be->optim_step(st->ctx, ad, &p, &gnorm, err, sizeof err) < 0) {
        exe_op_fail(op, "server", "optimizer step failed: %s", err);
        return;
    }
    op->result = json_pack("{s:{s:f, s:f, s:I}, s:s}", "metrics", "grad_norm:mean", isfinite(gnorm) ? gnorm : -1.0,
                           "learning_rate:mean", p.learning_rate, "step:max", (json_int_t)ad->step,
                           "type", "optim_step");
}
