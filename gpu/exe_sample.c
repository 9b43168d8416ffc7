/* exe_sample.c: sampling operations. Not written yet: sample ops fail with a clear
 * message (and the api answers 501 before any is queued). */
#include "gpu/exe_internal.h"

const exe_handler_entry exe_sample_handlers[] = {{NULL, NULL}};

void exe_run_sample_batch(exe_state *st, exe_op **ops, int nops) {
    for (int i = 0; i < nops; i++) exe_op_fail(ops[i], "user", "sampling is not implemented yet in this Loom version");
}

void exe_run_snapshot(exe_state *st, exe_op *op) {
    exe_op_fail(op, "user", "save_weights_for_sampler is not implemented yet in this Loom version");
}
