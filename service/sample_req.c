/* sample_req.c: asample requests: decoding, validation, payload (see sample_req.h).
 * Messages name the field (sampling_params.top_p, prompt.chunks[0].tokens[3]) so a
 * user can fix the call. */
#include "service/sample_req.h"
#include "common/strbuf.h"
#include "service/api_json.h"
#include "service/fwdbwd.h"
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) abort();
    return p;
}

/* sampling_params.stop: null, one string, a list of strings, or a list of token ids. */
static int decode_stop(const json_t *sp, sample_req *r, char *err, size_t errlen) {
    const json_t *stop = json_object_get(sp, "stop");
    if (!stop || json_is_null(stop)) return 0;
    if (json_is_string(stop)) {
        r->stop_strings = xcalloc(1, sizeof *r->stop_strings);
        r->stop_strings[r->n_stop_strings++] = json_string_value(stop);
    } else if (json_is_array(stop)) {
        size_t n = json_array_size(stop), n_str = 0, n_int = 0;
        if (n > SAMPLE_MAX_STOP) {
            snprintf(err, errlen, "sampling_params.stop has %zu entries; at most %d are accepted",
                     n, SAMPLE_MAX_STOP);
            return -1;
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_array_get(stop, i);
            int64_t v;
            if (json_is_string(e)) n_str++;
            else if (jx_as_int(e, &v)) n_int++;
            else {
                snprintf(err, errlen, "sampling_params.stop[%zu]: expected a string or an integer "
                                      "token id, got %s", i, jx_type_name(e));
                return -1;
            }
        }
        if (n_str && n_int) {
            snprintf(err, errlen, "sampling_params.stop mixes strings and token ids; send either "
                                  "a list of strings or a list of token ids");
            return -1;
        }
        if (n_str) r->stop_strings = xcalloc(n, sizeof *r->stop_strings);
        if (n_int) r->stop_tokens = xcalloc(n, sizeof *r->stop_tokens);
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_array_get(stop, i);
            if (n_str) r->stop_strings[r->n_stop_strings++] = json_string_value(e);
            else jx_as_int(e, &r->stop_tokens[r->n_stop_tokens++]);
        }
    } else {
        snprintf(err, errlen, "sampling_params.stop: expected a string, a list of strings or a "
                              "list of token ids, got %s", jx_type_name(stop));
        return -1;
    }
    for (size_t i = 0; i < r->n_stop_strings; i++) {
        const json_t *e = json_is_string(stop) ? stop : json_array_get(stop, i);
        if (json_string_length(e) == 0 || json_string_length(e) > SAMPLE_MAX_STOP_LEN) {
            snprintf(err, errlen, "sampling_params.stop: stop strings must be non-empty and at "
                                  "most %d bytes long", SAMPLE_MAX_STOP_LEN);
            return -1;
        }
    }
    return 0;
}

