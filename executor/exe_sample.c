/* exe_sample.c: sampling (docs/protocol.md §11) and the unnamed save_weights_for_sampler (§7.6).
 *
 * Snapshots: an unnamed save_weights_for_sampler copies the model's current LoRA
 * parameters, on the device, into an inference-only adapter of the store (exe_store.h),
 * keyed by its sampling session id and evicted least recently used first when the store
 * needs room. Its commit hook records this executor on the sampling session, so the
 * scheduler sends that session's samples here. A sample from an evicted snapshot fails
 * (category server). A draining executor hands its snapshots over to the pool
 * (exe_hand_over_samplers): their weights go to the blob store, and any executor of the
 * base model loads them from there for the session's samples.
 *
 * Samples: every 'sample' op of the cycle runs in ONE backend->sample call (prompts
 * packed, then one decode pass per step for all live samples); prompt_logprobs and
 * topk_prompt_logprobs come from ONE forward pass over the prompts. If a batched call
 * fails, each op is retried alone so that only the offending one fails. The sampler is
 * resolved from the payload the api wrote: "source" base | snapshot | checkpoint (with
 * "blob_digest", loaded through exe_load_sampler_adapter).
 *
 * The prompt pass also answers asample's target_prompt_logprobs (chosen ids scored at
 * chosen positions, laid out as the client sent them: dense or sparse CSR) and
 * prompt_alt_tokens_k (draws along the prompt at the request's temperature, from streams
 * seeded by the request's seed and the position): be_seq's score_* and draw_*, which every
 * backend answers with the same arithmetic (backend.h). prompt_logprobs_last_n masks the
 * prompt logprobs before the last n positions (null), the top-k rows with them.
 *
 * Every sequence of a result carries its sequence_id (contract.h sample_sequence_id), the
 * id the api answered at submit. The per-token top-k of the sampled distribution is
 * asample's topk_sample_logprobs (result key "topk_logprobs") and the same code as the
 * OpenAI routes' "top_logprobs".
 *
 * The OpenAI routes' operations (docs/protocol.md §18) also ask for "top_logprobs" (the
 * most likely tokens of each step's distribution, kept in the result per sequence) and
 * "progress": their tokens are published while the batch decodes (exe_stream.h), and a
 * request whose client went away ends early (its result says "canceled": true).
 *
 * Stops (§11.2): a stop token or the model's EOS ends a sample and is kept as its last
 * token; a stop string (needs the model's tokenizer.json) ends it at the token whose
 * bytes complete the string, that token included. The decoded text of the generated
 * tokens only (not the prompt) is searched.
 */
#include "executor/exe_sample.h"
#include "executor/exe_ckpt.h"
#include "executor/exe_sql.h"
#include "executor/exe_stream.h"
#include "backend/loss.h"
#include "contract/sample_payload.h"
#include "text/tokenizer.h"
#include "common/clock.h"
#include "common/db.h"
#include "common/log.h"
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const exe_handler_entry exe_sample_handlers[] = {{NULL, NULL}};

/* ---- snapshots ------------------------------------------------------------------------- */

static int snapshot_hook(PGconn *c, exe_state *st, exe_op *op, char *err, size_t errlen) {
    char eid[24];
    snprintf(eid, sizeof eid, "%lld", (long long)st->executor_id);
    const char *p[2] = {eid, json_string_value(json_object_get(op->payload, "sampling_session_id"))};
    PGresult *r = db_query(c, SQL_EXE_SNAPSHOT_EXECUTOR, 2, p, err, errlen);
    if (!r) return -1;
    int changed = atoi(PQcmdTuples(r));
    PQclear(r);
    if (changed != 1) {
        snprintf(err, errlen, "sampling session %s does not exist", p[1]);
        return -1;
    }
    return 0;
}

