/* lcu_sample.cu — picking tokens from logits on the device with the CPU backend's
 * algorithm (cpu_choose.c cpu_choose_token; see cuda_ops.h), one block per row:
 *
 *   argmax (first index of the max) → greedy: log-softmax of it, done
 *   w_v = (float)exp((z_v − max)·(1/T))            (as the CPU: float difference, double exp)
 *   top-k: the k-th largest w (radix select on the bits of w ≥ 0, counts with duplicates,
 *          like the CPU's quickselect) is the threshold; smaller weights become 0
 *   no top-p: u = uniform·Σw, the first id (in id order) whose running sum exceeds u
 *   top-p:   keys (w bits, id) sorted descending (CUB segmented radix sort; keys are unique,
 *          so the order is the CPU's qsort order), keep = the shortest prefix whose mass
 *          reaches top_p·Σw, u = uniform·mass(keep), the first kept key whose running sum
 *          exceeds u
 *
 * The one uniform draw comes from the row's xoshiro256** state (model/rng.h), advanced here.
 * Sums run in double in a fixed block order that differs from the CPU's sequential one,
 * so a pick can differ only when u lands within ~1e-16 (relative) of a boundary.
 */
#include "backend/cuda/lcu_common.cuh"

#include <cub/device/device_segmented_radix_sort.cuh>
#include <math.h>

#define LCU_SAMPLE_THREADS 1024
#define LCU_SCAN_IPT 8

/* ---- workspace ---------------------------------------------------------------------------- */

typedef struct {
    size_t params, w, keys, sorted, begin, end, sum, cub, total;
    size_t cub_bytes;
} lcu_sample_layout;

static size_t lcu_al(size_t x) { return (x + 255) / 256 * 256; }

static int lcu_sample_plan(int rows, int V, lcu_sample_layout *L)
{
    size_t n = (size_t)rows * V;
    L->cub_bytes = 0;
    cudaError_t e = cub::DeviceSegmentedRadixSort::SortKeysDescending(
        (void *)NULL, L->cub_bytes, (const uint64_t *)NULL, (uint64_t *)NULL, (int)n, rows, (const int *)NULL,
        (const int *)NULL, 0, 64, (cudaStream_t)0);
    if (e != cudaSuccess) return (int)e;
    size_t off = 0;
    L->params = off; off += lcu_al(rows * sizeof(lcu_sample_params));
    L->w = off;      off += lcu_al(n * sizeof(float));
    L->keys = off;   off += lcu_al(n * sizeof(uint64_t));
    L->sorted = off; off += lcu_al(n * sizeof(uint64_t));
    L->begin = off;  off += lcu_al(rows * sizeof(int));
    L->end = off;    off += lcu_al(rows * sizeof(int));
    L->sum = off;    off += lcu_al(rows * sizeof(double));
    L->cub = off;    off += lcu_al(L->cub_bytes);
    L->total = off;
    return 0;
}

size_t lcu_sample_workspace_bytes(int rows, int V)
{
    lcu_sample_layout L;
    if (rows <= 0 || V <= 0 || (size_t)rows * V >= (1u << 31)) return 0;
    return lcu_sample_plan(rows, V, &L) ? 0 : L.total;
}

/* ---- block helpers ------------------------------------------------------------------------ */

/* model/rng.h rng_next + rng_uniform on a state in global memory. */
__device__ double lcu_rng_uniform(uint64_t *s)
{
    uint64_t r = s[1] * 5;
    r = ((r << 7) | (r >> 57)) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return (double)(r >> 11) * 0x1.0p-53;
}

/* Exclusive prefix of v over the block (fixed order); *total gets the block's sum. */
__device__ double lcu_block_exscan(double v, double *tot, double *total)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    double x = v;
    for (int o = 1; o < 32; o <<= 1) {
        double y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    double ex = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) ex = 0;
    __syncthreads();
    if (lane == 31) tot[w] = x;
    __syncthreads();
    if (w == 0) {
        double t = lane < nw ? tot[lane] : 0.0;
        for (int o = 1; o < 32; o <<= 1) {
            double y = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += y;
        }
        tot[lane] = t; /* inclusive over warps */
    }
    __syncthreads();
    *total = tot[nw - 1];
    return ex + (w > 0 ? tot[w - 1] : 0.0);
}

/* The first index i < n with weight(i) > 0 whose running sum (in this fixed order)
 * satisfies sum ≥ thr (ge) or sum > thr (!ge); -1 if none. *at = the sum there (the total if none).
 * weight(i) gives item i. Tiles of blockDim·8 items; each thread sums 8 in a row. */
