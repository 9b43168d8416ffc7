/* sample_req.c: asample requests: decoding, validation, payload (see sample_req.h).
 * Messages name the field (sampling_params.top_p, prompt.chunks[0].tokens[3]) so a
 * user can fix the call. */
#include "service/sample_req.h"
#include "common/xalloc.h"
#include "core/api_json.h"
#include "service/fwdbwd.h"
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* sampling_params.stop: null, one string, a list of strings, or a list of token ids. */
static int decode_stop(const json_t *sp, sample_req *r, char *err, size_t errlen) {
    const json_t *stop = json_object_get(sp, "stop");
    if (!stop || json_is_null(stop)) return 0;
    if (json_is_string(stop)) {
        r->p.stop_strings = xcalloc(1, sizeof *r->p.stop_strings);
        r->p.stop_strings[r->p.n_stop_strings++] = json_string_value(stop);
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
        if (n_str) r->p.stop_strings = xcalloc(n, sizeof *r->p.stop_strings);
        if (n_int) r->p.stop_tokens = xcalloc(n, sizeof *r->p.stop_tokens);
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_array_get(stop, i);
            if (n_str) r->p.stop_strings[r->p.n_stop_strings++] = json_string_value(e);
            else jx_as_int(e, &r->p.stop_tokens[r->p.n_stop_tokens++]);
        }
    } else {
        snprintf(err, errlen, "sampling_params.stop: expected a string, a list of strings or a "
                              "list of token ids, got %s", jx_type_name(stop));
        return -1;
    }
    for (size_t i = 0; i < r->p.n_stop_strings; i++) {
        const json_t *e = json_is_string(stop) ? stop : json_array_get(stop, i);
        if (json_string_length(e) == 0 || json_string_length(e) > SAMPLE_MAX_STOP_LEN) {
            snprintf(err, errlen, "sampling_params.stop: stop strings must be non-empty and at "
                                  "most %d bytes long", SAMPLE_MAX_STOP_LEN);
            return -1;
        }
    }
    return 0;
}

/* An int list (TensorData data or CSR indices) of at most `cap` entries, as int64. */
static int int_list(const json_t *v, const char *name, size_t cap, int64_t **out, size_t *n, char *err,
                    size_t errlen) {
    if (!json_is_array(v)) {
        snprintf(err, errlen, "target_prompt_logprobs.%s: expected an array of integers, got %s", name,
                 v ? jx_type_name(v) : "nothing");
        return -1;
    }
    *n = json_array_size(v);
    if (*n > cap) {
        snprintf(err, errlen, "target_prompt_logprobs.%s has %zu entries; at most %zu are accepted", name, *n,
                 cap);
        return -1;
    }
    *out = xcalloc(*n, sizeof **out);
    for (size_t k = 0; k < *n; k++) {
        if (!jx_as_int(json_array_get(v, k), &(*out)[k])) {
            snprintf(err, errlen, "target_prompt_logprobs.%s[%zu]: expected an integer, got %s", name, k,
                     jx_type_name(json_array_get(v, k)));
            return -1;
        }
    }
    return 0;
}

/* target_prompt_logprobs (newer SDKs): an int64 TensorData of shape [len(prompt) - 1, K],
 * dense row-major or sparse CSR, each cell a token id or -1 (nothing asked). Everything the
 * model does not decide is checked here: shape, sizes before memory, a well-formed CSR
 * (crow from 0, non-decreasing, ending at the number of values; columns in [0, K), rising
 * within a row), and at least one id; the vocabulary in sample_validate. */