void exe_run_snapshot(exe_state *st, exe_op *op) {
    const char *sid = json_string_value(json_object_get(op->payload, "sampling_session_id"));
    if (!sid || !*sid || strlen(sid) >= sizeof st->store.e[0].key) {
        exe_op_fail(op, "server", "save_weights_for_sampler payload lacks a valid sampling_session_id");
        return;
    }
    be_adapter *ad = exe_op_training_slot(st, op);
    if (!ad) return;
    char err[256];
    be_adapter *copy = st->be->adapter_alloc(st->ctx, &ad->layout.cfg, false, err, sizeof err);
    if (!copy || st->be->adapter_copy(st->ctx, copy, ad, ADAPTER_PARAMS, err, sizeof err) < 0) {
        if (copy) st->be->adapter_free(st->ctx, copy);
        exe_op_fail(op, "server", "cannot snapshot the weights: %s", err);
        return;
    }
    if (exe_store_put(&st->store, STORE_SNAPSHOT, sid, copy, false, err, sizeof err) < 0) {
        exe_op_fail(op, "server", "cannot keep the snapshot: %s", err);
        return;
    }
    log_info("sampler snapshot %s of %s at step %lld (%zu parameters)", sid, op->model_id, (long long)ad->step,
             ad->layout.num_params);
    op->result = json_pack("{s:s, s:s}", "sampling_session_id", sid, "type", OP_SAVE_FOR_SAMPLER);
    op->commit_hook = snapshot_hook;
}

/* One snapshot into the blob store and its sampling session pointed at it, in one
 * transaction on c. 0, or -1 with err. */
static int hand_over_sampler(exe_state *st, PGconn *c, const char *sid, char *err, size_t errlen) {
    be_adapter *ad = exe_store_peek(&st->store, STORE_SNAPSHOT, sid);
    uint8_t *bytes;
    size_t len;
    char digest[BLOB_DIGEST_HEX], eid[24];
    if (!ad) {
        snprintf(err, errlen, "it is no longer in the store");
        return -1;
    }
    if (exe_adapter_to_blob(st, ad, false, &bytes, &len, digest, err, errlen) < 0) return -1;
    snprintf(eid, sizeof eid, "%lld", (long long)st->executor_id);
    const char *p[3] = {sid, digest, eid};
    int rc = db_begin(c, err, errlen);
    if (rc == 0 && (exe_blob_hold(st, c, digest, bytes, len, err, errlen) < 0 ||
                    db_exec(c, SQL_EXE_SNAPSHOT_HAND_OVER, 3, p, err, errlen) < 0 || db_commit(c, err, errlen) < 0)) {
        db_rollback(c);
        rc = -1;
    }
    free(bytes);
    return rc;
}

int exe_hand_over_samplers(exe_state *st, PGconn *c) {
    exe_store_stats ss;
    exe_store_get_stats(&st->store, &ss);
    int n = ss.count[STORE_SNAPSHOT];
    if (!n) return 0;
    const char **keys = malloc(n * sizeof *keys);
    char (*ids)[sizeof st->store.e[0].key] = malloc(n * sizeof *ids);
    n = keys && ids ? exe_store_keys(&st->store, STORE_SNAPSHOT, keys, n) : 0;
    for (int i = 0; i < n; i++) snprintf(ids[i], sizeof ids[i], "%s", keys[i]);   /* the store changes below */
    int moved = 0;
    for (int i = 0; i < n; i++) {
        char err[768];
        if (hand_over_sampler(st, c, ids[i], err, sizeof err) < 0) {
            /* retried on every idle pass while draining: a warning a minute, the rest at debug */
            static time_t warned;
            log_msg(log_level_every(&warned, 60, LOG_WARN_),
                    "sampler %s: could not hand its snapshot over (draining; its samples wait here; retried on "
                    "every idle pass, repeats logged at debug level for a minute): %s", ids[i], err);
            continue;
        }
        exe_store_drop(&st->store, STORE_SNAPSHOT, ids[i]);
        log_info("sampler %s handed over (draining): its snapshot is in the blob store for the pool", ids[i]);
        moved++;
    }
    free(keys);
    free(ids);
    return moved;
}

/* ---- the model's tokenizer (stop strings) ---------------------------------------------- */

static const tokenizer *sampler_tokenizer(exe_state *st) {
    if (st->tok_tried) return st->tok;
    st->tok_tried = true;
    char path[4200];
    const char *env = getenv("LOOM_TOKENIZER");   /* a tokenizer.json path (tests, odd layouts) */
    if (env && *env) snprintf(path, sizeof path, "%s", env);
    else if (st->model_dir) snprintf(path, sizeof path, "%s/tokenizer.json", st->model_dir);
    else {
        snprintf(st->tok_err, sizeof st->tok_err, "the executor's model directory is unknown");
        return NULL;
    }
    st->tok = tok_load(path, st->tok_err, sizeof st->tok_err);
    if (st->tok) log_info("tokenizer %s: %d tokens%s", path, tok_vocab_size(st->tok),
                        tok_exact(st->tok) ? "" : " (unknown split pattern: approximated)");
    else log_warn("no tokenizer for stop strings: %s", st->tok_err);
    return st->tok;
}

