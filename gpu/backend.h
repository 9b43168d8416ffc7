/* backend.h — the executor backend table: one packed forward/backward pass over many
 * sequences (each with its own adapter and loss) and the AdamW step. The CPU backend
 * (gpu/cpu/) is the reference; the CUDA backend fills the same table.
 */
#ifndef LOOM_GPU_BACKEND_H
#define LOOM_GPU_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/lora.h"
#include "gpu/model.h"

/* Losses of spec §8; see gpu/loss.h for the per-token formulas. */
typedef enum { LOSS_CROSS_ENTROPY, LOSS_IMPORTANCE_SAMPLING, LOSS_PPO, LOSS_CISPO, LOSS_DRO } loss_kind;

/* clip_low/clip_high: ratio bounds for ppo and cispo (default 0.8 / 1.2); beta: dro
 * (default 0.05). loss_spec_default() in gpu/loss.h fills them. */
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
    const int32_t *targets;       /* target t[0..n) */
    const float *weights;         /* cross_entropy weights (may be negative); NULL = 1.0 */
    const float *sampler_logprobs, *advantages; /* RL losses (required for them) */
    float *logprobs_out;          /* [n] learner log p(t[i] | x[..i]) (caller-allocated) */
    float *loss_out;              /* [n] elementwise loss (caller-allocated) */
    bool forward_only;            /* extension: no gradient from this sequence even when the
                                     pass is a backward one (a `forward` op packed with
                                     forward_backward ops of the same cycle) */
} exe_seq;

typedef struct {
    double learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm;
} adam_params;

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
} exe_backend;

extern const exe_backend exe_backend_cpu;

#endif
