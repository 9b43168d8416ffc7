/* chat_template.c — renders chat templates: a small interpreter of the Jinja2 subset that
 * Hugging Face chat templates use (see chat_template.h for what it covers).
 *
 * Why our own: Debian packages no Jinja2 implementation for C (nor does any C library
 * of this kind exist that is kept up), and recognising templates by their text would
 * break on every variant a fine-tune ships. The subset is small: the templates of the
 * Llama 3.x, Qwen2/2.5/3 and ChatML families use if/for/set, a dozen filters and tests,
 * a few string methods and namespace().
 *
 * Shape: the source is lexed into tokens (text and tag contents, with Jinja2's
 * whitespace control, trim_blocks and lstrip_blocks applied to the text), parsed by
 * recursive descent into a tree (Jinja2's precedence), and the tree is evaluated with
 * Python semantics for values (what transformers' Jinja2 does). Parse trees live in the
 * template's arena; each render has its own arena for values, freed at the end. Errors
 * unwind with longjmp to the API function, which frees the arena: no value owns memory
 * of its own, so nothing leaks on the way.
 *
 * Limits (a template is a model file, messages come from users): 16 MiB of output,
 * 256 MiB of memory, 10 million evaluation steps, nesting 200 deep, range() up to 1M
 * items.
 */
#include "model/chat_template.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

enum { CT_MAX_OUT = 16 << 20, CT_MAX_STEPS = 10000000, CT_MAX_DEPTH = 200, CT_MAX_RANGE = 1 << 20 };
#define CT_MAX_MEM ((size_t)256 << 20) /* arena bytes per parse or render */

/* ---- arena and errors ------------------------------------------------------------------ */

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

_Noreturn __attribute__((format(printf, 3, 4))) static void ct_fail(ct_env *e, int line, const char *fmt, ...)
{
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (line > 0) snprintf(e->msg, sizeof e->msg, "chat template line %d: %s", line, m);
    else snprintf(e->msg, sizeof e->msg, "chat template: %s", m);
    longjmp(e->jb, 1);
}

static void *ct_alloc(ct_env *e, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    chunk *c = *e->arena;
    if ((e->used += n) > CT_MAX_MEM) ct_fail(e, 0, "the template needs more than %zu MiB", CT_MAX_MEM >> 20);
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        chunk *nc = malloc(sizeof *nc + cap);
        if (!nc) ct_fail(e, 0, "out of memory");
        nc->next = c;
        nc->used = 0;
        nc->cap = cap;
        *e->arena = c = nc;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    return p;
}

static void arena_free(chunk *c)
{
    while (c) {
        chunk *n = c->next;
        free(c);
        c = n;
    }
}

/* ---- values ------------------------------------------------------------------------------ */

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
        int fn;  /* V_FUNC: a global function */
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

enum { FN_NAMESPACE, FN_RANGE, FN_RAISE, FN_STRFTIME, FN_DICT };

static const value undef = {.k = V_UNDEF};
static const value none = {.k = V_NONE};

static value mk_bool(bool b) { return (value){.k = V_BOOL, .b = b}; }
static value mk_int(int64_t i) { return (value){.k = V_INT, .i = i}; }
static value mk_float(double f) { return (value){.k = V_FLOAT, .f = f}; }
static value mk_str(str s) { return (value){.k = V_STR, .s = s}; }
static value mk_undef(str name) { return (value){.k = V_UNDEF, .s = name}; }
static str S(const char *c) { return (str){c, strlen(c)}; }
static bool str_eq(str a, str b) { return a.n == b.n && memcmp(a.s, b.s, a.n) == 0; }
static bool str_is(str a, const char *c) { return str_eq(a, S(c)); }

static str str_dup(ct_env *e, const char *s, size_t n)
{
    char *p = ct_alloc(e, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return (str){p, n};
}

static list *list_new(ct_env *e, size_t n)
{
    list *l = ct_alloc(e, sizeof *l);
    l->n = n;
    l->v = n ? ct_alloc(e, n * sizeof *l->v) : NULL;
    return l;
}

static value mk_list(list *l) { return (value){.k = V_LIST, .l = l}; }

static dict *dict_new(ct_env *e) { return memset(ct_alloc(e, sizeof(dict)), 0, sizeof(dict)); }

static value *dict_get(const dict *d, str k)
{
    for (size_t i = 0; i < d->n; i++)
        if (str_eq(d->key[i], k)) return &d->val[i];
    return NULL;
}

static void dict_set(ct_env *e, dict *d, str k, value v)
{
    value *p = dict_get(d, k);
    if (p) { *p = v; return; }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        str *nk = ct_alloc(e, cap * sizeof *nk);
        value *nv = ct_alloc(e, cap * sizeof *nv);
        if (d->n) { memcpy(nk, d->key, d->n * sizeof *nk); memcpy(nv, d->val, d->n * sizeof *nv); }
        d->key = nk;
        d->val = nv;
        d->cap = cap;
    }
    d->key[d->n] = k;
    d->val[d->n++] = v;
}

/* Strings built piece by piece in the arena (growth copies; the old block stays in the
 * arena until the render ends, at most doubling what is kept). */
typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_add(ct_env *e, sbuf *b, const char *s, size_t n)
{
    if (b->n + n > CT_MAX_OUT) ct_fail(e, 0, "a string grew past %d MiB", CT_MAX_OUT >> 20);
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        char *p = ct_alloc(e, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void sb_str(ct_env *e, sbuf *b, const char *s) { sb_add(e, b, s, strlen(s)); }
static str sb_done(sbuf *b) { return (str){b->p ? b->p : "", b->n}; }

/* ---- Unicode helpers ------------------------------------------------------------------------ */

/* One code point of s[0..n) (invalid bytes: one byte, as U+FFFD); its length in *len. */
static int32_t u8_next(const char *s, size_t n, size_t *len)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
    if (l < 1) { *len = 1; return 0xFFFD; }
    *len = (size_t)l;
    return c;
}

static size_t u8_count(str s)
{
    size_t k = 0, l;
    for (size_t i = 0; i < s.n; i += l, k++) u8_next(s.s + i, s.n - i, &l);
    return k;
}

/* Python's str.isspace() (what strip() and split() take away by default). */
static bool memchr_cp(const int32_t *set, size_t n, int32_t c)
{
    for (size_t i = 0; i < n; i++) if (set[i] == c) return true;
    return false;
}

static bool py_space(int32_t c)
{
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* The code points of s as an array (for indexing, slicing, strip sets). */
static int32_t *u8_decode(ct_env *e, str s, size_t *n, size_t **off)
{
    int32_t *cp = ct_alloc(e, (s.n + 1) * sizeof *cp);
    size_t *o = off ? ct_alloc(e, (s.n + 1) * sizeof *o) : NULL;
    size_t k = 0, l;
    for (size_t i = 0; i < s.n; i += l) {
        if (o) o[k] = i;
        cp[k++] = u8_next(s.s + i, s.n - i, &l);
    }
    if (o) { o[k] = s.n; *off = o; }
    *n = k;
    return cp;
}

/* ---- conversions (Python's str(), repr(), json.dumps) ------------------------------------- */

/* Python's repr of a float: the shortest digits that read back the same, fixed notation
 * for exponents -4..15, else scientific. */
static void py_float(ct_env *e, sbuf *b, double f)
{
    if (isnan(f)) { sb_str(e, b, "nan"); return; }
    if (isinf(f)) { sb_str(e, b, f < 0 ? "-inf" : "inf"); return; }
    char d[40];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(d, sizeof d, "%.*e", p - 1, f);
        if (strtod(d, NULL) == f) break;
    }
    snprintf(d, sizeof d, "%.*e", p - 1, f);
    char *ep = strchr(d, 'e');
    int ex = atoi(ep + 1);
    char digits[24];
    int nd = 0;
    for (char *q = d; q < ep; q++) if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char o[64];
    int m = 0;
    if (f < 0) o[m++] = '-';
    if (ex >= 16 || ex < -4) {
        o[m++] = digits[0];
        if (nd > 1) { o[m++] = '.'; for (int i = 1; i < nd; i++) o[m++] = digits[i]; }
        m += snprintf(o + m, sizeof o - m, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    } else if (ex < 0) {
        o[m++] = '0'; o[m++] = '.';
        for (int i = 0; i < -ex - 1; i++) o[m++] = '0';
        for (int i = 0; i < nd; i++) o[m++] = digits[i];
    } else {
        for (int i = 0; i <= ex; i++) o[m++] = i < nd ? digits[i] : '0';
        o[m++] = '.';
        if (nd > ex + 1) for (int i = ex + 1; i < nd; i++) o[m++] = digits[i];
        else o[m++] = '0';
    }
    sb_add(e, b, o, (size_t)m);
}

static void to_text(ct_env *e, sbuf *b, value v, bool repr);

static void py_repr_str(ct_env *e, sbuf *b, str s)
{
    bool dq = memchr(s.s, '\'', s.n) && !memchr(s.s, '"', s.n);
    char q = dq ? '"' : '\'';
    sb_add(e, b, &q, 1);
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.s[i];
        char x[8];
        if (c == '\\' || c == (unsigned char)q) { x[0] = '\\'; x[1] = (char)c; sb_add(e, b, x, 2); }
        else if (c == '\n') sb_str(e, b, "\\n");
        else if (c == '\r') sb_str(e, b, "\\r");
        else if (c == '\t') sb_str(e, b, "\\t");
        else if (c < 0x20 || c == 0x7F) { snprintf(x, sizeof x, "\\x%02x", c); sb_str(e, b, x); }
        else sb_add(e, b, (const char *)&c, 1);
    }
    sb_add(e, b, &q, 1);
}

/* Python's str(v) (repr false) or repr(v) into b. */
static void to_text(ct_env *e, sbuf *b, value v, bool repr)
{
    char x[32];
    switch (v.k) {
    case V_UNDEF: break;
    case V_NONE: sb_str(e, b, "None"); break;
    case V_BOOL: sb_str(e, b, v.b ? "True" : "False"); break;
    case V_INT: snprintf(x, sizeof x, "%lld", (long long)v.i); sb_str(e, b, x); break;
    case V_FLOAT: py_float(e, b, v.f); break;
    case V_STR: if (repr) py_repr_str(e, b, v.s); else sb_add(e, b, v.s.s, v.s.n); break;
    case V_LIST:
        sb_str(e, b, "[");
        for (size_t i = 0; i < v.l->n; i++) { if (i) sb_str(e, b, ", "); to_text(e, b, v.l->v[i], true); }
        sb_str(e, b, "]");
        break;
    case V_DICT:
    case V_NS:
        sb_str(e, b, v.k == V_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) sb_str(e, b, ", ");
            py_repr_str(e, b, v.d->key[i]);
            sb_str(e, b, ": ");
            to_text(e, b, v.d->val[i], true);
        }
        sb_str(e, b, v.k == V_NS ? "}>" : "}");
        break;
    case V_FUNC: sb_str(e, b, "<built-in function>"); break;
    }
}