int sample_decode_json(const json_t *b, sample_req *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    if (jx_str(b, "", "sampling_session_id", &r->sampling_session_id, err, errlen) < 0) return -1;
    if (!r->sampling_session_id || !*r->sampling_session_id) {
        const json_t *bm = json_object_get(b, "base_model"), *mp = json_object_get(b, "model_path");
        if ((bm && !json_is_null(bm)) || (mp && !json_is_null(mp)))
            snprintf(err, errlen, "sampling directly from base_model or model_path is not "
                                  "supported: create a sampling session first (POST "
                                  "/api/v1/create_sampling_session with base_model or model_path) "
                                  "and send its sampling_session_id");
        else
            snprintf(err, errlen, "sampling_session_id is required (create one with POST "
                                  "/api/v1/create_sampling_session)");
        return -1;
    }
    json_t *prompt, *sp;
    if (jx_int(b, "", "seq_id", 0, &r->seq_id, &r->has_seq_id, err, errlen) < 0 ||
        jx_int(b, "", "num_samples", 1, &r->num_samples, NULL, err, errlen) < 0 ||
        jx_obj(b, "", "prompt", &prompt, err, errlen) < 0 ||
        jx_obj(b, "", "sampling_params", &sp, err, errlen) < 0 ||
        jx_bool(b, "", "prompt_logprobs", false, &r->prompt_logprobs, err, errlen) < 0 ||
        jx_int(b, "", "topk_prompt_logprobs", 0, &r->topk_prompt_logprobs, NULL, err, errlen) < 0)
        return -1;
    if (r->has_seq_id && r->seq_id < 0) {
        snprintf(err, errlen, "seq_id must be >= 0, got %lld", (long long)r->seq_id);
        return -1;
    }
    if (r->num_samples < 1 || r->num_samples > LIMIT_NUM_SAMPLES) {
        snprintf(err, errlen, "num_samples must be between 1 and %d, got %lld",
                 LIMIT_NUM_SAMPLES, (long long)r->num_samples);
        return -1;
    }
    if (r->topk_prompt_logprobs < 0 || r->topk_prompt_logprobs > LIMIT_TOPK_PROMPT_LOGPROBS) {
        snprintf(err, errlen, "topk_prompt_logprobs must be between 0 and %d, got %lld",
                 LIMIT_TOPK_PROMPT_LOGPROBS, (long long)r->topk_prompt_logprobs);
        return -1;
    }
    if (!prompt) {
        snprintf(err, errlen, "prompt is required (a ModelInput {\"chunks\": [{\"type\": "
                              "\"encoded_text\", \"tokens\": [...]}]})");
        return -1;
    }
    if (fb_decode_model_input(prompt, "prompt", &r->prompt, &r->n_prompt, err, errlen) < 0)
        return -1;

    json_t *empty = sp ? NULL : json_object();
    const json_t *p = sp ? sp : empty;
    int rc = -1;
    if (jx_int(p, "sampling_params", "max_tokens", 0, &r->max_tokens, &r->has_max_tokens, err,
               errlen) < 0 ||
        jx_num(p, "sampling_params", "temperature", 1.0, &r->temperature, err, errlen) < 0 ||
        jx_int(p, "sampling_params", "top_k", -1, &r->top_k, NULL, err, errlen) < 0 ||
        jx_num(p, "sampling_params", "top_p", 1.0, &r->top_p, err, errlen) < 0 ||
        jx_int(p, "sampling_params", "seed", 0, &r->seed, &r->has_seed, err, errlen) < 0 ||
        decode_stop(p, r, err, errlen) < 0)
        goto out;
    if (r->has_max_tokens && r->max_tokens < 1) {
        snprintf(err, errlen, "sampling_params.max_tokens must be >= 1, got %lld",
                 (long long)r->max_tokens);
        goto out;
    }
    if (!(r->temperature >= 0) || r->temperature >= 1e18) {
        snprintf(err, errlen, "sampling_params.temperature must be >= 0 (0 = greedy), got %g",
                 r->temperature);
        goto out;
    }
    if (!(r->top_p > 0 && r->top_p <= 1)) {
        snprintf(err, errlen, "sampling_params.top_p must be in (0, 1], got %g", r->top_p);
        goto out;
    }
    if (r->top_k != -1 && r->top_k < 1) {
        snprintf(err, errlen, "sampling_params.top_k must be -1 (no limit) or >= 1, got %lld",
                 (long long)r->top_k);
        goto out;
    }
    if (r->has_seed && r->seed < 0) {
        snprintf(err, errlen, "sampling_params.seed must be >= 0, got %lld", (long long)r->seed);
        goto out;
    }
    rc = 0;
out:
    json_decref(empty);
    return rc;
}

