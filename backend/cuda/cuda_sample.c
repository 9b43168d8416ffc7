/* cuda_sample.c — sampling with KV caches on the device: the CPU backend's cpu_sample.c,
 * pass for pass. All prompts are prefilled in one packed pass (the training forward, with
 * each layer's K/V rows copied into the caches of every sample of their prompt), then
 * every live sample advances one token per decode pass, attending to its own cache
 * (lcu_attn_fwd with kv_start/kv_len). Tokens are picked on the device by lcu_sample (the
 * CPU's cpu_choose_token algorithm) from each sample's own xoshiro256** stream, kept on
 * the host between passes (be_sample_stream: seeded by (seed, sample index) exactly as
 * the CPU backend seeds it); stop tokens, stop_check and the limits are backend.c's.
 *
 * Correct first: every sample has its own cache rows (a prompt's K/V are copied once per
 * sample), the host waits for each chunk of picks, and decode runs the whole layer stack
 * for one row per sample. Sharing prompt caches and keeping the loop on the device are
 * the speed work of a later issue. Unless LCU_DECODE_GRAPH=0, a decode pass's layer stack (a
 * few thousand small launches with many adapters) is captured once as a CUDA graph and
 * replayed while its shape holds (cs_decode_pass).
 */
#include "backend/cuda/cuda_sample.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_head.h"
#include "backend/cuda/cuda_layer.h"
#include "backend/cuda/cuda_prof.h"
#include "common/clock.h"
#include "common/err.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t csa(size_t x) { return (x + 255) & ~(size_t)255; }

/* The rows of one pass (prefill or decode) in c->sstep: inputs first, uploaded in one copy. */
typedef struct {
    size_t tokens, pos, q_start, kv_dst, kv_src, kv_start, kv_len, gather, in_end;
    size_t rng, tok, lp, total;
} cs_rows;

static void cs_rows_layout(cs_rows *r, long rows, long nmap, int nseq, int pick_rows)
{
    size_t off = 0;
#define CS_AT(f, bytes) (r->f = off, off += csa(bytes))
    CS_AT(tokens, rows * 4);
    CS_AT(pos, rows * 4);
    CS_AT(q_start, ((size_t)nseq + 1) * 4);
    CS_AT(kv_dst, nmap * 8);
    CS_AT(kv_src, nmap * 8);
    CS_AT(kv_start, (size_t)nseq * 8);
    CS_AT(kv_len, (size_t)nseq * 4);
    CS_AT(gather, (size_t)nseq * 8);
    r->in_end = off;
    CS_AT(rng, (size_t)pick_rows * 32);
    CS_AT(tok, (size_t)pick_rows * 4);
    CS_AT(lp, (size_t)pick_rows * 4);
    r->total = off;
#undef CS_AT
}

#define CS_H(c, off) ((void *)((char *)(c)->sstep.host + (off)))
#define CS_D(c, off) ((void *)((char *)(c)->sstep.dev + (off)))

/* Rows of logits picked per lcu_sample call: its workspace (about 20 bytes per logit) within
 * 256 MiB, and no more than a head chunk. */
static int cs_pick_rows(const cu_ctx *c)
{
    long r = (256L << 20) / ((long)c->cfg.vocab_size * 20);
    return (int)(r < 1 ? 1 : r > c->head_rows ? c->head_rows : r);
}

/* ---- decode profile (LCU_DECODE_PROFILE=1): a measurement aid for the speed work ---------- */
/* LCU_DECODE_PROFILE=2 adds a table of the layer stack's operations (cuda_prof.c), under the
 * same line; the decode passes then run eagerly. */

/* Events at a decode step's start (0), after its layer stack (1), its head's logits (2) and
 * its picks (3): recorded on the stream only while profiling. */
static void cs_prof_mark(cu_ctx *c, int i)
{
    if (c->dprof) cudaEventRecord(c->dprof_ev[i], c->stream);
}

static void cs_prof_begin(cu_ctx *c)
{
    c->dprof = c->dprof_level > 0;
    memset(c->dprof_ms, 0, sizeof c->dprof_ms);
    c->dprof_steps = 0;
    for (int i = 0; c->dprof && i < 4; i++)
        if (!c->dprof_ev[i] && cudaEventCreate(&c->dprof_ev[i]) != cudaSuccess) {
            cudaGetLastError();
            c->dprof = false; /* no events: no profile, sampling goes on */
        }
    if (c->dprof && c->dprof_level >= 2) cu_ops_begin(c);
}

