/* exe_durable.c: durable training state (see exe_durable.h). */
#include "executor/exe_durable.h"
#include "executor/exe_ckpt.h"
#include "executor/exe_sql.h"
#include "executor/exe_train.h"
#include "model/adapter_io.h"
#include "registry/blobstore.h"
#include "registry/registry.h"
#include "common/db.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- a snapshot as bytes and as a row -------------------------------------------------- */

typedef struct {
    char model_id[256];
    int64_t seq, step;
    char digest[BLOB_DIGEST_HEX];
    uint8_t *bytes;        /* the blob, to store again if GC took it before the row */
    size_t len;
    bool failed;
} snap_blob;

/* The slot's weights, moments and step (the state after its base_seq) on the host. */
static int download(exe_state *st, be_adapter *ad, adapter_state *host, char *err, size_t errlen) {
    return be_adapter_to_state(st->be, st->ctx, ad, ADAPTER_PARAMS | ADAPTER_OPTIM, host, err, errlen);
}

static int store_blob(exe_state *st, const adapter_state *host, snap_blob *b, char *err, size_t errlen) {
    if (!st->blobs) { err_set(err, errlen, "this executor has no registry blob store (--blob-dir)"); return -1; }
    if (adapter_io_encode(host, true, &b->bytes, &b->len, err, errlen) < 0) return -1;
    b->step = host->step;
    return blob_put(st->blobs, b->bytes, b->len, b->digest, err, errlen);
}

/* Inside a transaction: the row, under the digest's shared lock (registry GC takes it
 * exclusive before it removes a blob no row names), storing the blob again if GC took it. */
static int record_blob(exe_state *st, PGconn *c, const snap_blob *b, char *err, size_t errlen) {
    if (exe_blob_hold(st, c, b->digest, b->bytes, b->len, err, errlen) < 0) return -1;
    char seq[24], step[24], size[24], eid[24];
    snprintf(seq, sizeof seq, "%lld", (long long)b->seq);
    snprintf(step, sizeof step, "%lld", (long long)b->step);
    snprintf(size, sizeof size, "%zu", b->len);
    snprintf(eid, sizeof eid, "%lld", (long long)st->executor_id);
    const char *p[6] = {b->model_id, seq, step, b->digest, size, eid};
    return db_exec(c, SQL_EXE_SNAPSHOT_PUT, 6, p, err, errlen);
}

/* ---- recovery -------------------------------------------------------------------------- */

/* The model's snapshot as a new training adapter and, in *seq, the seq_id it was taken after; 1 when there
 * is none, 0 done, -1 with err. */
static int load_snapshot(exe_state *st, PGconn *c, const char *model_id, const lora_config *lcfg, int64_t state_seq,
                         be_adapter **out, int64_t *seq, char *err, size_t errlen) {
    char sseq[24];
    snprintf(sseq, sizeof sseq, "%lld", (long long)state_seq);
    const char *p[2] = {model_id, sseq};
    PGresult *r = db_query(c, SQL_EXE_SNAPSHOT_GET, 2, p, err, errlen);
    if (!r) return -1;
    if (PQntuples(r) == 0) { PQclear(r); return 1; }
    *seq = db_int(r, 0, 0);
    char digest[BLOB_DIGEST_HEX];
    snprintf(digest, sizeof digest, "%s", PQgetvalue(r, 0, 2));
    PQclear(r);
    void *buf;
    size_t len;
    if (!st->blobs) { err_set(err, errlen, "this executor has no registry blob store (--blob-dir)"); return -1; }
    if (blob_get(st->blobs, digest, &buf, &len, err, errlen) < 0) return -1;
    lora_layout layout;
    adapter_state host = {0};
    int rc = lora_layout_init(&layout, &st->model, lcfg, err, errlen);
    if (rc == 0) {
        rc = adapter_state_alloc(&host, &layout, ADAPTER_PARAMS | ADAPTER_OPTIM, err, errlen);
        lora_layout_free(&layout);
    }
    if (rc == 0) rc = adapter_io_restore(&host, buf, len, true, err, errlen);
    free(buf);
    if (rc == 0 && !(*out = be_adapter_from_state(st->be, st->ctx, &host, true, err, errlen))) rc = -1;
    adapter_state_free(&host);
    return rc;
}

