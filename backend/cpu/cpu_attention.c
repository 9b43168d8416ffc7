/* cpu_attention.c — blocked causal GQA attention, forward and backward (see the header).
 * Each block's scores are a small GEMM (BLOCK × context × d) on the calling thread; the
 * pool spreads blocks (forward) or kv-head groups (backward, which owns dK/dV of its group
 * and so needs no locking) over threads. */
#include "backend/cpu/cpu_attention.h"

#include "backend/cpu/cpu_gemm.h"
#include <math.h>
#include <string.h>

long cpu_attention_scratch(int max_len) { return 2L * CPU_ATTN_BLOCK * (max_len > 0 ? max_len : 1); }

typedef struct {
    const cpu_attn_shape *s;
    const float *q, *k, *v, *out, *lse, *dout;
    float *o, *lse_out, *dq, *dk, *dv;
    float *scratch;
    long per_thread;
} cpu_attn_job;

void cpu_attention_blocks(int nseq, const int *seq_start, int *blk_start)
{
    blk_start[0] = 0;
    for (int i = 0; i < nseq; i++) {
        int n = seq_start[i + 1] - seq_start[i];
        blk_start[i + 1] = blk_start[i] + (n + CPU_ATTN_BLOCK - 1) / CPU_ATTN_BLOCK;
    }
}

/* Which sequence a forward task belongs to: binary search in the cumulative counts. */
static int cpu_attn_find_seq(const int *cum, int nseq, int blk)
{
    int lo = 0, hi = nseq - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cum[mid] <= blk) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* S[r, j] = scale · q_r·k_j for the block's rows; then rows turned into probabilities
 * P = exp(S − lse) with j > i masked to 0. When lse_in is NULL the lse is computed here
 * (forward) and stored to lse_out. */
static void cpu_attn_probs(const cpu_attn_shape *s, const float *Q, const float *K, float *S, int rows, int ctx,
                           int i0, const float *lse_in, float *lse_out, int lse_stride)
{
    int qd = s->nq * s->d, kvd = s->nkv * s->d;
    cpu_gemm(false, true, rows, ctx, s->d, s->scale, Q, qd, K, kvd, 0.0f, S, ctx);
    for (int r = 0; r < rows; r++) {
        float *row = S + (long)r * ctx;
        int valid = i0 + r + 1; /* keys 0..i0+r */
        if (lse_in) {
            float l = lse_in[(long)r * lse_stride];
            for (int j = 0; j < valid; j++) row[j] = expf(row[j] - l);
        } else {
            float mx = row[0];
            for (int j = 1; j < valid; j++) mx = row[j] > mx ? row[j] : mx;
            double sum = 0;
            for (int j = 0; j < valid; j++) { row[j] = expf(row[j] - mx); sum += row[j]; }
            float inv = (float)(1.0 / sum);
            for (int j = 0; j < valid; j++) row[j] *= inv;
            lse_out[(long)r * lse_stride] = mx + (float)log(sum);
        }
        for (int j = valid; j < ctx; j++) row[j] = 0.0f;
    }
}

static void cpu_attn_fwd_task(void *va, int task, int thread)
{
    const cpu_attn_job *j = va;
    const cpu_attn_shape *s = j->s;
    int blk = task / s->nq, h = task % s->nq;
    int sq = cpu_attn_find_seq(s->blk_start, s->nseq, blk);
    int s0 = s->seq_start[sq], n = s->seq_start[sq + 1] - s0;
    int i0 = (blk - s->blk_start[sq]) * CPU_ATTN_BLOCK, i1 = i0 + CPU_ATTN_BLOCK < n ? i0 + CPU_ATTN_BLOCK : n;
    int rows = i1 - i0, ctx = i1, g = h / (s->nq / s->nkv), qd = s->nq * s->d, kvd = s->nkv * s->d;
    float *S = j->scratch + (long)thread * j->per_thread;
    const float *Q = j->q + (long)(s0 + i0) * qd + h * s->d;
    const float *K = j->k + (long)s0 * kvd + g * s->d, *V = j->v + (long)s0 * kvd + g * s->d;
    cpu_attn_probs(s, Q, K, S, rows, ctx, i0, NULL, j->lse_out + (long)(s0 + i0) * s->nq + h, s->nq);
    cpu_gemm(false, false, rows, s->d, ctx, 1.0f, S, ctx, V, kvd, 0.0f,
                j->o + (long)(s0 + i0) * qd + h * s->d, qd);
}