template <typename F>
__device__ long lcu_first_prefix(F weight, long n, double thr, bool ge, double *at, double *tot, int *s_best,
                                 double *s_at)
{
    double carry = 0;
    long tile = (long)blockDim.x * LCU_SCAN_IPT;
    for (long base = 0; base < n; base += tile) {
        long b = base + (long)threadIdx.x * LCU_SCAN_IPT;
        double mine = 0;
        for (int j = 0; j < LCU_SCAN_IPT; j++)
            if (b + j < n) mine += weight(b + j);
        double total, run = carry + lcu_block_exscan(mine, tot, &total);
        if (threadIdx.x == 0) *s_best = 0x7fffffff;
        __syncthreads();
        long hit = -1;
        double hit_at = 0;
        for (int j = 0; j < LCU_SCAN_IPT && b + j < n; j++) {
            double x = weight(b + j);
            run += x;
            /* Only an item with weight can be the hit (the CPU skips zero weights): this
             * thread's start (the block scan) and the previous thread's end (its own
             * sequential sum) may differ in the last bit, and a threshold between them would
             * otherwise pick this thread's first item, weight 0 or not. */
            if (x > 0 && (ge ? run >= thr : run > thr)) { hit = b + j; hit_at = run; break; }
        }
        if (hit >= 0) atomicMin(s_best, (int)(hit - base));
        __syncthreads();
        int best = *s_best;
        if (best != 0x7fffffff) {
            if (hit == base + best) *s_at = hit_at;
            __syncthreads();
            *at = *s_at;
            return base + best;
        }
        carry += total;
    }
    *at = carry;
    return -1;
}

/* ---- kernels ------------------------------------------------------------------------------ */

typedef struct {
    const float *logits;
    long ld;
    int V;
    const lcu_sample_params *params;
    uint64_t *rng;
    int32_t *tok;
    float *lp;
    float *w;
    uint64_t *keys;
    const uint64_t *sorted;
    int *begin, *end;
    double *sum;
} lcu_sample_k_args;

struct lcu_w_id {
    const float *w;
    __device__ double operator()(long i) const { return w[i]; }
};

struct lcu_w_sorted {
    const float *w;
    const uint64_t *k;
    __device__ double operator()(long i) const { return w[(uint32_t)k[i]]; }
};

__global__ void __launch_bounds__(LCU_SAMPLE_THREADS) lcu_sample_prep_k(lcu_sample_k_args a)
{
    __shared__ double tot[32], s_at;
    __shared__ float s_val[32];
    __shared__ int s_idx[32], hist[256], s_best;
    __shared__ uint32_t s_prefix;
    __shared__ int s_rem;
    int row = blockIdx.x, V = a.V;
    const float *z = a.logits + (long)row * a.ld;
    const lcu_sample_params *pr = &a.params[row];
    float *w = a.w + (long)row * V;
    long base = (long)row * V;
    if (threadIdx.x == 0) {
        a.begin[row] = (int)base;
        a.end[row] = (int)base; /* an empty segment unless this row sorts */
    }

    /* argmax: the largest value, the lowest index among equals (the CPU's strict >) */
    float mx = -INFINITY;
    int bi = 0x7fffffff;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        if (z[v] > mx || bi == 0x7fffffff) { mx = z[v]; bi = v; }
    for (int o = 16; o > 0; o >>= 1) {
        float om = __shfl_xor_sync(0xffffffffu, mx, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (om > mx || (om == mx && oi < bi)) { mx = om; bi = oi; }
    }
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) { s_val[wid] = mx; s_idx[wid] = bi; }
    __syncthreads();
    if (wid == 0) {
        mx = lane < nw ? s_val[lane] : -INFINITY;
        bi = lane < nw ? s_idx[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            float om = __shfl_xor_sync(0xffffffffu, mx, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (om > mx || (om == mx && oi < bi)) { mx = om; bi = oi; }
        }
        if (lane == 0) { s_val[0] = mx; s_idx[0] = bi; }
    }
    __syncthreads();
    mx = s_val[0];
    int best = s_idx[0];

    if (pr->temperature == 0) {
        double s = 0;
        for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(z[v] - mx);
        s = lcu_block_sum(s, tot);
        if (threadIdx.x == 0) {
            a.tok[row] = best;
            a.lp[row] = (float)(-log(s));
        }
        return;
    }
    double inv_t = 1.0 / pr->temperature;
    for (int v = threadIdx.x; v < V; v += blockDim.x) w[v] = (float)exp((double)(z[v] - mx) * inv_t);
    if (pr->top_k > 0 && pr->top_k < V) {
        /* the k-th largest weight, duplicates counted (the CPU's quickselect): w ≥ 0, so
         * its bits order like its values */
        uint32_t kth = lcu_radix_kth<uint32_t>([&](long v) { return __float_as_uint(w[v]); }, V, pr->top_k, hist,
                                               &s_prefix, &s_rem);
        float thr = __uint_as_float(kth);
        for (int v = threadIdx.x; v < V; v += blockDim.x)
            if (w[v] < thr) w[v] = 0.0f;
    }
    __syncthreads(); /* w final */
    double s = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) s += w[v];
    s = lcu_block_sum(s, tot);

    if (pr->top_p < 1.0) {
        for (int v = threadIdx.x; v < V; v += blockDim.x)
            a.keys[base + v] = ((uint64_t)__float_as_uint(w[v]) << 32) | (uint32_t)v;
        if (threadIdx.x == 0) {
            a.end[row] = (int)(base + V);
            a.sum[row] = s;
        }
        return; /* lcu_sample_nucleus_k finishes the row after the sort */
    }
    __shared__ double s_u;
    if (threadIdx.x == 0) s_u = lcu_rng_uniform(a.rng + 4L * row) * s;
    __syncthreads();
    double at;
    lcu_w_id f = {w};
    long i = lcu_first_prefix(f, V, s_u, false, &at, tot, &s_best, &s_at);
    if (threadIdx.x == 0) {
        long pick = i;
        if (pick < 0) /* u ≥ the running total (rounding): the last nonzero weight, as the CPU */
            for (pick = V - 1; pick > 0 && w[pick] == 0.0f; pick--) {}
        a.tok[row] = (int32_t)pick;
        a.lp[row] = (float)log(w[pick] / s);
    }
}

