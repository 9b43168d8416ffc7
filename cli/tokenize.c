/* tokenize.c — `loom tokenize --model-dir DIR [TEXT]`: what Loom feeds a model for a text
 * or a conversation, to check a model directory's tokenizer.json and chat template (and
 * for the tests, which compare it with Hugging Face's reference implementations).
 *
 * With TEXT: prints {"ids": [...], "tokens": [...]} for it. Without: reads JSON lines on
 * stdin and answers one JSON line each:
 *   {"text": S [, "add_special_tokens": B]}          -> {"ids": [...]}
 *   {"decode": [ids]}                                -> {"text": S}
 *   {"messages": [...] [, "add_generation_prompt": B] [, "kwargs": {...}]}
 *                                                    -> {"text": rendered, "ids": [...]}
 * and {"error": "..."} for a request it cannot serve. Decoded text that is not valid UTF-8
 * (a token sequence cut inside a character) has U+FFFD in place of the bad bytes, as
 * Hugging Face's decode gives. */
#include "cli/tokenize.h"
#include "common/config.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define TZ_MAX_LINE (64u << 20)

/* Bytes as a JSON string, invalid UTF-8 replaced by U+FFFD. */
static json_t *tz_lossy(const char *s, size_t n)
{
    char *o = malloc(3 * n + 1);
    if (!o) return NULL;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
        if (l < 1) { memcpy(o + m, "\xEF\xBF\xBD", 3); m += 3; i++; continue; }
        memcpy(o + m, s + i, (size_t)l);
        m += (size_t)l;
        i += (size_t)l;
    }
    json_t *j = json_stringn(o, m);
    free(o);
    return j;
}

