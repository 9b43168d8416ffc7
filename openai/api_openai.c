/* api_openai.c: the OpenAI-compatible routes on the database workers (see api_openai.h,
 * docs/protocol.md §18): the model list, the aliases, and accepting a completion: its
 * fields checked and named in OpenAI's error shape, the model resolved (a base model, a
 * readable tinker:// checkpoint, or one of the tenant's aliases), the prompt rendered and
 * tokenised exactly as Hugging Face does, and one sample operation per prompt inserted
 * under the tenant's bounds. Its event loop answers it (api_openai_stream.c). */
#include "openai/api_openai.h"
#include "common/db.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "contract/sample_payload.h"
#include "core/api_json.h"
#include "openai/api_openai_sql.h"
#include "registry/registry.h"
#include "tinker/api_ops.h"
#include "tinker/api_sql.h"
#include "service/sample_req.h"
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OAI_MAX_MESSAGES 4096
#define OAI_DEFAULT_MAX_TOKENS 1024   /* max_tokens absent: min(this, the context left) */
#define OAI_MAX_ANSWER_TOKENS (1 << 18) /* n x max_tokens: bounds an answer's memory, here and in the executor */

void oai_spec_free(oai_spec *s) {
    free(s->model);
    for (int i = 0; i < s->nstop; i++) free(s->stop[i]);
    free(s);
}

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

char *oai_error_body(int status, const char *msg, const char *param, const char *code, size_t *len) {
    strbuf b;
    sb_init(&b, strlen(msg) + 128);
    sb_puts(&b, "{\"error\": {\"message\": ");
    sb_json_str(&b, msg);
    sb_printf(&b, ", \"type\": \"%s\", \"param\": ", error_type(status));
    if (param) sb_json_str(&b, param);
    else sb_puts(&b, "null");
    sb_puts(&b, ", \"code\": ");
    if (code) sb_json_str(&b, code);
    else sb_puts(&b, "null");
    sb_puts(&b, "}}");
    return sb_steal(&b, len);
}

const api_error_shape oai_error_shape = {"/v1/", oai_error_body};

/* An error naming the field (param) and OpenAI's code; returns 0 like api_error. */
static int __attribute__((format(printf, 5, 6))) oai_fail(api_call *c, int status, const char *param,
                                                          const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    api_error_v(c, status, param, code, fmt, ap);
    va_end(ap);
    return 0;
}

/* ---- the model a request names ------------------------------------------------------------- */

typedef struct {
    char base_model[OP_NAME_MAX];
    char path[1024];              /* the checkpoint's tinker path, "" for a base model */
    char version_id[24];          /* "" for a base model */
    char digest[80];
    int64_t max_context, vocab;
} oai_model;

/* A tinker path the tenant may read. 0, 404 (with the answer), or -1 (database error). */
static int resolve_checkpoint(api_call *c, const char *name, const char *path, oai_model *m) {
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *p[2] = {path, tid};
    PGresult *r = db_query(c->db, SQL_CHECKPOINT_READABLE, 2, p, c->err, sizeof c->err);
    if (!r) return -1;
    if (PQntuples(r) == 0) {
        PQclear(r);
        oai_fail(c, 404, "model", "model_not_found", "The model `%.300s` does not exist or you do not have access "
                 "to it (checkpoint %.300s: deleted, expired, or not shared with you)", name, path);
        return 404;
    }
    snprintf(m->version_id, sizeof m->version_id, "%s", PQgetvalue(r, 0, 0));
    snprintf(m->base_model, sizeof m->base_model, "%s", PQgetvalue(r, 0, 1));
    snprintf(m->digest, sizeof m->digest, "%s", PQgetvalue(r, 0, 2));
    snprintf(m->path, sizeof m->path, "%s", path);
    PQclear(r);
    return 0;
}

/* model: a base model name, a tinker:// checkpoint path, or one of the tenant's aliases.
 * 0 with m filled; else the answer is sent (404, or 503 on a database error) and -1. */
