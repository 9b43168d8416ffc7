/* lcu_moe.cu — the per-token kernels of a sparse mixture-of-experts layer (Qwen3-MoE), the
 * twins of backend/cpu/cpu_moe.c's row loops: routing (softmax over the experts, the K most
 * likely, their weights), gathering a token's row into its experts' blocks, combining the
 * experts' outputs, and the backward of the combine and of the routing weights. The
 * experts' products themselves are grouped GEMMs (lcu_grouped_gemm, lcu_sgmv.cu) and the
 * grouping of the assignments is the host's (be_moe_group, backend/backend.c), as on the
 * CPU. Every output element is written by one thread in a fixed order (no atomics).
 */
#include "backend/cuda/lcu_common.cuh"

typedef __nv_bfloat16 bf16;

/* One thread per token: p = softmax(logits) in double (in place), then the K largest, a
 * strict > keeping the lower index of equal probabilities first (the CPU's rule), their
 * weights p (÷ Σ p_sel when norm). */
__global__ void lcu_moe_route_k(float *prob, long T, int E, int K, bool norm, int32_t *sel, float *w)
{
    for (long t = blockIdx.x * (long)blockDim.x + threadIdx.x; t < T; t += (long)gridDim.x * blockDim.x) {
        float *p = prob + t * E;
        double mx = p[0], sum = 0;
        for (int i = 1; i < E; i++) mx = fmax(mx, (double)p[i]);
        for (int i = 0; i < E; i++) sum += exp((double)p[i] - mx);
        for (int i = 0; i < E; i++) p[i] = (float)(exp((double)p[i] - mx) / sum);
        unsigned taken[32] = {0}; /* E ≤ 1024 */
        int32_t *s = sel + t * K;
        double tot = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int i = 0; i < E; i++)
                if (!(taken[i >> 5] >> (i & 31) & 1u) && (best < 0 || p[i] > p[best])) best = i;
            taken[best >> 5] |= 1u << (best & 31);
            s[k] = best;
            tot += p[best];
        }
        for (int k = 0; k < K; k++) w[t * K + k] = norm ? (float)(p[s[k]] / tot) : p[s[k]];
    }
}

int lcu_moe_route(float *prob, long T, int E, int K, bool norm, int32_t *sel, float *w, cudaStream_t s)
{
    if (T < 0 || E < 1 || E > 1024 || K < 1 || K > E) return LCU_EINVAL;
    if (T == 0) return 0;
    lcu_moe_route_k<<<lcu_blocks(T, 128), 128, 0, s>>>(prob, T, E, K, norm, sel, w);
    return lcu_launch_status();
}

/* ex[r] = x[a_tok[r]] for the n grouped rows (bf16 rows of H). */
__global__ void lcu_moe_gather_k(bf16 *ex, const bf16 *x, const int32_t *a_tok, long n, int H)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n * H; i += (long)gridDim.x * blockDim.x) {
        long r = i / H;
        ex[i] = x[(long)a_tok[r] * H + i % H];
    }
}

int lcu_moe_gather(lcu_bf16 *ex, const lcu_bf16 *x, const int32_t *a_tok, long n, int H, cudaStream_t s)
{
    if (n < 0 || H < 1) return LCU_EINVAL;
    if (n == 0) return 0;
    lcu_moe_gather_k<<<lcu_blocks(n * H, 256), 256, 0, s>>>((bf16 *)ex, (const bf16 *)x, a_tok, n, H);
    return lcu_launch_status();
}

/* out[t] = resid[t] + (w_0·y_0 + w_1·y_1 + ...), the sum in the order of sel as the CPU's
 * moe_combine_rows, then the residual (cpu_layer.c adds xmid after). */
__global__ void lcu_moe_combine_k(float *out, const float *resid, const float *ey, const int32_t *a_pos,
                                  const float *w, long T, int K, int H)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < T * H; i += (long)gridDim.x * blockDim.x) {
        long t = i / H, h = i % H;
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            float v = w[t * K + k] * ey[(long)a_pos[t * K + k] * H + h];
            acc = k ? acc + v : v;
        }
        out[i] = resid[i] + acc;
    }
}

int lcu_moe_combine(float *out, const float *resid, const float *ey, const int32_t *a_pos, const float *w, long T,
                    int K, int H, cudaStream_t s)
{
    if (T < 0 || K < 1 || H < 1) return LCU_EINVAL;
    if (T == 0) return 0;
    lcu_moe_combine_k<<<lcu_blocks(T * H, 256), 256, 0, s>>>(out, resid, ey, a_pos, w, T, K, H);
    return lcu_launch_status();
}

