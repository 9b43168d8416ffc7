/* executor.c: the executor's loop and the translation between operation rows (the
 * normalised payload JSON written by the api) and the backend's packed batch.
 *
 * One cycle: create_model ops make adapters; every forward_backward of the cycle runs
 * as ONE packed batch across adapters (and every forward as another, without
 * gradients); then each model's optim_step; then all results are committed in one
 * transaction guarded by "still claimed by this cycle", so a cycle the reaper took
 * back cannot write. A heartbeat thread keeps the executor row and the cycle's lease
 * fresh while the (possibly long) compute runs. */
#include "gpu/executor.h"
#include "gpu/backend.h"
#include "gpu/lora.h"
#include "gpu/model.h"
#include "common/db.h"
#include "common/log.h"
#include "common/migrate.h"
#include <jansson.h>
#include <math.h>
#include <float.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char id[256];
    adapter *ad;
} model_slot;

typedef struct {
    const exe_backend *be;
    void *ctx;
    base_model *model;
    int vocab;
    model_slot *slots;
    int nslots, cap;
} exe_state;

typedef struct {
    int64_t id;
    char request_id[80];
    char model_id[256];
    char kind[32];
    json_t *payload;
    lora_config lcfg;
    /* outcome */
    json_t *result;
    char error[512];
    const char *category;   /* NULL = success */
} exe_op;

static volatile sig_atomic_t g_stop;
static void on_signal(int s) { g_stop = 1; }

static adapter *slot_find(exe_state *st, const char *id) {
    for (int i = 0; i < st->nslots; i++)
        if (!strcmp(st->slots[i].id, id)) return st->slots[i].ad;
    return NULL;
}

static void slot_put(exe_state *st, const char *id, adapter *ad) {
    if (st->nslots == st->cap) {
        st->cap = st->cap ? 2 * st->cap : 16;
        st->slots = realloc(st->slots, st->cap * sizeof *st->slots);
    }
    snprintf(st->slots[st->nslots].id, sizeof st->slots[0].id, "%s", id);
    st->slots[st->nslots++].ad = ad;
}

static void op_fail(exe_op *op, const char *category, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->error, sizeof op->error, fmt, ap);
    va_end(ap);
    op->category = category;
    if (op->result) { json_decref(op->result); op->result = NULL; }
}

/* ---- forward / forward_backward ------------------------------------------------- */

typedef struct {
    exe_op *op;
    int first_seq, nseq;     /* the op's datums in the packed batch */
} fb_span;

static bool parse_loss(const char *name, json_t *cfg, loss_spec *out) {
    static const struct { const char *name; loss_kind kind; } names[] = {
        {"cross_entropy", LOSS_CROSS_ENTROPY}, {"importance_sampling", LOSS_IMPORTANCE_SAMPLING},
        {"ppo", LOSS_PPO}, {"cispo", LOSS_CISPO}, {"dro", LOSS_DRO}};
    out->clip_low = 0.8; out->clip_high = 1.2; out->beta = 0.05;   /* spec §8 defaults */
    bool found = false;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i].name)) { out->kind = names[i].kind; found = true; }
    json_t *v;
    if ((v = json_object_get(cfg, "clip_low_threshold")) && json_is_number(v)) out->clip_low = json_number_value(v);
    if ((v = json_object_get(cfg, "clip_high_threshold")) && json_is_number(v)) out->clip_high = json_number_value(v);
    if ((v = json_object_get(cfg, "beta")) && json_is_number(v)) out->beta = json_number_value(v);
    return found;
}

/* Copies a JSON number array of length n into a new buffer; NULL if absent. */
static float *f32_array(json_t *a, int n) {
    if (!json_is_array(a) || (int)json_array_size(a) != n) return NULL;
    float *o = malloc((n ? n : 1) * sizeof *o);
    for (int i = 0; i < n; i++) o[i] = (float)json_number_value(json_array_get(a, i));
    return o;
}

