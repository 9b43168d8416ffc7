/* jinja.h — the inside of the chat-template interpreter (text/chat_template.h is its face):
 * a small interpreter of the Jinja2 subset that Hugging Face chat templates use.
 *
 * Shape: the source is lexed into tokens (jinja_lex.c: text and tag contents, with Jinja2's
 * whitespace control, trim_blocks and lstrip_blocks applied to the text), parsed by
 * recursive descent into a tree (jinja_parse.c: Jinja2's precedence), and the tree is
 * evaluated with Python semantics for values (jinja_eval.c: what transformers' Jinja2
 * does), calling the filters, tests, string and dict methods and global functions of
 * jinja_builtins.c. Values, their arena and their Python conversions are jinja_value.c.
 * Parse trees live in the template's arena; each render has its own arena for values,
 * freed at the end. Errors unwind with longjmp (ct_fail) to the API function
 * (chat_template.c), which frees the arena: no value owns memory of its own, so nothing
 * leaks on the way.
 *
 * Limits (a template is a model file, messages come from users): 16 MiB of output,
 * 256 MiB of memory, 10 million evaluation steps, nesting 200 deep, range() up to 1M
 * items.
 *
 * For text/ only: its short type names (str, value, node, ...) are private to the
 * interpreter; the functions with linkage are ct_-prefixed, the small helpers static inline.
 */
#ifndef LOOM_TEXT_JINJA_H
#define LOOM_TEXT_JINJA_H

#include <jansson.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { CT_MAX_OUT = 16 << 20, CT_MAX_STEPS = 10000000, CT_MAX_DEPTH = 200, CT_MAX_RANGE = 1 << 20 };
#define CT_MAX_MEM ((size_t)256 << 20) /* arena bytes per parse or render */

/* ---- arena and errors (jinja_value.c) ----------------------------------------------------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

typedef struct {
    chunk **arena; /* where allocations go */
    chunk *own;    /* a render's arena (heap, so that longjmp leaves it intact) */
    size_t used;   /* bytes taken from the arena, against CT_MAX_MEM */
    jmp_buf jb;    /* errors unwind to the API function */
    char msg[512];
} ct_env;

/* "chat template line N: message" into e->msg, then longjmp to e->jb. */
_Noreturn __attribute__((format(printf, 3, 4))) void ct_fail(ct_env *e, int line, const char *fmt, ...);
void *ct_alloc(ct_env *e, size_t n);
void ct_arena_free(chunk *c);

/* ---- values (jinja_value.c) ---------------------------------------------------------------- */

typedef struct {
    const char *s;
    size_t n;
} str;

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_FUNC } vkind;

typedef struct value value;
typedef struct list list;
typedef struct dict dict;

struct value {
    vkind k;
    union {
        bool b;
        int64_t i;
        double f;
        str s;   /* V_STR; for V_UNDEF the name that was looked up */
        list *l;
        dict *d; /* V_DICT, V_NS (a namespace: the one mutable kind) */
        int fn;  /* V_FUNC: a global function (jinja_builtins.c) */
    };
};

struct list {
    size_t n;
    value *v;
};

struct dict {
    size_t n, cap;
    str *key;
    value *val;
};

static const value undef = {.k = V_UNDEF};
static const value none = {.k = V_NONE};

static inline value mk_bool(bool b) { return (value){.k = V_BOOL, .b = b}; }
static inline value mk_int(int64_t i) { return (value){.k = V_INT, .i = i}; }
static inline value mk_float(double f) { return (value){.k = V_FLOAT, .f = f}; }
static inline value mk_str(str s) { return (value){.k = V_STR, .s = s}; }
static inline value mk_undef(str name) { return (value){.k = V_UNDEF, .s = name}; }
static inline value mk_list(list *l) { return (value){.k = V_LIST, .l = l}; }
static inline str S(const char *c) { return (str){c, strlen(c)}; }
static inline bool str_eq(str a, str b) { return a.n == b.n && memcmp(a.s, b.s, a.n) == 0; }
static inline bool str_is(str a, const char *c) { return str_eq(a, S(c)); }

str ct_str_dup(ct_env *e, const char *s, size_t n);
list *ct_list_new(ct_env *e, size_t n);
dict *ct_dict_new(ct_env *e);
value *ct_dict_get(const dict *d, str k);
void ct_dict_set(ct_env *e, dict *d, str k, value v);

/* Strings built piece by piece in the arena (growth copies; the old block stays in the
 * arena until the render ends, at most doubling what is kept). */
typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