/* ---- stop strings ------------------------------------------------------------------------ */

typedef struct {
    const tokenizer *tok;
    const char **s;
    size_t *len;
    int n;
    size_t maxlen;
} stop_strings;

static size_t piece_len(const tokenizer *t, int32_t id) {
    size_t l = 0;
    return tok_token_to_piece(t, id, &l) ? l : 0;
}

/* True when the bytes of tokens[0..n) contain a stop string that ends inside the last
 * token's bytes (so it was completed by that token). */
static bool stop_string_hit(const stop_strings *ss, const int32_t *tokens, int n) {
    if (n <= 0 || ss->n == 0) return false;
    size_t last = piece_len(ss->tok, tokens[n - 1]), before = 0;
    if (last == 0) return false;
    int j = n - 1;
    while (j > 0 && before + 1 < ss->maxlen) before += piece_len(ss->tok, tokens[--j]);
    size_t total = before + last;
    char small[1024], *buf = total <= sizeof small ? small : malloc(total);
    if (!buf) return false;
    size_t m = 0;
    for (int k = j; k < n; k++) {
        size_t l = 0;
        const char *p = tok_token_to_piece(ss->tok, tokens[k], &l);
        if (p) { memcpy(buf + m, p, l); m += l; }
    }
    bool hit = false;
    for (int i = 0; i < ss->n && !hit; i++) {
        size_t L = ss->len[i];
        if (L == 0 || L > total) continue;
        size_t lo = before + 1 > L ? before + 1 - L : 0;
        for (size_t a = lo; a + L <= total && !hit; a++) hit = memcmp(buf + a, ss->s[i], L) == 0;
    }
    if (buf != small) free(buf);
    return hit;
}

static bool stop_check(const be_sample_req *r, int sample, const int32_t *tokens, int n) {
    (void)sample;
    return stop_string_hit(r->stop_user, tokens, n);
}

/* ---- sample operations ------------------------------------------------------------------- */

typedef struct {
    exe_op *op;
    int32_t *prompt;
    int n_prompt, num_samples, max_tokens, top_k, topk_prompt;
    double temperature, top_p;
    uint64_t seed;
    int32_t *stop_tokens;
    int n_stop;
    stop_strings ss;
    bool prompt_logprobs;
    be_adapter *ad;
    bool pinned;                 /* ad is pinned in the store until job_free */
    /* outputs */
    int32_t *tokens;
    float *logprobs;
    int *n_out;
    bool *stopped;
    float *plp, *ploss, *tk_lp;  /* prompt logprobs [n_prompt − 1], scratch, top-k [n_prompt − 1, k] */
    int32_t *tk_ids;
    int top_logprobs;            /* per generated token (the OpenAI routes' top_logprobs, asample's
                                    topk_sample_logprobs) */
    const char *top_key;         /* its result key: "top_logprobs" or "topk_logprobs" */
    int32_t *top_ids;            /* [num_samples, max_tokens, top_logprobs] */
    float *top_lp;
    int last_n;                  /* prompt_logprobs_last_n; 0 = the whole prompt */
    /* target_prompt_logprobs: the client's layout [target_rows, target_cols], dense or CSR
     * (target_crow / target_col) of n_target cells; the cells that name an id (not −1), in
     * row order, go to the prompt pass as score_*, score_cell[m] saying which cell each is */
    bool has_target;
    int target_rows, target_cols;
    size_t n_target;
    int64_t *target_crow, *target_col;
    int64_t *score_start, *score_cell;
    int32_t *score_ids;
    float *score_lp;
    int alt_k;                   /* prompt_alt_tokens_k */
    int32_t *alt_ids;            /* [n_prompt − 1, alt_k] */
    float *alt_lp;
    bool progress;               /* publish tokens as they come (exe_stream.h) */
    exe_stream_op *stream;
    bool canceled;               /* its client went away: samples ended early */
} sample_job;

