/* jinja_value.c — the values of the chat-template interpreter (see jinja.h): their arena and
 * its errors, strings, lists and dicts, Unicode helpers, and Python's conversions (str(),
 * repr(), json.dumps) and semantics (truth, ==, ordering) as transformers' Jinja2 has them.
 */
#include "text/jinja.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- arena and errors ------------------------------------------------------------------ */

_Noreturn __attribute__((format(printf, 3, 4))) void ct_fail(ct_env *e, int line, const char *fmt, ...)
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

void *ct_alloc(ct_env *e, size_t n)
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

void ct_arena_free(chunk *c)
{
    while (c) {
        chunk *n = c->next;
        free(c);
        c = n;
    }
}

/* ---- values ------------------------------------------------------------------------------ */

str ct_str_dup(ct_env *e, const char *s, size_t n)
{
    char *p = ct_alloc(e, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return (str){p, n};
}

list *ct_list_new(ct_env *e, size_t n)
{
    list *l = ct_alloc(e, sizeof *l);
    l->n = n;
    l->v = n ? ct_alloc(e, n * sizeof *l->v) : NULL;
    return l;
}

dict *ct_dict_new(ct_env *e) { return memset(ct_alloc(e, sizeof(dict)), 0, sizeof(dict)); }

value *ct_dict_get(const dict *d, str k)
{
    for (size_t i = 0; i < d->n; i++)
        if (str_eq(d->key[i], k)) return &d->val[i];
    return NULL;
}

void ct_dict_set(ct_env *e, dict *d, str k, value v)
{
    value *p = ct_dict_get(d, k);
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

void ct_sb_add(ct_env *e, sbuf *b, const char *s, size_t n)
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

/* ---- Unicode helpers ------------------------------------------------------------------------ */

/* One code point of s[0..n) (invalid bytes: one byte, as U+FFFD); its length in *len. */
int32_t ct_u8_next(const char *s, size_t n, size_t *len)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
    if (l < 1) { *len = 1; return 0xFFFD; }
    *len = (size_t)l;
    return c;
}

size_t ct_u8_count(str s)
{
    size_t k = 0, l;
    for (size_t i = 0; i < s.n; i += l, k++) ct_u8_next(s.s + i, s.n - i, &l);
    return k;
}

/* Python's str.isspace() (what strip() and split() take away by default). */
bool ct_memchr_cp(const int32_t *set, size_t n, int32_t c)
{
    for (size_t i = 0; i < n; i++) if (set[i] == c) return true;
    return false;
}

bool ct_py_space(int32_t c)
{
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* The code points of s as an array (for indexing, slicing, strip sets). */
int32_t *ct_u8_decode(ct_env *e, str s, size_t *n, size_t **off)
{
    int32_t *cp = ct_alloc(e, (s.n + 1) * sizeof *cp);
    size_t *o = off ? ct_alloc(e, (s.n + 1) * sizeof *o) : NULL;
    size_t k = 0, l;
    for (size_t i = 0; i < s.n; i += l) {
        if (o) o[k] = i;
        cp[k++] = ct_u8_next(s.s + i, s.n - i, &l);
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
    ct_sb_add(e, b, o, (size_t)m);
}

static void py_repr_str(ct_env *e, sbuf *b, str s)
{
    bool dq = memchr(s.s, '\'', s.n) && !memchr(s.s, '"', s.n);
    char q = dq ? '"' : '\'';
    ct_sb_add(e, b, &q, 1);
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.s[i];
        char x[8];
        if (c == '\\' || c == (unsigned char)q) { x[0] = '\\'; x[1] = (char)c; ct_sb_add(e, b, x, 2); }
        else if (c == '\n') sb_str(e, b, "\\n");
        else if (c == '\r') sb_str(e, b, "\\r");
        else if (c == '\t') sb_str(e, b, "\\t");
        else if (c < 0x20 || c == 0x7F) { snprintf(x, sizeof x, "\\x%02x", c); sb_str(e, b, x); }
        else ct_sb_add(e, b, (const char *)&c, 1);
    }
    ct_sb_add(e, b, &q, 1);
}

/* Python's str(v) (repr false) or repr(v) into b. */
void ct_to_text(ct_env *e, sbuf *b, value v, bool repr)
{
    char x[32];
    switch (v.k) {
    case V_UNDEF: break;
    case V_NONE: sb_str(e, b, "None"); break;
    case V_BOOL: sb_str(e, b, v.b ? "True" : "False"); break;
    case V_INT: snprintf(x, sizeof x, "%lld", (long long)v.i); sb_str(e, b, x); break;
    case V_FLOAT: py_float(e, b, v.f); break;
    case V_STR: if (repr) py_repr_str(e, b, v.s); else ct_sb_add(e, b, v.s.s, v.s.n); break;
    case V_LIST:
        sb_str(e, b, "[");
        for (size_t i = 0; i < v.l->n; i++) { if (i) sb_str(e, b, ", "); ct_to_text(e, b, v.l->v[i], true); }
        sb_str(e, b, "]");
        break;
    case V_DICT:
    case V_NS:
        sb_str(e, b, v.k == V_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) sb_str(e, b, ", ");
            py_repr_str(e, b, v.d->key[i]);
            sb_str(e, b, ": ");
            ct_to_text(e, b, v.d->val[i], true);
        }
        sb_str(e, b, v.k == V_NS ? "}>" : "}");
        break;
    case V_FUNC: sb_str(e, b, "<built-in function>"); break;
    }
}

str ct_to_str(ct_env *e, value v)
{
    if (v.k == V_STR) return v.s;
    sbuf b = {0};
    ct_to_text(e, &b, v, false);
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
            else ct_sb_add(e, b, (const char *)&c, 1);
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
void ct_to_json(ct_env *e, sbuf *b, value v, int indent, int level, int line)
{
    switch (v.k) {
    case V_NONE: sb_str(e, b, "null"); break;
    case V_BOOL: sb_str(e, b, v.b ? "true" : "false"); break;
    case V_INT: ct_to_text(e, b, v, false); break;
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
            if (is_list) ct_to_json(e, b, v.l->v[i], indent, level + 1, line);
            else {
                json_str(e, b, v.d->key[i]);
                sb_str(e, b, ": ");
                ct_to_json(e, b, v.d->val[i], indent, level + 1, line);
            }
        }
        if (indent >= 0 && n) json_nl(e, b, indent, level);
        sb_str(e, b, is_list ? "]" : "}");
        break;
    }
    default: ct_fail(e, line, "tojson: this value is not JSON serializable");
    }
}

