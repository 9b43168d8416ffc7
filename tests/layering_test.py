"""The layering of the tree against tests/layers.txt, where it is written down once.

  - every .c, .h, .cu and .cuh of the clone (git ls-files, new files too) belongs to a
    room of layers.txt, and every room there exists;
  - every #include "x.h" in them reaches a file of its own room or of a room its room may
    include (directly or through the rooms below: the closure of layers.txt's arrows);
  - layers.txt's graph has no circle, nor has the graph of the rooms' actual includes, nor
    that of the files' includes (header guards would hide one from the compiler);
  - CMake agrees: in a scratch configure of this source tree (CMake's file API,
    codemodel-v2), a target's room is the room of its sources that may use all the others,
    and each target it depends on is of its own room or one its room may include or link.

Run alone: /usr/bin/python3 tests/layering_test.py [--no-cmake]
"""
import json, os, re, shutil, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = os.path.join(ROOT, "tests", "layers.txt")
SOURCE = re.compile(r"\.(c|h|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def source_files():
    """The clone's files, new ones not yet added included (git: tracked and not ignored;
    outside a git checkout, every file), less any build tree's."""
    try:
        p = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, text=True)
    except FileNotFoundError:
        p = None
    if p and p.returncode == 0:
        files = [f for f in p.stdout.split("\0") if f]
    else:
        files = []
        for d, dirs, names in os.walk(ROOT):
            dirs[:] = [x for x in dirs
                       if not x.startswith(".") and not os.path.exists(os.path.join(d, x, "CMakeCache.txt"))]
            files += [os.path.relpath(os.path.join(d, n), ROOT) for n in names]
    # Build trees other than the ignored build/ (their generated sources are no room's).
    trees = {f.split("/")[0] for f in files if f.count("/") == 1 and f.endswith("/CMakeCache.txt")}
    return [f for f in files if f.split("/")[0] not in trees]


def read_layers(path):
    """{room: (may include, links)} in file order, or exits naming the bad line."""
    rooms = {}
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"^(\S+):(.*)$", line)
        if not m or m.group(1) in rooms:
            sys.exit(f"{path}:{n}: expected 'room: rooms...' once per room, got {line!r}")
        uses, links = [], []
        for tok in m.group(2).split():
            (links if tok.startswith("link:") else uses).append(tok.removeprefix("link:"))
        rooms[m.group(1)] = (uses, links)
    return rooms


def room_of(path, rooms):
    """The room with the longest path containing path (a repository-relative path)."""
    best = None
    for r in rooms:
        if (path == r or (r.endswith("/") and path.startswith(r))) and (best is None or len(r) > len(best)):
            best = r
    return best


def closure(graph):
    """{room: every room reachable from it by one or more arrows}."""
    out = {}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            r = todo.pop()
            if r not in seen:
                seen.add(r)
                todo.extend(graph.get(r, ()))
        out[start] = seen
    return out


