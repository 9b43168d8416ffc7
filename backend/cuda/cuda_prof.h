/* cuda_prof.h — the decode profile's second level (LCU_DECODE_PROFILE=2; cuda_prof.c): each
 * operation of a decode pass timed by a CUDA event after it, the intervals summed per
 * label over a sampling call and said on stderr as a table; and the same for training
 * passes (LCU_TRAIN_PROFILE=1). The first level (the step's
 * layer stack, head and picks) is cuda_sample.c's cs_prof_*, which calls these. */
#ifndef LOOM_BACKEND_CUDA_PROF_H
#define LOOM_BACKEND_CUDA_PROF_H

#include "backend/cuda/cuda_ctx.h"

void cu_ops_mark_on(cu_ctx *c, const char *label);

/* Marks the end of the operation just queued on c's stream; label: a string constant (the
 * table keeps the pointer), the same pointer for the same operation. Only a NULL check
 * unless a pass is being profiled. */
static inline void cu_mark(cu_ctx *c, const char *label)
{
    if (c->dops) cu_ops_mark_on(c, label);
}

/* A sampling call's profile starts (c->dops set; silently none when out of host memory). */
void cu_ops_begin(cu_ctx *c);
/* A decode pass is queued between these (marks outside one are ignored): open records its
 * start; close adds host_ms, the host's time to queue it. */
void cu_ops_open(cu_ctx *c);
void cu_ops_close(cu_ctx *c, double host_ms);
/* Once the stream has run the pass (the step's picks came back): its intervals into the
 * table. */
void cu_ops_step(cu_ctx *c);
/* The table on stderr (S samples on nad distinct adapters; nothing when no step was
 * timed), then the profile's events and memory go (c->dops NULL). */
void cu_ops_end(cu_ctx *c, int S, int nad);

/* LCU_TRAIN_PROFILE=1: a forward(_backward) pass of T tokens in nseq sequences is profiled
 * the same way (it runs as it always does: training passes are not graphs). begin before
 * the pass is queued, end after it synchronized (ok) or failed; passes of one shape are
 * summed, and the table is said when the shape changes (begin) or at flush (the context's
 * end). Nothing while a sampling call's profile records. */
void cu_train_prof_begin(cu_ctx *c, long T, int nseq, bool layer_grad);
/* The pass is queued (before its synchronization): the host's time to queue it. */
void cu_train_prof_queued(cu_ctx *c);
void cu_train_prof_end(cu_ctx *c, bool ok);
void cu_train_prof_flush(cu_ctx *c);

#endif
