/* jinja_lex.c — the chat-template source into tokens (see jinja.h): text between tags, with
 * Jinja2's whitespace rules, and the insides of tags (names, literals, operators).
 */
#include "text/jinja.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

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
        if (c != '\\' || L->pos >= L->n) { ct_sb_add(L->e, &b, &c, 1); continue; }
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
        case '0': m = ""; ct_sb_add(L->e, &b, "", 1); break;
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
            ct_sb_add(L->e, &b, o, (size_t)k);
            m = "";
            break;
        }
        default: o[0] = '\\'; o[1] = x; ct_sb_add(L->e, &b, o, 2); m = ""; /* kept, as Python does */
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

token *ct_lex(ct_env *e, const char *src, size_t n)
{
    lexer L = {.e = e, .src = src, .n = n, .line = 1};
    lex(&L);
    return L.t;
}
