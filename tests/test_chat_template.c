/* test_chat_template.c — text/chat_template.c on Jinja2's semantics as transformers runs
 * it (trim_blocks, lstrip_blocks, Python values): whitespace control, loops and their
 * scoping, namespace, slices, filters, tests, string methods, errors and limits. The
 * expected outputs are Jinja2's (the real templates are compared with Hugging Face's
 * renderer in tests/chat_template_test.py). */
#include "text/chat_template.h"
#define CHECK_QUIET   /* thousands of checks: print failures only */
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Renders src for messages (JSON text) and checks the output, or that it fails with an
 * error containing want_err. */
static void expect(const char *src, const char *msgs, const char *want, const char *want_err)
{
    char err[512] = "", *out = NULL;
    json_t *vars = json_pack("{s:s, s:s}", "bos_token", "<s>", "eos_token", "</s>");
    json_t *m = json_loads(msgs ? msgs : "[]", 0, NULL);
    chat_template *ct = chat_template_parse(src, vars, err, sizeof err);
    int rc = ct ? chat_template_render(ct, m, true, NULL, &out, NULL, err, sizeof err) : -1;
    if (want) CHECK(rc == 0 && !strcmp(out, want), "%s\n  got  \"%s\" %s\n  want \"%s\"", src, rc == 0 ? out : "", err, want);
    else CHECK(rc < 0 && strstr(err, want_err), "%s\n  error \"%s\", want one with \"%s\"", src, err, want_err);
    free(out);
    chat_template_free(ct);
    json_decref(vars);
    json_decref(m);
}