void ct_sb_add(ct_env *e, sbuf *b, const char *s, size_t n);
static inline void sb_str(ct_env *e, sbuf *b, const char *s) { ct_sb_add(e, b, s, strlen(s)); }
static inline str sb_done(sbuf *b) { return (str){b->p ? b->p : "", b->n}; }

/* Unicode: one code point of s[0..n) (invalid bytes: one byte, as U+FFFD) and its length;
 * code points in s; Python's str.isspace(); c in set[0..n); the code points of s as an
 * array (with their byte offsets when off is not NULL). */
int32_t ct_u8_next(const char *s, size_t n, size_t *len);
size_t ct_u8_count(str s);
bool ct_py_space(int32_t c);
bool ct_memchr_cp(const int32_t *set, size_t n, int32_t c);
int32_t *ct_u8_decode(ct_env *e, str s, size_t *n, size_t **off);

/* Python's str(v) (repr false) or repr(v) into b; str(v) as a string; transformers'
 * tojson (json.dumps, indent < 0: none); a JSON value as a template value. */
void ct_to_text(ct_env *e, sbuf *b, value v, bool repr);
str ct_to_str(ct_env *e, value v);
void ct_to_json(ct_env *e, sbuf *b, value v, int indent, int level, int line);
value ct_from_json(ct_env *e, const json_t *j);

/* Python semantics: truth, ==, the type's name, <0 / 0 / >0 for numbers and strings. */
bool ct_truthy(value v);
static inline bool is_num(value v) { return v.k == V_BOOL || v.k == V_INT || v.k == V_FLOAT; }
static inline double num(value v) { return v.k == V_FLOAT ? v.f : v.k == V_INT ? (double)v.i : v.b; }
static inline int64_t inum(value v) { return v.k == V_INT ? v.i : v.b; }
bool ct_py_eq(value a, value b);
const char *ct_type_name(value v);
int ct_py_cmp(ct_env *e, int line, value a, value b, const char *op);

/* ---- tokens (jinja_lex.c) ------------------------------------------------------------------ */

enum { T_TEXT, T_VAR, T_BLOCK, T_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct {
    int k, line;
    str s; /* text, name, decoded string, operator */
    int64_t i;
    double f;
} token;

/* The template src[0..n) as tokens, ending with T_EOF. */
token *ct_lex(ct_env *e, const char *src, size_t n);

/* ---- parse tree (jinja_parse.c) ------------------------------------------------------------ */

enum {
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS, E_NOT, E_AND, E_OR, E_BIN,
    E_COND, E_LIST, E_DICT,
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_BREAK, S_CONTINUE, S_BLOCK
};

typedef struct node node;
struct node {
    int k, line;
    str s, s2;   /* name, text or operator; s2: namespace attribute or second loop name */
    value lit;
    node *a, *b, *c;
    node **v;    /* arguments, items, body */
    node **w;    /* keyword argument values, dict values, else body */
    str *kw;     /* keyword argument names */
    int nv, nw;
    bool neg;    /* `is not` */
};

/* The template's statements, *n of them. */
node **ct_parse(ct_env *e, token *t, int *n);

/* ---- evaluation (jinja_eval.c) ------------------------------------------------------------- */

typedef struct scope {
    struct scope *up;
    dict *vars;
} scope;

typedef struct {
    ct_env *e;
    scope *sc;
    sbuf *out;
    sbuf result; /* the output (malloc'd), where out points outside block sets */
    long steps;
    int depth, ctl;
} render;

/* Runs body into R->result (NUL-terminated) with R->sc as the variables. */
void ct_exec(render *R, node *const *body, int n);
void ct_need_defined(render *R, int line, value v);
value ct_get_attr(render *R, int line, value obj, str name);
/* The items a for loop or a filter iterates: list elements, dict keys, characters. */
list *ct_iter_items(render *R, int line, value v);

/* ---- built-ins (jinja_builtins.c) ---------------------------------------------------------- */

/* Evaluated call arguments. */
typedef struct {
    value *pos, *kwv;
    str *kw;
    int npos, nkw;
} args;

/* The filters and tests Loom has (the parser refuses others at load). */
bool ct_is_filter(str name);
bool ct_is_test(str name);
/* The global functions (namespace, range, raise_exception, strftime_now, dict) into vars. */
void ct_add_globals(ct_env *e, dict *vars);
value ct_call_global(render *R, int line, int fn, const args *a);
value ct_call_method(render *R, int line, value obj, str m, const args *a);
bool ct_run_test(render *R, int line, str name, value v, const args *a);
value ct_apply_filter(render *R, int line, str f, value v, const args *a);

#endif
