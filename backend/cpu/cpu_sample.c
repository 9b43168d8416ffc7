/* cpu_sample.c — sampling with a KV cache (be_backend_cpu.sample), llama2.c style but
 * batched: all prompts are prefilled in one packed pass (the training forward, with
 * cpu_kv_store (cpu_kv.c) copying each layer's K/V into the caches of the prompt's
 * samples), then every live sample advances one token per decode pass, attending to its
 * own cache.
 *
 * Streams: each request's num_samples samples are streams s = stream0 .. stream0+n−1,
 * each with its own cache [2][L][kv_cap][nkv·d] and its own PRNG seeded by
 * (seed, sample index), so results do not depend on the rest of the batch (the stream,
 * the request checks and the stop rules are backend.c's, shared with the CUDA backend).
 */
#include "backend/cpu/cpu_sample.h"
#include "backend/cpu/cpu_buffers.h"
#include "backend/cpu/cpu_choose.h"
#include "backend/cpu/cpu_head.h"
#include "backend/cpu/cpu_layer.h"
#include "backend/cpu/cpu_ops.h"
#include "model/rng.h"
#include "common/err.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the passes ---------------------------------------------------------------------- */

typedef struct {
    cpu_ctx *c;
    be_sample_stream *st;
    long c0;
} cs_pick_job;

/* Bytes of choice scratch per thread: V floats (padded to 8 bytes) then V uint64. */
static size_t cs_stride(long V) { return (size_t)((V + 1) & ~1L) * sizeof(float) + (size_t)V * sizeof(uint64_t); }

/* Each row of the chunk serves the streams kv_stream0[row] .. + kv_nstream[row]. */
static void cs_pick_rows(void *va, long b, long e, int thread)
{
    const cs_pick_job *j = va;
    cpu_ctx *c = j->c;
    long V = c->m->cfg.vocab_size;
    float *w = (float *)((char *)c->sample_scratch + (size_t)thread * cs_stride(V));
    uint64_t *keys = (uint64_t *)(w + ((V + 1) & ~1L));
    for (long i = b; i < e; i++) {
        long row = j->c0 + i;
        for (int s = c->kv_stream0[row]; s < c->kv_stream0[row] + c->kv_nstream[row]; s++) {
            be_sample_stream *st = &j->st[s];
            if (st->done) continue;
            float lp;
            if (st->req->top_logprobs > 0) be_sample_top(st, c->logits + i * V, V, w, keys);
            int32_t tok = cpu_choose_token(st->req, c->logits + i * V, V, &st->rng, w, keys, &lp);
            be_sample_record(st, tok, lp, c->m->cfg.max_position_embeddings);
        }
    }
}

/* Logits of the R rows of xf (final-normed), chunk by chunk, and a token for each live
 * stream of each row. */
static void cs_head_pick(cpu_ctx *c, const float *xf, long R, be_sample_stream *st)
{
    for (long c0 = 0; c0 < R; c0 += c->head_rows) {
        int n = (int)(R - c0 < c->head_rows ? R - c0 : c->head_rows);
        cpu_head_logits_chunk(c, xf, c0, n);
        cs_pick_job j = {c, st, c0};
        cpu_pool_for(c->pool, n, 1, cs_pick_rows, &j);
    }
}

/* Segments over rows whose adapters are given by ads[row] (NULL = none). */
static void cs_segments(cpu_ctx *c, const cpu_adapter *const *ads, long R)
{
    c->nsegs = 0;
    for (long t = 0; t < R; t++) {
        if (!ads[t]) continue;
        cpu_segment *last = c->nsegs ? &c->segs[c->nsegs - 1] : NULL;
        if (last && last->ad == ads[t] && last->row_end == t) last->row_end = (int)t + 1;
        else c->segs[c->nsegs++] = (cpu_segment){ads[t], (int)t, (int)t + 1, false, 0};
    }
}

/* Grows the caches, the row → stream maps and the per-thread choice scratch. */
static int cs_reserve(cpu_ctx *c, int nrows, int S, int kv_cap)
{
    const model_config *mc = &c->m->cfg;
    size_t need = (size_t)S * 2 * mc->num_hidden_layers * kv_cap * mc->num_key_value_heads * mc->head_dim;
    c->kv_cap = kv_cap;
    if (need > c->kv_mem_floats) {
        free(c->kv_mem);
        c->kv_mem = malloc(need * sizeof(float));
        c->kv_mem_floats = c->kv_mem ? need : 0;
        if (!c->kv_mem) return -1;
    }
    int n = nrows > S ? nrows : S;
    if (n > c->cap_kv_map) {
        free(c->kv_stream0);
        free(c->kv_nstream);
        c->kv_stream0 = malloc(n * sizeof(int));
        c->kv_nstream = malloc(n * sizeof(int));
        c->cap_kv_map = (c->kv_stream0 && c->kv_nstream) ? n : 0;
        if (!c->cap_kv_map) return -1;
    }
    if (!c->sample_scratch) {
        c->sample_scratch = malloc((size_t)cpu_pool_size(c->pool) * cs_stride(mc->vocab_size));
        if (!c->sample_scratch) return -1;
    }
    return cpu_reserve_seqs(c, n);
}

