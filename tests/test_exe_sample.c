/* test_exe_sample.c — the executor's sampling code (executor/exe_sample.c) without a database:
 * operations built in memory as the executor loop builds them from rows, run through
 * exe_run_snapshot / exe_run_sample_batch on the tiny Llama with the test backend
 * (LOOM_TEST_BACKEND, default cpu).
 *
 * Checks the result JSON of docs/protocol.md §11.2 and the semantics of §9: sampled log-probs at
 * temperature 1 equal a forward pass over the same tokens; prompt_logprobs and
 * topk_prompt_logprobs agree with it; a seed reproduces samples alone or batched with
 * others; temperature 0 is the argmax; stop tokens, EOS and stop strings end a sample
 * and are kept; a snapshot keeps the weights it was taken with while training goes on;
 * eviction within the store's memory budget, unknown snapshots, bad payloads and
 * unsupported sources fail cleanly; a bad datum fails only its forward_backward. The SDK
 * 0.29+ outputs: sequence ids, topk_sample_logprobs, target_prompt_logprobs (the prompt
 * token's equals prompt_logprobs), prompt_logprobs_last_n, prompt_alt_tokens_k (scored as
 * targets they give their own logprobs), the same alone as batched. */
#include "backend/backend.h"
#include "backend/loss.h"
#include "contract/fb_payload.h"
#include "executor/exe_sample.h"
#include "executor/exe_train.h"
#include "model/mkmodel.h"
#include "model/rng.h"
#include "text/tokenizer.h"
#include "tests/lib/test_backend.h"
#define CHECK_QUIET   /* thousands of checks: print failures only */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static exe_state st;
static tokenizer *tok;

static exe_op *new_op(const char *kind, const char *model_id, const char *ssid, const char *payload)
{
    exe_op *op = calloc(1, sizeof *op);
    snprintf(op->kind, sizeof op->kind, "%s", kind);
    snprintf(op->model_id, sizeof op->model_id, "%s", model_id ? model_id : "");
    snprintf(op->sampling_session_id, sizeof op->sampling_session_id, "%s", ssid ? ssid : "");
    json_error_t je;
    op->payload = json_loads(payload, 0, &je);
    if (!op->payload) { printf("bad test payload: %s: %s\n", je.text, payload); exit(1); }
    op->lcfg = (lora_config){.rank = 4, .seed = 5, .train_attn = true, .train_mlp = true, .train_unembed = true};
    return op;
}

static void free_op(exe_op *op)
{
    json_decref(op->payload);
    json_decref(op->result);
    free(op->payload_bin);
    free(op->result_bin);
    free(op->hook_data);
    free(op);
}

/* A cross_entropy forward_backward of one or two datums (tokens t, targets t + 1), its
 * payload packed as the api packs it (contract/fb_payload.h). */
static exe_op *fb_op(const int64_t *t0, size_t n0, const int64_t *t1, size_t n1)
{
    exe_op *op = new_op("forward_backward", "m1", NULL, "{\"loss_fn\": \"cross_entropy\"}");
    fb_datum d[2] = {{.tokens = (int64_t *)t0, .n_tokens = n0}, {.tokens = (int64_t *)t1, .n_tokens = n1}};
    int64_t tg[2][4];
    for (int i = 0; i < 2; i++) {
        for (size_t k = 0; k < d[i].n_tokens; k++) tg[i][k] = d[i].tokens[k] + 1;
        d[i].in[LOSS_IN_TARGET_TOKENS] = (fb_tensor){.present = true, .n = d[i].n_tokens, .k = 1, .dims = 1, .i = tg[i]};
    }
    fb_request r = {.loss = LOSS_CROSS_ENTROPY, .data = d, .n_data = t1 ? 2 : 1};
    fb_payload p;
    fb_payload_encode(&r, &p);
    op->payload_bin = p.bin;
    op->payload_bin_len = p.bin_len;
    free(p.header);
    return op;
}

/* One sample op, alone. */
static exe_op *sample1(const char *ssid, const char *payload)
{
    exe_op *op = new_op("sample", NULL, ssid, payload);
    exe_run_sample_batch(&st, &op, 1);
    return op;
}

static json_t *seq_of(const exe_op *op, int i) { return json_array_get(json_object_get(op->result, "sequences"), i); }