static int resolve_model(api_call *c, const char *name, oai_model *m) {
    memset(m, 0, sizeof m[0]);
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    int st = 0;
    if (!strncmp(name, "tinker://", 9)) {
        st = resolve_checkpoint(c, name, name, m);
    } else {
        const char *p[1] = {name};
        PGresult *r = db_query(c->db, SQL_BASE_MODEL_GET, 1, p, c->err, sizeof c->err);
        if (!r) return api_db_error(c, "openai model", c->err), -1;
        bool base = PQntuples(r) > 0;
        PQclear(r);
        if (base) {
            snprintf(m->base_model, sizeof m->base_model, "%s", name);
        } else {
            const char *ap[2] = {name, tid};
            if (!(r = db_query(c->db, SQL_OAI_ALIAS_GET, 2, ap, c->err, sizeof c->err)))
                return api_db_error(c, "openai model", c->err), -1;
            char path[1024] = "";
            if (PQntuples(r)) snprintf(path, sizeof path, "%s", PQgetvalue(r, 0, 0));
            PQclear(r);
            if (!*path) {
                if (!(r = db_query(c->db, SQL_BASE_MODEL_NAMES, 0, NULL, c->err, sizeof c->err)))
                    return api_db_error(c, "openai model", c->err), -1;
                oai_fail(c, 404, "model", "model_not_found", "The model `%.300s` does not exist: give a base model "
                         "(%.500s), a tinker://…/sampler_weights/… checkpoint path, or an alias of yours "
                         "(GET /v1/models lists them)", name, PQgetvalue(r, 0, 0));
                PQclear(r);
                return -1;
            }
            st = resolve_checkpoint(c, name, path, m);
        }
    }
    if (st < 0) return api_db_error(c, "openai model", c->err), -1;
    if (st > 0) return -1;
    char timeout[24];
    api_fmt_i64(timeout, c->settings->executor_timeout_s);
    const char *bp[2] = {m->base_model, timeout};
    PGresult *r = db_query(c->db, SQL_OAI_BASE_MODEL, 2, bp, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "openai model", c->err), -1;
    if (!PQntuples(r) || !db_bool(r, 0, 2)) {
        PQclear(r);
        oai_fail(c, 503, "model", "model_not_served", "no executor is serving base model %.200s at the moment; "
                 "retry shortly", m->base_model);
        return -1;
    }
    m->max_context = db_int(r, 0, 0);
    m->vocab = db_int(r, 0, 1);
    PQclear(r);
    return 0;
}

/* ---- GET /v1/models ------------------------------------------------------------------------- */

int api_h_oai_models(api_call *c) {
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *p[1] = {tid};
    PGresult *r = db_query(c->db, SQL_OAI_MODELS, 1, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "models", c->err);
    strbuf b;
    sb_init(&b, 256 + strlen(PQgetvalue(r, 0, 0)));
    sb_puts(&b, "{\"object\": \"list\", \"data\": ");
    sb_puts(&b, PQgetvalue(r, 0, 0));
    sb_putc(&b, '}');
    PQclear(r);
    size_t len;
    char *text = sb_steal(&b, &len);
    return api_reply_take(c, 200, text, len);
}

int api_h_oai_model(api_call *c) {
    const char *name = api_path_id(c);
    oai_model m;
    if (resolve_model(c, name, &m) < 0) return 0;
    json_t *v = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:I}", "id", name, "object", "model", "created",
                          (json_int_t)time(NULL), "owned_by", *m.path ? "loom-checkpoint" : "loom", "root",
                          *m.path ? m.path : m.base_model, "parent",
                          *m.path ? json_string(m.base_model) : json_null(), "max_model_len",
                          (json_int_t)m.max_context);
    return api_reply_json(c, 200, v);
}

/* ---- the request's fields ---------------------------------------------------------------------- */

typedef struct {
    bool chat;
    const char *model;
    int64_t max_tokens, n, top_k, seed, top_logprobs;
    bool has_max_tokens, has_seed, stream, include_usage, logprobs, token_ids, add_generation_prompt;
    double temperature, top_p;
    const char *stop[OAI_MAX_STOP];
    int nstop;
    json_t *messages, *prompt, *template_kwargs;
} oai_req;

/* Fields that change what is generated and that Loom does not implement: refused when
 * set to anything but their neutral value, so no answer silently ignores them. */