static str to_str(ct_env *e, value v)
{
    if (v.k == V_STR) return v.s;
    sbuf b = {0};
    to_text(e, &b, v, false);
    return sb_done(&b);
}

static void json_str(ct_env *e, sbuf *b, str s)
{
    sb_str(e, b, "\"");
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.s[i];
        char x[8];
        switch (c) {
        case '"': sb_str(e, b, "\\\""); break;
        case '\\': sb_str(e, b, "\\\\"); break;
        case '\n': sb_str(e, b, "\\n"); break;
        case '\r': sb_str(e, b, "\\r"); break;
        case '\t': sb_str(e, b, "\\t"); break;
        case '\b': sb_str(e, b, "\\b"); break;
        case '\f': sb_str(e, b, "\\f"); break;
        default:
            if (c < 0x20) { snprintf(x, sizeof x, "\\u%04x", c); sb_str(e, b, x); }
            else sb_add(e, b, (const char *)&c, 1);
        }
    }
    sb_str(e, b, "\"");
}

static void json_nl(ct_env *e, sbuf *b, int indent, int level)
{
    sb_str(e, b, "\n");
    for (int i = 0; i < indent * level; i++) sb_str(e, b, " ");
}

/* transformers' tojson: json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0:
 * none, separators ", " and ": "). */
static void to_json(ct_env *e, sbuf *b, value v, int indent, int level, int line)
{
    switch (v.k) {
    case V_NONE: sb_str(e, b, "null"); break;
    case V_BOOL: sb_str(e, b, v.b ? "true" : "false"); break;
    case V_INT: to_text(e, b, v, false); break;
    case V_STR: json_str(e, b, v.s); break;
    case V_FLOAT:
        if (isnan(v.f)) sb_str(e, b, "NaN");
        else if (isinf(v.f)) sb_str(e, b, v.f < 0 ? "-Infinity" : "Infinity");
        else py_float(e, b, v.f);
        break;
    case V_LIST:
    case V_DICT: {
        bool is_list = v.k == V_LIST;
        size_t n = is_list ? v.l->n : v.d->n;
        sb_str(e, b, is_list ? "[" : "{");
        for (size_t i = 0; i < n; i++) {
            if (i) sb_str(e, b, indent >= 0 ? "," : ", ");
            if (indent >= 0) json_nl(e, b, indent, level + 1);
            if (is_list) to_json(e, b, v.l->v[i], indent, level + 1, line);
            else {
                json_str(e, b, v.d->key[i]);
                sb_str(e, b, ": ");
                to_json(e, b, v.d->val[i], indent, level + 1, line);
            }
        }
        if (indent >= 0 && n) json_nl(e, b, indent, level);
        sb_str(e, b, is_list ? "]" : "}");
        break;
    }
    default: ct_fail(e, line, "tojson: this value is not JSON serializable");
    }
}

static value from_json(ct_env *e, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_STRING: return mk_str(str_dup(e, json_string_value(j), json_string_length(j)));
    case JSON_INTEGER: return mk_int(json_integer_value(j));
    case JSON_REAL: return mk_float(json_real_value(j));
    case JSON_TRUE: return mk_bool(true);
    case JSON_FALSE: return mk_bool(false);
    case JSON_NULL: return none;
    case JSON_ARRAY: {
        list *l = list_new(e, json_array_size(j));
        for (size_t i = 0; i < l->n; i++) l->v[i] = from_json(e, json_array_get(j, i));
        return mk_list(l);
    }
    case JSON_OBJECT: {
        dict *d = dict_new(e);
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)j, k, x) dict_set(e, d, str_dup(e, k, strlen(k)), from_json(e, x));
        return (value){.k = V_DICT, .d = d};
    }
    }
    return none;
}

/* ---- Python semantics ------------------------------------------------------------------------ */

static bool truthy(value v)
{
    switch (v.k) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v.b;
    case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0;
    case V_STR: return v.s.n > 0;
    case V_LIST: return v.l->n > 0;
    case V_DICT: return v.d->n > 0;
    default: return true;
    }
}

static bool is_num(value v) { return v.k == V_BOOL || v.k == V_INT || v.k == V_FLOAT; }
static double num(value v) { return v.k == V_FLOAT ? v.f : v.k == V_INT ? (double)v.i : v.b; }
static int64_t inum(value v) { return v.k == V_INT ? v.i : v.b; }

static bool py_eq(value a, value b)
{
    if (is_num(a) && is_num(b)) {
        if (a.k != V_FLOAT && b.k != V_FLOAT) return inum(a) == inum(b);
        return num(a) == num(b);
    }
    if (a.k != b.k) return false;
    switch (a.k) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return str_eq(a.s, b.s);
    case V_LIST:
        if (a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++) if (!py_eq(a.l->v[i], b.l->v[i])) return false;
        return true;
    case V_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            value *o = dict_get(b.d, a.d->key[i]);
            if (!o || !py_eq(a.d->val[i], *o)) return false;
        }
        return true;
    default: return a.d == b.d;
    }
}

static const char *type_name(value v)
{
    static const char *const n[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict",
                                    "Namespace", "function"};
    return n[v.k];
}

/* <0, 0, >0 for numbers and strings (code point order = UTF-8 byte order). */
static int py_cmp(ct_env *e, int line, value a, value b, const char *op)
{
    if (is_num(a) && is_num(b)) return num(a) < num(b) ? -1 : num(a) > num(b);
    if (a.k == V_STR && b.k == V_STR) {
        int c = memcmp(a.s.s, b.s.s, a.s.n < b.s.n ? a.s.n : b.s.n);
        return c ? c : (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    ct_fail(e, line, "'%s' not supported between %s and %s", op, type_name(a), type_name(b));
    return 0;
}

/* ---- lexer ------------------------------------------------------------------------------------ */

enum { T_TEXT, T_VAR, T_BLOCK, T_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct {
    int k, line;
    str s; /* text, name, decoded string, operator */
    int64_t i;
    double f;
} token;

typedef struct {
    ct_env *e;
    const char *src;
    size_t n, pos;
    int line;
    token *t;
    size_t nt, cap;
} lexer;

static void lx_push(lexer *L, token t)
{
    if (L->nt == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 256;
        token *p = ct_alloc(L->e, cap * sizeof *p);
        if (L->nt) memcpy(p, L->t, L->nt * sizeof *p);
        L->t = p;
        L->cap = cap;
    }
    L->t[L->nt++] = t;
}

static int line_at(const char *s, size_t from, size_t to, int line)
{
    for (size_t i = from; i < to; i++) line += s[i] == '\n';
    return line;
}

/* A string literal at L->pos (Python escapes, as Jinja2 reads them). */
static str lx_string(lexer *L)
{
    char q = L->src[L->pos++];
    sbuf b = {0};
    while (L->pos < L->n && L->src[L->pos] != q) {
        char c = L->src[L->pos++];
        if (c != '\\' || L->pos >= L->n) { sb_add(L->e, &b, &c, 1); continue; }
        char x = L->src[L->pos++], o[8];
        const char *m = NULL;
        switch (x) {
        case 'n': m = "\n"; break;
        case 't': m = "\t"; break;
        case 'r': m = "\r"; break;
        case '\\': m = "\\"; break;
        case '\'': m = "'"; break;
        case '"': m = "\""; break;
        case '\n': m = ""; break;
        case 'a': m = "\a"; break;
        case 'b': m = "\b"; break;
        case 'f': m = "\f"; break;
        case 'v': m = "\v"; break;
        case '0': m = ""; sb_add(L->e, &b, "", 1); break;
        case 'x': case 'u': case 'U': {
            int digits = x == 'x' ? 2 : x == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int i = 0; i < digits; i++) {
                char h = L->pos < L->n ? L->src[L->pos] : 0;
                int d = h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
                if (d < 0) ct_fail(L->e, L->line, "bad \\%c escape in a string", x);
                cp = cp * 16 + (uint32_t)d;
                L->pos++;
            }
            utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)o);
            if (k < 1) ct_fail(L->e, L->line, "bad code point in a string escape");
            sb_add(L->e, &b, o, (size_t)k);
            m = "";
            break;
        }
        default: o[0] = '\\'; o[1] = x; sb_add(L->e, &b, o, 2); m = ""; /* kept, as Python does */
        }
        sb_str(L->e, &b, m);
    }
    if (L->pos >= L->n) ct_fail(L->e, L->line, "unterminated string");
    L->pos++;
    return sb_done(&b);
}

static const char *const lx_ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
                                     "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};

/* The inside of a tag up to its end ("}}" or "%}", optionally after '-' or '+');
 * returns the end marker ('-', '+' or 0). */
static char lx_tag(lexer *L, char close)
{
    int depth = 0;
    for (;;) {
        while (L->pos < L->n && strchr(" \t\r\n", L->src[L->pos])) L->line += L->src[L->pos++] == '\n';
        if (L->pos >= L->n) ct_fail(L->e, L->line, "unclosed tag");
        const char *p = L->src + L->pos;
        size_t left = L->n - L->pos;
        if (depth == 0) {
            for (int m = 0; m < 3; m++) {
                char mark = "\0-+"[m];
                size_t skip = mark ? 1 : 0;
                if (mark && (left < 3 || p[0] != mark)) continue;
                if (left >= skip + 2 && p[skip] == close && p[skip + 1] == '}') {
                    L->pos += skip + 2;
                    return mark;
                }
            }
        }
        token t = {.line = L->line};
        char c = *p;
        if (c == '\'' || c == '"') {
            t.k = T_STR;
            t.s = lx_string(L);
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t k = 0;
            while (k < left && (p[k] == '_' || (p[k] >= 'a' && p[k] <= 'z') || (p[k] >= 'A' && p[k] <= 'Z') ||
                                (p[k] >= '0' && p[k] <= '9')))
                k++;
            t.k = T_NAME;
            t.s = (str){p, k};
            L->pos += k;
        } else if (c >= '0' && c <= '9') {
            char *end;
            errno = 0;
            long long i = strtoll(p, &end, 10);
            if (*end == '.' && end[1] >= '0' && end[1] <= '9') {
                t.k = T_FLOAT;
                t.f = strtod(p, &end);
            } else {
                if (errno) ct_fail(L->e, L->line, "integer literal too large");
                t.k = T_INT;
                t.i = i;
            }
            L->pos += (size_t)(end - p);
        } else {
            t.k = T_OP;
            for (size_t o = 0; o < sizeof lx_ops / sizeof *lx_ops && !t.s.n; o++) {
                size_t l = strlen(lx_ops[o]);
                if (left >= l && !memcmp(p, lx_ops[o], l)) t.s = (str){lx_ops[o], l};
            }
            if (!t.s.n) ct_fail(L->e, L->line, "unexpected character '%c'", c);
            if (strchr("([{", c)) depth++;
            if (strchr(")]}", c) && depth > 0) depth--;
            L->pos += t.s.n;
        }
        lx_push(L, t);
    }
}

