/* exe_store.h: the adapter store, one per executor: every adapter the executor holds on
 * its backend's device, by kind and key, within a memory budget.
 *
 *   training    a model's training slot (weights, gradients, Adam state), keyed by model
 *               id; created by create_model, load_weights or a recovery (exe_durable.h),
 *               freed on unload_model or when the model moves. Never evicted by the store
 *               itself: the executor evicts idle ones (exe_durable.h), whose state the
 *               database and the blob store can rebuild.
 *   snapshot    the weights of a model at an unnamed save_weights_for_sampler, keyed by
 *               the sampling session id.
 *   checkpoint  a registry checkpoint loaded for sampling, keyed by its blob digest.
 *
 * Snapshots and checkpoints can be made again (a snapshot by saving again, a checkpoint
 * from its blob), so they are evicted, least recently used first, whenever an adapter
 * added would take the store over its budget. An adapter in use by a running batch is
 * pinned and stays. Training slots are evicted by the executor itself, to the blob store
 * (docs/architecture.md, "Pools and placement"), and rebuilt by exe_slot_restore.
 * The store is used by the executor's main thread only. */
#pragma once
#include "backend/backend.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { STORE_TRAINING, STORE_SNAPSHOT, STORE_CHECKPOINT, STORE_NKINDS } store_kind;

/* What a training slot holds, by operation seq_id of its model (executor/exe_durable.h):
 * the state after state_seq; its weights and moments as of base_seq (the last
 * create_model, optim_step or load_weights: gradients added since by forward_backward);
 * snap_seq and snap_step, the seq_id and optimizer step of its newest snapshot written or
 * being written (-1: none); snap_retry, the last write failed: the next is due at once. */
typedef struct {
    int64_t state_seq, base_seq, snap_seq, snap_step;
    bool snap_retry;
} slot_seqs;

typedef struct {
    store_kind kind;
    char key[256];
    be_adapter *ad;
    int pins;
    uint64_t last_use;
    double used_at;     /* CLOCK_MONOTONIC seconds of the last use */
    slot_seqs seqs;     /* training slots */
} store_entry;

typedef struct {
    const be_backend *be;
    void *ctx;
    size_t budget;      /* bytes of device memory adapters may hold */
    size_t used;
    store_entry *e;
    int n, cap;
    uint64_t clock;
} exe_store;

/* What the store holds, for the executors row and the logs. */
typedef struct {
    size_t budget, used;
    int count[STORE_NKINDS];
} exe_store_stats;

void exe_store_init(exe_store *s, const be_backend *be, void *ctx, size_t budget);
/* Frees every adapter. */
void exe_store_free(exe_store *s);

/* The adapter of (kind, key), or NULL; counts as a use for the LRU order. */
be_adapter *exe_store_get(exe_store *s, store_kind kind, const char *key);
/* Same, without counting as a use (bookkeeping: snapshots, eviction). */
be_adapter *exe_store_peek(const exe_store *s, store_kind kind, const char *key);
/* Same, pinned until exe_store_release (which evicts what pins kept over the budget). */
be_adapter *exe_store_acquire(exe_store *s, store_kind kind, const char *key);
void exe_store_release(exe_store *s, be_adapter *ad);

/* Adds ad under (kind, key), the store taking ownership; an adapter already there under
 * that key is freed (a retried operation). A training slot starts with seqs -1. Snapshots and checkpoints are evicted to fit
 * the budget (never ad itself); a training slot is added even when they cannot make room
 * (it is logged). pinned: ad comes back pinned (as exe_store_acquire). 0, or -1 with err
 * and ad freed (key too long). */
int exe_store_put(exe_store *s, store_kind kind, const char *key, be_adapter *ad, bool pinned, char *err,
                  size_t errlen);
/* Frees the adapter of (kind, key) if there is one (unload_model). */
void exe_store_drop(exe_store *s, store_kind kind, const char *key);

/* The seq_ids of a training slot (NULL when there is none); valid until the store changes. */
slot_seqs *exe_store_seqs(exe_store *s, const char *model_id);

void exe_store_get_stats(const exe_store *s, exe_store_stats *out);
/* The training slots unused for idle_s seconds or more, least recently used first (pointers
 * into the store, valid until it changes); returns n. */
int exe_store_idle_training(const exe_store *s, double idle_s, const char **keys, int cap);
/* The keys of one kind (pointers into the store, valid until it changes); returns n. */
int exe_store_keys(const exe_store *s, store_kind kind, const char **keys, int cap);
