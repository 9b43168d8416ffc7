/* cuda_sample.h — sampling with KV caches on the device (cuda_sample.c). */
#ifndef LOOM_BACKEND_CUDA_SAMPLE_H
#define LOOM_BACKEND_CUDA_SAMPLE_H

#include "backend/cuda/cuda_ctx.h"

/* be_backend_cuda.sample (see backend.h); c's device is current. */
int cu_sample(cu_ctx *c, be_sample_req *reqs, int nreq, char *err, size_t errlen);

#endif
