"""The documents name the tree as it is (no build, no server):

- every repository path the README and docs/*.md name exists: a word that starts with a
  top-level folder of the repository and ends in a file name with an extension or in `/`
  (`scheduler/planner.c`, `backend/cuda/`; globs such as `tests/*_test.py` must match),
  and every relative Markdown link (`[x](docs/using.md)`, images);
- a source file named bare (`cycle.c`, `lcu_*.cu`) exists somewhere in the tree, and in a
  table row that starts with a folder (docs/architecture.md, "Where things live") under
  that folder;
- every reference to a section of them, `README "X"` or `docs/NAME.md, "X"` (and the
  quoted names that follow it, `"X", "Y"`), in the documents and in the code's comments,
  names a heading that file has (the heading itself, or its part before ":" or " (");
  docs/architecture.md's own `§"X"` too;
- the README is a front door: at most 200 lines, with a map that links every docs/*.md.

Applied migrations are never edited, so their comments keep the names of their day and
are not read here. Prints "N passed, N failed" last.
"""
import fnmatch, os, re, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
from stack import Results  # noqa: E402

ROOT = os.path.normpath(os.path.join(HERE, ".."))
SKIP_DIRS = {"node_modules", "__pycache__"}
# Files the documents name that are not Loom's: upstream projects' sources they cite.
EXTERNAL = {"transformers_weight_conversion.py"}
SOURCE_EXT = r"c|h|cu|cuh|py|sh|sql|cmake"


def tree():
    """(files, folders) of the repository, relative to its root (no .git, no build trees)."""
    files, dirs = set(), set()
    for d, sub, names in os.walk(ROOT):
        sub[:] = [x for x in sub if not (x.startswith(".") or x.startswith("build") or x in SKIP_DIRS)]
        rel = os.path.relpath(d, ROOT)
        if rel != ".":
            dirs.add(rel)
        for n in names:
            files.add(n if rel == "." else f"{rel}/{n}")
    return files, dirs