static int32_t *i32_array(json_t *a, int n) {
    if (!json_is_array(a) || (int)json_array_size(a) != n) return NULL;
    int32_t *o = malloc((n ? n : 1) * sizeof *o);
    for (int i = 0; i < n; i++) o[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return o;
}

static json_t *tensor_json(const float *x, int n) {
    json_t *data = json_array();
    for (int i = 0; i < n; i++) {
        double v = x[i];
        if (isnan(v)) v = 0;          /* guarded below: a NaN fails the op */
        if (isinf(v)) v = v < 0 ? -FLT_MAX : FLT_MAX;
        json_array_append_new(data, json_real(v));
    }
    return json_pack("{s:o, s:s, s:[i]}", "data", data, "dtype", "float32", "shape", n);
}

static void free_seq(exe_seq *s) {
    free((void *)s->tokens); free((void *)s->targets); free((void *)s->weights);
    free((void *)s->sampler_logprobs); free((void *)s->advantages);
    free(s->logprobs_out); free(s->loss_out);
}

/* Packs every datum of the given ops into one batch, runs it, and writes results. */
static void run_fb_batch(exe_state *st, exe_op **ops, int nops, bool backward) {
    if (nops == 0) return;
    int cap = 0;
    for (int i = 0; i < nops; i++) cap += (int)json_array_size(json_object_get(ops[i]->payload, "data"));
    exe_seq *seqs = calloc(cap ? cap : 1, sizeof *seqs);
    fb_span *spans = calloc(nops, sizeof *spans);
    int ns = 0, nspan = 0;
    for (int i = 0; i < nops; i++) {
        exe_op *op = ops[i];
        adapter *ad = slot_find(st, op->model_id);
        if (!ad) {
            op_fail(op, "server", "this model's training state is not on this executor (it was restarted); "
                    "create a new model or load a checkpoint");
            continue;
        }
        loss_spec ls;
        json_t *p = op->payload;
        const char *lname = json_string_value(json_object_get(p, "loss_fn"));
        if (!lname || !parse_loss(lname, json_object_get(p, "loss_fn_config"), &ls)) {
            op_fail(op, "user", "unknown loss_fn '%s'", lname ? lname : "(none)");
            continue;
        }
        json_t *data = json_object_get(p, "data");
        int start = ns;
        bool bad = false;
        for (size_t d = 0; d < json_array_size(data) && !bad; d++) {
            json_t *dj = json_array_get(data, d);
            int n = (int)json_array_size(json_object_get(dj, "tokens"));
            exe_seq *s = &seqs[ns++];
            s->ad = ad;
            s->loss = ls;
            s->n = n;
            s->tokens = i32_array(json_object_get(dj, "tokens"), n);
            s->targets = i32_array(json_object_get(dj, "target_tokens"), n);
            s->weights = f32_array(json_object_get(dj, "weights"), n);
            s->sampler_logprobs = f32_array(json_object_get(dj, "logprobs"), n);
            s->advantages = f32_array(json_object_get(dj, "advantages"), n);
            s->logprobs_out = calloc(n ? n : 1, sizeof(float));
            s->loss_out = calloc(n ? n : 1, sizeof(float));
            if (!s->tokens || !s->targets) bad = true;
            if (ls.kind != LOSS_CROSS_ENTROPY && (!s->sampler_logprobs || !s->advantages)) bad = true;
            for (int t = 0; t < n && !bad; t++)
                if (s->tokens[t] < 0 || s->tokens[t] >= st->vocab || s->targets[t] < 0 || s->targets[t] >= st->vocab)
                    bad = true;
        }
        if (bad) {
            for (int k = start; k < ns; k++) free_seq(&seqs[k]);
            memset(&seqs[start], 0, (ns - start) * sizeof *seqs);
            ns = start;
            op_fail(op, "user", "malformed datum: missing or out-of-range loss inputs for %s", lname);
            continue;
        }
        spans[nspan++] = (fb_span){op, start, ns - start};
    }
    if (ns > 0) {
        char err[512] = "";
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = st->be->forward_backward(st->ctx, seqs, ns, backward, err, sizeof err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long tokens = 0;
        for (int k = 0; k < ns; k++) tokens += seqs[k].n;
        double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        log_info("%s: %d sequences, %ld tokens in %.3f s (%.0f tok/s)", backward ? "forward_backward" : "forward",
                 ns, tokens, secs, secs > 0 ? tokens / secs : 0.0);
        for (int i = 0; i < nspan; i++) {
            exe_op *op = spans[i].op;
            if (rc < 0) { op_fail(op, "server", "backend error: %s", err); continue; }
            json_t *outs = json_array();
            double loss_sum = 0;
            bool nonfinite = false;
            for (int k = spans[i].first_seq; k < spans[i].first_seq + spans[i].nseq; k++) {
                exe_seq *s = &seqs[k];
                for (int t = 0; t < s->n; t++) {
                    loss_sum += s->loss_out[t];
                    if (isnan(s->loss_out[t]) || isnan(s->logprobs_out[t])) nonfinite = true;
                }
                json_array_append_new(outs, json_pack("{s:o, s:o}", "logprobs", tensor_json(s->logprobs_out, s->n),
                                                      "elementwise_loss", tensor_json(s->loss_out, s->n)));
            }
            if (nonfinite) {
                json_decref(outs);
                op_fail(op, "user", "the loss is not a number (NaN): check loss inputs (e.g. huge advantages or "
                        "sampler logprobs far from the model's)");
                continue;
            }
            op->result = json_pack("{s:s, s:o, s:{s:f}}", "loss_fn_output_type", "ArrayRecord",
                                   "loss_fn_outputs", outs, "metrics", "loss:sum", loss_sum);
        }
    }
    for (int k = 0; k < ns; k++) free_seq(&seqs[k]);
    free(seqs);
    free(spans);
}

/* ---- the cycle -------------------------------------------------------------------- */

static void run_create(exe_state *st, exe_op *op) {
    if (!slot_find(st, op->model_id)) {
        char err[512] = "";
        adapter *ad = adapter_create(st->model, &op->lcfg, err, sizeof err);
        if (!ad) { op_fail(op, "user", "cannot create LoRA adapter: %s", err); return; }
        slot_put(st, op->model_id, ad);
    }
    op->result = json_pack("{s:s, s:s}", "model_id", op->model_id, "type", "create_model");
}

static void run_optim(exe_state *st, exe_op *op) {
    adapter *ad = slot_find(st, op->model_id);
    if (!ad) {
        op_fail(op, "server", "this model's training state is not on this executor (it was restarted); "
                "create a new model or load a checkpoint");
        return;
    }
    json_t *ap = json_object_get(op->payload, "adam_params");
    adam_params p = {
        .learning_rate = json_number_value(json_object_get(ap, "learning_rate")),
        .beta1 = json_number_value(json_object_get(ap, "beta1")),
        .beta2 = json_number_value(json_object_get(ap, "beta2")),
        .eps = json_number_value(json_object_get(ap, "eps")),
        .weight_decay = json_number_value(json_object_get(ap, "weight_decay")),
        .grad_clip_norm = json_number_value(json_object_get(ap, "grad_clip_norm")),
    };
    double gnorm = 0;
    char err[512] = "";
    if (st->be->optim_step(st->ctx, ad, &p, &gnorm, err, sizeof err) < 0) {
        op_fail(op, "server", "optimizer step failed: %s", err);
        return;
    }
    op->result = json_pack("{s:{s:f, s:f, s:I}, s:s}", "metrics", "grad_norm:mean", isfinite(gnorm) ? gnorm : -1.0,
                           "learning_rate:mean", p.learning_rate, "step:max", (json_int_t)adapter_step(ad),
                           "type", "optim_step");
}

static int commit_cycle(PGconn *c, int64_t cycle, exe_op *ops, int n, char *err, size_t errlen) {
    char cyc[24];
    snprintf(cyc, sizeof cyc, "%lld", (long long)cycle);
    if (db_begin(c, err, errlen) < 0) return -1;
    for (int i = 0; i < n; i++) {
        exe_op *op = &ops[i];
        char id[24];
        snprintf(id, sizeof id, "%lld", (long long)op->id);
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

static int run_cycle(exe_state *st, PGconn *c, int64_t cycle) {
    char err[1024], cyc[24];
    snprintf(cyc, sizeof cyc, "%lld", (long long)cycle);
    const char *p[1] = {cyc};
    if (db_exec(c, "UPDATE cycles SET state = 'running', started_at = now() WHERE id = $1 AND state = 'assigned'",
                1, p, err, sizeof err) < 0) {
        log_error("cycle %s: %s", cyc, err);
        return -1;
    }
    PGresult *r = db_query(c, "SELECT o.id, o.request_id, o.model_id, o.kind, o.payload::text,"
                              " m.lora_rank, m.lora_seed, m.train_attn, m.train_mlp, m.train_unembed"
                              " FROM operations o JOIN models m ON m.id = o.model_id"
                              " WHERE o.cycle_id = $1 AND o.state = 'claimed' ORDER BY o.model_id, o.seq_id",
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
        if (!op->payload) op_fail(op, "server", "stored payload is not JSON: %s", je.text);
    }
    PQclear(r);

    /* 1. new adapters; 2. packed forward_backward, then packed forward; 3. optimizer steps. */
    exe_op **fb = calloc(n ? n : 1, sizeof *fb), **fwd = calloc(n ? n : 1, sizeof *fwd);
    int nfb = 0, nfwd = 0;
    for (int i = 0; i < n; i++) {
        exe_op *op = &ops[i];
        if (op->category) continue;
        if (!strcmp(op->kind, "create_model")) run_create(st, op);
        else if (!strcmp(op->kind, "forward_backward")) fb[nfb++] = op;
        else if (!strcmp(op->kind, "forward")) fwd[nfwd++] = op;
    }
    run_fb_batch(st, fb, nfb, true);
    run_fb_batch(st, fwd, nfwd, false);
    for (int i = 0; i < n; i++) {
        exe_op *op = &ops[i];
        if (op->category || op->result) continue;
        if (!strcmp(op->kind, "optim_step")) run_optim(st, op);
        else op_fail(op, "user", "operation '%s' is not implemented yet in this Loom version", op->kind);
    }
    free(fb);
    free(fwd);

    int rc = commit_cycle(c, cycle, ops, n, err, sizeof err);
    if (rc < 0) log_error("cycle %s: commit failed: %s", cyc, err);
    else log_info("cycle %s done: %d operation(s)", cyc, n);
    for (int i = 0; i < n; i++) { json_decref(ops[i].payload); json_decref(ops[i].result); }
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
                    "                     [--backend cpu] [--threads N] [--token-budget N] [--name NAME]\n");
}

int exe_main(int argc, char **argv) {
    const char *db = getenv("DATABASE_URL"), *model_dir = NULL, *model_name = NULL, *backend = "cpu";
    const char *name = "executor";
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
    exe_state st = {.be = &exe_backend_cpu};
    if (model_load(model_dir, &st.model, err, sizeof err) < 0) {
        log_error("cannot load model %s: %s", model_dir, err);
        return 1;
    }
    if (!(st.ctx = st.be->create(st.model, threads, err, sizeof err))) {
        log_error("backend %s: %s", st.be->name, err);
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
    model_free(st.model);
    log_info("executor stopped");
    return 0;
}
