/* exe_ckpt.h: checkpoint operations against the registry (exe_ckpt.c): save_weights, the
 * named save_weights_for_sampler, load_weights, and checkpoints loaded for sampling. */
#pragma once
#include "executor/exe_ops.h"

extern const exe_handler_entry exe_ckpt_handlers[];   /* ends with {NULL, NULL} */

/* A registry blob (sampler or training checkpoint, by sha256 digest) as an inference
 * adapter for this executor's base model, cached in the store. The blob is read verified
 * (a corrupted one is an error saying so). *out is pinned: it stays valid until
 * exe_store_release (call it once per successful load, e.g. when the sample batch is
 * done). */
int exe_load_sampler_adapter(exe_state *st, const char *digest, exe_adapter **out, char *err, size_t errlen);

/* Loads the checkpoint a load_weights payload names (path, blob_digest, optimizer) into
 * the model's training slot (made when there is none), without asking the registry again
 * whether the tenant may still read it: load_weights checks that first; a recovery
 * replaying a load_weights committed earlier calls this directly. Sets op->applied. */
void exe_load_checkpoint(exe_state *st, exe_op *op);
