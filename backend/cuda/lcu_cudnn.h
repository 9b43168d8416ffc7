/* lcu_cudnn.h — inside the kernel layer: cuDNN loaded at run time, and a small builder over
 * cuDNN's backend descriptor API (the C API under cuDNN's C++ frontend). Used by
 * lcu_cudnn_attn.c; the public entry points are in cuda_ops.h ("attention through cuDNN").
 *
 * Nothing here links against libcudnn: lcd_load() finds it with dlopen (LOOM_CUDNN_LIBRARY,
 * then the dynamic loader's own search, the CUDA toolkit's lib directories, then the
 * nvidia/<pkg>/lib directories of Python's site-packages, where PyTorch's wheels put it)
 * and resolves the dozen functions below with dlsym, so the CUDA module builds on a
 * machine without cuDNN and still loads where cuDNN is missing. The enums and types come
 * from cuDNN's headers (cudnn_graph.h) when the build found them (LOOM_HAVE_CUDNN_H);
 * without them lcd_load() says so and the callers keep the own kernels.
 *
 * The builder: every descriptor it creates is recorded in the lcd_graph and destroyed with
 * it (an execution plan is kept together with the tensors and operations it was built
 * from); the first failing call is remembered (status, the step, cuDNN's last error
 * string) and every later call is a no-op, so a graph is written as straight-line code
 * and checked once at lcd_finish().
 */
#ifndef LOOM_BACKEND_CUDA_LCU_CUDNN_H
#define LOOM_BACKEND_CUDA_LCU_CUDNN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef LOOM_HAVE_CUDNN_H
#include <cudnn_graph.h>

/* The functions of libcudnn that the kernel layer calls. */
typedef struct {
    void *lib;
    size_t version; /* cudnnGetVersion(): 90600 for 9.6.0 */
    char path[512]; /* the file dlopen loaded */
    size_t (*GetVersion)(void);
    const char *(*GetErrorString)(cudnnStatus_t);
    void (*GetLastErrorString)(char *, size_t);
    cudnnStatus_t (*Create)(cudnnHandle_t *);
    cudnnStatus_t (*Destroy)(cudnnHandle_t);
    cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*BackendCreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*BackendDestroyDescriptor)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*BackendFinalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*BackendSetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                         cudnnBackendAttributeType_t, int64_t, const void *);
    cudnnStatus_t (*BackendGetAttribute)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                         cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
    cudnnStatus_t (*BackendExecute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
} lcd_api;

/* The oldest cuDNN the attention graphs are written for: packed (ragged) tensors with GQA in
 * the backward need 9.6 (cuDNN frontend's support checks say so). */
#define LCD_MIN_VERSION 90600

/* libcudnn, loaded once per process; NULL with why filled when it cannot be used. */
const lcd_api *lcd_load(char *why, size_t whylen);

/* ---- graph builder -------------------------------------------------------------------- */

typedef cudnnBackendDescriptor_t lcd_t; /* a tensor descriptor of the graph */

typedef struct {
    const lcd_api *api;
    cudnnBackendDescriptor_t *descs; /* everything created, destroyed by lcd_graph_free */
    int ndescs, cap;
    lcd_t ops[96];
    int nops;
    int64_t next_uid;                /* virtual tensors get 1000, 1001, ... */
    cudnnStatus_t st;                /* first failure; CUDNN_STATUS_SUCCESS while none */
    char err[384];                   /* its step and cuDNN's message */
    /* set by lcd_finish */
    cudnnBackendDescriptor_t plan;
    int64_t workspace;               /* the plan's (or the first taker's, when no plan) */
    int64_t engine;                  /* its engine's global index, for logs */
    int accepted;                    /* engine configs that took the graph: their plan finalized,
                                        or failed only in the CUDA driver (loading the kernels
                                        they compiled: what a plan built without a GPU gets) */
} lcd_graph;

void lcd_graph_init(lcd_graph *g, const lcd_api *api);
void lcd_graph_free(lcd_graph *g);

enum { LCD_VIRTUAL = 1, LCD_BY_VALUE = 2 };

/* A 4-d tensor: uid (0 = the next virtual uid), its type, dims and strides in elements,
 * flags, and the tensor of ragged offsets (NULL: none) that places each batch entry. */
lcd_t lcd_tensor(lcd_graph *g, int64_t uid, cudnnDataType_t t, const int64_t dim[4], const int64_t stride[4],
                 int flags, lcd_t ragged);
/* A virtual tensor with the dims and strides given. */
lcd_t lcd_virtual(lcd_graph *g, cudnnDataType_t t, const int64_t dim[4], const int64_t stride[4]);
/* A scalar passed by value at execution (the variant pack points at host memory). */
lcd_t lcd_scalar(lcd_graph *g, int64_t uid, cudnnDataType_t t);

