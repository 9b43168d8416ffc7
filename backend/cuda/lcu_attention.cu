/* lcu_attention.cu — causal GQA attention over packed variable-length sequences, forward
 * and backward, flash-attention style (see cuda_ops.h): the entry points, their checks and
 * workspace, the tile tables and D = rowsum(dO ⊙ O). Two kernel versions compute the same
 * function, each in a file of its own: version 1 (lcu_attention_v1.cu: WMMA, simple and
 * checkable, the default) and version 2 (lcu_attention_v2.cu: mma.sync with the operands
 * in registers, LCU_ATTN=mma); lcu_attention.cuh is what they share.
 *
 * Backward (deterministic, no atomics): D = rowsum(dO ⊙ O) first; then one block per (key
 * tile, kv head) recomputes P = exp(scale·QKᵀ − lse) for every query tile and query head of
 * its group and owns dK, dV of its keys; another block per (query tile, query head) owns dQ.
 * That recomputes S and dP once more than a kernel with atomic dQ updates (7 instead of 5
 * matrix products per tile pair) and is the price of bitwise reproducibility.
 *
 * Tiles → (sequence, tile): a small kernel writes cumulative tile counts into the
 * workspace; each block finds its sequence by binary search. Query-tile passes number the
 * blocks from the last tile backwards (late query tiles see the most keys), the key-tile
 * pass from the first (early key tiles see the most queries), so the heavy blocks start
 * first.
 *
 * lcu_attn_decode_fwd (lcu_attention_decode.cu) computes the KV-cache forward with a kernel
 * made for a decode step's one query row per sequence.
 *
 * Tuning is local to these files: the entry points and the workspace stay as they are.
 */
#include "backend/cuda/lcu_attention.cuh"

#include <stdlib.h>
#include <string.h>

/* Cumulative 64-row tile counts of the queries (cum_q) and of the keys (cum_k). One block:
 * each thread sums a contiguous run of sequences, thread 0 scans the runs. */
__global__ void lcu_attn_prep_k(const int32_t *q_start, const int32_t *kv_len, int nseq, int32_t *cum_q,
                                int32_t *cum_k)
{
    __shared__ int sq[1024], sk[1024];
    int chunk = (nseq + blockDim.x - 1) / blockDim.x, b = threadIdx.x * chunk;
    int e = b + chunk < nseq ? b + chunk : nseq;
    int tq = 0, tk = 0;
    for (int i = b; i < e; i++) {
        int ql = q_start[i + 1] - q_start[i], kl = kv_len ? kv_len[i] : ql;
        tq += (ql + LCU_AT - 1) / LCU_AT;
        tk += (kl + LCU_AT - 1) / LCU_AT;
    }
    sq[threadIdx.x] = tq;
    sk[threadIdx.x] = tk;
    __syncthreads();
    if (threadIdx.x == 0) {
        int rq = 0, rk = 0;
        for (int t = 0; t < (int)blockDim.x; t++) {
            int a = sq[t], c = sk[t];
            sq[t] = rq;
            sk[t] = rk;
            rq += a;
            rk += c;
        }
        cum_q[nseq] = rq;
        cum_k[nseq] = rk;
    }
    __syncthreads();
    int rq = sq[threadIdx.x], rk = sk[threadIdx.x];
    for (int i = b; i < e; i++) {
        int ql = q_start[i + 1] - q_start[i], kl = kv_len ? kv_len[i] : ql;
        cum_q[i] = rq;
        cum_k[i] = rk;
        rq += (ql + LCU_AT - 1) / LCU_AT;
        rk += (kl + LCU_AT - 1) / LCU_AT;
    }
}

/* Dv[t, h] = Σ_c dO[t, h, c]·O[t, h, c] (fp32) for every row and query head. */
__global__ void lcu_attn_bwd_pre_k(const bf16 *out, const bf16 *dout, float *Dv, long n, int d)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const uint4 *o = reinterpret_cast<const uint4 *>(out + i * d), *g = reinterpret_cast<const uint4 *>(dout + i * d);
        float s = 0.0f;
        for (int c = 0; c < d / 8; c++) {
            uint4 a = o[c], b = g[c];
            const __nv_bfloat162 *pa = reinterpret_cast<const __nv_bfloat162 *>(&a);
            const __nv_bfloat162 *pb = reinterpret_cast<const __nv_bfloat162 *>(&b);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 x = __bfloat1622float2(pa[e]), y = __bfloat1622float2(pb[e]);
                s += x.x * y.x + x.y * y.y;
            }
        }
        Dv[i] = s;
    }
}

/* ---- host side ---------------------------------------------------------------------------- */

static size_t lcu_attn_cum_bytes(int nseq) { return ((size_t)2 * (nseq + 1) * 4 + 255) / 256 * 256; }

size_t lcu_attn_workspace_bytes(const lcu_attn_desc *a)
{
    return lcu_attn_cum_bytes(a->nseq) + (size_t)a->total_q * a->nq * sizeof(float);
}

static int lcu_attn_check(const lcu_attn_desc *a, void *ws)
{
    if (!a || a->nseq < 0 || a->total_q < 0 || a->nq <= 0 || a->nkv <= 0 || a->nq % a->nkv) return LCU_EINVAL;
    if (a->d != 16 && a->d != 32 && a->d != 64 && a->d != 128) return LCU_EINVAL;
    if (a->total_q > 0 && (!a->q_start || !ws)) return LCU_EINVAL;
    if ((long)a->total_q / LCU_AT + a->nseq >= (1L << 31)) return LCU_EINVAL;
    return 0;
}

