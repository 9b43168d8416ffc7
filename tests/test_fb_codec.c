/* test_fb_codec.c: the forward / forward_backward codec (contract/fb_payload.h,
 * contract/fb_result.h) against a real PostgreSQL:
 *  - payloads: what the api encodes the executor reads back exactly (ids, floats bit for
 *    bit, 2-D inputs, the loss with its config); cut or corrupted payload_bin is an error,
 *    never a crash or an allocation beyond its size;
 *  - results: fb_result_json writes, byte for byte, what clients got before migration 0028:
 *    the executor's jansson text of the result (reals at 9 digits) printed back by
 *    PostgreSQL as jsonb, for random outputs and for awkward numbers (negative zero,
 *    subnormals, huge, tiny, integral); cut result_bin is an error;
 *  - migration 0028: rows written in the old form (the old api's payload text, the old
 *    executor's result) come out as the codecs write them now, and the JSON answered
 *    from the converted result is the one stored before. */
#include "check.h"
#include "common/strbuf.h"
#include "contract/fb_payload.h"
#include "contract/fb_result.h"
#include "dbtest.h"
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIT(i) (1u << (i))

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static int rnd_int(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }

/* A float of the kinds that make printing hard: ordinary, integral, tiny, huge,
 * subnormal, zero of either sign. */
static float rnd_float(void) {
    switch (rnd() % 10) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return (float)rnd_int(-100000, 100000);
    case 3: return (float)((double)rnd_int(1, 1000) * 1e-42);               /* subnormal */
    case 4: return (float)((double)(rnd() % 1000000) * 1e25);               /* huge */
    case 5: return (float)((double)(rnd() % 1000000) * -1e-12);             /* tiny */
    case 6: {   /* any finite bit pattern */
        uint32_t u;
        float f;
        do {
            u = (uint32_t)rnd();
            memcpy(&f, &u, 4);
        } while (!isfinite(f));
        return f;
    }
    default: return (float)((double)(int64_t)(rnd() % 2000001 - 1000000) / 37.0);
    }
}

/* ---- payloads --------------------------------------------------------------------- */

/* A random request as the api would hold it after fb_validate. */
static void rnd_request(fb_request *r) {
    memset(r, 0, sizeof *r);
    r->loss = (loss_kind)rnd_int(0, LOSS_N - 1);
    if (r->loss == LOSS_PPO || r->loss == LOSS_CISPO) {
        r->config = calloc(2, sizeof *r->config);
        r->config[0] = (fb_kv){strdup("clip_low_threshold"), 0.5 + rnd_int(0, 9) / 40.0};
        r->config[1] = (fb_kv){strdup("unused_key"), 3.25};
        r->n_config = 2;
    }
    r->n_data = (size_t)rnd_int(1, 4);
    r->data = calloc(r->n_data, sizeof *r->data);
    for (size_t i = 0; i < r->n_data; i++) {
        fb_datum *d = &r->data[i];
        size_t n = (size_t)rnd_int(1, 40), k = r->loss == LOSS_CROSS_ENTROPY && rnd() % 2 ? (size_t)rnd_int(1, 4) : 1;
        d->n_tokens = n;
        d->tokens = calloc(n, sizeof *d->tokens);
        for (size_t t = 0; t < n; t++) d->tokens[t] = rnd_int(0, 151935);
        for (int in = 0; in < LOSS_N_INPUTS; in++) {
            bool take = in == LOSS_IN_TARGET_TOKENS || (r->loss == LOSS_CROSS_ENTROPY ? in == LOSS_IN_WEIGHTS && rnd() % 2
                                                                                      : in != LOSS_IN_WEIGHTS);
            if (!take) continue;
            bool per_target = in == LOSS_IN_TARGET_TOKENS || in == LOSS_IN_WEIGHTS;
            fb_tensor *t = &d->in[in];
            *t = (fb_tensor){.present = true, .n = n, .k = per_target ? k : 1, .dims = per_target && k > 1 ? 2 : 1};
            size_t m = n * t->k;
            if (in == LOSS_IN_TARGET_TOKENS) {
                t->i = calloc(m, sizeof *t->i);
                for (size_t q = 0; q < m; q++) t->i[q] = rnd_int(0, 151935);
            } else {
                t->f = calloc(m, sizeof *t->f);
                for (size_t q = 0; q < m; q++) t->f[q] = rnd_float();
            }
        }
    }
}