static void job_free(exe_state *st, sample_job *j) {
    if (j->pinned) exe_store_release(&st->store, j->ad);
    free(j->prompt); free(j->stop_tokens); free(j->ss.s); free(j->ss.len);
    free(j->tokens); free(j->logprobs); free(j->n_out); free(j->stopped);
    free(j->plp); free(j->ploss); free(j->tk_lp); free(j->tk_ids);
    free(j->top_ids); free(j->top_lp);
    free(j->target_crow); free(j->target_col);
    free(j->score_start); free(j->score_cell); free(j->score_ids); free(j->score_lp);
    free(j->alt_ids); free(j->alt_lp);
}

/* The payload's target_prompt_logprobs (decoded and checked: contract/sample_payload.h)
 * into j, the asked cells in row order as the prompt pass's score_* rows; j takes the CSR
 * arrays. false: op failed. */
static bool target_take(sample_payload *p, sample_job *j)
{
    size_t n = p->n_target_ids;
    long long R = p->target_rows, K = p->target_cols;
    bool sparse = p->target_crow != NULL;
    j->has_target = true;
    j->target_rows = (int)R;
    j->target_cols = (int)K;
    j->n_target = n;
    j->target_crow = p->target_crow;
    j->target_col = p->target_col;
    p->target_crow = p->target_col = NULL;
    j->score_start = calloc((size_t)R + 1, sizeof *j->score_start);
    j->score_cell = malloc((n ? n : 1) * sizeof *j->score_cell);
    j->score_ids = malloc((n ? n : 1) * sizeof *j->score_ids);
    j->score_lp = calloc(n ? n : 1, sizeof *j->score_lp);
    if (!j->score_start || !j->score_cell || !j->score_ids || !j->score_lp) {
        exe_op_fail(j->op, "server", "out of memory for target_prompt_logprobs");
        return false;
    }
    const int64_t *ids = p->target_ids, *crow = j->target_crow;
    int64_t m = 0;
    for (long long r = 0; r < R; r++) {
        size_t a = sparse ? (size_t)crow[r] : (size_t)(r * K), b = sparse ? (size_t)crow[r + 1] : (size_t)((r + 1) * K);
        for (size_t q = a; q < b; q++) {
            if (ids[q] < 0) continue;
            j->score_ids[m] = (int32_t)ids[q];
            j->score_cell[m++] = (int64_t)q;
        }
        j->score_start[r + 1] = m;
    }
    return true;
}

/* Whether j needs the forward pass over its prompt (prompt_logprobs, topk_prompt_logprobs,
 * target_prompt_logprobs, prompt_alt_tokens_k). */
static bool job_prompt_pass(const sample_job *j)
{
    return j->prompt_logprobs || j->topk_prompt > 0 || j->has_target || j->alt_k > 0;
}

