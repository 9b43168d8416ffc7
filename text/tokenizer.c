/* tokenizer.c — byte-level BPE from a Hugging Face tokenizer.json (see tokenizer.h for
 * what is supported).
 *
 * Layout: per token id, its decoded bytes and its tokenizer.json spelling in two string
 * pools; one open-addressing map spelling → id, one map (left id, right id) → (rank,
 * merged id). Encoding follows HF's pipeline: split out the added tokens that are matched
 * on raw text (leftmost-longest, with their lstrip/rstrip/single_word rules), normalise
 * each remaining segment (NFC etc., utf8proc), split out the added tokens matched on
 * normalised text, pre-tokenise with the pattern (over code points, Unicode categories
 * from utf8proc), map each piece's bytes to their single-byte tokens, then merge the
 * lowest-ranked adjacent pair everywhere it occurs until no pair has a merge (GPT-2's
 * reference loop; the same result as HF's heap of merges).
 */
#include "text/tokenizer.h"
#include "common/err.h"
#include "common/strhash.h"

#include <jansson.h>
#include <utf8proc.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { PRE_GPT2, PRE_LLAMA3, PRE_QWEN2 } pre_kind;

/* Per-id flags; the last four are the added token's tokenizer.json flags. */
enum { TF_PRESENT = 1, TF_ADDED = 2, TF_SPECIAL = 4, TF_LSTRIP = 8, TF_RSTRIP = 16, TF_SINGLE = 32, TF_NORM = 64 };

typedef struct {
    char *p;
    size_t used, cap;
} pool;

struct tokenizer {
    int vocab_size;
    uint32_t *dec_off, *dec_len, *sp_off, *sp_len; /* per id: decoded bytes, spelling */
    uint8_t *flags;
    pool dec, sp;
    int32_t *map;          /* spelling → id, -1 empty */
    uint32_t map_cap;
    uint64_t *mkey;        /* (left << 32 | right) + 1, 0 empty */
    int32_t *mrank, *mout;
    uint32_t mcap;
    int32_t byte_id[256];  /* the token of each single byte, -1 if the vocabulary lacks it */
    int32_t *added;        /* added token ids by first byte, then longest content first */
    int n_added;
    int added_at[257];     /* added[added_at[b] .. added_at[b + 1]) start with byte b */
    utf8proc_option_t norm; /* the normalizer's utf8proc options; 0 for none */
    pre_kind pre;
    bool exact, ignore_merges;
    bool prefix_segment;   /* ByteLevel add_prefix_space before its own split: per segment */
    bool prefix_piece;     /* ByteLevel add_prefix_space after a Split: per piece */
    int32_t affix[2][8];   /* ids the post_processor adds before / after a sequence */
    int n_affix[2];
};

/* ---- GPT-2 byte ↔ unicode ------------------------------------------------------------ */