/* a (read back) has the bits of b (sent), negative zero read as zero. */
static bool same_bits(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float want = b[i] == 0.0f ? 0.0f : b[i];
        if (memcmp(&a[i], &want, 4)) return false;
    }
    return true;
}

/* Reads p back and compares it with r. */
static bool reads_back(const fb_request *r, const fb_payload *p) {
    fb_payload_reader rd;
    char err[256];
    loss_spec want = fb_request_loss(r);
    if (fb_payload_open(&rd, p->bin, p->bin_len, err, sizeof err) < 0) return printf("      %s\n", err), false;
    bool ok = rd.datums == r->n_data && rd.loss.kind == want.kind && rd.loss.clip_low == want.clip_low &&
              rd.loss.clip_high == want.clip_high && rd.loss.beta == want.beta;
    for (size_t i = 0; ok && i < r->n_data; i++) {
        const fb_datum *d = &r->data[i];
        fb_payload_datum g;
        if (fb_payload_next(&rd, &g, err, sizeof err) != 1) return printf("      datum %zu: %s\n", i, err), false;
        size_t k = d->in[LOSS_IN_TARGET_TOKENS].k;
        ok = g.n == d->n_tokens && g.k == k;
        for (size_t t = 0; ok && t < g.n; t++) ok = g.tokens[t] == d->tokens[t];
        for (int in = 0; ok && in < LOSS_N_INPUTS; in++) {
            ok = g.has[in] == d->in[in].present;
            if (!ok || !g.has[in]) continue;
            size_t m = g.n * (in <= LOSS_IN_WEIGHTS ? k : 1);
            if (in == LOSS_IN_TARGET_TOKENS)
                for (size_t q = 0; ok && q < m; q++) ok = g.targets[q] == d->in[in].i[q];
            else
                ok = same_bits(g.f[in], d->in[in].f, m);
        }
        fb_payload_datum_free(&g);
    }
    fb_payload_datum g;
    return ok && fb_payload_next(&rd, &g, err, sizeof err) == 0;
}

/* Every datum of bin read; 1: the whole payload read, -1: an error on the way. */
static int read_all(const uint8_t *bin, size_t len) {
    fb_payload_reader rd;
    char err[256];
    if (fb_payload_open(&rd, bin, len, err, sizeof err) < 0) return -1;
    for (;;) {
        fb_payload_datum d;
        int rc = fb_payload_next(&rd, &d, err, sizeof err);
        if (rc <= 0) return rc == 0 ? 1 : -1;
        fb_payload_datum_free(&d);
    }
}

static void test_payloads(void) {
    int round_trips = 0, cuts_refused = 0, cuts = 0;
    for (int it = 0; it < 300; it++) {
        fb_request r;
        rnd_request(&r);
        fb_payload p;
        fb_payload_encode(&r, &p);
        round_trips += reads_back(&r, &p);
        if (it < 20)
            for (size_t len = 0; len < p.bin_len; len++, cuts++) cuts_refused += read_all(p.bin, len) < 0;
        fb_payload_free(&p);
        fb_request_free(&r);
    }
    CHECK(round_trips == 300, "300 random payloads read back exactly (ids, float bits but the sign of zero, 2-D, the "
          "loss): %d", round_trips);
    CHECK(cuts_refused == cuts, "every cut payload_bin is refused: %d of %d", cuts_refused, cuts);

    fb_request r;
    rnd_request(&r);
    fb_payload p;
    fb_payload_encode(&r, &p);
    uint8_t *bad = malloc(p.bin_len + 4);
    memcpy(bad, p.bin, p.bin_len);
    memset(bad + FB_PAYLOAD_DATA_AT, 0xff, 4);   /* the first datum claims 2^32 - 1 tokens */
    CHECK(read_all(bad, p.bin_len) < 0, "a datum larger than its payload is refused before memory is taken");
    memcpy(bad, p.bin, p.bin_len);
    memcpy(bad + p.bin_len, "junk", 4);
    CHECK(read_all(bad, p.bin_len + 4) < 0, "bytes after the last datum are refused");
    memcpy(bad, "LFB0", 4);
    CHECK(read_all(bad, p.bin_len) < 0, "another format (magic) is refused");
    memcpy(bad, p.bin, p.bin_len);
    bad[4] = LOSS_N;
    CHECK(read_all(bad, p.bin_len) < 0, "an unknown loss is refused");
    free(bad);
    CHECK(read_all(NULL, 0) < 0, "no payload_bin is refused");
    json_t *h = json_loads(p.header, 0, NULL);
    CHECK(h && !strcmp(json_string_value(json_object_get(h, "loss_fn")), loss_kind_name(r.loss)) &&
              json_integer_value(json_object_get(h, "datums")) == (json_int_t)r.n_data &&
              json_is_object(json_object_get(h, "loss_fn_config")),
          "the header names the loss, its config and the datums: %s", p.header);
    json_decref(h);
    fb_payload_free(&p);
    fb_request_free(&r);
}