/* Reads the payload into j and resolves the sampler. false: op failed. */
static bool job_parse(exe_state *st, exe_op *op, sample_job *j) {
    const model_config *mc = &st->model;
    j->op = op;
    sample_payload p;
    char why[512];
    if (sample_payload_decode(op->payload, mc->vocab_size, mc->max_position_embeddings, &p, why, sizeof why) < 0) {
        sample_payload_free(&p);
        exe_op_fail(op, "user", "%s", why);
        return false;
    }
    int np = (int)p.n_prompt;
    j->prompt = malloc(np * sizeof *j->prompt);
    j->n_prompt = np;
    for (int i = 0; i < np; i++) j->prompt[i] = (int32_t)p.prompt[i];
    int room = mc->max_position_embeddings - np + 1;   /* the backend stops at the context */
    long long mt = p.has_max_tokens ? p.max_tokens : room < 256 ? room : 256, tlp = p.top_logprobs;
    j->temperature = p.temperature;
    j->top_p = p.top_p;
    j->num_samples = (int)p.num_samples;
    j->max_tokens = (int)(mt < room ? mt : room);
    j->top_k = p.top_k <= 0 || p.top_k > mc->vocab_size ? -1 : (int)p.top_k;
    j->topk_prompt = (int)(p.topk_prompt_logprobs < mc->vocab_size ? p.topk_prompt_logprobs : mc->vocab_size);
    j->seed = (uint64_t)p.seed;
    j->prompt_logprobs = p.prompt_logprobs;
    j->top_key = p.topk_sample_logprobs > 0 ? "topk_logprobs" : "top_logprobs";
    if (p.topk_sample_logprobs > 0) tlp = p.topk_sample_logprobs;
    j->top_logprobs = (int)(tlp < mc->vocab_size ? tlp : mc->vocab_size);
    j->progress = p.progress;
    j->last_n = (int)p.prompt_logprobs_last_n;
    j->alt_k = (int)p.prompt_alt_tokens_k;
    if (p.has_target && !target_take(&p, j)) {
        sample_payload_free(&p);
        return false;
    }

    /* stop tokens: the client's, then the model's EOS ids */
    j->stop_tokens = malloc((p.n_stop_tokens + MODEL_MAX_EOS + 1) * sizeof *j->stop_tokens);
    for (size_t i = 0; i < p.n_stop_tokens; i++) j->stop_tokens[j->n_stop++] = (int32_t)p.stop_tokens[i];
    for (int i = 0; i < mc->n_eos; i++) j->stop_tokens[j->n_stop++] = mc->eos_token_ids[i];

    if (p.n_stop_strings > 0) {
        const tokenizer *tok = sampler_tokenizer(st);
        if (!tok) {
            sample_payload_free(&p);
            exe_op_fail(op, "user", "stop strings need the base model's tokenizer.json, which this executor cannot "
                        "load (%s); pass stop token ids instead", st->tok_err);
            return false;
        }
        size_t n = p.n_stop_strings;
        j->ss.tok = tok;
        j->ss.s = calloc(n, sizeof *j->ss.s);
        j->ss.len = calloc(n, sizeof *j->ss.len);
        for (size_t i = 0; i < n; i++) {
            j->ss.s[j->ss.n] = p.stop_strings[i];   /* the payload's (op->payload outlives the job) */
            j->ss.len[j->ss.n] = strlen(p.stop_strings[i]);
            if (j->ss.len[j->ss.n] > j->ss.maxlen) j->ss.maxlen = j->ss.len[j->ss.n];
            j->ss.n++;
        }
    }
    const char *source = p.source, *digest = p.blob_digest;
    sample_payload_free(&p);

    /* the sampler */
    if (!source) source = op->sampling_session_id[0] && exe_store_get(&st->store, STORE_SNAPSHOT, op->sampling_session_id)
                          ? "snapshot" : digest ? "checkpoint" : "base";
    if (!strcmp(source, "base")) {
        j->ad = NULL;
    } else if (!strcmp(source, "snapshot")) {
        /* pinned: a checkpoint loaded for a later job of this batch must not evict it. A
         * snapshot handed over by the draining executor that took it is in the blob store. */
        char err[512];
        j->ad = exe_store_acquire(&st->store, STORE_SNAPSHOT, op->sampling_session_id);
        if (!j->ad && op->snapshot_digest[0] &&
            exe_load_sampler_adapter(st, op->snapshot_digest, &j->ad, err, sizeof err) < 0) {
            exe_op_fail(op, "server", "cannot load the snapshot of sampler %s from the blob store: %s",
                        op->sampling_session_id, err);
            return false;
        }
        if (!j->ad) {
            exe_op_fail(op, "server", "the weights of sampler %s are no longer in this executor's memory (evicted or "
                        "the executor restarted); save weights for the sampler again",
                        op->sampling_session_id[0] ? op->sampling_session_id : "(none)");
            return false;
        }
        j->pinned = true;
    } else if (!strcmp(source, "checkpoint")) {
        char err[512];
        if (!digest) { exe_op_fail(op, "server", "sample payload lacks the checkpoint's blob_digest"); return false; }
        if (exe_load_sampler_adapter(st, digest, &j->ad, err, sizeof err) < 0) {
            exe_op_fail(op, "server", "cannot load the sampler's checkpoint: %s", err);
            return false;
        }
        j->pinned = true;
    } else {
        exe_op_fail(op, "server", "unknown sampler source '%s'", source);
        return false;
    }

    /* outputs */
    size_t cells = (size_t)j->num_samples * (j->max_tokens ? j->max_tokens : 1);
    j->tokens = malloc(cells * sizeof *j->tokens);
    j->logprobs = malloc(cells * sizeof *j->logprobs);
    j->n_out = calloc(j->num_samples, sizeof *j->n_out);
    j->stopped = calloc(j->num_samples, sizeof *j->stopped);
    if (j->top_logprobs) {
        j->top_ids = malloc(cells * j->top_logprobs * sizeof *j->top_ids);
        j->top_lp = malloc(cells * j->top_logprobs * sizeof *j->top_lp);
    }
    bool pass = job_prompt_pass(j);
    if (pass) {
        j->plp = calloc(np, sizeof *j->plp);
        j->ploss = calloc(np, sizeof *j->ploss);
        if (j->topk_prompt > 0) {
            j->tk_ids = calloc((size_t)np * j->topk_prompt, sizeof *j->tk_ids);
            j->tk_lp = calloc((size_t)np * j->topk_prompt, sizeof *j->tk_lp);
        }
    }
    if (j->alt_k > 0) {
        j->alt_ids = calloc((size_t)np * j->alt_k, sizeof *j->alt_ids);
        j->alt_lp = calloc((size_t)np * j->alt_k, sizeof *j->alt_lp);
    }
    if (!j->tokens || !j->logprobs || !j->n_out || !j->stopped || (j->top_logprobs && (!j->top_ids || !j->top_lp)) ||
        (pass && (!j->plp || !j->ploss || (j->topk_prompt && (!j->tk_ids || !j->tk_lp)))) ||
        (j->alt_k && (!j->alt_ids || !j->alt_lp))) {
        exe_op_fail(op, "server", "out of memory for %d samples of %d tokens", j->num_samples, j->max_tokens);
        return false;
    }
    return true;
}

