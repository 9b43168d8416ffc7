/* lcu_head.cu — the output head's per-row work on a chunk of logits (see cuda_ops.h):
 * log-softmax, per-token logprobs, the five losses of backend/loss.h, dℓ/dlogits, and top-k.
 *
 * The caller computes logits for a chunk of rows at a time (a GEMM into a [rows, V] fp32
 * buffer), so [T, V] never exists; chunks of whole rows (rather than vocabulary slices)
 * let each row be finished in one visit: the dlogits of the chunk feed the dX and LoRA
 * GEMMs right away, and logits are computed once, not twice.
 *
 * One block per row; every reduction has a fixed shape (per-thread strided partials, then
 * lcu_block_sum), so results are the same bits run to run.
 */
#include "backend/cuda/lcu_common.cuh"

#include <math.h>

#define LCU_HEAD_THREADS 1024
#define LCU_TOPK_MAX 1024

/* ℓ and dℓ/dlp of one token: backend/loss.h loss_token, line for line, on the device
 * (tests/gpu/test_gpu_head.c compares the two on random inputs). */
__device__ __forceinline__ void lcu_loss_token(const lcu_loss_seq *s, float lp, float w, float q, float adv,
                                               float *loss, float *dlp)
{
    if (s->kind == 0) { /* cross_entropy */
        *loss = -w * lp;
        *dlp = -w;
        return;
    }
    if (adv == 0.0f) { *loss = 0.0f; *dlp = 0.0f; return; }
    double A = adv, l = lp, r = exp(l - (double)q);
    switch (s->kind) {
    case 1: /* importance_sampling */
        *loss = (float)(-r * A);
        *dlp = (float)(-r * A);
        return;
    case 2: { /* ppo */
        double rc = r < s->clip_low ? s->clip_low : r > s->clip_high ? s->clip_high : r;
        double unclipped = r * A, clipped = rc * A;
        *loss = (float)(-(unclipped < clipped ? unclipped : clipped));
        *dlp = unclipped <= clipped ? (float)(-r * A) : 0.0f;
        return;
    }
    case 3: { /* cispo */
        double rc = r < s->clip_low ? s->clip_low : r > s->clip_high ? s->clip_high : r;
        *loss = (float)(-rc * l * A);
        *dlp = (float)(-rc * A);
        return;
    }
    case 4: { /* dro */
        double dq = l - (double)q;
        *loss = (float)(-(l * A - 0.5 * s->beta * dq * dq));
        *dlp = (float)(-(A - s->beta * dq));
        return;
    }
    default:
        *loss = 0.0f;
        *dlp = 0.0f;
    }
}

/* lp, ℓ, dℓ/dlp of the row's target k. */
__device__ __forceinline__ void lcu_head_target(const lcu_head_batch &b, const lcu_loss_seq *ls, const float *z,
                                                long t, long k, double lse, float *lp, float *l, float *dlp)
{
    *lp = (float)((double)z[b.targets[k]] - lse);
    float w = b.weights ? b.weights[k] : 1.0f;
    float q = b.sampler_lp ? b.sampler_lp[t] : 0.0f, adv = b.adv ? b.adv[t] : 0.0f;
    lcu_loss_token(ls, *lp, w, q, adv, l, dlp);
}

__global__ void __launch_bounds__(LCU_HEAD_THREADS) lcu_head_loss_k(const float *logits, long ld, long row0, int V,
                                                                    lcu_head_batch b, __nv_bfloat16 *dlog, long ldd)
{
    __shared__ double sd[32];
    __shared__ float sf[32];
    long t = row0 + blockIdx.x;
    const float *z = logits + (long)blockIdx.x * ld;

    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, z[v]);
    mx = lcu_block_max(mx, sf, -INFINITY);
    double sum = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(z[v] - mx);
    sum = lcu_block_sum(sum, sd);
    double lse = (double)mx + log(sum);

    const lcu_loss_seq *ls = &b.seqs[b.row_seq[t]];
    long k0 = b.tgt_start[t], K = b.tgt_start[t + 1] - k0;
    double loss = 0, dsum = 0;
    for (long k = threadIdx.x; k < K; k += blockDim.x) {
        float lp, l, dlp;
        lcu_head_target(b, ls, z, t, k0 + k, lse, &lp, &l, &dlp);
        b.lp_out[k0 + k] = lp;
        loss += l;
        dsum += dlp;
    }
    loss = lcu_block_sum(loss, sd);
    dsum = lcu_block_sum(dsum, sd);
    if (threadIdx.x == 0) {
        b.loss_out[t] = (float)loss;
        if (b.lse_out) b.lse_out[t] = lse;
    }
    if (!dlog) return;

    __nv_bfloat16 *g = dlog + (long)blockIdx.x * ldd;
    /* a row whose dℓ/dlp is not finite adds no gradient (backend/backend.h; the CPU's
     * !isfinite(dsum)): dsum is the block's sum, the same bits in every thread */
    bool grad = ls->grad != 0 && isfinite(dsum);
    if (grad && K == 1) { /* a row whose only dℓ/dlp is 0 stays exactly zero (as the CPU) */
        float lp, l, dlp;
        lcu_head_target(b, ls, z, t, k0, lse, &lp, &l, &dlp);
        grad = dlp != 0.0f;
    }
    if (!grad) {
        for (int v = threadIdx.x; v < V; v += blockDim.x) g[v] = __float2bfloat16_rn(0.0f);
        return;
    }
    /* dℓ/dz_v = −Σ_k dℓ/dlp_k · softmax_v + Σ_{k: t_k = v} dℓ/dlp_k */
    float f = (float)(-dsum / sum);
    for (int v = threadIdx.x; v < V; v += blockDim.x) g[v] = __float2bfloat16_rn(f * expf(z[v] - mx));
    __syncthreads(); /* the dense part is written; target columns are rewritten whole below */
    for (long k = threadIdx.x; k < K; k += blockDim.x) {
        int id = b.targets[k0 + k];
        bool first = true;
        float add = 0.0f;
        for (long j = 0; j < K && first; j++) {
            if (b.targets[k0 + j] != id) continue;
            if (j < k) { first = false; break; } /* an earlier duplicate writes this column */
            float lp, l, dlp;
            lcu_head_target(b, ls, z, t, k0 + j, lse, &lp, &l, &dlp);
            add += dlp;
        }
        if (first) g[id] = __float2bfloat16_rn(f * expf(z[id] - mx) + add);
    }
}

