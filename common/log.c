/* log.c: stderr logging. One fprintf per line so lines from threads do not interleave.
 * Messages often quote what a client sent; control characters and bytes that are not
 * UTF-8 are written as \xNN, so a message is always exactly one line and cannot forge
 * another (or move a terminal's cursor). */
#include "common/log.h"
#include "common/strbuf.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char g_role[32] = "loom";
static int g_level = LOG_INFO_;

void log_init(const char *role) {
    snprintf(g_role, sizeof g_role, "%s", role);
    const char *lv = getenv("LOOM_LOG_LEVEL");
    if (lv && !strcmp(lv, "debug")) g_level = LOG_DEBUG_;
    else if (lv && !strcmp(lv, "warn")) g_level = LOG_WARN_;
}

void log_set_level(int level) { g_level = level; }

/* msg with C0/C1 controls, DEL and invalid UTF-8 as \xNN (out holds 4x msg). */
static void escape_line(const char *msg, char *out, size_t outlen) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)msg;
    size_t o = 0, n = strlen(msg);
    for (size_t i = 0; i < n && o + 5 < outlen;) {
        uint32_t cp = 0;
        size_t k = utf8_seq_len(p + i, n - i, &cp);
        if (k && cp >= 0x20 && cp != 0x7f && !(cp >= 0x80 && cp < 0xa0)) {
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
            continue;
        }
        size_t bad = k ? k : 1;   /* a control is escaped byte by byte */
        for (size_t j = 0; j < bad && o + 5 < outlen; j++) {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[p[i + j] >> 4];
            out[o++] = hex[p[i + j] & 15];
        }
        i += bad;
    }
    out[o] = 0;
}

void log_msg(int level, const char *fmt, ...) {
    if (level < g_level) return;
    static const char *names[] = {"debug", "info", "warn", "error"};
    char raw[2048], msg[4 * sizeof raw + 8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    escape_line(raw, msg, sizeof msg);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%d] %s: %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            g_role, (int)getpid(), names[level], msg);
}
