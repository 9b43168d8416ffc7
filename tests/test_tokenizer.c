/* test_tokenizer.c — text/tokenizer.c against what byte-level BPE must do and against an
 * independent Python encoder (tests/lib/bpe_ref.py, run with /usr/bin/python3 when it
 * exists): the tokenizers `loom mkmodel` writes (Llama 3 split + "a b" merges on the tiny
 * 256-token vocabulary, Qwen2 split + [a, b] merges with the full byte alphabet) and a
 * GPT-2-style one; round trips decode(encode(s)) == s over varied and random UTF-8,
 * merges applied, special tokens, pre-tokeniser splits known from tiktoken/HF. */
#include "model/mkmodel.h"
#include "text/tokenizer.h"
#include "model/rng.h"
#define CHECK_QUIET   /* thousands of checks: print failures only */
#include "check.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmp[256];

static const char *const varied[] = {
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nand\r\nwindows",
    "numbers 1234567 and 3.14159, -42, 1e10",
    "don't I'll we've they're she'd I'M YOU'RE",
    "punctuation!!! ??? ... --- (parens) [brackets] {braces} <angles> \"quotes\"",
    "café naïve résumé Ærøskøbing",
    "Привет, мир! Как дела?",
    "日本語のテキストと漢字。",
    "한국어 텍스트",
    "مرحبا بالعالم",
    "Γειά σου κόσμε",
    "emoji 🙂🚀 and symbols ∑∫√ ©®™ €£¥",
    "mixed: abc123def 456ghi ٣٤٥ ½",
    "code: int main(void) { return x->y[3] + 0x1F; }\n    indented\n",
    "a",
    " ",
    "\n",
    "",
    "end with space ",
    "multiple    inner     spaces\n   \n  x",
    "the the the then there other",
};

/* Characters for random strings: every class the pattern distinguishes, within the
 * scripts the C tables cover. */
static const char *const alphabet[] = {
    "a", "b", "e", "t", "h", "s", "Z", "Q", " ", " ", " ", "\n", "\t", "\r", "'", "'s", "'t", "'re", "'LL", "0",
    "7", "9", ".", ",", "!", "-", "(", "\"", "é", "ñ", "Ж", "я", "日", "本", "ア", "한", "ع", "λ", "🙂", "€", "½",
    "²", "٣", "\xc2\xa0", "\xe3\x80\x80", "the", " the", "ing", "<|endoftext|>", "<|begin_of_text|>",
};

static char *rand_string(rng_state *r)
{
    char *s = malloc(512);
    size_t n = 0;
    int parts = 1 + (int)(rng_next(r) % 24);
    for (int i = 0; i < parts; i++) {
        const char *a = alphabet[rng_next(r) % (sizeof alphabet / sizeof alphabet[0])];
        size_t l = strlen(a);
        if (n + l >= 511) break;
        memcpy(s + n, a, l);
        n += l;
    }
    s[n] = 0;
    return s;
}

static bool round_trip(const tokenizer *t, const char *s, size_t len)
{
    int32_t *ids;
    size_t n, dropped;
    char err[256], *out;
    size_t olen;
    if (tok_encode(t, s, len, &ids, &n, &dropped, err, sizeof err) < 0) return false;
    bool ok = tok_decode(t, ids, n, &out, &olen) == 0 && olen == len && memcmp(out, s, len) == 0 && dropped == 0;
    free(ids);
    free(out);
    return ok;
}

static size_t encode(const tokenizer *t, const char *s, int32_t *out, size_t cap)
{
    int32_t *ids;
    size_t n;
    char err[256];
    if (tok_encode(t, s, strlen(s), &ids, &n, NULL, err, sizeof err) < 0) return 0;
    for (size_t i = 0; i < n && i < cap; i++) out[i] = ids[i];
    free(ids);
    return n;
}

/* The tokens as decoded strings joined with '|', for readable expectations. */
static void tokens_str(const tokenizer *t, const char *s, char *out, size_t cap)
{
    int32_t ids[256];
    size_t n = encode(t, s, ids, 256), m = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && m + 40 < cap; i++) {
        size_t l;
        const char *p = tok_token_to_piece(t, ids[i], &l);
        if (i) out[m++] = '|';
        memcpy(out + m, p, l);
        m += l;
    }
    out[m] = 0;
}