static bool is_hspace(char c) { return c == ' ' || c == '\t'; }
static bool is_wspace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* The whole template into tokens: text between tags, with Jinja2's whitespace rules:
 * '-' inside a tag strips all whitespace on that side; lstrip_blocks removes spaces and
 * tabs from the start of a line up to a block or comment tag; trim_blocks removes the
 * first newline after one. One trailing newline of the template is dropped. */
static void lex(lexer *L)
{
    if (L->n && L->src[L->n - 1] == '\n') L->n--;
    bool strip_next = false;
    while (L->pos <= L->n) {
        size_t k = L->pos;
        while (k + 1 < L->n && !(L->src[k] == '{' && strchr("{%#", L->src[k + 1]))) k++;
        if (k + 1 >= L->n) k = L->n;
        size_t a = L->pos, b = k;
        if (strip_next) while (a < b && is_wspace(L->src[a])) a++;
        char kind = k < L->n ? L->src[k + 1] : 0, mark = k + 2 < L->n ? L->src[k + 2] : 0;
        if (kind && mark == '-') {
            while (b > a && is_wspace(L->src[b - 1])) b--;
        } else if ((kind == '%' || kind == '#') && mark != '+') {
            size_t ls = b;
            while (ls > a && is_hspace(L->src[ls - 1])) ls--;
            if ((ls == 0 || L->src[ls - 1] == '\n') && (ls > a || a == 0 || L->src[a - 1] == '\n')) b = ls;
        }
        int line0 = L->line;
        if (b > a) lx_push(L, (token){.k = T_TEXT, .line = line_at(L->src, L->pos, a, line0), .s = {L->src + a, b - a}});
        L->line = line_at(L->src, L->pos, k, line0);
        if (!kind) break;
        L->pos = k + 2 + (mark == '-' || mark == '+');
        char end;
        if (kind == '#') {
            const char *c = NULL;
            for (size_t i = L->pos; i + 1 < L->n && !c; i++) if (L->src[i] == '#' && L->src[i + 1] == '}') c = L->src + i;
            if (!c) ct_fail(L->e, L->line, "unclosed comment");
            end = c > L->src + L->pos && c[-1] == '-' ? '-' : c > L->src + L->pos && c[-1] == '+' ? '+' : 0;
            L->line = line_at(L->src, L->pos, (size_t)(c - L->src), L->line);
            L->pos = (size_t)(c - L->src) + 2;
        } else {
            lx_push(L, (token){.k = kind == '{' ? T_VAR : T_BLOCK, .line = L->line});
            end = lx_tag(L, kind == '{' ? '}' : '%');
            lx_push(L, (token){.k = T_END, .line = L->line});
        }
        strip_next = end == '-';
        if (kind != '{' && !end && L->pos < L->n && L->src[L->pos] == '\n') { L->pos++; L->line++; }
    }
    lx_push(L, (token){.k = T_EOF, .line = L->line});
}

/* ---- parse tree ------------------------------------------------------------------------------- */

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

typedef struct {
    ct_env *e;
    token *t;
    size_t i;
    int depth;
} parser;

static node *nd(parser *P, int k, int line)
{
    node *n = memset(ct_alloc(P->e, sizeof(node)), 0, sizeof(node));
    n->k = k;
    n->line = line;
    return n;
}

typedef struct {
    node **p;
    int n, cap;
} nlist;

static void nl_add(parser *P, nlist *l, node *x)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 4;
        node **p = ct_alloc(P->e, (size_t)cap * sizeof *p);
        if (l->n) memcpy(p, l->p, (size_t)l->n * sizeof *p);
        l->p = p;
        l->cap = cap;
    }
    l->p[l->n++] = x;
}

static token *cur(parser *P) { return &P->t[P->i]; }
static bool at_op(parser *P, const char *op) { return cur(P)->k == T_OP && str_is(cur(P)->s, op); }
static bool at_name(parser *P, const char *n) { return cur(P)->k == T_NAME && str_is(cur(P)->s, n); }

static void expect_op(parser *P, const char *op)
{
    if (!at_op(P, op)) ct_fail(P->e, cur(P)->line, "expected '%s'", op);
    P->i++;
}

static str expect_name(parser *P)
{
    if (cur(P)->k != T_NAME) ct_fail(P->e, cur(P)->line, "expected a name");
    return P->t[P->i++].s;
}

static void expect_end(parser *P)
{
    if (cur(P)->k != T_END) ct_fail(P->e, cur(P)->line, "expected the end of the tag");
    P->i++;
}

static const char *const filters[] = {"trim", "length", "count", "tojson", "string", "lower", "upper", "capitalize",
                                      "title", "first", "last", "join", "default", "d", "replace", "list", "reverse",
                                      "int", "float", "abs", "items", "safe", "e", "escape", "select", "reject",
                                      "selectattr", "rejectattr", "map", NULL};
static const char *const tests[] = {"defined", "undefined", "none", "string", "number", "integer", "float", "boolean",
                                    "true", "false", "mapping", "iterable", "sequence", "callable", "odd", "even",
                                    "divisibleby", "eq", "equalto", "==", "ne", "!=", "lt", "<", "gt", ">", "le",
                                    "<=", "ge", ">=", "in", "sameas", "lower", "upper", NULL};

static bool known(const char *const *names, str s)
{
    for (int i = 0; names[i]; i++) if (str_is(s, names[i])) return true;
    return false;
}

static node *p_expr(parser *P);
static node *p_or(parser *P);
static node *p_unary(parser *P, bool with_filter);

/* ( args ) into n->v (positional) and n->kw / n->w (keyword). */
static void p_args(parser *P, node *n)
{
    nlist pos = {0}, kwv = {0};
    str *kw = NULL;
    int nkw = 0;
    expect_op(P, "(");
    while (!at_op(P, ")")) {
        if (pos.n || kwv.n) expect_op(P, ",");
        if (at_op(P, ")")) break;
        if (cur(P)->k == T_NAME && P->t[P->i + 1].k == T_OP && str_is(P->t[P->i + 1].s, "=")) {
            str name = P->t[P->i].s;
            P->i += 2;
            str *nk = ct_alloc(P->e, (size_t)(nkw + 1) * sizeof *nk);
            if (nkw) memcpy(nk, kw, (size_t)nkw * sizeof *nk);
            nk[nkw++] = name;
            kw = nk;
            nl_add(P, &kwv, p_expr(P));
        } else {
            if (kwv.n) ct_fail(P->e, cur(P)->line, "positional argument after a keyword argument");
            nl_add(P, &pos, p_expr(P));
        }
    }
    P->i++;
    n->v = pos.p;
    n->nv = pos.n;
    n->w = kwv.p;
    n->nw = kwv.n;
    n->kw = kw;
}

static node *p_primary(parser *P)
{
    token *t = cur(P);
    node *n = nd(P, E_LIT, t->line);
    if (++P->depth > CT_MAX_DEPTH) ct_fail(P->e, t->line, "expression nested too deeply");
    switch (t->k) {
    case T_NAME:
        P->i++;
        if (str_is(t->s, "true") || str_is(t->s, "True")) n->lit = mk_bool(true);
        else if (str_is(t->s, "false") || str_is(t->s, "False")) n->lit = mk_bool(false);
        else if (str_is(t->s, "none") || str_is(t->s, "None")) n->lit = none;
        else { n->k = E_NAME; n->s = t->s; }
        break;
    case T_STR: {
        sbuf b = {0};
        while (cur(P)->k == T_STR) { sb_add(P->e, &b, cur(P)->s.s, cur(P)->s.n); P->i++; } /* "a" "b" is "ab" */
        n->lit = mk_str(sb_done(&b));
        break;
    }
    case T_INT: P->i++; n->lit = mk_int(t->i); break;
    case T_FLOAT: P->i++; n->lit = mk_float(t->f); break;
    case T_OP:
        if (at_op(P, "(")) {
            P->i++;
            node *x = p_expr(P);
            if (at_op(P, ",")) { /* a tuple: a list here */
                nlist items = {0};
                nl_add(P, &items, x);
                while (at_op(P, ",")) { P->i++; if (at_op(P, ")")) break; nl_add(P, &items, p_expr(P)); }
                x = nd(P, E_LIST, t->line);
                x->v = items.p;
                x->nv = items.n;
            }
            expect_op(P, ")");
            n = x;
            break;
        }
        if (at_op(P, "[") || at_op(P, "{")) {
            bool is_dict = at_op(P, "{");
            const char *close = is_dict ? "}" : "]";
            nlist keys = {0}, vals = {0};
            P->i++;
            n->k = is_dict ? E_DICT : E_LIST;
            while (!at_op(P, close)) {
                if (keys.n) { expect_op(P, ","); if (at_op(P, close)) break; }
                nl_add(P, &keys, p_expr(P));
                if (is_dict) { expect_op(P, ":"); nl_add(P, &vals, p_expr(P)); }
            }
            P->i++;
            n->v = keys.p;
            n->nv = keys.n;
            n->w = vals.p;
            n->nw = vals.n;
            break;
        }
        /* fall through */
    default: ct_fail(P->e, t->line, "unexpected %s", t->k == T_END ? "end of tag" : "token");
    }
    P->depth--;
    return n;
}

static node *p_postfix(parser *P, node *n)
{
    for (;;) {
        int line = cur(P)->line;
        if (at_op(P, ".")) {
            P->i++;
            node *x = nd(P, E_ATTR, line);
            x->a = n;
            if (cur(P)->k == T_INT) { /* a.0 is a[0] */
                x->k = E_ITEM;
                x->b = nd(P, E_LIT, line);
                x->b->lit = mk_int(P->t[P->i++].i);
            } else x->s = expect_name(P);
            n = x;
        } else if (at_op(P, "[")) {
            P->i++;
            node *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            while (!at_op(P, "]")) {
                if (at_op(P, ":")) { P->i++; slice = true; if (++np > 2) ct_fail(P->e, line, "bad slice"); continue; }
                if (parts[np]) ct_fail(P->e, line, "bad subscript");
                parts[np] = p_expr(P);
            }
            P->i++;
            node *x = nd(P, slice ? E_SLICE : E_ITEM, line);
            x->a = n;
            if (slice) { x->v = ct_alloc(P->e, 3 * sizeof(node *)); memcpy(x->v, parts, sizeof parts); x->nv = 3; }
            else if (!(x->b = parts[0])) ct_fail(P->e, line, "empty subscript");
            n = x;
        } else if (at_op(P, "(")) {
            node *x = nd(P, E_CALL, line);
            x->a = n;
            p_args(P, x);
            n = x;
        } else return n;
    }
}

