/* safetensors.c — safetensors reader (mmap, fully bounds-checked), streaming writer, and
 * sharded-model sets. See safetensors.h for the format and the conventions. */
#include "model/safetensors.h"
#include "common/err.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation refuses headers above 100 MB; so do we, before allocating. */
#define ST_MAX_HEADER (100u * 1024u * 1024u)

static const char *const st_names[ST_DTYPE_COUNT] = {
    "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"};
static const size_t st_sizes[ST_DTYPE_COUNT] = {4, 2, 2, 8, 8, 4, 2, 1, 1, 1};

const char *st_dtype_name(st_dtype d) { return (unsigned)d < ST_DTYPE_COUNT ? st_names[d] : "?"; }
size_t st_dtype_size(st_dtype d) { return (unsigned)d < ST_DTYPE_COUNT ? st_sizes[d] : 0; }

int st_dtype_parse(const char *s, st_dtype *out)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (strcmp(s, st_names[i]) == 0) { *out = (st_dtype)i; return 0; }
    return -1;
}

/* ---- scalar conversions ------------------------------------------------------------- */

float st_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t st_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* keep NaN a NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* nearest even */
    return (uint16_t)(u >> 16);
}

float st_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t st_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, aexp = (u >> 23) & 0xffu, man = u & 0x7fffffu;
    if (aexp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    int e = (int)aexp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* subnormal or zero in f16 */
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - e;
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++; /* may carry into exp: ok */
    return (uint16_t)(sign | half);
}

/* ---- reading ------------------------------------------------------------------------ */

struct st_file {
    void *map;            /* mmap base, or NULL for st_open_mem */
    size_t map_len;
    const uint8_t *base;  /* file bytes */
    size_t len;
    int n;
    st_tensor *t;         /* sorted by data offset */
    const st_tensor **by_name; /* into t, sorted by name */
    json_t *meta;         /* "__metadata__" object or NULL */
    char *names;          /* one block for all names */
};

