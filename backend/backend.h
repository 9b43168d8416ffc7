/* backend.h — the executor backend table: one packed forward/backward pass over many
 * sequences (each with its own adapter and loss) and the AdamW step. The CPU backend
 * (backend/cpu/) is the reference; the CUDA backend fills the same table.
 */
#ifndef LOOM_BACKEND_BACKEND_H
#define LOOM_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/lora.h"
#include "model/model.h"

/* Losses of spec §8; see backend/loss.h for the per-token formulas. */
typedef enum { LOSS_CROSS_ENTROPY, LOSS_IMPORTANCE_SAMPLING, LOSS_PPO, LOSS_CISPO, LOSS_DRO } loss_kind;

/* clip_low/clip_high: ratio bounds for ppo and cispo (default 0.8 / 1.2); beta: dro
 * (default 0.05). loss_spec_default() in backend/loss.h fills them. */
typedef struct {
    loss_kind kind;
    double clip_low, clip_high, beta;
} loss_spec;

/* One sequence of a packed batch; sequences may belong to different adapters and losses. */
typedef struct {
    adapter *ad;                  /* NULL = base model only (forward only, no gradient) */
    loss_spec loss;
    int n;                        /* tokens */
    const int32_t *tokens;        /* model input x[0..n) */
    const int32_t *targets;       /* target t[0..n) ([n, k] row-major when k > 1) */
    const float *weights;         /* cross_entropy weights (may be negative); NULL = 1.0; [n, k] when k > 1 */
    const float *sampler_logprobs, *advantages; /* RL losses (required for them) */
    float *logprobs_out;          /* [n] learner log p(t[i] | x[..i]) (caller-allocated) */
    float *loss_out;              /* [n] elementwise loss (caller-allocated) */
    bool forward_only;            /* extension: no gradient from this sequence even when the
                                     pass is a backward one (a `forward` op packed with
                                     forward_backward ops of the same cycle) */
    int k;                        /* extension: targets per position for 2-D cross_entropy
                                     (spec §8, top-k distillation): loss_out[i] =
                                     −Σ_j w[i,j]·log p(t[i,j]); 0 or 1 = the usual 1-D case */
    int topk;                     /* extension (sampling's topk_prompt_logprobs, spec §11.2):
                                     when > 0, the topk most likely tokens of each position's
                                     distribution p(· | x[..i]), best first (ties: lower id
                                     first), into topk_ids_out / topk_lp_out [n, topk];
                                     0 ≤ topk ≤ min(vocab, EXE_MAX_TOPK) */
    int32_t *topk_ids_out;
    float *topk_lp_out;
} exe_seq;

#define EXE_MAX_TOPK 1024

typedef struct {
    double learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm;
} adam_params;

/* One sampling request (spec §11): num_samples completions of one prompt, which is
 * prefilled once. Generation of a sample ends after a token of stop_tokens (kept as its
 * last token; the caller adds the model's EOS ids to the list), at max_tokens, or at the
 * context limit. logprobs are those of the distribution actually sampled from (after
 * temperature, top-k, top-p); for greedy decoding (temperature 0) the model's own
 * log-probs. At temperature 1 without filtering they equal forward_backward's logprobs
 * for the same tokens (spec §9.1). Samples are reproducible per (seed, sample index),
 * independently of what else is in the batch. */
typedef struct exe_sample_req {
    adapter *ad;                  /* NULL = base model */
    int n_prompt;                 /* ≥ 1 */
    const int32_t *prompt;
    int num_samples;              /* ≥ 1 */
    int max_tokens;               /* ≥ 0 */
    double temperature;           /* ≥ 0; 0 = greedy */
    int top_k;                    /* ≤ 0 = no limit */
    double top_p;                 /* (0, 1]; 1 = no limit */
    uint64_t seed;
    const int32_t *stop_tokens;
    int n_stop;
    /* Optional (NULL = none): asked after each generated token that is not a stop token,
     * with the sample's tokens so far; true ends the sample there like a stop token (the
     * executor's stop strings). May be called from several threads at once. A backend
     * may ignore it (it then only costs decode steps: the executor cuts the sequence at
     * the stop string itself), so it must be a pure function of its arguments. */
    bool (*stop_check)(const struct exe_sample_req *r, int sample, const int32_t *tokens, int n);
    void *stop_user;              /* for stop_check */
    /* outputs, caller-allocated */
    int32_t *tokens_out;          /* [num_samples, max_tokens] */
    float *logprobs_out;          /* [num_samples, max_tokens] */
    int *n_out;                   /* [num_samples] tokens generated */
    bool *stopped_out;            /* [num_samples] true: ended on a stop token; false: length */
} exe_sample_req;

typedef struct exe_backend {
    const char *name;
    /* threads ≤ 0: use all online CPUs. */
    void *(*create)(const base_model *m, int threads, char *err, size_t errlen);
    void (*destroy)(void *ctx);
    /* Runs all sequences packed into one pass (no padding; each attends only within
     * itself). backward=true ADDS d(sum of loss_out)/dθ into each adapter's gradient
     * accumulator; false touches no gradient. Returns 0, or -1 with err (bad token id,
     * missing RL inputs, adapter for another model, ...) having changed nothing. */
    int (*forward_backward)(void *ctx, exe_seq *seqs, int nseq, bool backward, char *err, size_t errlen);
    /* One AdamW step (torch.optim.AdamW: decoupled weight decay, bias correction) on the
     * accumulated gradients after optional global-norm clipping (torch clip_grad_norm_);
     * zeroes the gradients; *grad_norm_out = pre-clip global L2 norm (may be NULL). */
    int (*optim_step)(void *ctx, adapter *a, const adam_params *p, double *grad_norm_out, char *err, size_t errlen);
    /* Runs the sampling requests together (KV cache; prompts packed, then one token per
     * live sample per step). Touches no gradient. Returns 0, or -1 with err having
     * changed nothing (prompt longer than the context, bad token id, bad parameters). */
    int (*sample)(void *ctx, exe_sample_req *reqs, int nreq, char *err, size_t errlen);
} exe_backend;

extern const exe_backend exe_backend_cpu;

/* The checks every backend's forward_backward applies to one sequence (token ids in the
 * vocabulary, length within max_position_embeddings, RL inputs present, sane clip bounds,
 * adapter made for this model). An executor can call it per datum to fail only the
 * offending operation instead of the whole packed batch. 0 ok, -1 with err. (backend.c) */
int exe_seq_check(const base_model *m, const exe_seq *s, char *err, size_t errlen);

#endif
