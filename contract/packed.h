/* packed.h: the little-endian packing of the payload codecs (fb_payload.c, fb_result.c).
 * Packed arrays are little-endian, as on the protobuf wire and on every host Loom runs
 * on, so that copying one is a memcpy there; a big-endian host swaps element by element.
 * Readers take any alignment (a packed value sits wherever its column's bytes do). */
#pragma once
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define PACKED_LE_HOST 1
#else
#define PACKED_LE_HOST 0
#endif

static inline uint32_t packed_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void packed_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++, v >>= 8) p[i] = (uint8_t)v;
}

static inline uint64_t packed_get_u64(const uint8_t *p) {
    return (uint64_t)packed_get_u32(p) | (uint64_t)packed_get_u32(p + 4) << 32;
}

static inline void packed_put_u64(uint8_t *p, uint64_t v) {
    packed_put_u32(p, (uint32_t)v);
    packed_put_u32(p + 4, (uint32_t)(v >> 32));
}

static inline float packed_get_f32(const uint8_t *p) {
    uint32_t u = packed_get_u32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline double packed_get_f64(const uint8_t *p) {
    uint64_t u = packed_get_u64(p);
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static inline void packed_put_f64(uint8_t *p, double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    packed_put_u64(p, u);
}

/* n 4-byte elements (int32 or float32) from packed bytes into host order. */
static inline void packed_read4(void *dst, const uint8_t *src, size_t n) {
    if (PACKED_LE_HOST) {
        memcpy(dst, src, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) ((uint32_t *)dst)[i] = packed_get_u32(src + 4 * i);
}

/* n float32 values as packed bytes, negative zero written as zero: the JSON text these
 * arrays replaced went through jsonb, whose numbers have no negative zero, so the
 * executor and clients got zero there; they still do. */
static inline void packed_write_f32(uint8_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float f = src[i] == 0.0f ? 0.0f : src[i];
        uint32_t u;
        memcpy(&u, &f, 4);
        packed_put_u32(dst + 4 * i, u);
    }
}
