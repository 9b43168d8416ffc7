/* executor.c: the executor's loop and the translation between operation rows (the
 * normalised payload JSON written by the api) and the backend's packed batch.
 *
 * One cycle (docs/architecture.md, "Clock cycles"): create_model ops make adapters;
 * every forward_backward of the cycle runs as ONE packed batch across adapters (and every
 * forward as another, without gradients); then each model's optim_step and checkpoint
 * work (handler tables of the op family files); then all sampling requests together; then
 * all results are committed in one transaction guarded by "still claimed by this cycle",
 * so a cycle the reaper took back cannot write. A heartbeat thread keeps the executor row
 * and the cycle's lease fresh while the (possibly long) compute runs; once the reaper has
 * written this executor off as gone, the heartbeat fences it: it touches no cycle again
 * and exits, so that a supervisor starts a new registration.
 *
 * Durable state (exe_durable.h): before a cycle runs, every model of it is brought to its
 * committed state (kept, or rebuilt from its snapshot and a replay); the commit records
 * which operations changed a model's state, and snapshots are written after it.
 *
 * Database errors in a cycle: marking it running and reading its operations is one
 * statement, so an error there leaves the cycle assigned and the next poll (on a fresh
 * connection if it broke) takes it again. The commit is retried until the database is
 * back (an outage only pauses the executor), unless the cycle was taken back meanwhile:
 * then its results are dropped with the copies of its models, which are rebuilt from what
 * was committed. A cycle that cannot be started three times in a row ends the process. */
#include "executor/executor.h"
#include "executor/exe_ckpt.h"
#include "executor/exe_durable.h"
#include "executor/exe_obs.h"
#include "executor/exe_ops.h"
#include "executor/exe_sample.h"
#include "executor/exe_sql.h"
#include "executor/exe_train.h"
#include "registry/blobstore.h"
#include "scheduler/planner.h"
#include "scheduler/sched.h"
#include "common/clock.h"
#include "common/common_sql.h"
#include "common/db.h"
#include "common/log.h"
#include "common/pgarray.h"
#include "common/migrate.h"
#include <errno.h>
#include <jansson.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;
static void on_signal(int s) { g_stop = 1; }
/* Set by the heartbeat thread when the executor row says 'gone'. */
static atomic_bool g_fenced;
/* Set by the heartbeat thread from the row's draining flag (`loom executor drain`). */
static atomic_bool g_draining;

/* Exit status of an executor that was written off as gone (a supervisor restarts it). */
#define EXE_EXIT_FENCED 3

static void exit_if_fenced(const char *when) {
    if (!atomic_load(&g_fenced)) return;
    log_error("this executor was written off as gone (no heartbeat for the scheduler's --executor-timeout-s, e.g. "
              "paused); exiting %s so that a new registration replaces it", when);
    exit(EXE_EXIT_FENCED);
}

static void fmt_i64(char *buf, size_t n, int64_t v) { snprintf(buf, n, "%lld", (long long)v); }

/* The loop's connection LISTENs on this executor's channel only while it waits for a
 * cycle (SQL_EXE_LISTEN_FMT): g_listen_sql is the statement, g_listen_pid the server
 * process of the session that listens (0: none; a reset or reconnect is a new session
 * that does not). */
static char g_listen_sql[64];
static int g_listen_pid;
static bool listening(PGconn *c) { return g_listen_pid && g_listen_pid == PQbackendPID(c); }

/* The scheduler's options for the cycles it builds itself (run_own_cycle): --lease-s and
 * --pair-hold-ms, as the scheduler's (SCHED_CLAIM_OPTS). */
static sched_opts g_claim = {.lease_s = 300, .max_models = 256, .pair_hold_ms = 100};
/* --gather-ms (shared with the scheduler): a hint waits this long before the own pass, so
 * that work submitted together (several tenants at once) shares the cycle, as the
 * scheduler's passes wait after a wake-up */
static int g_gather_ms;
/* The commit of the last cycle found work waiting for this executor (SQL_EXE_WORK_WAITS):
 * its own pass runs at once, reading it all (not a hint's operation alone). */
static bool g_backlog;

/* The store's figures as parameters of SQL_EXE_FINISH_CYCLE / SQL_EXE_CAPACITY. */
typedef struct {
    char used[24], training[16], snapshots[16], cached[16];
} capacity_params;

static void capacity_of(const exe_state *st, capacity_params *cp) {
    exe_store_stats s;
    exe_store_get_stats(&st->store, &s);
    snprintf(cp->used, sizeof cp->used, "%zu", s.used);
    snprintf(cp->training, sizeof cp->training, "%d", s.count[STORE_TRAINING]);
    snprintf(cp->snapshots, sizeof cp->snapshots, "%d", s.count[STORE_SNAPSHOT]);
    snprintf(cp->cached, sizeof cp->cached, "%d", s.count[STORE_CHECKPOINT]);
}

/* st->expert_tokens as a bigint[][] literal ([sparse layer][expert]) for
 * SQL_EXE_FINISH_CYCLE (malloc'd), or NULL (a dense model, or nothing routed yet). */
static char *expert_tokens_param(const exe_state *st) {
    int layers = model_num_moe_layers(&st->model), E = st->model.num_experts;
    if (!st->expert_tokens || layers == 0) return NULL;
    pgarray a;
    pga_init(&a);
    for (int l = 0; l < layers; l++) {
        pga_open(&a);
        for (int e = 0; e < E; e++) pga_int(&a, st->expert_tokens[(size_t)l * E + e]);
        pga_close(&a);
    }
    return pga_end(&a);
}

/* Each model's last operation of the cycle that changed its state, for models.state_seq
 * (ops are in seq order per model): the text[] and int[] parameters of
 * SQL_EXE_FINISH_CYCLE ($9, $10: malloc'd), both NULL (none) when no model's state
 * changed. */
static void model_states_params(const exe_op *ops, int n, char **models, char **seqs_out) {
    pgarray ids, seqs;
    pga_init(&ids);
    pga_init(&seqs);
    bool any = false;
    for (int i = 0; i < n; i++) {
        if (!ops[i].model_id[0] || (i + 1 < n && !strcmp(ops[i + 1].model_id, ops[i].model_id))) continue;
        int64_t seq = -1;
        for (int j = i; j >= 0 && !strcmp(ops[j].model_id, ops[i].model_id); j--)
            if (ops[j].applied && ops[j].seq_id > seq) seq = ops[j].seq_id;
        if (seq < 0) continue;
        pga_text(&ids, ops[i].model_id);
        pga_int(&seqs, seq);
        any = true;
    }
    *models = pga_end(&ids);
    *seqs_out = pga_end(&seqs);
    if (!any) {
        free(*models);
        free(*seqs_out);
        *models = *seqs_out = NULL;
    }
}

/* The cycle's outcomes as the JSON parameter of SQL_EXE_FINISH_OPS (malloc'd), and the
 * packed results it points into as its binary parameter (*bins, malloc'd; NULL: none). */
