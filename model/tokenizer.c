/* tokenizer.c — byte-level BPE from a Hugging Face tokenizer.json (see tokenizer.h for
 * what is supported and what is approximated).
 *
 * Layout: per token id, its decoded bytes and its tokenizer.json spelling in two string
 * pools; one open-addressing map spelling → id, one map (left id, right id) → (rank,
 * merged id). Encoding: split out added tokens, pre-tokenise the rest with the pattern
 * (over code points), map each piece's bytes to their single-byte tokens, then merge the
 * lowest-ranked adjacent pair everywhere it occurs until no pair has a merge (GPT-2's
 * reference loop; the same result as HF's heap of merges).
 */
#include "model/tokenizer.h"
#include "common/err.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { PRE_GPT2, PRE_LLAMA3, PRE_QWEN2 } pre_kind;

enum { TF_PRESENT = 1, TF_ADDED = 2, TF_SPECIAL = 4 };

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
    int32_t *added;        /* added token ids, longest content first */
    int n_added;
    uint8_t added_first[32]; /* bit set of the first bytes of added tokens */
    pre_kind pre;
    bool exact, add_prefix_space, ignore_merges;
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

/* ---- character classes (approximate \p{L}, \p{N}; exact \s) ------------------------- */

typedef struct { uint32_t lo, hi; } tk_range;

static const tk_range tk_letters[] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xAA, 0xAA}, {0xB5, 0xB5}, {0xBA, 0xBA}, {0xC0, 0xD6}, {0xD8, 0xF6},
    {0xF8, 0x2C1}, {0x2C6, 0x2D1}, {0x2E0, 0x2E4}, {0x2EC, 0x2EC}, {0x2EE, 0x2EE}, {0x370, 0x374},
    {0x376, 0x377}, {0x37A, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C},
    {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556}, {0x559, 0x559},
    {0x560, 0x588}, {0x5D0, 0x5EA}, {0x5EF, 0x5F2}, {0x620, 0x64A}, {0x66E, 0x66F}, {0x671, 0x6D3},
    {0x6D5, 0x6D5}, {0x6E5, 0x6E6}, {0x6EE, 0x6EF}, {0x6FA, 0x6FC}, {0x6FF, 0x6FF}, {0x904, 0x939},
    {0x93D, 0x93D}, {0x950, 0x950}, {0x958, 0x961}, {0x971, 0x980}, {0xE01, 0xE30}, {0xE32, 0xE33},
    {0xE40, 0xE46}, {0x10A0, 0x10C5}, {0x10D0, 0x10FA}, {0x10FC, 0x10FF}, {0x1100, 0x1248},
    {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57},
    {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4},
    {0x1FB6, 0x1FBC}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2071, 0x2071}, {0x207F, 0x207F},
    {0x2090, 0x209C}, {0x2C00, 0x2CE4}, {0x2D00, 0x2D25}, {0x3005, 0x3006}, {0x3031, 0x3035},
    {0x3041, 0x3096}, {0x309D, 0x309F}, {0x30A1, 0x30FA}, {0x30FC, 0x30FF}, {0x3105, 0x312F},
    {0x3131, 0x318E}, {0x3400, 0x4DBF}, {0x4E00, 0x9FFF}, {0xA000, 0xA48C}, {0xAC00, 0xD7A3},
    {0xF900, 0xFA6D}, {0xFB00, 0xFB06}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0xFF66, 0xFFBE},
    {0x20000, 0x2A6DF}, {0x2A700, 0x2EBE0}, {0x2F800, 0x2FA1D},
};

static const tk_range tk_numbers[] = {
    {0x30, 0x39}, {0xB2, 0xB3}, {0xB9, 0xB9}, {0xBC, 0xBE}, {0x660, 0x669}, {0x6F0, 0x6F9},
    {0x966, 0x96F}, {0xE50, 0xE59}, {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089},
    {0x2150, 0x2182}, {0x2185, 0x2189}, {0x2460, 0x249B}, {0x24EA, 0x24FF}, {0x2776, 0x2793},
    {0x3007, 0x3007}, {0x3021, 0x3029}, {0x3038, 0x303A}, {0xFF10, 0xFF19},
};