/* Runs one recorded operation again on the slot. -1 with err when it does not do what it
 * did the first time (fails, or a forward_backward reports another loss). */
static int replay_op(exe_state *st, const char *model_id, const lora_config *lcfg, PGresult *r, int row, char *err,
                     size_t errlen) {
    exe_op op;
    memset(&op, 0, sizeof op);
    snprintf(op.model_id, sizeof op.model_id, "%s", model_id);
    snprintf(op.kind, sizeof op.kind, "%s", PQgetvalue(r, row, 1));
    op.seq_id = db_int(r, row, 0);
    op.lcfg = *lcfg;
    json_error_t je;
    if (!(op.payload = json_loads(PQgetvalue(r, row, 2), 0, &je))) {
        err_set(err, errlen, "seq_id %lld: stored payload is not JSON: %s", (long long)op.seq_id, je.text);
        return -1;
    }
    if (!PQgetisnull(r, row, 4) && !(op.payload_bin = exe_copy_bytes(r, row, 4, &op.payload_bin_len))) {
        json_decref(op.payload);
        err_set(err, errlen, "seq_id %lld: no memory for its payload", (long long)op.seq_id);
        return -1;
    }
    if (!strcmp(op.kind, OP_FORWARD_BACKWARD)) {
        exe_op *p = &op;
        exe_run_fb_batch(st, &p, 1, true);
    } else if (!strcmp(op.kind, OP_OPTIM_STEP)) {
        exe_run_optim(st, &op);
    } else if (!strcmp(op.kind, OP_LOAD_WEIGHTS)) {
        exe_load_checkpoint(st, &op);
    }
    int rc = 0;
    if (!op.applied) {
        err_set(err, errlen, "replaying %s seq_id %lld failed: %s", op.kind, (long long)op.seq_id,
                op.category ? op.error : "it changed nothing");
        rc = -1;
    } else if (!PQgetisnull(r, row, 3) && op.result) {
        /* The loss it reported then, and now, as the 9 digits clients saw: a difference
         * means this executor computes differently (another backend build) and the state
         * it rebuilt is not the one acknowledged. */
        double then = strtod(PQgetvalue(r, row, 3), NULL);
        char now_txt[64];
        snprintf(now_txt, sizeof now_txt, "%.9g", json_number_value(json_object_get(json_object_get(op.result,
                                                                                               "metrics"),
                                                                         "loss:sum")));
        char then_txt[64];
        snprintf(then_txt, sizeof then_txt, "%.9g", then);
        if (strcmp(now_txt, then_txt))
            log_error("model %s: replaying forward_backward seq_id %lld gave loss:sum %s where it reported %s: this "
                      "executor's numerics differ from the one that ran it (backend build, CPU?); the rebuilt state "
                      "is not bitwise the acknowledged one", model_id, (long long)op.seq_id, now_txt, then_txt);
    }
    json_decref(op.payload);
    json_decref(op.result);
    free(op.payload_bin);
    free(op.result_bin);
    return rc;
}

#define REPLAY_BATCH 16   /* operations read per query (payloads can be megabytes) */