static char *outcomes_json(const exe_op *ops, int n, uint8_t **bins, size_t *bins_len) {
    json_t *outs = json_array();
    size_t at = 0;
    for (int i = 0; i < n; i++) at += ops[i].category ? 0 : ops[i].result_bin_len;
    *bins = at ? malloc(at) : NULL;
    *bins_len = at;
    if (at && !*bins) return NULL;
    at = 0;
    for (int i = 0; i < n; i++) {
        const exe_op *op = &ops[i];
        json_t *o = json_pack("{s:I, s:s, s:O?, s:s?, s:s?, s:b}", "id", (json_int_t)op->id, "state",
                              op->category ? "failed" : "done", "result", op->category ? NULL : op->result, "error",
                              op->category ? op->error : NULL, "category", op->category, "applied", op->applied);
        if (o && !op->category && op->result_bin) {
            memcpy(*bins + at, op->result_bin, op->result_bin_len);
            json_object_set_new(o, "bin_at", json_integer((json_int_t)at + 1));
            json_object_set_new(o, "bin_len", json_integer((json_int_t)op->result_bin_len));
            at += op->result_bin_len;
        }
        json_array_append_new(outs, o);
    }
    char *text = json_dumps(outs, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(outs);
    return text;
}

/* Runs the operations' commit hooks (checkpoint rows and the like) inside the open
 * transaction; a failing hook fails its operation only. -1 on a database error. */
static int run_commit_hooks(PGconn *c, exe_state *st, exe_op *ops, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        exe_op *op = &ops[i];
        if (op->category || !op->commit_hook) continue;
        /* A savepoint keeps a failing hook from aborting the whole cycle's transaction. */
        char herr[512] = "";
        if (db_exec(c, SQL_EXE_HOOK_SAVEPOINT, 0, NULL, err, errlen) < 0) return -1;
        if (op->commit_hook(c, st, op, herr, sizeof herr) < 0) {
            if (db_exec(c, SQL_EXE_HOOK_ROLLBACK, 0, NULL, err, errlen) < 0) return -1;
            exe_op_fail(op, "server", "%s", herr);
        } else if (db_exec(c, SQL_EXE_HOOK_RELEASE, 0, NULL, err, errlen) < 0) {
            return -1;
        }
    }
    return 0;
}

/* 0 committed; -1 a database error (worth another try); -2 the cycle is no longer this
 * executor's (the reaper took it back): its results must never be committed.
 * One round trip in the usual case (no commit hooks, no snapshot to record): the
 * statements up to the cycle's end, the COMMIT, the futures' wake-up (SQL_EXE_NOTIFY_DONE,
 * after the commit and not waiting for the disk) and the look for waiting work go in one
 * batch (db_pipeline), the results' statement failing (SQL_EXE_FINISH_OPS_ALL) unless every
 * operation was still the cycle's, which stops the rest, the COMMIT included. With hooks
 * or snapshots to record, those run between the batch and the COMMIT. */
static int commit_cycle(PGconn *c, exe_state *st, int64_t cycle, exe_op *ops, int n, exe_snap_set *snaps,
                        double compute_s, char *err, size_t errlen) {
    char cyc[24], eid[24], comp[32], nops[16];
    snprintf(comp, sizeof comp, "%.6f", compute_s);
    snprintf(nops, sizeof nops, "%d", n);
    fmt_i64(cyc, sizeof cyc, cycle);
    fmt_i64(eid, sizeof eid, st->executor_id);
    bool hooks = false;
    for (int i = 0; i < n; i++) hooks |= !ops[i].category && ops[i].commit_hook;
    bool one_trip = !hooks && !snaps;
    if (hooks && (db_begin(c, err, errlen) < 0 || run_commit_hooks(c, st, ops, n, err, errlen) < 0)) goto fail;

    uint8_t *bins = NULL;
    size_t bins_len = 0;
    char *outcomes = n > 0 ? outcomes_json(ops, n, &bins, &bins_len) : NULL, *models = NULL, *seqs = NULL;
    if (n > 0 && !outcomes) { free(bins); snprintf(err, errlen, "the cycle's results could not be encoded"); goto fail; }
    const char *pf[4] = {outcomes, cyc, (const char *)bins, nops};
    const int pf_len[4] = {[2] = (int)bins_len}, pf_fmt[4] = {[2] = 1};
    db_bin bin[8] = {{NULL, NULL, 0}};
    model_states_params(ops, n, &models, &seqs);
    capacity_params cp;
    capacity_of(st, &cp);
    char *experts = expert_tokens_param(st);
    const char *pe[1] = {eid};
    const char *pc[10] = {cyc, comp, eid, cp.used, cp.training, cp.snapshots, cp.cached, experts,
                          models, seqs};
    db_stmt b[8];
    int nb = 0, finish_at = -1, commit_at = -1;
    if (!hooks) b[nb++] = (db_stmt){SQL_BEGIN, 0, NULL};
    /* The executor is idle, and listens for its next cycle, from the same commit: the
     * scheduler, which builds cycles only for idle executors, cannot notify it before. */
    b[nb++] = (db_stmt){g_listen_sql, 0, NULL};
    if (n > 0) {
        finish_at = nb;
        bin[nb] = (db_bin){pf_len, pf_fmt, 0};
        b[nb++] = one_trip ? (db_stmt){SQL_EXE_FINISH_OPS_ALL, 4, pf} : (db_stmt){SQL_EXE_FINISH_OPS, 3, pf};
    }
    b[nb++] = (db_stmt){SQL_EXE_FINISH_CYCLE, 10, pc};
    const char *pd[1] = {cyc};
    if (one_trip) {
        commit_at = nb;
        b[nb++] = (db_stmt){SQL_COMMIT, 0, NULL};
        b[nb++] = (db_stmt){SQL_EXE_NOTIFY_DONE, 1, pd};
        b[nb++] = (db_stmt){SQL_EXE_WORK_WAITS, 1, pe};
    }
    PGresult *r[8];
    int got = db_pipeline_bin(c, b, bin, nb, r, err, errlen);
    bool taken_back = got == finish_at && !strcmp(db_last_sqlstate(), EXE_SQLSTATE_TAKEN_BACK);
    free(experts);
    free(outcomes);
    free(bins);
    free(models);
    free(seqs);
    int changed = !one_trip && finish_at >= 0 && got > finish_at ? (int)db_int(r[finish_at], 0, 0) : n;
    if (one_trip && got == nb) g_backlog = PQntuples(r[nb - 1]) > 0;
    for (int i = 0; i < nb; i++) PQclear(r[i]);
    if (one_trip) {
        if (got > commit_at) {   /* committed */
            if (got < nb) log_warn("cycle %s: after its commit, waking its futures and looking for work: %s", cyc, err);
            g_listen_pid = PQbackendPID(c);
            return 0;
        }
        if (taken_back) {
            snprintf(err, errlen, "%s", db_last_message());   /* loom_refuse's message alone */
            db_rollback(c);
            return -2;
        }
        if (got == commit_at) return -1;   /* the session broke in its commit: it is tried again */
        goto fail;
    }
    if (got < nb) goto fail;
    if (changed != n) {
        snprintf(err, errlen, "%d of the %d operations of cycle %s are no longer claimed by it (lease expired?)",
                 n - changed, n, cyc);
        db_rollback(c);
        return -2;
    }
    if (exe_snapshots_record(st, c, snaps, err, errlen) < 0) goto fail;
    db_stmt end[3] = {{SQL_COMMIT, 0, NULL}, {SQL_EXE_NOTIFY_DONE, 1, pd}, {SQL_EXE_WORK_WAITS, 1, pe}};
    PGresult *re[3];
    int ended = db_pipeline(c, end, 3, re, err, errlen);
    if (ended == 3) g_backlog = PQntuples(re[2]) > 0;
    for (int i = 0; i < 3; i++) PQclear(re[i]);
    if (ended < 1) return -1;   /* the session broke in its commit: it is tried again */
    if (ended < 3) log_warn("cycle %s: after its commit, waking its futures and looking for work: %s", cyc, err);
    g_listen_pid = PQbackendPID(c);
    return 0;
fail:
    db_rollback(c);
    return -1;
}

