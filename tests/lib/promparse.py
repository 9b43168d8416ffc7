"""A strict reader of the Prometheus text exposition format (version 0.0.4), written from
the format's specification independently of Loom's writer: it refuses what Prometheus
would refuse and also what it merely tolerates, so that a scrape that passes here is
clean.

Checked: line grammar (HELP, TYPE, samples; no blank lines, a final newline), metric and
label names, label-value escapes (only \\\\, \\" and \\n), values (floats, NaN, +Inf,
-Inf), one TYPE and at most one HELP per family, TYPE before the family's samples, each
family's samples together, no series twice, sample names fitting the family's type
(histogram: _bucket with le, _sum, _count), counters not negative, histogram buckets in
increasing le ending at +Inf, cumulative, with +Inf equal to _count.

    fams = parse(text)        # {family: Family}; raises ParseError
    fams["loom_x"].samples    # [(name, {label: value}, float)]
    value(fams, "loom_x_total", kind="fb")   # the sample with exactly these labels
"""
import math
import re

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


class ParseError(ValueError):
    pass


class Family:
    def __init__(self, name):
        self.name, self.type, self.help, self.samples = name, None, None, []


def _value(s, where):
    if s in ("NaN", "+Inf", "-Inf"):
        return {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}[s]
    if not re.fullmatch(r"[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?)", s):
        raise ParseError(f"{where}: value {s!r} is not a float")
    return float(s)


def _labels(s, i, where):
    """Parses {a="x",b="y"} starting at s[i] == '{'; returns (dict, index after '}')."""
    out = {}
    i += 1
    while True:
        if s[i] == "}":
            return out, i + 1
        m = LABEL.match(s, i)
        if not m:
            raise ParseError(f"{where}: bad label name at {s[i:i + 20]!r}")
        name = m.group(0)
        if name.startswith("__"):
            raise ParseError(f"{where}: label name {name} is reserved")
        if name in out:
            raise ParseError(f"{where}: label {name} twice")
        i = m.end()
        if s[i:i + 2] != '="':
            raise ParseError(f"{where}: expected =\" after {name}")
        i += 2
        v = []
        while True:
            if i >= len(s):
                raise ParseError(f"{where}: unterminated label value")
            c = s[i]
            if c == "\\":
                e = s[i + 1:i + 2]
                if e not in ("\\", '"', "n"):
                    raise ParseError(f"{where}: bad escape \\{e} in a label value")
                v.append("\n" if e == "n" else e)
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == "\n":
                raise ParseError(f"{where}: newline in a label value")
            else:
                v.append(c)
                i += 1
        out[name] = "".join(v)
        if s[i] == ",":
            i += 1
        elif s[i] != "}":
            raise ParseError(f"{where}: expected , or }} after label {name}")


def _family_of(name, fams):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[:-len(suffix)] in fams and \
                fams[name[:-len(suffix)]].type in ("histogram", "summary"):
            return name[:-len(suffix)]
    return name


