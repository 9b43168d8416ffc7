/* exe_train.h: the training operations of a cycle (exe_train.c): create_model, the packed
 * forward / forward_backward batches (every datum checked by contract/fb_check.h before a
 * backend sees it) and optim_step. */
#pragma once
#include "executor/exe_ops.h"

void exe_run_create(exe_state *st, exe_op *op);
/* Packs every datum of ops into one batch (backward or forward only) and sets results; an
 * op whose datum breaks a rule, or whose loss is out of range, fails alone. */
void exe_run_fb_batch(exe_state *st, exe_op **ops, int nops, bool backward);
void exe_run_optim(exe_state *st, exe_op *op);
