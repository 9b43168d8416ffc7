/* blobstore.h: content-addressed storage for adapter blobs. A blob's name is the
 * sha256 of its bytes; writes are atomic (temp file + fsync + rename + fsync of the
 * directory) and deduplicated; every read is verified against the digest, so a
 * corrupted blob is reported, never silently used. The store sits behind a table of
 * functions so an object store can be added beside the local directory. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BLOB_DIGEST_HEX 65   /* 64 hex characters + NUL */

typedef struct blobstore blobstore;

/* One stored blob as listed by the store (GC's orphan sweep ages blobs by mtime). */
typedef struct {
    char digest[BLOB_DIGEST_HEX];
    int64_t size;
    int64_t mtime;       /* unix seconds: when it was stored, or last stored again */
} blob_info;

typedef struct {
    const char *name;
    /* Stores data; writes its digest. Storing an existing blob only refreshes its mtime
     * (so a blob a new save reuses looks young to the orphan sweep). */
    int (*put)(blobstore *s, const void *data, size_t n, char digest[BLOB_DIGEST_HEX], char *err, size_t errlen);
    /* Reads and verifies; *data is malloc'd. */
    int (*get)(blobstore *s, const char *digest, void **data, size_t *n, char *err, size_t errlen);
    int (*exists)(blobstore *s, const char *digest);
    int (*remove)(blobstore *s, const char *digest, char *err, size_t errlen);
    /* Every blob in the store, in no particular order; *out is malloc'd (NULL when empty).
     * Files that are not blobs (bad names) are skipped. */
    int (*list)(blobstore *s, blob_info **out, size_t *n, char *err, size_t errlen);
    /* One blob's size and mtime: 0 found, 1 absent, -1 error. */
    int (*stat)(blobstore *s, const char *digest, blob_info *out, char *err, size_t errlen);
    /* Removes temporary files of interrupted puts last modified before `before` (unix
     * seconds); *removed counts them (dry_run: counts only). */
    int (*clean_tmp)(blobstore *s, int64_t before, bool dry_run, int *removed, char *err, size_t errlen);
    /* Staged files: bytes that are not a blob yet (an adapter upload's files, until it is
     * finished and imported), kept beside the temporary files of puts, so the orphan sweep
     * (clean_tmp) also removes what a crash left. Names: 1..100 of [A-Za-z0-9._-], not
     * starting with '.'. stage_put replaces the file whole (a reader never sees half of it);
     * stage_map maps it read-only (page cache, not the heap), at most max bytes, else an
     * error naming the size; stage_remove of an absent file succeeds. */
    int (*stage_put)(blobstore *s, const char *name, const void *data, size_t n, char *err, size_t errlen);
    int (*stage_map)(blobstore *s, const char *name, size_t max, const void **data, size_t *n, char *err,
                     size_t errlen);
    int (*stage_remove)(blobstore *s, const char *name, char *err, size_t errlen);
    void (*close)(blobstore *s);
} blobstore_ops;

struct blobstore {
    const blobstore_ops *ops;
};

/* The local-directory store rooted at dir (created if absent). */
blobstore *blob_open_dir(const char *dir, char *err, size_t errlen);

/* True if s is 64 lower-case hex characters (also what keeps paths inside the store). */
bool blob_digest_valid(const char *s);

static inline int blob_put(blobstore *s, const void *d, size_t n, char dg[BLOB_DIGEST_HEX], char *e, size_t el) {
    return s->ops->put(s, d, n, dg, e, el);
}
static inline int blob_get(blobstore *s, const char *dg, void **d, size_t *n, char *e, size_t el) {
    return s->ops->get(s, dg, d, n, e, el);
}
static inline int blob_exists(blobstore *s, const char *dg) { return s->ops->exists(s, dg); }
static inline int blob_remove(blobstore *s, const char *dg, char *e, size_t el) { return s->ops->remove(s, dg, e, el); }
static inline int blob_list(blobstore *s, blob_info **out, size_t *n, char *e, size_t el) {
    return s->ops->list(s, out, n, e, el);
}
static inline int blob_stat(blobstore *s, const char *dg, blob_info *out, char *e, size_t el) {
    return s->ops->stat(s, dg, out, e, el);
}
static inline int blob_clean_tmp(blobstore *s, int64_t before, bool dry, int *removed, char *e, size_t el) {
    return s->ops->clean_tmp(s, before, dry, removed, e, el);
}
static inline int blob_stage_put(blobstore *s, const char *name, const void *d, size_t n, char *e, size_t el) {
    return s->ops->stage_put(s, name, d, n, e, el);
}
static inline int blob_stage_map(blobstore *s, const char *name, size_t max, const void **d, size_t *n, char *e,
                                 size_t el) {
    return s->ops->stage_map(s, name, max, d, n, e, el);
}
static inline int blob_stage_remove(blobstore *s, const char *name, char *e, size_t el) {
    return s->ops->stage_remove(s, name, e, el);
}
/* Ends a stage_map mapping. */
void blob_stage_unmap(const void *data, size_t n);
static inline void blob_close(blobstore *s) { s->ops->close(s); }
