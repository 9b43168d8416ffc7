/* chat_template.h — a model's chat template (the Jinja2 source in tokenizer_config.json
 * or chat_template.jinja) rendered for a conversation as transformers'
 * apply_chat_template renders it: the template sees `messages`, `add_generation_prompt`,
 * `tools` and `documents` (none), the tokenizer's special tokens (`bos_token`,
 * `eos_token`, `pad_token`, `unk_token`, `additional_special_tokens`) and extra keyword
 * arguments (e.g. Qwen3's `enable_thinking`); Jinja2 runs with trim_blocks and
 * lstrip_blocks, and drops one trailing newline of the template, as transformers sets it.
 *
 * The interpreter (text/jinja.h and the jinja_*.c beside it) covers the Jinja2 subset
 * chat templates use: text, {{ }}, {% if/elif/else %}, {% for %} (loop.*, else, filters,
 * two-name unpacking), {% set %} (names and namespace attributes), break/continue,
 * {% generation %}, comments and whitespace control; expressions with Python semantics
 * (strings, numbers, lists, dicts, slices, `in`, `~`, conditional expressions), the
 * filters, tests, string and dict methods and globals (namespace, range,
 * raise_exception, strftime_now) that the Llama 3.x, Qwen2/2.5/3 and ChatML templates
 * use. A template using anything else
 * (macros, includes, an unknown filter or test) is refused at load with the construct
 * and its line; a run-time problem (raise_exception in the template, a type error,
 * a limit) is an error from render.
 */
#ifndef LOOM_TEXT_CHAT_TEMPLATE_H
#define LOOM_TEXT_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct chat_template chat_template;

/* The template of a model directory: DIR/chat_template.jinja when present, else
 * DIR/tokenizer_config.json's "chat_template" (a string, or a list of {name, template}
 * from which "default" is taken), with that file's special tokens as variables. NULL with
 * err when the model has no chat template or Loom cannot render it. */
chat_template *chat_template_load(const char *model_dir, char *err, size_t errlen);

/* A template from source; vars (may be NULL): a JSON object of variables every render
 * sees (the special tokens). NULL with err. */
chat_template *chat_template_parse(const char *source, const json_t *vars, char *err, size_t errlen);

void chat_template_free(chat_template *ct);

/* Renders messages (a JSON array of objects with "role" and "content", as OpenAI's API
 * and HF's apply_chat_template take them; other fields are passed through) into *out
 * (malloc'd, NUL-terminated, *out_len bytes; out_len may be NULL). kwargs (may be NULL):
 * a JSON object of extra variables, e.g. {"enable_thinking": false}. 0, or -1 with err. */
int chat_template_render(const chat_template *ct, const json_t *messages, bool add_generation_prompt,
                         const json_t *kwargs, char **out, size_t *out_len, char *err, size_t errlen);

/* A string variable of the template (e.g. "eos_token", "bos_token"), or NULL. */
const char *chat_template_var(const chat_template *ct, const char *name);

#endif
