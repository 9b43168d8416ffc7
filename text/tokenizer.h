/* tokenizer.h — Hugging Face `tokenizer.json` of the byte-level BPE kind (GPT-2, Llama 3,
 * Qwen2/2.5/3): load, encode text → ids, decode ids → bytes, one token's bytes.
 *
 * Encoding gives the ids HF's `tokenizers` gives with add_special_tokens=False (what
 * apply_chat_template uses; tok_special_prefix/suffix give what True adds):
 *   - model.type "BPE" with vocab, merges ("a b" strings or [a, b] pairs), ignore_merges;
 *   - added_tokens matched in text before anything else, leftmost-longest, with their
 *     lstrip / rstrip / single_word / normalized flags (special tokens inside text are
 *     encoded as themselves, as HF does by default);
 *   - normalizer: none, NFC, NFD, NFKC, NFKD or a Sequence of them (utf8proc), applied
 *     to the text between added tokens (Qwen2/3 use NFC); others are refused at load;
 *   - pre_tokenizer ByteLevel (alone: the GPT-2 split; add_prefix_space) or a Sequence
 *     of a Split regex and ByteLevel, the regex being one of the three known patterns
 *       GPT-2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *       Llama 3 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *       Qwen2   the same with \p{N} (one digit per piece)
 *     implemented by hand over code points (no regex engine), \p{L} and \p{N} being
 *     the Unicode general categories (utf8proc) and \s Unicode White_Space. Another
 *     Split pattern is treated as the Llama 3 one and tok_exact() says false;
 *   - post_processor TemplateProcessing / RobertaProcessing / BertProcessing (their
 *     special tokens around a single sequence), ByteLevel (offsets only).
 * Not supported: byte_fallback (SentencePiece-style BPE over characters, Llama 2 /
 * Mistral: refused at load) and other model types.
 * Decoding is exact on bytes: byte-level pieces map back through the GPT-2 byte↔unicode
 * table and added tokens decode to their content (special ones included, as HF with
 * skip_special_tokens=False); HF's clean_up_tokenization_spaces is not applied.
 */
#ifndef LOOM_TEXT_TOKENIZER_H
#define LOOM_TEXT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;

/* Parses a tokenizer.json file / text. NULL with err on anything unsupported. */
tokenizer *tok_load(const char *path, char *err, size_t errlen);
tokenizer *tok_parse(const char *json_text, size_t len, char *err, size_t errlen);
void tok_free(tokenizer *t);

/* One past the largest token id (vocab and added tokens). */
int tok_vocab_size(const tokenizer *t);
/* False when the pre-tokenizer is approximated (a Split pattern other than the three
 * known ones, Digits/Punctuation splits, a split after a Split). */
bool tok_exact(const tokenizer *t);

/* Encodes len bytes of text into *ids (malloc'd, *n of them). Bytes that the vocabulary
 * cannot represent (a reduced byte alphabet) are dropped and counted in *dropped (may be
 * NULL). 0, or -1 with err (out of memory). */
int tok_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n, size_t *dropped,
               char *err, size_t errlen);

/* The ids HF's post_processor puts before / after one sequence when add_special_tokens
 * is true (Llama 3.1: <|begin_of_text|> before; Qwen: none); *n of them (at most 8). */
const int32_t *tok_special_prefix(const tokenizer *t, size_t *n);
const int32_t *tok_special_suffix(const tokenizer *t, size_t *n);

/* The bytes of ids[0..n) into *out (malloc'd, NUL-terminated, *len bytes without the
 * NUL). Unknown ids decode to nothing. 0 or -1 (out of memory). */
int tok_decode(const tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len);

/* The bytes one token decodes to (not NUL-terminated), or NULL for an unknown id. */
const char *tok_token_to_piece(const tokenizer *t, int32_t id, size_t *len);
/* The id of a vocabulary entry or added token, given its tokenizer.json spelling (for
 * byte-level pieces the GPT-2 unicode form, e.g. "Ġthe"); -1 if none. */
int32_t tok_piece_to_id(const tokenizer *t, const char *piece);
/* True for added tokens marked special. */
bool tok_is_special(const tokenizer *t, int32_t id);

/* The pre-tokeniser alone (no added tokens, no BPE): writes the byte offset where each
 * piece of text[0..len) ends into ends[0..cap) and returns the number of pieces (which may
 * exceed cap), or -1 (out of memory). For tests and debugging. */
long tok_pretokenize(const tokenizer *t, const char *text, size_t len, size_t *ends, size_t cap);

/* GPT-2's byte → code point table (bytes_to_unicode), for writers of tokenizer.json. */
uint32_t tok_byte_to_unicode(uint8_t b);

#endif
