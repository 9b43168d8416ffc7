/* cuda_buffers.h — the CUDA context's workspace: growing it for a batch, the per-call rows
 * of a packed batch (cu_meta_layout), LoRA segments, RoPE tables (cuda_buffers.c). */
#ifndef LOOM_BACKEND_CUDA_BUFFERS_H
#define LOOM_BACKEND_CUDA_BUFFERS_H

#include "backend/cuda/cuda_ctx.h"

/* b holds at least bytes on the device (and as much on the host when host): grown by 1.5×,
 * never shrunk; the contents are not kept. 0 or -1 (out of memory). */
int cu_buf_reserve(cu_buf *b, size_t bytes, bool host);
void cu_buf_free(cu_buf *b);

/* The activation workspace for T rows in up to nseq sequences, with the per-layer inputs
 * when saved. 0 or -1 with err (out of memory; nothing else changed). */
int cu_act_reserve(cu_ctx *c, long T, int nseq, bool saved, char *err, size_t errlen);
/* Slots for every layer's kept activations over T rows (c->keep) unless LCU_KEEP_ACT=0 turned
 * them off, the model is dense and they fit in the device's free memory less a reserve
 * (2 GiB, 5 % of the device and what cuDNN's attention may allocate for this batch of nseq
 * sequences, the longest max_len rows) and under LCU_KEEP_MB. true: the pass keeps them;
 * false: it recomputes each layer in the backward (said on stderr once per size). Asks the
 * device only when the slots must grow. Never fails a pass. */
bool cu_keep_reserve(cu_ctx *c, long T, int nseq, int max_len);
/* cudaMemGetInfo as this context sees the device: the total is LCU_DEVICE_MB's when set. */
void cu_mem_info(const cu_ctx *c, size_t *fr, size_t *tot);
/* Gives the slots' memory back (the next pass that keeps takes it again): before a larger
 * workspace, a sampling call's KV caches, or a retry after any out-of-memory, so that the
 * slots never make another allocation fail. */
void cu_keep_release(cu_ctx *c);
/* c->a's CU_KEPT_FIELDS pointed at layer l's slot; back at the shared buffers. */
void cu_keep_bind(cu_ctx *c, int l);
void cu_keep_unbind(cu_ctx *c);
/* RoPE tables covering positions 0 .. max_pos − 1 (queued on c->stream). 0 or -1 with err. */
int cu_rope_reserve(cu_ctx *c, int max_pos, char *err, size_t errlen);
/* Host arrays of segments for nseq sequences. 0 or -1 with err. */
int cu_segs_reserve(cu_ctx *c, int nseq, char *err, size_t errlen);

/* The per-call rows of a training pass: T rows, nseq sequences, nnz targets, ntopk top-k
 * outputs; c->ml and c->meta. 0 or -1 with err. */
int cu_meta_reserve(cu_ctx *c, long T, int nseq, long nnz, long ntopk, char *err, size_t errlen);
/* Host and device addresses of a piece of c->meta. */
static inline void *cu_meta_host(const cu_ctx *c, size_t off) { return (char *)c->meta.host + off; }
static inline void *cu_meta_dev(const cu_ctx *c, size_t off) { return (char *)c->meta.dev + off; }

/* Packs the non-empty sequences of a training pass into c->meta's inputs (tokens,
 * positions, targets, loss inputs, top-k layout), builds the LoRA segments and the
 * self-attention descriptor, and uploads the inputs. any_grad: this pass computes
 * gradients. 0 or -1 (recorded in c). */
int cu_pack(cu_ctx *c, const be_seq *seqs, int nseq, bool any_grad);

/* Appends row run [b, e) of adapter ad (NULL: none) to c->segs, merging with the last
 * segment when it continues it. */
void cu_segs_add_group(cu_ctx *c, const cu_adapter *ad, long b, long e, bool grad, int group);
static inline void cu_segs_add(cu_ctx *c, const cu_adapter *ad, long b, long e, bool grad)
{
    cu_segs_add_group(c, ad, b, e, grad, 0);
}

void cu_buffers_free(cu_ctx *c);

#endif
