/* log.h: one-line, timestamped log messages to stderr, prefixed with the process role. */
#pragma once
#include <stdarg.h>

enum { LOG_DEBUG_ = 0, LOG_INFO_ = 1, LOG_WARN_ = 2, LOG_ERROR_ = 3 };

void log_init(const char *role);           /* "api", "scheduler", "executor", "up" ... */
void log_set_level(int level);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) log_msg(LOG_DEBUG_, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO_, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN_, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR_, __VA_ARGS__)
