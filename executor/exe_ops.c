/* exe_ops.c: helpers every operation handler uses (see exe_ops.h). */
#include "executor/exe_ops.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void exe_op_fail(exe_op *op, const char *category, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->error, sizeof op->error, fmt, ap);
    va_end(ap);
    op->category = category;
    if (op->result) { json_decref(op->result); op->result = NULL; }
    free(op->result_bin);
    op->result_bin = NULL;
    op->result_bin_len = 0;
}

uint8_t *exe_copy_bytes(const PGresult *r, int row, int col, size_t *len) {
    *len = (size_t)PQgetlength(r, row, col);
    uint8_t *p = malloc(*len ? *len : 1);
    if (p) memcpy(p, PQgetvalue(r, row, col), *len);
    return p;
}

be_adapter *exe_op_training_slot(exe_state *st, exe_op *op) {
    be_adapter *ad = exe_store_get(&st->store, STORE_TRAINING, op->model_id);
    if (!ad)
        exe_op_fail(op, "server", "this model's training state is not on this executor (it was restarted); "
                    "create a new model or load a checkpoint");
    return ad;
}
