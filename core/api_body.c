/* api_body.c: Content-Encoding of request bodies (see api_body.h). */
#include "core/api_body.h"
#include "core/api_json.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zstd.h>

/* The encoding token without surrounding blanks: "zstd", "identity", "". */
static size_t trimmed(const char *s, const char **start) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    *start = s;
    return n;
}

bool api_body_plain(const api_job *job) {
    const char *enc;
    size_t n = job->content_encoding ? trimmed(job->content_encoding, &enc) : 0;
    return n == 0 || (n == 8 && !strncasecmp(enc, "identity", 8));
}

static int zstd_decode(api_job *job, size_t max_decoded, char *err, size_t errlen) {
    ZSTD_DStream *ds = ZSTD_createDStream();
    if (!ds) abort();
    unsigned long long hint = ZSTD_getFrameContentSize(job->body, job->body_len);
    size_t cap = hint != ZSTD_CONTENTSIZE_UNKNOWN && hint != ZSTD_CONTENTSIZE_ERROR &&
                         hint <= max_decoded
                     ? (size_t)hint + 1
                     : 4 * job->body_len + 4096;
    if (cap > max_decoded + 1) cap = max_decoded + 1;
    /* the output counts against the process's decode budget (api_json.h) */
    if (!jx_decode_take(cap)) {
        ZSTD_freeDStream(ds);
        snprintf(err, errlen, "server busy: other request bodies being decoded hold the memory for it (loom api "
                              "--max-decode-mb %zu); retry shortly", jx_decode_limit() >> 20);
        return 503;
    }
    char *out = malloc(cap);
    if (!out) abort();
    ZSTD_inBuffer in = {job->body, job->body_len, 0};
    ZSTD_outBuffer o = {out, cap, 0};
    int st = 0;
    for (;;) {
        if (o.pos == o.size) {
            if (o.size > max_decoded) {
                snprintf(err, errlen, "zstd-decoded request body is larger than this server's "
                                      "limit of %zu MiB (loom api --max-body-mb)", max_decoded >> 20);
                st = 413;
                break;
            }
            size_t ncap = o.size * 2 > max_decoded + 1 ? max_decoded + 1 : o.size * 2;
            if (!jx_decode_take(ncap - o.size)) {
                snprintf(err, errlen, "server busy: other request bodies being decoded hold the memory for it "
                                      "(loom api --max-decode-mb %zu); retry shortly", jx_decode_limit() >> 20);
                st = 503;
                break;
            }
            char *p = realloc(out, ncap);
            if (!p) abort();
            out = p;
            o.dst = out;
            o.size = ncap;
        }
        size_t rc = ZSTD_decompressStream(ds, &o, &in);
        if (ZSTD_isError(rc)) {
            snprintf(err, errlen, "request body is not a valid zstd frame (Content-Encoding: "
                                  "zstd): %s", ZSTD_getErrorName(rc));
            st = 400;
            break;
        }
        /* rc == 0: a frame ended; more input may hold another (concatenated frames) */
        if (rc == 0 && in.pos == in.size) break;
        if (rc != 0 && in.pos == in.size && o.pos < o.size) {
            snprintf(err, errlen, "request body is a truncated zstd frame (Content-Encoding: "
                                  "zstd)");
            st = 400;
            break;
        }
    }
    ZSTD_freeDStream(ds);
    if (st) {
        free(out);
        return st;
    }
    if (o.pos > max_decoded) {
        free(out);
        snprintf(err, errlen, "zstd-decoded request body is larger than this server's limit of "
                              "%zu MiB (loom api --max-body-mb)", max_decoded >> 20);
        return 413;
    }
    free(job->body);
    job->body = out;
    job->body_len = o.pos;
    return 0;
}

int api_body_decode(api_job *job, size_t max_decoded, char *err, size_t errlen) {
    if (!job->content_encoding) return 0;
    const char *enc;
    size_t n = trimmed(job->content_encoding, &enc);
    if (n == 0 || (n == 8 && !strncasecmp(enc, "identity", 8))) return 0;
    if (n == 4 && !strncasecmp(enc, "zstd", 4)) {
        if (job->body_len == 0) {
            snprintf(err, errlen, "Content-Encoding: zstd with an empty body");
            return 400;
        }
        return zstd_decode(job, max_decoded, err, errlen);
    }
    snprintf(err, errlen, "unsupported Content-Encoding \"%.40s\": send the body uncompressed, "
                          "or zstd-compressed with Content-Encoding: zstd", job->content_encoding);
    return 415;
}