static bool tk_printable_byte(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

uint32_t tok_byte_to_unicode(uint8_t b)
{
    if (tk_printable_byte(b)) return b;
    uint32_t n = 0;
    for (int x = 0; x < b; x++) if (!tk_printable_byte(x)) n++;
    return 256 + n;
}

/* Code point → byte, or -1 when cp is not one of the 256 byte characters. */
static int tk_unicode_to_byte(uint32_t cp)
{
    static int16_t inv[324];
    static bool ready;
    if (!ready) { /* idempotent: concurrent first calls write the same values */
        for (int i = 0; i < 324; i++) inv[i] = -1;
        for (int b = 0; b < 256; b++) inv[tok_byte_to_unicode((uint8_t)b)] = (int16_t)b;
        ready = true;
    }
    return cp < 324 ? inv[cp] : -1;
}

/* ---- UTF-8 --------------------------------------------------------------------------- */

/* Decodes one code point at s[0..n); *len its byte length. Invalid bytes decode one at a
 * time as U+FFFD (treated as "other" by the pre-tokeniser, their bytes kept). */
static uint32_t tk_utf8(const unsigned char *s, size_t n, int *len)
{
    unsigned c = s[0];
    int need = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    if (need == 0) { *len = 1; return c; }
    if (need < 0 || (size_t)need >= n) { *len = 1; return 0xFFFD; }
    uint32_t cp = c & (0x3F >> need);
    for (int i = 1; i <= need; i++) {
        if ((s[i] & 0xC0) != 0x80) { *len = 1; return 0xFFFD; }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < min[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) { *len = 1; return 0xFFFD; }
    *len = need + 1;
    return cp;
}

static int tk_put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- character classes: \p{L}, \p{N}, \s, \w ------------------------------------- */

/* General categories from utf8proc (the Unicode database Debian keeps current), so the
 * pre-tokeniser splits every script as HF's regex engine does. */
static bool tk_L(uint32_t c)
{
    if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

static bool tk_N(uint32_t c)
{
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}

/* Unicode White_Space (what \s matches in HF's Oniguruma patterns and Rust's regex). It
 * is a property, not a category (tab and newline are Cc), hence the list. */
static bool tk_S(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Rust regex's \w (HF's single_word rule): letters, marks, digits, connectors, ZWNJ/ZWJ. */
static bool tk_W(uint32_t c)
{
    if (c < 0x80) return tk_L(c) || tk_N(c) || c == '_';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ND) || k == UTF8PROC_CATEGORY_NL ||
           k == UTF8PROC_CATEGORY_PC || c == 0x200C || c == 0x200D;
}

static bool tk_other(uint32_t c) { return !tk_S(c) && !tk_L(c) && !tk_N(c); }
static bool tk_nl(uint32_t c) { return c == '\r' || c == '\n'; }

/* ---- the pre-tokeniser pattern -------------------------------------------------------- */

static int tk_lower(uint32_t c) { return c < 0x80 ? (int)(c | 0x20) : -1; }

/* 's 't 're 've 'm 'll 'd at c[i] (case-insensitive unless gpt2); code points matched or 0. */
static int tk_contraction(const uint32_t *c, int n, int i, bool fold)
{
    if (c[i] != '\'' || i + 1 >= n) return 0;
    int a = fold ? tk_lower(c[i + 1]) : (int)c[i + 1], b = i + 2 < n ? (fold ? tk_lower(c[i + 2]) : (int)c[i + 2]) : -1;
    if (a == 's' || a == 't') return 2;
    if ((a == 'r' || a == 'v') && b == 'e') return 3;
    if (a == 'm') return 2;
    if (a == 'l' && b == 'l') return 3;
    if (a == 'd') return 2;
    return 0;
}

static int tk_run(const uint32_t *c, int n, int j, bool (*cls)(uint32_t), int max)
{
    int k = j;
    while (k < n && k - j < max && cls(c[k])) k++;
    return k - j;
}

/* \s*[\r\n]+ | \s+(?!\S) | \s+ at a whitespace c[i]. */
static int tk_space(const uint32_t *c, int n, int i, bool newline_alt)
{
    int j = i;
    while (j < n && tk_S(c[j])) j++;
    if (newline_alt)
        for (int p = j - 1; p >= i; p--)
            if (tk_nl(c[p])) return p + 1 - i;
    if (j == n || j - i == 1) return j - i; /* at the end, or one space before a non-space */
    return j - i - 1;                        /* leave the last space to the next piece */
}

/* Length in code points of the piece starting at c[i]. */
static int tk_match(pre_kind k, const uint32_t *c, int n, int i)
{
    int m;
    if (k == PRE_GPT2) {
        if ((m = tk_contraction(c, n, i, false))) return m;
        int sp = c[i] == ' ' && i + 1 < n ? 1 : 0;
        bool (*cls[3])(uint32_t) = {tk_L, tk_N, tk_other};
        for (int a = 0; a < 3; a++) {
            if (sp && cls[a](c[i + 1])) return 1 + tk_run(c, n, i + 1, cls[a], INT_MAX);
            if (cls[a](c[i])) return tk_run(c, n, i, cls[a], INT_MAX);
        }
        return tk_space(c, n, i, false);
    }
    if ((m = tk_contraction(c, n, i, true))) return m;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (!tk_nl(c[i]) && !tk_L(c[i]) && !tk_N(c[i]) && i + 1 < n && tk_L(c[i + 1]))
        return 1 + tk_run(c, n, i + 1, tk_L, INT_MAX);
    if (tk_L(c[i])) return tk_run(c, n, i, tk_L, INT_MAX);
    /* \p{N}{1,3} (Llama 3) or \p{N} (Qwen2) */
    if (tk_N(c[i])) return tk_run(c, n, i, tk_N, k == PRE_LLAMA3 ? 3 : 1);
    /* ' '?[^\s\p{L}\p{N}]+[\r\n]* */
    int j = i + (c[i] == ' ' && i + 1 < n && tk_other(c[i + 1]) ? 1 : 0);
    if (tk_other(c[j])) {
        j += tk_run(c, n, j, tk_other, INT_MAX);
        while (j < n && tk_nl(c[j])) j++;
        return j - i;
    }
    return tk_space(c, n, i, true);
}

/* ---- pools and maps ------------------------------------------------------------------ */

static int tk_pool_add(pool *p, const char *s, size_t n, uint32_t *off)
{
    if (p->used + n + 1 > p->cap) {
        size_t cap = p->cap ? p->cap : 4096;
        while (cap < p->used + n + 1) cap *= 2;
        char *q = realloc(p->p, cap);
        if (!q) return -1;
        p->p = q;
        p->cap = cap;
    }
    if (p->used + n > UINT32_MAX) return -1;
    memcpy(p->p + p->used, s, n);
    p->p[p->used + n] = 0;
    *off = (uint32_t)p->used;
    p->used += n + 1;
    return 0;
}

static uint64_t tk_mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int32_t tk_map_find(const tokenizer *t, const char *s, size_t n)
{
    if (!t->map_cap) return -1;
    for (uint32_t h = str_hash(s, n) & (t->map_cap - 1);; h = (h + 1) & (t->map_cap - 1)) {
        int32_t id = t->map[h];
        if (id < 0) return -1;
        if (t->sp_len[id] == n && memcmp(t->sp.p + t->sp_off[id], s, n) == 0) return id;
    }
}

static void tk_map_insert(tokenizer *t, int32_t id)
{
    const char *s = t->sp.p + t->sp_off[id];
    size_t n = t->sp_len[id];
    if (tk_map_find(t, s, n) >= 0) return; /* first spelling wins */
    uint32_t h = str_hash(s, n) & (t->map_cap - 1);
    while (t->map[h] >= 0) h = (h + 1) & (t->map_cap - 1);
    t->map[h] = id;
}

static bool tk_merge_find(const tokenizer *t, int32_t l, int32_t r, int32_t *rank, int32_t *out)
{
    if (!t->mcap) return false;
    uint64_t key = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1;
    for (uint64_t h = tk_mix(key) & (t->mcap - 1);; h = (h + 1) & (t->mcap - 1)) {
        if (t->mkey[h] == 0) return false;
        if (t->mkey[h] == key) { *rank = t->mrank[h]; *out = t->mout[h]; return true; }
    }
}

/* ---- loading ------------------------------------------------------------------------- */

void tok_free(tokenizer *t)
{
    if (!t) return;
    free(t->dec_off); free(t->dec_len); free(t->sp_off); free(t->sp_len); free(t->flags);
    free(t->dec.p); free(t->sp.p); free(t->map);
    free(t->mkey); free(t->mrank); free(t->mout);
    free(t->added);
    free(t);
}

/* Sets id's spelling and decoded bytes (byte-level pieces map back through the table;
 * characters outside it are kept as UTF-8). */
static int tk_set_token(tokenizer *t, int32_t id, const char *spelling, bool byte_level)
{
    size_t n = strlen(spelling);
    if (t->flags[id] & TF_PRESENT) return 0;
    char *dec = malloc(n + 1);
    if (!dec) return -1;
    size_t m = 0;
    if (byte_level) {
        for (size_t i = 0; i < n;) {
            int len;
            uint32_t cp = tk_utf8((const unsigned char *)spelling + i, n - i, &len);
            int b = tk_unicode_to_byte(cp);
            if (b >= 0) dec[m++] = (char)b;
            else { memcpy(dec + m, spelling + i, len); m += len; }
            i += len;
        }
    } else {
        memcpy(dec, spelling, n);
        m = n;
    }
    int rc = tk_pool_add(&t->sp, spelling, n, &t->sp_off[id]) | tk_pool_add(&t->dec, dec, m, &t->dec_off[id]);
    free(dec);
    if (rc) return -1;
    t->sp_len[id] = (uint32_t)n;
    t->dec_len[id] = (uint32_t)m;
    t->flags[id] |= TF_PRESENT;
    return 0;
}

/* The pre-tokeniser kind of a tokenizer.json pre_tokenizer object. */
static int tk_pre(tokenizer *t, json_t *pre, char *err, size_t errlen)
{
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (!type) { err_set(err, errlen, "tokenizer: no pre_tokenizer (byte-level BPE expected)"); return -1; }
    if (!strcmp(type, "ByteLevel")) {
        t->prefix_segment = json_is_true(json_object_get(pre, "add_prefix_space"));
        t->pre = PRE_GPT2;
        t->exact = !json_is_false(json_object_get(pre, "use_regex"));
        return 0;
    }
    if (strcmp(type, "Sequence")) { err_set(err, errlen, "tokenizer: pre_tokenizer %s is not supported", type); return -1; }
    json_t *list = json_object_get(pre, "pretokenizers");
    bool byte_level = false, split = false;
    t->exact = true;
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *p = json_array_get(list, i);
        const char *ty = json_string_value(json_object_get(p, "type"));
        if (ty && !strcmp(ty, "ByteLevel")) {
            byte_level = true;
            bool prefix = json_is_true(json_object_get(p, "add_prefix_space"));
            bool regex = !json_is_false(json_object_get(p, "use_regex"));
            if (!split) { t->prefix_segment = prefix; t->pre = PRE_GPT2; t->exact &= regex; split = regex; }
            else { t->prefix_piece = prefix; t->exact &= !regex; /* a second split after the Split: not done */ }
        } else if (ty && !strcmp(ty, "Split")) {
            const char *re = json_string_value(json_object_get(json_object_get(p, "pattern"), "Regex"));
            const char *beh = json_string_value(json_object_get(p, "behavior"));
            t->exact &= re != NULL && !split && (!beh || !strcmp(beh, "Isolated")) &&
                        !json_is_true(json_object_get(p, "invert"));
            split = true;
            if (!re) t->pre = PRE_LLAMA3;
            else if (strstr(re, "\\p{N}{1,3}")) t->pre = PRE_LLAMA3;
            else if (strstr(re, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|")) t->pre = PRE_QWEN2;
            else if (strstr(re, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+|")) t->pre = PRE_GPT2;
            else { t->pre = PRE_LLAMA3; t->exact = false; }
        } else if (ty && strcmp(ty, "Digits") && strcmp(ty, "Punctuation")) {
            err_set(err, errlen, "tokenizer: pre_tokenizer %s is not supported", ty);
            return -1;
        } else {
            t->exact = false; /* Digits / Punctuation splits: approximated by the pattern */
        }
    }
    if (!byte_level) { err_set(err, errlen, "tokenizer: not a byte-level BPE (no ByteLevel pre_tokenizer)"); return -1; }
    if (!split) t->pre = PRE_GPT2;
    return 0;
}

/* The normalizer: none, a Unicode normal form, or a Sequence of them (utf8proc applies
 * them; NFC after NFD is NFC, so the last form of a sequence decides, unless a
 * compatibility form came before). Anything else would silently change what text
 * encodes to, so it is refused. */
static int tk_normalizer(tokenizer *t, json_t *n, char *err, size_t errlen)
{
    if (!n || json_is_null(n)) return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        for (size_t i = 0; i < json_array_size(list); i++)
            if (tk_normalizer(t, json_array_get(list, i), err, errlen) < 0) return -1;
        return 0;
    }
    utf8proc_option_t compat = t->norm & UTF8PROC_COMPAT;
    if (type && !strcmp(type, "NFC")) t->norm = UTF8PROC_STABLE | UTF8PROC_COMPOSE | compat;
    else if (type && !strcmp(type, "NFD")) t->norm = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | compat;
    else if (type && !strcmp(type, "NFKC")) t->norm = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (type && !strcmp(type, "NFKD")) t->norm = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else {
        err_set(err, errlen, "tokenizer: normalizer %s is not supported (NFC, NFD, NFKC, NFKD, Sequence)",
               type ? type : "without a type");
        return -1;
    }
    return 0;
}

/* The post_processor's additions to a single sequence (HF's add_special_tokens=True):
 * TemplateProcessing's "single" special tokens before and after $A, inside a Sequence
 * or alone. ByteLevel post-processing changes offsets only. Others are refused. */
static int tk_post(tokenizer *t, json_t *pp, char *err, size_t errlen)
{
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (!pp || json_is_null(pp) || (type && !strcmp(type, "ByteLevel"))) return 0;
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pp, "processors");
        for (size_t i = 0; i < json_array_size(list); i++)
            if (tk_post(t, json_array_get(list, i), err, errlen) < 0) return -1;
        return 0;
    }
    if (type && (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing"))) {
        json_int_t cls = json_integer_value(json_array_get(json_object_get(pp, "cls"), 1)),
                   sep = json_integer_value(json_array_get(json_object_get(pp, "sep"), 1));
        if (cls < 0 || cls >= t->vocab_size || sep < 0 || sep >= t->vocab_size) {
            err_set(err, errlen, "tokenizer: post_processor %s: bad cls/sep id", type);
            return -1;
        }
        t->affix[0][0] = (int32_t)cls;
        t->affix[1][0] = (int32_t)sep;
        t->n_affix[0] = t->n_affix[1] = 1;
        return 0;
    }
    if (!type || strcmp(type, "TemplateProcessing")) {
        err_set(err, errlen, "tokenizer: post_processor %s is not supported (TemplateProcessing, RobertaProcessing, "
               "BertProcessing, ByteLevel)", type ? type : "without a type");
        return -1;
    }
    json_t *single = json_object_get(pp, "single"), *specials = json_object_get(pp, "special_tokens");
    int side = 0;
    t->n_affix[0] = t->n_affix[1] = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *item = json_array_get(single, i), *sp = json_object_get(item, "SpecialToken");
        if (json_object_get(item, "Sequence")) { side = 1; continue; }
        json_t *ids = json_object_get(json_object_get(specials, json_string_value(json_object_get(sp, "id"))), "ids");
        if (!json_is_array(ids)) {
            err_set(err, errlen, "tokenizer: post_processor single[%zu] names no known special token", i);
            return -1;
        }
        for (size_t k = 0; k < json_array_size(ids); k++) {
            json_int_t id = json_integer_value(json_array_get(ids, k));
            if (t->n_affix[side] == 8 || id < 0 || id >= t->vocab_size) {
                err_set(err, errlen, "tokenizer: post_processor special tokens: bad id or more than 8");
                return -1;
            }
            t->affix[side][t->n_affix[side]++] = (int32_t)id;
        }
    }
    return 0;
}

/* Orders added tokens by first byte, then longest first (leftmost-longest matching). */
static int tk_cmp_added(const void *a, const void *b, void *ctx)
{
    const tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint8_t fx = (uint8_t)t->dec.p[t->dec_off[x]], fy = (uint8_t)t->dec.p[t->dec_off[y]];
    if (fx != fy) return fx < fy ? -1 : 1;
    return t->dec_len[x] < t->dec_len[y] ? 1 : t->dec_len[x] > t->dec_len[y] ? -1 : x - y;
}

tokenizer *tok_parse(const char *text, size_t len, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) { err_set(err, errlen, "tokenizer: JSON error at line %d: %s", je.line, je.text); return NULL; }
    tokenizer *t = calloc(1, sizeof *t);
    json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab"),
           *merges = json_object_get(model, "merges"), *added = json_object_get(root, "added_tokens");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!t) { err_set(err, errlen, "tokenizer: out of memory"); goto fail; }
    if (!type || strcmp(type, "BPE") || !json_is_object(vocab)) {
        err_set(err, errlen, "tokenizer: model.type must be BPE with a vocab (got %s)", type ? type : "none");
        goto fail;
    }
    if (json_is_true(json_object_get(model, "byte_fallback"))) {
        err_set(err, errlen, "tokenizer: byte_fallback (SentencePiece-style) BPE is not supported; byte-level BPE only");
        goto fail;
    }
    if (tk_pre(t, json_object_get(root, "pre_tokenizer"), err, errlen) < 0 ||
        tk_normalizer(t, json_object_get(root, "normalizer"), err, errlen) < 0)
        goto fail;
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    /* ids: the largest id of vocab and added tokens */
    int64_t maxid = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 26)) {
            err_set(err, errlen, "tokenizer: vocab entry %s has a bad id", key);
            goto fail;
        }
        if (json_integer_value(v) > maxid) maxid = json_integer_value(v);
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *id = json_object_get(json_array_get(added, i), "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 26) ||
            !json_is_string(json_object_get(json_array_get(added, i), "content"))) {
            err_set(err, errlen, "tokenizer: added_tokens[%zu] needs an id and a content", i);
            goto fail;
        }
        if (json_integer_value(id) > maxid) maxid = json_integer_value(id);
    }
    int V = (int)(maxid + 1);
    t->vocab_size = V;
    t->dec_off = calloc(V + 1, sizeof *t->dec_off);
    t->dec_len = calloc(V + 1, sizeof *t->dec_len);
    t->sp_off = calloc(V + 1, sizeof *t->sp_off);
    t->sp_len = calloc(V + 1, sizeof *t->sp_len);
    t->flags = calloc(V + 1, 1);
    t->added = calloc(json_array_size(added) + 1, sizeof *t->added);
    if (!t->dec_off || !t->dec_len || !t->sp_off || !t->sp_len || !t->flags || !t->added) goto oom;
    /* Added tokens first: their content is their bytes even when vocab spells them too. */
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        const char *content = json_string_value(json_object_get(a, "content"));
        if (!*content || (t->flags[id] & TF_ADDED)) continue;
        if (tk_set_token(t, id, content, false) < 0) goto oom;
        /* HF's defaults: normalized is true unless the token is special */
        bool special = json_is_true(json_object_get(a, "special")), norm = !special;
        if (json_is_boolean(json_object_get(a, "normalized"))) norm = json_is_true(json_object_get(a, "normalized"));
        t->flags[id] |= TF_ADDED | (special ? TF_SPECIAL : 0) | (norm ? TF_NORM : 0) |
                        (json_is_true(json_object_get(a, "lstrip")) ? TF_LSTRIP : 0) |
                        (json_is_true(json_object_get(a, "rstrip")) ? TF_RSTRIP : 0) |
                        (json_is_true(json_object_get(a, "single_word")) ? TF_SINGLE : 0);
        t->added[t->n_added++] = id;
    }
    json_object_foreach(vocab, key, v) if (tk_set_token(t, (int32_t)json_integer_value(v), key, true) < 0) goto oom;
    qsort_r(t->added, t->n_added, sizeof *t->added, tk_cmp_added, t);
    for (int b = 0, a = 0; b <= 256; b++) {
        while (a < t->n_added && (uint8_t)t->dec.p[t->dec_off[t->added[a]]] < b) a++;
        t->added_at[b] = a;
    }
    size_t count = json_object_size(vocab) + json_array_size(added);
    for (t->map_cap = 16; t->map_cap < 2 * count;) t->map_cap *= 2;
    if (!(t->map = malloc(t->map_cap * sizeof *t->map))) goto oom;
    memset(t->map, 0xFF, t->map_cap * sizeof *t->map);
    for (int id = 0; id < V; id++) if (t->flags[id] & TF_PRESENT) tk_map_insert(t, id);
    for (int b = 0; b < 256; b++) {
        char s[4];
        int n = tk_put_utf8(s, tok_byte_to_unicode((uint8_t)b));
        t->byte_id[b] = tk_map_find(t, s, n);
        if (t->byte_id[b] >= 0 && (t->flags[t->byte_id[b]] & TF_ADDED)) t->byte_id[b] = -1;
    }
    /* merges: "a b" or ["a", "b"]; a merge whose parts or result are not in vocab is skipped */
    size_t nm = json_array_size(merges);
    for (t->mcap = 16; t->mcap < 2 * nm + 2;) t->mcap *= 2;
    t->mkey = calloc(t->mcap, sizeof *t->mkey);
    t->mrank = malloc(t->mcap * sizeof *t->mrank);
    t->mout = malloc(t->mcap * sizeof *t->mout);
    if (!t->mkey || !t->mrank || !t->mout) goto oom;
    char *buf = NULL;
    size_t bufcap = 0;
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = strchr(a + (a[0] == ' ' ? 1 : 0), ' ');
            if (!sp) continue;
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            la = strlen(a);
            lb = strlen(b);
        } else {
            free(buf);
            err_set(err, errlen, "tokenizer: merges[%zu] is neither \"a b\" nor [a, b]", i);
            goto fail;
        }
        if (la + lb + 1 > bufcap) {
            bufcap = 2 * (la + lb + 1);
            char *nb = realloc(buf, bufcap);
            if (!nb) { free(buf); goto oom; }
            buf = nb;
        }
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        int32_t l = tk_map_find(t, a, la), r = tk_map_find(t, b, lb), o = tk_map_find(t, buf, la + lb), rank, out;
        if (l < 0 || r < 0 || o < 0 || tk_merge_find(t, l, r, &rank, &out)) continue;
        uint64_t k = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1;
        uint64_t h = tk_mix(k) & (t->mcap - 1);
        while (t->mkey[h]) h = (h + 1) & (t->mcap - 1);
        t->mkey[h] = k;
        t->mrank[h] = (int32_t)i;
        t->mout[h] = o;
    }
    free(buf);
    if (tk_post(t, json_object_get(root, "post_processor"), err, errlen) < 0) goto fail;
    json_decref(root);
    return t;