static int st_cmp_name(const void *a, const void *b)
{
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}
static int st_cmp_offset(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* Reads a non-negative JSON integer; false for anything else. */
static bool st_json_u64(const json_t *j, uint64_t *out)
{
    if (!json_is_integer(j) || json_integer_value(j) < 0) return false;
    *out = (uint64_t)json_integer_value(j);
    return true;
}

static int st_parse(st_file *f, char *err, size_t errlen)
{
    if (f->len < 8) { err_set(err, errlen, "safetensors: file too short (%zu bytes)", f->len); return -1; }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->base[i];
    if (hlen > ST_MAX_HEADER || hlen > f->len - 8) {
        err_set(err, errlen, "safetensors: header length %llu exceeds file size %zu",
               (unsigned long long)hlen, f->len);
        return -1;
    }
    if (hlen < 2 || f->base[8] != '{') { err_set(err, errlen, "safetensors: header is not a JSON object"); return -1; }
    const uint8_t *data = f->base + 8 + hlen;
    size_t dlen = f->len - 8 - (size_t)hlen;

    json_error_t je;
    json_t *root = json_loadb((const char *)f->base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        err_set(err, errlen, "safetensors: bad header JSON: %s", root ? "not an object" : je.text);
        json_decref(root);
        return -1;
    }
    size_t cap = json_object_size(root), namebytes = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) namebytes += strlen(key) + 1;
    f->t = calloc(cap ? cap : 1, sizeof *f->t);
    f->by_name = calloc(cap ? cap : 1, sizeof *f->by_name);
    f->names = malloc(namebytes ? namebytes : 1);
    if (!f->t || !f->by_name || !f->names) { err_set(err, errlen, "safetensors: out of memory"); json_decref(root); return -1; }
    char *np = f->names;
    int rc = -1;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) { err_set(err, errlen, "safetensors: __metadata__ is not an object"); goto out; }
            f->meta = json_incref(val);
            continue;
        }
        st_tensor *t = &f->t[f->n];
        const json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
                     *jo = json_object_get(val, "data_offsets");
        if (!json_is_object(val) || !json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
            json_array_size(jo) != 2) {
            err_set(err, errlen, "safetensors: tensor '%s': malformed entry", key);
            goto out;
        }
        if (st_dtype_parse(json_string_value(jd), &t->dtype) != 0) {
            err_set(err, errlen, "safetensors: tensor '%s': unknown dtype '%s'", key, json_string_value(jd));
            goto out;
        }
        size_t nd = json_array_size(js);
        if (nd > ST_MAX_DIMS) { err_set(err, errlen, "safetensors: tensor '%s': %zu dims", key, nd); goto out; }
        t->ndim = (int)nd;
        /* numel overflow: every dim ≤ file size, product checked stepwise against it. */
        uint64_t numel = 1;
        for (size_t d = 0; d < nd; d++) {
            uint64_t s;
            if (!st_json_u64(json_array_get(js, d), &s) || s > f->len) {
                err_set(err, errlen, "safetensors: tensor '%s': bad shape", key);
                goto out;
            }
            t->shape[d] = (int64_t)s;
            numel = (s == 0) ? 0 : numel * s;
            if (numel > f->len) { err_set(err, errlen, "safetensors: tensor '%s': shape larger than file", key); goto out; }
        }
        uint64_t b, e;
        if (!st_json_u64(json_array_get(jo, 0), &b) || !st_json_u64(json_array_get(jo, 1), &e) || b > e ||
            e > dlen) {
            err_set(err, errlen, "safetensors: tensor '%s': data_offsets outside the data (%zu bytes)", key, dlen);
            goto out;
        }
        if (e - b != numel * st_dtype_size(t->dtype)) {
            err_set(err, errlen, "safetensors: tensor '%s': %llu bytes for %llu %s elements", key,
                   (unsigned long long)(e - b), (unsigned long long)numel, st_dtype_name(t->dtype));
            goto out;
        }
        t->numel = (int64_t)numel;
        t->data = data + b;
        t->nbytes = (size_t)(e - b);
        size_t kl = strlen(key) + 1;
        memcpy(np, key, kl);
        t->name = np;
        np += kl;
        f->n++;
    }
    /* Offset order is the file's natural order (and jansson's own order is a hash order in
     * older releases); names are sorted separately for st_find. */
    qsort(f->t, f->n, sizeof *f->t, st_cmp_offset);
    for (int i = 0; i < f->n; i++) f->by_name[i] = &f->t[i];
    qsort(f->by_name, f->n, sizeof *f->by_name, st_cmp_name);
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int st_open_mem(const void *buf, size_t len, st_file **out, char *err, size_t errlen)
{
    *out = NULL;
    st_file *f = calloc(1, sizeof *f);
    if (!f) { err_set(err, errlen, "safetensors: out of memory"); return -1; }
    f->base = buf;
    f->len = len;
    if (st_parse(f, err, errlen) != 0) { st_close(f); return -1; }
    *out = f;
    return 0;
}

int st_open(const char *path, st_file **out, char *err, size_t errlen)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { err_set(err, errlen, "safetensors: open %s: %s", path, strerror(errno)); return -1; }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        err_set(err, errlen, "safetensors: %s is not a regular file", path);
        close(fd);
        return -1;
    }
    size_t len = (size_t)sb.st_size;
    void *map = NULL;
    if (len > 0) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            err_set(err, errlen, "safetensors: mmap %s: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
    }
    close(fd);
    st_file *f = calloc(1, sizeof *f);
    if (!f) { if (map) munmap(map, len); err_set(err, errlen, "safetensors: out of memory"); return -1; }
    f->map = map;
    f->map_len = len;
    f->base = map;
    f->len = len;
    if (st_parse(f, err, errlen) != 0) {
        size_t l = strlen(err ? err : "");
        if (err && l + 4 < errlen) snprintf(err + l, errlen - l, " (%s)", path);
        st_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

void st_close(st_file *f)
{
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    json_decref(f->meta);
    free(f->t);
    free(f->by_name);
    free(f->names);
    free(f);
}

int st_count(const st_file *f) { return f->n; }
const st_tensor *st_get(const st_file *f, int i) { return (i >= 0 && i < f->n) ? &f->t[i] : NULL; }

const st_tensor *st_find(const st_file *f, const char *name)
{
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(name, f->by_name[mid]->name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) hi = mid - 1; else lo = mid + 1;
    }
    return NULL;
}

