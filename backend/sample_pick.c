/* sample_pick.c — the arithmetic of picking a token that every sampler shares (see
 * backend.h: exe_sample_weights, exe_sample_nucleus, exe_sample_top): the CPU backend's
 * choice (cpu/cpu_choose.c) and the top_logprobs of both backends. Its own file, without
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

double exe_sample_weights(const exe_sample_req *r, const float *z, long V, float *w, uint64_t *keys, long *best)
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

long exe_sample_nucleus(const exe_sample_req *r, const float *w, long V, double sum, uint64_t *keys, double *cum)
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

void exe_sample_top(const exe_sample_stream *s, const float *z, long V, float *w, uint64_t *keys)
{
    const exe_sample_req *r = s->req;
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
    double sum = exe_sample_weights(r, z, V, w, keys, &best);
    if (r->temperature == 0) {
        /* greedy: the model's own distribution, log p = z − max − log Σ exp(z − max) */
        float mx = z[best];
        for (long v = 0; v < V; v++) top_insert(best_ids, xs, &n, k, (int32_t)v, z[v]);
        for (int i = 0; i < n; i++) lps[i] = (float)((z[best_ids[i]] - mx) - log(sum));
    } else if (r->top_p < 1.0) {
        double cum;
        long keep = exe_sample_nucleus(r, w, V, sum, keys, &cum);
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
