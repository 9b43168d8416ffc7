"""An independent byte-level BPE encoder for tests/test_tokenizer.c (Debian has no
`tokenizers` package): the tokenizer.json's split pattern run by Python's `re`, with
\\p{L}, \\p{N} and \\s replaced by classes built from unicodedata (so the character
classes come from the full Unicode database, not from text/tokenizer.c's range table),
GPT-2's bytes_to_unicode, and GPT-2's reference `bpe` merge loop.

    python3 bpe_ref.py tokenizer.json strings.json   -> prints a JSON list of id lists
"""
import json, re, sys, unicodedata


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def ranges(pred):
    out, start, prev = [], None, None
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            ok = False
        else:
            ok = pred(cp)
        if ok and start is None:
            start = cp
        if not ok and start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, 0x10FFFF))
    return "".join(re.escape(chr(a)) if a == b else re.escape(chr(a)) + "-" + re.escape(chr(b)) for a, b in out)


WS = {9, 10, 11, 12, 13, 32, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000} | set(range(0x2000, 0x200B))


def classes():
    cat = unicodedata.category
    return {"L": ranges(lambda c: cat(chr(c)).startswith("L")),
            "N": ranges(lambda c: cat(chr(c)).startswith("N")),
            "s": "".join(re.escape(chr(c)) for c in sorted(WS))}


def translate(pattern, cls):
    """Onig-style pattern -> Python re, class escapes replaced by explicit ranges."""
    out, i, depth = [], 0, 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("\\p{L}", i) or pattern.startswith("\\p{N}", i):
            body = cls[pattern[i + 3]]
            out.append(body if depth else "[" + body + "]")
            i += 5
            continue
        if c == "\\" and i + 1 < len(pattern) and pattern[i + 1] in "sS":
            neg = pattern[i + 1] == "S"
            if depth:
                assert not neg
                out.append(cls["s"])
            else:
                out.append(("[^" if neg else "[") + cls["s"] + "]")
            i += 2
            continue
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        out.append(c)
        i += 1
    return "".join(out)


GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


class Ref:
    def __init__(self, path):
        tj = json.load(open(path, encoding="utf-8"))
        model = tj["model"]
        self.vocab = model["vocab"]
        self.ignore_merges = bool(model.get("ignore_merges"))
        self.ranks = {}
        for i, m in enumerate(model["merges"]):
            a, b = m.split(" ") if isinstance(m, str) else m
            if (a, b) not in self.ranks:
                self.ranks[(a, b)] = i
        self.added = sorted(((t["content"], t["id"]) for t in tj.get("added_tokens", [])),
                            key=lambda x: (-len(x[0].encode()), x[1]))
        pre = tj["pre_tokenizer"]
        pats, self.prefix = [], False
        for p in (pre["pretokenizers"] if pre["type"] == "Sequence" else [pre]):
            if p["type"] == "Split":
                pats.append(p["pattern"]["Regex"])
            elif p["type"] == "ByteLevel":
                self.prefix = bool(p.get("add_prefix_space"))
                if p.get("use_regex", True) and not pats:
                    pats.append(GPT2)
        self.re = re.compile(translate(pats[0], classes()))
        self.b2u = bytes_to_unicode()

    def split(self, text):
        pieces, pos = [], 0
        for m in self.re.finditer(text):
            if m.start() > pos:
                pieces.append(text[pos:m.start()])
            if m.end() > m.start():
                pieces.append(m.group())
            pos = m.end()
        if pos < len(text):
            pieces.append(text[pos:])
        return pieces

    def bpe(self, word):
        """GPT-2's encoder.py loop: merge the lowest-ranked pair everywhere, repeat."""
        word = list(word)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            new, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    new.append(word[i] + word[i + 1])
                    i += 2
                else:
                    new.append(word[i])
                    i += 1
            word = new
        return word

    def encode_plain(self, text):
        ids = []
        for piece in self.split(text):
            u = "".join(self.b2u[b] for b in piece.encode("utf-8"))
            if self.ignore_merges and u in self.vocab:
                ids.append(self.vocab[u])
                continue
            u = "".join(ch for ch in u if ch in self.vocab)  # bytes the vocabulary lacks are dropped
            ids.extend(self.vocab[t] for t in self.bpe(u))
        return ids

    def encode(self, text):
        if self.prefix and text and not text.startswith(" "):
            text = " " + text
        ids, start, i = [], 0, 0
        while i < len(text):
            for content, tid in self.added:
                if content and text.startswith(content, i):
                    ids += self.encode_plain(text[start:i]) + [tid]
                    i += len(content)
                    start = i
                    break
            else:
                i += 1
        return ids + self.encode_plain(text[start:])


if __name__ == "__main__":
    ref = Ref(sys.argv[1])
    strings = json.load(open(sys.argv[2], encoding="utf-8"))
    print(json.dumps([ref.encode(s) for s in strings]))