int lcu_head_loss(const float *logits, long ld, long row0, int rows, int V, const lcu_head_batch *b,
                  lcu_bf16 *dlogits, long ldd, cudaStream_t s)
{
    if (!b || rows < 0 || V <= 0 || ld < V || row0 < 0 || (dlogits && ldd < V)) return LCU_EINVAL;
    if (rows == 0) return 0;
    if (!logits || !b->row_seq || !b->seqs || !b->tgt_start || !b->targets || !b->lp_out || !b->loss_out)
        return LCU_EINVAL;
    lcu_head_loss_k<<<rows, LCU_HEAD_THREADS, 0, s>>>(logits, ld, row0, V, *b, (__nv_bfloat16 *)dlogits, ldd);
    return lcu_launch_status();
}

/* ---- top-k -------------------------------------------------------------------------------- */

/* A key that orders logits by value, then lower id first, and is unique per id. */
__device__ __forceinline__ uint64_t lcu_topk_key(float f, int v)
{
    uint32_t u = f == 0.0f ? 0u : __float_as_uint(f); /* -0 ties with +0, as on the CPU */
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint32_t)(0xffffffffu - (uint32_t)v);
}

/* The k-th largest key by radix select (lcu_radix_kth, 8 passes of 8 bits), then the k
 * keys ≥ it collected and bitonic-sorted in shared memory. */
__global__ void __launch_bounds__(LCU_HEAD_THREADS) lcu_head_topk_k(const float *logits, long ld, long row0, int V,
                                                                    const int64_t *topk_start, const double *lse,
                                                                    int32_t *ids, float *lps)
{
    __shared__ int hist[256];
    __shared__ uint64_t keys[LCU_TOPK_MAX];
    __shared__ uint64_t s_prefix;
    __shared__ int s_rem, s_count;
    long t = row0 + blockIdx.x;
    long o = topk_start[t];
    long kk = topk_start[t + 1] - o;
    int k = (int)(kk < V ? (kk < LCU_TOPK_MAX ? kk : LCU_TOPK_MAX) : V); /* the backend checks k first */
    if (k <= 0) return;
    const float *z = logits + (long)blockIdx.x * ld;
    if (threadIdx.x == 0) s_count = 0;
    /* keys are unique per id: exactly k keys are ≥ the k-th largest */
    uint64_t kth = lcu_radix_kth<uint64_t>([&](long v) { return lcu_topk_key(z[v], (int)v); }, V, k, hist, &s_prefix,
                                           &s_rem);
    int n = 1;
    while (n < k) n <<= 1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) keys[i] = 0; /* below every real key */
    __syncthreads();
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        uint64_t key = lcu_topk_key(z[v], v);
        if (key >= kth) keys[atomicAdd(&s_count, 1)] = key;
    }
    __syncthreads();
    for (int size = 2; size <= n; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                int j = i ^ stride;
                if (j > i) {
                    bool up = (i & size) == 0;
                    uint64_t a = keys[i], c = keys[j];
                    if ((a > c) == up) { keys[i] = c; keys[j] = a; }
                }
            }
            __syncthreads();
        }
    /* ascending: the best is last */
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        uint64_t key = keys[n - 1 - i];
        int id = (int)(0xffffffffu - (uint32_t)key);
        ids[o + i] = id;
        lps[o + i] = (float)((double)z[id] - lse[t]);
    }
}

int lcu_head_topk(const float *logits, long ld, long row0, int rows, int V, const int64_t *topk_start,
                  const double *lse, int32_t *ids_out, float *lp_out, cudaStream_t s)
{
    if (rows < 0 || V <= 0 || ld < V || row0 < 0) return LCU_EINVAL;
    if (rows == 0) return 0;
    if (!logits || !topk_start || !lse || !ids_out || !lp_out) return LCU_EINVAL;
    lcu_head_topk_k<<<rows, LCU_HEAD_THREADS, 0, s>>>(logits, ld, row0, V, topk_start, lse, ids_out, lp_out);
    return lcu_launch_status();
}
