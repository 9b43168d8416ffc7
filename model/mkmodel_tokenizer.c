/* mkmodel_tokenizer.c — the small byte-level BPE tokenizer.json that `loom mkmodel`
 * writes next to a generated model, so that generated models can be driven with text
 * (stop strings, tests) like real ones.
 *
 * Ids 0.. go to the byte tokens (GPT-2 byte↔unicode spellings), then to merges taken in
 * order from a fixed list of common English merges (GPT-2's first ones); the BOS and EOS
 * ids of config.json are the added special tokens <|begin_of_text|> and <|endoftext|>.
 * All fits in the model's vocab_size. When the vocabulary is smaller than 256 bytes +
 * specials + 32 merges (the tiny preset has 256), bytes that never occur in text are left
 * out first: those invalid in UTF-8 (C0, C1, F5–FF), then DEL and C0 controls other than
 * \t \n \r. Llama models get the Llama 3 split pattern and "a b" merges, Qwen models the
 * Qwen2 pattern and [a, b] merges (both spellings of tokenizer.json occur in the wild).
 *
 * Chat: the last two ids are the ChatML markers <|im_start|> and <|im_end|> (special),
 * and tokenizer_config.json carries the ChatML chat template with eos_token <|im_end|>,
 * so a generated model chats like a Qwen one. They take the place of the last merges,
 * never of a byte, so the ids of bytes and of the other merges are those of a tokenizer
 * without them (tests depend on the tiny vocabulary).
 */
#include "model/mkmodel.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MKT_MIN_MERGES 32

static const char *const mkt_llama3_re =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
static const char *const mkt_qwen2_re =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

/* ChatML, as Qwen2 and most chat fine-tunes write it. */
static const char *const mkt_chatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* '_' stands for Ġ (the space byte), '~' for Ċ (newline). Merges whose parts are not
 * (yet) tokens are skipped, so the list needs no exact care. */
static const char *const mkt_merges[] = {
    "_ t", "_ a", "h e", "i n", "r e", "o n", "_t he", "e r", "_ s", "a t", "_ w", "_ o", "e n", "_ c", "i t",
    "i s", "a n", "o r", "e s", "_ b", "e d", "_ f", "in g", "_ p", "o u", "_a n", "a l", "a r", "_t o", "_ m",
    "_o f", "_ in", "_ d", "_ h", "_an d", "i c", "a s", "l e", "_t h", "i on", "o m", "l l", "en t", "_ n",
    "_ l", "s t", "_ re", "v e", "_ e", "r o", "l y", "_b e", "_ g", "_ T", "c t", "_ S", "i d", "o t", "_ I",
    "u t", "e t", "_ A", "_ is", "_ on", "i m", "a m", "o w", "a y", "a d", "s e", "_th at", "_ C", "i g",
    "_f or", "a c", "_ y", "v er", "u r", "_ u", "l d", "_s t", "_ M", "' s", "_ he", "_ it", "at ion", "it h",
    "i r", "c e", "_y ou", "i l", "_ B", "_w h", "o l", "_ P", "_w ith", "_ 1", "t er", "c h", "_a s", "_w e",
    "_ (", "n d", "i ll", "_ D", "i f", "_ 2", "a g", "er s", "k e", "_ \"", "_ H", "e m", "_c on", "_ W",
    "_ R", "he r", "_w as", "_ r", "o d", "_ F", "u l", "at e", "_a t", "r i", "p p", "o re", "_T he", "_s e",
    "u s", "_p ro", "_h a", "u m", "_a re", "_d e", "a in", "an d", "_o r", "ig h", "es t", "is t", "a b",
    "r om", "_ N", "t h", "_c om", "_ G", "u n", "o p", "0 0", "_ L", "_n ot", "es s", "_e x", "_ v", "re s",
    "_ E", "e w", "it y", "an t", "_b y", "e l", "o s", "or t", "o c", "q u", "_f rom", "_h ave", "_s u",
    "i ve", "ou ld", "_s h", "_th is", "n t", "r a", "p e", "igh t", "ar t", "m ent", "_a l", "u st", "en d",
    "- -", "al l", "_ O", "~ ~", ". ~", "_ _", "_ 0", "_ 3", "1 0", "2 0",
};

/* Bytes that text never needs, in the order they are given up when space is short. */
static int mkt_droppable(int *out)
{
    int n = 0;
    out[n++] = 0xC0;
    out[n++] = 0xC1;
    for (int b = 0xF5; b <= 0xFF; b++) out[n++] = b;
    out[n++] = 0x7F;
    for (int b = 0; b < 0x20; b++) if (b != '\t' && b != '\n' && b != '\r') out[n++] = b;
    return n;
}

typedef struct {
    char **s;
    int n, cap;
} mkt_list;

static int mkt_find(const mkt_list *l, const char *s)
{
    for (int i = 0; i < l->n; i++) if (!strcmp(l->s[i], s)) return i;
    return -1;
}

static int mkt_add(mkt_list *l, const char *s)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 512;
        char **p = realloc(l->s, cap * sizeof *p);
        if (!p) return -1;
        l->s = p;
        l->cap = cap;
    }
    return (l->s[l->n] = strdup(s)) ? l->n++ : -1;
}

/* Expands the '_' / '~' shorthand of one half of a merge into its spelling. */
static void mkt_spell(const char *a, size_t n, char *out)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] == '_') { out[m++] = (char)0xC4; out[m++] = (char)0xA0; }      /* Ġ U+0120 */
        else if (a[i] == '~') { out[m++] = (char)0xC4; out[m++] = (char)0x8A; } /* Ċ U+010A */
        else out[m++] = a[i];
    }
    out[m] = 0;
}

