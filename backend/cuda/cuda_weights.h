/* cuda_weights.h — the base weights on the device: every tensor of the model converted to
 * bf16 (from F32, BF16, F16 or F64 as stored) in one allocation, frozen. */
#ifndef LOOM_BACKEND_CUDA_WEIGHTS_H
#define LOOM_BACKEND_CUDA_WEIGHTS_H

#include "backend/cuda/cuda_ctx.h"

/* Fills c->w from m (c->cfg, c->stream, c->device set). 0, or -1 with err. */
int cu_weights_load(cu_ctx *c, const model_files *m, char *err, size_t errlen);
void cu_weights_free(cu_weights *w);

#endif
