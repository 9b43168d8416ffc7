/* sample_payload.c: the sample payload codec (sample_payload.h): the api's writer and the
 * executor's reader of one JSON format. */
#include "contract/sample_payload.h"
#include "common/err.h"
#include "common/strbuf.h"
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- writing ---------------------------------------------------------------------- */

static void put_ints(strbuf *b, const int64_t *v, size_t n) {
    sb_putc(b, '[');
    for (size_t k = 0; k < n; k++) {
        if (k) sb_putc(b, ',');
        sb_int(b, v[k]);
    }
    sb_putc(b, ']');
}

char *sample_payload_encode(const sample_payload *p, size_t *len) {
    strbuf b;
    sb_init(&b, 256 + 8 * p->n_prompt + 8 * p->n_target_ids);
    sb_puts(&b, "{\"prompt\": ");
    put_ints(&b, p->prompt, p->n_prompt);
    sb_printf(&b, ", \"num_samples\": %lld, \"max_tokens\": %lld, \"temperature\": ", (long long)p->num_samples,
              (long long)p->max_tokens);
    sb_real(&b, p->temperature);
    sb_printf(&b, ", \"top_k\": %lld, \"top_p\": ", (long long)p->top_k);
    sb_real(&b, p->top_p);
    sb_printf(&b, ", \"seed\": %lld", (long long)p->seed);
    if (p->stop_tokens) {
        sb_puts(&b, ", \"stop_tokens\": ");
        put_ints(&b, p->stop_tokens, p->n_stop_tokens);
    }
    if (p->stop_strings) {
        sb_puts(&b, ", \"stop_strings\": [");
        for (size_t k = 0; k < p->n_stop_strings; k++) {
            if (k) sb_puts(&b, ", ");
            sb_json_str(&b, p->stop_strings[k]);
        }
        sb_putc(&b, ']');
    }
    sb_printf(&b, ", \"prompt_logprobs\": %s, \"topk_prompt_logprobs\": %lld", p->prompt_logprobs ? "true" : "false",
              (long long)p->topk_prompt_logprobs);
    if (p->source) {
        sb_puts(&b, ", \"source\": ");
        sb_json_str(&b, p->source);
    }
    if (p->topk_sample_logprobs > 0)
        sb_printf(&b, ", \"topk_sample_logprobs\": %lld", (long long)p->topk_sample_logprobs);
    if (p->prompt_logprobs_last_n > 0)
        sb_printf(&b, ", \"prompt_logprobs_last_n\": %lld", (long long)p->prompt_logprobs_last_n);
    if (p->prompt_alt_tokens_k > 0)
        sb_printf(&b, ", \"prompt_alt_tokens_k\": %lld", (long long)p->prompt_alt_tokens_k);
    if (p->has_target) {
        sb_printf(&b, ", \"target_prompt_logprobs\": {\"shape\": [%lld, %lld], \"data\": ", (long long)p->target_rows,
                  (long long)p->target_cols);
        put_ints(&b, p->target_ids, p->n_target_ids);
        if (p->target_crow) {
            sb_puts(&b, ", \"crow\": ");
            put_ints(&b, p->target_crow, (size_t)p->target_rows + 1);
            sb_puts(&b, ", \"col\": ");
            put_ints(&b, p->target_col, p->n_target_ids);
        }
        sb_putc(&b, '}');
    }
    if (p->blob_digest) {
        sb_puts(&b, ", \"blob_digest\": ");
        sb_json_str(&b, p->blob_digest);
    }
    if (p->progress) sb_printf(&b, ", \"progress\": true, \"top_logprobs\": %lld", (long long)p->top_logprobs);
    sb_putc(&b, '}');
    return sb_steal(&b, len);
}

/* ---- reading ---------------------------------------------------------------------- */

