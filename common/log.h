/* log.h: one-line, timestamped log messages to stderr, prefixed with the process role.
 *
 * LOOM_LOG_LEVEL: debug | info (default) | warn | error; messages below it are dropped.
 * LOOM_LOG_FORMAT: text (default) | json. Text lines read
 *   2025-01-01T12:00:00.000Z api[123] info: message key=value key="a value"
 * JSON lines are one object each: {"ts", "level", "role", "pid", "msg", and the fields}.
 * Either way a line never holds a control character or invalid UTF-8 (written as \xNN),
 * so what a client sent cannot forge a line. */
#pragma once
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

enum { LOG_DEBUG_ = 0, LOG_INFO_ = 1, LOG_WARN_ = 2, LOG_ERROR_ = 3 };

void log_init(const char *role);           /* "api", "scheduler", "executor", "up" ... */
void log_set_level(int level);
bool log_enabled(int level);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* For a message repeated by a retry loop: level at most once every `seconds` (*last, the
 * caller's own clock of that message, is updated then), LOG_DEBUG_ in between. */
int log_level_every(time_t *last, int seconds, int level);

/* One named value of a structured line: a string (s) or a number (num). */
typedef struct {
    const char *key;
    const char *s;
    double num;
} log_field;
static inline log_field log_s(const char *k, const char *v) { return (log_field){k, v ? v : "", 0}; }
static inline log_field log_n(const char *k, double v) { return (log_field){k, NULL, v}; }
#define LOG_S(k, v) log_s((k), (v))
#define LOG_N(k, v) log_n((k), (double)(v))
/* msg followed by its fields: key=value in text (quoted when needed), members in JSON. */
void log_fields(int level, const char *msg, const log_field *f, size_t n);

#define log_debug(...) log_msg(LOG_DEBUG_, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO_, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN_, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR_, __VA_ARGS__)
