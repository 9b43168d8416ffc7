/* lcu_attention_decode.cu — the KV-cache attention of a decode step in a kernel of its own
 * (lcu_attn_decode_fwd, cuda_ops.h: the function lcu_attn_fwd computes with kv_start and
 * kv_len), which the backend takes unless LCU_DECODE_ATTN=0 (the default since the fifth
 * GPU window measured it: bench/cuda/WINDOWS.md).
 *
 * Why a kernel of its own: a decode step has one query row per sequence. Versions 1 and 2
 * work in 64-row query tiles, so there a block computes 64×64 score tiles of which one row
 * is real, and one block runs per (sequence, query head): the third GPU window measured
 * Qwen3-8B's decode attention at 162 µs a layer (32 samples, 192 keys each) against a
 * memory floor of 8 µs, more than its seven GEMMs together. cuDNN's attention graphs here
 * take no KV-cache layout (lcu_cudnn_attn.c answers LCU_ENOTSUP) and cuBLAS has nothing for
 * a softmax between two products, so nothing in NVIDIA's libraries fits.
 *
 * The kernel: one block per (sequence, kv head), LCU_DEC_WARPS warps. The block's tasks are
 * (query row, query head of the kv head's group) pairs, DEC_TASKS at a time (a decode step
 * has one row, so G = nq/nkv tasks: up to 4 in one go). Each warp takes runs of DEC_KU keys
 * of the row's causal range, LCU_DEC_WARPS·DEC_KU keys apart, loads a run's key and value
 * rows before using them, reads each key row once for all the tasks (each lane holds D/32
 * consecutive elements of the row, of each task's query, of each task's output), sums the
 * dot products across the warp with shuffles (every lane then has the score), and keeps an
 * online softmax per task in fp32: the running max m, the sum l of exp(s − m), and the
 * output o = Σ exp(s − m)·v. The warps' partial (m, l, o) go through shared memory and are
 * merged in warp order. Every sum has a fixed order: the results do not depend on timing
 * (bitwise reruns). Scores are scale·q·k in fp32 from the bf16 inputs, P stays fp32 (the
 * tile kernels round it to bf16 for their products), so values agree with version 1 within
 * bf16 rounding, not bit for bit; lse = m + log l (natural log), as version 1 writes it.
 *
 * Any q_len ≤ kv_len is computed correctly (row j of q_len sees keys 0 .. kv_len − q_len + j,
 * as cuda_ops.h says), so test_gpu_attention runs its KV-cache cases here too; it is fast
 * for the few rows a decode step has, not for long prefills (those are self-attention and
 * never come here).
 */
#include "backend/cuda/lcu_attention.cuh"

#define LCU_DEC_WARPS 8 /* warps of a block: keys split among them */
#define DEC_TASKS 4     /* (row, head) pairs a block keeps in registers at a time (a group of 4
                           query heads a kv head, Qwen3-8B's and Llama's, in one go) */
#define DEC_KU 4        /* consecutive keys a warp loads before using them */

/* Per lane: E consecutive elements of a D-long row (lanes ≥ D/E hold none when D < 32). */
template <int D> struct dec_geom {
    static constexpr int E = D >= 32 ? D / 32 : 1;
    static constexpr int LANES = D / E; /* lanes that hold elements */
};

template <int D> __device__ __forceinline__ void dec_load(float *x, const bf16 *row, int lane)
{
    constexpr int E = dec_geom<D>::E;
    if (lane >= dec_geom<D>::LANES) {
#pragma unroll
        for (int e = 0; e < E; e++) x[e] = 0.0f;
        return;
    }
    const bf16 *p = row + lane * E;
    if constexpr (E == 4) {
        uint2 u = *reinterpret_cast<const uint2 *>(p);
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
        float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
        x[0] = a.x;
        x[1] = a.y;
        x[2] = b.x;
        x[3] = b.y;
    } else if constexpr (E == 2) {
        float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
        x[0] = a.x;
        x[1] = a.y;
    } else {
#pragma unroll
        for (int e = 0; e < E; e++) x[e] = __bfloat162float(p[e]);
    }
}

__device__ __forceinline__ float dec_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(LCU_FULL, v, o);
    return v;
}