void sample_payload_free(sample_payload *p) {
    free(p->prompt);
    free(p->stop_tokens);
    free(p->stop_strings);
    free(p->target_ids);
    free(p->target_crow);
    free(p->target_col);
    memset(p, 0, sizeof *p);
}

/* An int list of at most cap entries in [lo, hi] as int64 (malloc'd, *n entries). */
static bool get_ints(const json_t *v, size_t cap, long long lo, long long hi, int64_t **out, size_t *n) {
    *out = NULL;
    *n = json_array_size(v);
    if (!json_is_array(v) || *n > cap || !(*out = malloc((*n ? *n : 1) * sizeof **out))) return false;
    for (size_t i = 0; i < *n; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < lo || json_integer_value(e) > hi) return false;
        (*out)[i] = json_integer_value(e);
    }
    return true;
}

static bool get_int(const json_t *p, const char *key, long long lo, long long hi, long long dflt, int64_t *out) {
    const json_t *v = json_object_get(p, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return true;
    }
    if (!json_is_integer(v)) return false;
    *out = json_integer_value(v);
    return *out >= lo && *out <= hi;
}

static bool get_real(const json_t *p, const char *key, double dflt, double *out) {
    const json_t *v = json_object_get(p, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return true;
    }
    if (!json_is_number(v)) return false;
    *out = json_number_value(v);
    return isfinite(*out);
}

/* target_prompt_logprobs: shape [len(prompt) - 1, K], ids in [-1, vocab), dense (rows x K
 * cells) or a well-formed CSR. */
static bool get_target(const json_t *t, sample_payload *p, int64_t vocab) {
    const json_t *shape = json_object_get(t, "shape");
    long long R = json_integer_value(json_array_get(shape, 0)), K = json_integer_value(json_array_get(shape, 1));
    p->has_target = true;
    p->target_rows = R;
    p->target_cols = K;
    bool sparse = json_object_get(t, "crow") != NULL;
    if (R != (long long)p->n_prompt - 1 || K < 1 || K > LIMIT_TARGET_PROMPT_K ||
        !get_ints(json_object_get(t, "data"), LIMIT_TARGET_PROMPT_CELLS, -1, vocab - 1, &p->target_ids,
                  &p->n_target_ids))
        return false;
    if (!sparse) return p->n_target_ids == (size_t)(R * K);
    size_t nc, nl, n = p->n_target_ids;
    bool ok = get_ints(json_object_get(t, "crow"), (size_t)R + 1, 0, (long long)n, &p->target_crow, &nc) &&
              nc == (size_t)R + 1 && get_ints(json_object_get(t, "col"), n, 0, K - 1, &p->target_col, &nl) && nl == n &&
              p->target_crow[0] == 0 && p->target_crow[R] == (int64_t)n;
    for (long long r = 0; ok && r < R; r++) ok = p->target_crow[r] <= p->target_crow[r + 1];
    return ok;
}

