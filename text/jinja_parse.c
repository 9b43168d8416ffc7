/* jinja_parse.c — tokens into a tree by recursive descent, with Jinja2's precedence (see
 * jinja.h): statements (if/elif/else, for, set, break/continue, generation) and expressions.
 * A construct Loom does not have (macros, includes, an unknown filter or test) is refused
 * here, at load, with its line.
 */
#include "text/jinja.h"

#include <string.h>

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
        while (cur(P)->k == T_STR) { ct_sb_add(P->e, &b, cur(P)->s.s, cur(P)->s.n); P->i++; } /* "a" "b" is "ab" */
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
            if (!ct_is_filter(x->s)) ct_fail(P->e, line, "filter '%.*s' is not supported by Loom", (int)x->s.n, x->s.s);
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
            if (!ct_is_test(x->s)) ct_fail(P->e, line, "test '%.*s' is not supported by Loom", (int)x->s.n, x->s.s);
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

node **ct_parse(ct_env *e, token *t, int *n)
{
    parser P = {.e = e, .t = t};
    nlist body = p_body(&P, NULL);
    *n = body.n;
    return body.p;
}