value ct_from_json(ct_env *e, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_STRING: return mk_str(ct_str_dup(e, json_string_value(j), json_string_length(j)));
    case JSON_INTEGER: return mk_int(json_integer_value(j));
    case JSON_REAL: return mk_float(json_real_value(j));
    case JSON_TRUE: return mk_bool(true);
    case JSON_FALSE: return mk_bool(false);
    case JSON_NULL: return none;
    case JSON_ARRAY: {
        list *l = ct_list_new(e, json_array_size(j));
        for (size_t i = 0; i < l->n; i++) l->v[i] = ct_from_json(e, json_array_get(j, i));
        return mk_list(l);
    }
    case JSON_OBJECT: {
        dict *d = ct_dict_new(e);
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)j, k, x) ct_dict_set(e, d, ct_str_dup(e, k, strlen(k)), ct_from_json(e, x));
        return (value){.k = V_DICT, .d = d};
    }
    }
    return none;
}

/* ---- Python semantics ------------------------------------------------------------------------ */

bool ct_truthy(value v)
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

bool ct_py_eq(value a, value b)
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
        for (size_t i = 0; i < a.l->n; i++) if (!ct_py_eq(a.l->v[i], b.l->v[i])) return false;
        return true;
    case V_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            value *o = ct_dict_get(b.d, a.d->key[i]);
            if (!o || !ct_py_eq(a.d->val[i], *o)) return false;
        }
        return true;
    default: return a.d == b.d;
    }
}

const char *ct_type_name(value v)
{
    static const char *const n[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict",
                                    "Namespace", "function"};
    return n[v.k];
}

/* <0, 0, >0 for numbers and strings (code point order = UTF-8 byte order). */
int ct_py_cmp(ct_env *e, int line, value a, value b, const char *op)
{
    if (is_num(a) && is_num(b)) return num(a) < num(b) ? -1 : num(a) > num(b);
    if (a.k == V_STR && b.k == V_STR) {
        int c = memcmp(a.s.s, b.s.s, a.s.n < b.s.n ? a.s.n : b.s.n);
        return c ? c : (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    ct_fail(e, line, "'%s' not supported between %s and %s", op, ct_type_name(a), ct_type_name(b));
    return 0;
}
