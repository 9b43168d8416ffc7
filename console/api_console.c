/* api_console.c: the web console's files and its JSON routes (see api_console.h). The
 * statements are in console_sql.h (shared with `loom status`). */
#include "console/api_console.h"
#include "common/db.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "console/api_console_files.h"
#include "core/api_json.h"
#include "tinker/api_state.h"
#include "tinker/api_weights.h"
#include "console/console_sql.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- files ------------------------------------------------------------------------------ */

void api_console_static(const char *path, size_t plen, api_static *out) {
    memset(out, 0, sizeof *out);
    /* "/" and "/console" lead to "/console/" (relative, so a --path-prefix is kept), whose
     * relative asset links then resolve under it. */
    if ((plen == 1 && path[0] == '/') || (plen == 8 && !memcmp(path, "/console", 8))) {
        out->status = 302;
        out->type = "text/plain; charset=utf-8";
        out->body = "the web console is at console/\n";
        out->len = strlen(out->body);
        out->location = plen == 1 ? "console/" : "console/";
        return;
    }
    const char *name = plen > 9 ? path + 9 : "index.html";   /* after "/console/" */
    size_t nlen = plen > 9 ? plen - 9 : strlen(name);
    for (const api_console_file *f = api_console_files; f->name; f++) {
        if (strlen(f->name) == nlen && !memcmp(f->name, name, nlen)) {
            out->status = 200;
            out->type = f->type;
            out->body = f->data;
            out->len = f->len;
            return;
        }
    }
    out->status = 404;
    out->body = "no such file of the web console";
}

/* ---- helpers ------------------------------------------------------------------------------ */

/* ?name= as an integer in [lo, hi] (def when absent) into out; 0, or the 400 is answered. */
static int int_param(api_call *c, const char *name, long def, long lo, long hi, char out[24]) {
    char v[32];
    long x = def;
    if (api_query_param(c, name, v, sizeof v)) {
        char *end;
        x = strtol(v, &end, 10);
        if (!*v || *end || x < lo || x > hi)
            return api_error(c, 400, "%s must be an integer between %ld and %ld, got \"%.20s\"", name, lo, hi, v), -1;
    }
    api_fmt_i64(out, x);
    return 0;
}

/* ---- tenant routes ------------------------------------------------------------------------ */

int api_h_console_whoami(api_call *c) {
    json_t *scopes = json_array();
    static const char *const names[] = {"train", "sample", "read", "admin", "metrics"};
    for (unsigned i = 0; i < 5; i++)
        if (c->scopes & (1u << i)) json_array_append_new(scopes, json_string(names[i]));
    return api_reply_json(c, 200, json_pack("{s:s, s:I, s:o, s:b}", "tenant", c->job->tenant_name, "tenant_id",
                                            (json_int_t)c->tenant_id, "scopes", scopes, "operator",
                                            (c->scopes & SCOPE_ADMIN) != 0));
}

int api_h_console_runs(api_call *c) {
    char tid[24], limit[24], offset[24];
    if (int_param(c, "limit", 50, 1, 500, limit) < 0 || int_param(c, "offset", 0, 0, 1 << 30, offset) < 0) return 0;
    api_fmt_i64(tid, c->tenant_id);
    const char *p[3] = {tid, limit, offset};
    return api_reply_sql_json(c, "console runs", SQL_CON_RUNS, 3, p, "nothing to list");
}

int api_h_console_run(api_call *c) {
    char tid[24], msg[300];
    const char *id = api_path_id(c);
    api_fmt_i64(tid, c->tenant_id);
    snprintf(msg, sizeof msg, "training run %.200s not found", id);
    const char *p[2] = {id, tid};
    return api_reply_sql_json(c, "console run", SQL_CON_RUN, 2, p, msg);
}

int api_h_console_checkpoints(api_call *c) {
    char tid[24], limit[24];
    if (int_param(c, "limit", 200, 1, 1000, limit) < 0) return 0;
    api_fmt_i64(tid, c->tenant_id);
    const char *p[2] = {limit, tid};
    return api_reply_sql_json(c, "console checkpoints", SQL_CON_CHECKPOINTS, 2, p, "nothing to list");
}

int api_h_console_download_link(api_call *c) {
    char path[1024], fmt[16] = "tinker";
    if (!api_query_param(c, "path", path, sizeof path) || !*path)
        return api_error(c, 400, "path is required: the checkpoint's tinker:// path");
    if (api_query_param(c, "format", fmt, sizeof fmt) && strcmp(fmt, "tinker") && strcmp(fmt, "peft"))
        return api_error(c, 400, "format must be tinker (default) or peft, got \"%.30s\"", fmt);
    char *url, exp_iso[32], exp_http[64];
    if (api_archive_link(c, path, fmt, &url, exp_iso, exp_http) < 0) return 0;
    json_t *v = json_pack("{s:s, s:s}", "url", url, "expires", exp_iso);
    free(url);
    return api_reply_json(c, 200, v);
}

/* ---- the playground's tokenizer (api_tokenizer_for, tinker/api_state.h) -------------------- */

#define MAX_TEXT (64 * 1024)
#define MAX_IDS 65536