static exe_op_handler find_handler(const char *kind) {
    const exe_handler_entry *tables[] = {exe_ckpt_handlers, exe_sample_handlers};
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        for (const exe_handler_entry *e = tables[t]; e->kind; e++)
            if (!strcmp(e->kind, kind)) return e->run;
    return NULL;
}

static int read_cycle(PGresult *r, int64_t *cycle, exe_op **ops, int *n);

/* How start_cycle changes the loop connection's LISTEN, in the same round trip: before
 * waiting the executor listens (and then looks, so that no cycle built in between goes
 * unseen); woken for a cycle, it stops listening while it runs one. */
typedef enum { START_LISTEN, START_UNLISTEN } start_mode;

/* Starts this executor's oldest open cycle and reads its operations (SQL_EXE_START_CYCLE),
 * after LISTEN or UNLISTEN as mode says. 1 with *cycle, *ops, *n (free with free_ops); 0
 * when it has no open cycle; -1 on a database error, the cycle left as it was (and the
 * connection taken as not listening). */
static int start_cycle(PGconn *c, exe_state *st, start_mode mode, int64_t *cycle, exe_op **ops, int *n, char *err,
                       size_t errlen) {
    char eid[24];
    fmt_i64(eid, sizeof eid, st->executor_id);
    const char *p[1] = {eid};
    db_stmt b[5] = {{SQL_BEGIN, 0, NULL},
                    {SQL_EXE_ASYNC_COMMIT, 0, NULL},
                    {mode == START_LISTEN ? g_listen_sql : SQL_EXE_UNLISTEN, 0, NULL},
                    {SQL_EXE_START_CYCLE, 1, p},
                    {SQL_COMMIT, 0, NULL}};
    db_bin bin[5] = {{NULL, NULL, 0}, {NULL, NULL, 0}, {NULL, NULL, 0}, {NULL, NULL, 1}, {NULL, NULL, 0}};
    PGresult *res[5];
    int pid = PQbackendPID(c), got = db_pipeline_bin(c, b, bin, 5, res, err, errlen);
    g_listen_pid = got == 5 && mode == START_LISTEN && PQbackendPID(c) == pid ? pid : 0;
    PGresult *r = res[3];
    for (int i = 0; i < 5; i++)
        if (i != 3) PQclear(res[i]);
    if (got < 5) {
        PQclear(r);
        if (PQstatus(c) == CONNECTION_OK) db_rollback(c);
        return -1;
    }
    return read_cycle(r, cycle, ops, n);
}

/* The rows of SQL_EXE_START_CYCLE (r, PQclear'ed here) as the cycle and its operations:
 * 1 with *cycle, *ops, *n (free with free_ops); 0 when there was no open cycle. */
static int read_cycle(PGresult *r, int64_t *cycle, exe_op **ops, int *n) {
    int rows = PQntuples(r);
    if (rows == 0) { PQclear(r); return 0; }
    *cycle = db_int(r, 0, 15);
    *ops = calloc(rows, sizeof **ops);
    *n = 0;
    for (int i = 0; i < rows; i++) {
        if (PQgetisnull(r, i, 0)) continue;   /* the cycle has no claimed operation left */
        exe_op *op = &(*ops)[(*n)++];
        op->id = db_int(r, i, 0);
        snprintf(op->request_id, sizeof op->request_id, "%s", PQgetvalue(r, i, 1));
        snprintf(op->model_id, sizeof op->model_id, "%s", PQgetvalue(r, i, 2));
        snprintf(op->kind, sizeof op->kind, "%s", PQgetvalue(r, i, 3));
        json_error_t je;
        op->payload = json_loads(PQgetvalue(r, i, 4), 0, &je);
        op->lcfg = (lora_config){.rank = (int)db_int(r, i, 5), .seed = (uint64_t)db_int(r, i, 6),
                                 .train_attn = db_bool(r, i, 7), .train_mlp = db_bool(r, i, 8),
                                 .train_unembed = db_bool(r, i, 9)};
        op->seq_id = db_int(r, i, 10);
        snprintf(op->sampling_session_id, sizeof op->sampling_session_id, "%s", PQgetvalue(r, i, 11));
        op->tenant_id = db_int(r, i, 12);
        op->state_seq = PQgetisnull(r, i, 13) ? -1 : db_int(r, i, 13);
        snprintf(op->snapshot_digest, sizeof op->snapshot_digest, "%s", PQgetvalue(r, i, 14));
        snprintf(op->tenant_name, sizeof op->tenant_name, "%s", PQgetvalue(r, i, 17));
        op->tokens = db_int(r, i, 18);
        if (!op->payload) exe_op_fail(op, "server", "stored payload is not JSON: %s", je.text);
        if (!PQgetisnull(r, i, 16) && !(op->payload_bin = exe_copy_bytes(r, i, 16, &op->payload_bin_len)))
            exe_op_fail(op, "server", "no memory for its payload (%d bytes)", PQgetlength(r, i, 16));
    }
    PQclear(r);
    return 1;
}

static void free_ops(exe_op *ops, int n) {
    for (int i = 0; i < n; i++) {
        json_decref(ops[i].payload);
        json_decref(ops[i].result);
        free(ops[i].payload_bin);
        free(ops[i].result_bin);
        free(ops[i].hook_data);
    }
    free(ops);
}

/* The compute of a cycle: every op ends with a result or an error. */
static void run_ops(exe_state *st, exe_op *ops, int n) {
    /* 1. new adapters; 2. packed forward_backward, then packed forward; 3. optimizer steps. */
    exe_op **fb = calloc(n > 0 ? (size_t)n : 1, sizeof *fb), **fwd = calloc(n > 0 ? (size_t)n : 1, sizeof *fwd);
    int nfb = 0, nfwd = 0;
    for (int i = 0; i < n; i++) {
        exe_op *op = &ops[i];
        if (op->category) continue;
        if (!strcmp(op->kind, OP_CREATE_MODEL)) exe_run_create(st, op);
        else if (!strcmp(op->kind, OP_FORWARD_BACKWARD)) fb[nfb++] = op;
        else if (!strcmp(op->kind, OP_FORWARD)) fwd[nfwd++] = op;
    }
    exe_run_fb_batch(st, fb, nfb, true);
    exe_run_fb_batch(st, fwd, nfwd, false);
    exe_op **samples = calloc(n > 0 ? (size_t)n : 1, sizeof *samples);
    int nsamples = 0;
    for (int i = 0; i < n; i++) {
        exe_op *op = &ops[i];
        if (op->category || op->result) continue;
        if (!strcmp(op->kind, OP_CREATE_MODEL) || !strcmp(op->kind, OP_FORWARD_BACKWARD) ||
            !strcmp(op->kind, OP_FORWARD)) {
            /* ran above but has neither result nor error: its result could not be built */
            exe_op_fail(op, "server", "%s finished without a result (the result could not be encoded)", op->kind);
            continue;
        }
        if (!strcmp(op->kind, OP_OPTIM_STEP)) { exe_run_optim(st, op); continue; }
        if (!strcmp(op->kind, OP_SAMPLE)) { samples[nsamples++] = op; continue; }
        if (!strcmp(op->kind, OP_SAVE_FOR_SAMPLER) && json_object_get(op->payload, "sampling_session_id")) {
            exe_run_snapshot(st, op);
            continue;
        }
        exe_op_handler h = find_handler(op->kind);
        if (h) h(st, op);
        else exe_op_fail(op, "user", "operation '%s' is not implemented yet in this Loom version", op->kind);
    }
    /* 4. sampling last: it sees every weight update of this cycle. */
    exe_run_sample_batch(st, samples, nsamples);
    free(samples);
    free(fb);
    free(fwd);
}