/* After a step's picks came back (the stream is idle): its parts' times, summed. */
static void cs_prof_step(cu_ctx *c, double host_ms)
{
    if (!c->dprof) return;
    for (int i = 0; i < 3; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, c->dprof_ev[i], c->dprof_ev[i + 1]) == cudaSuccess) c->dprof_ms[i] += ms;
        else cudaGetLastError();
    }
    c->dprof_ms[3] += host_ms;
    c->dprof_steps++;
    cu_ops_step(c);
}

/* Distinct adapters among the requests, for the profile's table. */
static int cs_adapters(const be_sample_req *reqs, int nreq)
{
    int n = 0;
    for (int r = 0; r < nreq; r++) {
        bool seen = !reqs[r].ad;
        for (int q = 0; q < r && !seen; q++) seen = reqs[q].ad == reqs[r].ad;
        n += !seen;
    }
    return n;
}

static void cs_prof_end(cu_ctx *c, int S, const be_sample_req *reqs, int nreq)
{
    if (c->dprof && c->dprof_steps) {
        double n = (double)c->dprof_steps, *m = c->dprof_ms, gpu = (m[0] + m[1] + m[2]) / n;
        fprintf(stderr, "loom cuda:%d: decode profile, %d samples, %ld steps, per step: layers %.3f ms (%s), head %.3f "
                "ms, pick %.3f ms; the host's step %.3f ms (%.3f ms of it outside those)\n", c->device, S,
                c->dprof_steps, m[0] / n, c->dgraph_wanted && !c->dgraph_off && !c->dops ? "graph" : "eager", m[1] / n,
                m[2] / n, m[3] / n, m[3] / n - gpu);
    }
    if (c->dops) cu_ops_end(c, S, cs_adapters(reqs, nreq)); /* the operations' table under that line */
}

/* top_logprobs of stream s from row j of c->logits: the row comes to the host and
 * be_sample_top (backend.c) ranks it there. Correct first: one copy per row asking for
 * them; a device top-k is speed work. */
static int cs_top_on_host(cu_ctx *c, int j, const be_sample_stream *s)
{
    long V = c->cfg.vocab_size;
    float *z = malloc(V * sizeof *z), *w = malloc(V * sizeof *w);
    uint64_t *keys = malloc(V * sizeof *keys);
    int rc = -1;
    if (!z || !w || !keys) {
        cu_where(c, "sampling top_logprobs: out of host memory");
        goto out;
    }
    cu_where(c, "sampling top_logprobs row %d", j);
    if (cu_check(c, (int)cudaMemcpyAsync(z, c->logits + (size_t)j * V, V * sizeof *z, cudaMemcpyDeviceToHost, c->stream),
                 "cudaMemcpyAsync", __FILE__, __LINE__) != 0 || cu_sync(c) < 0)
        goto out;
    be_sample_top(s, z, V, w, keys);
    rc = 0;
out:
    free(z);
    free(w);
    free(keys);
    return rc;
}

/* Logits of the n rows of c->a.xn2 (final-normed; c->segs by row), and a token for each
 * row's stream (row_stream[i]) that is still live. */