static int refuse_unsupported(api_call *c, const json_t *b) {
    static const struct { const char *key; double neutral; } nums[] = {
        {"frequency_penalty", 0}, {"presence_penalty", 0}, {"repetition_penalty", 1}, {"min_p", 0},
        {"length_penalty", 1}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        json_t *v = json_object_get(b, nums[i].key);
        if (v && !json_is_null(v) && (!json_is_number(v) || json_number_value(v) != nums[i].neutral))
            return oai_fail(c, 400, nums[i].key, "unsupported_parameter", "%s is not supported by this server "
                            "(leave it out or send %g)", nums[i].key, nums[i].neutral), -1;
    }
    json_t *v = json_object_get(b, "logit_bias");
    if (v && !json_is_null(v) && !(json_is_object(v) && json_object_size(v) == 0))
        return oai_fail(c, 400, "logit_bias", "unsupported_parameter", "logit_bias is not supported by this "
                        "server"), -1;
    v = json_object_get(b, "tools");
    if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
        return oai_fail(c, 400, "tools", "unsupported_parameter", "tool calls are not supported by this server; "
                        "send the request without tools"), -1;
    v = json_object_get(b, "response_format");
    const char *rf = json_string_value(json_object_get(v, "type"));
    if (v && !json_is_null(v) && (!rf || strcmp(rf, "text")))
        return oai_fail(c, 400, "response_format", "unsupported_parameter", "only response_format {\"type\": "
                        "\"text\"} is supported"), -1;
    if (json_is_true(json_object_get(b, "echo")))
        return oai_fail(c, 400, "echo", "unsupported_parameter", "echo is not supported by this server"), -1;
    v = json_object_get(b, "suffix");
    if (v && !json_is_null(v))
        return oai_fail(c, 400, "suffix", "unsupported_parameter", "suffix is not supported by this server"), -1;
    v = json_object_get(b, "best_of");
    int64_t best_of, n = 1;
    jx_as_int(json_object_get(b, "n"), &n);
    if (v && !json_is_null(v) && (!jx_as_int(v, &best_of) || best_of != n))
        return oai_fail(c, 400, "best_of", "unsupported_parameter", "best_of is not supported by this server "
                        "(leave it out, or make it equal to n)"), -1;
    return 0;
}

/* stop: null, a string, or a list of strings. */
static int read_stop(api_call *c, const json_t *b, oai_req *q) {
    const json_t *v = json_object_get(b, "stop");
    if (!v || json_is_null(v)) return 0;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_string(v) && !json_is_array(v))
        return oai_fail(c, 400, "stop", NULL, "stop: expected a string or a list of strings, got %s",
                        jx_type_name(v)), -1;
    if (n > OAI_MAX_STOP)
        return oai_fail(c, 400, "stop", NULL, "stop has %zu entries; at most %d are accepted", n, OAI_MAX_STOP), -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(e) || !json_string_length(e) || json_string_length(e) > SAMPLE_MAX_STOP_LEN)
            return oai_fail(c, 400, "stop", NULL, "stop[%zu]: stop sequences are non-empty strings of at most %d "
                            "bytes", i, SAMPLE_MAX_STOP_LEN), -1;
        q->stop[q->nstop++] = json_string_value(e);
    }
    return 0;
}

#define FIELD(call, key)                                                                                  \
    do {                                                                                                  \
        if ((call) < 0) return oai_fail(c, 400, key, NULL, "%s", c->err), -1;                           \
    } while (0)