/* Every model of the cycle gets its committed state in the store before anything runs
 * (exe_durable.h); the operations of a model that cannot be restored fail. */
static void restore_slots(exe_state *st, PGconn *c, exe_op *ops, int n) {
    for (int i = 0; i < n; i++) {
        if (!ops[i].model_id[0] || (i && !strcmp(ops[i - 1].model_id, ops[i].model_id))) continue;
        char err[512];
        if (exe_slot_restore(st, c, ops[i].model_id, &ops[i].lcfg, ops[i].state_seq, err, sizeof err) == 0) continue;
        log_error("model %s: restoring its training state failed: %s", ops[i].model_id, err);
        for (int j = i; j < n && !strcmp(ops[j].model_id, ops[i].model_id); j++)
            if (!ops[j].category)
                exe_op_fail(&ops[j], "server", "this model's training state could not be restored on this executor "
                            "(%s); the operation did not run: submit it again", err);
    }
}

/* The cycle's results were refused: the copies of its models here are ahead of what was
 * committed, and are rebuilt when their models come back. */
static void drop_slots(exe_state *st, const exe_op *ops, int n) {
    for (int i = 0; i < n; i++)
        if (ops[i].model_id[0] && exe_store_seqs(&st->store, ops[i].model_id))
            exe_store_drop(&st->store, STORE_TRAINING, ops[i].model_id);
}

/* Commits the cycle's results. A database error is retried (a PostgreSQL restart or
 * outage: the executor waits for it instead of exiting, its state would only have to be
 * rebuilt elsewhere) until it commits, it is fenced, or the cycle turns out to be taken
 * back. true when committed. */
static bool commit_with_retries(exe_state *st, PGconn *c, int64_t cycle, exe_op *ops, int n, exe_snap_set *snaps,
                                double compute_s) {
    char err[1024];
    for (int attempt = 0;; attempt++) {
        if (attempt) {
            sleep(attempt < 5 ? 1 : 2);
            /* a new session (it listens once this commit, which LISTENs, goes through) */
            if (PQstatus(c) != CONNECTION_OK) db_reset(c);
        }
        int rc = commit_cycle(c, st, cycle, ops, n, snaps, compute_s, err, sizeof err);
        if (rc == 0) {
            if (attempt) log_info("cycle %lld: committed at try %d", (long long)cycle, attempt + 1);
            return true;
        }
        log_msg(attempt == 0 || rc == -2 ? LOG_ERROR_ : db_outage_level(),
                "cycle %lld: commit failed (try %d; retried until the database answers): %s", (long long)cycle,
                attempt + 1, err);
        if (rc == -2) return false;
        exit_if_fenced("instead of committing a cycle");
        if (g_stop && attempt >= 2) return false;
    }
}

static void run_started(exe_state *st, PGconn *c, int64_t cycle, exe_op *ops, int n, double t0, const char *claim);

/* Runs this executor's next cycle (start_cycle's mode): 1 one ran; 0 none is open; -1 it
 * could not be started (database error: the caller polls again, reconnecting if needed). */
static int run_cycle(exe_state *st, PGconn *c, start_mode mode) {
    char err[1024];
    double t0 = clock_mono_s();
    exe_op *ops = NULL;
    int64_t cycle = 0;
    int n = 0, started = start_cycle(c, st, mode, &cycle, &ops, &n, err, sizeof err);
    if (started < 0) {
        log_error("starting the next cycle failed (it stays assigned and is tried again): %s", err);
        return -1;
    }
    if (started == 0) return 0;
    run_started(st, c, cycle, ops, n, t0, "scheduler");
    return 1;
}

/* What woke an idle executor (its connection's notifications): a cycle of the scheduler's
 * (any payload but a submit's), submits' hints (CYCLE_HINT_QUEUED), and forward_backwards
 * held for their step (CYCLE_HINT_PAIR: the soonest their holds end, ms from now); of the
 * hints, those with their details (all but an older api's) as they came, the first two. */
typedef struct {
    int cycles, queued, pairs, plain;
    double pair_ms;
    int nh;
    sched_hint h[2];
} exe_wake;

static void exe_wake_note(const char *payload, void *arg) {
    exe_wake *w = arg;
    size_t np = strlen(CYCLE_HINT_PAIR), nq = strlen(CYCLE_HINT_QUEUED);
    bool pair = !strncmp(payload, CYCLE_HINT_PAIR, np) && payload[np] == ' ';
    if (!pair && strncmp(payload, CYCLE_HINT_QUEUED, nq) == 0 && (payload[nq] == 0 || payload[nq] == ' ')) {
        w->queued++;
    } else if (pair) {
        double ms = plan_pair_window_ms(strtod(payload + np + 1, NULL), g_claim.pair_hold_ms);
        if (!w->pairs++ || ms < w->pair_ms) w->pair_ms = ms;
    } else {
        w->cycles++;
        return;
    }
    sched_hint h;
    if (!sched_hint_parse(payload, &h)) w->plain++;
    else if (w->nh++ < 2) w->h[w->nh - 1] = h;
}

/* The operations a wake-up lets the executor plan from submits' hints alone (rule 5 as
 * the pass applies it): one operation's hint while nothing is held, or a held
 * forward_backward's (*held, kept since its own hint) and its optim_step's. Writes them
 * to out and returns how many (0: none; the pass decides). A forward_backward's hint that
 * came alone, nothing held before, is kept in *held (*held_ok) for its step's. */
static int hinted_ops(const exe_wake *wk, bool holding, sched_hint *held, bool *held_ok, sched_hint out[2]) {
    bool had = holding && *held_ok;
    *held_ok = false;
    if (wk->cycles || wk->plain || wk->nh == 0 || wk->nh > 2) return 0;
    sched_hint seq[3];
    int n = 0;
    if (had) seq[n++] = *held;
    else if (holding) return 0;   /* a hold whose hint is not known: the pass */
    for (int i = 0; i < wk->nh; i++) seq[n++] = wk->h[i];
    if (n == 1 && !seq[0].pair) {
        out[0] = seq[0];
        return 1;
    }
    if (n == 1) {   /* held now, for its step */
        *held = seq[0];
        *held_ok = true;
        return 0;
    }
    if (n == 2 && seq[0].pair && !seq[1].pair && !strcmp(seq[0].model, seq[1].model) &&
        seq[1].seq == seq[0].seq + 1 && seq[1].next_seq == seq[0].seq) {
        out[0] = seq[0], out[1] = seq[1];
        return 2;
    }
    return 0;
}