/* ---- results ---------------------------------------------------------------------- */

typedef struct {
    fb_metric m[6];
    size_t nm;
    fb_output out[4];
    size_t nd;
    float *buf[8];
} rnd_result;

static void rnd_outputs(rnd_result *x) {
    memset(x, 0, sizeof *x);
    static const char *moe[] = {"e_frac_with_tokens:mean", "e_frac_oversubscribed:mean", "e_max_violation:mean",
                                "e_max_violation:max", "e_min_violation:mean"};
    double sum = 0;
    x->nd = (size_t)rnd_int(1, 4);
    for (size_t d = 0; d < x->nd; d++) {
        size_t n = (size_t)rnd_int(1, 30), k = rnd() % 3 == 0 ? (size_t)rnd_int(2, 4) : 1;
        float *lp = malloc(n * k * sizeof *lp), *loss = malloc(n * sizeof *loss);
        for (size_t i = 0; i < n * k; i++) lp[i] = rnd_float();
        for (size_t i = 0; i < n; i++) sum += loss[i] = rnd_float();
        x->buf[2 * d] = lp;
        x->buf[2 * d + 1] = loss;
        x->out[d] = (fb_output){.n = n, .k = k, .logprobs = lp, .loss = loss};
    }
    x->m[x->nm++] = (fb_metric){"loss:sum", sum};
    if (rnd() % 2)
        for (int i = 0; i < 5; i++) x->m[x->nm++] = (fb_metric){.value = (double)rnd_float() / 7.0};
    for (size_t i = 1; i < x->nm; i++) snprintf(x->m[i].key, sizeof x->m[i].key, "%s", moe[i - 1]);
}

static void free_outputs(rnd_result *x) {
    for (int i = 0; i < 8; i++) free(x->buf[i]);
}

/* The result JSON as the executor wrote it before migration 0028 (jansson, reals at 9
 * digits), to be printed back by PostgreSQL. */
