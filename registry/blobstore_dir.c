/* blobstore_dir.c: the local-directory blob store. Layout: <root>/sha256/<2 hex>/<64 hex>,
 * temporary files in <root>/tmp (same file system, so rename is atomic). Blobs are
 * tenants' trained weights: directories are 0700 and files 0600, for the service user
 * only (an existing store's directories are tightened when it is opened, if ours). */
#include "registry/blobstore.h"
#include "common/log.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    blobstore base;
    char root[PATH_MAX - 128];
} dirstore;

bool blob_digest_valid(const char *s) {
    if (!s || strlen(s) != 64) return false;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

static void blob_path(const dirstore *d, const char *digest, char *out, size_t n, bool dir_only) {
    if (dir_only) snprintf(out, n, "%s/sha256/%.2s", d->root, digest);
    else snprintf(out, n, "%s/sha256/%.2s/%s", d->root, digest, digest);
}

static void sha256_hex(const void *data, size_t n, char out[BLOB_DIGEST_HEX]) {
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, data, n);
    sodium_bin2hex(out, BLOB_DIGEST_HEX, h, sizeof h);
}

static int fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* A write failed: the log gets the path (the operator's), err only what failed and why,
 * since it may reach a client in an operation's error (a save's, a snapshot's). errno is
 * the failure's. */
static int put_failed(char *err, size_t errlen, const char *step, const char *path) {
    int e = errno;
    /* A full or broken store fails every write until it is mended: the path once a minute
     * (a racy clock between threads costs at most an extra line). */
    static time_t logged;
    log_msg(log_level_every(&logged, 60, LOG_ERROR_), "blob store: %s %s: %s", step, path, strerror(e));
    snprintf(err, errlen, "the blob store could not store the blob (%s: %s)", step, strerror(e));
    return -1;
}

static int dir_exists_blob(blobstore *s, const char *digest) {
    char p[PATH_MAX];
    if (!blob_digest_valid(digest)) return 0;
    blob_path((dirstore *)s, digest, p, sizeof p, false);
    return access(p, F_OK) == 0;
}

static int dir_put(blobstore *s, const void *data, size_t n, char digest[BLOB_DIGEST_HEX], char *err, size_t errlen) {
    dirstore *d = (dirstore *)s;
    sha256_hex(data, n, digest);
    char final[PATH_MAX], dir[PATH_MAX], tmp[PATH_MAX];
    blob_path(d, digest, final, sizeof final, false);
    /* Content-addressed: same bytes, same blob. Touch it, so the orphan sweep gives a
     * blob that a new save reuses the full grace period again. */
    if (utimensat(AT_FDCWD, final, NULL, 0) == 0) return 0;
    if (errno != ENOENT && access(final, F_OK) == 0) return 0;   /* read-only store */
    blob_path(d, digest, dir, sizeof dir, true);
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) return put_failed(err, errlen, "making its directory", dir);
    snprintf(tmp, sizeof tmp, "%s/tmp/%s.XXXXXX", d->root, digest);
    int fd = mkstemp(tmp);
    if (fd < 0) return put_failed(err, errlen, "creating a temporary file", tmp);
    const char *p = data;
    size_t left = n;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) goto io_fail;
        p += w;
        left -= (size_t)w;
    }
    if (fchmod(fd, 0600) < 0 || fsync(fd) < 0) goto io_fail;
    close(fd);
    if (rename(tmp, final) < 0) {
        put_failed(err, errlen, "renaming it into place", final);
        unlink(tmp);
        return -1;
    }
    if (fsync_dir(dir) < 0) return put_failed(err, errlen, "syncing its directory", dir);
    return 0;
io_fail:
    put_failed(err, errlen, "writing", tmp);
    close(fd);
    unlink(tmp);
    return -1;
}

static int dir_get(blobstore *s, const char *digest, void **data, size_t *n, char *err, size_t errlen) {
    dirstore *d = (dirstore *)s;
    *data = NULL;
    *n = 0;
    if (!blob_digest_valid(digest)) { snprintf(err, errlen, "invalid blob digest"); return -1; }
    char path[PATH_MAX];
    blob_path(d, digest, path, sizeof path, false);
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "blob %s is missing from the store (%s)", digest, strerror(errno)); return -1; }
    struct stat st;
    if (fstat(fileno(f), &st) < 0) {
        log_error("blob store: stat %s: %s", path, strerror(errno));
        fclose(f);
        snprintf(err, errlen, "blob %s: stat failed", digest);
        return -1;
    }
    char *buf = malloc(st.st_size ? st.st_size : 1);
    if (!buf || fread(buf, 1, st.st_size, f) != (size_t)st.st_size) {
        fclose(f);
        free(buf);
        snprintf(err, errlen, "blob %s: read failed", digest);
        return -1;
    }
    fclose(f);
    char actual[BLOB_DIGEST_HEX];
    sha256_hex(buf, st.st_size, actual);
    if (strcmp(actual, digest) != 0) {
        free(buf);
        snprintf(err, errlen, "blob %s is corrupted: its content hashes to %s", digest, actual);
        return -1;
    }
    *data = buf;
    *n = st.st_size;
    return 0;
}

