/* test_safetensors.c — safetensors reader/writer: round trips, dtype conversions, sharded
 * sets (and a sharded model load), and rejection of corrupt files without crashing. */
#include "model/mkmodel.h"
#include "model/model.h"
#include "model/rng.h"
#include "model/safetensors.h"
#define CHECK_QUIET   /* thousands of checks: print failures only */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmp[256];

static char *path_in(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmp, name);
    return p[k];
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(n ? n : 1);
    *len = fread(b, 1, n, f);
    fclose(f);
    return b;
}

static void spit(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

/* ---- round trip ---------------------------------------------------------------------- */

static void test_round_trip(void)
{
    float f32[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-20f, -7e30f};
    uint16_t bf[4] = {st_f32_to_bf16(1.0f), st_f32_to_bf16(-0.5f), st_f32_to_bf16(3.0f), st_f32_to_bf16(1e-3f)};
    uint16_t h[3] = {st_f32_to_f16(1.0f), st_f32_to_f16(-2.0f), st_f32_to_f16(0.1f)};
    int32_t i32[5] = {1, -2, 3, 2147483647, -2147483647 - 1};
    int64_t i64[2] = {1LL << 40, -5};
    double f64[1] = {3.141592653589793};
    st_write_desc d[] = {
        {"a.weight", ST_F32, 2, {2, 3}, f32}, {"b.bf16", ST_BF16, 2, {2, 2}, bf}, {"c", ST_F16, 1, {3}, h},
        {"ids", ST_I32, 1, {5}, i32}, {"big", ST_I64, 1, {2}, i64}, {"scalar", ST_F64, 0, {0}, f64},
        {"empty", ST_F32, 2, {0, 4}, NULL},
    };
    int n = sizeof d / sizeof d[0];
    const char *meta[] = {"step", "3", NULL};
    char err[256];
    CHECK(st_write(path_in("rt.safetensors"), d, n, meta, err, sizeof err) == 0, "st_write: %s", err);
    size_t len;
    uint8_t *raw = slurp(path_in("rt.safetensors"), &len);
    CHECK(raw != NULL, "read back");
    if (!raw) return;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
    CHECK(hl % 8 == 0 && hl + 8 <= len, "header length %llu not padded to 8", (unsigned long long)hl);
    CHECK(raw[8] == '{' && strstr((char *)raw + 8, "\"__metadata__\":{\"format\":\"pt\",\"step\":\"3\"}"),
          "metadata first with format pt");
    CHECK(raw[8 + hl - 1] == ' ' || raw[8 + hl - 1] == '}', "padding is spaces");

    st_file *f;
    CHECK(st_open(path_in("rt.safetensors"), &f, err, sizeof err) == 0, "st_open: %s", err);
    if (f) {
        CHECK(st_count(f) == n, "count %d", st_count(f));
        CHECK(st_metadata(f, "format") && !strcmp(st_metadata(f, "format"), "pt") && !strcmp(st_metadata(f, "step"), "3"),
              "st_metadata");
        size_t expect_off = 0;
        for (int i = 0; i < n; i++) { /* st_get is in offset order = write order here */
            const st_tensor *t = st_get(f, i);
            CHECK(t && !strcmp(t->name, d[i].name) && t->dtype == d[i].dtype && t->ndim == d[i].ndim, "tensor %d", i);
            CHECK(t->data == st_get(f, 0)->data + expect_off, "offsets of %s not contiguous", d[i].name);
            size_t nb = st_dtype_size(d[i].dtype);
            for (int k = 0; k < d[i].ndim; k++) nb *= d[i].shape[k];
            CHECK(t->nbytes == nb && (nb == 0 || memcmp(t->data, d[i].data, nb) == 0), "bytes of %s", d[i].name);
            expect_off += nb;
        }
        CHECK(8 + hl + expect_off == len, "data contiguous, file size %zu", len);
        const st_tensor *t = st_find(f, "b.bf16");
        float out[4];
        CHECK(t && st_tensor_to_f32(t, out, 4, err, sizeof err) == 0 && out[0] == 1.0f && out[1] == -0.5f && out[2] == 3.0f &&
                  fabsf(out[3] - 1e-3f) < 1e-5f,
              "bf16 → f32");
        t = st_find(f, "c");
        CHECK(t && st_tensor_to_f32(t, out, 3, err, sizeof err) == 0 && out[0] == 1.0f && out[1] == -2.0f &&
                  fabsf(out[2] - 0.1f) < 1e-4f,
              "f16 → f32");
        t = st_find(f, "ids");
        CHECK(t && st_tensor_to_f32(t, out, 5, err, sizeof err) == -1, "int tensor to f32 refused");
        t = st_find(f, "a.weight");
        CHECK(t && st_tensor_to_f32(t, out, 5, err, sizeof err) == -1, "count mismatch refused");
        CHECK(st_find(f, "nope") == NULL && st_find(f, "scalar") && st_find(f, "scalar")->numel == 1, "find");
        st_close(f);
    }
    /* memory writer = file writer, and the memory reader accepts it */
    uint8_t *mem;
    size_t mlen;
    CHECK(st_write_mem(d, n, meta, &mem, &mlen, err, sizeof err) == 0 && mlen == len && !memcmp(mem, raw, len),
          "st_write_mem differs from st_write");
    CHECK(st_open_mem(mem, mlen, &f, err, sizeof err) == 0, "st_open_mem: %s", err);
    st_close(f);
    free(mem);
    free(raw);
    st_write_desc dup[] = {{"x", ST_F32, 1, {1}, f32}, {"x", ST_F32, 1, {1}, f32}};
    CHECK(st_write(path_in("dup.safetensors"), dup, 2, NULL, err, sizeof err) == -1, "duplicate names written");
}

/* ---- conversions --------------------------------------------------------------------- */

static void test_conversions(void)
{
    CHECK(st_f32_to_bf16(1.0f) == 0x3f80, "bf16(1)");
    float f;
    uint32_t u = 0x3f808000u; /* halfway between 0x3f80 and 0x3f81: ties to even */
    memcpy(&f, &u, 4);
    CHECK(st_f32_to_bf16(f) == 0x3f80, "bf16 tie to even (down)");
    u = 0x3f818000u;
    memcpy(&f, &u, 4);
    CHECK(st_f32_to_bf16(f) == 0x3f82, "bf16 tie to even (up)");
    u = 0x3f808001u;
    memcpy(&f, &u, 4);
    CHECK(st_f32_to_bf16(f) == 0x3f81, "bf16 above half rounds up");
    CHECK(isnan(st_bf16_to_f32(st_f32_to_bf16(NAN))) && isinf(st_bf16_to_f32(st_f32_to_bf16(INFINITY))), "bf16 nan/inf");
    int bad = 0;
    for (uint32_t x = 0; x < 65536; x++) { /* every bf16 survives the round trip through f32 */
        float v = st_bf16_to_f32((uint16_t)x);
        if (!isnan(v) && st_f32_to_bf16(v) != x) bad++;
    }
    CHECK(bad == 0, "%d bf16 values do not round-trip", bad);
    bad = 0;
    for (uint32_t x = 0; x < 65536; x++) {
        float v = st_f16_to_f32((uint16_t)x);
        if (!isnan(v) && st_f32_to_f16(v) != x) bad++;
    }
    CHECK(bad == 0, "%d f16 values do not round-trip", bad);
    CHECK(st_f16_to_f32(0x0001) == ldexpf(1.0f, -24) && st_f16_to_f32(0x7bff) == 65504.0f && st_f16_to_f32(0xc000) == -2.0f,
          "f16 subnormal / max / negative");
    CHECK(st_f32_to_f16(65520.0f) == 0x7c00 && st_f32_to_f16(1e-9f) == 0, "f16 overflow to inf, underflow to 0");
    /* bf16 rounding error is at most half an ulp (2^-8 relative) */
    rng_state r;
    rng_seed(&r, 5);
    double worst = 0;
    for (int i = 0; i < 100000; i++) {
        float v = (float)rng_normal(&r);
        worst = fmax(worst, fabs(st_bf16_to_f32(st_f32_to_bf16(v)) - v) / fabs(v));
    }
    CHECK(worst <= 1.0 / 256 + 1e-9, "bf16 relative rounding error %g", worst);
}

/* ---- corrupt files ------------------------------------------------------------------- */

static int open_bytes(const uint8_t *b, size_t n, char *err, size_t errlen)
{
    spit(path_in("bad.safetensors"), b, n);
    st_file *f;
    int rc = st_open(path_in("bad.safetensors"), &f, err, errlen);
    if (rc == 0) st_close(f);
    return rc;
}

static int open_header(const char *json, size_t datalen, char *err, size_t errlen)
{
    size_t hl = strlen(json), n = 8 + hl + datalen;
    uint8_t *b = calloc(1, n);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    int rc = open_bytes(b, n, err, errlen);
    free(b);
    return rc;
}

static void test_corrupt(void)
{
    char err[256];
    uint8_t small[4] = {1, 2, 3, 4};
    CHECK(open_bytes(small, 4, err, sizeof err) == -1, "4-byte file accepted");
    uint8_t hugehl[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    CHECK(open_bytes(hugehl, 16, err, sizeof err) == -1 && strstr(err, "header length"), "huge header length: %s", err);
    const struct { const char *json; size_t data; const char *why; } bad[] = {
        {"not json", 0, "not JSON"},
        {"[1, 2]   ", 0, "array header"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}", 8, "truncated JSON"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 16]}}", 8, "offsets past the end"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8, "size/shape mismatch"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8, "negative dim"},
        {"{\"a\": {\"dtype\": \"Q4\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, "unknown dtype"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8, "begin > end"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0]}}", 8, "one offset"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}}", 8, "overflowing shape"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, \"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, "duplicate key"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", 8, "too many dims"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": \"2\", \"data_offsets\": [0, 8]}}", 8, "shape not a list"},
        {"{\"a\": 5}", 8, "entry not an object"},
        {"{\"__metadata__\": [1], \"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, "metadata not an object"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0.5, 8]}}", 8, "float offset"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK(open_header(bad[i].json, bad[i].data, err, sizeof err) == -1 && err[0], "%s accepted", bad[i].why);
    }
    CHECK(open_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, err, sizeof err) == 0,
          "the valid control case is rejected: %s", err);
    CHECK(st_open(path_in("does-not-exist"), &(st_file *){0}, err, sizeof err) == -1, "missing file");

    /* Mutation fuzz: flip/truncate bytes of a valid file; every outcome must be a clean
     * accept or a clean error, and accepted tensors must lie inside the file. */
    float v[64];
    for (int i = 0; i < 64; i++) v[i] = (float)i;
    st_write_desc d[] = {{"model.layers.0.w", ST_F32, 2, {8, 4}, v}, {"b", ST_BF16, 1, {16}, v}, {"c", ST_F32, 1, {8}, v}};
    uint8_t *good;
    size_t glen;
    st_write_mem(d, 3, NULL, &good, &glen, err, sizeof err);
    rng_state r;
    rng_seed(&r, 1);
    uint8_t *buf = malloc(glen);
    int accepted = 0, inside = 1;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, good, glen);
        size_t n = glen;
        int flips = 1 + (int)(rng_next(&r) % 4);
        for (int k = 0; k < flips; k++) buf[rng_next(&r) % glen] = (uint8_t)rng_next(&r);
        if (rng_next(&r) % 4 == 0) n = rng_next(&r) % glen;
        st_file *f;
        if (st_open_mem(buf, n, &f, err, sizeof err) == 0) {
            accepted++;
            for (int i = 0; i < st_count(f); i++) {
                const st_tensor *t = st_get(f, i);
                inside &= t->data >= buf && t->data + t->nbytes <= buf + n;
            }
            st_close(f);
        }
    }
    CHECK(inside, "an accepted mutated file has a tensor outside the buffer");
    printf("  fuzz: 3000 mutated files, %d accepted (all tensors in bounds)\n", accepted);
    free(buf);
    free(good);
}