/* POST {base_model, text, chat}: the prompt's token ids, its text, and stop_tokens. chat:
 * the text as one user message through the model's chat template, ready for the
 * assistant's answer, and stop_tokens the ids that end that answer; else the text as
 * Hugging Face's tokenizer(text) encodes it (with the model's special prefix), and no
 * stop_tokens. */
int api_h_console_tokenize(api_call *c) {
    const char *bm, *text;
    bool chat;
    if (jx_req_str(c->body, "", "base_model", &bm, c->err, sizeof c->err) < 0 ||
        jx_str(c->body, "", "text", &text, c->err, sizeof c->err) < 0 ||
        jx_bool(c->body, "", "chat", false, &chat, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    if (!text) text = "";
    if (strlen(text) > MAX_TEXT) return api_error(c, 400, "text is longer than %d bytes", MAX_TEXT);
    const api_tokenizer *e = api_tokenizer_for(c, bm);
    if (!e) return 0;
    char *rendered = NULL;
    size_t pre_n = 0;
    const int32_t *pre = NULL;
    if (chat) {
        if (!e->chat) return api_error(c, 400, "base model %.200s has no chat template; untick chat", bm);
        json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", text);
        int rc = chat_template_render(e->chat, msgs, true, NULL, &rendered, NULL, c->err, sizeof c->err);
        json_decref(msgs);
        if (rc < 0) return api_error(c, 400, "chat template: %s", c->err);
        text = rendered;
    } else {
        pre = tok_special_prefix(e->tok, &pre_n);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tok_encode(e->tok, text, strlen(text), &ids, &n, NULL, c->err, sizeof c->err);
    json_t *arr = json_array(), *shown = json_string(text);
    free(rendered);
    if (rc < 0) {
        json_decref(arr);
        json_decref(shown);
        return api_error(c, 500, "tokenizer: %s", c->err);
    }
    for (size_t i = 0; i < pre_n; i++) json_array_append_new(arr, json_integer(pre[i]));
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    /* A chat prompt's answer ends with the assistant's turn: the playground samples with
     * these as stop tokens, as /v1/chat/completions does. */
    json_t *stops = json_array();
    for (int i = 0; chat && i < e->n_turn_end; i++) json_array_append_new(stops, json_integer(e->turn_end[i]));
    return api_reply_json(c, 200, json_pack("{s:o, s:o, s:o}", "ids", arr, "text", shown, "stop_tokens", stops));
}

/* POST {base_model, ids}: their text (bytes that are not UTF-8 become U+FFFD). */
int api_h_console_detokenize(api_call *c) {
    const char *bm;
    json_t *ids_j;
    if (jx_req_str(c->body, "", "base_model", &bm, c->err, sizeof c->err) < 0 ||
        jx_arr(c->body, "", "ids", &ids_j, c->err, sizeof c->err) < 0)
        return api_error(c, 400, "%s", c->err);
    size_t n = ids_j ? json_array_size(ids_j) : 0;
    if (n > MAX_IDS) return api_error(c, 400, "ids has %zu entries; at most %d", n, MAX_IDS);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) abort();
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        if (!jx_as_int(json_array_get(ids_j, i), &v) || v < 0 || v > INT32_MAX) {
            free(ids);
            return api_error(c, 400, "ids[%zu] must be a token id (a non-negative integer)", i);
        }
        ids[i] = (int32_t)v;
    }
    const api_tokenizer *e = api_tokenizer_for(c, bm);
    if (!e) {
        free(ids);
        return 0;
    }
    char *text;
    size_t len;
    int rc = tok_decode(e->tok, ids, n, &text, &len);
    free(ids);
    if (rc < 0) return api_error(c, 500, "tokenizer: out of memory");
    /* The JSON answer must be UTF-8, and a token may end inside a character: such bytes
     * become U+FFFD. */
    strbuf b;
    sb_init(&b, len + 16);
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq_len((const unsigned char *)text + i, len - i, NULL);
        if (k) sb_append(&b, text + i, k);
        else sb_puts(&b, "\xef\xbf\xbd");
        i += k ? k : 1;
    }
    json_t *s = json_stringn(b.data, b.len);
    sb_free(&b);
    free(text);
    return api_reply_json(c, 200, json_pack("{s:o}", "text", s));
}

/* ---- operator routes ------------------------------------------------------------------------ */

/* The folded totals first (tokens per tenant), then the overview. */
int api_h_console_admin_overview(api_call *c) {
    if (db_exec(c->db, SQL_CON_FOLD, 0, NULL, c->err, sizeof c->err) < 0)
        return api_db_error(c, "console overview", c->err);
    return api_reply_sql_json(c, "console overview", SQL_CON_ADMIN_OVERVIEW, 0, NULL, "nothing to show");
}

int api_h_console_admin_cycles(api_call *c) {
    char limit[24];
    if (int_param(c, "limit", 60, 1, 500, limit) < 0) return 0;
    const char *p[1] = {limit};
    return api_reply_sql_json(c, "console cycles", SQL_CON_ADMIN_CYCLES, 1, p, "nothing to show");
}