/* One block per token: dw_k = dout·y_k (in double, a fixed-order block sum), and the
 * expert's dL/dy = w_k·dout into edy (bf16, the next GEMM's input). */
__global__ void lcu_moe_dweights_k(float *dw, bf16 *edy, const float *dout, const float *ey, const int32_t *a_pos,
                                   const float *w, long T, int K, int H)
{
    __shared__ double scratch[32];
    for (long t = blockIdx.x; t < T; t += gridDim.x) {
        const float *d = dout + t * H;
        for (int k = 0; k < K; k++) {
            long row = (long)a_pos[t * K + k] * H;
            double acc = 0;
            for (int h = threadIdx.x; h < H; h += blockDim.x) acc += (double)d[h] * ey[row + h];
            acc = lcu_block_sum(acc, scratch);
            if (threadIdx.x == 0) dw[t * K + k] = (float)acc;
            float wk = w[t * K + k];
            for (int h = threadIdx.x; h < H; h += blockDim.x) edy[row + h] = __float2bfloat16_rn(wk * d[h]);
        }
    }
}

int lcu_moe_dweights(float *dw, lcu_bf16 *edy, const float *dout, const float *ey, const int32_t *a_pos,
                     const float *w, long T, int K, int H, cudaStream_t s)
{
    if (T < 0 || K < 1 || H < 1) return LCU_EINVAL;
    if (T == 0) return 0;
    lcu_moe_dweights_k<<<lcu_blocks(T, 1, 65535L * 8), 128, 0, s>>>(dw, (bf16 *)edy, dout, ey, a_pos, w, T, K, H);
    return lcu_launch_status();
}

/* One block per token: dxn[t] = Σ_k edx[a_pos(t, k)] (in the order of sel), and the
 * router's dL/dlogits (bf16, for the router GEMM that adds its share to dxn):
 *   norm: dp_k = (dw_k − Σ_i dw_i w_i) / S, S = Σ p_sel; else dp_k = dw_k;
 *   dlogit_e = p_e (dp_e − Σ_k p_sel_k dp_k), dp zero off the chosen experts. */
__global__ void lcu_moe_dinput_k(float *dxn, bf16 *dlogits, const float *edx, const int32_t *a_pos, const float *prob,
                                 const int32_t *sel, const float *w, const float *dw, long T, int K, int E, int H,
                                 bool norm)
{
    __shared__ double s_q, s_dp[64]; /* K ≤ 64 */
    for (long t = blockIdx.x; t < T; t += gridDim.x) {
        for (int h = threadIdx.x; h < H; h += blockDim.x) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) {
                float v = edx[(long)a_pos[t * K + k] * H + h];
                acc = k ? acc + v : v;
            }
            dxn[t * H + h] = acc;
        }
        const float *p = prob + t * E;
        const int32_t *s = sel + t * K;
        if (threadIdx.x == 0) {
            double S = 0, dot = 0, q = 0;
            for (int k = 0; k < K; k++) {
                S += p[s[k]];
                dot += (double)dw[t * K + k] * w[t * K + k];
            }
            for (int k = 0; k < K; k++) {
                s_dp[k] = norm ? (dw[t * K + k] - dot) / S : (double)dw[t * K + k];
                q += p[s[k]] * s_dp[k];
            }
            s_q = q;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            double dp = 0;
            for (int k = 0; k < K; k++)
                if (s[k] == e) dp = s_dp[k];
            dlogits[t * E + e] = __float2bfloat16_rn((float)(p[e] * (dp - s_q)));
        }
        __syncthreads(); /* s_q, s_dp are rewritten for the next token */
    }
}

int lcu_moe_dinput(float *dxn, lcu_bf16 *dlogits, const float *edx, const int32_t *a_pos, const float *prob,
                   const int32_t *sel, const float *w, const float *dw, long T, int K, int E, int H, bool norm,
                   cudaStream_t s)
{
    if (T < 0 || K < 1 || K > 64 || E < K || H < 1) return LCU_EINVAL;
    if (T == 0) return 0;
    lcu_moe_dinput_k<<<lcu_blocks(T, 1, 65535L * 8), 128, 0, s>>>(dxn, (bf16 *)dlogits, edx, a_pos, prob, sel, w, dw,
                                                                   T, K, E, H, norm);
    return lcu_launch_status();
}
