/* lcu_cudnn.c — libcudnn found and loaded at run time, and the graph builder over cuDNN's
 * backend descriptor API (see lcu_cudnn.h).
 *
 * Where libcudnn is looked for, in order (the first that loads, has every function and is
 * cuDNN 9 at LCD_MIN_VERSION or later wins):
 *   1. LOOM_CUDNN_LIBRARY: the library file, or a directory holding libcudnn.so.9. When it
 *      is set nothing else is tried, so a wrong value is reported instead of hidden;
 *   2. "libcudnn.so.9" through the dynamic loader (LD_LIBRARY_PATH, the ld.so cache);
 *   3. the CUDA toolkit's lib directories (/usr/local/cuda/lib64, targets/<arch>/lib);
 *   4. nvidia/<package>/lib/libcudnn.so.9 under Python's site-packages: $VIRTUAL_ENV,
 *      $CONDA_PREFIX, $PYTHONPATH, ~/.local, /usr/local/lib, /usr/lib and /opt/conda. PyTorch's
 *      wheels install cuDNN there (nvidia-cudnn-cu12: nvidia/cudnn/lib; the CUDA 13 wheels:
 *      nvidia/cu13/lib).
 * The sub-libraries beside the chosen libcudnn.so.9 are loaded first (lcd_preload).
 */
#include "backend/cuda/lcu_cudnn.h"

#ifdef LOOM_HAVE_CUDNN_H

#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- loading ---------------------------------------------------------------------------- */

static lcd_api lcd;
static bool lcd_ok;
static char lcd_why[1024];
static pthread_once_t lcd_once = PTHREAD_ONCE_INIT;

/* Appends one attempt's failure to lcd_why (what is tried last matters most: kept short). */
static void lcd_note(const char *path, const char *what)
{
    size_t n = strlen(lcd_why);
    if (n + 8 >= sizeof lcd_why) return;
    snprintf(lcd_why + n, sizeof lcd_why - n, "%s%s: %s", n ? "; " : "", path, what);
}

/* libcudnn.so.9 is a dispatcher that dlopens its sub-libraries by bare soname when it first
 * needs them, so from a directory that is on no search path (site-packages) they would not
 * be found, or another installation's would be, of another version
 * (CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH). Loading the ones beside it first makes the
 * dynamic loader hand those back: it matches an already loaded library by soname. */
static const char *const lcd_sublibs[] = {"libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9",
                                          "libcudnn_engines_runtime_compiled.so.9", "libcudnn_heuristic.so.9",
                                          "libcudnn_ops.so.9", "libcudnn_cnn.so.9", "libcudnn_adv.so.9"};
enum { LCD_NSUB = sizeof lcd_sublibs / sizeof lcd_sublibs[0] };

static void lcd_preload(const char *path, void *subs[LCD_NSUB])
{
    const char *slash = strrchr(path, '/');
    for (int i = 0; i < LCD_NSUB; i++) {
        subs[i] = NULL;
        if (!slash) continue;
        char p[PATH_MAX + 64];
        snprintf(p, sizeof p, "%.*s/%s", (int)(slash - path), path, lcd_sublibs[i]);
        struct stat st;
        if (stat(p, &st) == 0) subs[i] = dlopen(p, RTLD_NOW | RTLD_LOCAL); /* a failure shows later, named */
    }
}