static int replay(exe_state *st, PGconn *c, const char *model_id, const lora_config *lcfg, int64_t state_seq,
                  slot_seqs *q, int *count, char *err, size_t errlen) {
    for (;;) {
        char from[24], to[24], lim[8];
        snprintf(from, sizeof from, "%lld", (long long)q->state_seq);
        snprintf(to, sizeof to, "%lld", (long long)state_seq);
        snprintf(lim, sizeof lim, "%d", REPLAY_BATCH);
        const char *p[4] = {model_id, from, to, lim};
        PGresult *r = db_query_bin(c, SQL_EXE_REPLAY_OPS, 4, p, NULL, NULL, 1, err, errlen);
        if (!r) return -1;
        int rows = PQntuples(r);
        for (int i = 0; i < rows; i++) {
            if (replay_op(st, model_id, lcfg, r, i, err, errlen) < 0) { PQclear(r); return -1; }
            q->state_seq = db_int(r, i, 0);
            if (strcmp(PQgetvalue(r, i, 1), OP_FORWARD_BACKWARD)) q->base_seq = q->state_seq;
            (*count)++;
        }
        PQclear(r);
        if (rows < REPLAY_BATCH) break;
    }
    if (q->state_seq != state_seq) {
        err_set(err, errlen, "the operations recorded as applied end at seq_id %lld, not at the model's state %lld",
                (long long)q->state_seq, (long long)state_seq);
        return -1;
    }
    return 0;
}

int exe_slot_restore(exe_state *st, PGconn *c, const char *model_id, const lora_config *lcfg, int64_t state_seq,
                     char *err, size_t errlen) {
    slot_seqs *q = exe_store_seqs(&st->store, model_id);
    if (q && q->state_seq == state_seq) return 0;
    if (q) {
        log_warn("model %s: the copy here is its state after seq_id %lld, the committed one after %lld; rebuilding it",
                 model_id, (long long)q->state_seq, (long long)state_seq);
        exe_store_drop(&st->store, STORE_TRAINING, model_id);
    }
    if (state_seq < 0) return 0;
    double t0 = clock_mono_s();
    be_adapter *ad = NULL;
    int64_t snap = -1;
    int rc = load_snapshot(st, c, model_id, lcfg, state_seq, &ad, &snap, err, errlen);
    if (rc < 0) return -1;
    if (rc == 1) {   /* no snapshot: from the create_model (seq 0) on */
        snap = -1;
        if (!(ad = be_adapter_new(st->be, st->ctx, lcfg, true, err, errlen))) return -1;
    }
    int64_t step0 = ad->step;
    if (exe_store_put(&st->store, STORE_TRAINING, model_id, ad, false, err, errlen) < 0) return -1;
    q = exe_store_seqs(&st->store, model_id);
    int64_t base = snap >= 0 ? snap : 0;
    *q = (slot_seqs){.state_seq = base, .base_seq = base, .snap_seq = snap, .snap_step = step0};
    int count = 0;
    if (replay(st, c, model_id, lcfg, state_seq, q, &count, err, errlen) < 0) {
        exe_store_drop(&st->store, STORE_TRAINING, model_id);
        return -1;
    }
    char from[64] = "its create_model";
    if (snap >= 0) snprintf(from, sizeof from, "its snapshot after seq_id %lld", (long long)snap);
    log_info("model %s: state after seq_id %lld restored from %s and %d operation(s) replayed in %.3f s", model_id,
             (long long)state_seq, from, count, clock_mono_s() - t0);
    return 0;
}

void exe_slots_advance(exe_state *st, const exe_op *ops, int n) {
    for (int i = 0; i < n; i++) {
        if (!ops[i].applied) continue;
        slot_seqs *q = exe_store_seqs(&st->store, ops[i].model_id);
        if (!q) continue;
        if (ops[i].seq_id > q->state_seq) q->state_seq = ops[i].seq_id;
        if (strcmp(ops[i].kind, OP_FORWARD_BACKWARD)) q->base_seq = ops[i].seq_id;
    }
}

/* ---- snapshots in the commit ----------------------------------------------------------- */

struct exe_snap_set {
    snap_blob *b;
    int n;
};

/* Whether the model must be snapshot before its cycle commits: it loaded a checkpoint, or
 * its state cannot be replayed exactly (the backend is not batch-invariant). */