/* A cycle of its own: woken by a submit's hint (CYCLE_HINT_QUEUED) while idle, the
 * executor builds its own cycle with the scheduler's pass for itself alone (same rules,
 * same locks: scheduler/cycle.c), and starts it and reads its operations in the same
 * transaction: no scheduler round trip, no notification in between, one commit without
 * waiting for the disk (the claim and the start are derived, as the scheduler's are).
 * The pass's transaction also stops the connection's LISTEN (a busy executor needs no
 * wake-up; the claim notifies nobody: SQL_INSERT_CYCLES_CLAIM). When it claims nothing
 * because a model is held for its optim_step (rule 5), *held_ms says how long: the
 * executor, still listening (the pass rolled back, its UNLISTEN too), looks again when the
 * step's submit wakes it or the hold ends, with no scheduler pass on the way. When it
 * claims nothing for another reason (a seq gap, work of another executor), the scheduler
 * is woken to decide, as the submit would have woken it. hint[0..nhint): the submits
 * that woke it, with their details (hinted_ops: a lone operation, a forward_backward and
 * its step): planned from them and claimed in one round trip instead of the pass's two
 * (sched_build_own_hinted), or by the pass when what they said no longer holds. 1 a
 * cycle ran; 0 nothing was claimed; -1 a database error (the scheduler was asked to
 * look). */
static int run_own_cycle(exe_state *st, PGconn *c, const sched_hint *hint, int nhint, int *held_ms) {
    char err[1024], eid[24];
    double t0 = clock_mono_s();
    fmt_i64(eid, sizeof eid, st->executor_id);
    const char *p[1] = {eid};
    static const char *const first[2] = {SQL_EXE_ASYNC_COMMIT, SQL_EXE_UNLISTEN};
    db_stmt start = {SQL_EXE_READ_CYCLE, 1, p};   /* the claim inserts the cycle running */
    db_bin start_bin = {NULL, NULL, 1};
    PGresult *started = NULL;
    sched_opts o = g_claim;
    o.first = first, o.nfirst = 2, o.start = &start, o.start_bin = &start_bin, o.started = &started;
    o.only_base = st->base_model;
    *held_ms = 0;
    int claimed = -2;
    if (nhint > 0) {
        claimed = sched_build_own_hinted(c, st->executor_id, st->base_model, st->token_budget, &o, hint, nhint,
                                         held_ms, err, sizeof err);
        if (claimed == 0 && *held_ms <= 0) claimed = -2;   /* not held, not claimed: the pass decides */
        if (claimed == -2) log_debug("the submit's hint for %s no longer holds: the full pass", hint->model);
    }
    const char *how = claimed == -2 ? "own" : "hint";
    if (claimed == -2) claimed = sched_build_cycles(c, st->executor_id, &o, NULL, held_ms, err, sizeof err);
    if (claimed > 0 && started) {
        g_listen_pid = 0;   /* the UNLISTEN committed with the claim */
        exe_op *ops = NULL;
        int64_t cycle = 0;
        int n = 0;
        if (read_cycle(started, &cycle, &ops, &n) > 0) run_started(st, c, cycle, ops, n, t0, how);
        return 1;
    }
    PQclear(started);
    if (claimed == 0 && *held_ms > 0) return 0;   /* held for its optim_step: looked at again here */
    *held_ms = 0;
    if (claimed < 0) log_warn("building a cycle of its own: %s (the scheduler is asked to)", err);
    if (db_exec(c, SQL_EXE_NOTIFY_QUEUED, 0, NULL, err, sizeof err) < 0) log_warn("waking the scheduler: %s", err);
    return claimed < 0 ? -1 : 0;
}

/* Runs a started cycle (its operations read: ops, n, freed here) and commits it; t0 when
 * the executor set out to start it. */
static void run_started(exe_state *st, PGconn *c, int64_t cycle, exe_op *ops, int n, double t0, const char *claim) {
    char cyc[24];
    fmt_i64(cyc, sizeof cyc, cycle);
    double tc = clock_mono_s();   /* the cycle's own time (restore, compute) starts once it is read */
    st->db = c;
    restore_slots(st, c, ops, n);
    run_ops(st, ops, n);
    st->db = NULL;
    exe_slots_advance(st, ops, n);
    exe_snap_set *snaps = exe_snapshots_before_commit(st, ops, n);
    exit_if_fenced("before committing a cycle");

    double tk = clock_mono_s();   /* the commit (results encoded, written, committed) starts */
    bool committed = commit_with_retries(st, c, cycle, ops, n, snaps, tk - tc);
    exe_snapshots_done(st, snaps, committed);
    if (!committed) {
        log_error("cycle %s was not committed: the reaper requeues its operations; the models' copies here are "
                  "dropped", cyc);
        drop_slots(st, ops, n);
        free_ops(ops, n);
        return;
    }
    exe_snapshots_after_commit(st, ops, n);
    double te = clock_mono_s();
    exe_log_cycle(cycle, ops, n, (exe_cycle_times){te - t0, tc - t0, tk - tc, te - tk}, claim);
    free_ops(ops, n);
}

/* ---- between cycles ------------------------------------------------------------------ */

static void record_capacity(exe_state *st, PGconn *c);

/* The model ids of the store's training slots as a JSON array (malloc'd; NULL when out of
 * memory), for the statements that compare them with the models' placement. */
static char *training_keys_json(exe_state *st) {
    exe_store_stats ss;
    exe_store_get_stats(&st->store, &ss);
    int n = ss.count[STORE_TRAINING];
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    if (!keys) return NULL;
    n = exe_store_keys(&st->store, STORE_TRAINING, keys, n);
    json_t *ids = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(ids, json_string(keys[i]));
    free(keys);
    char *text = json_dumps(ids, JSON_COMPACT);
    json_decref(ids);
    return text;
}

/* Frees the training slots of models that were unloaded, expired or failed, or moved to
 * another executor, since the last look, and records the store's figures when that
 * changed them. */
static void free_inactive_slots(exe_state *st, PGconn *c) {
    exe_store_stats ss;
    exe_store_get_stats(&st->store, &ss);
    if (ss.count[STORE_TRAINING] == 0) return;
    char *text = training_keys_json(st), err[512], eid[24];
    if (!text) return;
    fmt_i64(eid, sizeof eid, st->executor_id);
    const char *p[2] = {text, eid};
    PGresult *r = db_query(c, SQL_EXE_INACTIVE_MODELS, 2, p, err, sizeof err);
    free(text);
    if (!r) { log_warn("unloaded models: %s", err); return; }
    for (int i = 0; i < PQntuples(r); i++) exe_store_drop(&st->store, STORE_TRAINING, PQgetvalue(r, i, 0));
    int freed = PQntuples(r);
    PQclear(r);
    if (!freed) return;
    malloc_trim(0);   /* what the adapters held goes back to the system (see exe_main's mallopt) */
    record_capacity(st, c);
}

/* ---- pools: drain and eviction (docs/architecture.md, "Pools and placement") ------------ */

/* Records the store's figures in the executors row. */
static void record_capacity(exe_state *st, PGconn *c) {
    capacity_params cp;
    capacity_of(st, &cp);
    char eid[24], err[512];
    fmt_i64(eid, sizeof eid, st->executor_id);
    const char *pc[5] = {eid, cp.used, cp.training, cp.snapshots, cp.cached};
    if (db_exec(c, SQL_EXE_CAPACITY, 5, pc, err, sizeof err) < 0) log_warn("capacity: %s", err);
}

/* Hands over the slots named (copied: the store changes as they go) while keep_going says
 * so; returns how many went. */