/* dlopen(path) and the functions; true when this library is usable. */
static bool lcd_try(const char *path)
{
    void *subs[LCD_NSUB];
    lcd_preload(path, subs);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        lcd_note(path, e ? e : "dlopen failed");
        for (int i = 0; i < LCD_NSUB; i++)
            if (subs[i]) dlclose(subs[i]);
        return false;
    }
    lcd_api a;
    memset(&a, 0, sizeof a);
    a.lib = h;
    struct {
        const char *name;
        void **fn;
        bool optional;
    } syms[] = {
        {"cudnnGetVersion", (void **)&a.GetVersion, false},
        {"cudnnGetErrorString", (void **)&a.GetErrorString, false},
        {"cudnnGetLastErrorString", (void **)&a.GetLastErrorString, true},
        {"cudnnCreate", (void **)&a.Create, false},
        {"cudnnDestroy", (void **)&a.Destroy, false},
        {"cudnnSetStream", (void **)&a.SetStream, false},
        {"cudnnBackendCreateDescriptor", (void **)&a.BackendCreateDescriptor, false},
        {"cudnnBackendDestroyDescriptor", (void **)&a.BackendDestroyDescriptor, false},
        {"cudnnBackendFinalize", (void **)&a.BackendFinalize, false},
        {"cudnnBackendSetAttribute", (void **)&a.BackendSetAttribute, false},
        {"cudnnBackendGetAttribute", (void **)&a.BackendGetAttribute, false},
        {"cudnnBackendExecute", (void **)&a.BackendExecute, false},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].fn = dlsym(h, syms[i].name);
        if (!*syms[i].fn && !syms[i].optional) {
            char m[96];
            snprintf(m, sizeof m, "has no %s", syms[i].name);
            lcd_note(path, m);
            dlclose(h);
            for (int k = 0; k < LCD_NSUB; k++)
                if (subs[k]) dlclose(subs[k]);
            return false;
        }
    }
    a.version = a.GetVersion();
    if (a.version / 10000 != 9 || a.version < LCD_MIN_VERSION) {
        char m[96];
        snprintf(m, sizeof m, "cuDNN %zu.%zu.%zu (the attention graphs need 9.%d or a later 9.x)", a.version / 10000,
                 a.version / 100 % 100, a.version % 100, LCD_MIN_VERSION / 100 % 100);
        lcd_note(path, m);
        dlclose(h);
        for (int i = 0; i < LCD_NSUB; i++)
            if (subs[i]) dlclose(subs[i]);
        return false;
    }
    Dl_info info;
    const char *file = dladdr((void *)a.GetVersion, &info) && info.dli_fname ? info.dli_fname : path;
    snprintf(a.path, sizeof a.path, "%s", file);
    lcd = a;
    return true;
}

/* Tries every file matching pattern (glob), in sorted order. */
static bool lcd_try_glob(const char *pattern)
{
    glob_t gl;
    bool ok = false;
    if (glob(pattern, 0, NULL, &gl) != 0) return false;
    for (size_t i = 0; i < gl.gl_pathc && !ok; i++) ok = lcd_try(gl.gl_pathv[i]);
    globfree(&gl);
    return ok;
}

