/* exe_sample.c: sampling operations. Not written yet: the table is empty. */
#include "gpu/exe_internal.h"

const exe_handler_entry exe_sample_handlers[] = {{NULL, NULL}};
