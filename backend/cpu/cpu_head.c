/* cpu_head.c — the output head: logits chunk by chunk (never [T, V]), log-softmax, the
 * losses of backend/loss.h per target, top-k log-probs, sampling's prompt-pass extras
 * (be_prompt_extras), and the head's gradients. */
#include "backend/cpu/cpu_head.h"
#include "backend/cpu/cpu_layer.h"
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

typedef struct {
    cpu_ctx *c;
    be_seq *seqs;
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
        const be_seq *s = &j->seqs[c->row_seq[t]];
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
        if (be_seq_has_extras(s)) be_prompt_extras(s, pos, z, V, lse);
        if (!j->any_grad) continue;
        /* Zero rows keep the GEMMs exact; a row whose dℓ/dlp is not finite adds no gradient
         * (backend/backend.h), so no accumulator ever holds inf or NaN because of the inputs. */
        if (!s->ad || !s->ad->trainable || s->forward_only || (K == 1 && dlp0 == 0.0f) || !isfinite(dsum)) {
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
        const lora_pair *p = cpu_adapter_head(sg->ad);
        long lo = sg->row_begin > c0 ? sg->row_begin : c0, hi = sg->row_end < c0 + n ? sg->row_end : c0 + n;
        if (p && lo < hi) cpu_lora_fwd_rows(c, p, sg->ad->scale, xf + lo * H, c->logits + (lo - c0) * V, (int)(hi - lo));
    }
}

/* Where the head's chunk that starts at row c0 ends: after head_rows rows, or at the next
 * segment boundary. Chunks start where segments start, so a segment's head-LoRA gradient
 * is the same sum of chunks wherever the segment lies in the batch (batch invariance). */
static long cb_chunk_end(const cpu_ctx *c, long c0, long T)
{
    long end = c0 + c->head_rows < T ? c0 + c->head_rows : T;
    for (int s = 0; s < c->nsegs; s++) {
        const cpu_segment *sg = &c->segs[s];
        if (sg->row_begin > c0 && sg->row_begin < end) end = sg->row_begin;
        if (sg->row_end > c0 && sg->row_end < end) end = sg->row_end;
    }
    return end;
}

/* Runs the head over all rows in chunks: xf [T, H] → outputs; with gradients, adds the
 * head-LoRA gradients and (want_dxf) writes dL/dxf into dxf. */
void cpu_head(cpu_ctx *c, be_seq *seqs, long T, const float *xf, bool any_grad, float *dxf)
{
    const model_config *mc = &c->m->cfg;
    int V = mc->vocab_size, H = mc->hidden_size;
    for (long c0 = 0, c1; c0 < T; c0 = c1) {
        c1 = cb_chunk_end(c, c0, T);
        int n = (int)(c1 - c0);
        cpu_head_logits_chunk(c, xf, c0, n);
        cb_head_job j = {c, seqs, c0, any_grad};
        cpu_pool_for(c->pool, n, 1, cb_head_rows, &j);
        if (!any_grad) continue;
        if (dxf) cpu_sgemm(c->pool, false, false, n, H, V, 1.0f, c->logits, V, c->m->lm_head, H, 0.0f, dxf + c0 * H, H);
        for (int s = 0; s < c->nsegs; s++) {
            const cpu_segment *sg = &c->segs[s];
            const lora_pair *p = cpu_adapter_head(sg->ad);
            long lo = sg->row_begin > c0 ? sg->row_begin : c0, hi = sg->row_end < c0 + n ? sg->row_end : c0 + n;
            if (p && sg->grad && lo < hi)
                cpu_lora_bwd_rows(c, p, sg->ad->scale, xf + lo * H, c->logits + (lo - c0) * V, dxf ? dxf + lo * H : NULL,
                                  (int)(hi - lo));
        }
    }
}