static bool needs_sync_snapshot(const exe_state *st, const exe_op *op) {
    if (!op->applied || !strcmp(op->kind, OP_FORWARD_BACKWARD)) return false;
    return !strcmp(op->kind, OP_LOAD_WEIGHTS) || !st->be->batch_invariant;
}

static void free_set(exe_snap_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n; i++) free(set->b[i].bytes);
    free(set->b);
    free(set);
}

exe_snap_set *exe_snapshots_before_commit(exe_state *st, exe_op *ops, int n) {
    exe_snap_set *set = NULL;
    for (int i = 0; i < n; i++) {
        if (!needs_sync_snapshot(st, &ops[i])) continue;
        /* the model's last op of the cycle that needs it: ops are in seq order per model */
        bool later = false;
        for (int j = i + 1; j < n && !strcmp(ops[j].model_id, ops[i].model_id); j++) later |= needs_sync_snapshot(st, &ops[j]);
        if (later) continue;
        if (!set && !(set = calloc(1, sizeof *set))) return NULL;
        snap_blob *nb = realloc(set->b, (set->n + 1) * sizeof *nb);
        if (!nb) break;
        set->b = nb;
        snap_blob *b = &set->b[set->n++];
        memset(b, 0, sizeof *b);
        snprintf(b->model_id, sizeof b->model_id, "%s", ops[i].model_id);
        b->seq = ops[i].seq_id;
        char err[512] = "";
        be_adapter *ad = exe_store_peek(&st->store, STORE_TRAINING, ops[i].model_id);
        adapter_state host;
        int rc = ad ? download(st, ad, &host, err, sizeof err) : (err_set(err, sizeof err, "no training slot"), -1);
        if (rc == 0) {
            rc = store_blob(st, &host, b, err, sizeof err);
            adapter_state_free(&host);
        }
        if (rc < 0) {
            b->failed = true;
            exe_op_fail(&ops[i], "server", "the model's state after this %s could not be made durable (%s); the "
                        "operation was not applied", ops[i].kind, err);
            ops[i].applied = false;
        }
    }
    return set;
}

int exe_snapshots_record(exe_state *st, PGconn *c, exe_snap_set *set, char *err, size_t errlen) {
    for (int i = 0; set && i < set->n; i++)
        if (!set->b[i].failed && record_blob(st, c, &set->b[i], err, errlen) < 0) return -1;
    return 0;
}

void exe_snapshots_done(exe_state *st, exe_snap_set *set, bool committed) {
    for (int i = 0; set && i < set->n; i++) {
        snap_blob *b = &set->b[i];
        slot_seqs *q = exe_store_seqs(&st->store, b->model_id);
        if (!q) continue;
        if (b->failed) {   /* the slot is ahead of what was committed */
            exe_store_drop(&st->store, STORE_TRAINING, b->model_id);
        } else if (committed) {
            q->snap_seq = b->seq;
            q->snap_step = b->step;
            q->snap_retry = false;
        }
    }
    free_set(set);
}

/* ---- the writer thread ------------------------------------------------------------------ */

#define WRITER_QUEUE 2   /* host copies waiting (each the size of an adapter's weights and moments) */

typedef struct {
    char model_id[256];
    int64_t seq;
    adapter_state host;
} snap_job;

/* A write that failed, for the loop thread to learn of (it owns the slots). */
typedef struct {
    char model_id[256];
    int64_t seq;
} snap_failure;

struct snap_writer {
    exe_state *st;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    snap_job q[WRITER_QUEUE];
    int n, busy;
    bool stop;
    PGconn *c;
    snap_failure *failed;   /* not yet taken by the loop thread */
    int nfailed;
    bool failing;           /* the last write failed (logged once until one succeeds) */
};