static int cs_head_pick(cu_ctx *c, long n, const int *row_stream, be_sample_stream *st, const cs_rows *L)
{
    int V = c->cfg.vocab_size, SR = cs_pick_rows(c), maxp = c->cfg.max_position_embeddings;
    lcu_sample_params par[SR > 0 ? SR : 1];
    uint64_t *rng = CS_H(c, L->rng);
    int32_t *tok = CS_H(c, L->tok);
    float *lp = CS_H(c, L->lp);
    for (long c0 = 0; c0 < n; c0 += SR) {
        int k = (int)(n - c0 < SR ? n - c0 : SR);
        cu_where(c, "sampling head rows %ld..%ld", c0, c0 + k);
        for (int j = 0; j < k; j++) {
            const be_sample_stream *s = &st[row_stream[c0 + j]];
            par[j] = (lcu_sample_params){s->req->temperature, s->req->top_k, s->req->top_p};
            memcpy(rng + 4L * j, s->rng.s, 32);
        }
        if (cu_head_logits(c, c->a.xn2, c0, k) < 0) return -1;
        if (c0 == 0) cs_prof_mark(c, 2);
        CU_TRY(c, cudaMemcpyAsync(CS_D(c, L->rng), rng, (size_t)k * 32, cudaMemcpyHostToDevice, c->stream));
        CU_TRY(c, lcu_sample(c->logits, V, k, V, par, CS_D(c, L->rng), CS_D(c, L->tok), CS_D(c, L->lp), c->sws.dev,
                             c->sws.cap, c->stream));
        if (c0 == 0) cs_prof_mark(c, 3);
        CU_TRY(c, cudaMemcpyAsync(rng, CS_D(c, L->rng), (size_t)k * 32, cudaMemcpyDeviceToHost, c->stream));
        CU_TRY(c, cudaMemcpyAsync(tok, CS_D(c, L->tok), (size_t)k * 4, cudaMemcpyDeviceToHost, c->stream));
        CU_TRY(c, cudaMemcpyAsync(lp, CS_D(c, L->lp), (size_t)k * 4, cudaMemcpyDeviceToHost, c->stream));
        if (cu_sync(c) < 0) return -1;
        for (int j = 0; j < k; j++) {
            be_sample_stream *s = &st[row_stream[c0 + j]];
            if (s->done) continue; /* its stream did not draw (max_tokens 0) */
            memcpy(s->rng.s, rng + 4L * j, 32);
            if (s->req->top_logprobs > 0 && cs_top_on_host(c, j, s) < 0) return -1;
            be_sample_record(s, tok[j], lp[j], maxp);
        }
    }
    return 0;
}

/* The layer stack over the rows in c->sstep (c->segs, c->d_pos and the KV maps set), then
 * the final norm of the rows to pick from (gather: their rows of the pass, NULL = all n). */
static int cs_pass(cu_ctx *c, long T, const int32_t *d_tokens, const int64_t *d_gather, long n)
{
    const model_config *mc = &c->cfg;
    int H = mc->hidden_size;
    cu_where(c, "sampling embedding");
    CU_TRY(c, lcu_embed(c->a.x, c->w.embed, d_tokens, T, H, c->stream));
    cu_mark(c, "embedding");
    for (int l = 0; l < mc->num_hidden_layers; l++)
        if (cu_layer_forward(c, l, T, c->a.x, c->a.x, false) < 0) return -1;
    cu_where(c, "sampling final norm");
    const float *xf = c->a.x;
    if (d_gather) {
        CU_TRY(c, lcu_copy_rows(c->a.xmid, NULL, c->a.x, d_gather, n, (size_t)H * sizeof(float), c->stream));
        xf = c->a.xmid;
    }
    CU_TRY(c, lcu_rmsnorm_fwd(c->a.xn2, LCU_BF16, c->a.rstd_f, xf, c->w.final_norm, n, H, mc->rms_norm_eps,
                              c->stream));
    cu_mark(c, "final norm");
    return 0;
}

/* ---- decode passes as a CUDA graph (LCU_DECODE_GRAPH) ------------------------------------ */

/* The shape of a decode pass: what its kernels were given beyond the contents of device
 * memory (rows, LoRA segments and their adapters, the buffers). Within one sampling call the
 * buffers do not move; a sample that ends changes the rows. */
static uint64_t cs_sig(const cu_ctx *c, long n)
{
    uint64_t h = 1469598103934665603ull;
#define CS_MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    CS_MIX(n);
    CS_MIX(c->nsegs);
    CS_MIX((uintptr_t)c->act_mem);
    CS_MIX((uintptr_t)c->sstep.dev);
    CS_MIX((uintptr_t)c->kv.dev);
    CS_MIX(c->kv_cap);
    for (int s = 0; s < c->nsegs; s++) {
        CS_MIX((uintptr_t)c->segs[s].ad);
        CS_MIX(c->segs[s].row_begin);
        CS_MIX(c->segs[s].row_end);
    }
#undef CS_MIX
    return h;
}

static void cs_graph_drop(cu_ctx *c)
{
    if (c->dgraph) cudaGraphExecDestroy(c->dgraph);
    c->dgraph = NULL;
    c->dgraph_sig = 0;
    c->dgraph_seen = 0;
}

