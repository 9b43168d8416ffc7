/* backend.h — the executor backend table: what the executor asks of a device.
 *
 * A backend is opened on one device of one base model (create) and owns everything that
 * lives there: the base weights, in whatever form it computes in, and the LoRA adapters
 * (weights, gradient accumulators, AdamW moments). The executor holds adapters only as
 * opaque handles (be_adapter) and moves their numbers with adapter_upload /
 * adapter_download through the host form of model/lora.h (adapter_state): checkpoints,
 * snapshots, imports, durable snapshots and eviction all go through those two calls, so a backend
 * always knows when its copy changes. Compute is three calls: one packed
 * forward/backward pass over many sequences (each with its own adapter and loss), one
 * AdamW step on one adapter, and batched sampling.
 *
 * The contract (docs/architecture.md, "The backend table"):
 *  - A context is used by one thread at a time; calls run to completion (synchronous).
 *  - Inputs are trusted: the executor validates every datum before it calls
 *    forward_backward (contract/fb_check.h), so a backend does not check token ids, lengths
 *    or loss inputs again. Errors it reports are its own (out of memory, device faults).
 *  - A position whose dℓ/dlp is not finite adds nothing to any gradient (its row of
 *    dℓ/dlogits is zero): an accumulator never holds inf or NaN because of the inputs.
 *  - Adapters passed to a context were allocated by that context.
 *  - Results are those of the CPU backend (backend/cpu/), the numerical reference, within
 *    the tolerances the reference suites state (except "sim", below).
 *
 * Backends: "cpu" (backend/cpu/, always built); "sim" (backend/sim/, always built: a
 * modelled GPU that computes a tiny model of its own and takes the modelled time, for
 * fleet benchmarks; not held to the CPU's results); "cuda" (backend/cuda/, built where nvcc
 * is found).
 */
#ifndef LOOM_BACKEND_BACKEND_H
#define LOOM_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/adamw.h"
#include "backend/loss.h"
#include "contract/contract.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/rng.h"

/* An adapter resident on a backend's device. Backends allocate a larger struct that
 * starts with this header; the executor reads the header only. */
typedef struct be_adapter {
    lora_layout layout;      /* its tensors (names, shapes, offsets): host metadata */
    bool trainable;          /* has gradient accumulators and AdamW moments */
    int64_t step;            /* optimizer steps taken: optim_step adds one; an upload of
                                ADAPTER_OPTIM sets it */
    size_t device_bytes;     /* device memory it holds (what the adapter store budgets) */
} be_adapter;

/* One sequence of a packed batch; sequences may belong to different adapters and losses. */
typedef struct {
    be_adapter *ad;               /* NULL = base model only (forward only, no gradient) */
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
                                     (docs/protocol.md §8, top-k distillation): loss_out[i] =
                                     −Σ_j w[i,j]·log p(t[i,j]); 0 or 1 = the usual 1-D case;
                                     at most LIMIT_K */
    int topk;                     /* extension (sampling's topk_prompt_logprobs, docs/protocol.md §11.2):
                                     when > 0, the topk most likely tokens of each position's
                                     distribution p(· | x[..i]), best first (ties: lower id
                                     first), into topk_ids_out / topk_lp_out [n, topk];
                                     0 ≤ topk ≤ min(vocab, LIMIT_TOPK_PROMPT_LOGPROBS) */
    int32_t *topk_ids_out;
    float *topk_lp_out;
    /* Extensions for sampling's prompt pass (docs/protocol.md §11.2), answered from each
     * row's logits like topk, by the arithmetic every backend shares (be_prompt_extras,
     * sample_pick.c): the same logits give the same numbers on every backend, and a row's
     * answers depend on that row alone (batch invariance).
     * score_*: target_prompt_logprobs. Row i asks for log p(id | x[..i]) of the ids
     * score_ids[score_start[i] .. score_start[i+1]) (in the vocabulary), computed as
     * logprobs_out is, into score_lp_out at the same places. NULL score_start = none. */
    const int64_t *score_start;   /* [n + 1] */
    const int32_t *score_ids;
    float *score_lp_out;
    /* draw_*: prompt_alt_tokens. draw_k independent draws from each row's distribution at
     * draw_temperature (0: the argmax, draw_k times), from a PRNG stream seeded by
     * (draw_seed, row) alone, and their log p under the model's own distribution (as
     * logprobs_out), into draw_ids_out / draw_lp_out [n, draw_k]. 0 = none; at most
     * LIMIT_TOPK_PROMPT_LOGPROBS. */
    int draw_k;
    double draw_temperature;
    uint64_t draw_seed;
    int32_t *draw_ids_out;
    float *draw_lp_out;
    int32_t *expert_counts_out;   /* extension (mixture-of-experts models): when not NULL,
                                     [model_num_moe_layers, num_experts] caller-allocated,
                                     SET to how many of the sequence's positions each
                                     sparse layer routed to each expert (every position
                                     counts num_experts_per_tok times per layer); the
                                     routing metrics of docs/protocol.md §7.3 and the
                                     operator's per-expert counts are made of these */
    int group;                    /* the operation this sequence belongs to: consecutive
                                     sequences of one adapter and one group form one gradient
                                     reduction; each group's gradient is added to the
                                     accumulator on its own, in batch order, so that a pass
                                     of several groups equals one pass per group (an
                                     operation's gradient does not depend on the cycle that
                                     carried it) */
} be_seq;