static void write_job(struct snap_writer *w, snap_job *j) {
    exe_state *st = w->st;
    char err[512] = "";
    snap_blob b = {.seq = j->seq};
    snprintf(b.model_id, sizeof b.model_id, "%s", j->model_id);
    double t0 = clock_mono_s();
    int rc = store_blob(st, &j->host, &b, err, sizeof err);
    if (rc == 0) {
        if (!w->c || PQstatus(w->c) != CONNECTION_OK) {
            if (w->c) PQfinish(w->c);
            w->c = db_connect(st->db_conninfo, 5000, err, sizeof err);
        }
        rc = w->c && db_begin(w->c, err, sizeof err) == 0 ? 0 : -1;
        if (rc == 0 && (record_blob(st, w->c, &b, err, sizeof err) < 0 || db_commit(w->c, err, sizeof err) < 0)) {
            db_rollback(w->c);
            rc = -1;
        }
    }
    pthread_mutex_lock(&w->mu);
    bool was_failing = w->failing;
    w->failing = rc < 0;
    if (rc < 0) {
        snap_failure *nf = realloc(w->failed, (size_t)(w->nfailed + 1) * sizeof *nf);
        if (nf) {
            w->failed = nf;
            snprintf(nf[w->nfailed].model_id, sizeof nf[w->nfailed].model_id, "%s", j->model_id);
            nf[w->nfailed++].seq = j->seq;
        }
    }
    pthread_mutex_unlock(&w->mu);
    /* A store that cannot be written fails every write until it is mended: said once. */
    if (rc < 0 && !was_failing)
        log_error("model %s: snapshot after seq_id %lld not written: %s; a recovery replays the operations since "
                  "the last snapshot written, and the snapshot is tried again with the model's next operation "
                  "(further failures are not logged until one is written)", j->model_id, (long long)j->seq, err);
    else if (rc < 0)
        log_debug("model %s: snapshot after seq_id %lld not written: %s", j->model_id, (long long)j->seq, err);
    else
        log_info("model %s: snapshot after seq_id %lld (step %lld, %zu bytes) written in %.3f s%s", j->model_id,
                 (long long)j->seq, (long long)b.step, b.len, clock_mono_s() - t0,
                 was_failing ? " (snapshots are written again)" : "");
    free(b.bytes);
}

static void *writer_main(void *arg) {
    struct snap_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->n && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->n) break;
        snap_job j = w->q[0];
        memmove(&w->q[0], &w->q[1], (size_t)(w->n - 1) * sizeof j);
        w->n--;
        w->busy = 1;
        pthread_mutex_unlock(&w->mu);
        write_job(w, &j);
        adapter_state_free(&j.host);
        pthread_mutex_lock(&w->mu);
        w->busy = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    if (w->c) PQfinish(w->c);
    return NULL;
}

int exe_snapshot_writer_start(exe_state *st, char *err, size_t errlen) {
    struct snap_writer *w = calloc(1, sizeof *w);
    if (!w) { err_set(err, errlen, "out of memory"); return -1; }
    w->st = st;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        free(w);
        err_set(err, errlen, "cannot start the snapshot writer thread");
        return -1;
    }
    st->writer = w;
    return 0;
}

