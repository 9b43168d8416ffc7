/* cpu_buffers.c — the CPU context's buffers: growing them for a batch (cpu_reserve),
 * packing sequences into rows and LoRA segments (cpu_pack), freeing them. */
#include "backend/cpu/cpu_buffers.h"
#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int cpu_alloc(void *pp, size_t bytes)
{
    void **p = pp;
    free(*p);
    *p = NULL;
    if (posix_memalign(p, 64, bytes ? bytes : 64) != 0) { *p = NULL; return -1; }
    return 0;
}

static void cb_free_rows(cpu_ctx *c)
{
    float **fl[] = {&c->x, &c->xn1, &c->xn2, &c->xmid, &c->tmp, &c->q_pre, &c->q, &c->att, &c->datt, &c->dq,
                    &c->k_pre, &c->k, &c->v, &c->dk, &c->dv, &c->g, &c->u, &c->h, &c->dg, &c->du, &c->dh,
                    &c->dx, &c->dxn, &c->rstd1, &c->rstd2, &c->rstd_f, &c->rstd_q, &c->rstd_k, &c->lse,
                    &c->saved, &c->z, &c->dz};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) { free(*fl[i]); *fl[i] = NULL; }
    free(c->tokens); free(c->pos); free(c->row_seq);
    c->tokens = c->pos = NULL;
    c->row_seq = NULL;
    cpu_moe_free(c);
}

/* Makes every buffer large enough for T rows, sequences up to max_len, LoRA rank up to
 * max_rank, and (need_saved) the per-layer inputs. Grows by 1.5× so that a slowly
 * growing workload does not reallocate every call. */
int cpu_reserve(cpu_ctx *c, long T, int max_len, int max_rank, bool need_saved)
{
    const model_config *mc = &c->m->cfg;
    long H = mc->hidden_size, Im = mc->intermediate_size, qd = (long)mc->num_attention_heads * mc->head_dim,
         kvd = (long)mc->num_key_value_heads * mc->head_dim, nq = mc->num_attention_heads,
         nkv = mc->num_key_value_heads, L = mc->num_hidden_layers;
    int rc = 0;
    bool rows_grew = false;
    if (T > c->cap_T) {
        long cap = c->cap_T * 3 / 2 > T ? c->cap_T * 3 / 2 : T;
        if (cap < 64) cap = 64;
        cb_free_rows(c);
        c->cap_T = cap;
        c->cap_saved = false;
        c->cap_rank = 0;
        rows_grew = true;
        size_t f = sizeof(float);
        float **h_bufs[] = {&c->x, &c->xn1, &c->xn2, &c->xmid, &c->tmp, &c->dx, &c->dxn};
        float **q_bufs[] = {&c->q_pre, &c->q, &c->att, &c->datt, &c->dq};
        float **kv_bufs[] = {&c->k_pre, &c->k, &c->v, &c->dk, &c->dv};
        float **i_bufs[] = {&c->g, &c->u, &c->h, &c->dg, &c->du, &c->dh};
        for (int i = 0; i < 7; i++) rc |= cpu_alloc(h_bufs[i], cap * H * f);
        for (int i = 0; i < 5; i++) rc |= cpu_alloc(q_bufs[i], cap * qd * f);
        for (int i = 0; i < 5; i++) rc |= cpu_alloc(kv_bufs[i], cap * kvd * f);
        for (int i = 0; i < 6; i++) rc |= cpu_alloc(i_bufs[i], cap * Im * f);
        rc |= cpu_alloc(&c->rstd1, cap * f) | cpu_alloc(&c->rstd2, cap * f) | cpu_alloc(&c->rstd_f, cap * f);
        rc |= cpu_alloc(&c->rstd_q, cap * nq * f) | cpu_alloc(&c->rstd_k, cap * nkv * f) | cpu_alloc(&c->lse, cap * nq * f);
        rc |= cpu_alloc(&c->tokens, cap * sizeof(int32_t));
        rc |= cpu_alloc(&c->pos, cap * sizeof(int32_t)) | cpu_alloc(&c->row_seq, cap * sizeof(int));
        if (rc) { cb_free_rows(c); c->cap_T = 0; return -1; }
    }
    if (need_saved && !c->cap_saved) {
        if (cpu_alloc(&c->saved, (size_t)L * c->cap_T * H * sizeof(float)) != 0) return -1;
        c->cap_saved = true;
    }
    if (max_rank > c->cap_rank || rows_grew || c->cap_rank == 0) { /* 0: none yet, or a failed try */
        int r = max_rank > c->cap_rank ? max_rank : c->cap_rank;
        if (r < 1) r = 1;
        if (cpu_alloc(&c->z, (size_t)c->cap_T * r * sizeof(float)) | cpu_alloc(&c->dz, (size_t)c->cap_T * r * sizeof(float)) ||
            cpu_moe_reserve(c, c->cap_T, r) != 0) {
            c->cap_rank = 0;
            return -1;
        }
        c->cap_rank = r;
    }
    if (max_len > c->cap_len) {
        int cap = c->cap_len * 3 / 2 > max_len ? c->cap_len * 3 / 2 : max_len;
        if (cap < 64) cap = 64;
        int half = mc->head_dim / 2;
        double *inv = malloc(half * sizeof *inv);
        c->attn_per_thread = cpu_attention_scratch(cap);
        if (!inv || cpu_alloc(&c->rope_cos, (size_t)cap * half * sizeof(float)) ||
            cpu_alloc(&c->rope_sin, (size_t)cap * half * sizeof(float)) ||
            cpu_alloc(&c->attn_scratch, (size_t)cpu_pool_size(c->pool) * c->attn_per_thread * sizeof(float))) {
            free(inv);
            c->cap_len = 0;
            return -1;
        }
        /* Angles in double: pos·θ reaches 10⁴–10⁵ rad, where fp32 would lose ~1e-3 rad. */
        model_rope_inv_freq(mc, inv);
        for (int pos = 0; pos < cap; pos++)
            for (int i = 0; i < half; i++) {
                double a = pos * inv[i];
                c->rope_cos[(long)pos * half + i] = (float)cos(a);
                c->rope_sin[(long)pos * half + i] = (float)sin(a);
            }
        free(inv);
        c->cap_len = cap;
    }
    return 0;
}