static int read_request(api_call *c, bool chat, oai_req *q) {
    const json_t *b = c->body;
    memset(q, 0, sizeof q[0]);
    q->chat = chat;
    FIELD(jx_req_str(b, "", "model", &q->model, c->err, sizeof c->err), "model");
    bool has_mct;
    int64_t mct;
    FIELD(jx_int(b, "", "max_tokens", 0, &q->max_tokens, &q->has_max_tokens, c->err, sizeof c->err), "max_tokens");
    FIELD(jx_int(b, "", "max_completion_tokens", 0, &mct, &has_mct, c->err, sizeof c->err), "max_completion_tokens");
    if (has_mct) q->max_tokens = mct, q->has_max_tokens = true;
    FIELD(jx_num(b, "", "temperature", 1.0, &q->temperature, c->err, sizeof c->err), "temperature");
    FIELD(jx_num(b, "", "top_p", 1.0, &q->top_p, c->err, sizeof c->err), "top_p");
    FIELD(jx_int(b, "", "top_k", -1, &q->top_k, NULL, c->err, sizeof c->err), "top_k");
    FIELD(jx_int(b, "", "n", 1, &q->n, NULL, c->err, sizeof c->err), "n");
    FIELD(jx_int(b, "", "seed", 0, &q->seed, &q->has_seed, c->err, sizeof c->err), "seed");
    FIELD(jx_bool(b, "", "stream", false, &q->stream, c->err, sizeof c->err), "stream");
    FIELD(jx_bool(b, "", "return_tokens_as_token_ids", false, &q->token_ids, c->err, sizeof c->err),
          "return_tokens_as_token_ids");
    json_t *so;
    FIELD(jx_obj(b, "", "stream_options", &so, c->err, sizeof c->err), "stream_options");
    if (so) FIELD(jx_bool(so, "stream_options", "include_usage", false, &q->include_usage, c->err, sizeof c->err),
                  "stream_options.include_usage");
    if (chat) {
        FIELD(jx_bool(b, "", "logprobs", false, &q->logprobs, c->err, sizeof c->err), "logprobs");
        FIELD(jx_int(b, "", "top_logprobs", 0, &q->top_logprobs, NULL, c->err, sizeof c->err), "top_logprobs");
        FIELD(jx_arr(b, "", "messages", &q->messages, c->err, sizeof c->err), "messages");
        FIELD(jx_obj(b, "", "chat_template_kwargs", &q->template_kwargs, c->err, sizeof c->err), "chat_template_kwargs");
        FIELD(jx_bool(b, "", "add_generation_prompt", true, &q->add_generation_prompt, c->err, sizeof c->err),
              "add_generation_prompt");
        if (q->top_logprobs && !q->logprobs)
            return oai_fail(c, 400, "top_logprobs", NULL, "top_logprobs needs logprobs: true"), -1;
    } else {
        json_t *lp = json_object_get(b, "logprobs");
        if (lp && !json_is_null(lp)) {
            FIELD(jx_int(b, "", "logprobs", 0, &q->top_logprobs, NULL, c->err, sizeof c->err), "logprobs");
            q->logprobs = true;
        }
        q->prompt = json_object_get(b, "prompt");
    }
    if (q->has_max_tokens && (q->max_tokens < 1 || q->max_tokens > c->settings->openai_max_tokens))
        return oai_fail(c, 400, has_mct ? "max_completion_tokens" : "max_tokens", NULL, "max_tokens must be between "
                        "1 and %lld (this server's limit: loom api --openai-max-tokens), got %lld",
                        (long long)c->settings->openai_max_tokens, (long long)q->max_tokens), -1;
    if (!(q->temperature >= 0) || q->temperature > 1e6)
        return oai_fail(c, 400, "temperature", NULL, "temperature must be >= 0 (0 = greedy), got %g", q->temperature), -1;
    if (!(q->top_p > 0 && q->top_p <= 1))
        return oai_fail(c, 400, "top_p", NULL, "top_p must be in (0, 1], got %g", q->top_p), -1;
    if (q->top_k < -1) return oai_fail(c, 400, "top_k", NULL, "top_k must be -1 or 0 (no limit) or >= 1"), -1;
    if (q->top_k == 0) q->top_k = -1;
    if (q->n < 1 || q->n > LIMIT_NUM_SAMPLES)
        return oai_fail(c, 400, "n", NULL, "n must be between 1 and %d, got %lld", LIMIT_NUM_SAMPLES, (long long)q->n), -1;
    if (q->top_logprobs < 0 || q->top_logprobs > LIMIT_TOPK_PROMPT_LOGPROBS)
        return oai_fail(c, 400, chat ? "top_logprobs" : "logprobs", NULL, "%s must be between 0 and %d",
                        chat ? "top_logprobs" : "logprobs", LIMIT_TOPK_PROMPT_LOGPROBS), -1;
    if (refuse_unsupported(c, b) < 0 || read_stop(c, b, q) < 0) return -1;
    return 0;
}

/* ---- prompts -------------------------------------------------------------------------------------- */

typedef struct {
    int32_t *ids[OAI_MAX_PROMPTS];
    size_t n[OAI_MAX_PROMPTS];
    int count;
} oai_prompts;

static void prompts_free(oai_prompts *p) {
    for (int i = 0; i < p->count; i++) free(p->ids[i]);
}

/* messages as the template takes them: text content (a string, or the text parts of a
 * list joined), the role "developer" read as "system". NULL with the answer sent. */
