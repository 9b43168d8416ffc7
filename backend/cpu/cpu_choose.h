/* cpu_choose.h — one token from a row of logits under a request's temperature / top-k /
 * top-p, with one draw from the sample's stream (none when greedy).
 * defines: cpu_choose_token */
#pragma once
#include "backend/backend.h"
#include "model/rng.h"

#include <stdint.h>

/* z: V logits. w: V floats of scratch, keys: V uint64 of scratch. Returns the token; *lp
 * its log-prob under the distribution sampled from (see backend.h). */
int32_t cpu_choose_token(const be_sample_req *r, const float *z, long V, rng_state *rng, float *w, uint64_t *keys,
                         float *lp);