oom:
    err_set(err, errlen, "tokenizer: out of memory");
fail:
    json_decref(root);
    tok_free(t);
    return NULL;
}

tokenizer *tok_load(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) { err_set(err, errlen, "tokenizer: cannot open %s", path); return NULL; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        fclose(f);
        err_set(err, errlen, "tokenizer: cannot read %s", path);
        return NULL;
    }
    fclose(f);
    tokenizer *t = tok_parse(s, (size_t)n, err, errlen);
    free(s);
    return t;
}

/* ---- queries ------------------------------------------------------------------------- */

int tok_vocab_size(const tokenizer *t) { return t->vocab_size; }
bool tok_exact(const tokenizer *t) { return t->exact; }

const char *tok_token_to_piece(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->vocab_size || !(t->flags[id] & TF_PRESENT)) return NULL;
    if (len) *len = t->dec_len[id];
    return t->dec.p + t->dec_off[id];
}

int32_t tok_piece_to_id(const tokenizer *t, const char *piece) { return tk_map_find(t, piece, strlen(piece)); }

bool tok_is_special(const tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->vocab_size && (t->flags[id] & TF_SPECIAL);
}

int tok_decode(const tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = 0;
        if (tok_token_to_piece(t, ids[i], &l)) total += l;
    }
    char *s = malloc(total + 1);
    if (!s) return -1;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = 0;
        const char *p = tok_token_to_piece(t, ids[i], &l);
        if (p) { memcpy(s + m, p, l); m += l; }
    }
    s[m] = 0;
    *out = s;
    if (len) *len = m;
    return 0;
}