static int hand_over_slots(exe_state *st, PGconn *c, const char **keys, int n, bool (*keep_going)(exe_state *),
                           const char *why) {
    char (*ids)[256] = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return 0;
    for (int i = 0; i < n; i++) snprintf(ids[i], sizeof ids[i], "%s", keys[i]);
    int moved = 0;
    for (int i = 0; i < n && keep_going(st); i++) {
        char err[512];
        int rc = exe_hand_over(st, c, ids[i], err, sizeof err);
        if (rc < 0) {
            /* retried on every idle pass while draining or over budget: a warning a minute */
            static time_t warned;
            log_msg(log_level_every(&warned, 60, LOG_WARN_),
                    "model %s: could not hand it over (%s; retried on every idle pass, repeats logged at debug "
                    "level for a minute): %s", ids[i], why, err);
        }
        else if (rc > 0) {
            log_info("model %s handed over (%s): its state is in its snapshot, the scheduler places it again", ids[i],
                     why);
            moved++;
        }
    }
    free(ids);
    if (moved) {
        malloc_trim(0);
        record_capacity(st, c);
    }
    return moved;
}

static bool always_go(exe_state *st) { return true; }
static bool over_budget(exe_state *st) { return st->store.used > st->store.budget; }

/* A draining executor hands every model and sampler snapshot it holds over to its pool,
 * and lets go of the models placed on it that it holds nothing of. */
static void drain_slots(exe_state *st, PGconn *c) {
    if (exe_hand_over_samplers(st, c) > 0) {
        malloc_trim(0);
        record_capacity(st, c);
    }
    exe_store_stats ss;
    exe_store_get_stats(&st->store, &ss);
    int n = ss.count[STORE_TRAINING];
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    if (!keys) return;
    n = exe_store_keys(&st->store, STORE_TRAINING, keys, n);
    if (n) hand_over_slots(st, c, keys, n, always_go, "draining");
    free(keys);

    /* the slots whose hand-over failed stay */
    char *text = training_keys_json(st), err[512], eid[24];
    if (!text) return;
    fmt_i64(eid, sizeof eid, st->executor_id);
    const char *p[2] = {eid, text};
    PGresult *r = db_query(c, SQL_EXE_UNPIN_SLOTLESS, 2, p, err, sizeof err);
    free(text);
    if (!r) { log_warn("draining: %s", err); return; }
    if (PQntuples(r)) log_info("draining: %d model(s) placed here without a slot handed to the pool", PQntuples(r));
    PQclear(r);
}

/* Over its memory budget, the executor evicts the training slots idle longest (none used
 * for --evict-idle-s) until it fits: their state is in their snapshots, and they are
 * loaded again, wherever the scheduler places them, with their next operation. */
static void evict_idle(exe_state *st, PGconn *c) {
    if (!over_budget(st)) return;
    exe_store_stats ss;
    exe_store_get_stats(&st->store, &ss);
    int n = ss.count[STORE_TRAINING];
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    if (!keys) return;
    n = exe_store_idle_training(&st->store, st->evict_idle_s, keys, n);
    hand_over_slots(st, c, keys, n, over_budget, "evicted: memory is short");
    free(keys);
}

/* ---- heartbeat -------------------------------------------------------------------- */

typedef struct {
    const char *db;
    int64_t executor_id;
    exe_gpu *gpu;   /* NULL without a GPU: its figures go into the row with each heartbeat */
} hb_args;

static void *heartbeat_thread(void *arg) {
    hb_args *a = arg;
    char err[512], id[24];
    fmt_i64(id, sizeof id, a->executor_id);
    const char *p[1] = {id};
    PGconn *c = NULL;
    while (!g_stop && !atomic_load(&g_fenced)) {
        if (!c && !(c = db_connect(a->db, 2000, err, sizeof err))) { sleep(1); continue; }
        PGresult *r = db_query(c, SQL_EXE_HEARTBEAT, 1, p, err, sizeof err);
        if (!r) {
            log_msg(db_outage_level(), "heartbeat: %s", err);
            PQfinish(c);
            c = NULL;
        } else {
            if (db_int(r, 0, 0) == 0) {
                log_error("heartbeat: this executor is marked gone; fencing it (no cycle is touched again)");
                atomic_store(&g_fenced, true);
            }
            bool draining = db_bool(r, 0, 1);
            if (draining != atomic_exchange(&g_draining, draining))
                log_info("this executor is %s", draining ? "draining: its models move to the other executors of its "
                                                           "pool" : "no longer draining");
            PQclear(r);
            if (a->gpu && exe_gpu_report(a->gpu, c, a->executor_id, err, sizeof err) < 0)
                log_debug("GPU figures: %s", err);
        }
        for (int i = 0; i < 30 && !g_stop && !atomic_load(&g_fenced); i++) usleep(100 * 1000);
    }
    if (c) PQfinish(c);
    return NULL;
}

/* ---- main ------------------------------------------------------------------------- */

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc(n + 1);
    if (fread(s, 1, n, f) != (size_t)n) { free(s); fclose(f); return NULL; }
    s[n] = 0;
    fclose(f);
    return s;
}

/* Records the base model this executor serves, so the api can validate requests. */
static int register_base_model(PGconn *c, const char *name, const char *dir, char *err, size_t errlen) {
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = read_file(path);
    if (!text) { snprintf(err, errlen, "cannot read %s", path); return -1; }
    json_error_t je;
    json_t *cfg = json_loads(text, 0, &je);
    if (!cfg) { snprintf(err, errlen, "%s: %s", path, je.text); free(text); return -1; }
    const char *arch = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
    int vocab = (int)json_integer_value(json_object_get(cfg, "vocab_size"));
    int maxpos = (int)json_integer_value(json_object_get(cfg, "max_position_embeddings"));
    char svocab[16], smax[16];
    snprintf(svocab, sizeof svocab, "%d", vocab);
    snprintf(smax, sizeof smax, "%d", maxpos > 0 ? maxpos : 4096);
    const char *p[6] = {name, dir, arch ? arch : "unknown", smax, svocab, text};
    int rc = db_exec(c, SQL_EXE_BASE_MODEL, 6, p, err, errlen);
    json_decref(cfg);
    free(text);
    return rc;
}

/* What `loom up` takes too and passes through (cli/up.c). */
const opt_spec EXE_OPTS[] = {
    {.name = "backend", .kind = OPT_STR, .arg = "NAME", .def = "cpu", .help = "executor backend"},
    {.name = "device", .kind = OPT_INT, .arg = "N", .def = "0", .lo = 0, .hi = 1023, .help = "the backend's device"},
    {.name = "threads", .kind = OPT_INT, .arg = "N", .def = "0", .lo = 0, .hi = 4096,
     .help = "CPU backend threads (0: all cores)"},
    {.name = "memory-budget", .kind = OPT_STR, .arg = "BYTES",
     .help = "adapters' memory, e.g. 8G (default: half the device memory left after the weights)"},
    {.name = "token-budget", .kind = OPT_INT, .arg = "N", .def = "32768", .lo = 1, .hi = 100000000,
     .help = "tokens per cycle"},
    {.name = "snapshot-every", .kind = OPT_INT, .arg = "STEPS", .def = "20", .lo = 1, .hi = 1000000,
     .help = "write a model's state to the blob store every STEPS optimizer steps (its recovery replays the rest)"},
    {.name = "evict-idle-s", .kind = OPT_INT, .arg = "S", .def = "5", .lo = 0, .hi = 86400,
     .help = "over the memory budget, models idle for S seconds are evicted to the blob store"},
    {0}};

/* How often an executor waiting for a cycle looks for one without being woken (a lost
 * notification costs this much latency at most, never the cycle): rarely, as every look
 * is a statement per idle executor for PostgreSQL. */