/* The pre-tokeniser's pieces joined with '|'. */
static void split_str(const tokenizer *t, const char *s, char *out, size_t cap)
{
    size_t ends[256], m = 0, b = 0;
    long k = tok_pretokenize(t, s, strlen(s), ends, 256);
    out[0] = 0;
    for (long i = 0; i < k && i < 256 && m + 40 < cap; i++) {
        if (i) out[m++] = '|';
        memcpy(out + m, s + b, ends[i] - b);
        m += ends[i] - b;
        b = ends[i];
    }
    out[m] = 0;
}

/* Compares tok_encode with tests/lib/bpe_ref.py on the strings; returns mismatches, or
 * -1 when Python is not there. */
static int compare_with_python(const tokenizer *t, const char *tj_path, const char *const *strs, int n)
{
    if (access("/usr/bin/python3", X_OK) != 0) return -1;
    char ref[1024], spath[512], cmd[2048];
    snprintf(ref, sizeof ref, "%s", __FILE__);
    char *slash = strrchr(ref, '/');
    snprintf(slash ? slash + 1 : ref, sizeof ref - (slash ? (size_t)(slash + 1 - ref) : 0), "lib/bpe_ref.py");
    snprintf(spath, sizeof spath, "%s/strings.json", tmp);
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_string(strs[i]));
    json_dump_file(arr, spath, 0);
    json_decref(arr);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %s %s", ref, tj_path, spath);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    json_error_t je;
    json_t *res = json_loadf(p, 0, &je);
    int st = pclose(p);
    if (!res || st != 0 || (int)json_array_size(res) != n) {
        printf("python reference failed (status %d): %s\n", st, res ? "wrong length" : je.text);
        json_decref(res);
        return n;
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int32_t ids[1024];
        size_t k = encode(t, strs[i], ids, 1024);
        json_t *want = json_array_get(res, i);
        bool same = k == json_array_size(want);
        for (size_t j = 0; same && j < k; j++) same = ids[j] == json_integer_value(json_array_get(want, j));
        if (!same) {
            if (bad < 5) {
                char *w = json_dumps(want, JSON_COMPACT);
                printf("  mismatch on \"%s\": C gives %zu ids [", strs[i], k);
                for (size_t j = 0; j < k && j < 40; j++) printf("%s%d", j ? "," : "", ids[j]);
                printf("], python %s\n", w);
                free(w);
            }
            bad++;
        }
    }
    json_decref(res);
    return bad;
}

static tokenizer *load(const char *path)
{
    char err[256];
    tokenizer *t = tok_load(path, err, sizeof err);
    CHECK(t != NULL, "load %s: %s", path, err);
    return t;
}