def parse(text):
    if not text.endswith("\n"):
        raise ParseError("the exposition does not end with a newline")
    fams, order, done, seen = {}, [], set(), set()
    current = None
    for n, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {n}"
        if line == "":
            raise ParseError(f"{where}: empty line")
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.fullmatch(name):
                    raise ParseError(f"{where}: bad metric name {name!r}")
                f = fams.get(name)
                if f is None:
                    if name in done:
                        raise ParseError(f"{where}: family {name} appears twice")
                    f = fams[name] = Family(name)
                    order.append(name)
                if current and current != name:
                    done.add(current)
                current = name
                if parts[1] == "TYPE":
                    if f.type is not None:
                        raise ParseError(f"{where}: second TYPE for {name}")
                    if f.samples:
                        raise ParseError(f"{where}: TYPE of {name} after its samples")
                    if len(parts) != 4 or parts[3] not in TYPES:
                        raise ParseError(f"{where}: bad TYPE line")
                    f.type = parts[3]
                else:
                    if f.help is not None:
                        raise ParseError(f"{where}: second HELP for {name}")
                    h = parts[3] if len(parts) == 4 else ""
                    if re.search(r"\\[^\\n]", h.replace("\\\\", "")):
                        raise ParseError(f"{where}: bad escape in HELP")
                    f.help = h
            continue
        m = NAME.match(line)
        if not m:
            raise ParseError(f"{where}: bad sample line {line[:60]!r}")
        name = m.group(0)
        i = m.end()
        labels = {}
        if i < len(line) and line[i] == "{":
            labels, i = _labels(line, i, where)
        if line[i:i + 1] != " ":
            raise ParseError(f"{where}: expected a space before the value")
        rest = line[i + 1:].split(" ")
        if len(rest) not in (1, 2):
            raise ParseError(f"{where}: expected value [timestamp]")
        v = _value(rest[0], where)
        if len(rest) == 2 and not re.fullmatch(r"-?\d+", rest[1]):
            raise ParseError(f"{where}: bad timestamp")
        fam = _family_of(name, fams)
        f = fams.get(fam)
        if f is None:
            if fam in done:
                raise ParseError(f"{where}: samples of {fam} are not together")
            f = fams[fam] = Family(fam)
            f.type = "untyped"
            order.append(fam)
        if current and current != fam:
            done.add(current)
            if fam in done:
                raise ParseError(f"{where}: samples of {fam} are not together")
        current = fam
        key = (name, tuple(sorted(labels.items())))
        if key in seen:
            raise ParseError(f"{where}: series {name}{labels} twice")
        seen.add(key)
        if f.type == "counter" and (v < 0 or math.isnan(v)):
            raise ParseError(f"{where}: counter {name} is {v}")
        if f.type == "histogram":
            if name == fam + "_bucket":
                if "le" not in labels:
                    raise ParseError(f"{where}: bucket without le")
                _value(labels["le"], where)
            elif name not in (fam + "_sum", fam + "_count"):
                raise ParseError(f"{where}: {name} in histogram {fam}")
            elif "le" in labels:
                raise ParseError(f"{where}: le on {name}")
        elif name != fam:
            raise ParseError(f"{where}: {name} in {f.type} family {fam}")
        f.samples.append((name, labels, v))
    for f in fams.values():
        if f.type == "histogram":
            _check_histogram(f)
    return fams


def _check_histogram(f):
    series = {}
    for name, labels, v in f.samples:
        base = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
        s = series.setdefault(base, {"buckets": [], "sum": None, "count": None})
        if name.endswith("_bucket"):
            s["buckets"].append((_value(labels["le"], f.name), v))
        else:
            s[name.rsplit("_", 1)[1]] = v
    for base, s in series.items():
        les = [le for le, _ in s["buckets"]]
        if not les or les[-1] != math.inf:
            raise ParseError(f"{f.name}{dict(base)}: no +Inf bucket last")
        if les != sorted(les) or len(set(les)) != len(les):
            raise ParseError(f"{f.name}{dict(base)}: buckets not in increasing le")
        counts = [c for _, c in s["buckets"]]
        if any(b < a for a, b in zip(counts, counts[1:])):
            raise ParseError(f"{f.name}{dict(base)}: buckets not cumulative")
        if s["count"] is None or s["sum"] is None:
            raise ParseError(f"{f.name}{dict(base)}: _sum or _count missing")
        if s["count"] != counts[-1]:
            raise ParseError(f"{f.name}{dict(base)}: +Inf bucket {counts[-1]} != _count {s['count']}")


def value(fams, name, **labels):
    """The value of the sample `name` whose labels are exactly `labels`, or None."""
    fam = fams.get(_family_of(name, fams)) or fams.get(name)
    for n, l, v in (fam.samples if fam else []):
        if n == name and l == labels:
            return v
    return None


def samples(fams, name):
    fam = fams.get(_family_of(name, fams)) or fams.get(name)
    return [(l, v) for n, l, v in (fam.samples if fam else []) if n == name]
