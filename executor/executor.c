/* executor.c: the executor's loop and the translation between operation rows (the
 * normalised payload JSON written by the api) and the backend's packed batch.
 *
 * One cycle: create_model ops make adapters; every forward_backward of the cycle runs
 * as ONE packed batch across adapters (and every forward as another, without
 * gradients); then each model's optim_step and checkpoint work (handler tables of the
 * op family files); then all sampling requests together; then all results are committed in one
 * transaction guarded by "still claimed by this cycle", so a cycle the reaper took
 * back cannot write. A heartbeat thread keeps the executor row and the cycle's lease
 * fresh while the (possibly long) compute runs. */
#include "executor/executor.h"
#include "executor/exe_internal.h"
#include "registry/blobstore.h"
#include "common/db.h"
#include "common/log.h"
#include "common/migrate.h"
#include <jansson.h>
#include <math.h>
#include <float.h>
#include <stdarg.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


static volatile sig_atomic_t g_stop;
static void on_signal(int s) { g_stop = 1; }

adapter *exe_slot_find(exe_state *st, const char *id) {
    for (int i = 0; i < st->nslots; i++)
        if (!strcmp(st->slots[i].id, id)) return st->slots[i].ad;
    return NULL;
}

void exe_slot_put(exe_state *st, const char *id, adapter *ad) {
    if (st->nslots == st->cap) {
        st->cap = st->cap ? 2 * st->cap : 16;
        st->slots = realloc(st->slots, st->cap * sizeof *st->slots);
    }
    snprintf(st->slots[st->nslots].id, sizeof st->slots[0].id, "%s", id);
    st->slots[st->nslots++].ad = ad;
}

void exe_op_fail(exe_op *op, const char *category, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->error, sizeof op->error, fmt, ap);
    va_end(ap);
    op->category = category;
    if (op->result) { json_decref(op->result); op->result = NULL; }
}