/* ---- encoding ------------------------------------------------------------------------ */

typedef struct {
    int32_t *ids;
    size_t n, cap;
    size_t dropped;
} tk_out;

static int tk_push(tk_out *o, int32_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        int32_t *p = realloc(o->ids, cap * sizeof *p);
        if (!p) return -1;
        o->ids = p;
        o->cap = cap;
    }
    o->ids[o->n++] = id;
    return 0;
}

/* BPE of one pre-tokenised piece s[0..n) (raw bytes). sym: scratch of n ids. */
static int tk_bpe(const tokenizer *t, const unsigned char *s, size_t n, int32_t *sym, char *spell, tk_out *o)
{
    if (t->ignore_merges) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) m += tk_put_utf8(spell + m, tok_byte_to_unicode(s[i]));
        int32_t id = tk_map_find(t, spell, m);
        if (id >= 0 && !(t->flags[id] & TF_ADDED)) return tk_push(o, id);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (t->byte_id[s[i]] < 0) { o->dropped++; continue; }
        sym[k++] = t->byte_id[s[i]];
    }
    for (;;) {
        int32_t best = INT32_MAX, bl = -1, br = -1, bo = -1;
        for (size_t i = 0; i + 1 < k; i++) {
            int32_t rank, out;
            if (tk_merge_find(t, sym[i], sym[i + 1], &rank, &out) && rank < best) {
                best = rank;
                bl = sym[i];
                br = sym[i + 1];
                bo = out;
            }
        }
        if (bo < 0) break;
        size_t w = 0;
        for (size_t i = 0; i < k;) {
            if (i + 1 < k && sym[i] == bl && sym[i + 1] == br) { sym[w++] = bo; i += 2; }
            else sym[w++] = sym[i++];
        }
        k = w;
    }
    for (size_t i = 0; i < k; i++) if (tk_push(o, sym[i]) < 0) return -1;
    return 0;
}