/* `| filter(args)`, `is [not] test [arg]`, and calls after them. */
static node *p_filters(parser *P, node *n)
{
    for (;;) {
        int line = cur(P)->line;
        if (at_op(P, "|")) {
            P->i++;
            node *x = nd(P, E_FILTER, line);
            x->a = n;
            x->s = expect_name(P);
            if (!known(filters, x->s)) ct_fail(P->e, line, "filter '%.*s' is not supported by Loom", (int)x->s.n, x->s.s);
            if (at_op(P, "(")) p_args(P, x);
            n = x;
        } else if (at_name(P, "is")) {
            P->i++;
            node *x = nd(P, E_TEST, line);
            x->a = n;
            if (at_name(P, "not")) { P->i++; x->neg = true; }
            if (cur(P)->k == T_NAME) x->s = expect_name(P);
            else if (cur(P)->k == T_OP) x->s = P->t[P->i++].s; /* is == x */
            else ct_fail(P->e, line, "expected a test name");
            if (!known(tests, x->s)) ct_fail(P->e, line, "test '%.*s' is not supported by Loom", (int)x->s.n, x->s.s);
            if (at_op(P, "(")) p_args(P, x);
            else if ((cur(P)->k == T_NAME && !at_name(P, "else") && !at_name(P, "or") && !at_name(P, "and") &&
                      !at_name(P, "if")) || cur(P)->k == T_STR || cur(P)->k == T_INT || cur(P)->k == T_FLOAT) {
                x->v = ct_alloc(P->e, sizeof(node *));
                x->v[0] = p_postfix(P, p_primary(P));
                x->nv = 1;
            }
            n = x;
        } else if (at_op(P, "(")) {
            node *x = nd(P, E_CALL, line);
            x->a = n;
            p_args(P, x);
            n = x;
        } else return n;
    }
}

static node *p_unary(parser *P, bool with_filter)
{
    int line = cur(P)->line;
    node *n;
    if (at_op(P, "-") || at_op(P, "+")) {
        bool neg = at_op(P, "-");
        P->i++;
        n = nd(P, neg ? E_NEG : E_POS, line);
        n->a = p_unary(P, false);
    } else n = p_primary(P);
    n = p_postfix(P, n);
    return with_filter ? p_filters(P, n) : n;
}

static node *bin(parser *P, const char *op, node *a, node *b, int line)
{
    node *n = nd(P, E_BIN, line);
    n->s = S(op);
    n->a = a;
    n->b = b;
    return n;
}

static node *p_pow(parser *P)
{
    node *n = p_unary(P, true);
    while (at_op(P, "**")) { int l = cur(P)->line; P->i++; n = bin(P, "**", n, p_unary(P, true), l); }
    return n;
}

static node *p_math2(parser *P)
{
    node *n = p_pow(P);
    while (at_op(P, "*") || at_op(P, "/") || at_op(P, "//") || at_op(P, "%")) {
        token *t = &P->t[P->i++];
        n = bin(P, t->s.s, n, p_pow(P), t->line);
    }
    return n;
}

static node *p_concat(parser *P)
{
    node *n = p_math2(P);
    while (at_op(P, "~")) { int l = cur(P)->line; P->i++; n = bin(P, "~", n, p_math2(P), l); }
    return n;
}

static node *p_math1(parser *P)
{
    node *n = p_concat(P);
    while (at_op(P, "+") || at_op(P, "-")) {
        token *t = &P->t[P->i++];
        n = bin(P, t->s.s, n, p_concat(P), t->line);
    }
    return n;
}

static node *p_compare(parser *P)
{
    node *n = p_math1(P);
    for (;;) {
        int line = cur(P)->line;
        const char *op = NULL;
        static const char *const ops[] = {"==", "!=", "<", ">", "<=", ">="};
        for (int i = 0; i < 6 && !op; i++) if (at_op(P, ops[i])) op = ops[i];
        if (op) P->i++;
        else if (at_name(P, "in")) { P->i++; op = "in"; }
        else if (at_name(P, "not") && P->t[P->i + 1].k == T_NAME && str_is(P->t[P->i + 1].s, "in")) { P->i += 2; op = "not in"; }
        else return n;
        n = bin(P, op, n, p_math1(P), line);
    }
}

static node *p_not(parser *P)
{
    if (at_name(P, "not")) {
        node *n = nd(P, E_NOT, cur(P)->line);
        P->i++;
        if (++P->depth > CT_MAX_DEPTH) ct_fail(P->e, n->line, "expression nested too deeply");
        n->a = p_not(P);
        P->depth--;
        return n;
    }
    return p_compare(P);
}

/* `a or b` (is_or) over `a and b` over `not a`, each left-associative. */
static node *p_logic(parser *P, bool is_or)
{
    node *n = is_or ? p_logic(P, false) : p_not(P);
    while (at_name(P, is_or ? "or" : "and")) {
        node *x = nd(P, is_or ? E_OR : E_AND, cur(P)->line);
        P->i++;
        x->a = n;
        x->b = is_or ? p_logic(P, false) : p_not(P);
        n = x;
    }
    return n;
}

static node *p_or(parser *P) { return p_logic(P, true); }

/* a if cond [else b] */
static node *p_expr(parser *P)
{
    node *n = p_or(P);
    while (at_name(P, "if")) {
        node *x = nd(P, E_COND, cur(P)->line);
        P->i++;
        x->a = n;
        x->b = p_or(P);
        if (at_name(P, "else")) { P->i++; x->c = p_or(P); }
        n = x;
    }
    return n;
}

static nlist p_body(parser *P, const char *const *stop);

/* At a block tag: is its first name one of stop? */
static bool at_stop(parser *P, const char *const *stop)
{
    if (!stop || cur(P)->k != T_BLOCK || P->t[P->i + 1].k != T_NAME) return false;
    for (int i = 0; stop[i]; i++) if (str_is(P->t[P->i + 1].s, stop[i])) return true;
    return false;
}

/* Consumes `{% name` of the block tag the body stopped at; returns the name. */
static str p_block_name(parser *P)
{
    P->i++;
    return expect_name(P);
}

/* Ends the current tag (`%}`), then reads a body up to `{% end`, which it consumes; the
 * caller ends that tag. */
static nlist p_body_to(parser *P, const char *end)
{
    const char *const stop[] = {end, NULL};
    expect_end(P);
    nlist body = p_body(P, stop);
    p_block_name(P);
    return body;
}

static node *p_if(parser *P, int line)
{
    static const char *const stop[] = {"elif", "else", "endif", NULL};
    node *n = nd(P, S_IF, line);
    n->a = p_expr(P);
    expect_end(P);
    nlist body = p_body(P, stop);
    n->v = body.p;
    n->nv = body.n;
    int l = cur(P)->line;
    str w = p_block_name(P);
    if (str_is(w, "elif")) {
        n->w = ct_alloc(P->e, sizeof(node *));
        n->w[0] = p_if(P, l); /* consumes the shared endif */
        n->nw = 1;
        return n;
    }
    if (str_is(w, "else")) {
        nlist els = p_body_to(P, "endif");
        n->w = els.p;
        n->nw = els.n;
    }
    expect_end(P);
    return n;
}

static node *p_for(parser *P, int line)
{
    static const char *const stop[] = {"else", "endfor", NULL};
    node *n = nd(P, S_FOR, line);
    n->s = expect_name(P);
    if (at_op(P, ",")) { P->i++; n->s2 = expect_name(P); }
    if (!at_name(P, "in")) ct_fail(P->e, line, "expected 'in' in the for tag");
    P->i++;
    n->a = p_or(P);
    if (at_name(P, "if")) { P->i++; n->b = p_expr(P); }
    if (at_name(P, "recursive")) ct_fail(P->e, line, "recursive loops are not supported by Loom");
    expect_end(P);
    nlist body = p_body(P, stop);
    n->v = body.p;
    n->nv = body.n;
    if (str_is(p_block_name(P), "else")) {
        nlist els = p_body_to(P, "endfor");
        n->w = els.p;
        n->nw = els.n;
    }
    expect_end(P);
    return n;
}

static node *p_stmt(parser *P)
{
    int line = cur(P)->line;
    P->i++; /* T_BLOCK */
    str w = expect_name(P);
    if (str_is(w, "if")) return p_if(P, line);
    if (str_is(w, "for")) return p_for(P, line);
    if (str_is(w, "set")) {
        node *n = nd(P, S_SET, line);
        n->s = expect_name(P);
        if (at_op(P, ".")) { P->i++; n->s2 = expect_name(P); }
        if (at_op(P, "=")) {
            P->i++;
            n->a = p_expr(P);
            expect_end(P);
            return n;
        }
        nlist body = p_body_to(P, "endset"); /* {% set x %}...{% endset %} */
        n->v = body.p;
        n->nv = body.n;
        expect_end(P);
        return n;
    }
    if (str_is(w, "break") || str_is(w, "continue")) {
        expect_end(P);
        return nd(P, str_is(w, "break") ? S_BREAK : S_CONTINUE, line);
    }
    if (str_is(w, "generation")) { /* transformers' assistant-mask marker: renders its body */
        node *n = nd(P, S_BLOCK, line);
        nlist body = p_body_to(P, "endgeneration");
        n->v = body.p;
        n->nv = body.n;
        expect_end(P);
        return n;
    }
    ct_fail(P->e, line, "the '%.*s' statement is not supported by Loom", (int)w.n, w.s);
    return NULL;
}

static nlist p_body(parser *P, const char *const *stop)
{
    nlist l = {0};
    if (++P->depth > CT_MAX_DEPTH) ct_fail(P->e, cur(P)->line, "blocks nested too deeply");
    for (;;) {
        token *t = cur(P);
        if (t->k == T_EOF) {
            if (stop) { /* the last stop word is the closing one */
                int k = 0;
                while (stop[k + 1]) k++;
                ct_fail(P->e, t->line, "missing {%% %s %%}", stop[k]);
            }
            break;
        }
        if (at_stop(P, stop)) break;
        if (t->k == T_TEXT) {
            node *n = nd(P, S_TEXT, t->line);
            n->s = t->s;
            nl_add(P, &l, n);
            P->i++;
        } else if (t->k == T_VAR) {
            node *n = nd(P, S_OUT, t->line);
            P->i++;
            n->a = p_expr(P);
            expect_end(P);
            nl_add(P, &l, n);
        } else if (t->k == T_BLOCK) {
            if (P->t[P->i + 1].k == T_NAME &&
                (str_is(P->t[P->i + 1].s, "endif") || str_is(P->t[P->i + 1].s, "endfor") ||
                 str_is(P->t[P->i + 1].s, "else") || str_is(P->t[P->i + 1].s, "elif") ||
                 str_is(P->t[P->i + 1].s, "endset") || str_is(P->t[P->i + 1].s, "endgeneration")))
                ct_fail(P->e, t->line, "unexpected {%% %.*s %%}", (int)P->t[P->i + 1].s.n, P->t[P->i + 1].s.s);
            nl_add(P, &l, p_stmt(P));
        } else ct_fail(P->e, t->line, "unexpected token");
    }
    P->depth--;
    return l;
}

/* ---- evaluation ---------------------------------------------------------------------------- */