static int decode_target(const json_t *t, sample_req *r, char *err, size_t errlen) {
    if (!t || json_is_null(t)) return 0;
    if (!json_is_object(t)) {
        snprintf(err, errlen, "target_prompt_logprobs: expected a TensorData {\"data\": [...], \"dtype\": "
                              "\"int64\", \"shape\": [len(prompt) - 1, K]}, got %s", jx_type_name(t));
        return -1;
    }
    const char *dtype;
    if (jx_str(t, "target_prompt_logprobs", "dtype", &dtype, err, errlen) < 0) return -1;
    if (dtype && strcmp(dtype, "int64") != 0) {
        snprintf(err, errlen, "target_prompt_logprobs.dtype must be \"int64\" (token ids), got \"%.40s\"", dtype);
        return -1;
    }
    const json_t *shape = json_object_get(t, "shape");
    int64_t dims[2];
    if (!json_is_array(shape) || json_array_size(shape) != 2 || !jx_as_int(json_array_get(shape, 0), &dims[0]) ||
        !jx_as_int(json_array_get(shape, 1), &dims[1])) {
        snprintf(err, errlen, "target_prompt_logprobs.shape: expected [len(prompt) - 1, K] (two integers)");
        return -1;
    }
    int64_t rows = (int64_t)r->p.n_prompt - 1;
    if (rows < 1) {
        snprintf(err, errlen, "target_prompt_logprobs needs a prompt of at least 2 tokens (position 0 has no "
                              "preceding context)");
        return -1;
    }
    if (dims[0] != rows || dims[1] < 1 || dims[1] > LIMIT_TARGET_PROMPT_K) {
        snprintf(err, errlen, "target_prompt_logprobs.shape [%lld, %lld]: expected [len(prompt) - 1, K] = "
                              "[%lld, K] with 1 <= K <= %d (row i scores prompt position i + 1)",
                 (long long)dims[0], (long long)dims[1], (long long)rows, LIMIT_TARGET_PROMPT_K);
        return -1;
    }
    r->p.target_rows = rows;
    r->p.target_cols = dims[1];
    const json_t *data = json_object_get(t, "data"), *crow = json_object_get(t, "sparse_crow_indices"),
                 *col = json_object_get(t, "sparse_col_indices");
    if (crow && json_is_null(crow)) crow = NULL;
    if (col && json_is_null(col)) col = NULL;
    if (!crow != !col) {
        snprintf(err, errlen, "target_prompt_logprobs: sparse CSR needs both sparse_crow_indices and "
                              "sparse_col_indices");
        return -1;
    }
    if (!crow && rows * dims[1] > LIMIT_TARGET_PROMPT_CELLS) {
        snprintf(err, errlen, "target_prompt_logprobs.shape [%lld, %lld]: %lld cells; at most %d are accepted "
                              "(send the cells you need as sparse CSR)", (long long)rows, (long long)dims[1],
                 (long long)(rows * dims[1]), LIMIT_TARGET_PROMPT_CELLS);
        return -1;
    }
    r->p.has_target = true;
    if (int_list(data, "data", LIMIT_TARGET_PROMPT_CELLS, &r->p.target_ids, &r->p.n_target_ids, err, errlen) < 0)
        return -1;
    size_t nnz = r->p.n_target_ids;
    if (!crow) {
        if (nnz != (size_t)(rows * dims[1])) {
            snprintf(err, errlen, "target_prompt_logprobs.shape [%lld, %lld] needs %lld values (row-major), data "
                                  "has %zu", (long long)rows, (long long)dims[1], (long long)(rows * dims[1]), nnz);
            return -1;
        }
    } else {
        size_t nc, nl;
        if (int_list(crow, "sparse_crow_indices", (size_t)rows + 1, &r->p.target_crow, &nc, err, errlen) < 0 ||
            int_list(col, "sparse_col_indices", nnz, &r->p.target_col, &nl, err, errlen) < 0)
            return -1;
        if (nc != (size_t)rows + 1 || nl != nnz) {
            snprintf(err, errlen, "target_prompt_logprobs (sparse CSR): sparse_crow_indices needs rows + 1 = "
                                  "%lld entries (has %zu) and sparse_col_indices one per value, %zu (has %zu)",
                     (long long)rows + 1, nc, nnz, nl);
            return -1;
        }
        if (r->p.target_crow[0] != 0 || r->p.target_crow[rows] != (int64_t)nnz) {
            snprintf(err, errlen, "target_prompt_logprobs (sparse CSR): sparse_crow_indices must start at 0 and "
                                  "end at the number of values %zu", nnz);
            return -1;
        }
        for (int64_t i = 0; i < rows; i++) {
            int64_t a = r->p.target_crow[i], b = r->p.target_crow[i + 1];
            if (b < a) {
                snprintf(err, errlen, "target_prompt_logprobs (sparse CSR): sparse_crow_indices must not decrease "
                                      "(entry %lld)", (long long)i + 1);
                return -1;
            }
            for (int64_t q = a; q < b; q++) {
                int64_t c = r->p.target_col[q];
                if (c < 0 || c >= dims[1] || (q > a && c <= r->p.target_col[q - 1])) {
                    snprintf(err, errlen, "target_prompt_logprobs (sparse CSR): sparse_col_indices[%lld] = %lld: "
                                          "columns must lie in [0, %lld) and rise within a row", (long long)q,
                             (long long)c, (long long)dims[1]);
                    return -1;
                }
            }
        }
    }
    bool any = false;
    for (size_t q = 0; q < nnz; q++) {
        if (r->p.target_ids[q] < -1) {
            snprintf(err, errlen, "target_prompt_logprobs.data[%zu] = %lld: a token id, or -1 for nothing",
                     q, (long long)r->p.target_ids[q]);
            return -1;
        }
        any = any || r->p.target_ids[q] >= 0;
    }
    if (!any) {
        snprintf(err, errlen, "target_prompt_logprobs names no token id (every cell is -1); leave it out instead");
        return -1;
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
        jx_int(b, "", "num_samples", 1, &r->p.num_samples, NULL, err, errlen) < 0 ||
        jx_obj(b, "", "prompt", &prompt, err, errlen) < 0 ||
        jx_obj(b, "", "sampling_params", &sp, err, errlen) < 0 ||
        jx_bool(b, "", "prompt_logprobs", false, &r->p.prompt_logprobs, err, errlen) < 0 ||
        jx_int(b, "", "topk_prompt_logprobs", 0, &r->p.topk_prompt_logprobs, NULL, err, errlen) < 0 ||
        jx_int(b, "", "topk_sample_logprobs", 0, &r->p.topk_sample_logprobs, NULL, err, errlen) < 0 ||
        jx_int(b, "", "prompt_logprobs_last_n", 0, &r->p.prompt_logprobs_last_n, NULL, err, errlen) < 0 ||
        jx_int(b, "", "prompt_alt_tokens_k", 0, &r->p.prompt_alt_tokens_k, NULL, err, errlen) < 0)
        return -1;
    if (r->has_seq_id && r->seq_id < 0) {
        snprintf(err, errlen, "seq_id must be >= 0, got %lld", (long long)r->seq_id);
        return -1;
    }
    if (r->p.num_samples < 1 || r->p.num_samples > LIMIT_NUM_SAMPLES) {
        snprintf(err, errlen, "num_samples must be between 1 and %d, got %lld",
                 LIMIT_NUM_SAMPLES, (long long)r->p.num_samples);
        return -1;
    }
    if (r->p.topk_prompt_logprobs < 0 || r->p.topk_prompt_logprobs > LIMIT_TOPK_PROMPT_LOGPROBS) {
        snprintf(err, errlen, "topk_prompt_logprobs must be between 0 and %d, got %lld",
                 LIMIT_TOPK_PROMPT_LOGPROBS, (long long)r->p.topk_prompt_logprobs);
        return -1;
    }
    const struct { const char *name; int64_t v; } counts[] = {
        {"topk_sample_logprobs", r->p.topk_sample_logprobs}, {"prompt_alt_tokens_k", r->p.prompt_alt_tokens_k}};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        if (counts[i].v < 0 || counts[i].v > LIMIT_TOPK_PROMPT_LOGPROBS) {
            snprintf(err, errlen, "%s must be between 0 and %d, got %lld", counts[i].name,
                     LIMIT_TOPK_PROMPT_LOGPROBS, (long long)counts[i].v);
            return -1;
        }
    }
    if (r->p.prompt_logprobs_last_n < 0) {
        snprintf(err, errlen, "prompt_logprobs_last_n must be >= 1 (0 or null: the whole prompt), got %lld",
                 (long long)r->p.prompt_logprobs_last_n);
        return -1;
    }
    if (r->p.prompt_logprobs_last_n > 0 && !r->p.prompt_logprobs) {
        snprintf(err, errlen, "prompt_logprobs_last_n needs prompt_logprobs: true (it limits the prompt "
                              "logprobs to the last n positions)");
        return -1;
    }
    if (!prompt) {
        snprintf(err, errlen, "prompt is required (a ModelInput {\"chunks\": [{\"type\": "
                              "\"encoded_text\", \"tokens\": [...]}]})");
        return -1;
    }
    if (fb_decode_model_input(prompt, "prompt", &r->p.prompt, &r->p.n_prompt, err, errlen) < 0)
        return -1;
    if (decode_target(json_object_get(b, "target_prompt_logprobs"), r, err, errlen) < 0) return -1;

    json_t *empty = sp ? NULL : json_object();
    const json_t *p = sp ? sp : empty;
    int rc = -1;
    if (jx_int(p, "sampling_params", "max_tokens", 0, &r->p.max_tokens, &r->p.has_max_tokens, err,
               errlen) < 0 ||
        jx_num(p, "sampling_params", "temperature", 1.0, &r->p.temperature, err, errlen) < 0 ||
        jx_int(p, "sampling_params", "top_k", -1, &r->p.top_k, NULL, err, errlen) < 0 ||
        jx_num(p, "sampling_params", "top_p", 1.0, &r->p.top_p, err, errlen) < 0 ||
        jx_int(p, "sampling_params", "seed", 0, &r->p.seed, &r->has_seed, err, errlen) < 0 ||
        decode_stop(p, r, err, errlen) < 0)
        goto out;
    if (r->p.has_max_tokens && r->p.max_tokens < 1) {
        snprintf(err, errlen, "sampling_params.max_tokens must be >= 1, got %lld",
                 (long long)r->p.max_tokens);
        goto out;
    }
    if (!(r->p.temperature >= 0) || r->p.temperature >= 1e18) {
        snprintf(err, errlen, "sampling_params.temperature must be >= 0 (0 = greedy), got %g",
                 r->p.temperature);
        goto out;
    }
    if (!(r->p.top_p > 0 && r->p.top_p <= 1)) {
        snprintf(err, errlen, "sampling_params.top_p must be in (0, 1], got %g", r->p.top_p);
        goto out;
    }
    if (r->p.top_k != -1 && r->p.top_k < 1) {
        snprintf(err, errlen, "sampling_params.top_k must be -1 (no limit) or >= 1, got %lld",
                 (long long)r->p.top_k);
        goto out;
    }
    if (r->has_seed && r->p.seed < 0) {
        snprintf(err, errlen, "sampling_params.seed must be >= 0, got %lld", (long long)r->p.seed);
        goto out;
    }
    rc = 0;
