/* jinja_builtins.c — what a chat template can call (see jinja.h): the filters, the tests,
 * the string and dict methods and the global functions (namespace, range,
 * raise_exception, strftime_now, dict) that the Llama 3.x, Qwen2/2.5/3 and ChatML
 * templates use, with Python's semantics.
 */
#include "text/jinja.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

enum { FN_NAMESPACE, FN_RANGE, FN_RAISE, FN_STRFTIME, FN_DICT }; /* a V_FUNC value's fn */

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

bool ct_is_filter(str name) { return known(filters, name); }
bool ct_is_test(str name) { return known(tests, name); }

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
    int32_t *set = chars.k == V_STR ? ct_u8_decode(R->e, chars.s, &nset, NULL) : NULL;
    int32_t *cp = ct_u8_decode(R->e, s, &ncp, &off);
    size_t a = 0, b = ncp;
#define STRIPS(c) (set ? ct_memchr_cp(set, nset, c) : ct_py_space(c))
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
    list *l = ct_list_new(R->e, 0);
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
            while (i < s.n && ct_py_space(ct_u8_next(s.s + i, s.n - i, &l8))) i += l8;
            if (i >= s.n) break;
            size_t a = i;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                vpush(R, l, &cap, mk_str(py_strip(R, (str){s.s + a, s.n - a}, none, 2)));
                break;
            }
            while (i < s.n && !ct_py_space(ct_u8_next(s.s + i, s.n - i, &l8))) i += l8;
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
            ct_sb_add(R->e, &b, new.s, new.n);
            i += old.n;
            done++;
        } else ct_sb_add(R->e, &b, s.s + i++, 1);
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
        int32_t c = ct_u8_next(s.s + i, s.n - i, &l);
        bool up = mode == 1 || (mode == 2 && i == 0) || (mode == 3 && !prev_letter);
        int32_t m = up ? utf8proc_toupper(c) : utf8proc_tolower(c);
        utf8proc_category_t cat = utf8proc_category(c);
        prev_letter = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        uint8_t o[4];
        utf8proc_ssize_t k = utf8proc_encode_char(m, o);
        ct_sb_add(R->e, &b, (const char *)o, (size_t)k);
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
    list *l = ct_list_new(R->e, d->n);
    for (size_t i = 0; i < d->n; i++) {
        if (what == 1) l->v[i] = mk_str(d->key[i]);
        else if (what == 2) l->v[i] = d->val[i];
        else {
            list *p = ct_list_new(R->e, 2);
            p->v[0] = mk_str(d->key[i]);
            p->v[1] = d->val[i];
            l->v[i] = mk_list(p);
        }
    }
    return mk_list(l);
}

value ct_call_method(render *R, int line, value obj, str m, const args *a)
{
    ct_need_defined(R, line, obj);
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
                if (at < 0) at = (int64_t)ct_u8_count((str){s.s, i});
                cnt++;
                if (sub.n) i += sub.n - 1;
            }
            return mk_int(str_is(m, "find") ? at : cnt);
        }
        if (str_is(m, "join")) {
            list *l = ct_iter_items(R, line, arg(a, 0, NULL, undef));
            sbuf b = {0};
            for (size_t i = 0; i < l->n; i++) {
                if (i) ct_sb_add(R->e, &b, s.s, s.n);
                if (l->v[i].k != V_STR) ct_fail(R->e, line, "join: sequence item %zu is not a string", i);
                ct_sb_add(R->e, &b, l->v[i].s.s, l->v[i].s.n);
            }
            return mk_str(sb_done(&b));
        }
        if (str_is(m, "isdigit") || str_is(m, "isalpha") || str_is(m, "isspace")) {
            size_t l8;
            bool ok = s.n > 0;
            for (size_t i = 0; i < s.n && ok; i += l8) {
                int32_t c = ct_u8_next(s.s + i, s.n - i, &l8);
                utf8proc_category_t k = utf8proc_category(c);
                ok = m.s[2] == 'd' ? k == UTF8PROC_CATEGORY_ND
                   : m.s[2] == 'a' ? (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) : ct_py_space(c);
            }
            return mk_bool(ok);
        }
    } else if (obj.k == V_DICT || obj.k == V_NS) {
        if (str_is(m, "items")) return dict_items(R, obj.d, 0);
        if (str_is(m, "keys")) return dict_items(R, obj.d, 1);
        if (str_is(m, "values")) return dict_items(R, obj.d, 2);
        if (str_is(m, "get")) {
            value k = arg(a, 0, "key", undef), *v = k.k == V_STR ? ct_dict_get(obj.d, k.s) : NULL;
            return v ? *v : arg(a, 1, "default", none);
        }
    }
    ct_fail(R->e, line, "'%s' object has no method '%.*s' that Loom supports", ct_type_name(obj), (int)m.n, m.s);
    return undef;
}