typedef struct scope {
    struct scope *up;
    dict *vars;
} scope;

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

typedef struct {
    ct_env *e;
    scope *sc;
    sbuf *out;
    sbuf result; /* the output (malloc'd), where out points outside block sets */
    long steps;
    int depth, ctl;
} render;

static value eval(render *R, const node *n);
static void exec_body(render *R, node *const *body, int n);

static void step(render *R, int line)
{
    if (++R->steps > CT_MAX_STEPS) ct_fail(R->e, line, "more than %d evaluation steps", CT_MAX_STEPS);
}

static value lookup(render *R, str name)
{
    for (scope *s = R->sc; s; s = s->up) {
        value *v = dict_get(s->vars, name);
        if (v) return *v;
    }
    return mk_undef(name);
}

static void need_defined(render *R, int line, value v)
{
    if (v.k == V_UNDEF) ct_fail(R->e, line, "'%.*s' is undefined", (int)v.s.n, v.s.s);
}

static value get_attr(render *R, int line, value obj, str name)
{
    need_defined(R, line, obj);
    if (obj.k == V_DICT || obj.k == V_NS) {
        value *v = dict_get(obj.d, name);
        if (v) return *v;
    }
    return mk_undef(name);
}

/* Python's slice indices for a sequence of n: start, count and step of the result. */
static void py_slice(render *R, int line, size_t n, value *parts, int64_t *start, int64_t *cnt, int64_t *stp)
{
    int64_t step = 1, N = (int64_t)n;
    if (parts[2].k != V_NONE && parts[2].k != V_UNDEF) {
        if (parts[2].k != V_INT || parts[2].i == 0) ct_fail(R->e, line, "slice step must be a non-zero integer");
        step = parts[2].i;
    }
    int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? N : N - 1, b[2];
    for (int k = 0; k < 2; k++) {
        value p = parts[k];
        if (p.k == V_NONE || p.k == V_UNDEF) { b[k] = k == 0 ? (step > 0 ? lo : hi) : (step > 0 ? hi : lo); continue; }
        if (p.k != V_INT && p.k != V_BOOL) ct_fail(R->e, line, "slice indices must be integers");
        int64_t x = inum(p);
        if (x < 0) { x += N; if (x < lo) x = lo; }
        else if (x > hi) x = hi;
        b[k] = x;
    }
    int64_t c = step > 0 ? (b[1] - b[0] + step - 1) / step : (b[0] - b[1] - step - 1) / -step;
    *start = b[0];
    *cnt = c > 0 ? c : 0;
    *stp = step;
}

static value get_item(render *R, int line, value obj, value key)
{
    need_defined(R, line, obj);
    if ((obj.k == V_DICT || obj.k == V_NS) && key.k == V_STR) {
        value *v = dict_get(obj.d, key.s);
        return v ? *v : mk_undef(key.s);
    }
    if ((obj.k == V_LIST || obj.k == V_STR) && (key.k == V_INT || key.k == V_BOOL)) {
        size_t n, *off = NULL;
        if (obj.k == V_STR) u8_decode(R->e, obj.s, &n, &off);
        else n = obj.l->n;
        int64_t i = inum(key);
        if (i < 0) i += (int64_t)n;
        if (i < 0 || i >= (int64_t)n) return mk_undef(S("item"));
        if (obj.k == V_LIST) return obj.l->v[i];
        return mk_str((str){obj.s.s + off[i], off[i + 1] - off[i]});
    }
    return mk_undef(key.k == V_STR ? key.s : S("item"));
}

/* The items a for loop or a filter iterates: list elements, dict keys, characters. */
static list *iter_items(render *R, int line, value v)
{
    if (v.k == V_LIST) return v.l;
    if (v.k == V_UNDEF) return list_new(R->e, 0);
    if (v.k == V_DICT) {
        list *l = list_new(R->e, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) l->v[i] = mk_str(v.d->key[i]);
        return l;
    }
    if (v.k == V_STR) {
        size_t n, *off;
        u8_decode(R->e, v.s, &n, &off);
        list *l = list_new(R->e, n);
        for (size_t i = 0; i < n; i++) l->v[i] = mk_str((str){v.s.s + off[i], off[i + 1] - off[i]});
        return l;
    }
    ct_fail(R->e, line, "'%s' object is not iterable", type_name(v));
    return NULL;
}

/* Evaluated call arguments. */
typedef struct {
    value *pos, *kwv;
    str *kw;
    int npos, nkw;
} args;

static args eval_args(render *R, const node *n)
{
    args a = {.npos = n->nv, .nkw = n->nw, .kw = n->kw};
    a.pos = ct_alloc(R->e, (size_t)(n->nv + 1) * sizeof(value));
    a.kwv = ct_alloc(R->e, (size_t)(n->nw + 1) * sizeof(value));
    for (int i = 0; i < n->nv; i++) a.pos[i] = eval(R, n->v[i]);
    for (int i = 0; i < n->nw; i++) a.kwv[i] = eval(R, n->w[i]);
    return a;
}

/* Argument i, or the keyword argument name, or def. */
static value arg(const args *a, int i, const char *name, value def)
{
    if (i >= 0 && i < a->npos) return a->pos[i];
    for (int k = 0; name && k < a->nkw; k++) if (str_is(a->kw[k], name)) return a->kwv[k];
    return def;
}

static str arg_str(render *R, int line, const args *a, int i, const char *name, const char *what)
{
    value v = arg(a, i, name, undef);
    if (v.k != V_STR) ct_fail(R->e, line, "%s expects a string argument", what);
    return v.s;
}

/* Python's strip family: which ends (1 left, 2 right), chars (none: whitespace). */
static str py_strip(render *R, str s, value chars, int ends)
{
    size_t nset = 0, ncp, *off;
    int32_t *set = chars.k == V_STR ? u8_decode(R->e, chars.s, &nset, NULL) : NULL;
    int32_t *cp = u8_decode(R->e, s, &ncp, &off);
    size_t a = 0, b = ncp;
#define STRIPS(c) (set ? memchr_cp(set, nset, c) : py_space(c))
    if (ends & 1) while (a < b && STRIPS(cp[a])) a++;
    if (ends & 2) while (b > a && STRIPS(cp[b - 1])) b--;
#undef STRIPS
    return (str){s.s + off[a], off[b] - off[a]};
}

/* Appends to a growing array of values in the arena. */
static void vpush(render *R, list *l, size_t *cap, value v)
{
    if (l->n == *cap) {
        *cap = *cap ? 2 * *cap : 8;
        value *nv = ct_alloc(R->e, *cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
    }
    l->v[l->n++] = v;
}

/* Python's str.split(sep=None, maxsplit=-1). */
static value py_split(render *R, int line, str s, value sep, int64_t maxsplit)
{
    list *l = list_new(R->e, 0);
    size_t cap = 0;
    bool more = true; /* splits left */
    if (sep.k == V_STR) {
        if (!sep.s.n) ct_fail(R->e, line, "split: empty separator");
        size_t a = 0;
        for (size_t i = 0; i + sep.s.n <= s.n;) {
            more = maxsplit < 0 || (int64_t)l->n < maxsplit;
            if (more && !memcmp(s.s + i, sep.s.s, sep.s.n)) {
                vpush(R, l, &cap, mk_str((str){s.s + a, i - a}));
                i += sep.s.n;
                a = i;
            } else i++;
        }
        vpush(R, l, &cap, mk_str((str){s.s + a, s.n - a}));
    } else if (sep.k == V_NONE || sep.k == V_UNDEF) { /* runs of whitespace, no empty items */
        size_t i = 0, l8;
        for (;;) {
            while (i < s.n && py_space(u8_next(s.s + i, s.n - i, &l8))) i += l8;
            if (i >= s.n) break;
            size_t a = i;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                vpush(R, l, &cap, mk_str(py_strip(R, (str){s.s + a, s.n - a}, none, 2)));
                break;
            }
            while (i < s.n && !py_space(u8_next(s.s + i, s.n - i, &l8))) i += l8;
            vpush(R, l, &cap, mk_str((str){s.s + a, i - a}));
        }
    } else ct_fail(R->e, line, "split: the separator must be a string");
    return mk_list(l);
}

static str py_replace(render *R, str s, str old, str new, int64_t count)
{
    sbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (!old.n) return s; /* Python inserts between characters; no template needs that */
    while (i < s.n) {
        if ((count < 0 || done < count) && i + old.n <= s.n && !memcmp(s.s + i, old.s, old.n)) {
            sb_add(R->e, &b, new.s, new.n);
            i += old.n;
            done++;
        } else sb_add(R->e, &b, s.s + i++, 1);
    }
    return sb_done(&b);
}

/* Case mapping per code point (utf8proc's simple mappings). mode: 0 lower, 1 upper,
 * 2 capitalize (first upper, rest lower), 3 title (upper after a non-letter). */
static str py_case(render *R, str s, int mode)
{
    sbuf b = {0};
    size_t l;
    bool prev_letter = false;
    for (size_t i = 0; i < s.n; i += l) {
        int32_t c = u8_next(s.s + i, s.n - i, &l);
        bool up = mode == 1 || (mode == 2 && i == 0) || (mode == 3 && !prev_letter);
        int32_t m = up ? utf8proc_toupper(c) : utf8proc_tolower(c);
        utf8proc_category_t cat = utf8proc_category(c);
        prev_letter = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        uint8_t o[4];
        utf8proc_ssize_t k = utf8proc_encode_char(m, o);
        sb_add(R->e, &b, (const char *)o, (size_t)k);
    }
    return sb_done(&b);
}

static bool starts_or_ends(render *R, int line, str s, value x, bool end)
{
    if (x.k == V_LIST) {
        for (size_t i = 0; i < x.l->n; i++) if (starts_or_ends(R, line, s, x.l->v[i], end)) return true;
        return false;
    }
    if (x.k != V_STR) ct_fail(R->e, line, "%s expects a string", end ? "endswith" : "startswith");
    if (x.s.n > s.n) return false;
    return !memcmp(s.s + (end ? s.n - x.s.n : 0), x.s.s, x.s.n);
}

static value dict_items(render *R, dict *d, int what) /* 0 items, 1 keys, 2 values */
{
    list *l = list_new(R->e, d->n);
    for (size_t i = 0; i < d->n; i++) {
        if (what == 1) l->v[i] = mk_str(d->key[i]);
        else if (what == 2) l->v[i] = d->val[i];
        else {
            list *p = list_new(R->e, 2);
            p->v[0] = mk_str(d->key[i]);
            p->v[1] = d->val[i];
            l->v[i] = mk_list(p);
        }
    }
    return mk_list(l);
}