out:
    json_decref(empty);
    return rc;
}

int sample_validate(sample_req *r, int64_t vocab_size, int64_t max_context, char *err,
                    size_t errlen) {
    if (r->p.n_prompt == 0) {
        snprintf(err, errlen, "prompt has no tokens");
        return -1;
    }
    for (size_t k = 0; k < r->p.n_prompt; k++) {
        if (r->p.prompt[k] < 0 || r->p.prompt[k] >= vocab_size) {
            snprintf(err, errlen, "prompt: token id %lld at position %zu is outside the vocabulary "
                                  "[0, %lld)", (long long)r->p.prompt[k], k, (long long)vocab_size);
            return -1;
        }
    }
    for (size_t q = 0; q < r->p.n_target_ids; q++) {
        if (r->p.target_ids[q] >= vocab_size) {
            snprintf(err, errlen, "target_prompt_logprobs.data[%zu]: token id %lld is outside the vocabulary "
                                  "[0, %lld) (-1 = nothing)", q, (long long)r->p.target_ids[q],
                     (long long)vocab_size);
            return -1;
        }
    }
    for (size_t k = 0; k < r->p.n_stop_tokens; k++) {
        if (r->p.stop_tokens[k] < 0 || r->p.stop_tokens[k] >= vocab_size) {
            snprintf(err, errlen, "sampling_params.stop[%zu]: token id %lld is outside the "
                                  "vocabulary [0, %lld)", k, (long long)r->p.stop_tokens[k],
                     (long long)vocab_size);
            return -1;
        }
    }
    int64_t room = max_context - (int64_t)r->p.n_prompt;
    if (room < 1) {
        snprintf(err, errlen, "prompt has %zu tokens; the base model's context length is %lld, "
                              "which leaves no room to generate", r->p.n_prompt,
                 (long long)max_context);
        return -1;
    }
    if (!r->p.has_max_tokens) {
        r->p.max_tokens = room < SAMPLE_DEFAULT_MAX_TOKENS ? room : SAMPLE_DEFAULT_MAX_TOKENS;
        r->p.has_max_tokens = true;
    }
    if (r->p.max_tokens > room) {
        snprintf(err, errlen, "prompt (%zu tokens) + sampling_params.max_tokens (%lld) exceeds the "
                              "base model's context length %lld; lower max_tokens to at most %lld",
                 r->p.n_prompt, (long long)r->p.max_tokens, (long long)max_context, (long long)room);
        return -1;
    }
    if (r->p.topk_sample_logprobs > 0 &&
        r->p.num_samples * r->p.max_tokens * r->p.topk_sample_logprobs > LIMIT_TOPK_SAMPLE_CELLS) {
        snprintf(err, errlen, "topk_sample_logprobs %lld x num_samples %lld x max_tokens %lld is more than the %d "
                              "top-k entries one request may return; lower one of them",
                 (long long)r->p.topk_sample_logprobs, (long long)r->p.num_samples, (long long)r->p.max_tokens,
                 LIMIT_TOPK_SAMPLE_CELLS);
        return -1;
    }
    /* "the last n positions" of a prompt that has fewer is all of it */
    if (r->p.prompt_logprobs_last_n > (int64_t)r->p.n_prompt - 1)
        r->p.prompt_logprobs_last_n = (int64_t)r->p.n_prompt - 1;
    if (!r->has_seed) {
        uint64_t s;
        randombytes_buf(&s, sizeof s);
        r->p.seed = (int64_t)(s & ((UINT64_C(1) << 48) - 1)); /* exact in any JSON reader */
        r->has_seed = true;
    }
    return 0;
}

int64_t sample_n_tokens(const sample_req *r) {
    return r->p.num_samples * ((int64_t)r->p.n_prompt + r->p.max_tokens);
}

char *sample_payload_json(const sample_req *r, const char *source, const char *blob_digest,
                          size_t *len) {
    sample_payload p = r->p;
    p.source = source;
    p.blob_digest = blob_digest;
    return sample_payload_encode(&p, len);
}

void sample_req_free(sample_req *r) {
    sample_payload_free(&r->p);
    memset(r, 0, sizeof *r);
}
