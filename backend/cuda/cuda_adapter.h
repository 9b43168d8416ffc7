/* cuda_adapter.h — LoRA adapters in device memory (layout in cuda_ctx.h, cu_adapter). */
#ifndef LOOM_BACKEND_CUDA_ADAPTER_H
#define LOOM_BACKEND_CUDA_ADAPTER_H

#include "backend/cuda/cuda_ctx.h"

/* The module of a layer, or NULL when the adapter does not train it. */
const cu_lora_pair *cu_adapter_module(const cu_adapter *a, int layer, lora_module mod);
/* Expert e's gate, up or down (LORA_GATE..LORA_DOWN) in sparse layer `layer`, or NULL when
 * the experts are not trained. */
const cu_lora_pair *cu_adapter_expert(const cu_adapter *a, int layer, int e, lora_module mod);
/* The head adapter, or NULL when train_unembed is off. */
const cu_lora_pair *cu_adapter_head(const cu_adapter *a);

/* The table's adapter entries (see backend.h). */
be_adapter *cu_adapter_alloc(cu_ctx *c, const lora_config *lc, bool trainable, char *err, size_t errlen);
void cu_adapter_free(cu_ctx *c, be_adapter *a);
int cu_adapter_upload(cu_ctx *c, be_adapter *a, const adapter_state *src, unsigned parts, char *err, size_t errlen);
int cu_adapter_download(cu_ctx *c, const be_adapter *a, adapter_state *dst, unsigned parts, char *err,
                        size_t errlen);
int cu_adapter_copy(cu_ctx *c, be_adapter *dst, const be_adapter *src, unsigned parts, char *err, size_t errlen);

/* Queued on c->stream: the bf16 copy of the parameters from the fp32 masters; zero
 * gradients. 0 or -1 (recorded in c). */
int cu_adapter_refresh_bf16(cu_ctx *c, cu_adapter *a);
int cu_adapter_zero_grad(cu_ctx *c, cu_adapter *a);

#endif
