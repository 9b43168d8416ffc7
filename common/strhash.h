/* strhash.h: FNV-1a over n bytes, for the fixed-size tables that bucket strings (request
 * ids, model ids, vocabulary entries). Not for anything an attacker's choice of keys could
 * hurt beyond a slower lookup: collisions only share a bucket. */
#pragma once
#include <stddef.h>
#include <stdint.h>

static inline uint32_t str_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}