/* y = mode(x[, b[, t]]) computed in prec; axis ≥ 0 only for GEN_INDEX. */
void lcd_pointwise(lcd_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, lcd_t x, lcd_t b, lcd_t t,
                   lcd_t y, int64_t axis);
/* c = a·b (batched over the first two dims, fp32 accumulation); m/n/k overrides: per-batch
 * sizes read from device tensors (NULL: the full dims). */
void lcd_matmul(lcd_graph *g, lcd_t a, lcd_t b, lcd_t c, lcd_t m_ovr, lcd_t n_ovr, lcd_t k_ovr);
/* y = reduce(x) over the dims where y has 1 (or a group of heads), in fp32. */
void lcd_reduction(lcd_graph *g, cudnnReduceTensorOp_t op, lcd_t x, lcd_t y);
/* y = x seen with y's dims and strides (no data moves). */
void lcd_reshape(lcd_graph *g, lcd_t x, lcd_t y);

/* Makes the operation graph of the ops added so far and the first execution plan that
 * cuDNN's heuristics (mode A, then FALLBACK) offer and that finalizes; deterministic: only
 * engines without cuDNN's NONDETERMINISTIC note. For the device of handle h, or, with h
 * NULL, for the device devprop describes (a CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR: a plan
 * built without any device, cuDNN ≥ 9.8). 0, or -1 with g->err saying why. */
int lcd_finish(lcd_graph *g, cudnnHandle_t h, cudnnBackendDescriptor_t devprop, bool deterministic);

/* Runs g->plan on the handle's stream: n tensors (uids, data pointers: device memory, host
 * memory for by-value scalars) and a workspace of at least g->workspace bytes. 0, or the
 * cudnnStatus_t. */
int lcd_execute(const lcd_api *api, cudnnHandle_t h, const lcd_graph *g, int n, const int64_t *uids,
                void *const *ptrs, void *workspace);

/* cuDNN's message for a status, with its last error string when it has one. */
void lcd_explain(const lcd_api *api, int status, char *buf, size_t len);
#endif /* LOOM_HAVE_CUDNN_H */

/* For the graph test against the stand-in libcudnn (tests/cudnn_shim/cudnn_shim.c): builds
 * the plan of a's bucket as lcu_cudnn_attn_fwd/bwd do and executes it with placeholder
 * device addresses, no device work. LCU_ENOTSUP unless the library loaded is that stand-in
 * (it exports loom_cudnn_shim): a real libcudnn would dereference the placeholders. */
int lcu_cudnn_dry_run(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, bool bwd);

/* Plans without a device (cuDNN ≥ 9.8): a context whose plans are built for the GPU that
 * devprop_json describes (cuDNN's device-property JSON: multiProcessorCount, deviceVer,
 * maxSharedMemoryPerBlockOptin, ...), with no handle; nothing can run on it. For
 * test_cudnn_plans, which asks a real libcudnn, on a machine without a GPU, whether its
 * engines take every graph this file builds for an H100. LCU_ENOTSUP with why otherwise. */
int lcu_cudnn_create_deviceless(lcu_cudnn **out, const char *devprop_json, char *why, size_t whylen);
/* Builds (or finds) the plan of a's bucket and runs nothing: 0 with its workspace bytes and
 * engine index, or LCU_ENOTSUP (cuDNN's reason on stderr, as for a refused bucket); either
 * way *accepted = the engine configs that took the graph (lcd_graph.accepted), and when
 * there is no plan but a taker, its workspace and engine. */
int lcu_cudnn_plan_check(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, bool bwd, int64_t *workspace,
                         int64_t *engine, int *accepted);
/* The backward's head groups as lcu_cudnn_attn_bwd chooses them, planning only: the fewest
 * (1, 2, 4, ...) whose graph an engine takes within the workspace limit
 * (LCU_CUDNN_WORKSPACE_MB; a device-less context has none unless that is set). 0 (a plan
 * built) or LCU_ENOTSUP (taken by an engine, not built: a device-less context; *groups 0:
 * none) with *groups and that plan's workspace, engine and accepting configs. */
int lcu_cudnn_bwd_groups(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, int *groups, int64_t *workspace,
                         int64_t *engine, int *accepted);

/* ---- the packed batch as cuDNN reads it (lcu_cudnn_prep.cu) ------------------------------ */

/* From q_start [nseq + 1] (rows of each sequence): seq_len [B] (0 past nseq: the padding
 * of the batch bucket) and three ragged-offset arrays [B + 1] in elements, rows × mul_qo
 * (Q, O, dQ, dO: rows of nq·d), rows × mul_kv (K, V, dK, dV: rows of nkv·d) and rows × mul_st
 * (stats: rows of nq), int64. B ≥ nseq. */
int lcd_ragged_prep(const int32_t *q_start, int nseq, int B, int64_t mul_qo, int64_t mul_kv, int64_t mul_st,
                    int32_t *seq_len, int64_t *ro_qo, int64_t *ro_kv, int64_t *ro_st, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