static value call_method(render *R, int line, value obj, str m, const args *a)
{
    need_defined(R, line, obj);
    if (obj.k == V_STR) {
        str s = obj.s;
        if (str_is(m, "startswith") || str_is(m, "endswith"))
            return mk_bool(starts_or_ends(R, line, s, arg(a, 0, NULL, undef), str_is(m, "endswith")));
        if (str_is(m, "strip")) return mk_str(py_strip(R, s, arg(a, 0, "chars", none), 3));
        if (str_is(m, "lstrip")) return mk_str(py_strip(R, s, arg(a, 0, "chars", none), 1));
        if (str_is(m, "rstrip")) return mk_str(py_strip(R, s, arg(a, 0, "chars", none), 2));
        if (str_is(m, "split")) {
            value mx = arg(a, 1, "maxsplit", mk_int(-1));
            return py_split(R, line, s, arg(a, 0, "sep", none), mx.k == V_INT ? mx.i : -1);
        }
        if (str_is(m, "lower")) return mk_str(py_case(R, s, 0));
        if (str_is(m, "upper")) return mk_str(py_case(R, s, 1));
        if (str_is(m, "capitalize")) return mk_str(py_case(R, s, 2));
        if (str_is(m, "title")) return mk_str(py_case(R, s, 3));
        if (str_is(m, "replace")) {
            value c = arg(a, 2, "count", mk_int(-1));
            return mk_str(py_replace(R, s, arg_str(R, line, a, 0, "old", "replace"), arg_str(R, line, a, 1, "new", "replace"),
                                     c.k == V_INT ? c.i : -1));
        }
        if (str_is(m, "find") || str_is(m, "count")) {
            str sub = arg_str(R, line, a, 0, "sub", "find");
            int64_t cnt = 0, at = -1;
            for (size_t i = 0; i + sub.n <= s.n; i++) {
                if (memcmp(s.s + i, sub.s, sub.n)) continue;
                if (at < 0) at = (int64_t)u8_count((str){s.s, i});
                cnt++;
                if (sub.n) i += sub.n - 1;
            }
            return mk_int(str_is(m, "find") ? at : cnt);
        }
        if (str_is(m, "join")) {
            list *l = iter_items(R, line, arg(a, 0, NULL, undef));
            sbuf b = {0};
            for (size_t i = 0; i < l->n; i++) {
                if (i) sb_add(R->e, &b, s.s, s.n);
                if (l->v[i].k != V_STR) ct_fail(R->e, line, "join: sequence item %zu is not a string", i);
                sb_add(R->e, &b, l->v[i].s.s, l->v[i].s.n);
            }
            return mk_str(sb_done(&b));
        }
        if (str_is(m, "isdigit") || str_is(m, "isalpha") || str_is(m, "isspace")) {
            size_t l8;
            bool ok = s.n > 0;
            for (size_t i = 0; i < s.n && ok; i += l8) {
                int32_t c = u8_next(s.s + i, s.n - i, &l8);
                utf8proc_category_t k = utf8proc_category(c);
                ok = m.s[2] == 'd' ? k == UTF8PROC_CATEGORY_ND
                   : m.s[2] == 'a' ? (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) : py_space(c);
            }
            return mk_bool(ok);
        }
    } else if (obj.k == V_DICT || obj.k == V_NS) {
        if (str_is(m, "items")) return dict_items(R, obj.d, 0);
        if (str_is(m, "keys")) return dict_items(R, obj.d, 1);
        if (str_is(m, "values")) return dict_items(R, obj.d, 2);
        if (str_is(m, "get")) {
            value k = arg(a, 0, "key", undef), *v = k.k == V_STR ? dict_get(obj.d, k.s) : NULL;
            return v ? *v : arg(a, 1, "default", none);
        }
    }
    ct_fail(R->e, line, "'%s' object has no method '%.*s' that Loom supports", type_name(obj), (int)m.n, m.s);
    return undef;
}

static value call_global(render *R, int line, int fn, const args *a)
{
    switch (fn) {
    case FN_NAMESPACE:
    case FN_DICT: {
        dict *d = dict_new(R->e);
        for (int i = 0; i < a->npos; i++) {
            if (a->pos[i].k != V_DICT) ct_fail(R->e, line, "namespace()/dict() take keyword arguments or a dict");
            for (size_t k = 0; k < a->pos[i].d->n; k++) dict_set(R->e, d, a->pos[i].d->key[k], a->pos[i].d->val[k]);
        }
        for (int i = 0; i < a->nkw; i++) dict_set(R->e, d, a->kw[i], a->kwv[i]);
        return (value){.k = fn == FN_NAMESPACE ? V_NS : V_DICT, .d = d};
    }
    case FN_RANGE: {
        int64_t r[3] = {0, 0, 1};
        if (a->npos < 1 || a->npos > 3) ct_fail(R->e, line, "range() takes 1 to 3 integers");
        for (int i = 0; i < a->npos; i++) {
            if (a->pos[i].k != V_INT) ct_fail(R->e, line, "range() takes integers");
            r[a->npos == 1 ? 1 : i] = a->pos[i].i;
        }
        if (r[2] == 0) ct_fail(R->e, line, "range() step must not be zero");
        int64_t n = r[2] > 0 ? (r[1] - r[0] + r[2] - 1) / r[2] : (r[0] - r[1] - r[2] - 1) / -r[2];
        if (n < 0) n = 0;
        if (n > CT_MAX_RANGE) ct_fail(R->e, line, "range() of more than %d items", CT_MAX_RANGE);
        list *l = list_new(R->e, (size_t)n);
        for (int64_t i = 0; i < n; i++) l->v[i] = mk_int(r[0] + i * r[2]);
        return mk_list(l);
    }
    case FN_RAISE: {
        str m = to_str(R->e, arg(a, 0, NULL, mk_str(S(""))));
        ct_fail(R->e, line, "the template raised an error: %.*s", (int)(m.n > 300 ? 300 : m.n), m.s);
    }
    case FN_STRFTIME: {
        str f = arg_str(R, line, a, 0, NULL, "strftime_now");
        char fmt[128], o[256];
        snprintf(fmt, sizeof fmt, "%.*s", (int)f.n, f.s);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t k = strftime(o, sizeof o, fmt, &tm);
        return mk_str(str_dup(R->e, o, k));
    }
    }
    return undef;
}

/* ---- tests and filters ------------------------------------------------------------------------ */

static bool run_test(render *R, int line, str name, value v, const args *a)
{
    value x = arg(a, 0, NULL, undef);
    if (str_is(name, "defined")) return v.k != V_UNDEF;
    if (str_is(name, "undefined")) return v.k == V_UNDEF;
    if (str_is(name, "none")) return v.k == V_NONE;
    if (str_is(name, "string")) return v.k == V_STR;
    if (str_is(name, "number")) return is_num(v);
    if (str_is(name, "integer")) return v.k == V_INT;
    if (str_is(name, "float")) return v.k == V_FLOAT;
    if (str_is(name, "boolean")) return v.k == V_BOOL;
    if (str_is(name, "true")) return v.k == V_BOOL && v.b;
    if (str_is(name, "false")) return v.k == V_BOOL && !v.b;
    if (str_is(name, "mapping")) return v.k == V_DICT;
    if (str_is(name, "iterable") || str_is(name, "sequence")) return v.k == V_LIST || v.k == V_DICT || v.k == V_STR;
    if (str_is(name, "callable")) return v.k == V_FUNC;
    if (str_is(name, "odd") || str_is(name, "even") || str_is(name, "divisibleby")) {
        int64_t d = str_is(name, "divisibleby") ? (x.k == V_INT ? x.i : 0) : 2;
        if (v.k != V_INT || d == 0) ct_fail(R->e, line, "test '%.*s' needs integers", (int)name.n, name.s);
        int64_t r = v.i % d;
        return str_is(name, "odd") ? r != 0 : r == 0;
    }
    if (str_is(name, "eq") || str_is(name, "equalto") || str_is(name, "==")) return py_eq(v, x);
    if (str_is(name, "ne") || str_is(name, "!=")) return !py_eq(v, x);
    if (str_is(name, "sameas")) return v.k == x.k && (v.k <= V_NONE || py_eq(v, x));
    if (str_is(name, "lower") || str_is(name, "upper")) {
        if (v.k != V_STR) return false;
        str c = py_case(R, v.s, str_is(name, "upper"));
        return str_eq(c, v.s);
    }
    if (str_is(name, "in")) {
        if (x.k == V_STR && v.k == V_STR) return memmem(x.s.s, x.s.n, v.s.s, v.s.n) != NULL || !v.s.n;
        list *l = iter_items(R, line, x);
        for (size_t i = 0; i < l->n; i++) if (py_eq(l->v[i], v)) return true;
        return false;
    }
    int c = py_cmp(R->e, line, v, x, "<");
    if (str_is(name, "lt") || str_is(name, "<")) return c < 0;
    if (str_is(name, "gt") || str_is(name, ">")) return c > 0;
    if (str_is(name, "le") || str_is(name, "<=")) return c <= 0;
    return c >= 0; /* ge, >= */
}

/* Arguments from position `from` on, as a test's arguments (select, selectattr). */
static args shift_args(const args *a, int from)
{
    args b = *a;
    b.pos = a->pos + (from < a->npos ? from : a->npos);
    b.npos = from < a->npos ? a->npos - from : 0;
    b.nkw = 0;
    return b;
}

static value apply_filter(render *R, int line, str f, value v, const args *a);

static value select_items(render *R, int line, str f, value v, const args *a)
{
    bool attr = f.s[f.n - 4] == 'a', keep_true = f.s[0] == 's';
    list *in = iter_items(R, line, v), *out = list_new(R->e, in->n);
    out->n = 0;
    str attr_name = attr ? arg_str(R, line, a, 0, NULL, "selectattr") : (str){0};
    int ti = attr ? 1 : 0;
    value test = arg(a, ti, NULL, undef);
    if (test.k != V_UNDEF && test.k != V_STR) ct_fail(R->e, line, "%.*s: the test name must be a string", (int)f.n, f.s);
    if (test.k == V_STR && !known(tests, test.s))
        ct_fail(R->e, line, "test '%.*s' is not supported by Loom", (int)test.s.n, test.s.s);
    args targs = shift_args(a, ti + 1);
    for (size_t i = 0; i < in->n; i++) {
        value x = attr ? get_attr(R, line, in->v[i], attr_name) : in->v[i];
        bool ok = test.k == V_STR ? run_test(R, line, test.s, x, &targs) : truthy(x);
        if (ok == keep_true) out->v[out->n++] = in->v[i];
    }
    return mk_list(out);
}

