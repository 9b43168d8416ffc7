/* err.h: the error convention of every C module here. A function that can fail takes
 * (char *err, size_t errlen), returns -1 (or NULL) and leaves a message in err that a
 * person can act on. err_set writes it; err may be NULL (the caller does not want it). */
#pragma once
#include <stddef.h>

void err_set(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
