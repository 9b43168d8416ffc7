/* sample_pick.c — the arithmetic of picking a token that every sampler shares (see
 * backend.h: be_sample_weights, be_sample_nucleus, be_sample_top, be_prompt_extras):
 * the CPU backend's choice (cpu/cpu_choose.c), the top_logprobs of both backends and the
 * prompt pass's target logprobs and alternative draws. Its own file, without
 * dependencies, so that the CUDA kernel tests' CPU twins link it too. */
#include "backend/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

double be_sample_weights(const be_sample_req *r, const float *z, long V, float *w, uint64_t *keys, long *best)
{
    float mx = z[0];
    *best = 0;
    for (long v = 1; v < V; v++) if (z[v] > mx) { mx = z[v]; *best = v; }
    double sum = 0;
    if (r->temperature == 0) {
        for (long v = 0; v < V; v++) sum += expf(z[v] - mx);
        return sum;
    }
    double inv_t = 1.0 / r->temperature;
    for (long v = 0; v < V; v++) w[v] = (float)exp((z[v] - mx) * inv_t); /* in (0, 1], 1 at the max */
    if (r->top_k > 0 && r->top_k < V) {
        /* k-th largest weight by quickselect on a copy (Hoare partition) */
        float *tmp = (float *)keys;
        memcpy(tmp, w, V * sizeof(float));
        long lo = 0, hi = V - 1, k = r->top_k - 1;
        while (lo < hi) {
            float piv = tmp[(lo + hi) / 2];
            long i = lo, j = hi;
            while (i <= j) {
                while (tmp[i] > piv) i++;
                while (tmp[j] < piv) j--;
                if (i <= j) { float x = tmp[i]; tmp[i] = tmp[j]; tmp[j] = x; i++; j--; }
            }
            if (k <= j) hi = j;
            else if (k >= i) lo = i;
            else break;
        }
        float thr = tmp[k];
        for (long v = 0; v < V; v++) if (w[v] < thr) w[v] = 0.0f;
    }
    for (long v = 0; v < V; v++) sum += w[v];
    return sum;
}

long be_sample_nucleus(const be_sample_req *r, const float *w, long V, double sum, uint64_t *keys, double *cum)
{
    /* Weights are non-negative floats, so their bit patterns sort like their values: the
     * key (bits << 32 | token) sorts by weight with a context-free comparator. */
    long n = 0;
    for (long v = 0; v < V; v++) {
        if (w[v] <= 0) continue;
        uint32_t bits;
        memcpy(&bits, &w[v], 4);
        keys[n++] = ((uint64_t)bits << 32) | (uint32_t)v;
    }
    qsort(keys, n, sizeof *keys, cmp_desc);
    double target = r->top_p * sum;
    long keep = 0;
    *cum = 0;
    while (keep < n && (keep == 0 || *cum < target)) *cum += w[(uint32_t)keys[keep++]];
    return keep;
}

/* Inserts (id, x) into the k best so far (x descending, ties by lower id). */
static void top_insert(int32_t *ids, double *xs, int *n, int k, int32_t id, double x)
{
    int i = *n < k ? (*n)++ : k;
    if (i == k && !(x > xs[k - 1])) return;   /* not better than the worst kept (ids ascend) */
    if (i == k) i = k - 1;
    while (i > 0 && x > xs[i - 1]) { ids[i] = ids[i - 1]; xs[i] = xs[i - 1]; i--; }
    ids[i] = id;
    xs[i] = x;
}