/* Hands the slot's state to the writer; wait: even if the queue is full (else skipped). */
static void enqueue(exe_state *st, const char *model_id, slot_seqs *q, be_adapter *ad, bool wait) {
    struct snap_writer *w = st->writer;
    if (!w || !st->blobs) return;
    pthread_mutex_lock(&w->mu);
    while (wait && w->n == WRITER_QUEUE) pthread_cond_wait(&w->cv, &w->mu);
    bool room = w->n < WRITER_QUEUE;
    pthread_mutex_unlock(&w->mu);
    if (!room) return;
    snap_job j = {.seq = q->base_seq};
    snprintf(j.model_id, sizeof j.model_id, "%s", model_id);
    char err[512];
    if (download(st, ad, &j.host, err, sizeof err) < 0) {
        log_warn("model %s: snapshot: %s", model_id, err);
        return;
    }
    q->snap_seq = q->base_seq;   /* being written; take_failures undoes it if the write fails */
    q->snap_step = ad->step;
    q->snap_retry = false;
    pthread_mutex_lock(&w->mu);
    w->q[w->n++] = j;   /* only this thread adds: the room is still there */
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void wait_idle(exe_state *st) {
    struct snap_writer *w = st->writer;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    while (w->n || w->busy) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

/* The slots whose snapshot the writer failed to write learn of it (unless a newer one
 * was handed over since): no snapshot is being written for them, and the next is due at
 * once rather than --snapshot-every steps after the failed one (a recovery would replay
 * up to twice as many steps). */
static void take_failures(exe_state *st) {
    struct snap_writer *w = st->writer;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    snap_failure *f = w->failed;
    int n = w->nfailed;
    w->failed = NULL;
    w->nfailed = 0;
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < n; i++) {
        slot_seqs *q = exe_store_seqs(&st->store, f[i].model_id);
        if (!q || q->snap_seq != f[i].seq) continue;
        q->snap_seq = -1;   /* the one written before is not known here: -1 makes any state newer */
        q->snap_retry = true;
    }
    free(f);
}

/* Whether the slot's snapshot is due after a committed cycle that changed its state. */
static bool snapshot_due(const exe_state *st, const slot_seqs *q, const be_adapter *ad) {
    return q->base_seq > q->snap_seq && (q->snap_retry || ad->step - q->snap_step >= st->snapshot_every);
}

void exe_snapshots_after_commit(exe_state *st, const exe_op *ops, int n) {
    take_failures(st);
    for (int i = 0; i < n; i++) {
        if (!ops[i].applied || (i + 1 < n && !strcmp(ops[i + 1].model_id, ops[i].model_id))) continue;
        slot_seqs *q = exe_store_seqs(&st->store, ops[i].model_id);
        be_adapter *ad = exe_store_peek(&st->store, STORE_TRAINING, ops[i].model_id);
        if (q && ad && snapshot_due(st, q, ad)) enqueue(st, ops[i].model_id, q, ad, false);
    }
}

void exe_snapshot_slots(exe_state *st, const char *model_id, bool wait) {
    take_failures(st);
    exe_store_stats ss;
    exe_store_get_stats(&st->store, &ss);
    int n = ss.count[STORE_TRAINING];
    const char **keys = n ? malloc(n * sizeof *keys) : NULL;
    n = keys ? exe_store_keys(&st->store, STORE_TRAINING, keys, n) : 0;
    for (int i = 0; i < n; i++) {
        if (model_id && strcmp(keys[i], model_id)) continue;
        slot_seqs *q = exe_store_seqs(&st->store, keys[i]);
        be_adapter *ad = exe_store_peek(&st->store, STORE_TRAINING, keys[i]);
        if (q && ad && q->base_seq > q->snap_seq) enqueue(st, keys[i], q, ad, true);
    }
    free(keys);
    if (wait) wait_idle(st);
}

void exe_snapshot_writer_stop(exe_state *st) {
    struct snap_writer *w = st->writer;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->failed);
    free(w);
    st->writer = NULL;
}

/* ---- handing a model over ---------------------------------------------------------------- */

int exe_hand_over(exe_state *st, PGconn *c, const char *model_id, char *err, size_t errlen) {
    exe_snapshot_slots(st, model_id, true);
    char eid[24];
    snprintf(eid, sizeof eid, "%lld", (long long)st->executor_id);
    const char *p[2] = {model_id, eid};
    PGresult *r = db_query(c, SQL_EXE_UNPIN, 2, p, err, errlen);
    if (!r) return -1;
    int moved = PQntuples(r) > 0;
    PQclear(r);
    if (moved) exe_store_drop(&st->store, STORE_TRAINING, model_id);
    return moved;
}