static json_t *template_messages(api_call *c, const json_t *msgs) {
    size_t n = json_array_size(msgs);
    if (!msgs || n == 0)
        return oai_fail(c, 400, "messages", NULL, "messages is required: a non-empty list of {\"role\", \"content\"}"),
               NULL;
    if (n > OAI_MAX_MESSAGES)
        return oai_fail(c, 400, "messages", NULL, "messages has %zu entries; at most %d", n, OAI_MAX_MESSAGES), NULL;
    json_t *out = json_array();
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i), *content = json_object_get(m, "content");
        const char *role = json_string_value(json_object_get(m, "role"));
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m) || !role) {
            json_decref(out);
            return oai_fail(c, 400, param, NULL, "%s: expected an object with a string \"role\"", param), NULL;
        }
        if (strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool")) {
            json_decref(out);
            return oai_fail(c, 400, param, NULL, "%s.role: unknown role \"%.40s\" (system, developer, user, assistant "
                            "or tool)", param, role), NULL;
        }
        strbuf text;
        sb_init(&text, 64);
        if (json_is_string(content)) {
            sb_append(&text, json_string_value(content), json_string_length(content));
        } else if (json_is_array(content)) {
            for (size_t k = 0; k < json_array_size(content); k++) {
                const json_t *part = json_array_get(content, k);
                const char *type = json_string_value(json_object_get(part, "type"));
                const json_t *t = json_object_get(part, "text");
                if (!type || strcmp(type, "text") || !json_is_string(t)) {
                    sb_free(&text);
                    json_decref(out);
                    return oai_fail(c, 400, param, NULL, "%s.content[%zu]: only text parts ({\"type\": \"text\", "
                                    "\"text\": ...}) are supported", param, k), NULL;
                }
                if (k) sb_putc(&text, '\n');
                sb_append(&text, json_string_value(t), json_string_length(t));
            }
        } else if (content && !json_is_null(content)) {
            sb_free(&text);
            json_decref(out);
            return oai_fail(c, 400, param, NULL, "%s.content: expected a string or a list of text parts, got %s",
                            param, jx_type_name(content)), NULL;
        }
        json_t *tm = json_pack("{s:s, s:s#}", "role", strcmp(role, "developer") ? role : "system", "content",
                               text.data ? text.data : "", text.len);
        sb_free(&text);
        const json_t *name = json_object_get(m, "name");
        if (json_is_string(name)) json_object_set(tm, "name", (json_t *)name);
        json_array_append_new(out, tm);
    }
    return out;
}

/* Token ids of a prompt given as ids: checked against the vocabulary. */
static int prompt_ids(api_call *c, const json_t *arr, const char *param, const oai_model *m, oai_prompts *p) {
    size_t n = json_array_size(arr);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) abort();
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        if (!jx_as_int(json_array_get(arr, i), &v) || v < 0 || v >= m->vocab) {
            free(ids);
            return oai_fail(c, 400, param, NULL, "%s[%zu]: token ids are integers in [0, %lld)", param, i,
                            (long long)m->vocab), -1;
        }
        ids[i] = (int32_t)v;
    }
    p->ids[p->count] = ids;
    p->n[p->count++] = n;
    return 0;
}

/* text as /v1/completions encodes it: the tokenizer's special prefix (Llama 3's
 * <|begin_of_text|>), then the text, as vLLM and transformers' tokenizer(text) do. chat:
 * the rendered template, encoded as is (the template carries its own specials). */
static int prompt_text(api_call *c, const api_tokenizer *t, const char *text, size_t len, bool chat, oai_prompts *p) {
    int32_t *ids;
    size_t n, pre_n = 0;
    const int32_t *pre = chat ? NULL : tok_special_prefix(t->tok, &pre_n);
    if (tok_encode(t->tok, text, len, &ids, &n, NULL, c->err, sizeof c->err) < 0)
        return oai_fail(c, 500, NULL, NULL, "tokenizer: %s", c->err), -1;
    int32_t *all = malloc((n + pre_n + 1) * sizeof *all);
    if (!all) abort();
    if (pre_n) memcpy(all, pre, pre_n * sizeof *all);
    memcpy(all + pre_n, ids, n * sizeof *all);
    free(ids);
    p->ids[p->count] = all;
    p->n[p->count++] = n + pre_n;
    return 0;
}

static int read_prompts(api_call *c, const oai_req *q, const api_tokenizer *t, const oai_model *m, oai_prompts *p) {
    memset(p, 0, sizeof p[0]);
    if (q->chat) {
        if (!t->chat)
            return oai_fail(c, 400, "messages", "no_chat_template", "base model %.200s has no chat template "
                            "(tokenizer_config.json chat_template): use /v1/completions with a prompt instead",
                            m->base_model), -1;
        json_t *msgs = template_messages(c, q->messages);
        if (!msgs) return -1;
        char *text;
        size_t len;
        int rc = chat_template_render(t->chat, msgs, q->add_generation_prompt, q->template_kwargs, &text, &len, c->err,
                                      sizeof c->err);
        json_decref(msgs);
        if (rc < 0) return oai_fail(c, 400, "messages", "chat_template_error", "chat template: %s", c->err), -1;
        rc = prompt_text(c, t, text, len, true, p);
        free(text);
        return rc;
    }
    const json_t *pr = q->prompt;
    if (json_is_string(pr)) return prompt_text(c, t, json_string_value(pr), json_string_length(pr), false, p);
    if (!json_is_array(pr) || json_array_size(pr) == 0)
        return oai_fail(c, 400, "prompt", NULL, "prompt is required: a string, a list of strings, a list of token "
                        "ids or a list of such lists"), -1;
    const json_t *first = json_array_get(pr, 0);
    if (json_is_integer(first) || json_is_real(first)) return prompt_ids(c, pr, "prompt", m, p);
    if (json_array_size(pr) > OAI_MAX_PROMPTS)
        return oai_fail(c, 400, "prompt", NULL, "prompt has %zu prompts; at most %d in one request",
                        json_array_size(pr), OAI_MAX_PROMPTS), -1;
    for (size_t i = 0; i < json_array_size(pr); i++) {
        const json_t *e = json_array_get(pr, i);
        char param[32];
        snprintf(param, sizeof param, "prompt[%zu]", i);
        if (!json_is_string(e) && !json_is_array(e))
            return oai_fail(c, 400, param, NULL, "%s: expected a string or a list of token ids", param), -1;
        int rc = json_is_string(e) ? prompt_text(c, t, json_string_value(e), json_string_length(e), false, p)
                                   : prompt_ids(c, e, param, m, p);
        if (rc < 0) return -1;
    }
    return 0;
}