static int dir_remove(blobstore *s, const char *digest, char *err, size_t errlen) {
    char path[PATH_MAX];
    if (!blob_digest_valid(digest)) { snprintf(err, errlen, "invalid blob digest"); return -1; }
    blob_path((dirstore *)s, digest, path, sizeof path, false);
    if (unlink(path) < 0 && errno != ENOENT) {
        snprintf(err, errlen, "blob store: unlink %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Walks <root>/sha256/<xx>/: regular files named by a valid digest that starts with xx. */
static int dir_list(blobstore *s, blob_info **out, size_t *n, char *err, size_t errlen) {
    dirstore *d = (dirstore *)s;
    *out = NULL;
    *n = 0;
    size_t cap = 0;
    char top[PATH_MAX];
    snprintf(top, sizeof top, "%s/sha256", d->root);
    DIR *td = opendir(top);
    if (!td) { snprintf(err, errlen, "blob store: opendir %s: %s", top, strerror(errno)); return -1; }
    struct dirent *te;
    while ((te = readdir(td))) {
        const char *xx = te->d_name;
        if (strlen(xx) != 2 || !strchr("0123456789abcdef", xx[0]) || !strchr("0123456789abcdef", xx[1]))
            continue;
        char sub[PATH_MAX];
        snprintf(sub, sizeof sub, "%s/%s", top, xx);
        DIR *sd = opendir(sub);
        if (!sd) continue;   /* not a directory, or removed meanwhile */
        struct dirent *e;
        while ((e = readdir(sd))) {
            struct stat st;
            if (!blob_digest_valid(e->d_name) || strncmp(e->d_name, xx, 2) ||
                fstatat(dirfd(sd), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
                continue;
            if (*n == cap) {
                cap = cap ? 2 * cap : 256;
                blob_info *grown = realloc(*out, cap * sizeof **out);
                if (!grown) {
                    closedir(sd);
                    closedir(td);
                    free(*out);
                    *out = NULL;
                    *n = 0;
                    snprintf(err, errlen, "blob store: out of memory listing blobs");
                    return -1;
                }
                *out = grown;
            }
            blob_info *b = &(*out)[(*n)++];
            snprintf(b->digest, sizeof b->digest, "%s", e->d_name);
            b->size = (int64_t)st.st_size;
            b->mtime = (int64_t)st.st_mtime;
        }
        closedir(sd);
    }
    closedir(td);
    return 0;
}

static int dir_stat(blobstore *s, const char *digest, blob_info *out, char *err, size_t errlen) {
    char path[PATH_MAX];
    if (!blob_digest_valid(digest)) { snprintf(err, errlen, "invalid blob digest"); return -1; }
    blob_path((dirstore *)s, digest, path, sizeof path, false);
    struct stat st;
    if (stat(path, &st) < 0) {
        if (errno == ENOENT) return 1;
        snprintf(err, errlen, "blob store: stat %s: %s", path, strerror(errno));
        return -1;
    }
    snprintf(out->digest, sizeof out->digest, "%s", digest);
    out->size = (int64_t)st.st_size;
    out->mtime = (int64_t)st.st_mtime;
    return 0;
}

static int dir_clean_tmp(blobstore *s, int64_t before, bool dry_run, int *removed, char *err, size_t errlen) {
    dirstore *d = (dirstore *)s;
    *removed = 0;
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/tmp", d->root);
    DIR *td = opendir(tmp);
    if (!td) { snprintf(err, errlen, "blob store: opendir %s: %s", tmp, strerror(errno)); return -1; }
    struct dirent *e;
    while ((e = readdir(td))) {
        struct stat st;
        if (e->d_name[0] == '.' || fstatat(dirfd(td), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
            !S_ISREG(st.st_mode) || (int64_t)st.st_mtime >= before)
            continue;
        if (dry_run || unlinkat(dirfd(td), e->d_name, 0) == 0) (*removed)++;
    }
    closedir(td);
    return 0;
}

/* ---- staged files: <root>/tmp/<name> ---------------------------------------------------- */

static bool stage_name_ok(const char *name) {
    size_t n = name ? strlen(name) : 0;
    if (n < 1 || n > 100 || name[0] == '.') return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", name[i])) return false;
    return true;
}

static int dir_stage_put(blobstore *s, const char *name, const void *data, size_t n, char *err, size_t errlen) {
    dirstore *d = (dirstore *)s;
    if (!stage_name_ok(name)) { snprintf(err, errlen, "blob store: invalid staged file name"); return -1; }
    char final[PATH_MAX], tmp[PATH_MAX];
    snprintf(final, sizeof final, "%s/tmp/%s", d->root, name);
    snprintf(tmp, sizeof tmp, "%s/tmp/%s.part.XXXXXX", d->root, name);
    int fd = mkstemp(tmp);
    if (fd < 0) { snprintf(err, errlen, "blob store: %s: %s", tmp, strerror(errno)); return -1; }
    /* No fsync: a staged file that a crash loses is sent again by its client. */
    const char *p = data;
    for (size_t left = n; left > 0;) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            snprintf(err, errlen, "blob store: writing %s: %s", tmp, w < 0 ? strerror(errno) : "short write");
            close(fd);
            unlink(tmp);
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    if (close(fd) < 0 || rename(tmp, final) < 0) {
        snprintf(err, errlen, "blob store: staging %s: %s", final, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

static int dir_stage_map(blobstore *s, const char *name, size_t max, const void **data, size_t *n, char *err,
                         size_t errlen) {
    dirstore *d = (dirstore *)s;
    *data = NULL;
    *n = 0;
    if (!stage_name_ok(name)) { snprintf(err, errlen, "blob store: invalid staged file name"); return -1; }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/tmp/%s", d->root, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { snprintf(err, errlen, "staged file %s: %s", name, strerror(errno)); return -1; }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "staged file %s is not a regular file", name);
        close(fd);
        return -1;
    }
    if ((uint64_t)st.st_size > max) {
        snprintf(err, errlen, "%lld bytes, more than the %zu allowed", (long long)st.st_size, max);
        close(fd);
        return -1;
    }
    void *m = st.st_size ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : (void *)"";
    close(fd);
    if (m == MAP_FAILED) { snprintf(err, errlen, "staged file %s: mmap: %s", name, strerror(errno)); return -1; }
    *data = m;
    *n = (size_t)st.st_size;
    return 0;
}

void blob_stage_unmap(const void *data, size_t n) {
    if (data && n) munmap((void *)data, n);
}

static int dir_stage_remove(blobstore *s, const char *name, char *err, size_t errlen) {
    dirstore *d = (dirstore *)s;
    if (!stage_name_ok(name)) { snprintf(err, errlen, "blob store: invalid staged file name"); return -1; }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/tmp/%s", d->root, name);
    if (unlink(path) < 0 && errno != ENOENT) {
        snprintf(err, errlen, "blob store: unlink %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

static void dir_close(blobstore *s) { free(s); }

static const blobstore_ops dir_ops = {.name = "dir", .put = dir_put, .get = dir_get, .exists = dir_exists_blob,
                                      .remove = dir_remove, .list = dir_list, .stat = dir_stat,
                                      .clean_tmp = dir_clean_tmp, .stage_put = dir_stage_put,
                                      .stage_map = dir_stage_map, .stage_remove = dir_stage_remove,
                                      .close = dir_close};

blobstore *blob_open_dir(const char *root, char *err, size_t errlen) {
    if (sodium_init() < 0) { snprintf(err, errlen, "libsodium init failed"); return NULL; }
    dirstore *d = calloc(1, sizeof *d);
    if (strlen(root) >= sizeof d->root) { free(d); snprintf(err, errlen, "blob store path too long"); return NULL; }
    snprintf(d->root, sizeof d->root, "%s", root);
    char p[PATH_MAX];
    const char *subs[] = {"", "/sha256", "/tmp"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s%s", root, subs[i]);
        if (mkdir(p, 0700) < 0 && errno != EEXIST) {
            snprintf(err, errlen, "blob store: mkdir %s: %s", p, strerror(errno));
            free(d);
            return NULL;
        }
        if (chmod(p, 0700) < 0) {}   /* best effort: a store we do not own is left alone */
    }
    d->base.ops = &dir_ops;
    return &d->base;
}