def circles(graph):
    """The strongly connected components of more than one node (or a node with an arrow to
    itself), each as a list of nodes (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph.get(v, ()):
                    out.append(sorted(comp))
    return out


def round_trip(graph, comp):
    """One way round a circle: comp[0] -> ... -> comp[0] within comp (breadth first, so
    the shortest)."""
    inside, start = set(comp), comp[0]
    prev, todo = {}, [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph.get(v, ())):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return " -> ".join([start] + path[::-1][1:] + [start])
            if w in inside and w not in prev:
                prev[w] = v
                todo.append(w)
    return ", ".join(comp)


def resolve(src, inc):
    """The file a quoted #include of src names: beside src first, then from the top of the
    clone (the include path); a file that does not exist is a generated one (protoc-c's
    service/proto/...), placed by its path."""
    beside = os.path.normpath(os.path.join(os.path.dirname(src), inc))
    if os.path.exists(os.path.join(ROOT, beside)):
        return beside
    return os.path.normpath(inc)


def check_includes(rooms, files, fails):
    may = closure({r: uses for r, (uses, _) in rooms.items()})
    room_edges, file_edges = {}, {}
    for src in files:
        r = room_of(src, rooms)
        file_edges[src] = set()
        for n, line in enumerate(open(os.path.join(ROOT, src), encoding="utf-8", errors="replace"), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = resolve(src, m.group(1))
            t = room_of(target, rooms)
            if t is None:
                fails.append(f"{src}:{n}: #include \"{m.group(1)}\": no such file, and no room holds that path")
                continue
            file_edges[src].add(target)
            if t == r:
                continue
            room_edges.setdefault(r, set()).add(t)
            if t not in may[r]:
                fails.append(f"{src}:{n}: #include \"{m.group(1)}\": room {r} may not include room {t} "
                             f"(tests/layers.txt: {r} may include {', '.join(sorted(may[r])) or 'nothing'})")
    for c in circles(room_edges):
        fails.append("the rooms' includes go round in a circle: " + round_trip(room_edges, c))
    for c in circles(file_edges):
        fails.append("files include each other in a circle: " + round_trip(file_edges, c))
    return room_edges


def check_cmake(rooms, fails):
    """Configures this source tree in a scratch directory with a file-API query and checks
    each target's dependencies against the rooms (include and link arrows, closed)."""
    cmake = shutil.which("cmake")
    if not cmake:
        fails.append("cmake not found: cannot check the CMake targets (run with --no-cmake to skip)")
        return 0
    reach = closure({r: uses + links for r, (uses, links) in rooms.items()})
    with tempfile.TemporaryDirectory(prefix="loom-layers-") as build:
        query = os.path.join(build, ".cmake", "api", "v1", "query")
        os.makedirs(query)
        open(os.path.join(query, "codemodel-v2"), "w").close()
        p = subprocess.run([cmake, "-S", ROOT, "-B", build], capture_output=True, text=True)
        if p.returncode != 0:
            fails.append("cmake configure failed:\n" + p.stdout[-2000:] + p.stderr[-2000:])
            return 0
        reply = os.path.join(build, ".cmake", "api", "v1", "reply")
        index = json.load(open(os.path.join(reply, sorted(f for f in os.listdir(reply) if f.startswith("index-"))[-1])))
        model = json.load(open(os.path.join(reply, index["reply"]["codemodel-v2"]["jsonFile"])))
        targets = {}
        for t in model["configurations"][0]["targets"]:
            targets[t["id"]] = json.load(open(os.path.join(reply, t["jsonFile"])))
    top = {}
    for tid, t in targets.items():
        # Sources in the clone only (the build's generated files have absolute paths).
        srcs = {room_of(s["path"], rooms) for s in t.get("sources", []) if not os.path.isabs(s["path"])}
        srcs.discard(None)
        if not srcs:
            continue
        heads = [r for r in srcs if srcs - {r} <= reach[r]]
        if not heads:
            fails.append(f"CMake target {t['name']}: its sources are in rooms {', '.join(sorted(srcs))}, "
                         "none of which may use all the others")
            continue
        top[tid] = heads[0]
    for tid, r in sorted(top.items(), key=lambda kv: targets[kv[0]]["name"]):
        # CMake lists what a target's dependencies depend on too: name them all at once.
        bad = [f"{targets[d['id']]['name']} ({top[d['id']]})" for d in targets[tid].get("dependencies", [])
               if top.get(d["id"]) not in (None, r) and top[d["id"]] not in reach[r]]
        if bad:
            fails.append(f"CMake target {targets[tid]['name']} (room {r}) depends on targets of rooms "
                         f"tests/layers.txt does not let it use: {', '.join(bad)}")
    return len(top)


def main():
    fails = []
    rooms = read_layers(LAYERS)
    for r, (uses, links) in rooms.items():
        if not os.path.exists(os.path.join(ROOT, r)):
            fails.append(f"tests/layers.txt: room {r} does not exist")
        for u in uses + links:
            if u not in rooms:
                fails.append(f"tests/layers.txt: {r} names {u}, which is not a room")
    declared = {r: set(uses + links) for r, (uses, links) in rooms.items()}
    for c in circles(declared):
        fails.append("tests/layers.txt goes round in a circle: " + round_trip(declared, c))
    if fails:
        return report(fails)

    files = sorted(f for f in source_files() if SOURCE.search(f) and os.path.exists(os.path.join(ROOT, f)))
    for f in files:
        if room_of(f, rooms) is None:
            fails.append(f"{f} belongs to no room: give its folder a line in tests/layers.txt")
    if fails:
        return report(fails)

    edges = check_includes(rooms, files, fails)
    print(f"includes: {len(files)} files in {len({room_of(f, rooms) for f in files})} rooms, "
          f"{sum(len(v) for v in edges.values())} arrows between rooms")
    if "--no-cmake" not in sys.argv:
        n = check_cmake(rooms, fails)
        print(f"cmake: {n} targets with sources in the clone")
    return report(fails)


def report(fails):
    for f in fails:
        print("FAIL: " + f)
    print(f"{0 if fails else 1} passed, {len(fails)} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
