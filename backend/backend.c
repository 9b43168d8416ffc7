/* backend.c — helpers made of backend table calls only (see backend.h). */
#include "backend/backend.h"
#include "common/err.h"

exe_adapter *exe_adapter_from_state(const exe_backend *be, void *ctx, const adapter_state *st, bool trainable,
                                    char *err, size_t errlen)
{
    exe_adapter *a = be->adapter_alloc(ctx, &st->layout.cfg, trainable, err, errlen);
    if (!a) return NULL;
    if (!lora_layout_same(&a->layout, &st->layout)) {
        err_set(err, errlen, "the adapter state does not fit this base model");
        be->adapter_free(ctx, a);
        return NULL;
    }
    unsigned parts = ADAPTER_PARAMS | (trainable ? ADAPTER_GRADS | ADAPTER_OPTIM : 0);
    if (be->adapter_upload(ctx, a, st, parts, err, errlen) < 0) {
        be->adapter_free(ctx, a);
        return NULL;
    }
    return a;
}

exe_adapter *exe_adapter_new(const exe_backend *be, void *ctx, const lora_config *c, bool trainable, char *err,
                             size_t errlen)
{
    exe_adapter *a = be->adapter_alloc(ctx, c, trainable, err, errlen);
    if (!a) return NULL;
    adapter_state st;
    if (adapter_state_alloc(&st, &a->layout, ADAPTER_PARAMS, err, errlen) < 0) {
        be->adapter_free(ctx, a);
        return NULL;
    }
    adapter_state_init_peft(&st);
    int rc = be->adapter_upload(ctx, a, &st, ADAPTER_PARAMS, err, errlen);
    adapter_state_free(&st);
    if (rc < 0) {
        be->adapter_free(ctx, a);
        return NULL;
    }
    return a;
}

int exe_adapter_to_state(const exe_backend *be, void *ctx, const exe_adapter *a, unsigned parts, adapter_state *dst,
                         char *err, size_t errlen)
{
    if (adapter_state_alloc(dst, &a->layout, parts, err, errlen) < 0) return -1;
    if (be->adapter_download(ctx, a, dst, parts, err, errlen) < 0) {
        adapter_state_free(dst);
        return -1;
    }
    return 0;
}