/* Code points of text[0..len) and their byte offsets (off[n] = len); n returned. */
static int tk_codepoints(const char *text, size_t len, uint32_t *cp, size_t *off)
{
    int n = 0;
    for (size_t i = 0; i < len;) {
        int l;
        cp[n] = tk_utf8((const unsigned char *)text + i, len - i, &l);
        off[n++] = i;
        i += l;
    }
    off[n] = len;
    return n;
}

static int tk_piece_len(const tokenizer *t, const uint32_t *cp, int n, int i)
{
    int m = tk_match(t->pre, cp, n, i);
    if (m < 1) m = 1;
    return i + m > n ? n - i : m;
}

long tok_pretokenize(const tokenizer *t, const char *text, size_t len, size_t *ends, size_t cap)
{
    uint32_t *cp = malloc((len + 1) * sizeof *cp);
    size_t *off = malloc((len + 2) * sizeof *off);
    if (!cp || !off) { free(cp); free(off); return -1; }
    int n = tk_codepoints(text, len, cp, off);
    long k = 0;
    for (int i = 0; i < n; k++) {
        i += tk_piece_len(t, cp, n, i);
        if ((size_t)k < cap) ends[k] = off[i];
    }
    free(cp);
    free(off);
    return k;
}

/* Pre-tokenises and encodes text that holds no added token. A space goes in front of the
 * segment, or of each piece, where the ByteLevel pre-tokenizer's add_prefix_space says so
 * (HF: before its own split, or per piece after a Split). */
