/* cudnn_shim.c — a stand-in libcudnn for test_cudnn_graph (no GPU, no cuDNN needed): the
 * dozen functions lcu_cudnn.c resolves, keeping every descriptor and checking, at each
 * finalize, what cuDNN's backend API documents as required: the attributes each
 * descriptor type needs, tensors finalized before an operation takes them, shapes that
 * match (matmul M/K/N with batch broadcast over heads, pointwise broadcasting, reductions
 * to 1 or to a group of heads, reshapes of equal size), boolean/int32 outputs of the mask
 * ops; at the operation graph: unique uids, every virtual tensor produced once and read,
 * no cycle; at execution: the variant pack binds exactly the graph's non-virtual tensors.
 * It computes nothing. Heuristics offer two engines: 1 (with the NONDETERMINISTIC note),
 * then 2 (without). Environment: SHIM_CUDNN_VERSION (default 91900), SHIM_CUDNN_REFUSE
 * (no engine for any graph), SHIM_CUDNN_WORKSPACE (bytes a plan asks for; 4096),
 * SHIM_CUDNN_WORKSPACE_PER_HEAD (instead: bytes per head of the graph's uid-1 tensor, the
 * query, dims[1]: as the deterministic backward's dP grows with the heads of one call),
 * SHIM_CUDNN_DUMP (prints each graph's operations).
 *
 * What this cannot say: whether cuDNN's engines accept the graph — only a GPU run can.
 * The test's functions (shim_cudnn_*) let it look at the last graph executed.
 */
#include <cudnn_graph.h>

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int loom_cudnn_shim = 1; /* lcu_cudnn_dry_run runs only against a library exporting this */

#define MAX_ATTRS 24
#define MAX_OPS 128

typedef struct {
    int name, type;
    int64_t n;
    unsigned char *data;
} mattr;

typedef struct mdesc {
    uint32_t magic;
    int type;
    bool fin;
    mattr at[MAX_ATTRS];
    int nat;
    /* engine configs and engines: filled by the heuristics */
    int64_t engine;
    struct mdesc *graph;
    /* operation graphs: what the pack must bind */
    int64_t bound[128];
    struct mdesc *bound_t[128];
    int nbound;
    int nops;
} mdesc;

#define MAGIC 0x6d6f636bu

static char last_err[512];
static int graphs_finalized, executions;
static int64_t last_engine = -1;
static mdesc *last_graph;
static struct {
    int64_t uid;
    float v;
} values[32];
static int nvalues;

static cudnnStatus_t fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_err, sizeof last_err, fmt, ap);
    va_end(ap);
    if (getenv("SHIM_CUDNN_DUMP")) fprintf(stderr, "cudnn shim: %s\n", last_err);
    return CUDNN_STATUS_BAD_PARAM;
}

static size_t elem_size(int type)
{
    switch (type) {
    case CUDNN_TYPE_BOOLEAN: case CUDNN_TYPE_CHAR: return 1;
    case CUDNN_TYPE_HANDLE: case CUDNN_TYPE_INT64: case CUDNN_TYPE_DOUBLE: case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return 8;
    default: return 4;
    }
}

static mdesc *D(void *p) { return p && ((mdesc *)p)->magic == MAGIC ? p : NULL; }

static mattr *attr(mdesc *d, int name)
{
    for (int i = 0; i < d->nat; i++)
        if (d->at[i].name == name) return &d->at[i];
    return NULL;
}

static int64_t i64(mdesc *d, int name, int64_t dflt)
{
    mattr *a = attr(d, name);
    if (!a) return dflt;
    if (a->type == CUDNN_TYPE_INT64) return *(int64_t *)a->data;
    if (a->type == CUDNN_TYPE_BOOLEAN) return *(bool *)a->data;
    return *(int32_t *)a->data;
}

static mdesc *ref(mdesc *d, int name)
{
    mattr *a = attr(d, name);
    return a && a->type == CUDNN_TYPE_BACKEND_DESCRIPTOR ? D(*(void **)a->data) : NULL;
}