void cpu_attention_fwd(cpu_pool *p, const cpu_attn_shape *s, const float *q, const float *k, const float *v,
                       float *out, float *lse, float *scratch, long scratch_per_thread)
{
    cpu_attn_job j = {.s = s, .q = q, .k = k, .v = v, .o = out, .lse_out = lse, .scratch = scratch,
                      .per_thread = scratch_per_thread};
    cpu_pool_run(p, s->blk_start[s->nseq] * s->nq, cpu_attn_fwd_task, &j);
}

/* Backward for one (sequence, kv head) pair, over the query heads of its group:
 *   dV += Pᵀ dO;  dP = dO Vᵀ;  dS = P ⊙ (dP − rowsum(dO ⊙ O));  dQ = scale·dS K;  dK += scale·dSᵀ Q */
static void cpu_attn_bwd_task(void *va, int task, int thread)
{
    const cpu_attn_job *j = va;
    const cpu_attn_shape *s = j->s;
    int sq = task / s->nkv, g = task % s->nkv, group = s->nq / s->nkv;
    int s0 = s->seq_start[sq], n = s->seq_start[sq + 1] - s0, qd = s->nq * s->d, kvd = s->nkv * s->d, d = s->d;
    float *P = j->scratch + (long)thread * j->per_thread, *dP = P + (long)CPU_ATTN_BLOCK * n;
    const float *K = j->k + (long)s0 * kvd + g * d, *V = j->v + (long)s0 * kvd + g * d;
    float *dK = j->dk + (long)s0 * kvd + g * d, *dV = j->dv + (long)s0 * kvd + g * d;
    for (int t = 0; t < n; t++) {
        memset(dK + (long)t * kvd, 0, d * sizeof(float));
        memset(dV + (long)t * kvd, 0, d * sizeof(float));
    }
    for (int h = g * group; h < (g + 1) * group; h++) {
        for (int i0 = 0; i0 < n; i0 += CPU_ATTN_BLOCK) {
            int i1 = i0 + CPU_ATTN_BLOCK < n ? i0 + CPU_ATTN_BLOCK : n, rows = i1 - i0, ctx = i1;
            long roff = (long)(s0 + i0) * qd + h * d;
            const float *Q = j->q + roff, *O = j->out + roff, *dO = j->dout + roff;
            cpu_attn_probs(s, Q, K, P, rows, ctx, i0, j->lse + (long)(s0 + i0) * s->nq + h, NULL, s->nq);
            cpu_gemm(true, false, ctx, d, rows, 1.0f, P, ctx, dO, qd, 1.0f, dV, kvd);
            cpu_gemm(false, true, rows, ctx, d, 1.0f, dO, qd, V, kvd, 0.0f, dP, ctx);
            for (int r = 0; r < rows; r++) {
                const float *o = O + (long)r * qd, *dor = dO + (long)r * qd;
                double D = 0;
                for (int c = 0; c < d; c++) D += (double)dor[c] * o[c];
                float *pr = P + (long)r * ctx, *dpr = dP + (long)r * ctx;
                int valid = i0 + r + 1;
                for (int c = 0; c < valid; c++) dpr[c] = pr[c] * (dpr[c] - (float)D) * s->scale;
                for (int c = valid; c < ctx; c++) dpr[c] = 0.0f;
            }
            cpu_gemm(false, false, rows, d, ctx, 1.0f, dP, ctx, K, kvd, 0.0f,
                        j->dq + roff, qd);
            cpu_gemm(true, false, ctx, d, rows, 1.0f, dP, ctx, Q, qd, 1.0f, dK, kvd);
        }
    }
}

void cpu_attention_bwd(cpu_pool *p, const cpu_attn_shape *s, const float *q, const float *k, const float *v,
                       const float *out, const float *lse, const float *dout, float *dq, float *dk, float *dv,
                       float *scratch, long scratch_per_thread)
{
    cpu_attn_job j = {.s = s, .q = q, .k = k, .v = v, .out = out, .lse = lse, .dout = dout, .dq = dq, .dk = dk,
                      .dv = dv, .scratch = scratch, .per_thread = scratch_per_thread};
    cpu_pool_run(p, s->nseq * s->nkv, cpu_attn_bwd_task, &j);
}