static int tk_encode_plain(const tokenizer *t, const char *text, size_t len, tk_out *o)
{
    if (len == 0) return 0;
    char *seg = NULL;
    if (t->prefix_segment && text[0] != ' ') {
        if (!(seg = malloc(len + 1))) return -1;
        seg[0] = ' ';
        memcpy(seg + 1, text, len++);
        text = seg;
    }
    uint32_t *cp = malloc((len + 1) * sizeof *cp);
    size_t *off = malloc((len + 2) * sizeof *off);
    int32_t *sym = malloc((len + 2) * sizeof *sym);
    char *spell = malloc(2 * len + 3), *piece = malloc(len + 2);
    int rc = -1;
    if (!cp || !off || !sym || !spell || !piece) goto out;
    int n = tk_codepoints(text, len, cp, off);
    for (int i = 0; i < n;) {
        int m = tk_piece_len(t, cp, n, i);
        const char *p = text + off[i];
        size_t pl = off[i + m] - off[i];
        if (t->prefix_piece && p[0] != ' ') {
            piece[0] = ' ';
            memcpy(piece + 1, p, pl++);
            p = piece;
        }
        if (tk_bpe(t, (const unsigned char *)p, pl, sym, spell, o) < 0) goto out;
        i += m;
    }
    rc = 0;
out:
    free(seg);
    free(cp);
    free(off);
    free(sym);
    free(spell);
    free(piece);
    return rc;
}