#define LOOK_EVERY_S 5.0

static const opt_spec EXE_OWN_OPTS[] = {
    {.name = "model-dir", .kind = OPT_STR, .arg = "DIR", .required = true,
     .help = "a Hugging Face model directory (config.json, *.safetensors, tokenizer.json)"},
    {.name = "model-name", .kind = OPT_STR, .arg = "NAME", .required = true,
     .help = "the base model's name for clients"},
    {.name = "name", .kind = OPT_STR, .arg = "NAME", .def = "executor", .help = "this executor's name in its row"},
    {0}};

static const cfg_cmd EXE_CMD = {.cmd = "loom executor", .section = "executor",
                                .about = "Runs the cycles the scheduler assigns to it on one device. `loom executor drain\n"
                                         "NAME|ID` moves an executor's models to the others of its pool (`undrain`: back).",
                                .tables = {CFG_DB, EXE_OWN_OPTS, EXE_OPTS, SCHED_CLAIM_OPTS, CFG_DATA_DIR, CFG_BLOBS}};

int exe_check_opts(const cfg *o, char *err, size_t errlen) {
    if (!be_backend_find(cfg_str(o, "backend"))) {
        snprintf(err, errlen, "unknown backend '%s' (this build has: %s)", cfg_str(o, "backend"), be_backend_names());
        return -1;
    }
    if (cfg_str(o, "memory-budget") && !cfg_parse_bytes(cfg_str(o, "memory-budget"))) {
        snprintf(err, errlen, "--memory-budget '%s' is not a size in bytes (e.g. 8G, 512M)", cfg_str(o, "memory-budget"));
        return -1;
    }
    return 0;
}

/* Device bytes of a trainable rank-1 adapter on every module and the head: the unit in
 * which the scheduler counts what the models placed here take (an adapter's size is about
 * linear in its rank). */
static size_t adapter_bytes_per_rank(exe_state *st) {
    lora_config lc = {.rank = 1, .train_attn = true, .train_mlp = true, .train_unembed = true};
    char err[256];
    be_adapter *a = st->be->adapter_alloc(st->ctx, &lc, true, err, sizeof err);
    if (!a) return 0;
    size_t n = a->device_bytes;
    st->be->adapter_free(st->ctx, a);
    return n;
}

/* Earlier registrations of this executor (same name and host) whose process is gone are
 * marked gone: a restart moves their models at once. A live process under the same name
 * (two executors misconfigured alike) is left alone. */
static void retire_previous(PGconn *c, const char *host, const char *name, const char *self) {
    char err[512];
    const char *p[3] = {host, name, self};
    PGresult *r = db_query(c, SQL_EXE_PREVIOUS, 3, p, err, sizeof err);
    if (!r) { log_warn("earlier registrations: %s", err); return; }
    for (int i = 0; i < PQntuples(r); i++) {
        pid_t pid = (pid_t)db_int(r, i, 1);
        if (kill(pid, 0) == 0 || errno != ESRCH) continue;
        const char *pg[1] = {PQgetvalue(r, i, 0)};
        if (db_exec(c, SQL_EXE_MARK_GONE, 1, pg, err, sizeof err) == 0)
            log_info("executor %s (pid %d) is no longer running: marked gone, its models move", pg[0], (int)pid);
    }
    PQclear(r);
}

/* Connects the loop's connection, named in pg_stat_activity in this session and every
 * later one (db_session_setup: a reset after a server restart restores it). It LISTENs
 * only while the executor waits for a cycle (start_cycle, commit_cycle). */
static PGconn *connect_loop(const char *db, int64_t exe_id, int wait_ms, char *err, size_t errlen) {
    PGconn *c = db_connect(db, wait_ms, err, errlen);
    if (!c) return NULL;
    char app[64];
    snprintf(app, sizeof app, "loom executor %lld", (long long)exe_id);
    db_setup_stmt setup[1] = {{SQL_EXE_APP_NAME, app}};
    if (db_session_setup(c, setup, 1, err, errlen) < 0) {
        db_finish(c);
        return NULL;
    }
    return c;
}

