/* reg_tar.c: a minimal ustar writer for checkpoint archives (docs/protocol.md §17.1): regular files
 * at the archive root, mode 0644, uid/gid 0, one mtime, two zero blocks at the end.
 * Deterministic: the same members give the same bytes. Reading archives (`loom adapter
 * import`) is libarchive's. */
#include "registry/registry.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAR_BLOCK 512

static void octal(char *field, size_t width, uint64_t v) {
    /* width-1 digits and a NUL; sizes beyond 8 GiB use the base-256 form readers accept */
    if (width == 12 && v >= 077777777777ULL) {
        memset(field, 0, width);
        field[0] = (char)0x80;
        for (int i = 11; i >= 4; i--, v >>= 8) field[i] = (char)(v & 0xff);
        return;
    }
    snprintf(field, width, "%0*llo", (int)width - 1, (unsigned long long)v);
}

int reg_tar_build(const reg_tar_member *m, int n, int64_t mtime, uint8_t **out, size_t *outlen, char *err,
                  size_t errlen) {
    size_t total = 2 * TAR_BLOCK;
    for (int i = 0; i < n; i++) {
        size_t nl = strlen(m[i].name);
        if (nl == 0 || nl >= 100 || strchr(m[i].name, '/') || !strcmp(m[i].name, "..")) {
            snprintf(err, errlen, "tar: bad member name \"%s\"", m[i].name);
            return -1;
        }
        total += TAR_BLOCK + (m[i].len + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
    }
    uint8_t *buf = calloc(1, total);
    if (!buf) { snprintf(err, errlen, "tar: out of memory (%zu bytes)", total); return -1; }
    uint8_t *p = buf;
    for (int i = 0; i < n; i++) {
        char *h = (char *)p;
        memcpy(h, m[i].name, strlen(m[i].name));
        octal(h + 100, 8, 0644);
        octal(h + 108, 8, 0);
        octal(h + 116, 8, 0);
        octal(h + 124, 12, m[i].len);
        octal(h + 136, 12, mtime > 0 ? (uint64_t)mtime : 0);
        memset(h + 148, ' ', 8);
        h[156] = '0';
        memcpy(h + 257, "ustar", 6);
        memcpy(h + 263, "00", 2);
        memcpy(h + 265, "root", 4);
        memcpy(h + 297, "root", 4);
        octal(h + 329, 8, 0);
        octal(h + 337, 8, 0);
        unsigned sum = 0;
        for (int k = 0; k < TAR_BLOCK; k++) sum += (unsigned char)h[k];
        snprintf(h + 148, 8, "%06o", sum);
        h[155] = ' ';
        p += TAR_BLOCK;
        if (m[i].len) memcpy(p, m[i].data, m[i].len);
        p += (m[i].len + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
    }
    *out = buf;
    *outlen = total;
    return 0;
}