FILES, DIRS = tree()
TOPS = sorted({p.split("/")[0] for p in DIRS if "/" not in p})
BASENAMES = {os.path.basename(p) for p in FILES}
DOCS = ["README.md"] + sorted(f"docs/{n}" for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md"))
PATH_RE = re.compile(r"(?<![\w./$<~@-])((?:%s)/[A-Za-z0-9_./*{}@-]*)" % "|".join(map(re.escape, TOPS)))
BARE_RE = re.compile(r"(?<![\w./$<~*@-])([A-Za-z0-9_*]+(?:\.[A-Za-z0-9_]+)*\.(?:%s))\b(?![./])" % SOURCE_EXT)


# Placeholders the documents write in paths: migrations/NNNN_name.sql, tests/NAME_test.py.
PLACEHOLDERS = (("NNNN", "[0-9][0-9][0-9][0-9]"), ("_name.", "_*."), ("NAME", "*"))


def placeholders(path):
    for word, glob in PLACEHOLDERS:
        path = path.replace(word, glob)
    return path


def exists(path):
    path = placeholders(path)
    if path in FILES or path in DIRS:
        return True
    if any(c in path for c in "*{["):
        pat = re.sub(r"\{[^}]*\}", "*", path)
        return any(fnmatch.fnmatch(p, pat) for p in FILES | DIRS)
    return False


def repo_paths(text):
    """(line, path) of the words that look like repository paths."""
    for n, line in enumerate(text.splitlines(), 1):
        for tok in PATH_RE.findall(line):
            tok = tok.rstrip(".,:;)")
            last = tok.rstrip("/").rsplit("/", 1)[-1]
            # `api/v1/...` routes and `text/event-stream` share a name with a folder: a
            # path here ends in a file name with an extension, or in a slash.
            if tok.endswith("/") or re.search(r"\.[A-Za-z0-9]+$", last):
                yield n, tok.rstrip("/")


def headings(doc):
    out = set()
    for line in open(os.path.join(ROOT, doc)):
        if line.startswith("#"):
            h = re.sub(r"^#+\s*", "", line).strip().lower()
            out |= {h, h.split(":")[0].strip(), h.split(" (")[0].strip()}
    return out


HEADINGS = {d: headings(d) for d in DOCS}
# README "X", README.md "X", docs/operating.md, "X" (and `, "Y"` after it); the quoted text
# may break across a line (and a comment's leading `*` or `#`).
REF_RE = re.compile(r'(?<![\w/.-])(README(?:\.md)?|docs/[a-z_]+\.md),?\s+((?:"[^"]{1,80}"(?:,\s*)?)+)')


def refs(text):
    for m in REF_RE.finditer(text):
        doc = "README.md" if m.group(1).startswith("README") else m.group(1)
        line = text[:m.start()].count("\n") + 1
        for q in re.findall(r'"([^"]+)"', m.group(2)):
            yield line, doc, re.sub(r"\s+[*#/]*\s*", " ", q).strip()


def main():
    R = Results()
    missing = []
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc)).read()
        for n, tok in repo_paths(text):
            if not exists(tok):
                missing.append(f"{doc}:{n}: {tok}")
        for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(doc), target))
            if not exists(path):
                missing.append(f"{doc}:{text[:m.start()].count(chr(10)) + 1}: link {target}")
        for n, line in enumerate(text.splitlines(), 1):
            for name in BARE_RE.findall(line):
                if name not in EXTERNAL and not any(fnmatch.fnmatch(b, placeholders(name)) for b in BASENAMES):
                    missing.append(f"{doc}:{n}: {name} (no such file in the tree)")
            row = re.match(r"\| `([a-z][a-z0-9_/]*?)/?` \|(.*)", line)
            if row and row.group(1) in DIRS:
                for name in BARE_RE.findall(row.group(2)):
                    under = [p for p in FILES if p.startswith(row.group(1) + "/")]
                    if name not in EXTERNAL and not any(fnmatch.fnmatch(os.path.basename(p), placeholders(name))
                                                        for p in under):
                        missing.append(f"{doc}:{n}: {name} is not under {row.group(1)}/")
    for m in missing:
        print("     ", m)
    R.check(not missing, f"every repository path and file the README and docs/ name exists ({len(missing)} not)")

    bad = []
    sources = sorted(p for p in FILES if re.search(r"\.(c|h|cu|py|sh|cmake|in|json|md|txt)$|^\.ci/run$", p)
                     and not p.startswith("migrations/") and not p.startswith("tests/npm/")
                     and p != "tests/docs_test.py")
    sources += [p for p in FILES if p.startswith("migrations/") and not re.match(r"migrations/\d", p)]
    n_refs = 0
    for path in sources:
        try:
            text = open(os.path.join(ROOT, path), errors="replace").read()
        except OSError:
            continue
        for line, doc, q in refs(text):
            n_refs += 1
            if doc not in HEADINGS:
                bad.append(f"{path}:{line}: {doc} (no such document)")
            elif q.lower() not in HEADINGS[doc]:
                bad.append(f'{path}:{line}: {doc} has no section "{q}"')
        if path == "docs/architecture.md":
            for m in re.finditer(r'§"([^"]+)"', text):
                n_refs += 1
                if re.sub(r"\s+", " ", m.group(1)).lower() not in HEADINGS[path]:
                    bad.append(f'{path}:{text[:m.start()].count(chr(10)) + 1}: no section §"{m.group(1)}"')
    for b in bad:
        print("     ", b)
    R.check(not bad and n_refs > 20, f"{n_refs} references to a section name a heading of their document "
                                     f"({len(bad)} do not)")

    readme = open(os.path.join(ROOT, "README.md")).read()
    R.check(readme.count("\n") <= 200, f"the README is a front door: {readme.count(chr(10))} lines (at most 200)")
    unlinked = [d for d in DOCS[1:] if f"]({d})" not in readme]
    R.check(not unlinked, f"the README's map links every document of docs/ {unlinked}")
    R.finish()


if __name__ == "__main__":
    main()
