/* api_console_files.h: the web console's files as compiled into the binary by
 * console/embed.cmake (the table ends with a NULL name). */
#pragma once
#include <stddef.h>

typedef struct {
    const char *name;   /* "index.html" */
    const char *type;   /* Content-Type */
    const char *data;
    size_t len;
} api_console_file;

extern const api_console_file api_console_files[];