/* A decode pass's layer stack and final norm (cs_pass over its n rows). With the switch:
 * the first pass of a shape runs eagerly (it builds the GEMM plans and grows every
 * workspace, so that a capture allocates nothing), the second is captured as a graph, and
 * every later one of that shape replays it: the same kernels with the same arguments,
 * reading the rows uploaded for this pass (so the same bits as eager passes). Eager
 * throughout under LOOM_CUDA_SYNC (a sync per call cannot be captured), for mixture-of-
 * experts models (their routing comes back to the host), once a capture failed (said
 * once: the executor keeps sampling without graphs) and under the per-operation profile
 * (LCU_DECODE_PROFILE=2: an event between every two operations is what it measures). */
static int cs_decode_pass(cu_ctx *c, long n, const int32_t *d_tokens)
{
    if (c->dops) {
        double t0 = clock_mono_s();
        cu_ops_open(c);
        int rc = cs_pass(c, n, d_tokens, NULL, n);
        cu_ops_close(c, (clock_mono_s() - t0) * 1e3);
        return rc;
    }
    /* a mixture-of-experts layer reads its routing back to the host: never captured */
    if (!c->dgraph_wanted || c->dgraph_off || c->sync_debug || c->cfg.num_experts > 0)
        return cs_pass(c, n, d_tokens, NULL, n);
    uint64_t sig = cs_sig(c, n);
    if (sig != c->dgraph_sig) {
        cs_graph_drop(c);
        c->dgraph_sig = sig;
    }
    if (!c->dgraph && c->dgraph_seen++ == 0) return cs_pass(c, n, d_tokens, NULL, n);
    if (!c->dgraph) {
        cudaGraph_t g = NULL;
        int brc = (int)cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed);
        int prc = brc ? 0 : cs_pass(c, n, d_tokens, NULL, n);
        int erc = brc ? brc : (int)cudaStreamEndCapture(c->stream, &g);
        if (!erc && prc == 0) erc = (int)cudaGraphInstantiate(&c->dgraph, g, 0);
        if (g) cudaGraphDestroy(g);
        if (erc || prc < 0) {
            cudaGetLastError(); /* nothing ran: the capture's failure is not this pass's */
            if (c->dgraph) cudaGraphExecDestroy(c->dgraph);
            c->dgraph = NULL;
            fprintf(stderr, "loom cuda:%d: capturing a decode pass as a graph failed (%s%s%s); decode passes run "
                    "without graphs\n", c->device, erc ? lcu_strerror(erc) : "", erc && prc < 0 ? "; " : "",
                    prc < 0 ? c->errmsg : "");
            if (c->failed) return -1;
            c->errmsg[0] = 0;
            c->dgraph_off = true;
            return cs_pass(c, n, d_tokens, NULL, n);
        }
    }
    cu_where(c, "sampling decode pass (graph)");
    CU_TRY(c, cudaGraphLaunch(c->dgraph, c->stream));
    return 0;
}

static const cu_adapter *cs_ad(const be_sample_req *r) { return r->ad ? (const cu_adapter *)r->ad : NULL; }


/* Prefill: every prompt in one packed pass, K/V into the caches of its samples; then the
 * first token of every sample from its prompt's last row. */
