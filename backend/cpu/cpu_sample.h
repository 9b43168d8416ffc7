/* cpu_sample.h — sampling with a KV cache (cpu_sample.c). */
#ifndef LOOM_BACKEND_CPU_SAMPLE_H
#define LOOM_BACKEND_CPU_SAMPLE_H

#include "backend/cpu/cpu_ctx.h"

/* be_backend_cpu.sample (see backend.h). */
int cpu_sample(void *ctx, be_sample_req *reqs, int nreq, char *err, size_t errlen);

#endif