static char *old_result_text(const rnd_result *x) {
    json_t *outs = json_array();
    for (size_t d = 0; d < x->nd; d++) {
        const fb_output *o = &x->out[d];
        json_t *lp = json_array(), *el = json_array();
        for (size_t i = 0; i < o->n * o->k; i++) json_array_append_new(lp, json_real(o->logprobs[i]));
        for (size_t i = 0; i < o->n; i++) json_array_append_new(el, json_real(o->loss[i]));
        json_t *lpt = o->k > 1 ? json_pack("{s:o, s:s, s:[i, i]}", "data", lp, "dtype", "float32", "shape", (int)o->n,
                                           (int)o->k)
                               : json_pack("{s:o, s:s, s:[i]}", "data", lp, "dtype", "float32", "shape", (int)o->n);
        json_array_append_new(outs, json_pack("{s:o, s:{s:o, s:s, s:[i]}}", "logprobs", lpt, "elementwise_loss", "data",
                                              el, "dtype", "float32", "shape", (int)o->n));
    }
    json_t *metrics = json_object();
    for (size_t i = 0; i < x->nm; i++) json_object_set_new(metrics, x->m[i].key, json_real(x->m[i].value));
    json_t *r = json_pack("{s:s, s:o, s:o}", "loss_fn_output_type", "ArrayRecord", "loss_fn_outputs", outs, "metrics",
                          metrics);
    char *text = json_dumps(r, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(r);
    return text;
}

/* PostgreSQL's jsonb print of a JSON text (malloc'd). */
static char *jsonb_text(const char *json) {
    char err[512];
    const char *p[1] = {json};
    PGresult *r = db_query(C, "SELECT $1::jsonb::text", 1, p, err, sizeof err);
    if (!r) dbt_die("jsonb", err);
    char *t = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return t;
}

static char *new_result_text(const rnd_result *x) {
    size_t len;
    uint8_t *bin = fb_result_encode(x->m, x->nm, x->out, x->nd, &len);
    fb_result_view v;
    char err[256];
    char *json = bin && fb_result_open(&v, bin, len, err, sizeof err) == 0 ? fb_result_json(&v, &len) : NULL;
    fb_result_close(&v);
    free(bin);
    return json;
}

static void test_results(void) {
    int same = 0;
    for (int it = 0; it < 300; it++) {
        rnd_result x;
        rnd_outputs(&x);
        char *old = old_result_text(&x), *want = jsonb_text(old), *got = new_result_text(&x);
        if (got && !strcmp(got, want)) same++;
        else if (same == it) printf("      want %.300s\n      got  %.300s\n", want, got ? got : "(null)");
        free(old);
        free(want);
        free(got);
        free_outputs(&x);
    }
    CHECK(same == 300, "300 random results: the JSON answered is PostgreSQL's print of the old stored text, byte for "
          "byte: %d", same);

    /* numbers alone, doubles too (metrics): every decade and sign, halves, integers */
    int n = 0, agree = 0;
    for (int e = -320; e <= 308; e++) {
        double vs[] = {pow(10, e), -pow(10, e) * 1.5, pow(10, e) * 1.23456789012, 3.0 * pow(10, e) / 7.0};
        for (int i = 0; i < 4; i++) {
            if (!isfinite(vs[i])) continue;
            json_t *a = json_pack("[f]", vs[i]);
            char *t = json_dumps(a, JSON_COMPACT | JSON_REAL_PRECISION(9)), *want = jsonb_text(t), got[FB_JSON_REAL_MAX];
            fb_json_real(got, sizeof got, vs[i]);
            n++;
            size_t gl = strlen(got);
            if (strlen(want) == gl + 2 && !strncmp(want + 1, got, gl)) agree++;
            else if (agree + 1 == n) printf("      %.17g: want %s got [%s]\n", vs[i], want, got);
            free(t);
            free(want);
            json_decref(a);
        }
    }
    CHECK(agree == n, "fb_json_real prints %d doubles from 1e-320 to 1e308 as jsonb prints jansson's text of them: %d",
          n, agree);

    rnd_result x;
    rnd_outputs(&x);
    size_t len, refused = 0;
    uint8_t *bin = fb_result_encode(x.m, x.nm, x.out, x.nd, &len);
    for (size_t cut = 0; cut < len; cut++) {
        fb_result_view v;
        char err[256];
        refused += fb_result_open(&v, bin, cut, err, sizeof err) < 0;
        fb_result_close(&v);
    }
    CHECK(refused == len, "every cut result_bin is refused: %zu of %zu", refused, len);
    float nan_out[1] = {NAN};
    fb_output bad = {.n = 1, .k = 1, .logprobs = nan_out, .loss = nan_out};
    uint8_t *b2 = fb_result_encode(x.m, x.nm, &bad, 1, &len);
    CHECK(!b2, "a result that is not finite is not encoded (the op then fails)");
    fb_metric twice[2] = {{"loss:sum", 1}, {"loss:sum", 2}};
    b2 = fb_result_encode(twice, 2, x.out, x.nd, &len);
    CHECK(!b2, "a metric named twice is not encoded");
    free(bin);
    free_outputs(&x);
}

/* ---- migration 0028 --------------------------------------------------------------- */

/* The payload as the api wrote it before migration 0028 (fwdbwd.c's fb_payload_json). */
static char *old_payload_text(const fb_request *r) {
    strbuf b;
    sb_init(&b, 1024);
    sb_puts(&b, "{\"loss_fn\": ");
    sb_json_str(&b, loss_kind_name(r->loss));
    sb_puts(&b, ", \"loss_fn_config\": {");
    bool first = true;
    for (size_t i = 0; i < r->n_config; i++) {
        sb_puts(&b, first ? "" : ", ");
        first = false;
        sb_json_str(&b, r->config[i].key);
        sb_puts(&b, ": ");
        sb_double(&b, r->config[i].value);
    }
    loss_spec defaults = loss_spec_default(r->loss);
    for (int k = 0; k < LOSS_CONFIG_KEYS; k++) {
        bool given = false;
        for (size_t i = 0; i < r->n_config; i++) given |= !strcmp(r->config[i].key, loss_config_keys[k]);
        if (!loss_config_used(r->loss, k) || given) continue;
        sb_puts(&b, first ? "" : ", ");
        first = false;
        sb_json_str(&b, loss_config_keys[k]);
        sb_puts(&b, ": ");
        sb_double(&b, loss_config_get(&defaults, k));
    }
    sb_puts(&b, "}, \"data\": [");
    for (size_t i = 0; i < r->n_data; i++) {
        const fb_datum *d = &r->data[i];
        sb_puts(&b, i ? ", {\"tokens\": [" : "{\"tokens\": [");
        for (size_t t = 0; t < d->n_tokens; t++) sb_printf(&b, "%s%lld", t ? "," : "", (long long)d->tokens[t]);
        sb_putc(&b, ']');
        if (d->in[LOSS_IN_TARGET_TOKENS].k > 1) sb_printf(&b, ", \"k\": %zu", d->in[LOSS_IN_TARGET_TOKENS].k);
        for (int k = 0; k < LOSS_N_INPUTS; k++) {
            const fb_tensor *t = &d->in[k];
            if (!t->present) continue;
            sb_printf(&b, ", \"%s\": [", loss_input_names[k]);
            for (size_t q = 0; q < t->n * t->k; q++) {
                if (q) sb_putc(&b, ',');
                if (t->i) sb_int(&b, t->i[q]);
                else sb_float(&b, t->f[q]);
            }
            sb_putc(&b, ']');
        }
        sb_putc(&b, '}');
    }
    sb_puts(&b, "]}");
    return sb_steal(&b, NULL);
}

static bool cell_is_text(const char *t, const uint8_t *want, size_t len);

/* Whether the bytea of a query's one cell is the bytes of ours. */
static bool cell_is(const char *q, const uint8_t *want, size_t len) {
    char err[512];
    PGresult *r = db_query(C, q, 0, NULL, err, sizeof err);
    if (!r) dbt_die(q, err);
    bool same = PQntuples(r) == 1 && cell_is_text(PQgetvalue(r, 0, 0), want, len);
    PQclear(r);
    return same;
}

static bool cell_is_text(const char *t, const uint8_t *want, size_t len) {
    if (strncmp(t, "\\x", 2) || strlen(t) != 2 + 2 * len) return false;
    for (size_t i = 0; i < len; i++) {
        unsigned v;
        if (sscanf(t + 2 + 2 * i, "%2x", &v) != 1 || v != want[i]) return false;
    }
    return true;
}

static void test_migration(void) {
    sql("INSERT INTO tenants (name) VALUES ('a')");
    sql("INSERT INTO base_models (name, path, arch, max_context, vocab_size, config)"
        " VALUES ('m', '/x', 'LlamaForCausalLM', 128, 151936, '{}')");
    sql("INSERT INTO sessions (id, tenant_id) VALUES ('s', 1)");
    sql("INSERT INTO models (id, tenant_id, session_id, model_seq_id, base_model, lora_rank, lora_seed, train_attn,"
        " train_mlp, train_unembed) VALUES ('s:train:0', 1, 's', 0, 'm', 8, 1, true, true, true)");
    enum { N = 40 };
    static fb_request reqs[N];
    static rnd_result outs[N];
    static char *stored[N];
    for (int i = 0; i < N; i++) {
        rnd_request(&reqs[i]);
        rnd_outputs(&outs[i]);
        char *pl = old_payload_text(&reqs[i]), *res = old_result_text(&outs[i]), rid[16], seq[16];
        snprintf(rid, sizeof rid, "r%d", i);
        snprintf(seq, sizeof seq, "%d", i + 1);
        const char *p[5] = {rid, seq, i % 2 ? "forward" : "forward_backward", pl, res};
        char err[512];
        if (db_exec(C, "INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, state, result)"
                       " VALUES ($1, 1, 's:train:0', $2::int, $3, $4::jsonb, 'done', $5::jsonb)", 5, p, err,
                    sizeof err) < 0)
            dbt_die("legacy row", err);
        const char *pr[1] = {rid};
        PGresult *r = db_query(C, "SELECT result::text FROM operations WHERE request_id = $1", 1, pr, err, sizeof err);
        if (!r) dbt_die("stored result", err);
        stored[i] = strdup(PQgetvalue(r, 0, 0));
        PQclear(r);
        free(pl);
        free(res);
    }
    sql("INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, state, error)"
        " VALUES ('rejected', 1, 's:train:0', 100, 'forward_backward', '{\"rejected\": 400}', 'failed', 'no')");
    char err[512];
    if (migrate_run(C, err, sizeof err) < 0) dbt_die("migrate", err);

    int payloads = 0, headers = 0, results = 0, answers = 0;
    for (int i = 0; i < N; i++) {
        fb_payload p;
        fb_payload_encode(&reqs[i], &p);
        char q[256];
        snprintf(q, sizeof q, "SELECT payload_bin FROM operations WHERE request_id = 'r%d'", i);
        payloads += cell_is(q, p.bin, p.bin_len);
        char *hq = malloc(p.header_len + 128);
        sprintf(hq, "SELECT payload = '%s'::jsonb FROM operations WHERE request_id = 'r%d'", p.header, i);
        headers += !strcmp(text(hq), "t");
        free(hq);
        size_t len;
        uint8_t *bin = fb_result_encode(outs[i].m, outs[i].nm, outs[i].out, outs[i].nd, &len);
        snprintf(q, sizeof q, "SELECT result_bin FROM operations WHERE request_id = 'r%d'", i);
        results += cell_is(q, bin, len);
        char *got = new_result_text(&outs[i]);
        answers += got && !strcmp(got, stored[i]);
        free(got);
        free(bin);
        fb_payload_free(&p);
        fb_request_free(&reqs[i]);
        free_outputs(&outs[i]);
        free(stored[i]);
    }
    CHECK(payloads == N, "0028 packs old payloads as the api packs them now: %d of %d", payloads, N);
    CHECK(headers == N, "0028 leaves the header the api writes now: %d of %d", headers, N);
    CHECK(results == N, "0028 packs old results as the executor packs them now: %d of %d", results, N);
    CHECK(answers == N, "the JSON answered from a converted result is the one stored before: %d of %d", answers, N);
    CHECK(scalar("SELECT count(*) FROM operations WHERE request_id LIKE 'r%' AND result ? 'loss_fn_outputs'") == 0 &&
              scalar("SELECT count(*) FROM operations WHERE request_id LIKE 'r%' AND metrics ? 'loss:sum'") == N,
          "results keep their metrics (operations.metrics), not their outputs");
    CHECK(!strcmp(text("SELECT payload::text || (payload_bin IS NULL)::text FROM operations WHERE request_id = 'rejected'"),
                  "{\"rejected\": 400}true"),
          "a refused submit's row is left as it was");
}

int main(void) {
    dbt_start_upto("fbcodec", 27);
    test_payloads();
    test_results();
    test_migration();
    dbt_stop();
    return check_summary();
}