int sample_validate(sample_req *r, int64_t vocab_size, int64_t max_context, char *err,
                    size_t errlen) {
    if (r->n_prompt == 0) {
        snprintf(err, errlen, "prompt has no tokens");
        return -1;
    }
    for (size_t k = 0; k < r->n_prompt; k++) {
        if (r->prompt[k] < 0 || r->prompt[k] >= vocab_size) {
            snprintf(err, errlen, "prompt: token id %lld at position %zu is outside the vocabulary "
                                  "[0, %lld)", (long long)r->prompt[k], k, (long long)vocab_size);
            return -1;
        }
    }
    for (size_t k = 0; k < r->n_stop_tokens; k++) {
        if (r->stop_tokens[k] < 0 || r->stop_tokens[k] >= vocab_size) {
            snprintf(err, errlen, "sampling_params.stop[%zu]: token id %lld is outside the "
                                  "vocabulary [0, %lld)", k, (long long)r->stop_tokens[k],
                     (long long)vocab_size);
            return -1;
        }
    }
    int64_t room = max_context - (int64_t)r->n_prompt;
    if (room < 1) {
        snprintf(err, errlen, "prompt has %zu tokens; the base model's context length is %lld, "
                              "which leaves no room to generate", r->n_prompt,
                 (long long)max_context);
        return -1;
    }
    if (!r->has_max_tokens) {
        r->max_tokens = room < SAMPLE_DEFAULT_MAX_TOKENS ? room : SAMPLE_DEFAULT_MAX_TOKENS;
        r->has_max_tokens = true;
    }
    if (r->max_tokens > room) {
        snprintf(err, errlen, "prompt (%zu tokens) + sampling_params.max_tokens (%lld) exceeds the "
                              "base model's context length %lld; lower max_tokens to at most %lld",
                 r->n_prompt, (long long)r->max_tokens, (long long)max_context, (long long)room);
        return -1;
    }
    if (!r->has_seed) {
        uint64_t s;
        randombytes_buf(&s, sizeof s);
        r->seed = (int64_t)(s & ((UINT64_C(1) << 48) - 1)); /* exact in any JSON reader */
        r->has_seed = true;
    }
    return 0;
}

int64_t sample_n_tokens(const sample_req *r) {
    return r->num_samples * ((int64_t)r->n_prompt + r->max_tokens);
}

char *sample_payload_json(const sample_req *r, const char *source, const char *blob_digest,
                          size_t *len) {
    strbuf b;
    sb_init(&b, 256 + 8 * r->n_prompt);
    sb_puts(&b, "{\"prompt\": [");
    for (size_t k = 0; k < r->n_prompt; k++) {
        if (k) sb_putc(&b, ',');
        sb_int(&b, r->prompt[k]);
    }
    sb_printf(&b, "], \"num_samples\": %lld, \"max_tokens\": %lld, \"temperature\": ",
              (long long)r->num_samples, (long long)r->max_tokens);
    sb_real(&b, r->temperature);
    sb_printf(&b, ", \"top_k\": %lld, \"top_p\": ", (long long)r->top_k);
    sb_real(&b, r->top_p);
    sb_printf(&b, ", \"seed\": %lld", (long long)r->seed);
    if (r->stop_tokens) {
        sb_puts(&b, ", \"stop_tokens\": [");
        for (size_t k = 0; k < r->n_stop_tokens; k++) {
            if (k) sb_putc(&b, ',');
            sb_int(&b, r->stop_tokens[k]);
        }
        sb_putc(&b, ']');
    }
    if (r->stop_strings) {
        sb_puts(&b, ", \"stop_strings\": [");
        for (size_t k = 0; k < r->n_stop_strings; k++) {
            if (k) sb_puts(&b, ", ");
            sb_json_str(&b, r->stop_strings[k]);
        }
        sb_putc(&b, ']');
    }
    sb_printf(&b, ", \"prompt_logprobs\": %s, \"topk_prompt_logprobs\": %lld, \"source\": ",
              r->prompt_logprobs ? "true" : "false", (long long)r->topk_prompt_logprobs);
    sb_json_str(&b, source);
    if (blob_digest) {
        sb_puts(&b, ", \"blob_digest\": ");
        sb_json_str(&b, blob_digest);
    }
    sb_putc(&b, '}');
    return sb_steal(&b, len);
}

void sample_req_free(sample_req *r) {
    free(r->prompt);
    free(r->stop_tokens);
    free(r->stop_strings);
    memset(r, 0, sizeof *r);
}
