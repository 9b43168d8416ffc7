/* cpu_choose.c — picking one token from a row of logits (the CPU backend's sampler; the
 * CUDA sampler's tests compare with it). */
#include "backend/cpu/cpu_choose.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int32_t cpu_choose_token(const exe_sample_req *r, const float *z, long V, rng_state *rng, float *w, uint64_t *keys,
                         float *lp)
{
    float mx = z[0];
    long best = 0;
    for (long v = 1; v < V; v++) if (z[v] > mx) { mx = z[v]; best = v; }
    if (r->temperature == 0) {
        double sum = 0;
        for (long v = 0; v < V; v++) sum += expf(z[v] - mx);
        *lp = (float)(-log(sum)); /* z[best] == mx */
        return (int32_t)best;
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
    double sum = 0;
    for (long v = 0; v < V; v++) sum += w[v];
    if (r->top_p < 1.0) {
        /* Smallest set of most likely tokens whose mass reaches top_p. Weights are
         * non-negative floats, so their bit patterns sort like their values: the key
         * (bits << 32 | token) sorts by weight with a context-free comparator. */
        long n = 0;
        for (long v = 0; v < V; v++) {
            if (w[v] <= 0) continue;
            uint32_t bits;
            memcpy(&bits, &w[v], 4);
            keys[n++] = ((uint64_t)bits << 32) | (uint32_t)v;
        }
        qsort(keys, n, sizeof *keys, cmp_desc);
        double cum = 0, target = r->top_p * sum;
        long keep = 0;
        while (keep < n && (keep == 0 || cum < target)) cum += w[(uint32_t)keys[keep++]];
        double u = rng_uniform(rng) * cum, acc = 0;
        for (long i = 0; i < keep; i++) {
            int32_t v = (int32_t)(uint32_t)keys[i];
            acc += w[v];
            if (u < acc || i == keep - 1) {
                *lp = (float)log(w[v] / cum);
                return v;
            }
        }
    }
    double u = rng_uniform(rng) * sum, acc = 0;
    long pick = best;
    for (long v = 0; v < V; v++) {
        if (w[v] == 0.0f) continue;
        acc += w[v];
        pick = v;
        if (u < acc) break;
    }
    *lp = (float)log(w[pick] / sum);
    return (int32_t)pick;
}
