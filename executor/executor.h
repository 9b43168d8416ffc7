/* executor.h: `loom executor --backend NAME --device N`, one process per device. Opens the
 * base model on its backend once, keeps adapters in its adapter store (exe_store.h), runs
 * the cycles the scheduler assigns to it and commits every result of a cycle in one
 * transaction. docs/architecture.md, "The executor". */
#pragma once
#include "common/config.h"
#include <stddef.h>

int exe_main(int argc, char **argv);
/* Its device options (not the model's), for `loom up` to take and pass through, and the checks
 * beyond their syntax (the backend exists, the memory budget is a size). */
extern const opt_spec EXE_OPTS[];
int exe_check_opts(const cfg *o, char *err, size_t errlen);