static void lcd_search(void)
{
    char p[PATH_MAX + 64];
    const char *env = getenv("LOOM_CUDNN_LIBRARY");
    if (env && *env) {
        struct stat st;
        if (stat(env, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(p, sizeof p, "%s/libcudnn.so.9", env);
        else snprintf(p, sizeof p, "%s", env);
        lcd_ok = lcd_try(p);
        if (!lcd_ok) {
            char tmp[sizeof lcd_why];
            snprintf(tmp, sizeof tmp, "LOOM_CUDNN_LIBRARY: %s", lcd_why);
            snprintf(lcd_why, sizeof lcd_why, "%s", tmp);
        }
        return;
    }
    if ((lcd_ok = lcd_try("libcudnn.so.9"))) return;
    const char *libdirs[] = {"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
                             "/usr/local/cuda/targets/sbsa-linux/lib"};
    for (size_t i = 0; i < sizeof libdirs / sizeof libdirs[0]; i++) {
        snprintf(p, sizeof p, "%s/libcudnn.so.9", libdirs[i]);
        struct stat st;
        if (stat(p, &st) == 0 && (lcd_ok = lcd_try(p))) return;
    }
    /* site-packages roots: a glob each, then nvidia/<package>/lib/libcudnn.so.9 below */
    char roots[16][PATH_MAX];
    int nr = 0;
    const char *venvs[] = {getenv("VIRTUAL_ENV"), getenv("CONDA_PREFIX")};
    for (int i = 0; i < 2; i++)
        if (venvs[i] && *venvs[i]) snprintf(roots[nr++], PATH_MAX, "%s/lib/python3*/site-packages", venvs[i]);
    const char *pp = getenv("PYTHONPATH");
    while (pp && *pp && nr < 10) { /* each entry of PYTHONPATH as it is */
        const char *colon = strchr(pp, ':');
        size_t len = colon ? (size_t)(colon - pp) : strlen(pp);
        if (len > 0 && len < PATH_MAX) snprintf(roots[nr++], PATH_MAX, "%.*s", (int)len, pp);
        pp = colon ? colon + 1 : NULL;
    }
    const char *home = getenv("HOME");
    if (home && *home) snprintf(roots[nr++], PATH_MAX, "%s/.local/lib/python3*/site-packages", home);
    const char *fixed[] = {"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                           "/usr/lib/python3/dist-packages", "/usr/lib/python3*/site-packages",
                           "/opt/conda/lib/python3*/site-packages"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] && nr < 16; i++) snprintf(roots[nr++], PATH_MAX, "%s", fixed[i]);
    for (int i = 0; i < nr; i++) {
        snprintf(p, sizeof p, "%s/nvidia/*/lib/libcudnn.so.9", roots[i]);
        if ((lcd_ok = lcd_try_glob(p))) return;
    }
    if (!lcd_why[0]) snprintf(lcd_why, sizeof lcd_why, "libcudnn.so.9 not found");
    char tmp[sizeof lcd_why];
    snprintf(tmp, sizeof tmp, "no usable libcudnn.so.9 (set LOOM_CUDNN_LIBRARY): %s", lcd_why);
    snprintf(lcd_why, sizeof lcd_why, "%s", tmp);
}

const lcd_api *lcd_load(char *why, size_t whylen)
{
    pthread_once(&lcd_once, lcd_search);
    if (lcd_ok) return &lcd;
    if (why && whylen) snprintf(why, whylen, "%s", lcd_why);
    return NULL;
}

void lcd_explain(const lcd_api *api, int status, char *buf, size_t len)
{
    char last[256] = "";
    if (api->GetLastErrorString) api->GetLastErrorString(last, sizeof last);
    snprintf(buf, len, "%s (%d)%s%s", api->GetErrorString((cudnnStatus_t)status), status, last[0] ? ": " : "", last);
}

/* ---- graph builder ---------------------------------------------------------------------- */

void lcd_graph_init(lcd_graph *g, const lcd_api *api)
{
    memset(g, 0, sizeof *g);
    g->api = api;
    g->next_uid = 1000;
}

void lcd_graph_free(lcd_graph *g)
{
    /* in reverse: a plan goes before the graph and tensors it was made from */
    for (int i = g->ndescs - 1; i >= 0; i--) g->api->BackendDestroyDescriptor(g->descs[i]);
    free(g->descs);
    const lcd_api *api = g->api;
    lcd_graph_init(g, api);
}

/* Records the first failure: the step and cuDNN's message. */
static void lcd_fail(lcd_graph *g, cudnnStatus_t st, const char *what)
{
    if (g->st) return;
    g->st = st;
    char m[320];
    lcd_explain(g->api, st, m, sizeof m);
    snprintf(g->err, sizeof g->err, "%s: %s", what, m);
}

static cudnnBackendDescriptor_t lcd_new(lcd_graph *g, cudnnBackendDescriptorType_t t, const char *what)
{
    if (g->st) return NULL;
    if (g->ndescs == g->cap) {
        int cap = g->cap ? 2 * g->cap : 128;
        cudnnBackendDescriptor_t *d = realloc(g->descs, cap * sizeof *d);
        if (!d) {
            lcd_fail(g, CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, what);
            return NULL;
        }
        g->descs = d;
        g->cap = cap;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = g->api->BackendCreateDescriptor(t, &d);
    if (st) {
        lcd_fail(g, st, what);
        return NULL;
    }
    g->descs[g->ndescs++] = d;
    return d;
}

static void lcd_set(lcd_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                    cudnnBackendAttributeType_t t, int64_t n, const void *v, const char *what)
{
    if (g->st) return;
    cudnnStatus_t st = g->api->BackendSetAttribute(d, a, t, n, v);
    if (st) {
        char m[96];
        snprintf(m, sizeof m, "%s (attribute %d)", what, (int)a);
        lcd_fail(g, st, m);
    }
}

static void lcd_fin(lcd_graph *g, cudnnBackendDescriptor_t d, const char *what)
{
    if (g->st) return;
    cudnnStatus_t st = g->api->BackendFinalize(d);
    if (st) lcd_fail(g, st, what);
}

static void lcd_add_op(lcd_graph *g, cudnnBackendDescriptor_t op)
{
    if (g->st) return;
    if (g->nops == (int)(sizeof g->ops / sizeof g->ops[0])) {
        lcd_fail(g, CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND, "too many operations");
        return;
    }
    g->ops[g->nops++] = op;
}

lcd_t lcd_tensor(lcd_graph *g, int64_t uid, cudnnDataType_t t, const int64_t dim[4], const int64_t stride[4],
                 int flags, lcd_t ragged)
{
    lcd_t d = lcd_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    if (!uid) uid = g->next_uid++;
    int64_t align = 16;
    bool yes = true;
    char what[48];
    snprintf(what, sizeof what, "tensor %lld", (long long)uid);
    lcd_set(g, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t, what);
    lcd_set(g, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, what);
    lcd_set(g, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, what);
    lcd_set(g, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
    lcd_set(g, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, what);
    if (flags & LCD_VIRTUAL) lcd_set(g, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
    if (flags & LCD_BY_VALUE) lcd_set(g, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
    if (ragged) lcd_set(g, d, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ragged, what);
    lcd_fin(g, d, what);
    return d;
}

lcd_t lcd_virtual(lcd_graph *g, cudnnDataType_t t, const int64_t dim[4], const int64_t stride[4])
{
    return lcd_tensor(g, 0, t, dim, stride, LCD_VIRTUAL, NULL);
}

lcd_t lcd_scalar(lcd_graph *g, int64_t uid, cudnnDataType_t t)
{
    const int64_t one[4] = {1, 1, 1, 1};
    return lcd_tensor(g, uid, t, one, one, LCD_BY_VALUE, NULL);
}

void lcd_pointwise(lcd_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, lcd_t x, lcd_t b, lcd_t t,
                   lcd_t y, int64_t axis)
{
    char what[48];
    snprintf(what, sizeof what, "pointwise mode %d", (int)mode);
    cudnnBackendDescriptor_t pw = lcd_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
    lcd_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
    lcd_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
    if (axis >= 0) lcd_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
    lcd_fin(g, pw, what);
    cudnnBackendDescriptor_t op = lcd_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
    float one = 1.0f;
    lcd_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    if (b) lcd_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
    if (t) lcd_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, what);
    lcd_fin(g, op, what);
    lcd_add_op(g, op);
}

void lcd_matmul(lcd_graph *g, lcd_t a, lcd_t b, lcd_t c, lcd_t m_ovr, lcd_t n_ovr, lcd_t k_ovr)
{
    const char *what = "matmul";
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t md = lcd_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
    lcd_set(g, md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what);
    lcd_fin(g, md, what);
    cudnnBackendDescriptor_t op = lcd_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &md, what);
    if (m_ovr)
        lcd_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m_ovr, what);
    if (n_ovr)
        lcd_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n_ovr, what);
    if (k_ovr)
        lcd_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &k_ovr, what);
    lcd_fin(g, op, what);
    lcd_add_op(g, op);
}