int sample_payload_decode(const json_t *j, int64_t vocab_size, int64_t max_context, sample_payload *p, char *err,
                          size_t errlen) {
    memset(p, 0, sizeof *p);
    const json_t *prompt = json_object_get(j, "prompt");
    size_t np = json_array_size(prompt);
    if (!json_is_array(prompt) || np < 1) {
        err_set(err, errlen, "the prompt is empty");
        return -1;
    }
    if ((int64_t)np > max_context) {
        err_set(err, errlen, "the prompt has %zu tokens, more than the model's context of %lld", np,
                (long long)max_context);
        return -1;
    }
    p->prompt = malloc(np * sizeof *p->prompt);
    if (!p->prompt) abort();
    p->n_prompt = np;
    for (size_t i = 0; i < np; i++) {
        const json_t *v = json_array_get(prompt, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab_size) {
            err_set(err, errlen, "prompt token %zu is not a token id in [0, %lld)", i, (long long)vocab_size);
            return -1;
        }
        p->prompt[i] = json_integer_value(v);
    }
    const json_t *mt = json_object_get(j, "max_tokens");
    p->has_max_tokens = mt && !json_is_null(mt);
    if (!get_int(j, "num_samples", 1, LIMIT_NUM_SAMPLES, 1, &p->num_samples) ||
        !get_int(j, "max_tokens", 0, 1 << 24, 0, &p->max_tokens) ||
        !get_int(j, "top_k", LLONG_MIN, LLONG_MAX, -1, &p->top_k) ||
        !get_int(j, "topk_prompt_logprobs", 0, LIMIT_TOPK_PROMPT_LOGPROBS, 0, &p->topk_prompt_logprobs) ||
        !get_int(j, "seed", LLONG_MIN, LLONG_MAX, 0, &p->seed) || !get_real(j, "temperature", 1.0, &p->temperature) ||
        !get_int(j, "top_logprobs", 0, LIMIT_TOPK_PROMPT_LOGPROBS, 0, &p->top_logprobs) ||
        !get_int(j, "topk_sample_logprobs", 0, LIMIT_TOPK_PROMPT_LOGPROBS, 0, &p->topk_sample_logprobs) ||
        !get_int(j, "prompt_logprobs_last_n", 0, INT_MAX, 0, &p->prompt_logprobs_last_n) ||
        !get_int(j, "prompt_alt_tokens_k", 0, LIMIT_TOPK_PROMPT_LOGPROBS, 0, &p->prompt_alt_tokens_k) ||
        !get_real(j, "top_p", 1.0, &p->top_p)) {
        err_set(err, errlen, "bad sampling parameters (num_samples, max_tokens, top_k, seed, temperature, top_p, "
                "topk_prompt_logprobs, topk_sample_logprobs, prompt_logprobs_last_n or prompt_alt_tokens_k)");
        return -1;
    }
    if (p->temperature < 0 || !(p->top_p > 0 && p->top_p <= 1)) {
        err_set(err, errlen, "temperature must be >= 0 and top_p in (0, 1]");
        return -1;
    }
    p->prompt_logprobs = json_is_true(json_object_get(j, "prompt_logprobs"));
    p->progress = json_is_true(json_object_get(j, "progress"));
    const json_t *target = json_object_get(j, "target_prompt_logprobs");
    if (target && !json_is_null(target) && !get_target(target, p, vocab_size)) {
        err_set(err, errlen, "bad target_prompt_logprobs: shape [len(prompt) - 1, K], token ids or -1, and a "
                "well-formed CSR are needed");
        return -1;
    }
    const json_t *stops = json_object_get(j, "stop_tokens");
    if (json_is_array(stops)) {
        p->n_stop_tokens = json_array_size(stops);
        p->stop_tokens = malloc((p->n_stop_tokens ? p->n_stop_tokens : 1) * sizeof *p->stop_tokens);
        if (!p->stop_tokens) abort();
        for (size_t i = 0; i < p->n_stop_tokens; i++) {
            const json_t *v = json_array_get(stops, i);
            if (!json_is_integer(v)) {
                err_set(err, errlen, "stop tokens must be token ids");
                return -1;
            }
            p->stop_tokens[i] = json_integer_value(v);
        }
    }
    const json_t *strs = json_object_get(j, "stop_strings");
    if (json_array_size(strs) > 0) {
        p->n_stop_strings = json_array_size(strs);
        p->stop_strings = calloc(p->n_stop_strings, sizeof *p->stop_strings);
        if (!p->stop_strings) abort();
        for (size_t i = 0; i < p->n_stop_strings; i++) {
            const json_t *v = json_array_get(strs, i);
            if (!json_is_string(v)) {
                err_set(err, errlen, "stop strings must be strings");
                return -1;
            }
            p->stop_strings[i] = json_string_value(v);
        }
    }
    p->source = json_string_value(json_object_get(j, "source"));
    p->blob_digest = json_string_value(json_object_get(j, "blob_digest"));
    return 0;
}
