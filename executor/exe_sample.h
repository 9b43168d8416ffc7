/* exe_sample.h: sampling (exe_sample.c): every 'sample' op of the cycle, run together
 * through backend->sample (and a forward pass for prompt_logprobs), and the unnamed
 * save_weights_for_sampler (payload has "sampling_session_id"): a snapshot of the
 * model's adapter in the store, keyed by the sampling session id; its commit hook sets
 * sampling_sessions.executor_id so the scheduler sends that session's samples here. */
#pragma once
#include "executor/exe_ops.h"

extern const exe_handler_entry exe_sample_handlers[];  /* ends with {NULL, NULL} */
/* A draining executor hands every sampler snapshot it holds over to its pool: the weights
 * into the blob store, the sampling session pointed at the blob instead of this executor
 * (any executor of the base model loads it for the session's samples), the snapshot
 * dropped here. A snapshot that cannot be handed over stays (its samples wait here, and
 * their futures say why). Returns how many went. */
int exe_hand_over_samplers(exe_state *st, PGconn *c);
void exe_run_sample_batch(exe_state *st, exe_op **ops, int nops);
void exe_run_snapshot(exe_state *st, exe_op *op);
