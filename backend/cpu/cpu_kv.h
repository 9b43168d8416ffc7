/* cpu_kv.h — KV caches of sampling passes (cpu_kv.c). */
#ifndef LOOM_BACKEND_CPU_KV_H
#define LOOM_BACKEND_CPU_KV_H

#include "backend/cpu/cpu_ctx.h"

/* Copies layer l's K/V of the T rows into the caches of each row's streams. */
void cpu_kv_store(cpu_ctx *c, int l, long T);
/* Decode: each row (one new token of one stream) attends to its stream's cache. */
void cpu_kv_attention(cpu_ctx *c, int l, long T);

#endif