/* ---- accepting a completion ------------------------------------------------------------------------- */

/* The operation's payload: asample's, with "progress" and "top_logprobs" (contract/sample_payload.h). */
static char *payload_of(const oai_req *q, const oai_model *m, const oai_prompts *p, int i, int64_t max_tokens,
                        int64_t seed, const int32_t *stop_ids, size_t nstop_ids) {
    int64_t stops[8];
    sample_payload r = {.num_samples = q->n, .max_tokens = max_tokens, .has_max_tokens = true,
                        .temperature = q->temperature, .top_p = q->top_p, .top_k = q->top_k, .seed = seed,
                        .stop_strings = q->nstop ? (const char **)q->stop : NULL, .n_stop_strings = (size_t)q->nstop,
                        .n_prompt = p->n[i], .n_stop_tokens = nstop_ids, .source = *m->path ? "checkpoint" : "base",
                        .blob_digest = *m->path ? m->digest : NULL, .progress = true,
                        .top_logprobs = q->logprobs ? q->top_logprobs : 0};
    r.prompt = malloc((p->n[i] + 1) * sizeof *r.prompt);
    if (!r.prompt) abort();
    for (size_t k = 0; k < p->n[i]; k++) r.prompt[k] = p->ids[i][k];
    for (size_t k = 0; k < nstop_ids && k < 8; k++) stops[k] = stop_ids[k];
    r.stop_tokens = nstop_ids ? stops : NULL;
    char *pl = sample_payload_encode(&r, NULL);
    free(r.prompt);
    return pl;
}

/* Inserts the operations under the tenant's bounds, in one transaction. 0 with the
 * request ids in s; else the answer is sent and -1. */