void lcd_reduction(lcd_graph *g, cudnnReduceTensorOp_t rop, lcd_t x, lcd_t y)
{
    const char *what = "reduction";
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    bool det = false; /* as cuDNN's frontend sets it: the fused engines decide */
    cudnnBackendDescriptor_t rd = lcd_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
    lcd_set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what);
    lcd_set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &rop, what);
    if (g->api->version >= 91100)
        lcd_set(g, rd, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &det, what);
    lcd_fin(g, rd, what);
    cudnnBackendDescriptor_t op = lcd_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    lcd_fin(g, op, what);
    lcd_add_op(g, op);
}

void lcd_reshape(lcd_graph *g, lcd_t x, lcd_t y)
{
    const char *what = "reshape";
    cudnnBackendDescriptor_t op = lcd_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    lcd_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    lcd_fin(g, op, what);
    lcd_add_op(g, op);
}

/* True when the engine of cfg carries the NONDETERMINISTIC numerical note; *index = its
 * global index. Engines whose notes cannot be read count as nondeterministic. */
static bool lcd_nondeterministic(lcd_graph *g, cudnnBackendDescriptor_t cfg, int64_t *index)
{
    const lcd_api *api = g->api;
    *index = -1;
    cudnnBackendDescriptor_t eng = lcd_new(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
    if (!eng) return true;
    int64_t n = 0;
    if (api->BackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng))
        return true;
    api->BackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, index);
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    n = 0;
    if (api->BackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes))
        return true;
    for (int64_t i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++)
        if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
    return false;
}