/* Per-sequence bookkeeping arrays for nseq sequences (grown, never shrunk). */
int cpu_reserve_seqs(cpu_ctx *c, int nseq)
{
    if (nseq + 1 > c->cap_seqs) {
        int cap = nseq + 1 > 2 * c->cap_seqs ? nseq + 1 : 2 * c->cap_seqs;
        free(c->seq_start); free(c->blk_start); free(c->seq_index); free(c->segs);
        c->seq_start = malloc(cap * sizeof *c->seq_start);
        c->blk_start = malloc(cap * sizeof *c->blk_start);
        c->seq_index = malloc(cap * sizeof *c->seq_index);
        c->segs = malloc(cap * sizeof *c->segs);
        c->cap_seqs = (c->seq_start && c->blk_start && c->seq_index && c->segs) ? cap : 0;
        if (!c->cap_seqs) return -1;
    }
    return 0;
}

/* Packs the non-empty sequences back to back (tokens, positions, row → sequence) and
 * builds the LoRA segments: runs of consecutive sequences of one adapter and group. */
int cpu_pack(cpu_ctx *c, const be_seq *seqs, int nseq, bool any_grad)
{
    if (cpu_reserve_seqs(c, nseq) != 0) return -1;
    int np = 0, row = 0;
    c->nsegs = 0;
    for (int i = 0; i < nseq; i++) {
        const be_seq *s = &seqs[i];
        if (s->n == 0) continue;
        c->seq_index[np] = i;
        c->seq_start[np] = row;
        for (int t = 0; t < s->n; t++) {
            c->tokens[row + t] = s->tokens[t];
            c->pos[row + t] = t;
            c->row_seq[row + t] = i;
        }
        const cpu_adapter *ad = s->ad ? cpu_adapter_of(s->ad) : NULL;
        bool grad = any_grad && ad && ad->pub.trainable && !s->forward_only;
        cpu_segment *last = c->nsegs ? &c->segs[c->nsegs - 1] : NULL;
        /* One segment per operation (group): its gradient is one reduction over its own
         * rows, the same however the cycle packed it (backend.h, be_seq.group). */
        if (ad && last && last->ad == ad && last->grad == grad && last->group == s->group && last->row_end == row) {
            last->row_end = row + s->n;
        } else if (ad) {
            c->segs[c->nsegs++] = (cpu_segment){ad, row, row + s->n, grad, s->group};
        }
        row += s->n;
        np++;
    }
    c->seq_start[np] = row;
    c->nseq_packed = np;
    cpu_attention_blocks(np, c->seq_start, c->blk_start);
    return 0;
}

void cpu_buffers_free(cpu_ctx *c)
{
    cb_free_rows(c);
    free(c->rope_cos);
    free(c->rope_sin);
    free(c->attn_scratch);
    free(c->logits);
    free(c->kv_mem);
    free(c->kv_stream0);
    free(c->kv_nstream);
    free(c->sample_scratch);
    free(c->seq_start);
    free(c->blk_start);
    free(c->seq_index);
    free(c->segs);
}
