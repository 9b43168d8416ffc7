/* contract.h: what Loom's processes must agree on, in one place. The api writes operation
 * rows and validates requests, the scheduler builds cycles from them, the executor runs
 * them; every name, default and limit they share is defined here and nowhere else:
 * operation kinds (operations.kind), NOTIFY channels, the losses with their inputs and
 * loss_fn_config defaults, and the limits of a request. docs/architecture.md describes
 * the processes, docs/protocol.md what a client sees of these rules.
 *
 * The strings are macros so that SQL text can splice them by C string concatenation:
 *   "... WHERE o.kind = '" OP_SAMPLE "'"   "SELECT pg_notify('" CHAN_OP_DONE "', ...)" */
#pragma once
#include <stdbool.h>
#include <stddef.h>

/* ---- operation kinds (operations.kind) ------------------------------------------------- */

#define OP_CREATE_MODEL "create_model"
#define OP_FORWARD "forward"
#define OP_FORWARD_BACKWARD "forward_backward"
#define OP_OPTIM_STEP "optim_step"
#define OP_SAVE_WEIGHTS "save_weights"                   /* training state: weights + Adam */
#define OP_SAVE_FOR_SAMPLER "save_weights_for_sampler"   /* named: a checkpoint; unnamed: a snapshot */
#define OP_LOAD_WEIGHTS "load_weights"
#define OP_SAMPLE "sample"
#define OP_UNLOAD_MODEL "unload_model"                   /* done at once by the api */

/* The checkpoint name (weights/<name>) a model's state is saved under when its session
 * expires (scheduler), as the error of its canceled operations says (api, scheduler). */
#define SESSION_EXPIRED_CHECKPOINT "session-expired"

/* ---- NOTIFY channels (a wake-up hint only: every waiter also polls) ------------------- */

#define CHAN_OP_QUEUED "loom_op_queued"             /* api, reaper -> scheduler */
#define CHAN_EXECUTOR_READY "loom_executor_ready"   /* executors -> scheduler */
#define CHAN_CYCLE "loom_cycle"                     /* scheduler -> executor: the prefix of each
                                                       executor's channel, loom_cycle_<id> */
/* The payload on an idle executor's channel from a submit of a model placed on it (api ->
 * executor): an operation is queued, build the cycle yourself (the scheduler's payload,
 * a cycle built for it, is the executor's id). */
#define CYCLE_HINT_QUEUED "queued"
/* ... and for a forward_backward of a model whose optim_step usually follows (rule 5:
 * pair_p > 0.5): "pair <the model's pair_gap_ms, -1 unknown>". The executor does not
 * look now (its pass would hold it): the step's own hint wakes it, or it looks when the
 * hold would end (plan_pair_window_ms). */
#define CYCLE_HINT_PAIR "pair"
/* A submit's hint ("queued", or "pair <gap>") goes on with what the executor's own
 * pass would read of the operation and its model, space-separated: the operation's id,
 * seq_id, the model's next_seq at the submit, the operation's tokens, its submit (epoch
 * ms), the tenant, whether the tenant has a rate limit (1 / 0), the model's pair_p,
 * pair_gap_ms (-1 unknown) and tail_fb_at (epoch ms, -1 none), the kind and the model's
 * id (last: the rest of the payload). An idle executor woken by one operation's hint
 * alone, or by a held forward_backward's and then its step's, plans them from the hints
 * and claims them in one round trip, guarded (scheduler/cycle.c, sched_build_own_hinted);
 * a bare "queued" is read as before: look. */
#define CHAN_OP_DONE "loom_op_done"                 /* executor, reaper, api -> api (payload: request_id) */
/* An executor's loom_op_done of an operation done with a small result carries the result
 * after the request_id, tab-separated: "request_id\ttenant_id\tkind\tB<hex of result_bin>"
 * (forward / forward_backward) or "...\tJ<result as its jsonb text>" (the others), so
 * that the api answers the parked future without reading it back. Sent with the commit
 * that makes the result final; larger results (the data over OP_DONE_INLINE_MAX bytes,
 * under PostgreSQL's 8000-byte payload limit), failures and other senders' notifications
 * are the request_id alone, and the api reads the row. */
#define OP_DONE_INLINE_MAX "7000"
#define CHAN_API_KEYS "loom_api_keys"               /* database triggers (migration 0031) -> api: a key changed */
/* Streaming (docs/protocol.md §18.5): the tokens of sample operations that asked for
 * progress ("progress": true in the payload) as the executor's decode loop makes them
 * (payload: lines of JSON, one per request and sample), and the request_id of such an
 * operation whose client went away (the executor ends its samples early). */
#define CHAN_SAMPLE_PROGRESS "loom_sample_progress" /* executors -> api */
#define CHAN_SAMPLE_CANCEL "loom_sample_cancel"     /* api -> executors (payload: request_id) */

/* ---- limits of a request (checked by the api before memory is taken for them) --------- */

