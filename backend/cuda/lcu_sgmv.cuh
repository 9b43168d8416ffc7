/* lcu_sgmv.cuh — LoRA version 2 (lcu_sgmv.cu): every segment of a call in one launch per
 * product (SGMV style) instead of version 1's cuBLASLt calls per segment (lcu_lora.cu).
 * Chosen per call by the environment variable LCU_LORA (`auto`, the default: version 3 for
 * calls of several segments that are not long, else version 1; `gemm`: version 1; `sgmv`:
 * version 2; `sgmv3`: version 3, lcu_sgmv3.cu; lcu_lora.cu's lcu_lora_version), like
 * LCU_ATTN for the attention. Same
 * interface and semantics as lcu_lora_fwd / lcu_lora_bwd (cuda_ops.h); the caller has
 * checked the arguments and that the segments are sorted and disjoint in rows. */
#ifndef LOOM_BACKEND_CUDA_SGMV_CUH
#define LOOM_BACKEND_CUDA_SGMV_CUH

#include "backend/cuda/cuda_ops.h"

/* The context's device scratch for split-K partial sums, at least bytes (grown, never
 * shrunk; lcu_gemm.cu). 0 or a CUDA error (out of memory). */
int lcu_ctx_splitk_scratch(lcu_ctx *c, size_t bytes, void **out);
int lcu_sgmv_lora_fwd(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x, long ldx,
                      float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s);
int lcu_sgmv_lora_bwd(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x, long ldx,
                      const lcu_bf16 *dy, long lddy, float *dx, long lddx, lcu_bf16 *z, lcu_bf16 *dz, long ldz,
                      cudaStream_t s);

/* The K chunks (split-K) of an item of `tiles` output tiles over k, each *kchunk long (a
 * multiple of LCU_SGMV_KSTEP, the kernels' K step): versions 2 and 3 split by this rule. */
enum { LCU_SGMV_KSTEP = 32 };
int lcu_sgmv_splits(long tiles, long k, int *kchunk);

/* LoRA version 3 (lcu_sgmv3.cu): the same interface and preconditions as version 2. */
int lcu_sgmv3_lora_fwd(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x, long ldx,
                       float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s);
/* Several modules at once (lcu_lora_fwd_multi): every module's shrinks in one launch (per
 * kernel class), then every expand. */
int lcu_sgmv3_lora_fwd_multi(lcu_ctx *c, const lcu_lora_mod *mods, int nmod, int in, const lcu_bf16 *x, long ldx,
                             float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s);
/* One of its two products alone: z_part the shrinks (z), else the expands (y += ..., from the
 * z the shrinks wrote): the two calls in that order are lcu_sgmv3_lora_fwd_multi. */
int lcu_sgmv3_lora_fwd_multi_part(lcu_ctx *c, bool z_part, const lcu_lora_mod *mods, int nmod, int in,
                                  const lcu_bf16 *x, long ldx, float *y, long ldy, lcu_bf16 *z, long ldz,
                                  cudaStream_t s);
/* The same with y = scale·(x Aᵀ) Bᵀ written, not added (lcu_lora_fwd_into). */
int lcu_sgmv3_lora_fwd_write(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x,
                             long ldx, float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s);
int lcu_sgmv3_lora_bwd(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x, long ldx,
                       const lcu_bf16 *dy, long lddy, float *dx, long lddx, lcu_bf16 *z, lcu_bf16 *dz, long ldz,
                       cudaStream_t s);
/* The same with dx = dz A written, not added (lcu_lora_bwd_into; the segments cover dx's rows). */
int lcu_sgmv3_lora_bwd_write(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x,
                             long ldx, const lcu_bf16 *dy, long lddy, float *dx, long lddx, lcu_bf16 *z, lcu_bf16 *dz,
                             long ldz, cudaStream_t s);

#endif