/* One sampling request (docs/protocol.md §11): num_samples completions of one prompt, which is
 * prefilled once. Generation of a sample ends after a token of stop_tokens (kept as its
 * last token; the caller adds the model's EOS ids to the list), at max_tokens, or at the
 * context limit. logprobs are those of the distribution actually sampled from (after
 * temperature, top-k, top-p); for greedy decoding (temperature 0) the model's own
 * log-probs. At temperature 1 without filtering they equal forward_backward's logprobs
 * for the same tokens (docs/protocol.md §9.1). Samples are reproducible per (seed, sample index),
 * independently of what else is in the batch. */
typedef struct be_sample_req {
    be_adapter *ad;               /* NULL = base model */
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
    bool (*stop_check)(const struct be_sample_req *r, int sample, const int32_t *tokens, int n);
    void *stop_user;              /* for stop_check */
    /* Optional (NULL = none): told after each token is recorded for a sample (tokens_out,
     * logprobs_out, top_*_out, n_out and stopped_out hold it; done: the sample has
     * ended), so that the executor can publish tokens while the batch decodes
     * (streaming, docs/architecture.md "Streaming"). Called from any of the backend's
     * threads, for different samples at once: it must be cheap and thread-safe. True ends
     * the sample there (its client went away), as at max_tokens. */
    bool (*on_token)(const struct be_sample_req *r, int sample, int n, bool done);
    void *on_token_user;          /* for on_token */
    /* Optional: the top_logprobs most likely tokens of the distribution each token was
     * drawn from (the one its logprob is taken from: after temperature, top-k, top-p;
     * greedy: the model's own), most likely first; tokens the filters removed are not
     * listed (their ids are −1). 0 = none; at most LIMIT_TOPK_PROMPT_LOGPROBS. */
    int top_logprobs;
    int32_t *top_ids_out;         /* [num_samples, max_tokens, top_logprobs] */
    float *top_lp_out;            /* [num_samples, max_tokens, top_logprobs] */
    /* outputs, caller-allocated */
    int32_t *tokens_out;          /* [num_samples, max_tokens] */
    float *logprobs_out;          /* [num_samples, max_tokens] */
    int *n_out;                   /* [num_samples] tokens generated */
    bool *stopped_out;            /* [num_samples] true: ended on a stop token; false: length */
} be_sample_req;

/* Where a backend runs. */
typedef struct {
    int device;                   /* device index (the CPU backend has one device, 0) */
    int threads;                  /* CPU threads; ≤ 0: all online CPUs */
} be_backend_opts;

/* What a backend says about its device, after the base weights are loaded. */
typedef struct {
    char device[128];             /* e.g. "cpu:0 (16 threads)", "cuda:1 NVIDIA H100" */
    size_t memory_total;          /* bytes of device memory */
    size_t memory_free;           /* bytes still free for adapters and activations */
    size_t attn_workspace;        /* bytes held for the attention's reusable workspace (cuDNN's
                                     deterministic backward keeps dP, T x T per head of a head
                                     group, within a quarter of the device); 0: none */
} be_device_info;