int cpu_sample(void *ctx, be_sample_req *reqs, int nreq, char *err, size_t errlen)
{
    cpu_ctx *c = ctx;
    const model_config *mc = &c->m->cfg;
    long T = 0;
    int S = 0, kv_cap = 1, max_rank = 0, H = mc->hidden_size, L = mc->num_hidden_layers;
    for (int r = 0; r < nreq; r++) {
        char why[256];
        if (be_sample_check(mc, &reqs[r], why, sizeof why) != 0) { err_set(err, errlen, "request %d: %s", r, why); return -1; }
        T += reqs[r].n_prompt;
        S += reqs[r].num_samples;
        long cap = (long)reqs[r].n_prompt + reqs[r].max_tokens;
        if (cap > mc->max_position_embeddings) cap = mc->max_position_embeddings;
        if (cap > kv_cap) kv_cap = (int)cap;
        if (reqs[r].ad && reqs[r].ad->layout.cfg.rank > max_rank) max_rank = reqs[r].ad->layout.cfg.rank;
    }
    if (nreq <= 0) return 0;
    if (T > (1L << 30) || S > (1 << 24)) { err_set(err, errlen, "sampling batch too large"); return -1; }
    be_sample_stream *st = calloc(S, sizeof *st);
    be_seq *ps = calloc(nreq, sizeof *ps);
    const cpu_adapter **ads = calloc(S > nreq ? S : nreq, sizeof *ads);
    if (!st || !ps || !ads || cpu_reserve(c, T > S ? T : S, kv_cap, max_rank, false) != 0 || cs_reserve(c, nreq, S, kv_cap) != 0) {
        free(st); free(ps); free(ads);
        err_set(err, errlen, "cpu: out of memory for sampling (%d samples, context %d)", S, kv_cap);
        return -1;
    }
    int s = 0;
    for (int r = 0; r < nreq; r++) {
        be_sample_req *q = &reqs[r];
        ps[r] = (be_seq){.ad = q->ad, .n = q->n_prompt, .tokens = q->prompt, .targets = q->prompt};
        c->kv_stream0[r] = s;
        c->kv_nstream[r] = q->num_samples;
        ads[r] = q->ad ? cpu_adapter_of(q->ad) : NULL;
        for (int i = 0; i < q->num_samples; i++, s++) be_sample_stream_init(&st[s], q, i);
    }
    /* prefill: every prompt in one packed pass; K/V go to the caches of its samples */
    cpu_pack(c, ps, nreq, false);
    cpu_embed(c->pool, c->x, c->m->embed, c->tokens, T, H);
    c->kv_mode = CPU_KV_PREFILL;
    for (int l = 0; l < L; l++) cpu_layer_forward(c, l, T, false);
    c->kv_mode = CPU_KV_NONE;
    for (int r = 0; r < nreq; r++) memcpy(c->xn1 + (long)r * H, c->x + (long)(c->seq_start[r + 1] - 1) * H, H * sizeof(float));
    cpu_rmsnorm_fwd(c->pool, c->xn2, c->rstd_f, c->xn1, c->m->final_norm, nreq, H, mc->rms_norm_eps);
    cs_segments(c, ads, nreq);
    cs_head_pick(c, c->xn2, nreq, st);
    /* decode: one token per live stream per pass */
    for (;;) {
        long n = 0;
        for (int k = 0; k < S; k++) {
            if (st[k].done) continue;
            c->tokens[n] = st[k].last;
            c->pos[n] = st[k].req->n_prompt + st[k].n_gen - 1;
            c->row_seq[n] = (int)n;
            c->kv_stream0[n] = k;
            c->kv_nstream[n] = 1;
            ads[n] = st[k].req->ad ? cpu_adapter_of(st[k].req->ad) : NULL;
            n++;
        }
        if (n == 0) break;
        cs_segments(c, ads, n);
        cpu_embed(c->pool, c->x, c->m->embed, c->tokens, n, H);
        c->kv_mode = CPU_KV_DECODE;
        for (int l = 0; l < L; l++) cpu_layer_forward(c, l, n, false);
        c->kv_mode = CPU_KV_NONE;
        cpu_rmsnorm_fwd(c->pool, c->xn2, c->rstd_f, c->x, c->m->final_norm, n, H, mc->rms_norm_eps);
        cs_head_pick(c, c->xn2, n, st);
    }
    free(st);
    free(ps);
    free(ads);
    return 0;
}