static json_t *tz_ids(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* Encodes text, with the post-processor's special tokens when specials is set. */
static json_t *tz_encode(const tokenizer *t, const char *text, size_t len, bool specials, char *err, size_t errlen)
{
    int32_t *ids;
    size_t n, np = 0, ns = 0;
    if (tok_encode(t, text, len, &ids, &n, NULL, err, errlen) < 0) return NULL;
    const int32_t *pre = specials ? tok_special_prefix(t, &np) : NULL, *suf = specials ? tok_special_suffix(t, &ns) : NULL;
    json_t *a = tz_ids(pre, np), *body = tz_ids(ids, n), *post = tz_ids(suf, ns);
    json_array_extend(a, body);
    json_array_extend(a, post);
    json_decref(body);
    json_decref(post);
    free(ids);
    return a;
}

/* One request line → one answer object. The chat template is loaded on first use. */
static json_t *tz_serve(const tokenizer *t, const char *dir, chat_template **ct, const char *line, size_t len)
{
    char err[512] = "";
    json_error_t je;
    json_t *req = json_loadb(line, len, 0, &je), *ans = NULL;
    if (!json_is_object(req)) {
        json_decref(req);
        return json_pack("{s:s+}", "error", "not a JSON object: ", je.text);
    }
    json_t *text = json_object_get(req, "text"), *dec = json_object_get(req, "decode"),
           *msgs = json_object_get(req, "messages");
    if (json_is_string(text)) {
        json_t *ids = tz_encode(t, json_string_value(text), json_string_length(text),
                                json_is_true(json_object_get(req, "add_special_tokens")), err, sizeof err);
        if (ids) ans = json_pack("{s:o}", "ids", ids);
    } else if (json_is_array(dec)) {
        size_t n = json_array_size(dec);
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        char *out = NULL;
        size_t olen;
        for (size_t i = 0; ids && i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(dec, i));
        if (ids && tok_decode(t, ids, n, &out, &olen) == 0) ans = json_pack("{s:o}", "text", tz_lossy(out, olen));
        else snprintf(err, sizeof err, "out of memory");
        free(ids);
        free(out);
    } else if (json_is_array(msgs)) {
        if (!*ct) *ct = chat_template_load(dir, err, sizeof err);
        char *out = NULL;
        size_t olen;
        if (*ct && chat_template_render(*ct, msgs, json_is_true(json_object_get(req, "add_generation_prompt")),
                                        json_object_get(req, "kwargs"), &out, &olen, err, sizeof err) == 0) {
            json_t *ids = tz_encode(t, out, olen, false, err, sizeof err);
            if (ids) ans = json_pack("{s:o, s:o}", "text", tz_lossy(out, olen), "ids", ids);
        }
        free(out);
    } else snprintf(err, sizeof err, "expected \"text\", \"decode\" or \"messages\"");
    json_decref(req);
    return ans ? ans : json_pack("{s:s}", "error", err);
}

static void tz_print(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    if (s) puts(s);
    free(s);
    json_decref(j);
    fflush(stdout);
}

static const opt_spec TZ_OPTS[] = {
    {.name = "model-dir", .kind = OPT_STR, .arg = "DIR",
     .help = "a model directory with tokenizer.json (and a chat template); default: the model `loom up` "
             "generates, <data-dir>/models/tiny-llama"},
    {0}};
static const cfg_cmd TZ_CMD = {
    .cmd = "loom tokenize", .synopsis = "[--model-dir DIR] [TEXT]",
    .about = "TEXT: prints its token ids and pieces. Without TEXT: JSON lines on stdin,\n"
             "{\"text\": S}, {\"decode\": [ids]} or {\"messages\": [...], \"add_generation_prompt\": true},\n"
             "one JSON answer per line on stdout.",
    .tables = {TZ_OPTS, CFG_DATA_DIR}, .max_pos = 1};

int tokenize_main(int argc, char **argv)
{
    cfg o;
    int rc = 0;
    if (!cfg_parse(&TZ_CMD, argc, argv, &o, &rc)) return rc;
    const char *dir = cfg_str(&o, "model-dir"), *text = o.npos ? o.pos[0] : NULL;
    char path[4096], err[512], def[4096];
    /* Without --model-dir: the default model of `loom up` on this data directory, found
     * as every command finds the data directory. */
    if (!dir) {
        char data[4000];
        cfg_data_dir(&o, data, sizeof data);
        snprintf(def, sizeof def, "%s/models/tiny-llama", data);
        dir = def;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    tokenizer *t = tok_load(path, err, sizeof err);
    if (!t) {
        fprintf(stderr, "loom tokenize: %s%s\n", err,
                cfg_str(&o, "model-dir") ? "" : " (the default model, which `loom up` generates on its first start; "
                                                 "--model-dir DIR names another)");
        return 1;
    }
    if (!tok_exact(t)) fprintf(stderr, "loom tokenize: warning: this pre-tokenizer is approximated\n");
    chat_template *ct = NULL;
    if (text) {
        json_t *ids = tz_encode(t, text, strlen(text), false, err, sizeof err), *pieces = json_array();
        for (size_t i = 0; ids && i < json_array_size(ids); i++) {
            size_t l = 0;
            const char *p = tok_token_to_piece(t, (int32_t)json_integer_value(json_array_get(ids, i)), &l);
            json_array_append_new(pieces, tz_lossy(p ? p : "", l));
        }
        if (ids) tz_print(json_pack("{s:o, s:o}", "ids", ids, "tokens", pieces));
        else { fprintf(stderr, "loom tokenize: %s\n", err); json_decref(pieces); rc = 1; }
    } else {
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        while ((n = getline(&line, &cap, stdin)) > 0) {
            if (line[n - 1] == '\n') n--;
            if (n == 0) continue;
            if ((size_t)n > TZ_MAX_LINE) { tz_print(json_pack("{s:s}", "error", "request line too long")); continue; }
            tz_print(tz_serve(t, dir, &ct, line, (size_t)n));
        }
        free(line);
    }
    chat_template_free(ct);
    tok_free(t);
    return rc;
}