static int cs_prefill(cu_ctx *c, be_sample_req *reqs, int nreq, be_sample_stream *st, int S, long T, long nmap,
                      int *row_stream)
{
    cs_rows L;
    cs_rows_layout(&L, T, nmap, nreq > S ? nreq : S, cs_pick_rows(c));
    int32_t *tok = CS_H(c, L.tokens), *pos = CS_H(c, L.pos), *qs = CS_H(c, L.q_start);
    int64_t *dst = CS_H(c, L.kv_dst), *src = CS_H(c, L.kv_src), *gather = CS_H(c, L.gather);
    long row = 0, m = 0;
    int s = 0;
    c->nsegs = 0;
    for (int r = 0; r < nreq; r++) {
        const be_sample_req *q = &reqs[r];
        qs[r] = (int32_t)row;
        for (int t = 0; t < q->n_prompt; t++) {
            tok[row + t] = q->prompt[t];
            pos[row + t] = t;
        }
        for (int i = 0; i < q->num_samples; i++, s++) {
            for (int t = 0; t < q->n_prompt; t++, m++) {
                dst[m] = (int64_t)s * c->kv_cap + t;
                src[m] = row + t;
            }
            gather[s] = row + q->n_prompt - 1;
            row_stream[s] = s;
        }
        cu_segs_add(c, cs_ad(q), row, row + q->n_prompt, false);
        row += q->n_prompt;
    }
    qs[nreq] = (int32_t)row;
    cu_where(c, "sampling prefill upload");
    CU_TRY(c, cudaMemcpyAsync(c->sstep.dev, c->sstep.host, L.in_end, cudaMemcpyHostToDevice, c->stream));
    c->attn = (lcu_attn_desc){nreq, CS_D(c, L.q_start), NULL, NULL, T, c->cfg.num_attention_heads,
                              c->cfg.num_key_value_heads, c->cfg.head_dim, (float)(1.0 / sqrt((double)c->cfg.head_dim)), false};
    c->attn_max_len = cu_attn_max_len(qs, nreq);
    c->d_pos = CS_D(c, L.pos);
    c->kv_dst = CS_D(c, L.kv_dst);
    c->kv_src = CS_D(c, L.kv_src);
    c->kv_nmap = nmap;
    c->kv_mode = CU_KV_PREFILL;
    int rc = cs_pass(c, T, CS_D(c, L.tokens), CS_D(c, L.gather), S);
    c->kv_mode = CU_KV_NONE;
    if (rc < 0) return -1;
    c->nsegs = 0;
    for (int k = 0; k < S; k++) cu_segs_add(c, cs_ad(st[k].req), k, k + 1, false);
    return cs_head_pick(c, S, row_stream, st, &L);
}

/* One decode pass: each live sample feeds its last token and attends to its cache.
 * *live = how many samples were live. */
static int cs_decode(cu_ctx *c, be_sample_stream *st, int S, int *row_stream, long *live)
{
    cs_rows L;
    cs_rows_layout(&L, S, S, S, cs_pick_rows(c));
    int32_t *tok = CS_H(c, L.tokens), *pos = CS_H(c, L.pos), *qs = CS_H(c, L.q_start), *kl = CS_H(c, L.kv_len);
    int64_t *dst = CS_H(c, L.kv_dst), *ks = CS_H(c, L.kv_start);
    long n = 0;
    c->nsegs = 0;
    for (int k = 0; k < S; k++) {
        if (st[k].done) continue;
        int p = st[k].req->n_prompt + st[k].n_gen - 1;
        tok[n] = st[k].last;
        pos[n] = p;
        qs[n] = (int32_t)n;
        ks[n] = (int64_t)k * c->kv_cap;
        kl[n] = p + 1;
        dst[n] = (int64_t)k * c->kv_cap + p;
        row_stream[n] = k;
        cu_segs_add(c, cs_ad(st[k].req), n, n + 1, false);
        n++;
    }
    *live = n;
    if (n == 0) return 0;
    qs[n] = (int32_t)n;
    cu_where(c, "sampling decode upload");
    cs_prof_mark(c, 0);
    CU_TRY(c, cudaMemcpyAsync(c->sstep.dev, c->sstep.host, L.in_end, cudaMemcpyHostToDevice, c->stream));
    c->kv_attn = (lcu_attn_desc){(int)n, CS_D(c, L.q_start), CS_D(c, L.kv_start), CS_D(c, L.kv_len), n,
                                 c->cfg.num_attention_heads, c->cfg.num_key_value_heads, c->cfg.head_dim,
                                 (float)(1.0 / sqrt((double)c->cfg.head_dim)), false};
    c->d_pos = CS_D(c, L.pos);
    c->kv_dst = CS_D(c, L.kv_dst);
    c->kv_src = NULL;
    c->kv_nmap = n;
    c->kv_mode = CU_KV_DECODE;
    int rc = cs_decode_pass(c, n, CS_D(c, L.tokens));
    c->kv_mode = CU_KV_NONE;
    if (rc < 0) return -1;
    cs_prof_mark(c, 1);
    return cs_head_pick(c, n, row_stream, st, &L);
}

