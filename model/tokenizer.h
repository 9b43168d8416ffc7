/* tokenizer.h — Hugging Face `tokenizer.json` of the byte-level BPE kind (GPT-2, Llama 3,
 * Qwen2/2.5/3): load, encode text → ids, decode ids → bytes, one token's bytes.
 *
 * Supported: model.type "BPE" with vocab, merges ("a b" strings or [a, b] pairs),
 * ignore_merges; added_tokens (matched in text before pre-tokenisation, longest first);
 * pre_tokenizer ByteLevel (alone: the GPT-2 split; add_prefix_space) or a Sequence of a
 * Split regex and ByteLevel, the regex being one of the three known patterns:
 *   GPT-2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama 3 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   Qwen2   the same with \p{N} (one digit per piece)
 * implemented by hand over code points (no regex engine).
 *
 * Approximations (documented, checked by tests/test_tokenizer.c on the scripts below):
 *   - \p{L} and \p{N} come from a compact range table covering Latin, Greek, Cyrillic,
 *     Armenian, Hebrew, Arabic, Devanagari, Thai, Georgian, Hangul, kana, CJK and the
 *     fullwidth forms; letters of other scripts count as "other" (punctuation-like), so
 *     text in them may be split differently from HF (ids still decode to the same bytes).
 *   - Another Split pattern is treated as the Llama 3 one (tok_exact() says false).
 *   - The normalizer (Qwen2: NFC) is not applied: give NFC text.
 *   - added_tokens flags lstrip/rstrip/single_word/normalized are ignored.
 * Decoding is exact: byte-level pieces map back through the GPT-2 byte↔unicode table,
 * added tokens decode to their content (special ones included, as HF with
 * skip_special_tokens=False).
 */
#ifndef LOOM_MODEL_TOKENIZER_H
#define LOOM_MODEL_TOKENIZER_H

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
/* False when the pre-tokenizer pattern was not one of the three known ones. */
bool tok_exact(const tokenizer *t);

/* Encodes len bytes of text into *ids (malloc'd, *n of them). Bytes that the vocabulary
 * cannot represent (a reduced byte alphabet) are dropped and counted in *dropped (may be
 * NULL). 0, or -1 with err (out of memory). */
int tok_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n, size_t *dropped,
               char *err, size_t errlen);

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
