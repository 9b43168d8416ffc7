/* attn_ref.h — causal GQA self-attention over packed sequences in fp64 on the host: the
 * reference the attention tests hold the device kernels to. Layouts as cuda_ops.h's
 * lcu_attn_*: q, out [rows, nq·d]; k, v [rows, nkv·d]; lse [rows, nq]; sequence i is rows
 * q_start[i] .. q_start[i+1]; query head h reads kv head h / (nq / nkv); scale 1/√d. */
#ifndef LOOM_TESTS_GPU_ATTN_REF_H
#define LOOM_TESTS_GPU_ATTN_REF_H

typedef struct {
    int nseq;
    const int *q_start; /* [nseq + 1], q_start[0] = 0 */
    int nq, nkv, d;
} attn_ref_shape;

/* out and lse (natural log of Σ exp(scale·q·k)) for every row and query head. */
void attn_ref_fwd(const attn_ref_shape *s, const float *q, const float *k, const float *v, double *out, double *lse);

/* dq, dk, dv (overwritten) of L = Σ dout ⊙ out. */
void attn_ref_bwd(const attn_ref_shape *s, const float *q, const float *k, const float *v, const float *dout,
                  double *dq, double *dk, double *dv);

/* attn_ref_bwd against central differences of attn_ref_fwd (L = Σ c ⊙ out) on a tiny packed
 * GQA batch with fixed pseudo-random inputs: the largest error, relative to max(1, |grad|)
 * (below 1e-5 when the two agree). */
double attn_ref_fd_check(void);

#endif