int lcd_finish(lcd_graph *g, cudnnHandle_t h, cudnnBackendDescriptor_t devprop, bool deterministic)
{
    const lcd_api *api = g->api;
    cudnnBackendDescriptor_t og = lcd_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    if (h) lcd_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "operation graph");
    lcd_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops, "operation graph");
    lcd_fin(g, og, "operation graph");
    if (g->st) return -1;

    /* Candidates in the heuristics' order; a candidate that does not finalize is normal (an
     * engine that does not take this graph): remember why the last one failed. */
    char last[320] = "cuDNN's heuristics offered no engine";
    cudnnStatus_t last_st = CUDNN_STATUS_NOT_SUPPORTED;
    int skipped = 0;
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int m = 0; m < 2; m++) {
        cudnnBackendDescriptor_t heur = lcd_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
        lcd_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og, "heuristics");
        lcd_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m], "heuristics");
        if (devprop)
            lcd_set(g, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop, "heuristics");
        lcd_fin(g, heur, "heuristics");
        if (g->st) { /* this mode is not offered for the graph: try the next */
            last_st = g->st;
            snprintf(last, sizeof last, "%s", g->err);
            g->st = CUDNN_STATUS_SUCCESS;
            g->err[0] = 0;
            continue;
        }
        int64_t count = 0;
        if (api->BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                     NULL))
            continue;
        cudnnBackendDescriptor_t cfgs[64];
        if (count > 64) count = 64;
        for (int64_t i = 0; i < count; i++) cfgs[i] = lcd_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
        if (g->st) return -1;
        int64_t got = 0;
        if (count == 0 || api->BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                   count, &got, cfgs))
            continue;
        for (int64_t i = 0; i < got && i < count; i++) {
            int64_t index;
            bool nondet = lcd_nondeterministic(g, cfgs[i], &index);
            if (g->st) return -1;
            if (deterministic && nondet) {
                skipped++;
                continue;
            }
            cudnnBackendDescriptor_t plan = lcd_new(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
            if (!plan) return -1;
            cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
            if (h) st = api->BackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
            if (!st && devprop)
                st = api->BackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                              1, &devprop);
            if (!st)
                st = api->BackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
            if (!st) st = api->BackendFinalize(plan);
            if (st / 1000 * 1000 == CUDNN_STATUS_EXECUTION_FAILED || !st) {
                if (!g->accepted++) { /* the first taker's workspace, known before its kernels load */
                    int64_t n = 0;
                    api->BackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                             &g->workspace);
                    g->engine = index;
                }
            }
            if (st) {
                char m2[256];
                lcd_explain(api, st, m2, sizeof m2);
                snprintf(last, sizeof last, "engine %lld: %s", (long long)index, m2);
                last_st = st;
                if (!h && g->accepted) goto none; /* without a device no plan can follow: one taker says enough */
                continue;
            }
            int64_t ws = 0, n = 0;
            api->BackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
            g->plan = plan;
            g->workspace = ws;
            g->engine = index;
            return 0;
        }
    }
none:
    g->st = last_st ? last_st : CUDNN_STATUS_NOT_SUPPORTED;
    snprintf(g->err, sizeof g->err, "no execution plan (%d nondeterministic engines skipped); last refusal: %s",
             skipped, last);
    return -1;
}

int lcd_execute(const lcd_api *api, cudnnHandle_t h, const lcd_graph *g, int n, const int64_t *uids,
                void *const *ptrs, void *workspace)
{
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t st = api->BackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (st) return (int)st;
    st = api->BackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (!st) st = api->BackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (!st) st = api->BackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    if (!st) st = api->BackendFinalize(vp);
    if (!st) st = api->BackendExecute(h, g->plan, vp);
    api->BackendDestroyDescriptor(vp);
    return (int)st;
}

#endif /* LOOM_HAVE_CUDNN_H */