static value apply_filter(render *R, int line, str f, value v, const args *a)
{
    ct_env *e = R->e;
    if (str_is(f, "trim")) return mk_str(py_strip(R, to_str(e, v), arg(a, 0, "chars", none), 3));
    if (str_is(f, "length") || str_is(f, "count")) {
        if (v.k == V_STR) return mk_int((int64_t)u8_count(v.s));
        if (v.k == V_LIST) return mk_int((int64_t)v.l->n);
        if (v.k == V_DICT || v.k == V_NS) return mk_int((int64_t)v.d->n);
        if (v.k == V_UNDEF) return mk_int(0);
        ct_fail(e, line, "object of type '%s' has no len()", type_name(v));
    }
    if (str_is(f, "tojson")) {
        value ind = arg(a, 0, "indent", none);
        sbuf b = {0};
        to_json(e, &b, v, ind.k == V_INT ? (int)ind.i : -1, 0, line);
        return mk_str(sb_done(&b));
    }
    if (str_is(f, "string")) return mk_str(to_str(e, v));
    if (str_is(f, "lower")) return mk_str(py_case(R, to_str(e, v), 0));
    if (str_is(f, "upper")) return mk_str(py_case(R, to_str(e, v), 1));
    if (str_is(f, "capitalize")) return mk_str(py_case(R, to_str(e, v), 2));
    if (str_is(f, "title")) return mk_str(py_case(R, to_str(e, v), 3));
    if (str_is(f, "first") || str_is(f, "last")) {
        list *l = iter_items(R, line, v);
        return l->n ? l->v[f.s[0] == 'f' ? 0 : l->n - 1] : mk_undef(f);
    }
    if (str_is(f, "join")) {
        value sep = arg(a, 0, "d", mk_str(S(""))), at = arg(a, 1, "attribute", none);
        list *l = iter_items(R, line, v);
        sbuf b = {0};
        str s = to_str(e, sep);
        for (size_t i = 0; i < l->n; i++) {
            if (i) sb_add(e, &b, s.s, s.n);
            to_text(e, &b, at.k == V_STR ? get_attr(R, line, l->v[i], at.s) : l->v[i], false);
        }
        return mk_str(sb_done(&b));
    }
    if (str_is(f, "default") || str_is(f, "d")) {
        bool boolean = truthy(arg(a, 1, "boolean", mk_bool(false)));
        return v.k == V_UNDEF || (boolean && !truthy(v)) ? arg(a, 0, "default_value", mk_str(S(""))) : v;
    }
    if (str_is(f, "replace")) {
        value c = arg(a, 2, "count", none);
        return mk_str(py_replace(R, to_str(e, v), arg_str(R, line, a, 0, "old", "replace"),
                                 arg_str(R, line, a, 1, "new", "replace"), c.k == V_INT ? c.i : -1));
    }
    if (str_is(f, "list")) return mk_list(iter_items(R, line, v));
    if (str_is(f, "reverse")) {
        list *in = iter_items(R, line, v), *out = list_new(e, in->n);
        for (size_t i = 0; i < in->n; i++) out->v[i] = in->v[in->n - 1 - i];
        if (v.k != V_STR) return mk_list(out);
        sbuf b = {0};
        for (size_t i = 0; i < out->n; i++) sb_add(e, &b, out->v[i].s.s, out->v[i].s.n);
        return mk_str(sb_done(&b));
    }
    if (str_is(f, "int") || str_is(f, "float")) {
        bool want_int = f.s[0] == 'i';
        double d = 0;
        if (is_num(v)) d = num(v);
        else if (v.k == V_STR) {
            char tmp[64];
            snprintf(tmp, sizeof tmp, "%.*s", (int)(v.s.n < 63 ? v.s.n : 63), v.s.s);
            char *end;
            d = want_int ? (double)strtoll(tmp, &end, 10) : strtod(tmp, &end);
            if (end == tmp) d = 0;
        }
        if (v.k == V_INT && want_int) return v;
        return want_int ? mk_int((int64_t)d) : mk_float(d);
    }
    if (str_is(f, "abs")) {
        if (v.k == V_INT || v.k == V_BOOL) return mk_int(inum(v) < 0 ? -inum(v) : inum(v));
        if (v.k == V_FLOAT) return mk_float(fabs(v.f));
        ct_fail(e, line, "bad operand type for abs(): '%s'", type_name(v));
    }
    if (str_is(f, "items")) {
        if (v.k == V_UNDEF) return mk_list(list_new(e, 0));
        if (v.k != V_DICT && v.k != V_NS) ct_fail(e, line, "items: expected a dict, got %s", type_name(v));
        return dict_items(R, v.d, 0);
    }
    if (str_is(f, "safe")) return v;
    if (str_is(f, "e") || str_is(f, "escape")) {
        str s = to_str(e, v);
        sbuf b = {0};
        for (size_t i = 0; i < s.n; i++) {
            const char *r = s.s[i] == '&' ? "&amp;" : s.s[i] == '<' ? "&lt;" : s.s[i] == '>' ? "&gt;"
                          : s.s[i] == '"' ? "&#34;" : s.s[i] == '\'' ? "&#39;" : NULL;
            if (r) sb_str(e, &b, r);
            else sb_add(e, &b, s.s + i, 1);
        }
        return mk_str(sb_done(&b));
    }
    if (str_is(f, "select") || str_is(f, "reject") || str_is(f, "selectattr") || str_is(f, "rejectattr"))
        return select_items(R, line, f, v, a);
    if (str_is(f, "map")) {
        list *in = iter_items(R, line, v), *out = list_new(e, in->n);
        value at = arg(a, -1, "attribute", undef), def = arg(a, -1, "default", undef);
        value fname = arg(a, 0, NULL, undef);
        args rest = shift_args(a, 1);
        if (at.k != V_STR && fname.k != V_STR) ct_fail(e, line, "map: needs attribute= or a filter name");
        if (fname.k == V_STR && !known(filters, fname.s))
            ct_fail(e, line, "filter '%.*s' is not supported by Loom", (int)fname.s.n, fname.s.s);
        for (size_t i = 0; i < in->n; i++) {
            if (at.k == V_STR) {
                value x = get_attr(R, line, in->v[i], at.s);
                out->v[i] = x.k == V_UNDEF && def.k != V_UNDEF ? def : x;
            } else out->v[i] = apply_filter(R, line, fname.s, in->v[i], &rest);
        }
        return mk_list(out);
    }
    ct_fail(e, line, "filter '%.*s' is not supported by Loom", (int)f.n, f.s);
    return undef;
}

/* ---- operators ------------------------------------------------------------------------------ */

static value binop(render *R, int line, str op, value a, value b)
{
    ct_env *e = R->e;
    if (str_is(op, "~")) {
        sbuf s = {0};
        to_text(e, &s, a, false);
        to_text(e, &s, b, false);
        return mk_str(sb_done(&s));
    }
    if (str_is(op, "==")) return mk_bool(py_eq(a, b));
    if (str_is(op, "!=")) return mk_bool(!py_eq(a, b));
    if (str_is(op, "in") || str_is(op, "not in")) {
        bool neg = op.n > 2, r;
        need_defined(R, line, b);
        if (b.k == V_STR) {
            if (a.k != V_STR) ct_fail(e, line, "'in <string>' requires a string as left operand, not %s", type_name(a));
            r = !a.s.n || memmem(b.s.s, b.s.n, a.s.s, a.s.n) != NULL;
        } else if (b.k == V_DICT || b.k == V_NS) {
            r = a.k == V_STR && dict_get(b.d, a.s) != NULL;
        } else if (b.k == V_LIST) {
            r = false;
            for (size_t i = 0; i < b.l->n && !r; i++) r = py_eq(a, b.l->v[i]);
        } else {
            ct_fail(e, line, "argument of type '%s' is not iterable", type_name(b));
            r = false;
        }
        return mk_bool(r != neg);
    }
    if (op.s[0] == '<' || op.s[0] == '>') {
        int c = py_cmp(e, line, a, b, op.s);
        if (str_is(op, "<")) return mk_bool(c < 0);
        if (str_is(op, ">")) return mk_bool(c > 0);
        if (str_is(op, "<=")) return mk_bool(c <= 0);
        return mk_bool(c >= 0);
    }
    need_defined(R, line, a);
    need_defined(R, line, b);
    if (str_is(op, "+") && a.k == V_STR && b.k == V_STR) {
        sbuf s = {0};
        sb_add(e, &s, a.s.s, a.s.n);
        sb_add(e, &s, b.s.s, b.s.n);
        return mk_str(sb_done(&s));
    }
    if (str_is(op, "+") && a.k == V_LIST && b.k == V_LIST) {
        list *l = list_new(e, a.l->n + b.l->n);
        if (a.l->n) memcpy(l->v, a.l->v, a.l->n * sizeof *l->v);
        if (b.l->n) memcpy(l->v + a.l->n, b.l->v, b.l->n * sizeof *l->v);
        return mk_list(l);
    }
    if (str_is(op, "*") && ((a.k == V_STR && b.k == V_INT) || (a.k == V_INT && b.k == V_STR))) {
        str s = a.k == V_STR ? a.s : b.s;
        int64_t n = a.k == V_INT ? a.i : b.i;
        if (n > 0 && s.n * (uint64_t)n > CT_MAX_OUT) ct_fail(e, line, "string repetition too large");
        sbuf o = {0};
        for (int64_t i = 0; i < n; i++) sb_add(e, &o, s.s, s.n);
        return mk_str(sb_done(&o));
    }
    if (!is_num(a) || !is_num(b))
        ct_fail(e, line, "unsupported operand type(s) for %.*s: '%s' and '%s'", (int)op.n, op.s, type_name(a), type_name(b));
    bool ints = a.k != V_FLOAT && b.k != V_FLOAT;
    int64_t x = inum(a), y = inum(b), r;
    double p = num(a), q = num(b);
    switch (op.s[0]) {
    case '+':
        if (!ints) return mk_float(p + q);
        if (__builtin_add_overflow(x, y, &r)) ct_fail(e, line, "integer overflow");
        return mk_int(r);
    case '-':
        if (!ints) return mk_float(p - q);
        if (__builtin_sub_overflow(x, y, &r)) ct_fail(e, line, "integer overflow");
        return mk_int(r);
    case '*':
        if (op.n == 2) { /* ** */
            if (ints && y >= 0) {
                r = 1;
                for (int64_t i = 0; i < y; i++) if (__builtin_mul_overflow(r, x, &r)) ct_fail(e, line, "integer overflow");
                return mk_int(r);
            }
            return mk_float(pow(p, q));
        }
        if (!ints) return mk_float(p * q);
        if (__builtin_mul_overflow(x, y, &r)) ct_fail(e, line, "integer overflow");
        return mk_int(r);
    case '/':
        if (q == 0) ct_fail(e, line, "division by zero");
        if (op.n == 1) return mk_float(p / q);
        if (!ints) return mk_float(floor(p / q));
        return mk_int(x / y - ((x % y != 0) && ((x < 0) != (y < 0))));
    case '%':
        if (q == 0) ct_fail(e, line, "modulo by zero");
        if (!ints) return mk_float(p - q * floor(p / q));
        r = x % y;
        return mk_int(r != 0 && ((r < 0) != (y < 0)) ? r + y : r);
    }
    ct_fail(e, line, "unknown operator");
    return undef;
}