value ct_call_global(render *R, int line, int fn, const args *a)
{
    switch (fn) {
    case FN_NAMESPACE:
    case FN_DICT: {
        dict *d = ct_dict_new(R->e);
        for (int i = 0; i < a->npos; i++) {
            if (a->pos[i].k != V_DICT) ct_fail(R->e, line, "namespace()/dict() take keyword arguments or a dict");
            for (size_t k = 0; k < a->pos[i].d->n; k++) ct_dict_set(R->e, d, a->pos[i].d->key[k], a->pos[i].d->val[k]);
        }
        for (int i = 0; i < a->nkw; i++) ct_dict_set(R->e, d, a->kw[i], a->kwv[i]);
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
        list *l = ct_list_new(R->e, (size_t)n);
        for (int64_t i = 0; i < n; i++) l->v[i] = mk_int(r[0] + i * r[2]);
        return mk_list(l);
    }
    case FN_RAISE: {
        str m = ct_to_str(R->e, arg(a, 0, NULL, mk_str(S(""))));
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
        return mk_str(ct_str_dup(R->e, o, k));
    }
    }
    return undef;
}

/* ---- tests and filters ------------------------------------------------------------------------ */

bool ct_run_test(render *R, int line, str name, value v, const args *a)
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
    if (str_is(name, "eq") || str_is(name, "equalto") || str_is(name, "==")) return ct_py_eq(v, x);
    if (str_is(name, "ne") || str_is(name, "!=")) return !ct_py_eq(v, x);
    if (str_is(name, "sameas")) return v.k == x.k && (v.k <= V_NONE || ct_py_eq(v, x));
    if (str_is(name, "lower") || str_is(name, "upper")) {
        if (v.k != V_STR) return false;
        str c = py_case(R, v.s, str_is(name, "upper"));
        return str_eq(c, v.s);
    }
    if (str_is(name, "in")) {
        if (x.k == V_STR && v.k == V_STR) return memmem(x.s.s, x.s.n, v.s.s, v.s.n) != NULL || !v.s.n;
        list *l = ct_iter_items(R, line, x);
        for (size_t i = 0; i < l->n; i++) if (ct_py_eq(l->v[i], v)) return true;
        return false;
    }
    int c = ct_py_cmp(R->e, line, v, x, "<");
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

static value select_items(render *R, int line, str f, value v, const args *a)
{
    bool attr = f.s[f.n - 4] == 'a', keep_true = f.s[0] == 's';
    list *in = ct_iter_items(R, line, v), *out = ct_list_new(R->e, in->n);
    out->n = 0;
    str attr_name = attr ? arg_str(R, line, a, 0, NULL, "selectattr") : (str){0};
    int ti = attr ? 1 : 0;
    value test = arg(a, ti, NULL, undef);
    if (test.k != V_UNDEF && test.k != V_STR) ct_fail(R->e, line, "%.*s: the test name must be a string", (int)f.n, f.s);
    if (test.k == V_STR && !known(tests, test.s))
        ct_fail(R->e, line, "test '%.*s' is not supported by Loom", (int)test.s.n, test.s.s);
    args targs = shift_args(a, ti + 1);
    for (size_t i = 0; i < in->n; i++) {
        value x = attr ? ct_get_attr(R, line, in->v[i], attr_name) : in->v[i];
        bool ok = test.k == V_STR ? ct_run_test(R, line, test.s, x, &targs) : ct_truthy(x);
        if (ok == keep_true) out->v[out->n++] = in->v[i];
    }
    return mk_list(out);
}

