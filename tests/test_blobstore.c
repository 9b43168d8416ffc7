/* test_blobstore.c: the content-addressed blob store: round trip, deduplication,
 * corruption and truncation detected on read, hostile digests refused. */
#include "registry/blobstore.h"
#include "check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

int main(void) {
    char root[] = "/tmp/loom-blob-XXXXXX", err[512];
    if (!mkdtemp(root)) return 2;
    blobstore *s = blob_open_dir(root, err, sizeof err);
    CHECK(s != NULL, "open store");
    const char *msg = "LoRA weights, pretend";
    char d1[BLOB_DIGEST_HEX], d2[BLOB_DIGEST_HEX];
    CHECK(blob_put(s, msg, strlen(msg), d1, err, sizeof err) == 0, "put");
    /* sha256("LoRA weights, pretend") computed independently with sha256sum */
    FILE *p = popen("printf 'LoRA weights, pretend' | sha256sum", "r");
    char expect[80] = "";
    if (p) { if (!fgets(expect, sizeof expect, p)) expect[0] = 0; pclose(p); }
    CHECK(strncmp(expect, d1, 64) == 0, "digest is the sha256 of the bytes");
    CHECK(blob_put(s, msg, strlen(msg), d2, err, sizeof err) == 0 && !strcmp(d1, d2), "same bytes, same digest");
    char sub[600];
    snprintf(sub, sizeof sub, "%s/sha256/%.2s", root, d1);
    CHECK(count_files(sub) == 1, "stored once (deduplicated)");
    char tmpd[600];
    snprintf(tmpd, sizeof tmpd, "%s/tmp", root);
    CHECK(count_files(tmpd) == 0, "no temporary files left behind");
    void *data; size_t n;
    CHECK(blob_get(s, d1, &data, &n, err, sizeof err) == 0 && n == strlen(msg) && !memcmp(data, msg, n), "get verifies and returns the bytes");
    free(data);
    CHECK(blob_exists(s, d1) == 1, "exists");

    /* Flip one byte on disk: the read must fail and say so. */
    char path[700];
    snprintf(path, sizeof path, "%s/%s", sub, d1);
    FILE *f = fopen(path, "r+b");
    fseek(f, 3, SEEK_SET);
    fputc('X', f);
    fclose(f);
    int rc = blob_get(s, d1, &data, &n, err, sizeof err);
    CHECK(rc < 0 && strstr(err, "corrupted") && data == NULL, "a corrupted blob is detected and reported");
    /* Truncate: also detected. */
    if (truncate(path, 4) != 0) {}
    rc = blob_get(s, d1, &data, &n, err, sizeof err);
    CHECK(rc < 0 && strstr(err, "corrupted"), "a truncated blob is detected");
    CHECK(blob_remove(s, d1, err, sizeof err) == 0 && !blob_exists(s, d1), "remove");
    rc = blob_get(s, d1, &data, &n, err, sizeof err);
    CHECK(rc < 0 && strstr(err, "missing"), "a missing blob is reported as missing");
    CHECK(blob_get(s, "../../etc/passwd", &data, &n, err, sizeof err) < 0 && !blob_digest_valid("../x"),
          "hostile digests are refused");
    CHECK(!blob_digest_valid("ABCDEF0000000000000000000000000000000000000000000000000000000000"), "upper case refused");
    blob_close(s);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0) {}
    return check_summary();
}