const char *st_metadata(const st_file *f, const char *key)
{
    return f->meta ? json_string_value(json_object_get(f->meta, key)) : NULL;
}

int st_tensor_to_f32(const st_tensor *t, float *dst, size_t count, char *err, size_t errlen)
{
    if (count != (size_t)t->numel) {
        err_set(err, errlen, "safetensors: tensor '%s' has %lld elements, expected %zu", t->name,
               (long long)t->numel, count);
        return -1;
    }
    const uint8_t *p = t->data;
    /* memcpy per element: the mapping gives no alignment guarantee for odd headers. */
    switch (t->dtype) {
    case ST_F32: memcpy(dst, p, count * 4); return 0;
    case ST_BF16:
        for (size_t i = 0; i < count; i++) { uint16_t h; memcpy(&h, p + 2 * i, 2); dst[i] = st_bf16_to_f32(h); }
        return 0;
    case ST_F16:
        for (size_t i = 0; i < count; i++) { uint16_t h; memcpy(&h, p + 2 * i, 2); dst[i] = st_f16_to_f32(h); }
        return 0;
    case ST_F64:
        for (size_t i = 0; i < count; i++) { double d; memcpy(&d, p + 8 * i, 8); dst[i] = (float)d; }
        return 0;
    default:
        err_set(err, errlen, "safetensors: tensor '%s' has non-float dtype %s", t->name, st_dtype_name(t->dtype));
        return -1;
    }
}

/* ---- writing ------------------------------------------------------------------------ */

/* Builds the padded header (8-byte length prefix included) into a malloc'd buffer. */
static int st_build_header(const st_write_desc *d, int n, const char *const *metadata, uint8_t **out,
                           size_t *outlen, uint64_t *datalen, char *err, size_t errlen)
{
    json_t *root = json_object(), *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    for (int i = 0; metadata && metadata[i] && metadata[i + 1]; i += 2)
        json_object_set_new(meta, metadata[i], json_string(metadata[i + 1]));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t es = st_dtype_size(d[i].dtype);
        if (!es || !d[i].name || d[i].ndim < 0 || d[i].ndim > ST_MAX_DIMS || strcmp(d[i].name, "__metadata__") == 0) {
            err_set(err, errlen, "safetensors: bad descriptor %d", i);
            json_decref(root);
            return -1;
        }
        json_t *shape = json_array();
        uint64_t numel = 1;
        for (int k = 0; k < d[i].ndim; k++) {
            if (d[i].shape[k] < 0) { json_decref(shape); json_decref(root); err_set(err, errlen, "safetensors: negative dim"); return -1; }
            json_array_append_new(shape, json_integer(d[i].shape[k]));
            numel *= (uint64_t)d[i].shape[k];
        }
        json_t *t = json_object();
        json_object_set_new(t, "dtype", json_string(st_dtype_name(d[i].dtype)));
        json_object_set_new(t, "shape", shape);
        json_object_set_new(t, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + numel * es)));
        if (json_object_get(root, d[i].name)) {
            err_set(err, errlen, "safetensors: duplicate tensor name '%s'", d[i].name);
            json_decref(t);
            json_decref(root);
            return -1;
        }
        json_object_set_new(root, d[i].name, t);
        off += numel * es;
    }
    char *js = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!js) { err_set(err, errlen, "safetensors: header encoding failed"); return -1; }
    size_t jl = strlen(js), padded = (jl + 7) & ~(size_t)7;
    uint8_t *h = malloc(8 + padded);
    if (!h) { free(js); err_set(err, errlen, "safetensors: out of memory"); return -1; }
    for (int i = 0; i < 8; i++) h[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(h + 8, js, jl);
    memset(h + 8 + jl, ' ', padded - jl);
    free(js);
    *out = h;
    *outlen = 8 + padded;
    *datalen = off;
    return 0;
}

