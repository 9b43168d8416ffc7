/* jinja_eval.c — runs a parse tree (see jinja.h): scopes and lookups, attributes, items
 * and slices, operators with Python semantics, output, if/for/set and loop.*; filters,
 * tests, methods and global functions are jinja_builtins.c.
 */
#include "text/jinja.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE }; /* R->ctl: a break or continue on its way to its loop */

static value eval(render *R, const node *n);
static void exec_body(render *R, node *const *body, int n);

static void step(render *R, int line)
{
    if (++R->steps > CT_MAX_STEPS) ct_fail(R->e, line, "more than %d evaluation steps", CT_MAX_STEPS);
}

static value lookup(render *R, str name)
{
    for (scope *s = R->sc; s; s = s->up) {
        value *v = ct_dict_get(s->vars, name);
        if (v) return *v;
    }
    return mk_undef(name);
}

void ct_need_defined(render *R, int line, value v)
{
    if (v.k == V_UNDEF) ct_fail(R->e, line, "'%.*s' is undefined", (int)v.s.n, v.s.s);
}

value ct_get_attr(render *R, int line, value obj, str name)
{
    ct_need_defined(R, line, obj);
    if (obj.k == V_DICT || obj.k == V_NS) {
        value *v = ct_dict_get(obj.d, name);
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
    ct_need_defined(R, line, obj);
    if ((obj.k == V_DICT || obj.k == V_NS) && key.k == V_STR) {
        value *v = ct_dict_get(obj.d, key.s);
        return v ? *v : mk_undef(key.s);
    }
    if ((obj.k == V_LIST || obj.k == V_STR) && (key.k == V_INT || key.k == V_BOOL)) {
        size_t n, *off = NULL;
        if (obj.k == V_STR) ct_u8_decode(R->e, obj.s, &n, &off);
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
list *ct_iter_items(render *R, int line, value v)
{
    if (v.k == V_LIST) return v.l;
    if (v.k == V_UNDEF) return ct_list_new(R->e, 0);
    if (v.k == V_DICT) {
        list *l = ct_list_new(R->e, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) l->v[i] = mk_str(v.d->key[i]);
        return l;
    }
    if (v.k == V_STR) {
        size_t n, *off;
        ct_u8_decode(R->e, v.s, &n, &off);
        list *l = ct_list_new(R->e, n);
        for (size_t i = 0; i < n; i++) l->v[i] = mk_str((str){v.s.s + off[i], off[i + 1] - off[i]});
        return l;
    }
    ct_fail(R->e, line, "'%s' object is not iterable", ct_type_name(v));
    return NULL;
}

static args eval_args(render *R, const node *n)
{
    args a = {.npos = n->nv, .nkw = n->nw, .kw = n->kw};
    a.pos = ct_alloc(R->e, (size_t)(n->nv + 1) * sizeof(value));
    a.kwv = ct_alloc(R->e, (size_t)(n->nw + 1) * sizeof(value));
    for (int i = 0; i < n->nv; i++) a.pos[i] = eval(R, n->v[i]);
    for (int i = 0; i < n->nw; i++) a.kwv[i] = eval(R, n->w[i]);
    return a;
}

/* ---- operators ------------------------------------------------------------------------------ */

static value binop(render *R, int line, str op, value a, value b)
{
    ct_env *e = R->e;
    if (str_is(op, "~")) {
        sbuf s = {0};
        ct_to_text(e, &s, a, false);
        ct_to_text(e, &s, b, false);
        return mk_str(sb_done(&s));
    }
    if (str_is(op, "==")) return mk_bool(ct_py_eq(a, b));
    if (str_is(op, "!=")) return mk_bool(!ct_py_eq(a, b));
    if (str_is(op, "in") || str_is(op, "not in")) {
        bool neg = op.n > 2, r;
        ct_need_defined(R, line, b);
        if (b.k == V_STR) {
            if (a.k != V_STR) ct_fail(e, line, "'in <string>' requires a string as left operand, not %s", ct_type_name(a));
            r = !a.s.n || memmem(b.s.s, b.s.n, a.s.s, a.s.n) != NULL;
        } else if (b.k == V_DICT || b.k == V_NS) {
            r = a.k == V_STR && ct_dict_get(b.d, a.s) != NULL;
        } else if (b.k == V_LIST) {
            r = false;
            for (size_t i = 0; i < b.l->n && !r; i++) r = ct_py_eq(a, b.l->v[i]);
        } else {
            ct_fail(e, line, "argument of type '%s' is not iterable", ct_type_name(b));
            r = false;
        }
        return mk_bool(r != neg);
    }
    if (op.s[0] == '<' || op.s[0] == '>') {
        int c = ct_py_cmp(e, line, a, b, op.s);
        if (str_is(op, "<")) return mk_bool(c < 0);
        if (str_is(op, ">")) return mk_bool(c > 0);
        if (str_is(op, "<=")) return mk_bool(c <= 0);
        return mk_bool(c >= 0);
    }
    ct_need_defined(R, line, a);
    ct_need_defined(R, line, b);
    if (str_is(op, "+") && a.k == V_STR && b.k == V_STR) {
        sbuf s = {0};
        ct_sb_add(e, &s, a.s.s, a.s.n);
        ct_sb_add(e, &s, b.s.s, b.s.n);
        return mk_str(sb_done(&s));
    }
    if (str_is(op, "+") && a.k == V_LIST && b.k == V_LIST) {
        list *l = ct_list_new(e, a.l->n + b.l->n);
        if (a.l->n) memcpy(l->v, a.l->v, a.l->n * sizeof *l->v);
        if (b.l->n) memcpy(l->v + a.l->n, b.l->v, b.l->n * sizeof *l->v);
        return mk_list(l);
    }
    if (str_is(op, "*") && ((a.k == V_STR && b.k == V_INT) || (a.k == V_INT && b.k == V_STR))) {
        str s = a.k == V_STR ? a.s : b.s;
        int64_t n = a.k == V_INT ? a.i : b.i;
        if (n > 0 && s.n * (uint64_t)n > CT_MAX_OUT) ct_fail(e, line, "string repetition too large");
        sbuf o = {0};
        for (int64_t i = 0; i < n; i++) ct_sb_add(e, &o, s.s, s.n);
        return mk_str(sb_done(&o));
    }
    if (!is_num(a) || !is_num(b))
        ct_fail(e, line, "unsupported operand type(s) for %.*s: '%s' and '%s'", (int)op.n, op.s, ct_type_name(a), ct_type_name(b));
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
    case E_ATTR: return ct_get_attr(R, n->line, eval(R, n->a), n->s);
    case E_ITEM: {
        value o = eval(R, n->a);
        return get_item(R, n->line, o, eval(R, n->b));
    }
    case E_SLICE: {
        value o = eval(R, n->a), parts[3];
        ct_need_defined(R, n->line, o);
        for (int i = 0; i < 3; i++) parts[i] = n->v[i] ? eval(R, n->v[i]) : none;
        size_t len, *off = NULL;
        if (o.k == V_STR) ct_u8_decode(R->e, o.s, &len, &off);
        else if (o.k == V_LIST) len = o.l->n;
        else ct_fail(R->e, n->line, "'%s' object is not subscriptable", ct_type_name(o));
        int64_t start, cnt, stp;
        py_slice(R, n->line, len, parts, &start, &cnt, &stp);
        if (o.k == V_LIST) {
            list *l = ct_list_new(R->e, (size_t)cnt);
            for (int64_t i = 0; i < cnt; i++) l->v[i] = o.l->v[start + i * stp];
            return mk_list(l);
        }
        sbuf b = {0};
        for (int64_t i = 0; i < cnt; i++) {
            int64_t k = start + i * stp;
            ct_sb_add(R->e, &b, o.s.s + off[k], off[k + 1] - off[k]);
        }
        return mk_str(sb_done(&b));
    }
    case E_CALL: {
        if (n->a->k == E_ATTR) {
            value o = eval(R, n->a->a);
            if ((o.k == V_DICT || o.k == V_NS) && ct_dict_get(o.d, n->a->s)) {
                value f = *ct_dict_get(o.d, n->a->s);
                if (f.k == V_FUNC) { args a = eval_args(R, n); return ct_call_global(R, n->line, f.fn, &a); }
            }
            args a = eval_args(R, n);
            return ct_call_method(R, n->line, o, n->a->s, &a);
        }
        value f = eval(R, n->a);
        if (f.k != V_FUNC) {
            ct_need_defined(R, n->line, f);
            ct_fail(R->e, n->line, "'%s' object is not callable", ct_type_name(f));
        }
        args a = eval_args(R, n);
        return ct_call_global(R, n->line, f.fn, &a);
    }
    case E_FILTER: {
        value v = eval(R, n->a);
        args a = eval_args(R, n);
        return ct_apply_filter(R, n->line, n->s, v, &a);
    }
    case E_TEST: {
        value v = eval(R, n->a);
        args a = eval_args(R, n);
        return mk_bool(ct_run_test(R, n->line, n->s, v, &a) != n->neg);
    }
    case E_NEG:
    case E_POS: {
        value v = eval(R, n->a);
        if (!is_num(v)) ct_fail(R->e, n->line, "bad operand type for unary %c: '%s'", n->k == E_NEG ? '-' : '+', ct_type_name(v));
        if (n->k == E_POS) return v.k == V_BOOL ? mk_int(v.b) : v;
        if (v.k == V_FLOAT) return mk_float(-v.f);
        if (inum(v) == INT64_MIN) ct_fail(R->e, n->line, "integer overflow");
        return mk_int(-inum(v));
    }
    case E_NOT: return mk_bool(!ct_truthy(eval(R, n->a)));
    case E_AND: {
        value a = eval(R, n->a);
        return ct_truthy(a) ? eval(R, n->b) : a;
    }
    case E_OR: {
        value a = eval(R, n->a);
        return ct_truthy(a) ? a : eval(R, n->b);
    }
    case E_BIN: {
        value a = eval(R, n->a);
        return binop(R, n->line, n->s, a, eval(R, n->b));
    }
    case E_COND: return ct_truthy(eval(R, n->b)) ? eval(R, n->a) : n->c ? eval(R, n->c) : undef;
    case E_LIST: {
        list *l = ct_list_new(R->e, (size_t)n->nv);
        for (int i = 0; i < n->nv; i++) l->v[i] = eval(R, n->v[i]);
        return mk_list(l);
    }
    case E_DICT: {
        dict *d = ct_dict_new(R->e);
        for (int i = 0; i < n->nv; i++) {
            value k = eval(R, n->v[i]);
            if (k.k != V_STR) ct_fail(R->e, n->line, "dict keys must be strings here");
            ct_dict_set(R->e, d, k.s, eval(R, n->w[i]));
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
    list *items = ct_iter_items(R, n->line, eval(R, n->a));
    scope sc = {.up = R->sc, .vars = ct_dict_new(R->e)};
    R->sc = &sc;
    if (n->b) { /* {% for x in xs if cond %}: the loop sees only the items that pass */
        list *kept = ct_list_new(R->e, items->n);
        kept->n = 0;
        for (size_t i = 0; i < items->n; i++) {
            ct_dict_set(R->e, sc.vars, n->s, items->v[i]);
            if (ct_truthy(eval(R, n->b))) kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    size_t len = items->n;
    dict *loop = ct_dict_new(R->e); /* one object advanced per iteration, as Jinja2's LoopContext */
    for (size_t i = 0; i < len; i++) {
        value it = items->v[i];
        step(R, n->line); /* an empty body still costs a step per item */
        if (n->s2.n) {
            if (it.k != V_LIST || it.l->n != 2) ct_fail(R->e, n->line, "cannot unpack %s into two names", ct_type_name(it));
            ct_dict_set(R->e, sc.vars, n->s, it.l->v[0]);
            ct_dict_set(R->e, sc.vars, n->s2, it.l->v[1]);
        } else ct_dict_set(R->e, sc.vars, n->s, it);
        ct_dict_set(R->e, loop, S("index"), mk_int((int64_t)i + 1));
        ct_dict_set(R->e, loop, S("index0"), mk_int((int64_t)i));
        ct_dict_set(R->e, loop, S("revindex"), mk_int((int64_t)(len - i)));
        ct_dict_set(R->e, loop, S("revindex0"), mk_int((int64_t)(len - i - 1)));
        ct_dict_set(R->e, loop, S("first"), mk_bool(i == 0));
        ct_dict_set(R->e, loop, S("last"), mk_bool(i + 1 == len));
        ct_dict_set(R->e, loop, S("length"), mk_int((int64_t)len));
        ct_dict_set(R->e, loop, S("previtem"), i > 0 ? items->v[i - 1] : mk_undef(S("previtem")));
        ct_dict_set(R->e, loop, S("nextitem"), i + 1 < len ? items->v[i + 1] : mk_undef(S("nextitem")));
        ct_dict_set(R->e, sc.vars, S("loop"), (value){.k = V_DICT, .d = loop});
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
        else { str s = ct_to_str(R->e, v); out_add(R, s.s, s.n); }
        break;
    }
    case S_IF:
        if (ct_truthy(eval(R, n->a))) exec_body(R, n->v, n->nv);
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
            v = mk_str(ct_str_dup(R->e, tmp.p ? tmp.p : "", tmp.n));
            free(tmp.p);
        }
        if (n->s2.n) {
            value ns = lookup(R, n->s);
            if (ns.k != V_NS) ct_fail(R->e, n->line, "cannot assign attribute on non-namespace object '%.*s'", (int)n->s.n, n->s.s);
            ct_dict_set(R->e, ns.d, n->s2, v);
        } else ct_dict_set(R->e, R->sc->vars, n->s, v);
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

void ct_exec(render *R, node *const *body, int n)
{
    exec_body(R, body, n);
    out_add(R, "", 0);
    R->result.p[R->result.n] = 0;
}
