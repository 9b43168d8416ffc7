/* exe_train.h: the training operations of a cycle (exe_train.c): create_model, the packed
 * forward / forward_backward batches, optim_step, and the one validation of a sequence
 * before it reaches a backend. */
#pragma once
#include "executor/exe_ops.h"

void exe_run_create(exe_state *st, exe_op *op);
/* Packs every datum of ops into one batch (backward or forward only) and sets results. */
void exe_run_fb_batch(exe_state *st, exe_op **ops, int nops, bool backward);
void exe_run_optim(exe_state *st, exe_op *op);
/* The one validation of a sequence before it reaches a backend (backends trust it):
 * token ids in the vocabulary, length within the context, a known loss with its RL inputs
 * and sane clip bounds, 2-D targets only for cross_entropy (k <= EXE_MAX_K), top-k within
 * bounds with output buffers. 0 ok, -1 with err. */
int exe_seq_check(const model_config *mc, const exe_seq *s, char *err, size_t errlen);