/* ---- sharded ------------------------------------------------------------------------- */

static void test_sharded(void)
{
    char err[512], dir[512];
    mkmodel_opts o;
    mkmodel_defaults(&o, "llama", "tiny", err, sizeof err);
    snprintf(dir, sizeof dir, "%s/one", tmp);
    o.out_dir = dir;
    CHECK(mkmodel_write(&o, err, sizeof err) == 0, "mkmodel: %s", err);
    /* split the single file into two shards + index */
    st_file *f;
    snprintf(dir, sizeof dir, "%s/one/model.safetensors", tmp);
    if (st_open(dir, &f, err, sizeof err) != 0) { CHECK(0, "open: %s", err); return; }
    int n = st_count(f), half = n / 2;
    st_write_desc *d = calloc(n, sizeof *d);
    for (int i = 0; i < n; i++) {
        const st_tensor *t = st_get(f, i);
        d[i].name = t->name;
        d[i].dtype = t->dtype;
        d[i].ndim = t->ndim;
        memcpy(d[i].shape, t->shape, sizeof d[i].shape);
        d[i].data = t->data;
    }
    snprintf(dir, sizeof dir, "%s/two", tmp);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s/one/config.json' '%s/'", dir, tmp, dir);
    CHECK(system(cmd) == 0, "mkdir/cp");
    CHECK(st_write(path_in("two/model-00001-of-00002.safetensors"), d, half, NULL, err, sizeof err) == 0 &&
              st_write(path_in("two/model-00002-of-00002.safetensors"), d + half, n - half, NULL, err, sizeof err) == 0,
          "write shards: %s", err);
    FILE *ix = fopen(path_in("two/model.safetensors.index.json"), "w");
    fprintf(ix, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (int i = 0; i < n; i++) fprintf(ix, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "", d[i].name, i < half ? 1 : 2);
    fprintf(ix, "}}\n");
    fclose(ix);
    st_set *s;
    CHECK(st_set_open_dir(dir, &s, err, sizeof err) == 0 && st_set_num_files(s) == 2, "st_set_open_dir: %s", err);
    if (s) {
        CHECK(st_set_find(s, d[0].name) && st_set_find(s, d[n - 1].name) && !st_set_find(s, "nope"), "st_set_find");
        st_set_close(s);
    }
    model_files *a = NULL, *b = NULL;
    snprintf(cmd, sizeof cmd, "%s/one", tmp);
    CHECK(model_open(cmd, &a, err, sizeof err) == 0, "open single: %s", err);
    CHECK(model_open(dir, &b, err, sizeof err) == 0, "open sharded: %s", err);
    if (a && b) {
        const st_tensor *ta[64], *tb[64];
        int na = model_tensor_list(a, ta), nb = model_tensor_list(b, tb);
        bool same = na == nb && na > 0 && na <= 64;
        for (int t = 0; same && t < na; t++)
            same = ta[t]->dtype == tb[t]->dtype && ta[t]->nbytes == tb[t]->nbytes && !memcmp(ta[t]->data, tb[t]->data, ta[t]->nbytes);
        CHECK(same, "sharded != single");
    }
    model_close(a);
    model_close(b);
    free(d);
    st_close(f);
    /* an index pointing outside the directory is refused */
    ix = fopen(path_in("two/model.safetensors.index.json"), "w");
    fprintf(ix, "{\"weight_map\": {\"x\": \"../one/model.safetensors\"}}");
    fclose(ix);
    CHECK(st_set_open_dir(dir, &s, err, sizeof err) == -1 && strstr(err, "shard"), "escaping shard name: %s", err);
}

int main(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/loom_st_XXXXXX");
    if (!mkdtemp(tmp)) { perror("mkdtemp"); return 2; }
    test_round_trip();
    test_conversions();
    test_corrupt();
    test_sharded();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return check_summary();
}
