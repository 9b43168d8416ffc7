/* cpu_backend.c — the CPU executor backend (exe_backend_cpu): buffers, the packed
 * forward/backward driver, the output head with the losses, and the AdamW step.
 * Plain C + OpenBLAS; the reference that the CUDA backend is compared against.
 *
 * Threads: the context's pool owns the cores. OpenBLAS is set to one thread so that its
 * own pool does not fight ours; cpu_sgemm splits big GEMMs across the pool instead.
 * A context is used by one caller at a time.
 */
#include "backend/adamw.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/loss.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void cb_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Logits are produced for this many floats' worth of rows at a time (64 MB), never [T, V]. */
#define CPU_HEAD_FLOATS (16L << 20)

/* ---- buffers ------------------------------------------------------------------------- */

static int cb_alloc(void *pp, size_t bytes)
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
        for (int i = 0; i < 7; i++) rc |= cb_alloc(h_bufs[i], cap * H * f);
        for (int i = 0; i < 5; i++) rc |= cb_alloc(q_bufs[i], cap * qd * f);
        for (int i = 0; i < 5; i++) rc |= cb_alloc(kv_bufs[i], cap * kvd * f);
        for (int i = 0; i < 6; i++) rc |= cb_alloc(i_bufs[i], cap * Im * f);
        rc |= cb_alloc(&c->rstd1, cap * f) | cb_alloc(&c->rstd2, cap * f) | cb_alloc(&c->rstd_f, cap * f);
        rc |= cb_alloc(&c->rstd_q, cap * nq * f) | cb_alloc(&c->rstd_k, cap * nkv * f) | cb_alloc(&c->lse, cap * nq * f);
        rc |= cb_alloc(&c->tokens, cap * sizeof(int32_t));
        rc |= cb_alloc(&c->pos, cap * sizeof(int32_t)) | cb_alloc(&c->row_seq, cap * sizeof(int));
        if (rc) { cb_free_rows(c); c->cap_T = 0; return -1; }
    }
    if (need_saved && !c->cap_saved) {
        if (cb_alloc(&c->saved, (size_t)L * c->cap_T * H * sizeof(float)) != 0) return -1;
        c->cap_saved = true;
    }
    if (max_rank > c->cap_rank || rows_grew) {
        int r = max_rank > c->cap_rank ? max_rank : c->cap_rank;
        if (r < 1) r = 1;
        if (cb_alloc(&c->z, (size_t)c->cap_T * r * sizeof(float)) | cb_alloc(&c->dz, (size_t)c->cap_T * r * sizeof(float))) {
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
        if (!inv || cb_alloc(&c->rope_cos, (size_t)cap * half * sizeof(float)) ||
            cb_alloc(&c->rope_sin, (size_t)cap * half * sizeof(float)) ||
            cb_alloc(&c->attn_scratch, (size_t)cpu_pool_size(c->pool) * c->attn_per_thread * sizeof(float))) {
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

static void *cpu_create(const base_model *m, int threads, char *err, size_t errlen)
{
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    openblas_set_num_threads(1);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) { cb_err(err, errlen, "cpu: out of memory"); return NULL; }
    c->m = m;
    c->pool = cpu_pool_create(threads);
    long V = m->cfg.vocab_size;
    c->head_rows = (int)(CPU_HEAD_FLOATS / V > 256 ? 256 : CPU_HEAD_FLOATS / V < 1 ? 1 : CPU_HEAD_FLOATS / V);
    if (!c->pool || cb_alloc(&c->logits, (size_t)c->head_rows * V * sizeof(float))) {
        cb_err(err, errlen, "cpu: out of memory");
        cpu_pool_destroy(c->pool);
        free(c);
        return NULL;
    }
    return c;
}

static void cpu_destroy(void *ctx)
{
    cpu_ctx *c = ctx;
    if (!c) return;
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
    cpu_pool_destroy(c->pool);
    free(c);
}

/* ---- validation and packing ---------------------------------------------------------- */

static int cb_validate(const cpu_ctx *c, const exe_seq *seqs, int nseq, char *err, size_t errlen)
{
    char why[256];
    for (int i = 0; i < nseq; i++)
        if (exe_seq_check(c->m, &seqs[i], why, sizeof why) != 0) {
            cb_err(err, errlen, "sequence %d: %s", i, why);
            return -1;
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
 * builds the LoRA segments: runs of consecutive sequences with one adapter. */
int cpu_pack(cpu_ctx *c, const exe_seq *seqs, int nseq, bool any_grad)
{
    if (cpu_reserve_seqs(c, nseq) != 0) return -1;
    int np = 0, row = 0;
    c->nsegs = 0;
    for (int i = 0; i < nseq; i++) {
        const exe_seq *s = &seqs[i];
        if (s->n == 0) continue;
        c->seq_index[np] = i;
        c->seq_start[np] = row;
        for (int t = 0; t < s->n; t++) {
            c->tokens[row + t] = s->tokens[t];
            c->pos[row + t] = t;
            c->row_seq[row + t] = i;
        }
        bool grad = any_grad && s->ad && !s->forward_only;
        cpu_segment *last = c->nsegs ? &c->segs[c->nsegs - 1] : NULL;
        if (s->ad && last && last->ad == s->ad && last->grad == grad && last->row_end == row) {
            last->row_end = row + s->n;
        } else if (s->ad) {
            c->segs[c->nsegs++] = (cpu_segment){s->ad, row, row + s->n, grad};
        }
        row += s->n;
        np++;
    }
    c->seq_start[np] = row;
    c->nseq_packed = np;
    cpu_attention_blocks(np, c->seq_start, c->blk_start);
    return 0;
}

/* ---- output head and losses ---------------------------------------------------------- */

typedef struct {
    cpu_ctx *c;
    exe_seq *seqs;
    long c0;
    bool any_grad;
} cb_head_job;

/* The k largest logits of z, best first (ties: lower id first), as log-probs z − lse:
 * insertion into a sorted list of k, which most logits fail to enter after the first few. */
static void cb_topk(const float *z, long V, int k, double lse, int32_t *ids, float *lp)
{
    int n = 0;
    for (long v = 0; v < V; v++) {
        if (n == k && z[v] <= z[ids[k - 1]]) continue;
        int i = n < k ? n++ : k - 1;
        while (i > 0 && z[ids[i - 1]] < z[v]) { ids[i] = ids[i - 1]; i--; }
        ids[i] = (int32_t)v;
    }
    for (int i = 0; i < k; i++) lp[i] = (float)((double)z[ids[i]] - lse);
}

/* One row of logits → log-softmax → lp, loss, dℓ/dlp for each of the row's targets; when
 * gradients are wanted the row is overwritten with
 *   dℓ/dlogits = Σ_j dℓ/dlp_j · (onehot(t_j) − softmax). */
static void cb_head_rows(void *va, long b, long e, int thread)
{
    (void)thread;
    const cb_head_job *j = va;
    cpu_ctx *c = j->c;
    long V = c->m->cfg.vocab_size;
    for (long i = b; i < e; i++) {
        long t = j->c0 + i;
        const exe_seq *s = &j->seqs[c->row_seq[t]];
        int pos = c->pos[t], K = s->k > 1 ? s->k : 1;
        const int32_t *tg = s->targets + (long)pos * K;
        float *z = c->logits + i * V;
        float mx = z[0];
        for (long v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        double sum = 0;
        for (long v = 0; v < V; v++) sum += expf(z[v] - mx);
        double lse = (double)mx + log(sum), loss = 0, dsum = 0;
        float dlp0 = 0;
        for (int k = 0; k < K; k++) {
            long q = (long)pos * K + k;
            float lp = (float)((double)z[tg[k]] - lse);
            float w = s->weights ? s->weights[q] : 1.0f;
            float sq = s->sampler_logprobs ? s->sampler_logprobs[pos] : 0.0f, adv = s->advantages ? s->advantages[pos] : 0.0f;
            float l, dlp;
            loss_token(&s->loss, lp, w, sq, adv, &l, &dlp);
            if (s->logprobs_out) s->logprobs_out[q] = lp;
            loss += l;
            dsum += dlp;
            if (k == 0) dlp0 = dlp;
        }
        if (s->loss_out) s->loss_out[pos] = (float)loss;
        if (s->topk > 0) cb_topk(z, V, s->topk, lse, s->topk_ids_out + (long)pos * s->topk, s->topk_lp_out + (long)pos * s->topk);
        if (!j->any_grad) continue;
        if (!s->ad || s->forward_only || (K == 1 && dlp0 == 0.0f)) { /* zero rows keep the GEMMs exact */
            memset(z, 0, V * sizeof(float));
            continue;
        }
        float f = (float)(-dsum / sum);
        for (long v = 0; v < V; v++) z[v] = f * expf(z[v] - mx);
        if (K == 1) {
            z[tg[0]] += dlp0;
        } else { /* K > 1 is cross_entropy only: dℓ/dlp_j = −w_j */
            for (int k = 0; k < K; k++) z[tg[k]] -= s->weights ? s->weights[(long)pos * K + k] : 1.0f;
        }
    }
}

/* c->logits[0..n) = the output head (base weights + each segment's head LoRA) of rows
 * c0..c0+n of xf [*, H]; shared by training (cb_head) and sampling (cs_head_pick). */
void cpu_head_logits_chunk(cpu_ctx *c, const float *xf, long c0, int n)
{
    int V = c->m->cfg.vocab_size, H = c->m->cfg.hidden_size;
    cpu_sgemm(c->pool, false, true, n, V, H, 1.0f, xf + c0 * H, H, c->m->lm_head, H, 0.0f, c->logits, V);
    for (int s = 0; s < c->nsegs; s++) {
        const cpu_segment *sg = &c->segs[s];
        const lora_pair *p = adapter_head(sg->ad);
        long lo = sg->row_begin > c0 ? sg->row_begin : c0, hi = sg->row_end < c0 + n ? sg->row_end : c0 + n;
        if (p && lo < hi) cpu_lora_fwd_rows(c, p, sg->ad->scale, xf + lo * H, c->logits + (lo - c0) * V, (int)(hi - lo));
    }
}

/* Runs the head over all rows in chunks: xf [T, H] → outputs; with gradients, adds the
 * head-LoRA gradients and (want_dxf) writes dL/dxf into dxf. */
static void cb_head(cpu_ctx *c, exe_seq *seqs, long T, const float *xf, bool any_grad, float *dxf)
{
    const model_config *mc = &c->m->cfg;
    int V = mc->vocab_size, H = mc->hidden_size;
    for (long c0 = 0; c0 < T; c0 += c->head_rows) {
        int n = (int)(T - c0 < c->head_rows ? T - c0 : c->head_rows);
        cpu_head_logits_chunk(c, xf, c0, n);
        cb_head_job j = {c, seqs, c0, any_grad};
        cpu_pool_for(c->pool, n, 1, cb_head_rows, &j);
        if (!any_grad) continue;
        if (dxf) cpu_sgemm(c->pool, false, false, n, H, V, 1.0f, c->logits, V, c->m->lm_head, H, 0.0f, dxf + c0 * H, H);
        for (int s = 0; s < c->nsegs; s++) {
            const cpu_segment *sg = &c->segs[s];
            const lora_pair *p = adapter_head(sg->ad);
            long lo = sg->row_begin > c0 ? sg->row_begin : c0, hi = sg->row_end < c0 + n ? sg->row_end : c0 + n;
            if (p && sg->grad && lo < hi)
                cpu_lora_bwd_rows(c, p, sg->ad->scale, xf + lo * H, c->logits + (lo - c0) * V, dxf ? dxf + lo * H : NULL,
                                  (int)(hi - lo));
        }
    }
}

/* ---- forward / backward -------------------------------------------------------------- */

static int cpu_forward_backward(void *ctx, exe_seq *seqs, int nseq, bool backward, char *err, size_t errlen)
{
    cpu_ctx *c = ctx;
    const model_config *mc = &c->m->cfg;
    if (nseq < 0 || (nseq > 0 && !seqs)) { cb_err(err, errlen, "bad batch"); return -1; }
    if (cb_validate(c, seqs, nseq, err, errlen) != 0) return -1;
    long T = 0;
    int max_len = 0, max_rank = 0;
    bool any_grad = false, layer_grad = false;
    for (int i = 0; i < nseq; i++) {
        const exe_seq *s = &seqs[i];
        T += s->n;
        if (s->n > max_len) max_len = s->n;
        if (!s->ad || s->n == 0) continue;
        if (s->ad->cfg.rank > max_rank) max_rank = s->ad->cfg.rank;
        if (backward && !s->forward_only) {
            any_grad = true;
            /* Only the head adapted: no gradient needs to enter the layers. */
            if (s->ad->cfg.train_attn || s->ad->cfg.train_mlp) layer_grad = true;
        }
    }
    if (T == 0) return 0;
    if (T > (1L << 30)) { cb_err(err, errlen, "batch of %ld tokens is too large", T); return -1; }
    if (cpu_reserve(c, T, max_len, max_rank, layer_grad) != 0 || cpu_pack(c, seqs, nseq, any_grad) != 0) {
        cb_err(err, errlen, "cpu: out of memory for a batch of %ld tokens", T);
        return -1;
    }
    int L = mc->num_hidden_layers, H = mc->hidden_size;
    cpu_embed(c->pool, c->x, c->m->embed, c->tokens, T, H);
    for (int l = 0; l < L; l++) {
        if (layer_grad) memcpy(c->saved + (long)l * T * H, c->x, (size_t)T * H * sizeof(float));
        cpu_layer_forward(c, l, T, false);
    }
    /* xf lives in xn2 and dL/dxf in dxn: both are free until the layer backward. */
    cpu_rmsnorm_fwd(c->pool, c->xn2, c->rstd_f, c->x, c->m->final_norm, T, H, mc->rms_norm_eps);
    cb_head(c, seqs, T, c->xn2, any_grad, layer_grad ? c->dxn : NULL);
    if (!layer_grad) return 0;
    cpu_rmsnorm_bwd(c->pool, c->dx, c->dxn, c->x, c->rstd_f, c->m->final_norm, T, H, false);
    for (int l = L - 1; l >= 0; l--) {
        memcpy(c->x, c->saved + (long)l * T * H, (size_t)T * H * sizeof(float));
        cpu_layer_forward(c, l, T, true);
        cpu_layer_backward(c, l, T, l > 0);
    }
    return 0;
}

/* ---- optimizer ----------------------------------------------------------------------- */

typedef struct {
    adapter *a;
    const adam_params *hp;
    double coef;
} cb_adam_job;

static void cb_adam_range(void *va, long b, long e, int thread)
{
    (void)thread;
    const cb_adam_job *j = va;
    adapter *a = j->a;
    adamw_update(a->params + b, a->grads + b, a->m + b, a->v + b, (size_t)(e - b), j->hp, a->step, j->coef);
}

static int cpu_optim_step(void *ctx, adapter *a, const adam_params *hp, double *grad_norm_out, char *err, size_t errlen)
{
    cpu_ctx *c = ctx;
    if (!(hp->learning_rate >= 0 && hp->beta1 >= 0 && hp->beta1 < 1 && hp->beta2 >= 0 && hp->beta2 < 1 &&
          hp->eps >= 0 && hp->weight_decay >= 0 && hp->grad_clip_norm >= 0 && isfinite(hp->learning_rate) &&
          isfinite(hp->eps) && isfinite(hp->weight_decay) && isfinite(hp->grad_clip_norm))) {
        cb_err(err, errlen, "bad adam_params (need lr, eps, weight_decay, grad_clip_norm ≥ 0 and betas in [0, 1))");
        return -1;
    }
    double norm = adamw_grad_norm(a->grads, a->num_params);
    if (grad_norm_out) *grad_norm_out = norm;
    if (!isfinite(norm)) {
        /* Stepping would poison parameters and moments for good: skip, drop the gradient. */
        adapter_zero_grad(a);
        cb_err(err, errlen, "non-finite gradient norm; optimizer step skipped and gradients cleared");
        return -1;
    }
    a->step++;
    cb_adam_job j = {a, hp, adamw_clip_coef(norm, hp->grad_clip_norm)};
    cpu_pool_for(c->pool, (long)a->num_params, 1 << 16, cb_adam_range, &j);
    adapter_zero_grad(a);
    return 0;
}

int cpu_sample(void *ctx, exe_sample_req *reqs, int nreq, char *err, size_t errlen); /* cpu_sample.c */

const exe_backend exe_backend_cpu = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .forward_backward = cpu_forward_backward,
    .optim_step = cpu_optim_step,
    .sample = cpu_sample,
};