static size_t st_desc_bytes(const st_write_desc *d)
{
    size_t b = st_dtype_size(d->dtype);
    for (int k = 0; k < d->ndim; k++) b *= (size_t)d->shape[k];
    return b;
}

int st_write_stream(const char *path, const st_write_desc *d, int n, const char *const *metadata,
                    st_fill_fn fill, void *user, char *err, size_t errlen)
{
    uint8_t *hdr;
    size_t hlen;
    uint64_t dlen;
    if (st_build_header(d, n, metadata, &hdr, &hlen, &dlen, err, errlen) != 0) return -1;
    size_t maxb = 0;
    for (int i = 0; i < n; i++) if (st_desc_bytes(&d[i]) > maxb) maxb = st_desc_bytes(&d[i]);
    char *tmp = malloc(strlen(path) + 8);
    uint8_t *buf = malloc(maxb ? maxb : 1);
    FILE *fp = NULL;
    int rc = -1;
    if (!tmp || !buf) { err_set(err, errlen, "safetensors: out of memory (%zu bytes)", maxb); goto out; }
    sprintf(tmp, "%s.tmp", path);
    fp = fopen(tmp, "wb");
    if (!fp) { err_set(err, errlen, "safetensors: create %s: %s", tmp, strerror(errno)); goto out; }
    if (fwrite(hdr, 1, hlen, fp) != hlen) goto ioerr;
    for (int i = 0; i < n; i++) {
        size_t nb = st_desc_bytes(&d[i]);
        if (fill(user, i, buf, nb, err, errlen) != 0) goto out;
        if (nb && fwrite(buf, 1, nb, fp) != nb) goto ioerr;
    }
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) goto ioerr;
    if (fclose(fp) != 0) { fp = NULL; goto ioerr; }
    fp = NULL;
    if (rename(tmp, path) != 0) { err_set(err, errlen, "safetensors: rename to %s: %s", path, strerror(errno)); goto out; }
    rc = 0;
    goto out;
ioerr:
    err_set(err, errlen, "safetensors: write %s: %s", tmp, strerror(errno));
out:
    if (fp) fclose(fp);
    if (rc != 0 && tmp) unlink(tmp);
    free(tmp);
    free(buf);
    free(hdr);
    return rc;
}

static int st_fill_copy(void *user, int i, void *dst, size_t nbytes, char *err, size_t errlen)
{
    const st_write_desc *d = user;
    if (nbytes && !d[i].data) { err_set(err, errlen, "safetensors: tensor '%s' has no data", d[i].name); return -1; }
    if (nbytes) memcpy(dst, d[i].data, nbytes);
    return 0;
}

int st_write(const char *path, const st_write_desc *d, int n, const char *const *metadata, char *err, size_t errlen)
{
    return st_write_stream(path, d, n, metadata, st_fill_copy, (void *)d, err, errlen);
}

int st_write_mem(const st_write_desc *d, int n, const char *const *metadata, uint8_t **out, size_t *outlen,
                 char *err, size_t errlen)
{
    uint8_t *hdr;
    size_t hlen;
    uint64_t dlen;
    *out = NULL;
    *outlen = 0;
    if (st_build_header(d, n, metadata, &hdr, &hlen, &dlen, err, errlen) != 0) return -1;
    uint8_t *buf = realloc(hdr, hlen + (size_t)dlen);
    if (!buf) { free(hdr); err_set(err, errlen, "safetensors: out of memory"); return -1; }
    size_t off = hlen;
    for (int i = 0; i < n; i++) {
        size_t nb = st_desc_bytes(&d[i]);
        if (st_fill_copy((void *)d, i, buf + off, nb, err, errlen) != 0) { free(buf); return -1; }
        off += nb;
    }
    *out = buf;
    *outlen = off;
    return 0;
}