static value eval(render *R, const node *n)
{
    step(R, n->line);
    switch (n->k) {
    case E_LIT: return n->lit;
    case E_NAME: return lookup(R, n->s);
    case E_ATTR: return get_attr(R, n->line, eval(R, n->a), n->s);
    case E_ITEM: {
        value o = eval(R, n->a);
        return get_item(R, n->line, o, eval(R, n->b));
    }
    case E_SLICE: {
        value o = eval(R, n->a), parts[3];
        need_defined(R, n->line, o);
        for (int i = 0; i < 3; i++) parts[i] = n->v[i] ? eval(R, n->v[i]) : none;
        size_t len, *off = NULL;
        if (o.k == V_STR) u8_decode(R->e, o.s, &len, &off);
        else if (o.k == V_LIST) len = o.l->n;
        else ct_fail(R->e, n->line, "'%s' object is not subscriptable", type_name(o));
        int64_t start, cnt, stp;
        py_slice(R, n->line, len, parts, &start, &cnt, &stp);
        if (o.k == V_LIST) {
            list *l = list_new(R->e, (size_t)cnt);
            for (int64_t i = 0; i < cnt; i++) l->v[i] = o.l->v[start + i * stp];
            return mk_list(l);
        }
        sbuf b = {0};
        for (int64_t i = 0; i < cnt; i++) {
            int64_t k = start + i * stp;
            sb_add(R->e, &b, o.s.s + off[k], off[k + 1] - off[k]);
        }
        return mk_str(sb_done(&b));
    }
    case E_CALL: {
        if (n->a->k == E_ATTR) {
            value o = eval(R, n->a->a);
            if ((o.k == V_DICT || o.k == V_NS) && dict_get(o.d, n->a->s)) {
                value f = *dict_get(o.d, n->a->s);
                if (f.k == V_FUNC) { args a = eval_args(R, n); return call_global(R, n->line, f.fn, &a); }
            }
            args a = eval_args(R, n);
            return call_method(R, n->line, o, n->a->s, &a);
        }
        value f = eval(R, n->a);
        if (f.k != V_FUNC) {
            need_defined(R, n->line, f);
            ct_fail(R->e, n->line, "'%s' object is not callable", type_name(f));
        }
        args a = eval_args(R, n);
        return call_global(R, n->line, f.fn, &a);
    }
    case E_FILTER: {
        value v = eval(R, n->a);
        args a = eval_args(R, n);
        return apply_filter(R, n->line, n->s, v, &a);
    }
    case E_TEST: {
        value v = eval(R, n->a);
        args a = eval_args(R, n);
        return mk_bool(run_test(R, n->line, n->s, v, &a) != n->neg);
    }
    case E_NEG:
    case E_POS: {
        value v = eval(R, n->a);
        if (!is_num(v)) ct_fail(R->e, n->line, "bad operand type for unary %c: '%s'", n->k == E_NEG ? '-' : '+', type_name(v));
        if (n->k == E_POS) return v.k == V_BOOL ? mk_int(v.b) : v;
        if (v.k == V_FLOAT) return mk_float(-v.f);
        if (inum(v) == INT64_MIN) ct_fail(R->e, n->line, "integer overflow");
        return mk_int(-inum(v));
    }
    case E_NOT: return mk_bool(!truthy(eval(R, n->a)));
    case E_AND: {
        value a = eval(R, n->a);
        return truthy(a) ? eval(R, n->b) : a;
    }
    case E_OR: {
        value a = eval(R, n->a);
        return truthy(a) ? a : eval(R, n->b);
    }
    case E_BIN: {
        value a = eval(R, n->a);
        return binop(R, n->line, n->s, a, eval(R, n->b));
    }
    case E_COND: return truthy(eval(R, n->b)) ? eval(R, n->a) : n->c ? eval(R, n->c) : undef;
    case E_LIST: {
        list *l = list_new(R->e, (size_t)n->nv);
        for (int i = 0; i < n->nv; i++) l->v[i] = eval(R, n->v[i]);
        return mk_list(l);
    }
    case E_DICT: {
        dict *d = dict_new(R->e);
        for (int i = 0; i < n->nv; i++) {
            value k = eval(R, n->v[i]);
            if (k.k != V_STR) ct_fail(R->e, n->line, "dict keys must be strings here");
            dict_set(R->e, d, k.s, eval(R, n->w[i]));
        }
        return (value){.k = V_DICT, .d = d};
    }
    }
    ct_fail(R->e, n->line, "internal: bad expression");
    return undef;
}

static void out_add(render *R, const char *s, size_t n)
{
    sbuf *o = R->out;
    if (o->n + n > CT_MAX_OUT) ct_fail(R->e, 0, "output larger than %d MiB", CT_MAX_OUT >> 20);
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 4096;
        while (cap < o->n + n + 1) cap *= 2;
        char *p = realloc(o->p, cap);
        if (!p) ct_fail(R->e, 0, "out of memory");
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

static void exec_for(render *R, const node *n)
{
    list *items = iter_items(R, n->line, eval(R, n->a));
    scope sc = {.up = R->sc, .vars = dict_new(R->e)};
    R->sc = &sc;
    if (n->b) { /* {% for x in xs if cond %}: the loop sees only the items that pass */
        list *kept = list_new(R->e, items->n);
        kept->n = 0;
        for (size_t i = 0; i < items->n; i++) {
            dict_set(R->e, sc.vars, n->s, items->v[i]);
            if (truthy(eval(R, n->b))) kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    size_t len = items->n;
    dict *loop = dict_new(R->e); /* one object advanced per iteration, as Jinja2's LoopContext */
    for (size_t i = 0; i < len; i++) {
        value it = items->v[i];
        step(R, n->line); /* an empty body still costs a step per item */
        if (n->s2.n) {
            if (it.k != V_LIST || it.l->n != 2) ct_fail(R->e, n->line, "cannot unpack %s into two names", type_name(it));
            dict_set(R->e, sc.vars, n->s, it.l->v[0]);
            dict_set(R->e, sc.vars, n->s2, it.l->v[1]);
        } else dict_set(R->e, sc.vars, n->s, it);
        dict_set(R->e, loop, S("index"), mk_int((int64_t)i + 1));
        dict_set(R->e, loop, S("index0"), mk_int((int64_t)i));
        dict_set(R->e, loop, S("revindex"), mk_int((int64_t)(len - i)));
        dict_set(R->e, loop, S("revindex0"), mk_int((int64_t)(len - i - 1)));
        dict_set(R->e, loop, S("first"), mk_bool(i == 0));
        dict_set(R->e, loop, S("last"), mk_bool(i + 1 == len));
        dict_set(R->e, loop, S("length"), mk_int((int64_t)len));
        dict_set(R->e, loop, S("previtem"), i > 0 ? items->v[i - 1] : mk_undef(S("previtem")));
        dict_set(R->e, loop, S("nextitem"), i + 1 < len ? items->v[i + 1] : mk_undef(S("nextitem")));
        dict_set(R->e, sc.vars, S("loop"), (value){.k = V_DICT, .d = loop});
        exec_body(R, n->v, n->nv);
        if (R->ctl == CTL_BREAK) { R->ctl = CTL_NONE; break; }
        R->ctl = CTL_NONE;
    }
    if (len == 0) exec_body(R, n->w, n->nw);
    R->sc = sc.up;
}

static void exec_node(render *R, const node *n)
{
    step(R, n->line);
    switch (n->k) {
    case S_TEXT: out_add(R, n->s.s, n->s.n); break;
    case S_OUT: {
        value v = eval(R, n->a);
        if (v.k == V_STR) out_add(R, v.s.s, v.s.n);
        else { str s = to_str(R->e, v); out_add(R, s.s, s.n); }
        break;
    }
    case S_IF:
        if (truthy(eval(R, n->a))) exec_body(R, n->v, n->nv);
        else exec_body(R, n->w, n->nw);
        break;
    case S_FOR: exec_for(R, n); break;
    case S_SET: {
        value v;
        if (n->a) v = eval(R, n->a);
        else { /* block set: the body's output */
            sbuf *saved = R->out, tmp = {0};
            R->out = &tmp;
            exec_body(R, n->v, n->nv);
            R->out = saved;
            v = mk_str(str_dup(R->e, tmp.p ? tmp.p : "", tmp.n));
            free(tmp.p);
        }
        if (n->s2.n) {
            value ns = lookup(R, n->s);
            if (ns.k != V_NS) ct_fail(R->e, n->line, "cannot assign attribute on non-namespace object '%.*s'", (int)n->s.n, n->s.s);
            dict_set(R->e, ns.d, n->s2, v);
        } else dict_set(R->e, R->sc->vars, n->s, v);
        break;
    }
    case S_BREAK: R->ctl = CTL_BREAK; break;
    case S_CONTINUE: R->ctl = CTL_CONTINUE; break;
    case S_BLOCK: exec_body(R, n->v, n->nv); break;
    default: ct_fail(R->e, n->line, "internal: bad statement");
    }
}

static void exec_body(render *R, node *const *body, int n)
{
    if (++R->depth > CT_MAX_DEPTH) ct_fail(R->e, 0, "blocks nested too deeply");
    for (int i = 0; i < n && R->ctl == CTL_NONE; i++) exec_node(R, body[i]);
    R->depth--;
}

/* ---- API ------------------------------------------------------------------------------------- */

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
    arena_free(ct->arena);
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
    lexer L = {.e = e, .src = ct->source, .n = strlen(ct->source), .line = 1};
    lex(&L);
    parser P = {.e = e, .t = L.t};
    nlist body = p_body(&P, NULL);
    ct->body = body.p;
    ct->nbody = body.n;
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
    root->vars = dict_new(e);
    static const struct { const char *name; int fn; } fns[] = {
        {"namespace", FN_NAMESPACE}, {"range", FN_RANGE}, {"raise_exception", FN_RAISE},
        {"strftime_now", FN_STRFTIME}, {"dict", FN_DICT}};
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
        dict_set(e, root->vars, S(fns[i].name), (value){.k = V_FUNC, .fn = fns[i].fn});
    const char *k;
    json_t *x;
    json_object_foreach(ct->vars, k, x) dict_set(e, root->vars, str_dup(e, k, strlen(k)), from_json(e, x));
    dict_set(e, root->vars, S("tools"), none);
    dict_set(e, root->vars, S("documents"), none);
    json_object_foreach((json_t *)kwargs, k, x) {
        if (!strcmp(k, "messages") || !strcmp(k, "add_generation_prompt"))
            ct_fail(e, 0, "'%s' cannot be passed as an extra variable", k);
        dict_set(e, root->vars, str_dup(e, k, strlen(k)), from_json(e, x));
    }
    dict_set(e, root->vars, S("messages"), from_json(e, messages));
    dict_set(e, root->vars, S("add_generation_prompt"), mk_bool(add_generation_prompt));
    R->sc = root;
    exec_body(R, ct->body, ct->nbody);
    out_add(R, "", 0);
    R->result.p[R->result.n] = 0;
    *out = R->result.p;
    if (out_len) *out_len = R->result.n;
    rc = 0;
done:
    arena_free(e->own);
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
