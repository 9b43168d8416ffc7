/* cpu_choose.c — picking one token from a row of logits (the CPU backend's sampler; the
 * CUDA sampler's tests compare with it). The weights and the nucleus are backend.c's
 * (be_sample_weights, be_sample_nucleus), shared with be_sample_top. */
#include "backend/cpu/cpu_choose.h"

#include <math.h>

int32_t cpu_choose_token(const be_sample_req *r, const float *z, long V, rng_state *rng, float *w, uint64_t *keys,
                         float *lp)
{
    long best;
    double sum = be_sample_weights(r, z, V, w, keys, &best);
    if (r->temperature == 0) {
        *lp = (float)(-log(sum)); /* z[best] is the max */
        return (int32_t)best;
    }
    if (r->top_p < 1.0) {
        double cum;
        long keep = be_sample_nucleus(r, w, V, sum, keys, &cum);
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