int main(void)
{
    const char *conv = "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \" hi \"},"
                       " {\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nA\"}]";
    /* whitespace: trim_blocks, lstrip_blocks, '-' markers, the dropped trailing newline */
    expect("{% if true %}\n  x\n{% endif %}\n", NULL, "  x\n", NULL);
    expect("a\n    {% if true %}\n    b\n    {% endif %}\nc", NULL, "a\n    b\nc", NULL);
    expect("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc", NULL);
    expect("x {{- ' y ' -}} z", NULL, "x y z", NULL);
    expect("  {# comment #}\nx{#- c -#}  y", NULL, "xy", NULL);
    expect("{% if true %}  {% endif %}|", NULL, "  |", NULL);
    expect("{{ 'keep' }}\n\n", NULL, "keep\n", NULL);
    /* loops */
    expect("{% for x in [1, 2, 3] %}{{ loop.index }}{{ ',' if not loop.last }}{% endfor %}", NULL, "1,2,3", NULL);
    expect("{% for x in 'ab' %}{{ loop.index0 }}{{ x }}{{ loop.revindex }}{{ loop.first }}{% endfor %}", NULL,
           "0a2True1b1False", NULL);
    expect("{% for x in [] %}a{% else %}empty{% endfor %}", NULL, "empty", NULL);
    expect("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}", NULL, "2/2 4/2 ", NULL);
    expect("{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}"
           "{{ x }}{% endfor %}", NULL, "02", NULL);
    expect("{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}={{ v }};{% endfor %}", NULL, "a=1;b=2;", NULL);
    expect("{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %}", conv, "aus", NULL);
    /* scoping: a set inside a loop stays there; namespace carries values out */
    expect("{% set y = 1 %}{% for x in [1] %}{% set y = 2 %}{{ y }}{% endfor %}{{ y }}", NULL, "21", NULL);
    expect("{% set ns = namespace(n=0, s='') %}{% for x in range(4) %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}",
           NULL, "6", NULL);
    expect("{% if true %}{% set z = 5 %}{% endif %}{{ z }}", NULL, "5", NULL);
    expect("{% set x %}hi {{ 1 + 1 }}{% endset %}[{{ x }}]", NULL, "[hi 2]", NULL);
    /* values and operators (Python's) */
    expect("{{ [1, 2, 3, 4][::-1] }}|{{ 'hello'[1:3] }}|{{ 'héllo'[-2:] }}|{{ 'héllo'[1] }}|{{ [1, 2][5] }}", NULL,
           "[4, 3, 2, 1]|el|lo|é|", NULL);
    expect("{{ none }}|{{ undefined_name }}|{{ true }}|{{ 1.5 }}|{{ 2.0 }}|{{ 0.1 + 0.2 }}|{{ 1 / 3 }}", NULL,
           "None||True|1.5|2.0|0.30000000000000004|0.3333333333333333", NULL);
    expect("{{ 10 // 3 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 'ab' * 3 }} {{ 1 ~ 'x' ~ none }}", NULL,
           "3 -4 2 3.5 1024 ababab 1xNone", NULL);
    expect("{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}{{ 1 == 1.0 }}{{ true == 1 }}",
           NULL, "TrueTrueTrueTrueTrueTrue", NULL);
    expect("{{ 'y' if false }}|{{ 'a' if 0 else 'b' }}|{{ 0 or 'z' }}|{{ 'p' and 'q' }}|{{ not [] }}", NULL,
           "|b|z|q|True", NULL);
    expect("{{ {'a': {'b': 'c'}}.a.b }}{{ {'a': 1}['a'] }}{{ [['x']][0][0] }}", NULL, "c1x", NULL);
    expect("{{ ['a', \"it's\", 1, none] }}|{{ {'k': 'v'} }}", NULL, "['a', \"it's\", 1, None]|{'k': 'v'}", NULL);
    /* string methods */
    expect("{{ '  a b  '.strip() }}|{{ 'x\\ny'.split('\\n')[1] }}|{{ 'aab'.lstrip('a') }}|{{ 'abc'.startswith('ab') }}|"
           "{{ '\\n\\nx\\n'.rstrip('\\n') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'Hi'.upper() }}",
           NULL, "a b|y|b|True|\n\nx|['a', 'b']|['a', 'b,c']|HI", NULL);
    expect("{{ 'x.y'.endswith(('.z', '.y')) }}|{{ 'hello'.replace('l', 'L') }}|{{ 'a-b'.split('-')[-1] }}|"
           "{{ '-'.join(['a', 'b']) }}|{{ 'abcb'.find('b') }}", NULL, "True|heLLo|b|a-b|1", NULL);
    /* filters */
    expect("{{ '  t  ' | trim }}|{{ [1, 2] | length }}|{{ 'héllo' | length }}|{{ u | default('d') }}|{{ [3, 4] | first }}|"
           "{{ [3, 4] | last }}|{{ ['a', 'b'] | join(', ') }}|{{ 'Ab' | lower }}|{{ 'ab' | capitalize }}|{{ '12' | int + 1 }}",
           NULL, "t|2|5|d|3|4|a, b|ab|Ab|13", NULL);
    expect("{{ {'a': [1, 'x\"\\n', none, true, 1.5], 'b': {}} | tojson }}", NULL,
           "{\"a\": [1, \"x\\\"\\n\", null, true, 1.5], \"b\": {}}", NULL);
    expect("{{ {'a': [1]} | tojson(indent=2) }}", NULL, "{\n  \"a\": [\n    1\n  ]\n}", NULL);
    expect("{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|"
           "{{ messages | map(attribute='role') | join(',') }}|{{ [1, 2, 3] | reject('odd') | list }}", conv,
           "1|system,user,assistant|[2]", NULL);
    /* tests */
    expect("{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ 3 is odd }}{{ false is false }}"
           "{{ messages[0] is mapping }}{{ 1 is not none }}{{ 6 is divisibleby 3 }}", conv,
           "FalseTrueTrueTrueTrueTrueTrueTrue", NULL);
    /* variables transformers passes */
    expect("{{ bos_token }}{{ messages[1].content | trim }}{{ eos_token }}{{ tools is none }}{{ add_generation_prompt }}",
           conv, "<s>hi</s>TrueTrue", NULL);
    expect("{% if messages[2].content is defined and '</think>' in messages[2].content %}"
           "{{ messages[2].content.split('</think>')[-1].lstrip('\\n') }}{% endif %}", conv, "A", NULL);
    /* what Loom refuses: at parse time with the construct and line, at run time with the reason */
    expect("{% macro m() %}x{% endmacro %}", NULL, NULL, "'macro' statement is not supported");
    expect("line1\n{% include 'x' %}", NULL, NULL, "line 2");
    expect("{{ x | wordcount }}", NULL, NULL, "filter 'wordcount' is not supported");
    expect("{{ x is foo }}", NULL, NULL, "test 'foo' is not supported");
    expect("{% for m in messages %}x", NULL, NULL, "missing {% endfor %}");
    expect("{% if x %}a{% endfor %}", NULL, NULL, "unexpected {% endfor %}");
    expect("{{ 'abc }}", NULL, NULL, "unterminated string");
    expect("{{ x", NULL, NULL, "unclosed tag");
    expect("{{ foo.bar }}", NULL, NULL, "'foo' is undefined");
    expect("{{ 'a' + 1 }}", NULL, NULL, "unsupported operand");
    expect("{{ raise_exception('Conversation roles must alternate') }}", NULL, NULL,
           "raised an error: Conversation roles must alternate");
    expect("{{ 'x'.nosuch() }}", NULL, NULL, "no method 'nosuch'");
    expect("{{ 1 // 0 }}", NULL, NULL, "division by zero");
    expect("{{ messages.x.y }}", "[]", NULL, "'x' is undefined");
    /* limits */
    expect("{% set r = range(1000000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}", NULL, NULL,
           "evaluation steps");
    expect("{% for i in range(1000000) %}{% set l = 'x' * 4000 %}{% endfor %}", NULL, NULL,
           "more than 256 MiB");
    expect("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", NULL, NULL, "output larger than");
    expect("{{ range(10000000) }}", NULL, NULL, "range() of more than");
    {
        char deep[4000] = "{{ ";
        for (int i = 0; i < 500; i++) strcat(deep, "(");
        strcat(deep, "1");
        for (int i = 0; i < 500; i++) strcat(deep, ")");
        strcat(deep, " }}");
        expect(deep, NULL, NULL, "nested too deeply");
    }
    /* kwargs and variables */
    {
        char err[256], *out = NULL;
        json_t *vars = json_pack("{s:s}", "eos_token", "<|im_end|>"), *m = json_array();
        json_t *kw = json_pack("{s:b}", "enable_thinking", 0);
        chat_template *ct = chat_template_parse("{{ enable_thinking is false }}{{ eos_token }}", vars, err, sizeof err);
        CHECK(ct && chat_template_render(ct, m, false, kw, &out, NULL, err, sizeof err) == 0 &&
              !strcmp(out, "True<|im_end|>"), "kwargs: %s", out ? out : err);
        CHECK(ct && !strcmp(chat_template_var(ct, "eos_token"), "<|im_end|>") && !chat_template_var(ct, "bos_token"),
              "chat_template_var");
        json_t *bad = json_pack("{s:[]}", "messages");
        CHECK(ct && chat_template_render(ct, m, false, bad, &out, NULL, err, sizeof err) < 0, "kwargs cannot set messages");
        CHECK(ct && chat_template_render(ct, kw, false, NULL, &out, NULL, err, sizeof err) < 0 && strstr(err, "array"),
              "messages must be an array");
        free(out);
        json_decref(bad);
        json_decref(kw);
        json_decref(vars);
        json_decref(m);
        chat_template_free(ct);
    }
    return check_summary();
}