static int commit_cycle(PGconn *c, exe_state *st, int64_t cycle, exe_op *ops, int n, char *err, size_t errlen) {
    char cyc[24];
    snprintf(cyc, sizeof cyc, "%lld", (long long)cycle);
    if (db_begin(c, err, errlen) < 0) return -1;
    for (int i = 0; i < n; i++) {
        exe_op *op = &ops[i];
        char id[24];
        snprintf(id, sizeof id, "%lld", (long long)op->id);
        if (!op->category && op->commit_hook) {
            /* A savepoint keeps a failing hook from aborting the whole cycle's transaction. */
            char herr[512] = "";
            if (db_exec(c, "SAVEPOINT op_hook", 0, NULL, err, errlen) < 0) goto fail;
            if (op->commit_hook(c, st, op, herr, sizeof herr) < 0) {
                if (db_exec(c, "ROLLBACK TO SAVEPOINT op_hook", 0, NULL, err, errlen) < 0) goto fail;
                exe_op_fail(op, "server", "%s", herr);
            } else if (db_exec(c, "RELEASE SAVEPOINT op_hook", 0, NULL, err, errlen) < 0) {
                goto fail;
            }
        }
        char *res = op->category ? NULL : json_dumps(op->result, JSON_COMPACT | JSON_REAL_PRECISION(9));
        const char *p[6] = {id, op->category ? "failed" : "done", res, op->category ? op->error : NULL,
                            op->category, cyc};
        PGresult *r = db_query(c, "UPDATE operations SET state = $2, result = $3::jsonb, error = $4,"
                                  " error_category = $5, finished_at = now()"
                                  " WHERE id = $1 AND cycle_id = $6 AND state = 'claimed'",
                               6, p, err, errlen);
        free(res);
        if (!r) goto fail;
        int changed = atoi(PQcmdTuples(r));
        PQclear(r);
        if (changed != 1) {
            snprintf(err, errlen, "operation %s is no longer claimed by cycle %s (lease expired?)", id, cyc);
            goto fail;
        }
    }
    const char *pc[1] = {cyc};
    if (db_exec(c, "UPDATE cycles SET state = 'done', finished_at = now() WHERE id = $1", 1, pc, err, errlen) < 0 ||
        db_exec(c, "UPDATE executors SET state = 'idle', heartbeat_at = now()"
                   " WHERE id = (SELECT executor_id FROM cycles WHERE id = $1)", 1, pc, err, errlen) < 0 ||
        db_exec(c, "SELECT pg_notify('loom_op_done', request_id) FROM operations WHERE cycle_id = $1", 1, pc, err,
                errlen) < 0 ||
        db_exec(c, "NOTIFY loom_executor_ready", 0, NULL, err, errlen) < 0)
        goto fail;
    return db_commit(c, err, errlen);
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

static int run_cycle(exe_state *st, PGconn *c, int64_t cycle) {
    char err[1024], cyc[24];
    snprintf(cyc, sizeof cyc, "%lld", (long long)cycle);
    const char *p[1] = {cyc};
    if (db_exec(c, "UPDATE cycles SET state = 'running', started_at = now() WHERE id = $1 AND state = 'assigned'",
                1, p, err, sizeof err) < 0) {
        log_error("cycle %s: %s", cyc, err);
        return -1;
    }
    /* Sample operations have no model (LEFT JOIN); they come after the model ops. */
    PGresult *r = db_query(c, "SELECT o.id, o.request_id, coalesce(o.model_id, ''), o.kind, o.payload::text,"
                              " m.lora_rank, m.lora_seed, m.train_attn, m.train_mlp, m.train_unembed,"
                              " o.seq_id, coalesce(o.sampling_session_id, '')"
                              " FROM operations o LEFT JOIN models m ON m.id = o.model_id"
                              " WHERE o.cycle_id = $1 AND o.state = 'claimed'"
                              " ORDER BY o.model_id NULLS LAST, o.seq_id, o.id",
                           1, p, err, sizeof err);
    if (!r) { log_error("cycle %s: %s", cyc, err); return -1; }
    int n = PQntuples(r);
    exe_op *ops = calloc(n ? n : 1, sizeof *ops);
    for (int i = 0; i < n; i++) {
        exe_op *op = &ops[i];
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
        if (!op->payload) exe_op_fail(op, "server", "stored payload is not JSON: %s", je.text);
    }
    PQclear(r);

    /* 1. new adapters; 2. packed forward_backward, then packed forward; 3. optimizer steps. */
    exe_op **fb = calloc(n ? n : 1, sizeof *fb), **fwd = calloc(n ? n : 1, sizeof *fwd);
    int nfb = 0, nfwd = 0;
    for (int i = 0; i < n; i++) {
        exe_op *op = &ops[i];
        if (op->category) continue;
        if (!strcmp(op->kind, "create_model")) exe_run_create(st, op);
        else if (!strcmp(op->kind, "forward_backward")) fb[nfb++] = op;
        else if (!strcmp(op->kind, "forward")) fwd[nfwd++] = op;
    }
    exe_run_fb_batch(st, fb, nfb, true);
    exe_run_fb_batch(st, fwd, nfwd, false);
    exe_op **samples = calloc(n ? n : 1, sizeof *samples);
    int nsamples = 0;
    for (int i = 0; i < n; i++) {
        exe_op *op = &ops[i];
        if (op->category || op->result) continue;
        if (!strcmp(op->kind, "optim_step")) { exe_run_optim(st, op); continue; }
        if (!strcmp(op->kind, "sample")) { samples[nsamples++] = op; continue; }
        if (!strcmp(op->kind, "save_weights_for_sampler") && json_object_get(op->payload, "sampling_session_id")) {
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

    /* A transient database error gets a few tries (on a fresh connection if it broke).
     * If the results still cannot be committed, this executor must not keep heartbeating
     * a lease it cannot honour: it exits, the lease lapses, and the reaper fails the
     * cycle's operations with a message instead of leaving them pending forever. */
    int rc = -1;
    for (int attempt = 0; attempt < 3 && rc < 0; attempt++) {
        if (attempt) {
            sleep(1);
            if (PQstatus(c) != CONNECTION_OK) PQreset(c);
        }
        rc = commit_cycle(c, st, cycle, ops, n, err, sizeof err);
        if (rc < 0) log_error("cycle %s: commit failed (try %d of 3): %s", cyc, attempt + 1, err);
    }
    if (rc < 0) {
        log_error("cycle %s could not be committed; exiting so that the reaper recovers its operations", cyc);
        exit(1);
    }
    log_info("cycle %s done: %d operation(s)", cyc, n);
    for (int i = 0; i < n; i++) {
        json_decref(ops[i].payload);
        json_decref(ops[i].result);
        free(ops[i].hook_data);
    }
    free(ops);
    return rc;
}

/* ---- heartbeat -------------------------------------------------------------------- */

typedef struct {
    const char *db;
    int64_t executor_id;
} hb_args;

static void *heartbeat_thread(void *arg) {
    hb_args *a = arg;
    char err[512], id[24];
    snprintf(id, sizeof id, "%lld", (long long)a->executor_id);
    const char *p[1] = {id};
    PGconn *c = NULL;
    while (!g_stop) {
        if (!c && !(c = db_connect(a->db, 2000, err, sizeof err))) { sleep(1); continue; }
        if (db_exec(c, "UPDATE executors SET heartbeat_at = now() WHERE id = $1", 1, p, err, sizeof err) < 0 ||
            db_exec(c, "UPDATE cycles SET lease_expires_at = greatest(lease_expires_at, now() + interval '60 seconds')"
                       " WHERE executor_id = $1 AND state IN ('assigned','running')", 1, p, err, sizeof err) < 0) {
            log_warn("heartbeat: %s", err);
            PQfinish(c);
            c = NULL;
        }
        for (int i = 0; i < 30 && !g_stop; i++) usleep(100 * 1000);
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
static int register_base_model(PGconn *c, const char *name, const char *dir, int *vocab, char *err, size_t errlen) {
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = read_file(path);
    if (!text) { snprintf(err, errlen, "cannot read %s", path); return -1; }
    json_error_t je;
    json_t *cfg = json_loads(text, 0, &je);
    if (!cfg) { snprintf(err, errlen, "%s: %s", path, je.text); free(text); return -1; }
    const char *arch = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
    *vocab = (int)json_integer_value(json_object_get(cfg, "vocab_size"));
    int maxpos = (int)json_integer_value(json_object_get(cfg, "max_position_embeddings"));
    char svocab[16], smax[16];
    snprintf(svocab, sizeof svocab, "%d", *vocab);
    snprintf(smax, sizeof smax, "%d", maxpos > 0 ? maxpos : 4096);
    const char *p[6] = {name, dir, arch ? arch : "unknown", smax, svocab, text};
    int rc = db_exec(c, "INSERT INTO base_models (name, path, arch, max_context, vocab_size, config)"
                        " VALUES ($1, $2, $3, $4, $5, $6::jsonb) ON CONFLICT (name) DO UPDATE SET"
                        " path = EXCLUDED.path, arch = EXCLUDED.arch, max_context = EXCLUDED.max_context,"
                        " vocab_size = EXCLUDED.vocab_size, config = EXCLUDED.config",
                     6, p, err, errlen);
    json_decref(cfg);
    free(text);
    return rc;
}

static void usage(void) {
    fprintf(stderr, "usage: loom executor --db CONNINFO --model-dir DIR --model-name NAME\n"
                    "                     [--backend cpu] [--threads N] [--token-budget N] [--name NAME]\n"
                    "                     [--blob-dir DIR]   (registry blob store for checkpoints)\n");
}

int exe_main(int argc, char **argv) {
    const char *db = getenv("DATABASE_URL"), *model_dir = NULL, *model_name = NULL, *backend = "cpu";
    const char *name = "executor", *blob_dir = NULL;
    int threads = 0, budget = 32768;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { usage(); return 2; }
        if (!strcmp(a, "--db")) db = argv[++i];
        else if (!strcmp(a, "--model-dir")) model_dir = argv[++i];
        else if (!strcmp(a, "--model-name")) model_name = argv[++i];
        else if (!strcmp(a, "--backend")) backend = argv[++i];
        else if (!strcmp(a, "--threads")) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--token-budget")) budget = atoi(argv[++i]);
        else if (!strcmp(a, "--name")) name = argv[++i];
        else if (!strcmp(a, "--blob-dir")) blob_dir = argv[++i];
        else { usage(); return 2; }
    }
    if (!db || !model_dir || !model_name) { usage(); return 2; }
    if (strcmp(backend, "cpu")) {
        log_error("backend '%s' is not available in this build (available: cpu)", backend);
        return 2;
    }
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    char err[1024];
    exe_state st = {.be = &exe_backend_cpu, .model_dir = model_dir};
    if (model_load(model_dir, &st.model, err, sizeof err) < 0) {
        log_error("cannot load model %s: %s", model_dir, err);
        return 1;
    }
    if (!(st.ctx = st.be->create(st.model, threads, err, sizeof err))) {
        log_error("backend %s: %s", st.be->name, err);
        return 1;
    }
    if (blob_dir && !(st.blobs = blob_open_dir(blob_dir, err, sizeof err))) {
        log_error("blob store %s: %s", blob_dir, err);
        return 1;
    }
    PGconn *c = db_connect(db, 30000, err, sizeof err);
    if (!c) { log_error("cannot connect: %s", err); return 1; }
    if (migrate_run(c, err, sizeof err) < 0 || register_base_model(c, model_name, model_dir, &st.vocab, err, sizeof err) < 0) {
        log_error("%s", err);
        return 1;
    }
    char host[256] = "localhost", pid[16], sbudget[16], device[64];
    gethostname(host, sizeof host);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    snprintf(sbudget, sizeof sbudget, "%d", budget);
    snprintf(device, sizeof device, "cpu:%d-threads", threads);
    const char *p[7] = {name, host, pid, st.be->name, device, model_name, sbudget};
    PGresult *r = db_query(c, "INSERT INTO executors (name, hostname, pid, backend, device, base_model, token_budget)"
                              " VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id", 7, p, err, sizeof err);
    if (!r) { log_error("register: %s", err); return 1; }
    int64_t exe_id = db_int(r, 0, 0);
    st.executor_id = exe_id;
    char sid[24];
    snprintf(sid, sizeof sid, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    if (db_exec(c, "LISTEN loom_cycle", 0, NULL, err, sizeof err) < 0 ||
        db_exec(c, "NOTIFY loom_executor_ready", 0, NULL, err, sizeof err) < 0) {
        log_error("listen: %s", err);
        return 1;
    }
    log_info("executor %s ready: model %s (%s), backend %s, %d threads, token budget %d", sid, model_name, model_dir,
             st.be->name, threads, budget);
    hb_args hb = {db, exe_id};
    pthread_t hbt;
    pthread_create(&hbt, NULL, heartbeat_thread, &hb);

    const char *pid1[1] = {sid};
    while (!g_stop) {
        r = db_query(c, "SELECT id FROM cycles WHERE executor_id = $1 AND state = 'assigned' ORDER BY id LIMIT 1",
                     1, pid1, err, sizeof err);
        if (!r) {
            log_warn("poll: %s; reconnecting", err);
            PQfinish(c);
            while (!g_stop && !(c = db_connect(db, 5000, err, sizeof err))) {}
            if (c) db_exec(c, "LISTEN loom_cycle", 0, NULL, err, sizeof err);
            continue;
        }
        int64_t cycle = PQntuples(r) ? db_int(r, 0, 0) : 0;
        PQclear(r);
        if (cycle) { run_cycle(&st, c, cycle); continue; }
        db_wait_notify(c, 500);
    }
    db_exec(c, "UPDATE executors SET state = 'gone' WHERE id = $1", 1, pid1, err, sizeof err);
    PQfinish(c);
    pthread_join(hbt, NULL);
    for (int i = 0; i < st.nslots; i++) adapter_free(st.slots[i].ad);
    free(st.slots);
    st.be->destroy(st.ctx);
    if (st.blobs) blob_close(st.blobs);
    model_free(st.model);
    log_info("executor stopped");
    return 0;
}