/* Applies the normalizer to s[0..n): *out is malloc'd, or NULL when there is none (use s).
 * utf8proc only takes valid UTF-8, so invalid bytes (which HF never sees: its input is a
 * Rust string) pass through unchanged between normalised runs. 0 or -1 (out of memory). */
static int tk_normalize(const tokenizer *t, const char *s, size_t n, char **out, size_t *outn)
{
    *out = NULL;
    if (!t->norm) return 0;
    size_t cap = n + 16, m = 0;
    char *buf = malloc(cap);
    if (!buf) return -1;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        int l;
        while (j < n && !(tk_utf8((const unsigned char *)s + j, n - j, &l) == 0xFFFD && l == 1)) j += l;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t dn = 0;
        if (j > i) {
            dn = utf8proc_map((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(j - i), &dst, t->norm);
            if (dn < 0) { free(buf); return -1; } /* only UTF8PROC_ERROR_NOMEM is possible on valid input */
        }
        size_t need = m + (size_t)dn + (j < n ? 1 : 0);
        if (need > cap) {
            while (cap < need) cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) { free(dst); free(buf); return -1; }
            buf = nb;
        }
        memcpy(buf + m, dst, (size_t)dn);
        m += (size_t)dn;
        free(dst);
        if (j < n) buf[m++] = s[j++]; /* the invalid byte */
        i = j;
    }
    *out = buf;
    *outn = m;
    return 0;
}