/* ---- sharded sets ------------------------------------------------------------------- */

struct st_set {
    int nfiles;
    st_file **files;
    json_t *weight_map; /* name → shard file name; NULL for a single file */
    char **file_names;
};

static int st_set_add(st_set *s, const char *dir, const char *fname, char *err, size_t errlen)
{
    for (int i = 0; i < s->nfiles; i++) if (strcmp(s->file_names[i], fname) == 0) return 0;
    /* Shard names come from a file we did not write: keep them inside the model directory. */
    if (strchr(fname, '/') || strstr(fname, "..") || !*fname) {
        err_set(err, errlen, "safetensors: bad shard file name '%s' in index", fname);
        return -1;
    }
    st_file **nf = realloc(s->files, (s->nfiles + 1) * sizeof *nf);
    char **nn = nf ? realloc(s->file_names, (s->nfiles + 1) * sizeof *nn) : NULL;
    if (nf) s->files = nf;
    if (nn) s->file_names = nn;
    if (!nf || !nn) { err_set(err, errlen, "safetensors: out of memory"); return -1; }
    size_t pl = strlen(dir) + strlen(fname) + 2;
    char *path = malloc(pl);
    if (!path) { err_set(err, errlen, "safetensors: out of memory"); return -1; }
    snprintf(path, pl, "%s/%s", dir, fname);
    st_file *f;
    int rc = st_open(path, &f, err, errlen);
    free(path);
    if (rc != 0) return -1;
    s->files[s->nfiles] = f;
    s->file_names[s->nfiles] = strdup(fname);
    s->nfiles++;
    return 0;
}

int st_set_open_dir(const char *dir, st_set **out, char *err, size_t errlen)
{
    *out = NULL;
    st_set *s = calloc(1, sizeof *s);
    if (!s) { err_set(err, errlen, "safetensors: out of memory"); return -1; }
    size_t pl = strlen(dir) + 64;
    char *ipath = malloc(pl);
    if (!ipath) { free(s); err_set(err, errlen, "safetensors: out of memory"); return -1; }
    snprintf(ipath, pl, "%s/model.safetensors.index.json", dir);
    if (access(ipath, F_OK) == 0) {
        json_error_t je;
        json_t *idx = json_load_file(ipath, 0, &je);
        json_t *wm = idx ? json_object_get(idx, "weight_map") : NULL;
        if (!json_is_object(wm)) {
            err_set(err, errlen, "safetensors: %s: %s", ipath, idx ? "no weight_map object" : je.text);
            json_decref(idx);
            goto fail;
        }
        s->weight_map = json_incref(wm);
        json_decref(idx);
        const char *k;
        json_t *v;
        json_object_foreach(s->weight_map, k, v) {
            if (!json_is_string(v)) { err_set(err, errlen, "safetensors: weight_map['%s'] is not a string", k); goto fail; }
            if (st_set_add(s, dir, json_string_value(v), err, errlen) != 0) goto fail;
        }
    } else {
        if (st_set_add(s, dir, "model.safetensors", err, errlen) != 0) goto fail;
    }
    free(ipath);
    *out = s;
    return 0;
fail:
    free(ipath);
    st_set_close(s);
    return -1;
}

void st_set_close(st_set *s)
{
    if (!s) return;
    for (int i = 0; i < s->nfiles; i++) { st_close(s->files[i]); free(s->file_names[i]); }
    free(s->files);
    free(s->file_names);
    json_decref(s->weight_map);
    free(s);
}

int st_set_num_files(const st_set *s) { return s->nfiles; }

const st_tensor *st_set_find(const st_set *s, const char *name)
{
    if (!s->weight_map) return s->nfiles ? st_find(s->files[0], name) : NULL;
    const char *fname = json_string_value(json_object_get(s->weight_map, name));
    if (!fname) return NULL;
    for (int i = 0; i < s->nfiles; i++)
        if (strcmp(s->file_names[i], fname) == 0) return st_find(s->files[i], name);
    return NULL;
}