static be_sample_req job_req(sample_job *j) {
    return (be_sample_req){.ad = j->ad, .n_prompt = j->n_prompt, .prompt = j->prompt, .num_samples = j->num_samples,
                            .max_tokens = j->max_tokens, .temperature = j->temperature, .top_k = j->top_k,
                            .top_p = j->top_p, .seed = j->seed, .stop_tokens = j->stop_tokens, .n_stop = j->n_stop,
                            .stop_check = j->ss.n ? stop_check : NULL, .stop_user = &j->ss,
                            .on_token = j->stream ? exe_stream_on_token : NULL, .on_token_user = j->stream,
                            .top_logprobs = j->top_logprobs, .top_ids_out = j->top_ids, .top_lp_out = j->top_lp,
                            .tokens_out = j->tokens, .logprobs_out = j->logprobs, .n_out = j->n_out,
                            .stopped_out = j->stopped};
}

static be_seq job_seq(sample_job *j) {
    return (be_seq){.ad = j->ad, .loss = loss_spec_default(LOSS_CROSS_ENTROPY), .n = j->n_prompt - 1,
                     .tokens = j->prompt, .targets = j->prompt + 1, .logprobs_out = j->plp, .loss_out = j->ploss,
                     .topk = j->topk_prompt, .topk_ids_out = j->tk_ids, .topk_lp_out = j->tk_lp,
                     .score_start = j->has_target ? j->score_start : NULL, .score_ids = j->score_ids,
                     .score_lp_out = j->score_lp, .draw_k = j->alt_k, .draw_temperature = j->temperature,
                     .draw_seed = j->seed, .draw_ids_out = j->alt_ids, .draw_lp_out = j->alt_lp};
}

/* Runs jobs through the backend together; if that fails, one by one so that only the
 * failing ones fail. prompt: the forward pass for prompt logprobs instead of sampling. */
static void run_jobs(exe_state *st, sample_job **jobs, int n, bool prompt) {
    if (n == 0) return;
    char err[512] = "";
    int rc;
    if (prompt) {
        be_seq *seqs = calloc(n, sizeof *seqs);
        for (int i = 0; i < n; i++) seqs[i] = job_seq(jobs[i]);
        rc = st->be->forward_backward(st->ctx, seqs, n, false, err, sizeof err);
        free(seqs);
    } else {
        be_sample_req *reqs = calloc(n, sizeof *reqs);
        for (int i = 0; i < n; i++) reqs[i] = job_req(jobs[i]);
        rc = st->be->sample(st->ctx, reqs, n, err, sizeof err);
        free(reqs);
    }
    if (rc == 0) return;
    if (n == 1) {
        exe_op_fail(jobs[0]->op, "server", "%s failed: %s", prompt ? "prompt logprobs" : "sampling", err);
        return;
    }
    log_warn("%s batch of %d failed (%s); running its operations one by one", prompt ? "prompt logprobs" : "sample",
             n, err);
    for (int i = 0; i < n; i++) run_jobs(st, &jobs[i], 1, prompt);
}