int main(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/loom-tok-XXXXXX");
    if (!mkdtemp(tmp)) { perror("mkdtemp"); return 1; }
    char err[256], p_llama[512], p_qwen[512], p_gpt2[512];
    snprintf(p_llama, sizeof p_llama, "%s/llama.json", tmp);
    snprintf(p_qwen, sizeof p_qwen, "%s/qwen.json", tmp);
    snprintf(p_gpt2, sizeof p_gpt2, "%s/gpt2.json", tmp);
    int nv = (int)(sizeof varied / sizeof varied[0]);
    enum { NRAND = 300 };
    char *rnd[NRAND];
    rng_state r;
    rng_seed(&r, 42);
    for (int i = 0; i < NRAND; i++) rnd[i] = rand_string(&r);

    /* ---- the tiny model's tokenizer (what `loom up` serves) ---- */
    CHECK(mkmodel_write_tokenizer(p_llama, NULL, "llama", 256, 1, 2, err, sizeof err) == 0, "write: %s", err);
    CHECK(mkmodel_write_tokenizer(p_qwen, NULL, "qwen2", 1024, 1000, 1001, err, sizeof err) == 0, "write: %s", err);
    CHECK(mkmodel_write_tokenizer(p_gpt2, NULL, "llama", 100, 1, 2, err, sizeof err) == 1, "vocab 100 is refused");
    tokenizer *tl = load(p_llama), *tq = load(p_qwen);
    if (!tl || !tq) { CHECK(false, "both tokenizers load"); return check_summary(); }
    CHECK(tok_vocab_size(tl) == 256, "tiny vocab size %d", tok_vocab_size(tl));
    CHECK(tok_exact(tl) && tok_exact(tq), "known split patterns");
    CHECK(tok_piece_to_id(tl, "<|endoftext|>") == 2 && tok_is_special(tl, 2), "EOS <|endoftext|> is id 2, special");
    CHECK(tok_piece_to_id(tl, "<|begin_of_text|>") == 1 && tok_is_special(tl, 1), "BOS is id 1");
    CHECK(tok_piece_to_id(tq, "<|endoftext|>") == 1001 && tok_piece_to_id(tq, "<|begin_of_text|>") == 1000,
          "qwen specials at 1000/1001");
    CHECK(!tok_is_special(tl, tok_piece_to_id(tl, "a")), "byte token is not special");
    CHECK(tok_piece_to_id(tl, "<|im_start|>") == 254 && tok_piece_to_id(tl, "<|im_end|>") == 255 && tok_is_special(tl, 255),
          "ChatML markers at the last two ids of the tiny vocabulary");
    CHECK(tok_piece_to_id(tq, "<|im_start|>") == 1022 && tok_piece_to_id(tq, "<|im_end|>") == 1023, "qwen ChatML ids");
    /* byte ids as before the ChatML markers existed: 222 bytes kept, ids skip bos 1 / eos 2 */
    CHECK(tok_piece_to_id(tl, "a") == 79 && tok_piece_to_id(tl, "\xc4\x8a") == 3 && tok_piece_to_id(tl, "\xc3\xbf") == -1,
          "tiny byte ids unchanged (a=%d)", tok_piece_to_id(tl, "a"));

    /* merges */
    int32_t ids[256];
    size_t n = encode(tl, " the", ids, 256);
    CHECK(n == 1 && ids[0] == tok_piece_to_id(tl, "\xc4\xa0the"), "' the' is one token (merges Ġ t, h e, Ġt he)");
    n = encode(tl, "the", ids, 256);
    CHECK(n == 2 && ids[0] == tok_piece_to_id(tl, "t") && ids[1] == tok_piece_to_id(tl, "he"), "'the' = t|he (%zu)", n);
    char pc[1024];
    tokens_str(tq, "testing the thing", pc, sizeof pc);
    CHECK(!strcmp(pc, "t|est|ing| the| th|ing"), "qwen merges: %s", pc);

    /* special tokens in text */
    n = encode(tl, "hi<|endoftext|>there", ids, 256);
    bool has_eos = false;
    for (size_t i = 0; i < n; i++) has_eos |= ids[i] == 2;
    CHECK(has_eos && ids[n - 1] != 2, "<|endoftext|> in the middle is encoded as id 2");
    n = encode(tl, "<|endoftext|><|begin_of_text|>", ids, 256);
    CHECK(n == 2 && ids[0] == 2 && ids[1] == 1, "two specials back to back");
    n = encode(tl, "<|endoftext", ids, 256);
    CHECK(n > 1, "an unfinished special is plain text");

    /* pre-tokeniser splits (as tiktoken / HF give them for these patterns) */
    struct { const tokenizer *t; const char *in, *want; } sp[] = {
        {tq, "Hello world", "Hello| world"},
        {tl, "123456", "123|456"},
        {tq, "123", "1|2|3"},
        {tl, "don't", "don|'t"},
        {tl, "DON'T", "DON|'T"},
        {tl, "a\n\nb", "a|\n\n|b"},
        {tl, "x  y", "x| | y"},
        {tl, "x \n y", "x| \n| y"},
        {tl, "hi!!\n\nyo", "hi|!!\n\n|yo"},
        {tl, " ?x", " ?|x"},
        {tl, "end  ", "end|  "},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
        split_str(sp[i].t, sp[i].in, pc, sizeof pc);
        CHECK(!strcmp(pc, sp[i].want), "split of \"%s\": got \"%s\", want \"%s\"", sp[i].in, pc, sp[i].want);
    }

    /* round trips */
    int bad_l = 0, bad_q = 0;
    for (int i = 0; i < nv; i++) {
        bad_l += !round_trip(tl, varied[i], strlen(varied[i]));
        bad_q += !round_trip(tq, varied[i], strlen(varied[i]));
    }
    for (int i = 0; i < NRAND; i++) {
        bad_l += !round_trip(tl, rnd[i], strlen(rnd[i]));
        bad_q += !round_trip(tq, rnd[i], strlen(rnd[i]));
    }
    CHECK(bad_l == 0, "tiny tokenizer round trips (%d of %d failed)", bad_l, nv + NRAND);
    CHECK(bad_q == 0, "qwen tokenizer round trips (%d of %d failed)", bad_q, nv + NRAND);
    const char bin[] = "\x00\x01\x7f\xff\xfe\xc0\x80 raw \xe2\x82 bytes\x1b[0m";
    CHECK(round_trip(tq, bin, sizeof bin - 1), "full byte alphabet: control and invalid UTF-8 bytes round trip");
    {
        int32_t *x;
        size_t k, dropped = 0;
        tok_encode(tl, bin, sizeof bin - 1, &x, &k, &dropped, err, sizeof err);
        CHECK(dropped > 0, "tiny alphabet drops bytes it cannot spell (%zu)", dropped);
        free(x);
    }
    /* decode edge cases */
    {
        int32_t bogus[] = {-5, 99999, tok_piece_to_id(tl, "a")};
        char *out;
        size_t ol;
        CHECK(tok_decode(tl, bogus, 3, &out, &ol) == 0 && ol == 1 && out[0] == 'a', "unknown ids decode to nothing");
        free(out);
        size_t l;
        const char *p = tok_token_to_piece(tl, 2, &l);
        CHECK(p && l == 13 && !memcmp(p, "<|endoftext|>", 13), "EOS piece");
    }

    /* GPT-2 style: ByteLevel with its built-in split, from the qwen file */
    {
        json_error_t je;
        json_t *j = json_load_file(p_qwen, 0, &je);
        json_object_set_new(j, "pre_tokenizer", json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                                                          "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1));
        json_dump_file(j, p_gpt2, JSON_COMPACT);
        json_decref(j);
    }
    tokenizer *tg = load(p_gpt2);
    if (tg) {
        split_str(tg, "it's 2024  now!", pc, sizeof pc);
        CHECK(!strcmp(pc, "it|'s| 2024| | now|!"), "gpt2 split: %s", pc);
    }

    /* the independent reference */
    const char *all[nv + NRAND];
    for (int i = 0; i < nv; i++) all[i] = varied[i];
    for (int i = 0; i < NRAND; i++) all[nv + i] = rnd[i];
    struct { tokenizer *t; const char *path, *name; } refs[] = {{tl, p_llama, "llama3/tiny"}, {tq, p_qwen, "qwen2"},
                                                               {tg, p_gpt2, "gpt2"}};
    for (int k = 0; k < 3; k++) {
        if (!refs[k].t) continue;
        int bad = compare_with_python(refs[k].t, refs[k].path, all, nv + NRAND);
        if (bad < 0) { printf("skip: no /usr/bin/python3 for the reference comparison\n"); break; }
        CHECK(bad == 0, "%s: ids equal the Python reference on %d strings (%d differ)", refs[k].name, nv + NRAND, bad);
        if (bad == 0) printf("ok    %s: same ids as the Python reference on %d strings\n", refs[k].name, nv + NRAND);
    }

    /* malformed files are refused */
    {
        const char *badj[] = {"{", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
                              "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"byte_fallback\": true},"
                              " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
                              "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []},"
                              " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
                              "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                              " \"pre_tokenizer\": {\"type\": \"Metaspace\"}}"};
        for (size_t i = 0; i < sizeof badj / sizeof badj[0]; i++) {
            tokenizer *x = tok_parse(badj[i], strlen(badj[i]), err, sizeof err);
            CHECK(x == NULL && err[0], "malformed tokenizer.json %zu refused", i);
            tok_free(x);
        }
    }

    tok_free(tl);
    tok_free(tq);
    tok_free(tg);
    for (int i = 0; i < NRAND; i++) free(rnd[i]);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) {}
    return check_summary();
}
