/* log.c: stderr logging (see log.h). One fprintf per line so lines from threads do not
 * interleave. Messages often quote what a client sent; control characters and bytes that
 * are not UTF-8 are written as \xNN, so a message is always exactly one line and cannot
 * forge another (or move a terminal's cursor). */
#include "common/log.h"
#include "common/strbuf.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char g_role[32] = "loom";
static int g_level = LOG_INFO_;
static bool g_json;
static const char *const g_names[] = {"debug", "info", "warn", "error"};

void log_init(const char *role) {
    snprintf(g_role, sizeof g_role, "%s", role);
    const char *lv = getenv("LOOM_LOG_LEVEL");
    for (int i = 0; lv && i < 4; i++)
        if (!strcmp(lv, g_names[i])) g_level = i;
    const char *fmt = getenv("LOOM_LOG_FORMAT");
    g_json = fmt && !strcmp(fmt, "json");
}

void log_set_level(int level) { g_level = level; }

bool log_enabled(int level) { return level >= g_level; }

int log_level_every(time_t *last, int seconds, int level) {
    time_t now = time(NULL);
    if (now - *last < seconds) return LOG_DEBUG_;
    *last = now;
    return level;
}

/* msg with C0/C1 controls, DEL and invalid UTF-8 as \xNN. */
static void escape_into(strbuf *out, const char *msg) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)msg;
    size_t n = strlen(msg);
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        size_t k = utf8_seq_len(p + i, n - i, &cp);
        if (k && cp >= 0x20 && cp != 0x7f && !(cp >= 0x80 && cp < 0xa0)) {
            sb_append(out, (const char *)p + i, k);
            i += k;
            continue;
        }
        size_t bad = k ? k : 1;   /* a control is escaped byte by byte */
        for (size_t j = 0; j < bad; j++) {
            char e[4] = {'\\', 'x', hex[p[i + j] >> 4], hex[p[i + j] & 15]};
            sb_append(out, e, 4);
        }
        i += bad;
    }
}

static void put_number(strbuf *b, double v) {
    if (isfinite(v) && fabs(v) < 9e15 && v == (double)(long long)v) sb_int(b, (int64_t)v);
    else if (isfinite(v)) sb_printf(b, "%.6g", v);
    else sb_puts(b, g_json ? "null" : "NaN");
}

/* A text value as key=value reads it back: bare when it has no space, quote, '=' or
 * backslash (and is not empty), else quoted with \" and \\. */
static void put_text_value(strbuf *b, const char *s) {
    bool bare = *s && !strpbrk(s, " \"=\\");
    if (bare) {
        sb_puts(b, s);
        return;
    }
    sb_putc(b, '"');
    for (const char *p = s; *p; p++) {
        if (*p == '"' || *p == '\\') sb_putc(b, '\\');
        sb_putc(b, *p);
    }
    sb_putc(b, '"');
}

static void emit(int level, const char *msg, const log_field *f, size_t n) {
    strbuf esc, line;
    sb_init(&esc, 256);
    sb_init(&line, 512);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    escape_into(&esc, msg);
    if (g_json) {
        sb_printf(&line, "{\"ts\":\"%s\",\"level\":\"%s\",\"role\":", when, g_names[level]);
        sb_json_str(&line, g_role);
        sb_printf(&line, ",\"pid\":%d,\"msg\":", (int)getpid());
        sb_json_str(&line, esc.data);
    } else {
        sb_printf(&line, "%s %s[%d] %s: %s", when, g_role, (int)getpid(), g_names[level], esc.data);
    }
    for (size_t i = 0; i < n; i++) {
        if (g_json) {
            sb_putc(&line, ',');
            sb_json_str(&line, f[i].key);
            sb_putc(&line, ':');
        } else {
            sb_printf(&line, " %s=", f[i].key);
        }
        if (!f[i].s) {
            put_number(&line, f[i].num);
            continue;
        }
        esc.len = 0;
        esc.data[0] = 0;
        escape_into(&esc, f[i].s);
        if (g_json) sb_json_str(&line, esc.data ? esc.data : "");
        else put_text_value(&line, esc.data ? esc.data : "");
    }
    if (g_json) sb_putc(&line, '}');
    fprintf(stderr, "%s\n", line.data);
    sb_free(&esc);
    sb_free(&line);
}

void log_msg(int level, const char *fmt, ...) {
    if (level < g_level) return;
    char raw[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    emit(level, raw, NULL, 0);
}

void log_fields(int level, const char *msg, const log_field *f, size_t n) {
    if (level >= g_level) emit(level, msg, f, n);
}