static json_t *lp_json(float x) { return json_real(isfinite(x) ? (double)x : x < 0 ? -FLT_MAX : 0.0); }

/* The top_logprobs of sample s's first n tokens: per token [[id, logprob], ...], most likely first. */
static json_t *top_json(const sample_job *j, int s, int n) {
    json_t *a = json_array();
    for (int k = 0; k < n; k++) {
        size_t c = ((size_t)s * j->max_tokens + k) * j->top_logprobs;
        json_t *row = json_array();
        for (int i = 0; i < j->top_logprobs; i++)
            if (j->top_ids[c + i] >= 0)
                json_array_append_new(row, json_pack("[i, o]", j->top_ids[c + i], lp_json(j->top_lp[c + i])));
        json_array_append_new(a, row);
    }
    return a;
}

/* target_prompt_logprobs as a float32 TensorData in the client's layout (sparse CSR with its
 * indices when it sent CSR); cells that asked for nothing (−1) hold 0.0. */
static json_t *target_json(const sample_job *j)
{
    float *cells = calloc(j->n_target ? j->n_target : 1, sizeof *cells);   /* 0.0 where nothing was asked */
    if (!cells) return json_null();
    for (int64_t m = 0; m < j->score_start[j->target_rows]; m++) cells[j->score_cell[m]] = j->score_lp[m];
    json_t *data = json_array();
    for (size_t q = 0; q < j->n_target; q++) json_array_append_new(data, lp_json(cells[q]));
    free(cells);
    json_t *t = json_pack("{s:o, s:s, s:[i, i]}", "data", data, "dtype", "float32", "shape", j->target_rows,
                          j->target_cols);
    if (j->target_crow) {
        json_t *crow = json_array(), *col = json_array();
        for (int r = 0; r <= j->target_rows; r++) json_array_append_new(crow, json_integer(j->target_crow[r]));
        for (size_t q = 0; q < j->n_target; q++) json_array_append_new(col, json_integer(j->target_col[q]));
        json_object_set_new(t, "sparse_crow_indices", crow);
        json_object_set_new(t, "sparse_col_indices", col);
    }
    return t;
}