value ct_apply_filter(render *R, int line, str f, value v, const args *a)
{
    ct_env *e = R->e;
    if (str_is(f, "trim")) return mk_str(py_strip(R, ct_to_str(e, v), arg(a, 0, "chars", none), 3));
    if (str_is(f, "length") || str_is(f, "count")) {
        if (v.k == V_STR) return mk_int((int64_t)ct_u8_count(v.s));
        if (v.k == V_LIST) return mk_int((int64_t)v.l->n);
        if (v.k == V_DICT || v.k == V_NS) return mk_int((int64_t)v.d->n);
        if (v.k == V_UNDEF) return mk_int(0);
        ct_fail(e, line, "object of type '%s' has no len()", ct_type_name(v));
    }
    if (str_is(f, "tojson")) {
        value ind = arg(a, 0, "indent", none);
        sbuf b = {0};
        ct_to_json(e, &b, v, ind.k == V_INT ? (int)ind.i : -1, 0, line);
        return mk_str(sb_done(&b));
    }
    if (str_is(f, "string")) return mk_str(ct_to_str(e, v));
    if (str_is(f, "lower")) return mk_str(py_case(R, ct_to_str(e, v), 0));
    if (str_is(f, "upper")) return mk_str(py_case(R, ct_to_str(e, v), 1));
    if (str_is(f, "capitalize")) return mk_str(py_case(R, ct_to_str(e, v), 2));
    if (str_is(f, "title")) return mk_str(py_case(R, ct_to_str(e, v), 3));
    if (str_is(f, "first") || str_is(f, "last")) {
        list *l = ct_iter_items(R, line, v);
        return l->n ? l->v[f.s[0] == 'f' ? 0 : l->n - 1] : mk_undef(f);
    }
    if (str_is(f, "join")) {
        value sep = arg(a, 0, "d", mk_str(S(""))), at = arg(a, 1, "attribute", none);
        list *l = ct_iter_items(R, line, v);
        sbuf b = {0};
        str s = ct_to_str(e, sep);
        for (size_t i = 0; i < l->n; i++) {
            if (i) ct_sb_add(e, &b, s.s, s.n);
            ct_to_text(e, &b, at.k == V_STR ? ct_get_attr(R, line, l->v[i], at.s) : l->v[i], false);
        }
        return mk_str(sb_done(&b));
    }
    if (str_is(f, "default") || str_is(f, "d")) {
        bool boolean = ct_truthy(arg(a, 1, "boolean", mk_bool(false)));
        return v.k == V_UNDEF || (boolean && !ct_truthy(v)) ? arg(a, 0, "default_value", mk_str(S(""))) : v;
    }
    if (str_is(f, "replace")) {
        value c = arg(a, 2, "count", none);
        return mk_str(py_replace(R, ct_to_str(e, v), arg_str(R, line, a, 0, "old", "replace"),
                                 arg_str(R, line, a, 1, "new", "replace"), c.k == V_INT ? c.i : -1));
    }
    if (str_is(f, "list")) return mk_list(ct_iter_items(R, line, v));
    if (str_is(f, "reverse")) {
        list *in = ct_iter_items(R, line, v), *out = ct_list_new(e, in->n);
        for (size_t i = 0; i < in->n; i++) out->v[i] = in->v[in->n - 1 - i];
        if (v.k != V_STR) return mk_list(out);
        sbuf b = {0};
        for (size_t i = 0; i < out->n; i++) ct_sb_add(e, &b, out->v[i].s.s, out->v[i].s.n);
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
        ct_fail(e, line, "bad operand type for abs(): '%s'", ct_type_name(v));
    }
    if (str_is(f, "items")) {
        if (v.k == V_UNDEF) return mk_list(ct_list_new(e, 0));
        if (v.k != V_DICT && v.k != V_NS) ct_fail(e, line, "items: expected a dict, got %s", ct_type_name(v));
        return dict_items(R, v.d, 0);
    }
    if (str_is(f, "safe")) return v;
    if (str_is(f, "e") || str_is(f, "escape")) {
        str s = ct_to_str(e, v);
        sbuf b = {0};
        for (size_t i = 0; i < s.n; i++) {
            const char *r = s.s[i] == '&' ? "&amp;" : s.s[i] == '<' ? "&lt;" : s.s[i] == '>' ? "&gt;"
                          : s.s[i] == '"' ? "&#34;" : s.s[i] == '\'' ? "&#39;" : NULL;
            if (r) sb_str(e, &b, r);
            else ct_sb_add(e, &b, s.s + i, 1);
        }
        return mk_str(sb_done(&b));
    }
    if (str_is(f, "select") || str_is(f, "reject") || str_is(f, "selectattr") || str_is(f, "rejectattr"))
        return select_items(R, line, f, v, a);
    if (str_is(f, "map")) {
        list *in = ct_iter_items(R, line, v), *out = ct_list_new(e, in->n);
        value at = arg(a, -1, "attribute", undef), def = arg(a, -1, "default", undef);
        value fname = arg(a, 0, NULL, undef);
        args rest = shift_args(a, 1);
        if (at.k != V_STR && fname.k != V_STR) ct_fail(e, line, "map: needs attribute= or a filter name");
        if (fname.k == V_STR && !known(filters, fname.s))
            ct_fail(e, line, "filter '%.*s' is not supported by Loom", (int)fname.s.n, fname.s.s);
        for (size_t i = 0; i < in->n; i++) {
            if (at.k == V_STR) {
                value x = ct_get_attr(R, line, in->v[i], at.s);
                out->v[i] = x.k == V_UNDEF && def.k != V_UNDEF ? def : x;
            } else out->v[i] = ct_apply_filter(R, line, fname.s, in->v[i], &rest);
        }
        return mk_list(out);
    }
    ct_fail(e, line, "filter '%.*s' is not supported by Loom", (int)f.n, f.s);
    return undef;
}

void ct_add_globals(ct_env *e, dict *vars)
{
    static const struct { const char *name; int fn; } fns[] = {
        {"namespace", FN_NAMESPACE}, {"range", FN_RANGE}, {"raise_exception", FN_RAISE},
        {"strftime_now", FN_STRFTIME}, {"dict", FN_DICT}};
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
        ct_dict_set(e, vars, S(fns[i].name), (value){.k = V_FUNC, .fn = fns[i].fn});
}