int exe_main(int argc, char **argv) {
    cfg o;
    int rc;
    if (!cfg_parse(&EXE_CMD, argc, argv, &o, &rc)) return rc;
    char err[1024], db[4096], db_from[4600], blob_dir[4096];
    if (exe_check_opts(&o, err, sizeof err) < 0) return cfg_usage_error(&EXE_CMD, "%s", err);
    const char *model_dir = cfg_str(&o, "model-dir"), *model_name = cfg_str(&o, "model-name"),
               *name = cfg_str(&o, "name"), *mem_budget = cfg_str(&o, "memory-budget");
    int threads = (int)cfg_int(&o, "threads"), budget = (int)cfg_int(&o, "token-budget"),
        device = (int)cfg_int(&o, "device");
    cfg_db(&o, db, sizeof db, db_from, sizeof db_from);
    cfg_blob_dir(&o, blob_dir, sizeof blob_dir);
    exe_state st = {.be = be_backend_find(cfg_str(&o, "backend")), .model_dir = model_dir, .base_model = model_name,
                    .snapshot_every = (int)cfg_int(&o, "snapshot-every"),
                    .evict_idle_s = (int)cfg_int(&o, "evict-idle-s")};
    size_t store_budget = mem_budget ? cfg_parse_bytes(mem_budget) : 0;
    g_claim.lease_s = (int)cfg_int(&o, "lease-s");
    g_claim.pair_hold_ms = (int)cfg_int(&o, "pair-hold-ms");
    g_gather_ms = (int)cfg_int(&o, "gather-ms");
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    db_set_stop_flag(&g_stop);
    /* Adapters and their host copies are large and come and go with models: allocations
     * of 1 MiB and more are mapped on their own (glibc would otherwise raise this threshold
     * as they are freed, and keep their memory in its heap after unload_model). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);

    model_files *mf;
    if (model_open(model_dir, &mf, err, sizeof err) < 0) {
        log_error("cannot load model %s: %s", model_dir, err);
        return 1;
    }
    st.model = mf->cfg;
    be_backend_opts bo = {.device = device, .threads = threads};
    st.ctx = st.be->create(mf, &bo, err, sizeof err);
    model_close(mf);
    if (!st.ctx) {
        log_error("backend %s: %s", st.be->name, err);
        return 1;
    }
    be_device_info dev;
    st.be->device_info(st.ctx, &dev);
    /* By default adapters may take half of what the device has left after the weights. */
    if (!store_budget) store_budget = dev.memory_free / 2;
    exe_store_init(&st.store, st.be, st.ctx, store_budget);
    if (!(st.blobs = blob_open_dir(blob_dir, err, sizeof err))) {
        log_error("blob store %s: %s", blob_dir, err);
        return 1;
    }
    PGconn *c = db_connect(db, 30000, err, sizeof err);
    if (!c) { log_error("cannot connect to the database (%s): %s", db_from, err); return 1; }
    if (migrate_run(c, err, sizeof err) < 0 || register_base_model(c, model_name, model_dir, err, sizeof err) < 0) {
        log_error("%s", err);
        return 1;
    }
    char host[256] = "localhost", pid[16], sbudget[16], sdev[16], smem[24], sstore[24];
    gethostname(host, sizeof host);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    snprintf(sbudget, sizeof sbudget, "%d", budget);
    snprintf(sdev, sizeof sdev, "%d", device);
    snprintf(smem, sizeof smem, "%zu", dev.memory_total);
    snprintf(sstore, sizeof sstore, "%zu", store_budget);
    char sper[24];
    snprintf(sper, sizeof sper, "%zu", adapter_bytes_per_rank(&st));
    const char *p[11] = {name, host, pid, st.be->name, dev.device, model_name, sbudget, sdev, smem, sstore, sper};
    PGresult *r = db_query(c, SQL_EXE_REGISTER, 11, p, err, sizeof err);
    if (!r) { log_error("register: %s", err); return 1; }
    st.executor_id = db_int(r, 0, 0);
    st.token_budget = budget;
    snprintf(g_listen_sql, sizeof g_listen_sql, SQL_EXE_LISTEN_FMT, (long long)st.executor_id);
    char sid[24];
    snprintf(sid, sizeof sid, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    retire_previous(c, host, name, sid);
    PQfinish(c);
    if (!(c = connect_loop(db, st.executor_id, 30000, err, sizeof err)) ||
        db_exec(c, SQL_EXE_NOTIFY_READY, 0, NULL, err, sizeof err) < 0) {
        log_error("listen: %s", err);
        return 1;
    }
    log_info("executor %s ready: model %s (%s), backend %s on %s, adapters up to %.1f GiB, token budget %d", sid,
             model_name, model_dir, st.be->name, dev.device, store_budget / 1073741824.0, budget);
    st.db_conninfo = db;
    if (exe_snapshot_writer_start(&st, err, sizeof err) < 0) {
        log_error("%s", err);
        return 1;
    }
    hb_args hb = {db, st.executor_id, exe_gpu_open(st.be->name, device)};
    pthread_t hbt;
    pthread_create(&hbt, NULL, heartbeat_thread, &hb);

    const char *pid1[1] = {sid};
    int fails = 0;   /* cycles that could not be started, in a row */
    bool woken = false, hinted = false;
    sched_hint hints[2], held_hint;   /* what to plan from hints (nhints); a held forward_backward's */
    int nhints = 0;
    bool held_hint_ok = false;
    double last_chores = 0, last_look = 0;
    double own_again_at = 0;   /* a hold of the own pass ends (rule 5): look again then; 0 none */
    while (!g_stop) {
        exit_if_fenced("instead of polling for cycles");
        if (!c || PQstatus(c) != CONNECTION_OK) {
            db_finish(c);
            c = connect_loop(db, st.executor_id, 5000, err, sizeof err);
            if (!c) { log_msg(db_outage_level(), "reconnecting the loop's connection: %s", err); continue; }
        }
        /* A listening connection has no cycle to look for until it is woken: the scheduler
         * builds one only for an idle executor, which listens from the commit that made it
         * idle (or from the look that follows its LISTEN), and notifies its channel. A
         * notification is still only a hint: an idle executor also looks every
         * LOOK_EVERY_S. */
        /* A submit's hint: build the cycle here (run_own_cycle). When it claims nothing
         * and no cycle of the scheduler's was notified with it, keep waiting. */
        if ((hinted || g_backlog) && listening(c)) {
            hinted = false;
            if (g_gather_ms > 0) { /* gather: what else is submitted meanwhile joins the cycle */
                usleep((useconds_t)g_gather_ms * 1000);
                exe_wake wk = {0};
                if (db_wait_notify_each(c, 0, exe_wake_note, &wk) > 0) {
                    if (wk.cycles) woken = true;
                    if (wk.cycles || wk.queued || wk.pairs) nhints = 0, held_hint_ok = false;
                }
            }
            /* the pass reads what waited (a hold: looked at again when it ends); its own
             * cycle's commit says again whether more does */
            bool backlog = g_backlog;
            g_backlog = false;
            int held_ms = 0, ran = run_own_cycle(&st, c, hints, backlog ? 0 : nhints, &held_ms);
            nhints = 0;
            if (held_ms <= 0) held_hint_ok = false;
            own_again_at = held_ms > 0 ? clock_mono_s() + held_ms / 1000.0 : 0;
            if (ran > 0 || !woken) {
                woken = false;
                if (ran > 0) last_look = clock_mono_s();
                continue;
            }
        }
        hinted = false;
        if (woken || !listening(c) || clock_mono_s() - last_look >= LOOK_EVERY_S) {
            int ran = run_cycle(&st, c, woken && listening(c) ? START_UNLISTEN : START_LISTEN);
            woken = false;
            last_look = clock_mono_s();
            if (ran < 0) {
                if (++fails >= 3) {
                    log_error("a cycle could not be started 3 times in a row; exiting so that the reaper recovers it");
                    exit(1);
                }
                sleep(1);
                continue;
            }
            fails = 0;
            if (ran == 0 && !listening(c)) continue;   /* woken for nothing: listen again, then look */
        }
        /* Between cycles, at most every poll interval (not on the way to a cycle): free
         * the slots of models no longer active here, drain, or evict idle models. */
        if (clock_mono_s() - last_chores >= 0.5) {
            free_inactive_slots(&st, c);
            if (atomic_load(&g_draining)) drain_slots(&st, c);
            else evict_idle(&st, c);
            last_chores = clock_mono_s();
            continue;   /* the chores may have taken a while: look for a notification first */
        }
        if (g_backlog && listening(c)) continue;   /* the last commit found work waiting: its pass, above */
        int wait_ms = 500;
        if (own_again_at > 0) {   /* a hold ends sooner: its own pass then */
            double left = (own_again_at - clock_mono_s()) * 1000;
            wait_ms = left <= 0 ? 0 : left < wait_ms ? (int)left + 1 : wait_ms;
        }
        exe_wake wk = {0};
        int w = db_wait_notify_each(c, wait_ms, exe_wake_note, &wk);
        /* woken: a cycle of the scheduler's; hinted: a submit's hint; a held forward_backward:
         * look when its hold ends (or sooner, at another hint) */
        if (w > 0) woken = wk.cycles > 0, hinted = wk.queued > 0;
        /* a submit's hint alone, or a held forward_backward's step: planned from the hints */
        nhints = w > 0 ? hinted_ops(&wk, own_again_at > 0, &held_hint, &held_hint_ok, hints) : 0;
        if (w > 0 && wk.pairs) {
            double at = clock_mono_s() + wk.pair_ms / 1000.0;
            if (own_again_at <= 0 || at < own_again_at) own_again_at = at;
        }
        if (own_again_at > 0 && clock_mono_s() >= own_again_at) hinted = true;   /* cleared by the pass */
    }
    /* A clean stop leaves every model's snapshot current (before the row says gone and
     * its models move): the next executor restores them without replaying. Its sampler
     * snapshots go to the blob store as a drain hands them over, so that their samples
     * run on any executor of the base model instead of failing. */
    exe_snapshot_slots(&st, NULL, true);
    exe_snapshot_writer_stop(&st);
    if (c && PQstatus(c) == CONNECTION_OK) exe_hand_over_samplers(&st, c);
    if (c) {
        db_exec(c, SQL_EXE_GONE, 1, pid1, err, sizeof err);
        db_finish(c);
    }
    pthread_join(hbt, NULL);
    exe_gpu_close(hb.gpu);
    exe_store_free(&st.store);
    free(st.expert_tokens);
    st.be->destroy(st.ctx);
    if (st.blobs) blob_close(st.blobs);
    if (st.tok) tok_free(st.tok);
    log_info("executor stopped");
    return 0;
}
