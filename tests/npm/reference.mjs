// reference.mjs — Hugging Face's tokenization and chat templates as independent JavaScript
// implementations compute them, for tests/chat_template_test.py:
//   @lenml/tokenizers        (a fork of transformers.js: tokenizers and apply_chat_template)
//   @huggingface/tokenizers  (Tokenizers.js: translates the Rust crate's Oniguruma regexes)
//   @huggingface/jinja       (the Jinja renderer of transformers.js, current version: the one
//                             bundled in @lenml/tokenizers cannot parse Qwen3's template)
// Usage: node reference.mjs MODEL_DIR < request.json > answer.json, where the request is
// {"texts": [S...], "conversations": [{"messages": [...], "add_generation_prompt": B,
//  "kwargs": {...}}...]} and the answer gives, per text, the ids of both tokenizers
// (without and with special tokens) and lenml's decode of its ids; per conversation, the
// rendered text (jinja), its ids, and lenml's own apply_chat_template where it can render.
import fs from "node:fs";
import { TokenizerLoader } from "@lenml/tokenizers";
import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";

const dir = process.argv[2];
const tokenizerJSON = JSON.parse(fs.readFileSync(`${dir}/tokenizer.json`, "utf8"));
const tokenizerConfig = JSON.parse(fs.readFileSync(`${dir}/tokenizer_config.json`, "utf8"));
const req = JSON.parse(fs.readFileSync(0, "utf8"));

const lenml = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
const hf = new Tokenizer(tokenizerJSON, tokenizerConfig);
const template = new Template(tokenizerConfig.chat_template);

// The variables transformers' apply_chat_template passes: the special tokens that are set.
const specials = {};
for (const k of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]) {
  const v = tokenizerConfig[k];
  if (typeof v === "string") specials[k] = v;
  else if (v && typeof v.content === "string") specials[k] = v.content;
}

const lenmlIds = (s, add) => Array.from(lenml.encode(s, { add_special_tokens: add }));
const hfIds = (s, add) => Array.from(hf.encode(s, { add_special_tokens: add }).ids);

const texts = req.texts.map((s) => {
  const ids = lenmlIds(s, false);
  return {
    lenml: ids,
    hf: hfIds(s, false),
    lenml_special: lenmlIds(s, true),
    hf_special: hfIds(s, true),
    decoded: lenml.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
  };
});

const conversations = req.conversations.map((c) => {
  const vars = { ...specials, ...(c.kwargs || {}), messages: c.messages, tools: null, documents: null,
                 add_generation_prompt: c.add_generation_prompt };
  const text = template.render(vars);
  let lenmlText = null;
  try {
    lenmlText = lenml.apply_chat_template(c.messages, { tokenize: false,
      add_generation_prompt: c.add_generation_prompt, ...(c.kwargs || {}) });
  } catch (e) {
    lenmlText = null; // its bundled Jinja is too old for this template (Qwen3)
  }
  return { text, lenml_text: lenmlText, lenml: lenmlIds(text, false), hf: hfIds(text, false) };
});

process.stdout.write(JSON.stringify({ texts, conversations }));