typedef struct be_backend {
    const char *name;
    /* Batch invariance (docs/architecture.md, "Batch invariance"): every output of a
     * sequence and every group's gradient are the same bits whatever else shares the
     * pass, wherever the sequence lies in it, and whatever the thread count. The executor
     * then recovers a model by replaying its operations alone (exact); a backend without
     * it has its models' state written at every optim_step instead. */
    bool batch_invariant;
    /* Devices on this machine (0 where there are none or no driver); never fails hard, so
     * a binary built with a device backend still starts where that device is missing. */
    int (*device_count)(void);

    /* ---- the device and the base model -------------------------------------------- */
    /* Opens device o->device and loads m's weights there. m may be closed once create
     * returns. NULL with err (no such device, out of memory, unsupported model). */
    void *(*create)(const model_files *m, const be_backend_opts *o, char *err, size_t errlen);
    void (*destroy)(void *ctx);
    void (*device_info)(void *ctx, be_device_info *out);

    /* ---- adapters ----------------------------------------------------------------- */
    /* A new adapter of config c on this model: every part zero, step 0 (the executor
     * uploads the initial weights). trainable: with gradients and AdamW moments (a
     * training slot); else weights only (a sampler). NULL with err (out of memory). */
    be_adapter *(*adapter_alloc)(void *ctx, const lora_config *c, bool trainable, char *err, size_t errlen);
    void (*adapter_free)(void *ctx, be_adapter *a);
    /* Copies the parts named (ADAPTER_PARAMS | ADAPTER_GRADS | ADAPTER_OPTIM) from the host
     * form into a; a NULL array of src writes zeros; ADAPTER_OPTIM also sets a->step. src
     * has a's layout. Parts not named are left as they are. Naming GRADS or OPTIM for an
     * adapter that is not trainable is an error. 0, or -1 with err and a unchanged. */
    int (*adapter_upload)(void *ctx, be_adapter *a, const adapter_state *src, unsigned parts, char *err,
                          size_t errlen);
    /* Copies the parts named from a into dst, whose arrays for them are allocated
     * (adapter_state_alloc with a's layout); ADAPTER_OPTIM also sets dst->step. */
    int (*adapter_download)(void *ctx, const be_adapter *a, adapter_state *dst, unsigned parts, char *err,
                            size_t errlen);
    /* dst's parts named := src's, on the device (a sampler snapshot of a training slot). */
    int (*adapter_copy)(void *ctx, be_adapter *dst, const be_adapter *src, unsigned parts, char *err,
                        size_t errlen);

    /* ---- compute ------------------------------------------------------------------ */
    /* Runs all sequences packed into one pass (no padding; each attends only within
     * itself). backward=true ADDS d(sum of loss_out)/dθ into each trainable adapter's
     * gradient accumulator; false touches no gradient. Returns 0, or -1 with err having
     * changed nothing. */
    int (*forward_backward)(void *ctx, be_seq *seqs, int nseq, bool backward, char *err, size_t errlen);
    /* One AdamW step (torch.optim.AdamW: decoupled weight decay, bias correction) on the
     * accumulated gradients after optional global-norm clipping (torch clip_grad_norm_);
     * zeroes the gradients; *grad_norm_out = pre-clip global L2 norm (may be NULL). */
    int (*optim_step)(void *ctx, be_adapter *a, const adam_params *p, double *grad_norm_out, char *err,
                      size_t errlen);
    /* Runs the sampling requests together (KV cache; prompts packed, then one token per
     * live sample per step). Touches no gradient. Returns 0, or -1 with err having
     * changed nothing (prompt longer than the context, bad token id, bad parameters). */
    int (*sample)(void *ctx, be_sample_req *reqs, int nreq, char *err, size_t errlen);
} be_backend;

/* The backends of this build, by name; NULL if unknown. be_backend_names lists them
 * ("cpu, sim, cuda") for messages. (backends.c) */
const be_backend *be_backend_find(const char *name);
const char *be_backend_names(void);

/* The named backend's device_count (0 when the name is unknown). (backends.c) */
int be_backend_device_count(const char *name);

/* ---- what every backend's sample does alike (backend.c) -------------------------------- */

/* One sample being generated. Its PRNG stream is seeded by (seed, sample index) alone, so
 * that a sample does not depend on the rest of the batch. */
typedef struct {
    be_sample_req *req;
    int index;                    /* sample index within its request */
    int n_gen;                    /* tokens generated so far */
    bool done;
    int32_t last;                 /* the last token generated: the next decode input */
    rng_state rng;
} be_sample_stream;

/* Checks a request against the model (prompt ids and length, parameters, output buffers).
 * 0, or -1 with err. */