static bool tk_in(const tk_range *r, size_t n, uint32_t c)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < r[mid].lo) hi = mid;
        else if (c > r[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

static bool tk_L(uint32_t c)
{
    if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
    return tk_in(tk_letters, sizeof tk_letters / sizeof tk_letters[0], c);
}

static bool tk_N(uint32_t c)
{
    if (c < 0x80) return c >= '0' && c <= '9';
    return tk_in(tk_numbers, sizeof tk_numbers / sizeof tk_numbers[0], c);
}

/* Unicode White_Space (what \s matches in HF's Oniguruma patterns). */
static bool tk_S(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
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

static uint32_t tk_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
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
    for (uint32_t h = tk_hash(s, n) & (t->map_cap - 1);; h = (h + 1) & (t->map_cap - 1)) {
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
    uint32_t h = tk_hash(s, n) & (t->map_cap - 1);
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
        t->add_prefix_space = json_is_true(json_object_get(pre, "add_prefix_space"));
        t->pre = PRE_GPT2;
        t->exact = !json_is_false(json_object_get(pre, "use_regex"));
        return 0;
    }
    if (strcmp(type, "Sequence")) { err_set(err, errlen, "tokenizer: pre_tokenizer %s is not supported", type); return -1; }
    json_t *list = json_object_get(pre, "pretokenizers");
    bool byte_level = false, split = false;
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *p = json_array_get(list, i);
        const char *ty = json_string_value(json_object_get(p, "type"));
        if (ty && !strcmp(ty, "ByteLevel")) {
            byte_level = true;
            t->add_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
            if (!split && !json_is_false(json_object_get(p, "use_regex"))) { t->pre = PRE_GPT2; t->exact = true; split = true; }
        } else if (ty && !strcmp(ty, "Split")) {
            const char *re = json_string_value(json_object_get(json_object_get(p, "pattern"), "Regex"));
            split = true;
            t->exact = re != NULL;
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

static int tk_cmp_len_desc(const void *a, const void *b, void *ctx)
{
    const tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
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
    if (tk_pre(t, json_object_get(root, "pre_tokenizer"), err, errlen) < 0) goto fail;
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
        t->flags[id] |= TF_ADDED | (json_is_true(json_object_get(a, "special")) ? TF_SPECIAL : 0);
        t->added[t->n_added++] = id;
    }
    json_object_foreach(vocab, key, v) if (tk_set_token(t, (int32_t)json_integer_value(v), key, true) < 0) goto oom;
    qsort_r(t->added, t->n_added, sizeof *t->added, tk_cmp_len_desc, t);
    for (int a = 0; a < t->n_added; a++) {
        uint8_t b = (uint8_t)t->dec.p[t->dec_off[t->added[a]]];
        t->added_first[b >> 3] |= (uint8_t)(1u << (b & 7));
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

/* Pre-tokenises and encodes text without added tokens. */
static int tk_encode_plain(const tokenizer *t, const char *text, size_t len, tk_out *o)
{
    if (len == 0) return 0;
    uint32_t *cp = malloc((len + 1) * sizeof *cp);
    size_t *off = malloc((len + 2) * sizeof *off);
    int32_t *sym = malloc((len + 1) * sizeof *sym);
    char *spell = malloc(2 * len + 1);
    int rc = -1;
    if (!cp || !off || !sym || !spell) goto out;
    int n = tk_codepoints(text, len, cp, off);
    for (int i = 0; i < n;) {
        int m = tk_piece_len(t, cp, n, i);
        if (tk_bpe(t, (const unsigned char *)text + off[i], off[i + m] - off[i], sym, spell, o) < 0) goto out;
        i += m;
    }
    rc = 0;
out:
    free(cp);
    free(off);
    free(sym);
    free(spell);
    return rc;
}

int tok_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n, size_t *dropped,
               char *err, size_t errlen)
{
    tk_out o = {0};
    char *owned = NULL;
    if (t->add_prefix_space && len > 0 && text[0] != ' ') {
        if (!(owned = malloc(len + 1))) goto oom;
        owned[0] = ' ';
        memcpy(owned + 1, text, len);
        text = owned;
        len++;
    }
    size_t start = 0;
    for (size_t i = 0; i < len;) {
        int32_t hit = -1;
        uint8_t b = (uint8_t)text[i];
        if (!(t->added_first[b >> 3] & (1u << (b & 7)))) { i++; continue; }
        for (int a = 0; a < t->n_added; a++) {
            int32_t id = t->added[a];
            size_t l = t->dec_len[id];
            if (l <= len - i && memcmp(text + i, t->dec.p + t->dec_off[id], l) == 0) { hit = id; break; }
        }
        if (hit < 0) { i++; continue; }
        if (tk_encode_plain(t, text + start, i - start, &o) < 0 || tk_push(&o, hit) < 0) goto oom;
        i += t->dec_len[hit];
        start = i;
    }
    if (tk_encode_plain(t, text + start, len - start, &o) < 0) goto oom;
    free(owned);
    *ids = o.ids ? o.ids : malloc(sizeof(int32_t));
    *n = o.n;
    if (dropped) *dropped = o.dropped;
    return *ids ? 0 : -1;
oom:
    free(owned);
    free(o.ids);
    err_set(err, errlen, "tokenizer: out of memory");
    return -1;
}
