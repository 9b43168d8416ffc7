/* exe_durable.h: durable training state (docs/architecture.md, "Durable training state").
 *
 * A model's state is what its committed operations made of it, so any executor of the
 * pool can rebuild it: from the model's newest snapshot (model_snapshots: weights, Adam
 * moments and step after operation seq_id, as a training-checkpoint blob in the registry's
 * store) by replaying, in seq order and one at a time, the operations committed since
 * with `applied` set (forward_backward, optim_step, load_weights). Replay is exact because
 * the backend is batch-invariant (backend.h): an operation's numbers do not depend on the
 * cycle that first carried it.
 *
 * When snapshots are written:
 *   - after a load_weights, before its cycle commits (its checkpoint may be deleted later,
 *     so it must never need replaying);
 *   - every optimizer step before the commit when the backend is not batch-invariant (its
 *     state cannot be replayed exactly; gradients added since the step still are, within
 *     rounding);
 *   - otherwise every --snapshot-every steps of a model, by a writer thread after the
 *     cycle committed (the acknowledgement never waits for it: the replay covers the gap),
 *     and for every model held when the executor stops cleanly, drains or evicts it.
 *
 * A slot's copy is checked against models.state_seq whenever a cycle brings one of its
 * model's operations: a copy that is not the committed state (the model moved away and
 * back, a commit was refused) is dropped and rebuilt. */
#pragma once
#include "executor/exe_ops.h"

/* Makes the store hold the model's committed state (state_seq; < 0: none yet): keeps a
 * slot that holds it, else rebuilds one from the snapshot and the replay, reading on c.
 * 0, or -1 with err (the slot is then absent). */
int exe_slot_restore(exe_state *st, PGconn *c, const char *model_id, const lora_config *lcfg, int64_t state_seq,
                     char *err, size_t errlen);

/* After a cycle's compute: the slots' seq_ids follow the operations that were applied. */
void exe_slots_advance(exe_state *st, const exe_op *ops, int n);

/* Snapshots a cycle must carry into its commit (see above): written to the blob store now;
 * an operation whose snapshot cannot be written fails (its effect is then not committed,
 * and the slot is dropped after the commit). */
typedef struct exe_snap_set exe_snap_set;
exe_snap_set *exe_snapshots_before_commit(exe_state *st, exe_op *ops, int n);
/* Inside the commit transaction: their rows. 0 or -1 with err. */
int exe_snapshots_record(exe_state *st, PGconn *c, exe_snap_set *set, char *err, size_t errlen);
/* After the commit (committed: whether it went through): the slots learn of their
 * snapshots, slots of failed snapshots are dropped, and the set is freed. */
void exe_snapshots_done(exe_state *st, exe_snap_set *set, bool committed);

/* After a committed cycle: models of ops that reached --snapshot-every steps since their
 * snapshot are handed to the writer thread. */
void exe_snapshots_after_commit(exe_state *st, const exe_op *ops, int n);

/* Every training slot whose snapshot is behind its state (or only the one of model_id)
 * is handed to the writer; wait: return once everything handed over is written. */
void exe_snapshot_slots(exe_state *st, const char *model_id, bool wait);

/* The writer thread, with its own database connection (st->db_conninfo). */
int exe_snapshot_writer_start(exe_state *st, char *err, size_t errlen);
/* Writes what is queued, then stops it. */
void exe_snapshot_writer_stop(exe_state *st);

/* Hands the model over to the pool (drain, eviction): its snapshot brought up to date,
 * then, when none of its operations is claimed, it is placed nowhere (the scheduler places
 * it again with its next operation, restored wherever that is) and its slot is freed.
 * 1 handed over, 0 kept (an operation of it is claimed: try later), -1 with err. */
int exe_hand_over(exe_state *st, PGconn *c, const char *model_id, char *err, size_t errlen);
