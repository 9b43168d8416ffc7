/* exe_ckpt.c: checkpoint operations (save_weights, named save_weights_for_sampler,
 * load_weights) against the registry. Not written yet: the table is empty, so these
 * kinds fail with "not implemented yet" (and the api answers 501 before they are queued). */
#include "gpu/exe_internal.h"

const exe_handler_entry exe_ckpt_handlers[] = {{NULL, NULL}};