__global__ void __launch_bounds__(LCU_SAMPLE_THREADS) lcu_sample_nucleus_k(lcu_sample_k_args a)
{
    __shared__ double tot[32], s_at, s_u;
    __shared__ int s_best;
    int row = blockIdx.x, V = a.V;
    const lcu_sample_params *pr = &a.params[row];
    if (pr->temperature == 0 || pr->top_p >= 1.0) return;
    const float *w = a.w + (long)row * V;
    const uint64_t *k = a.sorted + (long)row * V;
    /* n: the positive weights, which sort first */
    __shared__ int s_n;
    if (threadIdx.x == 0) s_n = V;
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if ((k[i] >> 32) == 0 && (i == 0 || (k[i - 1] >> 32) != 0)) s_n = i;
    __syncthreads();
    int n = s_n;
    lcu_w_sorted f = {w, k};
    double cum;
    long hit = lcu_first_prefix(f, n, pr->top_p * a.sum[row], true, &cum, tot, &s_best, &s_at);
    long keep = hit >= 0 ? hit + 1 : n;
    if (threadIdx.x == 0) s_u = lcu_rng_uniform(a.rng + 4L * row) * cum;
    __syncthreads();
    double at;
    long i = lcu_first_prefix(f, keep, s_u, false, &at, tot, &s_best, &s_at);
    if (threadIdx.x == 0) {
        if (i < 0) i = keep - 1;
        int v = (int)(uint32_t)k[i];
        a.tok[row] = v;
        a.lp[row] = (float)log(w[v] / cum);
    }
}

int lcu_sample(const float *logits, long ld, int rows, int V, const lcu_sample_params *params, uint64_t *rng,
               int32_t *tok_out, float *lp_out, void *ws, size_t ws_bytes, cudaStream_t s)
{
    if (rows < 0 || V <= 0 || ld < V || (rows && (!logits || !params || !rng || !tok_out || !lp_out || !ws)))
        return LCU_EINVAL;
    if (rows == 0) return 0;
    if ((size_t)rows * V >= (1u << 31)) return LCU_EINVAL;
    lcu_sample_layout L;
    int rc = lcu_sample_plan(rows, V, &L);
    if (rc) return rc;
    if (ws_bytes < L.total) return LCU_EINVAL;
    bool nucleus = false;
    for (int r = 0; r < rows; r++) {
        const lcu_sample_params *p = &params[r];
        if (!(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1)) return LCU_EINVAL;
        nucleus |= p->temperature > 0 && p->top_p < 1.0;
    }
    char *b = (char *)ws;
    rc = (int)cudaMemcpyAsync(b + L.params, params, rows * sizeof *params, cudaMemcpyHostToDevice, s);
    if (rc) return rc;
    lcu_sample_k_args a = {logits, ld, V, (const lcu_sample_params *)(b + L.params), rng, tok_out, lp_out,
                           (float *)(b + L.w), (uint64_t *)(b + L.keys), (const uint64_t *)(b + L.sorted),
                           (int *)(b + L.begin), (int *)(b + L.end), (double *)(b + L.sum)};
    lcu_sample_prep_k<<<rows, LCU_SAMPLE_THREADS, 0, s>>>(a);
    rc = lcu_launch_status();
    if (rc || !nucleus) return rc;
    size_t cub_bytes = L.cub_bytes;
    rc = (int)cub::DeviceSegmentedRadixSort::SortKeysDescending(
        (void *)(b + L.cub), cub_bytes, (const uint64_t *)(b + L.keys), (uint64_t *)(b + L.sorted), rows * V, rows,
        (const int *)(b + L.begin), (const int *)(b + L.end), 0, 64, s);
    if (rc) return rc;
    lcu_sample_nucleus_k<<<rows, LCU_SAMPLE_THREADS, 0, s>>>(a);
    return lcu_launch_status();
}