static void mkt_utf8(uint32_t cp, char *o)
{
    if (cp < 0x80) { o[0] = (char)cp; o[1] = 0; }
    else { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); o[2] = 0; } /* cp < 0x800 here */
}

static json_t *mkt_added(int id, const char *content)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content, "single_word", 0, "lstrip", 0,
                     "rstrip", 0, "normalized", 0, "special", 1);
}

/* tokenizer_config.json: the chat template and the special tokens it uses. */
static int mkt_write_config(const char *path, bool chat)
{
    json_t *c = json_pack("{s:s, s:s, s:s, s:b, s:b, s:s}", "tokenizer_class", "PreTrainedTokenizerFast", "bos_token",
                          "<|begin_of_text|>", "eos_token", chat ? "<|im_end|>" : "<|endoftext|>", "add_bos_token", 0,
                          "clean_up_tokenization_spaces", 0, "pad_token", "<|endoftext|>");
    if (chat) json_object_set_new(c, "chat_template", json_string(mkt_chatml));
    int rc = c ? json_dump_file(c, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : -1;
    json_decref(c);
    return rc;
}

int mkmodel_write_tokenizer(const char *path, const char *config_path, const char *arch, int vocab, int bos, int eos,
                            char *err, size_t errlen)
{
    bool qwen = arch && arch[0] == 'q';
    int nspecial = (bos >= 0 && bos < vocab) + (eos >= 0 && eos < vocab && eos != bos);
    int slots = vocab - nspecial, drop[64], ndrop = mkt_droppable(drop), k = 0;
    if (slots < 256 + MKT_MIN_MERGES) k = 256 + MKT_MIN_MERGES - slots;
    if (k > ndrop) k = ndrop;
    if (256 - k > slots) {
        snprintf(err, errlen, "mkmodel: vocab %d is too small for a byte-level tokenizer (needs %d)", vocab,
                 256 - ndrop + nspecial);
        return 1;
    }
    int nchat = slots - 2 >= 256 - k ? 2 : 0, chat_id[2], nc = 0; /* the last two ids that are not bos/eos */
    for (int id = vocab - 1; id >= 0 && nc < nchat; id--) if (id != bos && id != eos) chat_id[nc++] = id;
    bool dropped[256] = {false};
    for (int i = 0; i < k; i++) dropped[drop[i]] = true;
    mkt_list toks = {0};
    json_t *merges = json_array();
    int rc = -1;
    for (int b = 0; b < 256; b++) {
        char s[4];
        mkt_utf8(tok_byte_to_unicode((uint8_t)b), s);
        if (!dropped[b] && mkt_add(&toks, s) < 0) goto out;
    }
    for (size_t i = 0; i < sizeof mkt_merges / sizeof mkt_merges[0] && toks.n < slots - nchat; i++) {
        const char *m = mkt_merges[i], *sp = strchr(m, ' ');
        char a[64], b[64], ab[128];
        mkt_spell(m, (size_t)(sp - m), a);
        mkt_spell(sp + 1, strlen(sp + 1), b);
        snprintf(ab, sizeof ab, "%s%s", a, b);
        if (mkt_find(&toks, a) < 0 || mkt_find(&toks, b) < 0 || mkt_find(&toks, ab) >= 0) continue;
        if (mkt_add(&toks, ab) < 0) goto out;
        if (qwen) json_array_append_new(merges, json_pack("[s, s]", a, b));
        else {
            char line[160];
            snprintf(line, sizeof line, "%s %s", a, b);
            json_array_append_new(merges, json_string(line));
        }
    }
    /* ids in order, skipping the special ones */
    json_t *v = json_object();
    for (int i = 0, id = 0; i < toks.n; i++, id++) {
        while (id == bos || id == eos) id++;
        json_object_set_new(v, toks.s[i], json_integer(id));
    }
    json_t *added = json_array();
    const char *names[2] = {"<|begin_of_text|>", "<|endoftext|>"};
    int ids[2] = {bos, eos};
    for (int i = 0; i < 2; i++)
        if (ids[i] >= 0 && ids[i] < vocab && !(i == 1 && eos == bos)) json_array_append_new(added, mkt_added(ids[i], names[i]));
    if (nchat) {
        json_array_append_new(added, mkt_added(chat_id[1], "<|im_start|>"));
        json_array_append_new(added, mkt_added(chat_id[0], "<|im_end|>"));
    }
    json_t *pre = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence",
                            "pretokenizers", "type", "Split", "pattern", "Regex", qwen ? mkt_qwen2_re : mkt_llama3_re,
                            "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
                            "trim_offsets", 0, "use_regex", 0);
    json_t *byte_level = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                                   "use_regex", 0);
    json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
                              "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                              "byte_fallback", 0, "ignore_merges", 0, "vocab", v, "merges", merges);
    merges = NULL;
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:n, s:o, s:O, s:o, s:o}", "version", "1.0", "truncation", "padding",
                             "added_tokens", added, "normalizer", "pre_tokenizer", pre, "post_processor", byte_level,
                             "decoder", byte_level, "model", model);
    if (!root || json_dump_file(root, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER) != 0 ||
        (config_path && mkt_write_config(config_path, nchat > 0) != 0)) {
        snprintf(err, errlen, "mkmodel: cannot write %s", path);
        json_decref(root);
        goto out;
    }
    json_decref(root);
    rc = 0;
out:
    json_decref(merges);
    for (int i = 0; i < toks.n; i++) free(toks.s[i]);
    free(toks.s);
    return rc;
}
