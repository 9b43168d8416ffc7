/* log.c: stderr logging. One fprintf per line so lines from threads do not interleave. */
#include "common/log.h"
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

void log_msg(int level, const char *fmt, ...) {
    if (level < g_level) return;
    static const char *names[] = {"debug", "info", "warn", "error"};
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%d] %s: %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            g_role, (int)getpid(), names[level], msg);
}