/* Grows every buffer a sampling call needs. 0 or -1 with err. */
static int cs_reserve(cu_ctx *c, long T, int S, int nreq, long nmap, int kv_cap, char *err, size_t errlen)
{
    const model_config *mc = &c->cfg;
    long rows = T > S ? T : S;
    int nseq = nreq > S ? nreq : S;
    cu_keep_release(c); /* the KV caches before the training passes' kept activations */
    if (cu_act_reserve(c, rows, nseq, false, err, errlen) < 0 || cu_segs_reserve(c, nseq, err, errlen) < 0 ||
        cu_rope_reserve(c, kv_cap, err, errlen) < 0)
        return -1;
    size_t kv = (size_t)mc->num_hidden_layers * 2 * S * kv_cap * mc->num_key_value_heads * mc->head_dim *
                sizeof(lcu_bf16);
    if (cu_buf_reserve(&c->kv, kv, false) < 0) {
        cudaGetLastError();
        err_set(err, errlen, "cuda:%d: out of memory for the KV caches of %d samples × %d positions (%.2f GiB)",
                c->device, S, kv_cap, kv / 1073741824.0);
        return -1;
    }
    c->kv_streams = S;
    c->kv_cap = kv_cap;
    cs_rows a, b;
    cs_rows_layout(&a, T, nmap, nseq, cs_pick_rows(c));
    cs_rows_layout(&b, S, S, S, cs_pick_rows(c));
    int SR = cs_pick_rows(c);
    size_t ws = lcu_sample_workspace_bytes(SR, mc->vocab_size);
    if (cu_buf_reserve(&c->sstep, a.total > b.total ? a.total : b.total, true) < 0 || !ws ||
        cu_buf_reserve(&c->sws, ws, false) < 0) {
        cudaGetLastError();
        err_set(err, errlen, "cuda:%d: out of memory for sampling (%d samples, %ld prompt tokens)", c->device, S, T);
        return -1;
    }
    return 0;
}

int cu_sample(cu_ctx *c, be_sample_req *reqs, int nreq, char *err, size_t errlen)
{
    const model_config *mc = &c->cfg;
    long T = 0, nmap = 0;
    int S = 0, kv_cap = 1;
    for (int r = 0; r < nreq; r++) {
        char why[256];
        if (be_sample_check(mc, &reqs[r], why, sizeof why) != 0) { err_set(err, errlen, "request %d: %s", r, why); return -1; }
        T += reqs[r].n_prompt;
        S += reqs[r].num_samples;
        nmap += (long)reqs[r].n_prompt * reqs[r].num_samples;
        long cap = (long)reqs[r].n_prompt + reqs[r].max_tokens;
        if (cap > mc->max_position_embeddings) cap = mc->max_position_embeddings;
        if (cap > kv_cap) kv_cap = (int)cap;
    }
    if (nreq <= 0) return 0;
    if (T > (1L << 30) || S > (1 << 24) || nmap > (1L << 34)) { err_set(err, errlen, "sampling batch too large"); return -1; }
    be_sample_stream *st = calloc(S, sizeof *st);
    int *row_stream = calloc(S, sizeof *row_stream);
    if (!st || !row_stream) {
        free(st);
        free(row_stream);
        err_set(err, errlen, "cuda: out of host memory for %d samples", S);
        return -1;
    }
    int rc = cs_reserve(c, T, S, nreq, nmap, kv_cap, err, errlen);
    if (rc == 0) {
        int s = 0;
        for (int r = 0; r < nreq; r++)
            for (int i = 0; i < reqs[r].num_samples; i++, s++) be_sample_stream_init(&st[s], &reqs[r], i);
        rc = cs_prefill(c, reqs, nreq, st, S, T, nmap, row_stream);
        cs_prof_begin(c);
        for (long live = 1; rc == 0 && live > 0;) {
            double t0 = c->dprof ? clock_mono_s() : 0;
            rc = cs_decode(c, st, S, row_stream, &live);
            if (rc == 0 && live > 0) cs_prof_step(c, (clock_mono_s() - t0) * 1e3);
        }
        cs_prof_end(c, S, reqs, nreq);
        cs_graph_drop(c); /* a graph lives for one call: the next may move the buffers */
        if (rc < 0) cu_fail(c, err, errlen, "cuda: sampling failed");
    }
    free(st);
    free(row_stream);
    return rc;
}
