/* cuda_head.c — the output head: logits chunk by chunk (never [T, V]), then the kernel
 * layer's per-row log-softmax, losses of backend/loss.h, dℓ/dlogits and top-k
 * (lcu_head_loss, lcu_head_topk), and the head's gradients: the CPU backend's cpu_head.c
 * with bf16 GEMM inputs. */
#include "backend/cuda/cuda_head.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_layer.h"

#include <stdlib.h>

int cu_head_rows(long V)
{
    const char *e = getenv("LOOM_CUDA_HEAD_MB");
    long mb = e && atol(e) > 0 ? atol(e) : 512;
    long rows = (mb << 20) / (V * (long)(sizeof(float) + sizeof(lcu_bf16)));
    rows = rows / 8 * 8; /* keeps chunk offsets of bf16 rows 16-byte aligned */
    return (int)(rows < 8 ? 8 : rows > 4096 ? 4096 : rows);
}

int cu_head_logits(cu_ctx *c, const lcu_bf16 *xf, long c0, int n)
{
    int V = c->cfg.vocab_size, H = c->cfg.hidden_size;
    lcu_gemm_args g = {false, true, n, V, H, 1.0f, 0.0f, xf + c0 * H, H, c->w.lm_head, H, NULL, 0, c->logits, V,
                       LCU_F32};
    CU_TRY(c, lcu_gemm(c->lcu, &g, c->stream));
    int k = cu_lora_segs(c, -1, 0, c0, c0 + n, false);
    if (k)
        CU_TRY(c, lcu_lora_fwd(c->lcu, c->lsegs, k, H, V, xf + c0 * H, H, c->logits, V, c->a.z, CU_LDZ, c->stream));
    return 0;
}

/* Sampling's prompt-pass extras of the chunk's rows c0..c0+n (whose logits are in c->logits
 * and whose lse the loss kernel has written): the rows of sequences that ask for them come
 * to the host with their lse, in blocks of at most 64 MiB, and be_prompt_extras
 * (sample_pick.c) answers them there with the CPU backend's arithmetic, so that the same
 * logits give the same draws on both. Correct first, like sampling's top_logprobs
 * (cuda_sample.c): these outputs are asked for rarely; a device kernel is speed work. */
static int cu_head_extras(cu_ctx *c, const be_seq *seqs, long c0, int n)
{
    const cu_meta_layout *m = &c->ml;
    const int32_t *row_seq = cu_meta_host(c, m->row_seq), *pos = cu_meta_host(c, m->pos);
    const double *d_lse = cu_meta_dev(c, m->lse);
    long V = c->cfg.vocab_size, cap = (64L << 20) / (V * (long)sizeof(float));
    if (cap < 1) cap = 1;
    if (cap > n) cap = n;
    float *z = NULL;
    double *lse = NULL;
    int rc = -1;
    for (long b = c0; b < c0 + n;) {
        if (!be_seq_has_extras(&seqs[c->seq_index[row_seq[b]]])) { b++; continue; }
        long e = b + 1;
        while (e < c0 + n && e - b < cap && be_seq_has_extras(&seqs[c->seq_index[row_seq[e]]])) e++;
        if (!z && (!(z = malloc((size_t)cap * V * sizeof *z)) || !(lse = malloc((size_t)cap * sizeof *lse)))) {
            cu_where(c, "prompt logprob extras: out of host memory");
            goto out;
        }
        cu_where(c, "prompt logprob extras, rows %ld..%ld", b, e);
        if (cu_check(c, (int)cudaMemcpyAsync(z, c->logits + (size_t)(b - c0) * V, (size_t)(e - b) * V * sizeof *z,
                                             cudaMemcpyDeviceToHost, c->stream), "cudaMemcpyAsync", __FILE__, __LINE__) != 0 ||
            cu_check(c, (int)cudaMemcpyAsync(lse, d_lse + b, (size_t)(e - b) * sizeof *lse, cudaMemcpyDeviceToHost,
                                             c->stream), "cudaMemcpyAsync", __FILE__, __LINE__) != 0 ||
            cu_sync(c) < 0)
            goto out;
        for (long r = b; r < e; r++)
            be_prompt_extras(&seqs[c->seq_index[row_seq[r]]], pos[r], z + (size_t)(r - b) * V, V, lse[r - b]);
        b = e;
    }
    rc = 0;
out:
    free(z);
    free(lse);
    return rc;
}

int cu_head(cu_ctx *c, long T, const lcu_bf16 *xf, bool any_grad, bool topk, const be_seq *extras, float *dxf)
{
    const cu_meta_layout *m = &c->ml;
    int V = c->cfg.vocab_size, H = c->cfg.hidden_size;
    lcu_head_batch hb = {cu_meta_dev(c, m->row_seq), cu_meta_dev(c, m->loss_seqs), cu_meta_dev(c, m->tgt_start),
                         cu_meta_dev(c, m->targets), cu_meta_dev(c, m->weights), cu_meta_dev(c, m->sampler_lp),
                         cu_meta_dev(c, m->adv), cu_meta_dev(c, m->lp), cu_meta_dev(c, m->loss),
                         cu_meta_dev(c, m->lse)};
    for (long c0 = 0; c0 < T; c0 += c->head_rows) {
        int n = (int)(T - c0 < c->head_rows ? T - c0 : c->head_rows);
        cu_where(c, "head rows %ld..%ld", c0, c0 + n);
        if (cu_head_logits(c, xf, c0, n) < 0) return -1;
        CU_TRY(c, lcu_head_loss(c->logits, V, c0, n, V, &hb, any_grad ? c->dlogits : NULL, V, c->stream));
        if (topk)
            CU_TRY(c, lcu_head_topk(c->logits, V, c0, n, V, cu_meta_dev(c, m->topk_start), cu_meta_dev(c, m->lse),
                                    cu_meta_dev(c, m->topk_ids), cu_meta_dev(c, m->topk_lp), c->stream));
        if (extras && cu_head_extras(c, extras, c0, n) < 0) return -1;
        if (!any_grad) continue;
        if (dxf) {
            lcu_gemm_args g = {false, false, n, H, V, 1.0f, 0.0f, c->dlogits, V, c->w.lm_head, H, NULL, 0,
                               dxf + c0 * H, H, LCU_F32};
            CU_TRY(c, lcu_gemm(c->lcu, &g, c->stream));
        }
        int k = cu_lora_segs(c, -1, 0, c0, c0 + n, true);
        if (k)
            CU_TRY(c, lcu_lora_bwd(c->lcu, c->lsegs, k, H, V, xf + c0 * H, H, c->dlogits, V, dxf ? dxf + c0 * H : NULL,
                                   H, c->a.z, c->a.dz, CU_LDZ, c->stream));
    }
    return 0;
}
