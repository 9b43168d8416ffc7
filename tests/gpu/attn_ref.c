/* attn_ref.c — the fp64 attention reference (attn_ref.h). Row by row: the scores of one
 * query against the keys it sees, their softmax, then the products; the backward recomputes
 * the forward and uses Δ_i = Σ dout_i ⊙ out_i (dS = P ⊙ (dP − Δ)). */
#include "tests/gpu/attn_ref.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* p[0..n) = softmax of query row qi (head h) against the keys k0.. of its kv head g;
 * returns the log-sum-exp of the scaled scores. */
static double ar_probs(const attn_ref_shape *s, const float *qi, const float *k, long k0, int g, int n, double *p)
{
    int d = s->d;
    long kvd = (long)s->nkv * d;
    double scale = 1.0 / sqrt((double)d), mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++) {
        const float *kj = k + (k0 + j) * kvd + (long)g * d;
        double dot = 0;
        for (int c = 0; c < d; c++) dot += (double)qi[c] * kj[c];
        p[j] = dot * scale;
        mx = fmax(mx, p[j]);
    }
    for (int j = 0; j < n; j++) sum += p[j] = exp(p[j] - mx);
    for (int j = 0; j < n; j++) p[j] /= sum;
    return mx + log(sum);
}

static int ar_longest(const attn_ref_shape *s)
{
    int m = 1;
    for (int i = 0; i < s->nseq; i++)
        if (s->q_start[i + 1] - s->q_start[i] > m) m = s->q_start[i + 1] - s->q_start[i];
    return m;
}

void attn_ref_fwd(const attn_ref_shape *s, const float *q, const float *k, const float *v, double *out, double *lse)
{
    int d = s->d, grp = s->nq / s->nkv;
    long qd = (long)s->nq * d, kvd = (long)s->nkv * d;
    double *p = malloc(sizeof(double) * ar_longest(s));
    for (int i = 0; i < s->nseq; i++) {
        long r0 = s->q_start[i];
        int n = s->q_start[i + 1] - s->q_start[i];
        for (int h = 0; h < s->nq; h++)
            for (int t = 0; t < n; t++) {
                long row = r0 + t;
                lse[row * s->nq + h] = ar_probs(s, q + row * qd + (long)h * d, k, r0, h / grp, t + 1, p);
                double *o = out + row * qd + (long)h * d;
                memset(o, 0, sizeof(double) * d);
                for (int j = 0; j <= t; j++) {
                    const float *vj = v + (r0 + j) * kvd + (long)(h / grp) * d;
                    for (int c = 0; c < d; c++) o[c] += p[j] * vj[c];
                }
            }
    }
    free(p);
}

double attn_ref_fd_check(void)
{
    int qs[3] = {0, 3, 8};
    attn_ref_shape s = {2, qs, 4, 2, 4}; /* sequences of 3 and 5 rows, 2 query heads per kv head */
    enum { T = 8, QD = 16, KVD = 8 };
    float q[T * QD], k[T * KVD], v[T * KVD], c[T * QD];
    float *x[4] = {q, k, v, c};
    int n[4] = {T * QD, T * KVD, T * KVD, T * QD};
    uint32_t r = 12345;
    for (int b = 0; b < 4; b++)
        for (int i = 0; i < n[b]; i++) {
            r = r * 1664525u + 1013904223u;
            x[b][i] = (float)((r >> 8) / 8388608.0 - 1.0); /* uniform in [-1, 1) */
        }
    double gq[T * QD], gk[T * KVD], gv[T * KVD], o[T * QD], l[T * 4], worst = 0;
    double *grad[3] = {gq, gk, gv};
    attn_ref_bwd(&s, q, k, v, c, gq, gk, gv);
    for (int b = 0; b < 3; b++)
        for (int i = 0; i < n[b]; i++) {
            float x0 = x[b][i];
            double L[2];
            for (int sg = 0; sg < 2; sg++) {
                x[b][i] = x0 + (sg ? -1e-3f : 1e-3f);
                attn_ref_fwd(&s, q, k, v, o, l);
                L[sg] = 0;
                for (int t = 0; t < T * QD; t++) L[sg] += c[t] * o[t];
            }
            double h = (double)(x0 + 1e-3f) - (double)(x0 - 1e-3f);
            x[b][i] = x0;
            worst = fmax(worst, fabs((L[0] - L[1]) / h - grad[b][i]) / fmax(1.0, fabs(grad[b][i])));
        }
    return worst;
}

void attn_ref_bwd(const attn_ref_shape *s, const float *q, const float *k, const float *v, const float *dout,
                  double *dq, double *dk, double *dv)
{
    int d = s->d, grp = s->nq / s->nkv;
    long qd = (long)s->nq * d, kvd = (long)s->nkv * d, T = s->q_start[s->nseq];
    double scale = 1.0 / sqrt((double)d);
    double *out = malloc(sizeof(double) * T * qd), *lse = malloc(sizeof(double) * T * s->nq);
    double *p = malloc(sizeof(double) * ar_longest(s));
    attn_ref_fwd(s, q, k, v, out, lse);
    memset(dq, 0, sizeof(double) * T * qd);
    memset(dk, 0, sizeof(double) * T * kvd);
    memset(dv, 0, sizeof(double) * T * kvd);
    for (int i = 0; i < s->nseq; i++) {
        long r0 = s->q_start[i];
        int n = s->q_start[i + 1] - s->q_start[i];
        for (int h = 0; h < s->nq; h++)
            for (int t = 0; t < n; t++) {
                long row = r0 + t, g = h / grp;
                const float *qi = q + row * qd + h * d, *gi = dout + row * qd + h * d;
                ar_probs(s, qi, k, r0, (int)g, t + 1, p);
                double delta = 0;
                for (int c = 0; c < d; c++) delta += (double)gi[c] * out[row * qd + h * d + c];
                for (int j = 0; j <= t; j++) {
                    long kj = (r0 + j) * kvd + g * d;
                    double dp = 0;
                    for (int c = 0; c < d; c++) dp += (double)gi[c] * v[kj + c];
                    double ds = p[j] * (dp - delta) * scale;
                    for (int c = 0; c < d; c++) {
                        dv[kj + c] += p[j] * gi[c];
                        dk[kj + c] += ds * qi[c];
                        dq[row * qd + h * d + c] += ds * k[kj + c];
                    }
                }
            }
    }
    free(out);
    free(lse);
    free(p);
}