int be_sample_check(const model_config *mc, const be_sample_req *r, char *err, size_t errlen);
/* Sample `index` of r before its first token (done at once when max_tokens is 0); resets
 * r's n_out and stopped_out for it. */
void be_sample_stream_init(be_sample_stream *s, be_sample_req *r, int index);
/* Appends a generated token to s's outputs and decides whether s is done: a stop token
 * (kept as the last token), stop_check, max_tokens, or the context limit max_pos (the next
 * pass would feed the token at position n_prompt + n_gen − 1). */
void be_sample_record(be_sample_stream *s, int32_t tok, float lp, int max_pos);
/* The choice's arithmetic (sample_pick.c), shared by the CPU sampler (cpu_choose.c) and be_sample_top.
 * be_sample_weights: *best = the argmax of z; greedy (temperature 0): returns
 * Σ exp(z − max) (w untouched); else w[v] = exp((z − max) / temperature), zero below the
 * top-k threshold, and returns Σ w. keys: V uint64 of scratch. */
double be_sample_weights(const be_sample_req *r, const float *z, long V, float *w, uint64_t *keys, long *best);
/* The top-p nucleus of w (sum Σ w): keys[0..keep) = (bits(w) << 32 | id) of the smallest
 * set of most likely tokens whose mass *cum reaches top_p·sum, most likely first; returns
 * keep. */
long be_sample_nucleus(const be_sample_req *r, const float *w, long V, double sum, uint64_t *keys, double *cum);
/* When s's request asks for top_logprobs: the most likely tokens of the distribution the
 * next token of s is drawn from, given that row's logits z[0..V), into the request's
 * top_*_out at s's next position (call before be_sample_record). w: V floats and keys: V
 * uint64 of scratch. The same arithmetic as the CPU backend's choice (cpu_choose.c), so
 * that the sampled token's entry equals its logprob. */
void be_sample_top(const be_sample_stream *s, const float *z, long V, float *w, uint64_t *keys);
/* The prompt-pass extensions of be_seq (score_*, draw_*) for row `row` of s, from that
 * row's logits z[0..V) and lse = log Σ exp(z) (the one its logprobs_out used). Pure and
 * thread-safe: the CPU backend calls it inside its head, the CUDA backend on rows it
 * brings to the host, so that both draw the same tokens from the same logits. */
void be_prompt_extras(const be_seq *s, int row, const float *z, long V, double lse);
static inline bool be_seq_has_extras(const be_seq *s) { return s->score_start || s->draw_k > 0; }

/* ---- what every backend's sparse (mixture-of-experts) layer does alike (backend.c) ------- */

/* Groups a sparse layer's T·K (token, expert) assignments sel[T·K] (token t's experts at
 * sel[t·K ..]) expert by expert, tokens in row order within an expert, so that each
 * expert's rows are one block: off[E + 1] each expert's first grouped row, a_pos[T·K] the
 * grouped row of each assignment, a_tok[T·K] the token row of each grouped row. fill: E
 * ints of scratch. */
void be_moe_group(const int32_t *sel, long T, int K, int E, int *off, int *fill, int32_t *a_pos, int32_t *a_tok);
/* The first grouped row of [lo, hi) (one expert's block) whose token row is at least t:
 * where a segment starting at row t begins in that block. */
int be_moe_lower(const int32_t *a_tok, int lo, int hi, long t);

/* The transfer contract's check (adapter_upload / download / copy): a's layout is other's,
 * and GRADS or OPTIM are named only for a trainable adapter. 0, or -1 with err (prefixed
 * by who, the backend's name). (backend.c) */
int be_adapter_check_parts(const be_adapter *a, const lora_layout *other, unsigned parts, const char *who, char *err,
                           size_t errlen);

/* Helpers made of table calls only (backend.c). */
/* A fresh adapter with PEFT's initial weights (model/lora.h), zero Adam state. */
be_adapter *be_adapter_new(const be_backend *be, void *ctx, const lora_config *c, bool trainable, char *err,
                           size_t errlen);
/* A new adapter holding st's parts (those st has). */
be_adapter *be_adapter_from_state(const be_backend *be, void *ctx, const adapter_state *st, bool trainable,
                                  char *err, size_t errlen);
/* The parts of a as a new host state (dst is allocated here). */
int be_adapter_to_state(const be_backend *be, void *ctx, const be_adapter *a, unsigned parts, adapter_state *dst,
                        char *err, size_t errlen);

#endif