void be_sample_top(const be_sample_stream *s, const float *z, long V, float *w, uint64_t *keys)
{
    const be_sample_req *r = s->req;
    int k = r->top_logprobs;
    if (k <= 0 || !r->top_ids_out || !r->top_lp_out) return;
    size_t at = ((size_t)s->index * r->max_tokens + s->n_gen) * k;
    int32_t *ids = r->top_ids_out + at;
    float *lps = r->top_lp_out + at;
    int32_t best_ids[LIMIT_TOPK_PROMPT_LOGPROBS];
    double xs[LIMIT_TOPK_PROMPT_LOGPROBS];
    int n = 0;
    if (k > LIMIT_TOPK_PROMPT_LOGPROBS) k = LIMIT_TOPK_PROMPT_LOGPROBS;
    long best;
    double sum = be_sample_weights(r, z, V, w, keys, &best);
    if (r->temperature == 0) {
        /* greedy: the model's own distribution, log p = z − max − log Σ exp(z − max) */
        float mx = z[best];
        for (long v = 0; v < V; v++) top_insert(best_ids, xs, &n, k, (int32_t)v, z[v]);
        for (int i = 0; i < n; i++) lps[i] = (float)((z[best_ids[i]] - mx) - log(sum));
    } else if (r->top_p < 1.0) {
        double cum;
        long keep = be_sample_nucleus(r, w, V, sum, keys, &cum);
        for (long i = 0; i < keep && n < k; i++, n++) {
            best_ids[n] = (int32_t)(uint32_t)keys[i];
            lps[n] = (float)log(w[best_ids[n]] / cum);
        }
    } else {
        for (long v = 0; v < V; v++) if (w[v] > 0) top_insert(best_ids, xs, &n, k, (int32_t)v, w[v]);
        for (int i = 0; i < n; i++) lps[i] = (float)log(w[best_ids[i]] / sum);
    }
    for (int i = 0; i < r->top_logprobs; i++) {
        ids[i] = i < n ? best_ids[i] : -1;
        if (i >= n) lps[i] = 0;
    }
}

/* A draw's stream: seeded by (seed, row) and nothing else, so that draws do not depend on
 * the batch. The mix is the sample streams' (be_sample_stream_init: seed ^ φ·(index + 1))
 * with the multiplier offset by 2^32: multiplying by odd φ is a bijection modulo 2^64, so
 * no prompt row's stream is ever a sample's stream of the same seed. */
static void draw_stream(rng_state *r, uint64_t seed, int row)
{
    rng_seed(r, seed ^ (0x9e3779b97f4a7c15ull * ((UINT64_C(1) << 32) + (uint64_t)row + 1)));
}

void be_prompt_extras(const be_seq *s, int row, const float *z, long V, double lse)
{
    if (s->score_start)
        for (int64_t q = s->score_start[row]; q < s->score_start[row + 1]; q++)
            s->score_lp_out[q] = (float)((double)z[s->score_ids[q]] - lse);
    int k = s->draw_k;
    if (k <= 0) return;
    if (k > LIMIT_TOPK_PROMPT_LOGPROBS) k = LIMIT_TOPK_PROMPT_LOGPROBS;
    int32_t *ids = s->draw_ids_out + (size_t)row * s->draw_k;
    float *lps = s->draw_lp_out + (size_t)row * s->draw_k;
    long best = 0;
    float mx = z[0];
    for (long v = 1; v < V; v++) if (z[v] > mx) { mx = z[v]; best = v; }
    if (s->draw_temperature == 0) {
        for (int j = 0; j < k; j++) ids[j] = (int32_t)best;
    } else {
        /* Each draw is the CPU sampler's choice without filters (cpu_choose.c): weights
         * exp((z − max) / T) as floats, u·Σ against their running sum in vocabulary order.
         * The k thresholds are visited in rising order in one pass over the vocabulary,
         * which picks what k separate passes would, without a [V] scratch row. */
        rng_state r;
        draw_stream(&r, s->draw_seed, row);
        double inv_t = 1.0 / s->draw_temperature, sum = 0, u[LIMIT_TOPK_PROMPT_LOGPROBS];
        int order[LIMIT_TOPK_PROMPT_LOGPROBS];
        for (long v = 0; v < V; v++) sum += (float)exp((z[v] - mx) * inv_t);
        for (int j = 0; j < k; j++) {
            u[j] = rng_uniform(&r) * sum;
            int i = j;
            while (i > 0 && u[order[i - 1]] > u[j]) { order[i] = order[i - 1]; i--; }
            order[i] = j;
        }
        double acc = 0;
        long last = best;
        int next = 0;
        for (long v = 0; v < V && next < k; v++) {
            float w = (float)exp((z[v] - mx) * inv_t);
            if (w == 0.0f) continue;
            acc += w;
            last = v;
            while (next < k && u[order[next]] < acc) ids[order[next++]] = (int32_t)v;
        }
        while (next < k) ids[order[next++]] = (int32_t)last; /* u·Σ at the very top (rounding) */
    }
    for (int j = 0; j < k; j++) lps[j] = (float)((double)z[ids[j]] - lse);
}