static int submit(api_call *c, const oai_req *q, const oai_model *m, const oai_prompts *p, int64_t max_tokens,
                  int64_t seed, const int32_t *stop_ids, size_t nstop_ids, oai_spec *s) {
    char tid[24], lim[24], qlim[24];
    api_fmt_i64(tid, c->tenant_id);
    api_fmt_i64(lim, c->settings->max_streams);
    api_fmt_i64(qlim, c->settings->max_queued_samples + 1);
    const char *pt[1] = {tid}, *pl[2] = {tid, lim}, *pq[2] = {tid, qlim};
    PGresult *r = NULL;
    if (db_begin(c->db, c->err, sizeof c->err) < 0 || db_exec(c->db, SQL_OAI_TENANT_LOCK, 1, pt, c->err, sizeof c->err) < 0 ||
        !(r = db_query(c->db, SQL_OAI_LIVE, 2, pl, c->err, sizeof c->err)))
        goto dberr;
    int64_t live = db_int(r, 0, 0);
    PQclear(r);
    if (live + p->count > c->settings->max_streams) {
        db_rollback(c->db);
        c->job->retry_after = 1;
        return oai_fail(c, 429, NULL, "rate_limit_exceeded", "this tenant has %lld OpenAI requests in flight (the "
                        "limit is %lld, loom api --max-streams); retry when one ends", (long long)live,
                        (long long)c->settings->max_streams), -1;
    }
    if (!(r = db_query(c->db, SQL_TENANT_QUEUED_SAMPLES, 2, pq, c->err, sizeof c->err))) goto dberr;
    int64_t queued = db_int(r, 0, 0);
    PQclear(r);
    if (queued > c->settings->max_queued_samples) {
        db_rollback(c->db);
        c->job->retry_after = 1;
        return oai_fail(c, 429, NULL, "rate_limit_exceeded", "too many sample requests queued for this tenant (more "
                        "than %lld); retry in a moment", (long long)c->settings->max_queued_samples), -1;
    }
    const char *ps[4] = {tid, m->base_model, *m->path ? m->path : NULL, *m->version_id ? m->version_id : NULL};
    if (!(r = db_query(c->db, SQL_OAI_SAMPLER, 4, ps, c->err, sizeof c->err))) goto dberr;
    char sid[512];
    snprintf(sid, sizeof sid, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    for (int i = 0; i < p->count; i++) {
        char *payload = payload_of(q, m, p, i, max_tokens, seed, stop_ids, nstop_ids), ntok[24];
        api_fmt_i64(ntok, q->n * ((int64_t)p->n[i] + max_tokens));
        op_new_request_id(s->request_ids[i]);
        const char *ip[6] = {s->request_ids[i], tid, sid, NULL, payload, ntok};
        r = db_query(c->db, SQL_SAMPLE_INSERT, 6, ip, c->err, sizeof c->err);
        free(payload);
        if (!r) goto dberr;
        PQclear(r);
    }
    if (db_commit_notify(c->db, CHAN_OP_QUEUED, NULL, c->err, sizeof c->err) < 0) goto dberr;
    return 0;
dberr:
    db_rollback(c->db);
    api_db_error(c, q->chat ? "chat completion" : "completion", c->err);
    return -1;
}

static int completion(api_call *c, bool chat) {
    oai_req q;
    oai_model m;
    oai_prompts p = {0};
    if (read_request(c, chat, &q) < 0 || resolve_model(c, q.model, &m) < 0) return 0;
    const api_tokenizer *t = api_tokenizer_for(c, m.base_model);
    if (!t || read_prompts(c, &q, t, &m, &p) < 0) {
        prompts_free(&p);
        return 0;
    }
    int64_t max_tokens = q.max_tokens, prompt_tokens = 0;
    for (int i = 0; i < p.count; i++) {
        int64_t room = m.max_context - (int64_t)p.n[i];
        prompt_tokens += (int64_t)p.n[i];
        const char *param = q.has_max_tokens ? "max_tokens" : chat ? "messages" : "prompt";
        if (p.n[i] == 0 || room < 1 || (q.has_max_tokens && q.max_tokens > room)) {
            oai_fail(c, 400, param, "context_length_exceeded", "This model's maximum context length is %lld tokens. "
                     "However, you requested %lld tokens (%zu in the %s, %lld in the completion).%s",
                     (long long)m.max_context, (long long)p.n[i] + (q.has_max_tokens ? q.max_tokens : 1), p.n[i],
                     chat ? "messages" : "prompt", (long long)(q.has_max_tokens ? q.max_tokens : 1),
                     p.n[i] == 0 ? " The prompt is empty." : " Shorten the prompt or lower max_tokens.");
            prompts_free(&p);
            return 0;
        }
        if (!q.has_max_tokens) {
            int64_t d = room < OAI_DEFAULT_MAX_TOKENS ? room : OAI_DEFAULT_MAX_TOKENS;
            if (d > c->settings->openai_max_tokens) d = c->settings->openai_max_tokens;
            if (i == 0 || d < max_tokens) max_tokens = d;
        }
    }
    if (q.n * max_tokens > OAI_MAX_ANSWER_TOKENS) {
        prompts_free(&p);
        return oai_fail(c, 400, "n", NULL, "n x max_tokens is %lld; at most %d tokens are generated for one prompt "
                        "(lower n or max_tokens)", (long long)(q.n * max_tokens), OAI_MAX_ANSWER_TOKENS);
    }
    int64_t seed = q.seed;
    if (!q.has_seed) {
        uint64_t r;
        randombytes_buf(&r, sizeof r);
        seed = (int64_t)(r & ((UINT64_C(1) << 48) - 1));   /* exact in any JSON reader */
    }
    /* Chat ends at the template's end of the assistant's turn too (ChatML's <|im_end|>,
     * Llama 3's <|eot_id|>), which the model's config.json may not list among its EOS ids. */
    int32_t stop_ids[2] = {0};
    size_t nstop_ids = 0;
    for (int i = 0; chat && i < t->n_turn_end; i++) stop_ids[nstop_ids++] = t->turn_end[i];

    oai_spec *s = calloc(1, sizeof *s);
    if (!s) abort();
    if (submit(c, &q, &m, &p, max_tokens, seed, stop_ids, nstop_ids, s) < 0) {
        free(s);
        prompts_free(&p);
        return 0;
    }
    s->kind = OAI_ANSWER;
    s->chat = chat;
    s->stream = q.stream;
    s->include_usage = q.include_usage;
    s->token_ids = q.token_ids;
    s->n = (int)q.n;
    s->nprompts = p.count;
    s->prompt_tokens = (int)prompt_tokens;
    s->logprobs = q.logprobs ? (int)q.top_logprobs : -1;
    unsigned char rnd[12];
    randombytes_buf(rnd, sizeof rnd);
    char hex[25];
    sodium_bin2hex(hex, sizeof hex, rnd, sizeof rnd);
    snprintf(s->id, sizeof s->id, "%s-%s", chat ? "chatcmpl" : "cmpl", hex);
    s->created = (int64_t)time(NULL);
    s->model = strdup(q.model);
    s->tenant_id = c->tenant_id;
    s->tok = t;
    for (int i = 0; i < q.nstop; i++) {
        s->stop[i] = strdup(q.stop[i]);
        s->stop_len[i] = strlen(q.stop[i]);
        if (s->stop_len[i] > s->stop_max) s->stop_max = s->stop_len[i];
    }
    s->nstop = q.nstop;
    prompts_free(&p);
    c->job->loop_ext = &oai_loop_ext;
    c->job->ext = s;
    return api_reply_text(c, 200, "{}");   /* the loop answers (api_openai_stream.c) */
}

int api_h_oai_completions(api_call *c) { return completion(c, false); }
int api_h_oai_chat(api_call *c) { return completion(c, true); }

/* ---- the loop's own looks ----------------------------------------------------------------------------- */

int api_h_oai_internal(api_call *c) {
    oai_spec *s = c->job->ext;
    char tid[24];
    api_fmt_i64(tid, s->tenant_id);
    const char *p[2] = {s->fetch_id, tid};
    if (s->kind == OAI_CANCEL) {
        if (db_exec(c->db, SQL_OAI_CANCEL, 2, p, c->err, sizeof c->err) < 0)
            log_warn("openai: canceling %s: %s", s->fetch_id, c->err);
        return api_reply_text(c, 200, "{}");
    }
    PGresult *r = db_query(c->db, SQL_OAI_FETCH, 2, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "openai result", c->err);
    if (!PQntuples(r)) {
        PQclear(r);
        return api_reply_text(c, 200, "{\"state\": \"failed\", \"error\": \"the operation vanished\"}");
    }
    api_reply_text(c, 200, PQgetvalue(r, 0, 0));
    PQclear(r);
    return 0;
}

/* ---- aliases ------------------------------------------------------------------------------------------ */

int api_h_aliases_list(api_call *c) {
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *p[1] = {tid};
    return api_reply_sql_json(c, "aliases", SQL_OAI_ALIASES, 1, p, "nothing to list");
}

int api_h_alias_put(api_call *c) {
    const char *alias = api_path_id(c), *path;
    if (jx_req_str(c->body, "", "model_path", &path, c->err, sizeof c->err) < 0) return api_error(c, 400, "%s", c->err);
    size_t n = strlen(alias);
    bool ok = n >= 1 && n <= 128 && strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", alias[0]);
    for (size_t i = 0; ok && i < n; i++)
        ok = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-", alias[i]) != NULL;
    if (!ok)
        return api_error(c, 400, "alias \"%.200s\": 1-128 letters, digits, '.', '_', ':' or '-', starting with a "
                         "letter or digit", alias);
    char tid[24];
    api_fmt_i64(tid, c->tenant_id);
    const char *bp[1] = {alias};
    PGresult *r = db_query(c->db, SQL_BASE_MODEL_GET, 1, bp, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "alias", c->err);
    bool base = PQntuples(r) > 0;
    PQclear(r);
    if (base) return api_error(c, 400, "alias \"%.200s\" is the name of a base model; choose another", alias);
    const char *op[2] = {path, tid};
    if (!(r = db_query(c->db, SQL_OAI_OWNED_CHECKPOINT, 2, op, c->err, sizeof c->err)))
        return api_db_error(c, "alias", c->err);
    bool owned = PQntuples(r) > 0;
    PQclear(r);
    if (!owned)
        return api_error(c, 404, "checkpoint %.300s not found among your live checkpoints (an alias names a "
                         "checkpoint of your own)", path);
    if (reg_alias_set(c->db, c->tenant_id, alias, path, c->err, sizeof c->err) < 0)
        return api_db_error(c, "alias", c->err);
    return api_reply_json(c, 200, json_pack("{s:s, s:s}", "alias", alias, "model_path", path));
}

int api_h_alias_delete(api_call *c) {
    const char *alias = api_path_id(c);
    int n = reg_alias_delete(c->db, c->tenant_id, alias, c->err, sizeof c->err);
    if (n < 0) return api_db_error(c, "alias", c->err);
    if (!n) return api_error(c, 404, "alias %.200s not found", alias);
    return api_reply_json(c, 200, json_pack("{s:s, s:b}", "alias", alias, "deleted", 1));
}