/* Cuts each sample at its first completed stop string, then writes op->result. */
static void job_result(sample_job *j) {
    json_t *seqs = json_array();
    for (int s = 0; s < j->num_samples; s++) {
        const int32_t *tok = j->tokens + (size_t)s * j->max_tokens;
        const float *lp = j->logprobs + (size_t)s * j->max_tokens;
        int n = j->n_out[s];
        bool stopped = j->stopped[s];
        if (j->ss.n)
            for (int k = 1; k <= n; k++)
                if (stop_string_hit(&j->ss, tok, k)) { n = k; stopped = true; break; }
        json_t *t = json_array(), *l = json_array();
        for (int k = 0; k < n; k++) {
            json_array_append_new(t, json_integer(tok[k]));
            json_array_append_new(l, lp_json(lp[k]));
        }
        char sid[SAMPLE_SEQUENCE_ID_MAX];
        sample_sequence_id(sid, sizeof sid, j->op->request_id, s);
        json_t *seq = json_pack("{s:o, s:o, s:s, s:s}", "tokens", t, "logprobs", l, "stop_reason",
                                stopped ? "stop" : "length", "sequence_id", sid);
        if (j->top_logprobs) json_object_set_new(seq, j->top_key, top_json(j, s, n));
        json_array_append_new(seqs, seq);
    }
    json_t *r = json_pack("{s:s, s:o}", "type", OP_SAMPLE, "sequences", seqs);
    /* prompt position i + 1 is scored by row i; prompt_logprobs_last_n leaves out the rows
     * before the last n positions */
    int first_row = j->last_n > 0 ? j->n_prompt - 1 - j->last_n : 0;
    if (j->prompt_logprobs) {
        json_t *a = json_array();
        json_array_append_new(a, json_null());
        for (int i = 0; i + 1 < j->n_prompt; i++) json_array_append_new(a, i < first_row ? json_null() : lp_json(j->plp[i]));
        json_object_set_new(r, "prompt_logprobs", a);
    }
    if (j->topk_prompt > 0) {
        json_t *a = json_array();
        json_array_append_new(a, json_null());
        for (int i = 0; i + 1 < j->n_prompt; i++) {
            if (i < first_row) {
                json_array_append_new(a, json_null());
                continue;
            }
            json_t *row = json_array();
            for (int k = 0; k < j->topk_prompt; k++) {
                size_t c = (size_t)i * j->topk_prompt + k;
                json_array_append_new(row, json_pack("[i, o]", j->tk_ids[c], lp_json(j->tk_lp[c])));
            }
            json_array_append_new(a, row);
        }
        json_object_set_new(r, "topk_prompt_logprobs", a);
    }
    if (j->has_target) json_object_set_new(r, "target_prompt_logprobs", target_json(j));
    if (j->alt_k > 0) {
        int rows = j->n_prompt - 1, k = j->alt_k;
        json_t *ids = json_array(), *lps = json_array();
        for (int c = 0; c < rows * k; c++) {
            json_array_append_new(ids, json_integer(j->alt_ids[c]));
            json_array_append_new(lps, lp_json(j->alt_lp[c]));
        }
        json_object_set_new(r, "prompt_alt_tokens",
                            json_pack("{s:{s:o, s:s, s:[i, i]}, s:{s:o, s:s, s:[i, i]}}", "tokens", "data", ids,
                                      "dtype", "int64", "shape", rows, k, "logprobs", "data", lps, "dtype", "float32",
                                      "shape", rows, k));
    }
    json_object_set_new(r, "prompt_cache_hit_tokens", json_integer(0));
    if (j->canceled) json_object_set_new(r, "canceled", json_true());
    j->op->result = r;
}

void exe_run_sample_batch(exe_state *st, exe_op **ops, int nops) {
    if (nops == 0) return;
    sample_job *jobs = calloc(nops, sizeof *jobs);
    sample_job **run = calloc(nops, sizeof *run), **fwd = calloc(nops, sizeof *fwd);
    int nrun = 0, nfwd = 0;
    long new_tokens = 0;
    for (int i = 0; i < nops; i++) {
        if (!job_parse(st, ops[i], &jobs[i])) continue;
        run[nrun++] = &jobs[i];
        if (job_prompt_pass(&jobs[i]) && jobs[i].n_prompt > 1) fwd[nfwd++] = &jobs[i];
    }
    for (int i = 0; i < nrun; i++) {
        sample_job *j = run[i];
        if (j->progress)
            j->stream = exe_stream_track(st, j->op->request_id, j->num_samples, j->max_tokens, j->tokens, j->logprobs,
                                         j->top_logprobs, j->top_ids, j->top_lp);
    }
    double t0 = clock_mono_s();
    run_jobs(st, fwd, nfwd, true);
    int k = 0;
    for (int i = 0; i < nrun; i++) {
        if (!run[i]->op->category) run[k++] = run[i];
        else exe_stream_untrack(run[i]->stream, NULL, NULL), run[i]->stream = NULL;
    }
    nrun = k;
    run_jobs(st, run, nrun, false);
    for (int i = 0; i < nrun; i++) {
        sample_job *j = run[i];
        bool ok = !j->op->category;
        j->canceled = exe_stream_canceled(j->stream);
        exe_stream_untrack(j->stream, ok ? j->n_out : NULL, ok ? j->stopped : NULL);
        j->stream = NULL;
    }
    double secs = clock_mono_s() - t0;
    int nseq = 0;
    for (int i = 0; i < nrun; i++) {
        sample_job *j = run[i];
        if (j->op->category) continue;
        job_result(j);
        nseq += j->num_samples;
        for (int s = 0; s < j->num_samples; s++) new_tokens += j->n_out[s];
    }
    if (nrun) log_info("sample: %d request(s), %d sequence(s), %ld new tokens in %.3f s (%.0f tok/s)", nrun, nseq,
                       new_tokens, secs, secs > 0 ? new_tokens / secs : 0.0);
    for (int i = 0; i < nops; i++) job_free(st, &jobs[i]);
    free(jobs);
    free(run);
    free(fwd);
}