static int ints(json_t *a, int32_t *out, int cap)
{
    int n = (int)json_array_size(a);
    for (int i = 0; i < n && i < cap; i++) out[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return n;
}

/* log p(x[i+1] | x[..i]) for i < n−1 under adapter ad, by the training forward pass. */
static void forward_lp(be_adapter *ad, const int32_t *x, int n, float *lp)
{
    float *loss = calloc(n, sizeof *loss);
    be_seq s = {.ad = ad, .loss = loss_spec_default(LOSS_CROSS_ENTROPY), .n = n - 1, .tokens = x, .targets = x + 1,
                 .logprobs_out = lp, .loss_out = loss};
    char err[256];
    if (st.be->forward_backward(st.ctx, &s, 1, false, err, sizeof err) != 0) printf("forward: %s\n", err);
    free(loss);
}

/* Largest |sampled logprob − forward logprob| over a sample's generated tokens. */
static double lp_gap(be_adapter *ad, const int32_t *prompt, int np, json_t *seq)
{
    int32_t x[512];
    memcpy(x, prompt, np * sizeof *x);
    int n = ints(json_object_get(seq, "tokens"), x + np, 512 - np);
    float lp[512];
    forward_lp(ad, x, np + n, lp);
    double gap = 0;
    json_t *l = json_object_get(seq, "logprobs");
    for (int i = 0; i < n; i++) {
        double d = fabs(json_real_value(json_array_get(l, i)) - lp[np - 1 + i]);
        gap = d > gap ? d : gap;
    }
    return gap;
}

int main(void)
{
    char dir[] = "/tmp/loom-exs-XXXXXX", err[512], path[600];
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    mkmodel_opts o;
    mkmodel_defaults(&o, "llama", "tiny", err, sizeof err);
    o.out_dir = dir;
    o.init_std = 0.08; /* peakier distributions than 0.02: greedy and stops get exercised */
    if (mkmodel_write(&o, err, sizeof err) != 0) { printf("mkmodel: %s\n", err); return 1; }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    st.model_dir = dir;   /* stop strings find <model_dir>/tokenizer.json, as in the executor */
    tok = tok_load(path, err, sizeof err);
    CHECK(tok != NULL, "mkmodel wrote a loadable tokenizer.json: %s", err);
    st.be = test_backend();
    /* log-prob bars: the CPU's fp32 1e-4 between sampling and forward passes, 1e-5 for one
     * log-prob from two passes of another batch shape; a bf16 backend's passes run GEMMs of
     * other shapes, whose bf16 roundings differ: 2e-2 for both */
    bool bf16 = test_backend_bf16(st.be);
    double lp_tol = bf16 ? 2e-2 : 1e-4, pass_tol = bf16 ? 2e-2 : 1e-5;
    if (!(st.ctx = test_backend_open(st.be, dir, 2, &st.model, err, sizeof err))) { printf("load: %s\n", err); return 1; }
    exe_store_init(&st.store, st.be, st.ctx, (size_t)1 << 30);
    st.executor_id = 7;

    /* a training model whose B is not zero, so that the adapter changes the distribution */
    exe_op *cr = new_op("create_model", "m1", NULL, "{}");
    exe_run_create(&st, cr);
    be_adapter *ad = exe_store_get(&st.store, STORE_TRAINING, "m1");
    CHECK(ad && cr->result, "create_model");
    if (!ad) return 1;
    adapter_state w = test_download(st.be, st.ctx, ad, ADAPTER_PARAMS);
    rng_state r;
    rng_seed(&r, 9);
    for (size_t i = 0; i < w.layout.num_params; i++) w.params[i] = (float)(0.05 * rng_normal(&r));
    test_upload(st.be, st.ctx, ad, &w, ADAPTER_PARAMS);
    be_adapter *at_snap = be_adapter_from_state(st.be, st.ctx, &w, false, err, sizeof err);

    /* ---- snapshot ---- */
    exe_op *sn = new_op("save_weights_for_sampler", "m1", NULL, "{\"sampling_session_id\": \"S:sample:0\"}");
    exe_run_snapshot(&st, sn);
    char *res = json_dumps(sn->result, JSON_COMPACT | JSON_SORT_KEYS);
    CHECK(res && !strcmp(res, "{\"sampling_session_id\":\"S:sample:0\",\"type\":\"save_weights_for_sampler\"}"),
          "snapshot result %s", res ? res : "(none)");
    free(res);
    CHECK(sn->commit_hook != NULL, "snapshot sets a commit hook (sampling_sessions.executor_id)");
    /* training goes on: the live adapter changes, the snapshot must not */
    for (size_t i = 0; i < w.layout.num_params; i++) w.params[i] += 0.05f;
    test_upload(st.be, st.ctx, ad, &w, ADAPTER_PARAMS);
    adapter_state_free(&w);

    const int32_t prompt[] = {1, 17, 33, 90, 4, 250, 7};
    const int np = 7;

    /* ---- temperature 1: logprobs equal the forward pass (§9.1) ---- */
    exe_op *a = sample1("S:sample:0", "{\"prompt\": [1,17,33,90,4,250,7], \"num_samples\": 4, \"max_tokens\": 12,"
                                      " \"temperature\": 1.0, \"top_k\": -1, \"top_p\": 1.0, \"seed\": 123,"
                                      " \"prompt_logprobs\": true, \"topk_prompt_logprobs\": 5, \"source\": \"snapshot\"}");
    CHECK(!a->category, "snapshot sample ok: %s", a->error);
    CHECK(json_array_size(json_object_get(a->result, "sequences")) == 4, "num_samples sequences");
    CHECK(json_integer_value(json_object_get(a->result, "prompt_cache_hit_tokens")) == 0 &&
          !strcmp(json_string_value(json_object_get(a->result, "type")), "sample"), "type and prompt_cache_hit_tokens");
    double worst = 0, worst_live = 0;
    for (int s = 0; s < 4; s++) {
        json_t *q = seq_of(a, s);
        int n = (int)json_array_size(json_object_get(q, "tokens"));
        CHECK(n == (int)json_array_size(json_object_get(q, "logprobs")) && n >= 1 && n <= 12, "lengths %d", n);
        double g = lp_gap(at_snap, prompt, np, q), gl = lp_gap(ad, prompt, np, q);
        worst = g > worst ? g : worst;
        worst_live = gl > worst_live ? gl : worst_live;
    }
    CHECK(worst < lp_tol, "sampled logprobs = forward logprobs of the snapshot's weights (max gap %.2e)", worst);
    CHECK(worst_live > 1e-3, "and differ from the live, further-trained weights (gap %.2e)", worst_live);
    printf("ok    temperature 1: |sampled - forward| logprob max %.2e (snapshot), %.2e vs live weights\n", worst,
           worst_live);
    /* prompt logprobs */
    {
        float lp[16];
        forward_lp(at_snap, prompt, np, lp);
        json_t *pl = json_object_get(a->result, "prompt_logprobs"), *tk = json_object_get(a->result, "topk_prompt_logprobs");
        CHECK(json_array_size(pl) == (size_t)np && json_is_null(json_array_get(pl, 0)), "prompt_logprobs[0] is null");
        CHECK(json_array_size(tk) == (size_t)np && json_is_null(json_array_get(tk, 0)), "topk_prompt_logprobs[0] is null");
        double gap = 0;
        bool sorted = true, has_target = true;
        for (int i = 1; i < np; i++) {
            gap = fmax(gap, fabs(json_real_value(json_array_get(pl, i)) - lp[i - 1]));
            json_t *row = json_array_get(tk, i);
            sorted &= json_array_size(row) == 5;
            double prev = 1;
            bool found = false;
            for (int k = 0; k < 5; k++) {
                json_t *pair = json_array_get(row, k);
                double v = json_real_value(json_array_get(pair, 1));
                sorted &= v <= prev;
                prev = v;
                if (json_integer_value(json_array_get(pair, 0)) == prompt[i]) {
                    found = true;
                    gap = fmax(gap, fabs(v - lp[i - 1]));
                }
            }
            /* the prompt token is in the top 5 only when it is at least the 5th best */
            if (!found) has_target &= json_real_value(json_array_get(json_array_get(row, 4), 1)) >= lp[i - 1] - pass_tol;
        }
        CHECK(gap < lp_tol, "prompt_logprobs (and matching top-k entries) = forward logprobs (gap %.2e)", gap);
        CHECK(sorted && has_target, "topk_prompt_logprobs: 5 per position, best first, consistent");
    }

    /* ---- seeds: alone, again, and batched with other work ---- */
    {
        exe_op *b[3];
        b[0] = new_op("sample", NULL, NULL, "{\"prompt\": [5,6,7], \"num_samples\": 2, \"max_tokens\": 5, \"seed\": 1,"
                                            " \"source\": \"base\"}");
        b[1] = new_op("sample", NULL, "S:sample:0", "{\"prompt\": [1,17,33,90,4,250,7], \"num_samples\": 4, \"max_tokens\": 12,"
                                                   " \"temperature\": 1.0, \"seed\": 123, \"source\": \"snapshot\"}");
        b[2] = new_op("sample", NULL, NULL, "{\"prompt\": [9], \"num_samples\": 3, \"max_tokens\": 7, \"seed\": 2,"
                                            " \"temperature\": 0.7, \"top_k\": 20, \"top_p\": 0.9, \"source\": \"base\"}");
        exe_run_sample_batch(&st, b, 3);
        bool same = !b[1]->category;
        double gap = 0;
        for (int s = 0; s < 4 && same; s++) {
            char *x = json_dumps(json_object_get(seq_of(a, s), "tokens"), JSON_COMPACT),
                 *y = json_dumps(json_object_get(seq_of(b[1], s), "tokens"), JSON_COMPACT);
            same = x && y && !strcmp(x, y);
            if (!same) printf("  sample %d: %s vs %s\n", s, x, y);
            free(x);
            free(y);
            json_t *la = json_object_get(seq_of(a, s), "logprobs"), *lb = json_object_get(seq_of(b[1], s), "logprobs");
            for (size_t i = 0; i < json_array_size(la); i++)
                gap = fmax(gap, fabs(json_real_value(json_array_get(la, i)) - json_real_value(json_array_get(lb, i))));
        }
        CHECK(same && gap < pass_tol, "same seed → same tokens (logprobs within %.1e), also batched with other requests", gap);
        CHECK(!b[0]->category && !b[2]->category, "batched base-model samples ok");
        exe_op *c = sample1(NULL, "{\"prompt\": [9], \"num_samples\": 3, \"max_tokens\": 7, \"seed\": 3,"
                                  " \"temperature\": 0.7, \"top_k\": 20, \"top_p\": 0.9, \"source\": \"base\"}");
        char *x = json_dumps(json_object_get(c->result, "sequences"), JSON_COMPACT),
             *y = json_dumps(json_object_get(b[2]->result, "sequences"), JSON_COMPACT);
        CHECK(x && y && strcmp(x, y), "another seed → other samples");
        free(x);
        free(y);
        for (int i = 0; i < 3; i++) free_op(b[i]);
        free_op(c);
    }

    /* ---- SDK 0.29+ outputs: sequence ids, topk_sample_logprobs, target_prompt_logprobs,
     * prompt_logprobs_last_n, prompt_alt_tokens_k (docs/protocol.md §11.2) ---- */
    {
        const char *pl = "{\"prompt\": [1,17,33,90,4,250,7], \"num_samples\": 2, \"max_tokens\": 6, \"seed\": 21,"
                         " \"temperature\": 0.9, \"source\": \"base\", \"prompt_logprobs\": true,"
                         " \"topk_prompt_logprobs\": 2, \"prompt_logprobs_last_n\": 3, \"topk_sample_logprobs\": 3,"
                         " \"prompt_alt_tokens_k\": 4, \"target_prompt_logprobs\": {\"shape\": [6, 2],"
                         " \"data\": [17,-1, 33,5, 90,-1, 4,200, 250,-1, 7,0]}}";
        exe_op *x = new_op("sample", NULL, NULL, pl);
        snprintf(x->request_id, sizeof x->request_id, "req-x");
        exe_run_sample_batch(&st, &x, 1);
        CHECK(!x->category, "sample with every new output: %s", x->error);
        bool ids = true, rows = true;
        for (int s = 0; s < 2; s++) {
            char want[64];
            snprintf(want, sizeof want, "req-x:%d", s);
            json_t *q = seq_of(x, s);
            ids &= json_is_string(json_object_get(q, "sequence_id")) &&
                   !strcmp(json_string_value(json_object_get(q, "sequence_id")), want);
            json_t *tk = json_object_get(q, "topk_logprobs");
            rows &= json_array_size(tk) == json_array_size(json_object_get(q, "tokens")) &&
                    json_array_size(json_array_get(tk, 0)) == 3 && !json_object_get(q, "top_logprobs");
        }
        CHECK(ids, "every sequence carries sequence_id <request_id>:<index>");
        CHECK(rows, "topk_sample_logprobs: a row of 3 per sampled token, under \"topk_logprobs\"");
        /* target_prompt_logprobs: the actual next token's is prompt_logprobs' number; -1 is 0.0 */
        float lp[16];
        forward_lp(NULL, prompt, np, lp);
        json_t *t = json_object_get(x->result, "target_prompt_logprobs"), *td = json_object_get(t, "data");
        json_t *plp = json_object_get(x->result, "prompt_logprobs");
        bool same = json_array_size(td) == 12 && !strcmp(json_string_value(json_object_get(t, "dtype")), "float32");
        double gap = 0;
        for (int i = 0; i < 6 && same; i++) {
            double v = json_real_value(json_array_get(td, 2 * i));
            gap = fmax(gap, fabs(v - lp[i]));
            if (i >= 3) same &= v == json_real_value(json_array_get(plp, i + 1));   /* the last 3 are not masked */
            if (i % 2 == 0) same &= json_real_value(json_array_get(td, 2 * i + 1)) == 0.0;
        }
        CHECK(same && gap < pass_tol, "target_prompt_logprobs: the prompt token's equals prompt_logprobs, -1 cells 0.0 "
              "(gap to a forward pass %.1e)", gap);
        bool masked = json_array_size(plp) == (size_t)np;
        for (int i = 0; i < np && masked; i++)
            masked = (i < np - 3) == json_is_null(json_array_get(plp, i)) &&
                     (i < np - 3) == json_is_null(json_array_get(json_object_get(x->result, "topk_prompt_logprobs"), i));
        CHECK(masked, "prompt_logprobs_last_n 3: prompt logprobs and top-k rows null before the last 3 positions");
        /* prompt_alt_tokens: [6, 4]; scoring the drawn ids as targets gives their logprobs bit for bit */
        json_t *alt = json_object_get(x->result, "prompt_alt_tokens");
        json_t *at = json_object_get(json_object_get(alt, "tokens"), "data"),
               *al = json_object_get(json_object_get(alt, "logprobs"), "data");
        char tp[1024];
        int m = snprintf(tp, sizeof tp, "{\"prompt\": [1,17,33,90,4,250,7], \"max_tokens\": 1, \"source\": \"base\","
                                        " \"target_prompt_logprobs\": {\"shape\": [6, 4], \"data\": [");
        for (size_t i = 0; i < json_array_size(at); i++)
            m += snprintf(tp + m, sizeof tp - m, "%s%lld", i ? "," : "", (long long)json_integer_value(json_array_get(at, i)));
        snprintf(tp + m, sizeof tp - m, "]}}");
        exe_op *sc = sample1(NULL, tp);
        json_t *sd = json_object_get(json_object_get(sc->result, "target_prompt_logprobs"), "data");
        bool alt_ok = json_array_size(at) == 24 && json_array_size(sd) == 24;
        for (int i = 0; i < 24 && alt_ok; i++) alt_ok = json_real_value(json_array_get(al, i)) == json_real_value(json_array_get(sd, i));
        CHECK(alt_ok, "prompt_alt_tokens: [6, 4] draws, their logprobs those of target_prompt_logprobs exactly");
        /* batched with other work, the draws and scores are the same */
        exe_op *b[3];
        b[0] = new_op("sample", NULL, "S:sample:0", "{\"prompt\": [3,4,5,6,7,8,9,10], \"num_samples\": 2, \"max_tokens\": 3,"
                                                   " \"seed\": 4, \"prompt_alt_tokens_k\": 2, \"source\": \"snapshot\"}");
        b[1] = new_op("sample", NULL, NULL, pl);
        snprintf(b[1]->request_id, sizeof b[1]->request_id, "req-x");
        b[2] = new_op("sample", NULL, NULL, "{\"prompt\": [9, 8], \"max_tokens\": 4, \"seed\": 2, \"prompt_logprobs\": true,"
                                            " \"source\": \"base\"}");
        exe_run_sample_batch(&st, b, 3);
        char *u = json_dumps(x->result, JSON_COMPACT | JSON_SORT_KEYS), *v = json_dumps(b[1]->result, JSON_COMPACT | JSON_SORT_KEYS);
        CHECK(!b[0]->category && !b[2]->category && u && v && (bf16 || !strcmp(u, v)),
              "batched with other requests (a snapshot's draws among them) the result is the same, bit for bit");
        if (u && v && strcmp(u, v) && !bf16) printf("  alone   %s\n  batched %s\n", u, v);
        free(u);
        free(v);
        for (int i = 0; i < 3; i++) free_op(b[i]);
        free_op(sc);
        free_op(x);
        exe_op *bad = sample1(NULL, "{\"prompt\": [1,2,3], \"max_tokens\": 1, \"source\": \"base\","
                                    " \"target_prompt_logprobs\": {\"shape\": [2, 2], \"data\": [1, 2, 3]}}");
        CHECK(bad->category && !strcmp(bad->category, "user") && strstr(bad->error, "target_prompt_logprobs"),
              "a malformed target_prompt_logprobs payload fails its operation (user): %s", bad->error);
        free_op(bad);
    }

    /* ---- temperature 0: the argmax at every step ---- */
    {
        exe_op *g = sample1(NULL, "{\"prompt\": [1,17,33,90,4,250,7], \"num_samples\": 2, \"max_tokens\": 10,"
                                  " \"temperature\": 0, \"seed\": 5, \"source\": \"base\"}");
        int32_t x[64];
        memcpy(x, prompt, sizeof prompt);
        int n = ints(json_object_get(seq_of(g, 0), "tokens"), x + np, 32);
        int32_t y[64];
        int n2 = ints(json_object_get(seq_of(g, 1), "tokens"), y, 32);
        CHECK(n == n2 && !memcmp(x + np, y, n * sizeof *y), "greedy samples agree");
        /* top-1 of each position of prompt+generated, from topk_prompt_logprobs */
        char pl[1024];
        int m = snprintf(pl, sizeof pl, "{\"prompt\": [");
        for (int i = 0; i < np + n; i++) m += snprintf(pl + m, sizeof pl - m, "%s%d", i ? "," : "", x[i]);
        snprintf(pl + m, sizeof pl - m, "], \"max_tokens\": 1, \"topk_prompt_logprobs\": 1, \"source\": \"base\"}");
        exe_op *t = sample1(NULL, pl);
        bool argmax = !t->category;
        json_t *tk = json_object_get(t->result, "topk_prompt_logprobs");
        for (int i = 0; i < n && argmax; i++)
            argmax = json_integer_value(json_array_get(json_array_get(json_array_get(tk, np + i), 0), 0)) == x[np + i];
        CHECK(argmax && n > 0, "temperature 0 takes the argmax at each of %d steps", n);
        free_op(g);
        free_op(t);
    }

    /* ---- stop tokens, EOS ---- */
    {
        json_t *q = seq_of(a, 0);
        int32_t t[32];
        int n = ints(json_object_get(q, "tokens"), t, 32), k = 2;
        while (k < n && (t[k] == t[0] || t[k] == t[1] || t[k] == 2)) k++;
        if (k < n) {
            char pl[512];
            snprintf(pl, sizeof pl, "{\"prompt\": [1,17,33,90,4,250,7], \"num_samples\": 4, \"max_tokens\": 12,"
                                    " \"seed\": 123, \"stop_tokens\": [%d], \"source\": \"snapshot\"}", t[k]);
            exe_op *s = sample1("S:sample:0", pl);
            int32_t u[32];
            json_t *q2 = seq_of(s, 0);
            int n2 = ints(json_object_get(q2, "tokens"), u, 32);
            bool prefix = n2 <= k + 1 && !memcmp(u, t, n2 * sizeof *u);
            CHECK(prefix && u[n2 - 1] == t[k] && !strcmp(json_string_value(json_object_get(q2, "stop_reason")), "stop") &&
                      json_array_size(json_object_get(q2, "logprobs")) == (size_t)n2,
                  "stop token kept as the last token with its logprob, stop_reason stop (%d tokens)", n2);
            free_op(s);
        } else {
            CHECK(false, "no usable stop token in the sample");
        }
        /* EOS (id 2 in the tiny config) ends samples without being asked for */
        exe_op *e = sample1(NULL, "{\"prompt\": [1], \"num_samples\": 64, \"max_tokens\": 48, \"seed\": 11,"
                                  " \"source\": \"base\"}");
        int eos_end = 0, eos_inside = 0, length = 0;
        for (int s = 0; s < 64; s++) {
            json_t *q3 = seq_of(e, s);
            int32_t v[64];
            int n3 = ints(json_object_get(q3, "tokens"), v, 64);
            for (int i = 0; i + 1 < n3; i++) eos_inside += v[i] == 2;
            bool stop = !strcmp(json_string_value(json_object_get(q3, "stop_reason")), "stop");
            if (n3 && v[n3 - 1] == 2 && stop) eos_end++;
            if (!stop) length += n3 == 48;
        }
        CHECK(eos_end > 0 && eos_inside == 0, "EOS ends %d of 64 samples and never occurs inside one", eos_end);
        CHECK(eos_end + length == 64, "every other sample ran to max_tokens with stop_reason length");
        free_op(e);
    }

    /* ---- stop strings ---- */
    {
        exe_op *base = sample1(NULL, "{\"prompt\": [1,17,33], \"num_samples\": 8, \"max_tokens\": 24, \"seed\": 77,"
                                     " \"stop_tokens\": [], \"source\": \"base\"}");
        /* a stop string: the printable ASCII bytes of some token late in sample 0 */
        int32_t t[32];
        int n = ints(json_object_get(seq_of(base, 0), "tokens"), t, 32), k = -1;
        for (int i = n - 2; i >= 3 && k < 0; i--) {
            size_t l;
            const char *p = tok_token_to_piece(tok, t[i], &l);
            if (p && l >= 1 && p[0] > ' ' && p[0] < 127) k = i;
        }
        if (k >= 0) {
            size_t l;
            const char *p = tok_token_to_piece(tok, t[k], &l);
            char stop[8] = {p[0], 0};
            char pl[512];
            snprintf(pl, sizeof pl, "{\"prompt\": [1,17,33], \"num_samples\": 8, \"max_tokens\": 24, \"seed\": 77,"
                                    " \"stop_strings\": [\"%s%s\", \"never-occurs\"], \"source\": \"base\"}",
                     stop[0] == '"' || stop[0] == '\\' ? "\\" : "", stop);
            exe_op *s = sample1(NULL, pl);
            CHECK(!s->category, "stop strings: %s", s->error);
            bool all_ok = !s->category;
            int cut = 0;
            for (int j = 0; j < 8 && all_ok; j++) {
                int32_t full[32], got[32];
                int nf = ints(json_object_get(seq_of(base, j), "tokens"), full, 32);
                int ng = ints(json_object_get(seq_of(s, j), "tokens"), got, 32);
                /* expected: the first prefix whose text contains the stop string, else all (EOS aside) */
                int want = nf;
                for (int m = 1; m <= nf; m++) {
                    char *txt;
                    size_t tl;
                    tok_decode(tok, full, m, &txt, &tl);
                    bool hit = strstr(txt, stop) != NULL;
                    free(txt);
                    if (hit) { want = m; break; }
                }
                const char *why = json_string_value(json_object_get(seq_of(s, j), "stop_reason"));
                bool stopped_here = want < nf || (want == nf && strcmp(json_string_value(json_object_get(seq_of(base, j), "stop_reason")), "stop") == 0);
                all_ok = ng == want && !memcmp(got, full, ng * sizeof *got) && (!stopped_here || !strcmp(why, "stop"));
                cut += want < nf;
                if (!all_ok) printf("  sample %d: got %d tokens, want %d (of %d), %s\n", j, ng, want, nf, why);
            }
            CHECK(all_ok && cut > 0, "stop string \"%s\" cuts %d of 8 samples at the completing token", stop, cut);
            free_op(s);
        } else {
            CHECK(false, "no printable token for a stop string");
        }
        free_op(base);
    }

    /* ---- top_logprobs (the OpenAI routes'): per token the distribution's most likely
     * tokens, best first; the sampled one among them with its own logprob; the tokens
     * drawn are those of the same seed without them ---- */
    {
        static const char *params[] = {"\"temperature\": 1.0", "\"temperature\": 0.7, \"top_k\": 20, \"top_p\": 0.9",
                                       "\"temperature\": 0.0", "\"temperature\": 1.3, \"top_k\": 3"};
        for (int v = 0; v < 4; v++) {
            char pl[512], plain[512];
            snprintf(plain, sizeof plain, "{\"prompt\": [4, 9, 30], \"num_samples\": 3, \"max_tokens\": 10, \"seed\": 21, "
                     "%s, \"source\": \"base\"}", params[v]);
            snprintf(pl, sizeof pl, "{\"prompt\": [4, 9, 30], \"num_samples\": 3, \"max_tokens\": 10, \"seed\": 21, "
                     "%s, \"top_logprobs\": 5, \"source\": \"base\"}", params[v]);
            exe_op *t = sample1(NULL, pl), *u = sample1(NULL, plain);
            bool ok = !t->category && !u->category, found_all = true;
            for (int q = 0; q < 3 && ok; q++) {
                json_t *sq = seq_of(t, q), *tops = json_object_get(sq, "top_logprobs");
                json_t *toks = json_object_get(sq, "tokens"), *lps = json_object_get(sq, "logprobs");
                char *x = json_dumps(toks, JSON_COMPACT), *y = json_dumps(json_object_get(seq_of(u, q), "tokens"), JSON_COMPACT);
                ok = x && y && !strcmp(x, y) && json_array_size(tops) == json_array_size(toks);
                free(x);
                free(y);
                for (size_t i = 0; ok && i < json_array_size(toks); i++) {
                    json_t *row = json_array_get(tops, i);
                    int64_t tok = json_integer_value(json_array_get(toks, i));
                    double lp = json_real_value(json_array_get(lps, i)), prev = 1;
                    bool found = false;
                    ok = json_array_size(row) >= 1 && json_array_size(row) <= 5;
                    for (size_t k = 0; ok && k < json_array_size(row); k++) {
                        json_t *e = json_array_get(row, k);
                        double l = json_real_value(json_array_get(e, 1));
                        ok = l <= prev && l <= 0;
                        prev = l;
                        if (json_integer_value(json_array_get(e, 0)) == tok) found = true, ok = ok && fabs(l - lp) < 1e-6;
                    }
                    if (v == 3) ok = ok && json_array_size(row) <= 3;   /* top_k 3 leaves at most 3 */
                    if (v == 2) ok = ok && json_integer_value(json_array_get(json_array_get(row, 0), 0)) == tok;
                    found_all &= found;
                }
            }
            CHECK(ok, "top_logprobs (%s): sorted, the sampled token's equal, same tokens as without them", params[v]);
            if (v >= 2) CHECK(found_all, "top_logprobs (%s): the sampled token is always listed", params[v]);
            free_op(t);
            free_op(u);
        }
    }

    /* ---- failures ---- */
    {
        exe_op *f[5];
        f[0] = new_op("sample", NULL, "S:sample:404", "{\"prompt\": [1], \"source\": \"snapshot\"}");
        f[1] = new_op("sample", NULL, NULL, "{\"prompt\": [1, 256], \"source\": \"base\"}");
        f[2] = new_op("sample", NULL, NULL, "{\"prompt\": [1], \"source\": \"checkpoint\", \"blob_digest\": \"" \
                                            "0000000000000000000000000000000000000000000000000000000000000000\"}");
        f[3] = new_op("sample", NULL, NULL, "{\"prompt\": [], \"source\": \"base\"}");
        f[4] = new_op("sample", NULL, NULL, "{\"prompt\": [3, 4], \"max_tokens\": 0, \"prompt_logprobs\": true,"
                                            " \"source\": \"base\"}");
        exe_run_sample_batch(&st, f, 5);
        CHECK(f[0]->category && !strcmp(f[0]->category, "server") && strstr(f[0]->error, "no longer"),
              "unknown snapshot: server error: %s", f[0]->error);
        CHECK(f[1]->category && !strcmp(f[1]->category, "user"), "token outside the vocabulary: user error: %s", f[1]->error);
        CHECK(f[2]->category && !strcmp(f[2]->category, "server"), "checkpoint without a blob store: %s", f[2]->error);
        CHECK(f[3]->category && !strcmp(f[3]->category, "user"), "empty prompt: %s", f[3]->error);
        json_t *q = seq_of(f[4], 0);
        CHECK(!f[4]->category && json_array_size(json_object_get(q, "tokens")) == 0 &&
              !strcmp(json_string_value(json_object_get(q, "stop_reason")), "length") &&
              json_array_size(json_object_get(f[4]->result, "prompt_logprobs")) == 2,
              "max_tokens 0 (compute_logprobs style): empty sequence, prompt logprobs");
        for (int i = 0; i < 5; i++) free_op(f[i]);
    }

    /* ---- eviction: with room for the training slot and 64 snapshots, a 65th snapshot
     * evicts the least recently used ---- */
    {
        be_adapter *s0 = exe_store_get(&st.store, STORE_SNAPSHOT, "S:sample:0");
        CHECK(s0 && s0->device_bytes > 0 && ad->device_bytes > s0->device_bytes,
              "a snapshot holds weights only: %zu bytes, the training slot %zu", s0 ? s0->device_bytes : 0, ad->device_bytes);
        if (!s0) return 1;
        st.store.budget = ad->device_bytes + 64 * s0->device_bytes;
        for (int i = 1; i <= 64; i++) {
            char pl[128];
            snprintf(pl, sizeof pl, "{\"sampling_session_id\": \"S:sample:%d\"}", 100 + i);
            exe_op *x = new_op("save_weights_for_sampler", "m1", NULL, pl);
            exe_run_snapshot(&st, x);
            free_op(x);
        }
        exe_op *old = sample1("S:sample:0", "{\"prompt\": [1], \"max_tokens\": 2, \"source\": \"snapshot\"}");
        exe_op *recent = sample1("S:sample:164", "{\"prompt\": [1], \"max_tokens\": 2, \"source\": \"snapshot\"}");
        CHECK(old->category && !strcmp(old->category, "server"), "the 65th snapshot evicts the least recently used");
        CHECK(!recent->category, "recent snapshots stay: %s", recent->error);
        exe_store_stats ss;
        exe_store_get_stats(&st.store, &ss);
        CHECK(ss.count[STORE_SNAPSHOT] == 64 && ss.count[STORE_TRAINING] == 1 && ss.used <= ss.budget,
              "the store holds 64 snapshots and the training slot within its budget (%zu of %zu bytes)", ss.used,
              ss.budget);
        /* a training slot is never evicted */
        exe_op *c2 = new_op("create_model", "m2", NULL, "{}");
        exe_run_create(&st, c2);
        CHECK(!c2->category && exe_store_get(&st.store, STORE_TRAINING, "m1") && exe_store_get(&st.store, STORE_TRAINING, "m2"),
              "a new training slot takes its room from snapshots, never from another training slot");
        exe_store_drop(&st.store, STORE_TRAINING, "m2");
        CHECK(!exe_store_get(&st.store, STORE_TRAINING, "m2"), "a dropped slot is gone (unload_model)");
        free_op(c2);
        free_op(old);
        free_op(recent);
    }

    /* ---- forward_backward: a bad datum fails its own operation only ---- */
    {
        exe_op *fb[2];
        fb[0] = fb_op((int64_t[]){1, 2, 3}, 3, NULL, 0);
        fb[1] = fb_op((int64_t[]){1, 2}, 2, (int64_t[]){1, 256}, 2);   /* 256: outside the vocabulary */
        exe_run_fb_batch(&st, fb, 2, true);
        CHECK(!fb[0]->category && fb[0]->result_bin && json_object_get(fb[0]->result, "metrics"),
              "the good op ran: %s", fb[0]->error);
        CHECK(fb[1]->category && !strcmp(fb[1]->category, "user") && strstr(fb[1]->error, "data[1]") &&
                  strstr(fb[1]->error, "token id"), "the bad datum fails its op as the user's error: %s", fb[1]->error);
        free_op(fb[0]);
        free_op(fb[1]);
    }

    free_op(a);
    free_op(sn);
    free_op(cr);
    st.be->adapter_free(st.ctx, at_snap);
    exe_store_free(&st.store);
    if (st.tok) tok_free(st.tok);
    st.be->destroy(st.ctx);
    tok_free(tok);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) {}
    return check_summary();
}