typedef struct {
    size_t start, stop; /* the span the token takes, stripped whitespace included */
    int32_t id;
} tk_hit;

/* The code point that ends at s[end] (end > 0). */
static uint32_t tk_prev_cp(const char *s, size_t end)
{
    size_t b = end - 1;
    while (b > 0 && end - b < 4 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
    int l;
    uint32_t c = tk_utf8((const unsigned char *)s + b, end - b, &l);
    return b + (size_t)l == end ? c : 0xFFFD;
}

/* The next added token of s[from..n) among those matched on normalised (norm) or raw
 * text, as HF's AddedVocabulary finds it: leftmost-longest (its Aho-Corasick), a
 * single_word token only between non-word characters (else the search goes on after
 * it), lstrip taking the whitespace before it back to floor (the end of the previous
 * token), rstrip the whitespace after it. False if there is none. */
static bool tk_next_added(const tokenizer *t, const char *s, size_t n, size_t from, size_t floor, bool norm, tk_hit *h)
{
    for (size_t i = from; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        for (int a = t->added_at[b]; a < t->added_at[b + 1]; a++) {
            int32_t id = t->added[a];
            size_t l = t->dec_len[id];
            if (((t->flags[id] & TF_NORM) != 0) != norm || l > n - i || memcmp(s + i, t->dec.p + t->dec_off[id], l))
                continue;
            int cl;
            if ((t->flags[id] & TF_SINGLE) &&
                ((i > 0 && tk_W(tk_prev_cp(s, i))) ||
                 (i + l < n && tk_W(tk_utf8((const unsigned char *)s + i + l, n - i - l, &cl))))) {
                i += l - 1;
                break;
            }
            h->id = id;
            h->start = i;
            h->stop = i + l;
            while ((t->flags[id] & TF_LSTRIP) && h->start > floor && tk_S(tk_prev_cp(s, h->start))) {
                uint32_t c = tk_prev_cp(s, h->start);
                h->start -= c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
            }
            while ((t->flags[id] & TF_RSTRIP) && h->stop < n) {
                uint32_t c = tk_utf8((const unsigned char *)s + h->stop, n - h->stop, &cl);
                if (!tk_S(c)) break;
                h->stop += (size_t)cl;
            }
            return true;
        }
    }
    return false;
}

/* A segment between added tokens matched on raw text: normalised, then split again at
 * the added tokens matched on normalised text. */
static int tk_encode_segment(const tokenizer *t, const char *s, size_t n, tk_out *o)
{
    if (n == 0) return 0;
    char *norm;
    size_t nn;
    if (tk_normalize(t, s, n, &norm, &nn) < 0) return -1;
    if (norm) { s = norm; n = nn; }
    int rc = 0;
    size_t start = 0;
    tk_hit h;
    for (size_t from = 0; rc == 0 && tk_next_added(t, s, n, from, start, true, &h); from = h.stop) {
        rc = tk_encode_plain(t, s + start, h.start - start, o) < 0 || tk_push(o, h.id) < 0 ? -1 : 0;
        start = h.stop;
    }
    if (rc == 0) rc = tk_encode_plain(t, s + start, n - start, o);
    free(norm);
    return rc;
}

int tok_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n, size_t *dropped,
               char *err, size_t errlen)
{
    tk_out o = {0};
    size_t start = 0;
    tk_hit h;
    for (size_t from = 0; tk_next_added(t, text, len, from, start, false, &h); from = h.stop) {
        if (tk_encode_segment(t, text + start, h.start - start, &o) < 0 || tk_push(&o, h.id) < 0) goto oom;
        start = h.stop;
    }
    if (tk_encode_segment(t, text + start, len - start, &o) < 0) goto oom;
    *ids = o.ids ? o.ids : malloc(sizeof(int32_t));
    *n = o.n;
    if (dropped) *dropped = o.dropped;
    return *ids ? 0 : -1;
oom:
    free(o.ids);
    err_set(err, errlen, "tokenizer: out of memory");
    return -1;
}

const int32_t *tok_special_prefix(const tokenizer *t, size_t *n)
{
    *n = (size_t)t->n_affix[0];
    return t->affix[0];
}

const int32_t *tok_special_suffix(const tokenizer *t, size_t *n)
{
    *n = (size_t)t->n_affix[1];
    return t->affix[1];
}