template <int D>
__global__ void __launch_bounds__(LCU_DEC_WARPS * 32, 2)
    lcu_attn_decode_k(lcu_attn_p p, const bf16 *Q, const bf16 *K, const bf16 *V, bf16 *O, float *lse)
{
    constexpr int E = dec_geom<D>::E, W = LCU_DEC_WARPS;
    __shared__ float sm_m[W][DEC_TASKS], sm_l[W][DEC_TASKS], sm_o[W][DEC_TASKS][D];
    const int seq = blockIdx.x, kh = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int G = p.nq / p.nkv, q0 = p.q_start[seq], ql = p.q_start[seq + 1] - q0, kl = p.kv_len[seq];
    const long ks = p.kv_start[seq], qstride = (long)p.nq * D, kstride = (long)p.nkv * D;
    const int ntask = ql * G;
    for (int t0 = 0; t0 < ntask; t0 += DEC_TASKS) {
        const int nt = ntask - t0 < DEC_TASKS ? ntask - t0 : DEC_TASKS;
        float q[DEC_TASKS][E], o[DEC_TASKS][E], m[DEC_TASKS], l[DEC_TASKS];
        int lim[DEC_TASKS];
        int most = 0; /* the longest causal range of the chunk's rows */
#pragma unroll
        for (int t = 0; t < DEC_TASKS; t++) {
            m[t] = -INFINITY;
            l[t] = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++) o[t][e] = 0.0f;
            lim[t] = 0;
            if (t < nt) {
                int r = (t0 + t) / G, h = kh * G + (t0 + t) % G;
                dec_load<D>(q[t], Q + (q0 + r) * qstride + (long)h * D, lane);
                lim[t] = kl - ql + r + 1;
                most = lim[t] > most ? lim[t] : most;
            }
        }
        /* warp w takes keys w·KU .. w·KU + KU − 1, then W·KU further on, ...: its KU key and
         * value rows are loaded before any is used (2·KU loads in flight a warp, where one
         * key at a time left the loop waiting on each load's latency) */
        for (int j0 = warp * DEC_KU; j0 < most; j0 += W * DEC_KU) {
            float k[DEC_KU][E], v[DEC_KU][E];
#pragma unroll
            for (int u = 0; u < DEC_KU; u++) {
                if (j0 + u < most) {
                    dec_load<D>(k[u], K + (ks + j0 + u) * kstride + (long)kh * D, lane);
                    dec_load<D>(v[u], V + (ks + j0 + u) * kstride + (long)kh * D, lane);
                }
            }
#pragma unroll
            for (int u = 0; u < DEC_KU; u++)
#pragma unroll
                for (int t = 0; t < DEC_TASKS; t++) {
                    if (t >= nt || j0 + u >= lim[t]) continue; /* uniform across the warp */
                    float s = 0.0f;
#pragma unroll
                    for (int e = 0; e < E; e++) s = fmaf(q[t][e], k[u][e], s);
                    s = dec_warp_sum(s) * p.scale;
                    float mn = s > m[t] ? s : m[t], corr = __expf(m[t] - mn), pe = __expf(s - mn);
                    l[t] = l[t] * corr + pe;
#pragma unroll
                    for (int e = 0; e < E; e++) o[t][e] = fmaf(pe, v[u][e], o[t][e] * corr);
                    m[t] = mn;
                }
        }
        /* the warps' partials, merged in warp order by the block's threads */
#pragma unroll
        for (int t = 0; t < DEC_TASKS; t++) {
            if (t >= nt) continue;
            if (lane == 0) {
                sm_m[warp][t] = m[t];
                sm_l[warp][t] = l[t];
            }
            if (lane < dec_geom<D>::LANES) {
#pragma unroll
                for (int e = 0; e < E; e++) sm_o[warp][t][lane * E + e] = o[t][e];
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < nt * D; i += blockDim.x) {
            int t = i / D, c = i % D, r = (t0 + t) / G, h = kh * G + (t0 + t) % G;
            float M = -INFINITY;
            for (int w = 0; w < W; w++) M = sm_m[w][t] > M ? sm_m[w][t] : M;
            float L = 0.0f, acc = 0.0f;
            for (int w = 0; w < W; w++) {
                if (sm_m[w][t] == -INFINITY) continue; /* a warp that saw no key */
                float f = __expf(sm_m[w][t] - M);
                L = fmaf(sm_l[w][t], f, L);
                acc = fmaf(sm_o[w][t][c], f, acc);
            }
            O[(q0 + r) * qstride + (long)h * D + c] = __float2bfloat16_rn(acc / L);
            if (c == 0) lse[(long)(q0 + r) * p.nq + h] = M + logf(L);
        }
        __syncthreads(); /* the shared partials are rewritten by the next chunk */
    }
}

int lcu_attn_decode_fwd(const lcu_attn_desc *a, const lcu_bf16 *q, const lcu_bf16 *k, const lcu_bf16 *v,
                        lcu_bf16 *out, float *lse, cudaStream_t s)
{
    if (!a || a->nseq < 0 || a->total_q < 0 || a->nq <= 0 || a->nkv <= 0 || a->nq % a->nkv || a->nkv > 65535)
        return LCU_EINVAL;
    if (a->total_q == 0 || a->nseq == 0) return 0;
    if (!a->q_start || !a->kv_start || !a->kv_len || !q || !k || !v || !out || !lse) return LCU_EINVAL;
    lcu_attn_p p = {a->q_start, a->kv_start, a->kv_len, NULL, a->nseq, a->nq, a->nkv, a->scale, 0};
    dim3 grid((unsigned)a->nseq, (unsigned)a->nkv), block(LCU_DEC_WARPS * 32);
    const bf16 *Q = (const bf16 *)q, *K = (const bf16 *)k, *V = (const bf16 *)v;
    bf16 *O = (bf16 *)out;
    switch (a->d) {
    case 16: lcu_attn_decode_k<16><<<grid, block, 0, s>>>(p, Q, K, V, O, lse); break;
    case 32: lcu_attn_decode_k<32><<<grid, block, 0, s>>>(p, Q, K, V, O, lse); break;
    case 64: lcu_attn_decode_k<64><<<grid, block, 0, s>>>(p, Q, K, V, O, lse); break;
    case 128: lcu_attn_decode_k<128><<<grid, block, 0, s>>>(p, Q, K, V, O, lse); break;
    default: return LCU_EINVAL;
    }
    return lcu_launch_status();
}