/* Runs the tile-count kernel and fills the launch parameters; *ub = blocks along x. */
static int lcu_attn_prepare(const lcu_attn_desc *a, void *ws, bool keys, lcu_attn_p *p, cudaStream_t s)
{
    int32_t *cum_q = (int32_t *)ws, *cum_k = cum_q + a->nseq + 1;
    if (!a->counted) {
        lcu_attn_prep_k<<<1, 1024, 0, s>>>(a->q_start, a->kv_len, a->nseq, cum_q, cum_k);
        int rc = lcu_launch_status();
        if (rc) return rc;
    }
    p->q_start = a->q_start;
    p->kv_start = a->kv_start;
    p->kv_len = a->kv_len;
    p->cum = keys ? cum_k : cum_q;
    p->nseq = a->nseq;
    p->nq = a->nq;
    p->nkv = a->nkv;
    p->scale = a->scale;
    /* Σ ceil(n_i / 64) ≤ floor(Σ n_i / 64) + nseq (for keys: self-attention, the same n_i) */
    p->ub = a->total_q / LCU_AT + a->nseq;
    return 0;
}

/* The kernels of the version LCU_ATTN selects: mma version 2 (lcu_attention_v2.cu), anything
 * else version 1. */
static lcu_attn_kernels lcu_attn_version(int d)
{
    const char *e = getenv("LCU_ATTN");
    return e && strcmp(e, "mma") == 0 ? lcu_attn_v2_kernels(d) : lcu_attn_v1_kernels(d);
}

int lcu_attn_fwd(const lcu_attn_desc *a, const lcu_bf16 *q, const lcu_bf16 *k, const lcu_bf16 *v, lcu_bf16 *out,
                 float *lse, void *ws, cudaStream_t s)
{
    int rc = lcu_attn_check(a, ws);
    if (rc) return rc;
    if (a->total_q == 0 || a->nseq == 0) return 0;
    if (!q || !k || !v || !out || !lse) return LCU_EINVAL;
    const bf16 *Q = (const bf16 *)q, *K = (const bf16 *)k, *V = (const bf16 *)v;
    bf16 *O = (bf16 *)out;
    lcu_attn_p p;
    rc = lcu_attn_prepare(a, ws, false, &p, s);
    if (rc) return rc;
    lcu_attn_kernels kn = lcu_attn_version(a->d);
    rc = (int)cudaFuncSetAttribute(kn.fwd, cudaFuncAttributeMaxDynamicSharedMemorySize, kn.fwd_smem);
    if (rc) return rc;
    kn.fwd<<<dim3((unsigned)p.ub, p.nq), 128, kn.fwd_smem, s>>>(p, Q, K, V, O, lse);
    return lcu_launch_status();
}

int lcu_attn_bwd(const lcu_attn_desc *a, const lcu_bf16 *q, const lcu_bf16 *k, const lcu_bf16 *v,
                 const lcu_bf16 *out, const float *lse, const lcu_bf16 *dout, float *dq, float *dk, float *dv,
                 void *ws, cudaStream_t s)
{
    int rc = lcu_attn_check(a, ws);
    if (rc) return rc;
    if (a->kv_start || a->kv_len) return LCU_EINVAL; /* self-attention only */
    if (a->total_q == 0 || a->nseq == 0) return 0;
    if (!q || !k || !v || !out || !lse || !dout || !dq || !dk || !dv) return LCU_EINVAL;
    float *Dv = (float *)((char *)ws + lcu_attn_cum_bytes(a->nseq));
    long n = a->total_q * a->nq;
    lcu_attn_bwd_pre_k<<<lcu_blocks(n, 256), 256, 0, s>>>((const bf16 *)out, (const bf16 *)dout, Dv, n, a->d);
    rc = lcu_launch_status();
    if (rc) return rc;
    lcu_attn_p pk, pq;
    rc = lcu_attn_prepare(a, ws, true, &pk, s);
    if (rc) return rc;
    pq = pk;
    pq.cum = (const int32_t *)ws; /* query tiles */
    const bf16 *Q = (const bf16 *)q, *K = (const bf16 *)k, *V = (const bf16 *)v, *dO = (const bf16 *)dout;
    lcu_attn_kernels kn = lcu_attn_version(a->d);
    rc = (int)cudaFuncSetAttribute(kn.dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, kn.dkdv_smem);
    if (!rc) rc = (int)cudaFuncSetAttribute(kn.dq, cudaFuncAttributeMaxDynamicSharedMemorySize, kn.dq_smem);
    if (rc) return rc;
    kn.dkdv<<<dim3((unsigned)pk.ub, a->nkv), kn.bwd_threads, kn.dkdv_smem, s>>>(pk, Q, K, V, dO, lse, Dv, dk, dv);
    rc = lcu_launch_status();
    if (rc) return rc;
    kn.dq<<<dim3((unsigned)pq.ub, a->nq), kn.bwd_threads, kn.dq_smem, s>>>(pq, Q, K, V, dO, lse, Dv, dq);
    return lcu_launch_status();
}