static const int64_t *dims(mdesc *t) { return (const int64_t *)attr(t, CUDNN_ATTR_TENSOR_DIMENSIONS)->data; }
static bool is_virtual(mdesc *t) { return i64(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, 0) != 0; }
static int64_t uid(mdesc *t) { return i64(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, -1); }
static int dtype(mdesc *t) { return (int)i64(t, CUDNN_ATTR_TENSOR_DATA_TYPE, -1); }

/* ---- the API ---------------------------------------------------------------------------- */

size_t cudnnGetVersion(void)
{
    const char *v = getenv("SHIM_CUDNN_VERSION");
    return v ? (size_t)strtoul(v, NULL, 10) : 91900;
}

const char *cudnnGetErrorString(cudnnStatus_t st) { return st ? "CUDNN_STATUS_SHIM_ERROR" : "CUDNN_STATUS_SUCCESS"; }

void cudnnGetLastErrorString(char *m, size_t n)
{
    snprintf(m, n, "%s", last_err);
    last_err[0] = 0;
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *h)
{
    *h = (cudnnHandle_t)malloc(16);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t h)
{
    free(h);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) { return h ? CUDNN_STATUS_SUCCESS : fail("no handle"); }

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t t, cudnnBackendDescriptor_t *out)
{
    mdesc *d = calloc(1, sizeof *d);
    d->magic = MAGIC;
    d->type = t;
    d->engine = -1;
    *out = d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t p)
{
    mdesc *d = D(p);
    if (!d) return fail("destroy: not a descriptor");
    for (int i = 0; i < d->nat; i++) free(d->at[i].data);
    if (last_graph == d) last_graph = NULL;
    d->magic = 0;
    free(d);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t p, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t n, const void *v)
{
    mdesc *d = D(p);
    if (!d) return fail("set attribute %d: not a descriptor", name);
    if (d->fin) return fail("set attribute %d on a finalized descriptor (type %d)", name, d->type);
    if (n < 0 || (n > 0 && !v)) return fail("set attribute %d: %lld elements at %p", name, (long long)n, v);
    if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
        for (int64_t i = 0; i < n; i++) {
            mdesc *r = D(((void *const *)v)[i]);
            if (!r) return fail("attribute %d: element %lld is not a descriptor", name, (long long)i);
            if (!r->fin && !(d->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
                return fail("attribute %d of descriptor type %d: descriptor type %d not finalized", name, d->type,
                            r->type);
        }
    mattr *a = attr(d, name);
    if (!a) {
        if (d->nat == MAX_ATTRS) return fail("too many attributes");
        a = &d->at[d->nat++];
    } else {
        free(a->data);
    }
    a->name = name;
    a->type = type;
    a->n = n;
    a->data = malloc(n * elem_size(type) + 1);
    memcpy(a->data, v, n * elem_size(type));
    return CUDNN_STATUS_SUCCESS;
}

#define NEED(d, nm)                                                                                        \
    do {                                                                                                   \
        if (!attr((d), (nm))) return fail("descriptor type %d finalized without attribute %d", (d)->type, (nm)); \
    } while (0)

static cudnnStatus_t fin_tensor(mdesc *d)
{
    NEED(d, CUDNN_ATTR_TENSOR_DATA_TYPE);
    NEED(d, CUDNN_ATTR_TENSOR_DIMENSIONS);
    NEED(d, CUDNN_ATTR_TENSOR_STRIDES);
    NEED(d, CUDNN_ATTR_TENSOR_UNIQUE_ID);
    NEED(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
    mattr *dm = attr(d, CUDNN_ATTR_TENSOR_DIMENSIONS), *st = attr(d, CUDNN_ATTR_TENSOR_STRIDES);
    if (dm->n != st->n || dm->n < 1 || dm->n > CUDNN_DIM_MAX) return fail("tensor %lld: %lld dims, %lld strides",
                                                                     (long long)uid(d), (long long)dm->n, (long long)st->n);
    for (int i = 0; i < dm->n; i++)
        if (((int64_t *)dm->data)[i] < 1 || ((int64_t *)st->data)[i] < 0)
            return fail("tensor %lld: dim %d = %lld, stride %lld", (long long)uid(d), i, (long long)((int64_t *)dm->data)[i],
                        (long long)((int64_t *)st->data)[i]);
    if (is_virtual(d) && i64(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, 0)) return fail("tensor %lld virtual and by value", (long long)uid(d));
    mdesc *r = ref(d, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC);
    if (attr(d, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC)) {
        if (!r || r->type != CUDNN_BACKEND_TENSOR_DESCRIPTOR) return fail("tensor %lld: ragged offset is no tensor", (long long)uid(d));
        if (dtype(r) != CUDNN_DATA_INT32 && dtype(r) != CUDNN_DATA_INT64) return fail("ragged offsets of type %d", dtype(r));
        if (dims(r)[0] != dims(d)[0] + 1) return fail("tensor %lld: %lld ragged offsets for batch %lld", (long long)uid(d),
                                                      (long long)dims(r)[0], (long long)dims(d)[0]);
    }
    return CUDNN_STATUS_SUCCESS;
}

static bool broadcasts(mdesc *x, mdesc *y)
{
    for (int i = 0; i < 4; i++)
        if (dims(x)[i] != dims(y)[i] && dims(x)[i] != 1) return false;
    return true;
}

static cudnnStatus_t fin_pointwise_op(mdesc *d)
{
    NEED(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
    NEED(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
    NEED(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
    mdesc *pw = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
    mdesc *x = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC), *y = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
    mdesc *b = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC), *t = ref(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
    if (!pw || pw->type != CUDNN_BACKEND_POINTWISE_DESCRIPTOR) return fail("pointwise op without a pointwise descriptor");
    int mode = (int)i64(pw, CUDNN_ATTR_POINTWISE_MODE, -1);
    bool unary = mode == CUDNN_POINTWISE_EXP || mode == CUDNN_POINTWISE_LOG || mode == CUDNN_POINTWISE_GEN_INDEX ||
                 mode == CUDNN_POINTWISE_IDENTITY;
    if (unary && (b || t)) return fail("pointwise mode %d takes one input", mode);
    if (!unary && !b) return fail("pointwise mode %d needs B", mode);
    if ((mode == CUDNN_POINTWISE_BINARY_SELECT) != (t != NULL)) return fail("pointwise mode %d and T", mode);
    if (i64(y, CUDNN_ATTR_TENSOR_IS_BY_VALUE, 0)) return fail("pointwise output %lld is by value", (long long)uid(y));
    if (!broadcasts(x, y) || (b && !broadcasts(b, y)) || (t && !broadcasts(t, y)))
        return fail("pointwise mode %d: inputs do not broadcast to output %lld", mode, (long long)uid(y));
    bool boolean_out = mode == CUDNN_POINTWISE_CMP_LT || mode == CUDNN_POINTWISE_CMP_GE ||
                       mode == CUDNN_POINTWISE_LOGICAL_AND || mode == CUDNN_POINTWISE_CMP_GT;
    if (boolean_out && dtype(y) != CUDNN_DATA_BOOLEAN) return fail("mode %d writes type %d, not boolean", mode, dtype(y));
    if (mode == CUDNN_POINTWISE_GEN_INDEX && dtype(y) != CUDNN_DATA_INT32) return fail("index of type %d", dtype(y));
    if (mode == CUDNN_POINTWISE_BINARY_SELECT && dtype(t) != CUDNN_DATA_BOOLEAN) return fail("select on type %d", dtype(t));
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t fin_matmul_op(mdesc *d)
{
    NEED(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC);
    NEED(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
    NEED(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
    NEED(d, CUDNN_ATTR_OPERATION_MATMUL_DESC);
    mdesc *a = ref(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC), *b = ref(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
    mdesc *c = ref(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
    const int64_t *A = dims(a), *B = dims(b), *C = dims(c);
    if (A[3] != B[2] || C[2] != A[2] || C[3] != B[3])
        return fail("matmul %lld·%lld -> %lld: [%lld,%lld]·[%lld,%lld] -> [%lld,%lld]", (long long)uid(a), (long long)uid(b),
                    (long long)uid(c), (long long)A[2], (long long)A[3], (long long)B[2], (long long)B[3], (long long)C[2],
                    (long long)C[3]);
    if (C[0] != A[0] || B[0] != A[0] || C[1] != A[1] || A[1] % B[1]) /* B's heads may be a group's */
        return fail("matmul batch dims: A %lldx%lld B %lldx%lld C %lldx%lld", (long long)A[0], (long long)A[1],
                    (long long)B[0], (long long)B[1], (long long)C[0], (long long)C[1]);
    int ovr[3] = {CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
                  CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC};
    for (int i = 0; i < 3; i++) {
        mdesc *o = ref(d, ovr[i]);
        if (o && (dtype(o) != CUDNN_DATA_INT32 || dims(o)[0] != A[0] || dims(o)[1] * dims(o)[2] * dims(o)[3] != 1))
            return fail("matmul override %d: type %d, %lld values", i, dtype(o), (long long)dims(o)[0]);
    }
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t fin_reduction_op(mdesc *d)
{
    NEED(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
    NEED(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
    NEED(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
    mdesc *x = ref(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC), *y = ref(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
    for (int i = 0; i < 4; i++)
        if (dims(y)[i] != dims(x)[i] && dims(y)[i] != 1 && dims(x)[i] % dims(y)[i])
            return fail("reduction %lld -> %lld: dim %d %lld -> %lld", (long long)uid(x), (long long)uid(y), i,
                        (long long)dims(x)[i], (long long)dims(y)[i]);
    return CUDNN_STATUS_SUCCESS;
}

static int64_t count(mdesc *t)
{
    int64_t n = 1;
    for (int i = 0; i < 4; i++) n *= dims(t)[i];
    return n;
}

/* Inputs and outputs of an operation (tensor descriptors). */
static int op_io(mdesc *op, mdesc **in, mdesc **out)
{
    int ni = 0;
    *out = NULL;
    int ins[8] = {0}, o = 0, n = 0;
    switch (op->type) {
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
        ins[n++] = CUDNN_ATTR_OPERATION_POINTWISE_XDESC;
        ins[n++] = CUDNN_ATTR_OPERATION_POINTWISE_BDESC;
        ins[n++] = CUDNN_ATTR_OPERATION_POINTWISE_TDESC;
        o = CUDNN_ATTR_OPERATION_POINTWISE_YDESC;
        break;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
        ins[n++] = CUDNN_ATTR_OPERATION_MATMUL_ADESC;
        ins[n++] = CUDNN_ATTR_OPERATION_MATMUL_BDESC;
        ins[n++] = CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC;
        ins[n++] = CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC;
        ins[n++] = CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC;
        o = CUDNN_ATTR_OPERATION_MATMUL_CDESC;
        break;
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
        ins[n++] = CUDNN_ATTR_OPERATION_REDUCTION_XDESC;
        o = CUDNN_ATTR_OPERATION_REDUCTION_YDESC;
        break;
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
        ins[n++] = CUDNN_ATTR_OPERATION_RESHAPE_XDESC;
        o = CUDNN_ATTR_OPERATION_RESHAPE_YDESC;
        break;
    }
    for (int i = 0; i < n; i++) {
        mdesc *t = ref(op, ins[i]);
        if (t) in[ni++] = t;
    }
    *out = ref(op, o);
    return ni;
}

static const char *op_name(mdesc *op)
{
    static char buf[32];
    switch (op->type) {
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
        snprintf(buf, sizeof buf, "pointwise(%d)",
                 (int)i64(ref(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR), CUDNN_ATTR_POINTWISE_MODE, -1));
        return buf;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return "matmul";
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: return "reduction";
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return "reshape";
    }
    return "?";
}

static cudnnStatus_t fin_graph(mdesc *g)
{
    NEED(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE);
    NEED(g, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    mattr *a = attr(g, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    int nops = (int)a->n;
    if (nops < 1 || nops > MAX_OPS) return fail("graph of %d operations", nops);
    mdesc *ops[MAX_OPS], *tens[512];
    int producers[512] = {0}, readers[512] = {0}, nt = 0;
    for (int i = 0; i < nops; i++) ops[i] = D(((void **)a->data)[i]);
    /* every tensor, with the ragged-offset tensors they point at */
    for (int i = 0; i < nops; i++) {
        mdesc *in[8], *out;
        int ni = op_io(ops[i], in, &out);
        if (!out) return fail("operation %d (%s) has no output", i, op_name(ops[i]));
        in[ni++] = out;
        for (int j = 0; j < ni; j++) {
            mdesc *ts[2] = {in[j], ref(in[j], CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC)};
            for (int r = 0; r < 2; r++) {
                if (!ts[r]) continue;
                int k = 0;
                while (k < nt && tens[k] != ts[r]) k++;
                if (k == nt) {
                    if (nt == 512) return fail("too many tensors");
                    tens[nt++] = ts[r];
                }
                if (r == 0 && j == ni - 1) producers[k]++;
                else readers[k]++;
            }
        }
    }
    g->nbound = 0;
    for (int k = 0; k < nt; k++) {
        for (int m = 0; m < k; m++)
            if (uid(tens[m]) == uid(tens[k])) return fail("two tensors with uid %lld", (long long)uid(tens[k]));
        bool v = is_virtual(tens[k]), byval = i64(tens[k], CUDNN_ATTR_TENSOR_IS_BY_VALUE, 0) != 0;
        if (v && (producers[k] != 1 || readers[k] < 1))
            return fail("virtual tensor %lld: %d producers, %d readers", (long long)uid(tens[k]), producers[k], readers[k]);
        if (!v && producers[k] > 1) return fail("tensor %lld written by %d operations", (long long)uid(tens[k]), producers[k]);
        if (byval && producers[k]) return fail("by-value tensor %lld is written", (long long)uid(tens[k]));
        if (!v) {
            if (g->nbound == 128) return fail("too many bound tensors");
            g->bound_t[g->nbound] = tens[k];
            g->bound[g->nbound++] = uid(tens[k]);
        }
    }
    /* no cycle: repeatedly take an operation whose inputs are all available */
    bool done[MAX_OPS] = {false}, avail[512];
    for (int k = 0; k < nt; k++) avail[k] = producers[k] == 0;
    for (int pass = 0, left = nops; left > 0; pass++) {
        int took = 0;
        for (int i = 0; i < nops; i++) {
            if (done[i]) continue;
            mdesc *in[8], *out;
            int ni = op_io(ops[i], in, &out), ok = 1;
            for (int j = 0; j < ni; j++)
                for (int k = 0; k < nt; k++)
                    if (tens[k] == in[j] && !avail[k]) ok = 0;
            if (!ok) continue;
            for (int k = 0; k < nt; k++)
                if (tens[k] == out) avail[k] = true;
            done[i] = true;
            took++;
            left--;
        }
        if (!took) return fail("the operations form a cycle or read a tensor nobody writes");
    }
    if (getenv("SHIM_CUDNN_DUMP")) {
        fprintf(stderr, "cudnn shim: graph of %d operations\n", nops);
        for (int i = 0; i < nops; i++) {
            mdesc *in[8], *out;
            int ni = op_io(ops[i], in, &out);
            fprintf(stderr, "  %-14s", op_name(ops[i]));
            for (int j = 0; j < ni; j++) fprintf(stderr, " %lld", (long long)uid(in[j]));
            const int64_t *dm = dims(out);
            fprintf(stderr, " -> %lld [%lld %lld %lld %lld] type %d%s\n", (long long)uid(out), (long long)dm[0],
                    (long long)dm[1], (long long)dm[2], (long long)dm[3], dtype(out), is_virtual(out) ? "" : " (bound)");
        }
    }
    g->nops = nops;
    graphs_finalized++;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t p)
{
    mdesc *d = D(p);
    if (!d) return fail("finalize: not a descriptor");
    if (d->fin) return fail("finalized twice (type %d)", d->type);
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: st = fin_tensor(d); break;
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
        NEED(d, CUDNN_ATTR_POINTWISE_MODE);
        NEED(d, CUDNN_ATTR_POINTWISE_MATH_PREC);
        if (i64(d, CUDNN_ATTR_POINTWISE_MODE, -1) == CUDNN_POINTWISE_GEN_INDEX) {
            int64_t ax = i64(d, CUDNN_ATTR_POINTWISE_AXIS, -1);
            if (ax < 0 || ax > 3) return fail("GEN_INDEX axis %lld", (long long)ax);
        }
        break;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: st = fin_pointwise_op(d); break;
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: NEED(d, CUDNN_ATTR_MATMUL_COMP_TYPE); break;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: st = fin_matmul_op(d); break;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
        NEED(d, CUDNN_ATTR_REDUCTION_OPERATOR);
        NEED(d, CUDNN_ATTR_REDUCTION_COMP_TYPE);
        break;
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: st = fin_reduction_op(d); break;
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
        NEED(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
        NEED(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
        if (count(ref(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC)) != count(ref(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC)))
            return fail("reshape of another size");
        break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: st = fin_graph(d); break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        NEED(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
        NEED(d, CUDNN_ATTR_ENGINEHEUR_MODE);
        break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
        NEED(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE);
        NEED(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
        mdesc *cfg = ref(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
        if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR || !cfg->graph) return fail("plan without a config");
        d->graph = cfg->graph;
        d->engine = cfg->engine;
        break;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        NEED(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
        NEED(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
        NEED(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
        if (attr(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)->n != attr(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->n)
            return fail("variant pack: uids and pointers differ in number");
        break;
    default: break;
    }
    if (st) return st;
    d->fin = true;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const p, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t want, int64_t *got, void *out)
{
    mdesc *d = D(p);
    if (!d || !d->fin) return fail("get attribute %d of a descriptor not finalized", name);
    if (name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        mdesc *g = ref(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
        int n = getenv("SHIM_CUDNN_REFUSE") ? 0 : 2;
        *got = want < n ? want : n;
        for (int64_t i = 0; out && i < *got; i++) {
            mdesc *cfg = D(((void **)out)[i]);
            if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) return fail("results into a non-config");
            cfg->engine = i + 1;
            cfg->graph = g;
            cfg->fin = true;
        }
        if (!out) *got = n;
        return CUDNN_STATUS_SUCCESS;
    }
    if (name == CUDNN_ATTR_ENGINECFG_ENGINE) {
        mdesc *e = D(*(void **)out);
        if (!e || e->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR) return fail("engine into a non-engine");
        e->engine = d->engine;
        e->fin = true;
        *got = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    if (name == CUDNN_ATTR_ENGINE_GLOBAL_INDEX) {
        *(int64_t *)out = d->engine;
        *got = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    if (name == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE) {
        cudnnBackendNumericalNote_t *notes = out;
        notes[0] = CUDNN_NUMERICAL_NOTE_TENSOR_CORE;
        *got = 1;
        if (d->engine == 1 && want > 1) notes[(*got)++] = CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
        return CUDNN_STATUS_SUCCESS;
    }
    if (name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
        const char *w = getenv("SHIM_CUDNN_WORKSPACE"), *ph = getenv("SHIM_CUDNN_WORKSPACE_PER_HEAD");
        *(int64_t *)out = w ? strtoll(w, NULL, 10) : 4096;
        for (int k = 0; ph && d->graph && k < d->graph->nbound; k++) {
            mattr *dm = d->graph->bound[k] == 1 ? attr(d->graph->bound_t[k], CUDNN_ATTR_TENSOR_DIMENSIONS) : NULL;
            if (dm && dm->n >= 2) *(int64_t *)out = strtoll(ph, NULL, 10) * ((const int64_t *)dm->data)[1];
        }
        *got = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    return fail("get attribute %d: not in the shim", name);
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack)
{
    mdesc *p = D(plan), *v = D(pack);
    if (!h || !p || !p->fin || !v || !v->fin) return fail("execute: plan or pack not finalized");
    mdesc *g = p->graph;
    mattr *u = attr(v, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), *ptr = attr(v, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
    const int64_t *uids = (const int64_t *)u->data;
    void **ptrs = (void **)ptr->data;
    if (u->n != g->nbound) return fail("variant pack binds %lld tensors, the graph has %d", (long long)u->n, g->nbound);
    for (int i = 0; i < u->n; i++) {
        int k = 0;
        while (k < g->nbound && g->bound[k] != uids[i]) k++;
        if (k == g->nbound) return fail("variant pack binds uid %lld, not in the graph", (long long)uids[i]);
        for (int j = 0; j < i; j++)
            if (uids[j] == uids[i]) return fail("variant pack binds uid %lld twice", (long long)uids[i]);
        if (!ptrs[i]) return fail("uid %lld bound to NULL", (long long)uids[i]);
    }
    if (!*(void **)attr(v, CUDNN_ATTR_VARIANT_PACK_WORKSPACE)->data) return fail("no workspace pointer");
    /* by-value scalars: keep what was passed (the float ones) */
    nvalues = 0;
    for (int i = 0; i < u->n && nvalues < 32; i++)
        for (int k = 0; k < g->nbound; k++)
            if (g->bound[k] == uids[i] && i64(g->bound_t[k], CUDNN_ATTR_TENSOR_IS_BY_VALUE, 0) &&
                dtype(g->bound_t[k]) == CUDNN_DATA_FLOAT) {
                values[nvalues].uid = uids[i];
                values[nvalues++].v = *(const float *)ptrs[i];
            }
    executions++;
    last_engine = p->engine;
    last_graph = g;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- for the test --------------------------------------------------------------------- */

int shim_cudnn_executions(void) { return executions; }
int shim_cudnn_graphs(void) { return graphs_finalized; }
int64_t shim_cudnn_last_engine(void) { return last_engine; }
int shim_cudnn_last_ops(void) { return last_graph ? last_graph->nops : -1; }

bool shim_cudnn_value(int64_t uid, float *v)
{
    for (int i = 0; i < nvalues; i++)
        if (values[i].uid == uid) {
            *v = values[i].v;
            return true;
        }
    return false;
}

/* The last executed graph's tensor uid: dims, strides, type, its ragged-offset tensor's uid
 * (-1: none). False when the graph has no such bound tensor. */
bool shim_cudnn_tensor(int64_t want, int64_t dm[4], int64_t st[4], int *type, int64_t *ragged)
{
    if (!last_graph) return false;
    mattr *a = attr(last_graph, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    for (int i = 0; i < a->n; i++) {
        mdesc *in[16], *out;
        int ni = op_io(D(((void **)a->data)[i]), in, &out);
        in[ni++] = out;
        for (int j = 0, n = ni; j < n; j++) /* and the ragged-offset tensors they point at */
            if (ref(in[j], CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC) && ni < 16)
                in[ni++] = ref(in[j], CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC);
        for (int j = 0; j < ni; j++) {
            if (uid(in[j]) != want || is_virtual(in[j])) continue;
            memcpy(dm, dims(in[j]), 32);
            memcpy(st, attr(in[j], CUDNN_ATTR_TENSOR_STRIDES)->data, 32);
            *type = dtype(in[j]);
            mdesc *r = ref(in[j], CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC);
            *ragged = r ? uid(r) : -1;
            return true;
        }
    }
    return false;
}

/* How many operations of the last executed graph have this descriptor type (and, for
 * pointwise ones, this mode; -1: any). */
int shim_cudnn_count_ops(int type, int mode)
{
    if (!last_graph) return -1;
    mattr *a = attr(last_graph, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    int n = 0;
    for (int i = 0; i < a->n; i++) {
        mdesc *op = D(((void **)a->data)[i]);
        if (op->type != type) continue;
        if (mode >= 0 && i64(ref(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR), CUDNN_ATTR_POINTWISE_MODE, -1) != mode)
            continue;
        n++;
    }
    return n;
}
