/* exe_ckpt.h: checkpoint operations against the registry (exe_ckpt.c): save_weights, the
 * named save_weights_for_sampler, load_weights, and checkpoints loaded for sampling. */
#pragma once
#include "executor/exe_ops.h"
#include "registry/blobstore.h"

extern const exe_handler_entry exe_ckpt_handlers[];   /* ends with {NULL, NULL} */

/* The adapter's weights (and its Adam moments: training) in the checkpoint format, put
 * into the blob store: *bytes (malloc'd: to store again if the registry GC takes the blob
 * before a row names it), *len and its digest. 0, or -1 with err. */
int exe_adapter_to_blob(exe_state *st, be_adapter *ad, bool training, uint8_t **bytes, size_t *len,
                        char digest[BLOB_DIGEST_HEX], char *err, size_t errlen);
/* Inside the transaction that writes the row naming a blob: the digest's shared lock (the
 * registry GC takes it exclusive before it removes a blob no row names), and the blob
 * stored again if GC took it meanwhile. 0, or -1 with err. */
int exe_blob_hold(exe_state *st, PGconn *c, const char *digest, const void *bytes, size_t len, char *err,
                  size_t errlen);

/* A registry blob (sampler or training checkpoint, by sha256 digest) as an inference
 * adapter for this executor's base model, cached in the store. The blob is read verified
 * (a corrupted one is an error saying so). *out is pinned: it stays valid until
 * exe_store_release (call it once per successful load, e.g. when the sample batch is
 * done). */
int exe_load_sampler_adapter(exe_state *st, const char *digest, be_adapter **out, char *err, size_t errlen);

/* Loads the checkpoint a load_weights payload names (path, blob_digest, optimizer) into
 * the model's training slot (made when there is none), without asking the registry again
 * whether the tenant may still read it: load_weights checks that first; a recovery
 * replaying a load_weights committed earlier calls this directly. Sets op->applied. */
void exe_load_checkpoint(exe_state *st, exe_op *op);
