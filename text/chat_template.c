/* chat_template.c — renders chat templates as transformers' apply_chat_template does (see
 * chat_template.h): the Hugging Face side (tokenizer_config.json, chat_template.jinja, the
 * variables a template sees) over a small interpreter of the Jinja2 subset that Hugging
 * Face chat templates use (text/jinja.h and jinja_*.c).
 *
 * Why our own: Debian packages no Jinja2 implementation for C (nor does any C library
 * of this kind exist that is kept up), and recognising templates by their text would
 * break on every variant a fine-tune ships. The subset is small: the templates of the
 * Llama 3.x, Qwen2/2.5/3 and ChatML families use if/for/set, a dozen filters and tests,
 * a few string methods and namespace().
 */
#include "text/chat_template.h"
#include "text/jinja.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct chat_template {
    chunk *arena;  /* the parse tree and the tokens' strings */
    char *source;
    node **body;
    int nbody;
    json_t *vars;
};

void chat_template_free(chat_template *ct)
{
    if (!ct) return;
    ct_arena_free(ct->arena);
    free(ct->source);
    json_decref(ct->vars);
    free(ct);
}

chat_template *chat_template_parse(const char *source, const json_t *vars, char *err, size_t errlen)
{
    chat_template *volatile ct = calloc(1, sizeof *ct);
    ct_env *e = calloc(1, sizeof *e);
    if (!ct || !e || !(ct->source = strdup(source)) ||
        !(ct->vars = vars ? json_deep_copy(vars) : json_object())) {
        snprintf(err, errlen, "chat template: out of memory");
        free(e);
        chat_template_free(ct);
        return NULL;
    }
    e->arena = &ct->arena;
    if (setjmp(e->jb)) {
        snprintf(err, errlen, "%s", e->msg);
        free(e);
        chat_template_free(ct);
        return NULL;
    }
    ct->body = ct_parse(e, ct_lex(e, ct->source, strlen(ct->source)), &ct->nbody);
    free(e);
    return ct;
}

int chat_template_render(const chat_template *ct, const json_t *messages, bool add_generation_prompt,
                         const json_t *kwargs, char **out, size_t *out_len, char *err, size_t errlen)
{
    if (!json_is_array(messages)) { snprintf(err, errlen, "chat template: messages must be an array"); return -1; }
    if (kwargs && !json_is_object(kwargs)) { snprintf(err, errlen, "chat template: kwargs must be an object"); return -1; }
    /* everything that changes between setjmp and longjmp lives on the heap */
    ct_env *e = calloc(1, sizeof *e);
    render *R = calloc(1, sizeof *R);
    if (!e || !R) {
        free(e);
        free(R);
        snprintf(err, errlen, "chat template: out of memory");
        return -1;
    }
    e->arena = &e->own;
    R->e = e;
    R->out = &R->result;
    int rc = -1;
    if (setjmp(e->jb)) {
        snprintf(err, errlen, "%s", e->msg);
        free(R->result.p);
        goto done;
    }
    scope *root = ct_alloc(e, sizeof *root);
    root->up = NULL;
    root->vars = ct_dict_new(e);
    ct_add_globals(e, root->vars);
    const char *k;
    json_t *x;
    json_object_foreach(ct->vars, k, x) ct_dict_set(e, root->vars, ct_str_dup(e, k, strlen(k)), ct_from_json(e, x));
    ct_dict_set(e, root->vars, S("tools"), none);
    ct_dict_set(e, root->vars, S("documents"), none);
    json_object_foreach((json_t *)kwargs, k, x) {
        if (!strcmp(k, "messages") || !strcmp(k, "add_generation_prompt"))
            ct_fail(e, 0, "'%s' cannot be passed as an extra variable", k);
        ct_dict_set(e, root->vars, ct_str_dup(e, k, strlen(k)), ct_from_json(e, x));
    }
    ct_dict_set(e, root->vars, S("messages"), ct_from_json(e, messages));
    ct_dict_set(e, root->vars, S("add_generation_prompt"), mk_bool(add_generation_prompt));
    R->sc = root;
    ct_exec(R, ct->body, ct->nbody);
    *out = R->result.p;
    if (out_len) *out_len = R->result.n;
    rc = 0;
done:
    ct_arena_free(e->own);
    free(e);
    free(R);
    return rc;
}

const char *chat_template_var(const chat_template *ct, const char *name)
{
    return json_string_value(json_object_get(ct->vars, name));
}

/* A special token of tokenizer_config.json: a string, or an AddedToken object. */
static const char *token_content(json_t *v)
{
    if (json_is_string(v)) return json_string_value(v);
    return json_string_value(json_object_get(v, "content"));
}

static char *read_small_file(const char *path, size_t max)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = malloc(max + 1);
    size_t n = s ? fread(s, 1, max + 1, f) : 0;
    fclose(f);
    if (!s || n > max) { free(s); return NULL; }
    s[n] = 0;
    return s;
}

chat_template *chat_template_load(const char *model_dir, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je); /* model_max_length may exceed int64 */
    if (!cfg) {
        snprintf(err, errlen, "chat template: cannot read %s: %s", path, je.text);
        return NULL;
    }
    json_t *vars = json_object();
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                                        "mask_token"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *c = token_content(json_object_get(cfg, names[i]));
        if (c) json_object_set_new(vars, names[i], json_string(c));
    }
    json_t *extra = json_object_get(cfg, "additional_special_tokens");
    if (json_is_array(extra)) {
        json_t *l = json_array(), *v;
        size_t i;
        json_array_foreach(extra, i, v) if (token_content(v)) json_array_append_new(l, json_string(token_content(v)));
        json_object_set_new(vars, "additional_special_tokens", l);
    }
    snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir);
    char *src = read_small_file(path, 1 << 20);
    json_t *tpl = json_object_get(cfg, "chat_template");
    if (!src && json_is_array(tpl)) { /* named templates: the default one */
        json_t *v;
        size_t i;
        json_array_foreach(tpl, i, v) if (json_is_string(json_object_get(v, "name")) &&
                                          !strcmp(json_string_value(json_object_get(v, "name")), "default"))
            src = strdup(json_string_value(json_object_get(v, "template")) ? json_string_value(json_object_get(v, "template")) : "");
    } else if (!src && json_is_string(tpl)) src = strdup(json_string_value(tpl));
    chat_template *ct = NULL;
    if (!src) snprintf(err, errlen, "chat template: %s has no chat_template (nor chat_template.jinja)", model_dir);
    else ct = chat_template_parse(src, vars, err, errlen);
    free(src);
    json_decref(vars);
    json_decref(cfg);
    return ct;
}