#define LIMIT_DATA 4096                 /* datums of one forward / forward_backward */
#define LIMIT_K 1024                    /* columns K of a 2-D loss input [N, K] */
#define LIMIT_2D_VALUES (1 << 24)       /* N·K over all 2-D loss inputs of one request */
/* |x| of every float loss input and loss_fn_config value: numbers in a payload stay below
 * 1e18, because jsonb prints large integral values as plain digits that must still read
 * back in the executor. */
#define LIMIT_ABS 1e18
#define LIMIT_LOSS 1e30                 /* |per-token loss| (and its derivative) a datum may reach */
#define LIMIT_LORA_RANK 512
#define LIMIT_NUM_SAMPLES 128           /* num_samples of one asample */
#define LIMIT_TOPK_PROMPT_LOGPROBS 20   /* topk_prompt_logprobs of one asample; also its
                                           topk_sample_logprobs and prompt_alt_tokens_k */
/* num_samples x max_tokens x topk_sample_logprobs of one asample: the per-token top-k lists
 * the executor holds (8 bytes a cell) and the result carries */
#define LIMIT_TOPK_SAMPLE_CELLS (1 << 22)
/* cells of an asample's target_prompt_logprobs ([len(prompt) - 1, K] dense: rows x K; sparse
 * CSR: the values listed), and its columns K */
#define LIMIT_TARGET_PROMPT_CELLS (1 << 20)
#define LIMIT_TARGET_PROMPT_K LIMIT_K

/* ---- sampled sequence ids (docs/protocol.md §11.1) --------------------------------------- */

/* SampledSequence.sequence_id of sample `index` of the sample operation `request_id`:
 * "<request_id>:<index>". The api answers them at submit (sample_sequence_ids), the
 * executor writes them into the result; both call this, so they cannot disagree. A
 * resubmission gets the first submission's request_id, hence the same ids. Returns
 * snprintf's count (>= n: truncated). */
int sample_sequence_id(char *out, size_t n, const char *request_id, int index);
#define SAMPLE_SEQUENCE_ID_MAX 160

/* The range a client may set each optimizer hyperparameter in (docs/protocol.md §7.5):
 * values a training run can use (LoRA learning rates are around 1e-4; none above 10
 * trains). A learning rate of 1e17 used to be taken and turned the model into NaNs at the
 * next step. name: learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm. 0, or
 * -1 with "<name> must be in ..., got <v>" in err (the caller says where: "adam_params.");
 * a name not listed is accepted (not this function's to judge). */
int optim_param_check(const char *name, double v, char *err, size_t errlen);

/* ---- losses (docs/protocol.md §8) ---------------------------------------------------- */

typedef enum { LOSS_CROSS_ENTROPY, LOSS_IMPORTANCE_SAMPLING, LOSS_PPO, LOSS_CISPO, LOSS_DRO, LOSS_N } loss_kind;

/* A loss with its loss_fn_config: clip_low / clip_high are the ratio bounds of ppo and
 * cispo, beta is dro's. loss_spec_default fills the defaults. */
typedef struct {
    loss_kind kind;
    double clip_low, clip_high, beta;
} loss_spec;

/* The per-token inputs of a loss, by their names in loss_fn_inputs and in the payload. */
typedef enum { LOSS_IN_TARGET_TOKENS, LOSS_IN_WEIGHTS, LOSS_IN_LOGPROBS, LOSS_IN_ADVANTAGES, LOSS_N_INPUTS } loss_input;
extern const char *const loss_input_names[LOSS_N_INPUTS];

/* "cross_entropy", "importance_sampling", "ppo", "cispo", "dro" -> kind; -1 if unknown. */
int loss_kind_parse(const char *name, loss_kind *out);
const char *loss_kind_name(loss_kind kind);
/* True for the losses that need sampler logprobs and advantages (all but cross_entropy). */
bool loss_needs_rl_inputs(loss_kind kind);
/* Bit masks (1 << loss_input) of the inputs a loss requires / reads (others are ignored). */
unsigned loss_inputs_required(loss_kind kind);
unsigned loss_inputs_accepted(loss_kind kind);
/* Whether an input may be 2-D [N, K]: target_tokens and weights of cross_entropy. */
bool loss_input_two_d(loss_kind kind, loss_input in);

/* loss_fn_config: clip_low_threshold 0.8 and clip_high_threshold 1.2 (ppo, cispo), beta
 * 0.05 (dro). The keys a loss reads, in this order: */
#define LOSS_CONFIG_KEYS 3
extern const char *const loss_config_keys[LOSS_CONFIG_KEYS];
loss_spec loss_spec_default(loss_kind kind);
/* Whether kind reads config key i (of loss_config_keys). */
bool loss_config_used(loss_kind kind, int i);
double loss_config_get(const loss_spec *s, int i);
/* Sets key to v if kind reads it; other keys are ignored (the protocol allows them). */
void loss_config_set(loss_spec *s, const char *key, double v);
