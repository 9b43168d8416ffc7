/* rng.h — small deterministic PRNG for reproducible initialisation (mkmodel, LoRA A).
 * splitmix64 to seed, xoshiro256** to draw, Box-Muller for normals. Header-only.
 * defines: rng_state, rng_seed, rng_next, rng_uniform, rng_normal, rng_hash_str */
#ifndef LOOM_MODEL_RNG_H
#define LOOM_MODEL_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct {
    uint64_t s[4];
    double spare;      /* second Box-Muller value */
    int has_spare;
} rng_state;

static inline uint64_t rng_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void rng_seed(rng_state *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = rng_splitmix64(&seed);
    r->has_spare = 0;
}

static inline uint64_t rng_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(rng_state *r)
{
    uint64_t *s = r->s, res = rng_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rng_rotl(s[3], 45);
    return res;
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double rng_uniform(rng_state *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

static inline double rng_normal(rng_state *r)
{
    if (r->has_spare) { r->has_spare = 0; return r->spare; }
    double u1 = 1.0 - rng_uniform(r), u2 = rng_uniform(r); /* u1 in (0, 1]: log is finite */
    double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586476925 * u2;
    r->spare = rad * sin(th);
    r->has_spare = 1;
    return rad * cos(th);
}

/* FNV-1a, to derive a per-name stream from one seed. */
static inline uint64_t rng_hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

#endif
