"""The documents' commands work as printed: every ```sh block of README.md, then of
docs/using.md, docs/operating.md, docs/development.md and docs/protocol.md (DOCS), each
file's in order, in one shell session (variables carry over from block to block and from
file to file, as a reader goes on from the README to the guides), against a fresh `loom up`
with the default data directory, as a user would run them after the Quick start. No
example escapes: a Markdown file of the repository with ```sh blocks that DOCS does not
name fails the test.

A block preceded by `<!-- readme-test: skip (why) -->` is left out: the Quick start's
build itself, the test suite, and what installs on the host or needs systemd, vLLM or
other machines (tests/deb_test.py covers the package's steps). The test provides only what
the Quick start leaves the reader with: `loom` on PATH, and TINKER_BASE_URL and
TINKER_API_KEY exported as `loom up` printed them (its only output, the three lines the
README shows). Everything else an example uses (a training run, its checkpoints, tenants,
aliases) an earlier example made: the blocks run with `set -u`, and `curl` fails on an
HTTP error (--fail-with-body), so an example that uses what nobody made fails.

Also: the Quick start's packages are what Loom needs to build and run, the test-only ones
are installed by the test command (deploy/test.sh runs deploy/install-test-deps.sh, and
.ci/run runs deploy/install-deps.sh then deploy/test.sh).

As root, it runs everything as the unprivileged user `nobody` with its own HOME, so that
the default data directory (~/.loom) is the test's and nothing lands in /var/lib/loom.
"""
import os, pwd, re, select, shutil, signal, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
from stack import LOOM_BIN, Results  # noqa: E402

ROOT = os.path.normpath(os.path.join(HERE, ".."))
# The order a reader goes in: the front door, then the guides, then the wire.
DOCS = ["README.md", "docs/using.md", "docs/operating.md", "docs/development.md", "docs/protocol.md"]
SKIP = re.compile(r"<!-- readme-test: skip \((.+?)\) -->\s*$")


def blocks(doc):
    """[(line, skip reason or None, text)] of a Markdown file's sh blocks."""
    out, lines, i = [], open(os.path.join(ROOT, doc)).read().splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            start, body = i + 1, []
            m = SKIP.match(lines[i - 1].strip()) if i else None
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            out.append((start, m.group(1) if m else None, "\n".join(body) + "\n"))
        i += 1
    return out


class User:
    """Who runs the README: nobody (when we are root) with HOME in a fresh directory."""

    def __init__(self):
        self.home = tempfile.mkdtemp(prefix="loom-readme-", dir="/tmp")
        os.chmod(self.home, 0o755)
        bindir = os.path.join(self.home, "bin")
        os.makedirs(bindir)
        # A copy the user can surely execute, whatever the build directory's modes.
        shutil.copy2(LOOM_BIN, os.path.join(bindir, "loom"))
        self.work = os.path.join(self.home, "work")
        os.makedirs(self.work)
        self.prefix = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("nobody")
            for d in (self.home, self.work):
                os.chown(d, pw.pw_uid, pw.pw_gid)
            # setpriv keeps the environment (runuser would set HOME to nobody's).
            self.prefix = [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={pw.pw_uid}",
                           f"--regid={pw.pw_gid}", "--clear-groups"]
        self.env = {"HOME": self.home, "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                    "USER": "nobody" if self.prefix else os.environ.get("USER", "")}

    def popen(self, argv, **kw):
        return subprocess.Popen(self.prefix + argv, env=self.env, cwd=self.work, **kw)


def start_up(user):
    """`loom up --port 0` with the default data directory; the three lines it prints, and
    every line it printed on stdout (read until 2 s after the third)."""
    log = open(os.path.join(user.home, "up.log"), "wb")
    p = user.popen(["loom", "up", "--port", "0"], stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    got, buf, deadline = {}, b"", time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if select.select([p.stdout], [], [], 0.5)[0]:
            buf += os.read(p.stdout.fileno(), 4096)
            got = dict(line.split("=", 1) for line in buf.decode().splitlines() if "=" in line)
        if len(got) >= 3 and deadline > time.time() + 2:
            deadline = time.time() + 2
    return p, got, buf.decode().splitlines()


# curl as the blocks call it, failing on an HTTP error unless the block asks for its own
# --fail (-f): a 404 of an example is an error, not a JSON message printed and passed over.
CURL_FAILS = """curl() {
  local a
  for a in "$@"; do [[ $a == --fail* || ( $a == -[!-]* && $a == *f* ) ]] && { command curl "$@"; return; }; done
  command curl --fail-with-body "$@"
}"""


def markdown_with_sh():
    """Every Markdown file of the repository (not build trees, dependencies or .git) that
    holds an ```sh block, relative to the root."""
    out = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not (x.startswith(".") or x.startswith("build") or x == "node_modules")]
        for name in files:
            path = os.path.join(d, name)
            if name.endswith(".md") and any(l.strip() == "```sh" for l in open(path, errors="replace")):
                out.append(os.path.relpath(path, ROOT))
    return sorted(out)


def packages(script):
    """The Debian packages a deploy/ script's PKGS=( ... ) lists."""
    text = open(os.path.join(HERE, "..", "deploy", script)).read()
    body = re.search(r"^PKGS=\((.*?)^\)", text, re.S | re.M).group(1)
    return {w for line in body.splitlines() for w in line.split("#")[0].split()}


def test_packages_split(R):
    run_pkgs, test_pkgs = packages("install-deps.sh"), packages("install-test-deps.sh")
    test_only = {"python3-torch", "python3-numpy", "chromium", "chromium-driver", "python3-selenium", "nodejs", "npm",
                 "mmdebstrap", "python3-zstandard"}
    R.check(not run_pkgs & test_only and {"postgresql", "cmake", "libpq-dev", "curl", "python3"} <= run_pkgs,
            f"the Quick start installs what Loom builds and runs with, no test-only package: {sorted(run_pkgs & test_only)}")
    R.check(test_only - {"nodejs", "npm"} <= test_pkgs, "deploy/install-test-deps.sh installs the tests' packages")
    test_sh = open(os.path.join(HERE, "..", "deploy", "test.sh")).read()
    ci = open(os.path.join(HERE, "..", ".ci", "run")).read()
    R.check(re.search(r"^bash deploy/install-test-deps.sh$", test_sh, re.M) is not None and
            test_sh.index("install-test-deps.sh\n") < test_sh.index("\nctest "),
            "the test command (deploy/test.sh) installs the test-only packages before it tests")
    R.check(re.findall(r"^bash (deploy/\S+)", ci, re.M) == ["deploy/install-deps.sh", "deploy/test.sh"],
            ".ci/run: deploy/install-deps.sh, then the test command")


def main():
    R = Results()
    found = [(doc, line, why, text) for doc in DOCS for line, why, text in blocks(doc)]
    runnable = [(doc, line, text) for doc, line, why, text in found if not why]
    skipped = [(doc, line, why) for doc, line, why, _ in found if why]
    R.check(len(runnable) >= 10 and len(skipped) <= 8,
            f"{len(found)} sh blocks in {len(DOCS)} files: {len(runnable)} to run, {len(skipped)} marked skip")
    for doc, line, why in skipped:
        print(f"     skip {doc}:{line}: {why}")
    stray = [m for m in markdown_with_sh() if m not in DOCS]
    R.check(not stray, f"every Markdown file with sh blocks is run here {stray}")
    opening = [text for _, _, text in blocks("README.md")[:2]]
    R.check(len(opening) == 2 and "./deploy/install-deps.sh" in opening[0] and "loom up" in opening[0]
            and opening[1].strip() == "./deploy/test.sh",
            "the README's first two commands: set up and run Loom (the Quick start), then the tests")
    test_packages_split(R)
    user = User()
    up, env, printed = start_up(user)
    try:
        if not R.check({"DATABASE_URL", "TINKER_BASE_URL", "TINKER_API_KEY"} <= set(env),
                       f"loom up with the default data directory printed its three lines {env}"):
            print(open(os.path.join(user.home, "up.log")).read()[-3000:])
            R.finish()
        R.check([l.split("=", 1)[0] for l in printed] == ["DATABASE_URL", "TINKER_BASE_URL", "TINKER_API_KEY"],
                f"... and nothing else, as the README says (on a fresh data directory): {printed}")
        R.check(env["DATABASE_URL"].startswith(f"host={user.home}/.loom/pg "), "the data directory is ~/.loom")
        state = os.path.join(user.work, ".readme-state")
        with open(state, "w") as f:
            f.write(f"export TINKER_BASE_URL='{env['TINKER_BASE_URL']}' TINKER_API_KEY='{env['TINKER_API_KEY']}'\n")
        if user.prefix:
            os.chown(state, pwd.getpwnam("nobody").pw_uid, -1)
        for doc, line, text in runnable:
            # One session: what a block sets (set -a exports it) is there for the next. A
            # variable nobody set is an error (set -u), and so is an HTTP error of curl.
            script = (f"set -a\n. {state}\nset -euo pipefail\n"
                      f"{CURL_FAILS}\n{text}\nset +eu\n"
                      f"export -p | grep -v -e ' PWD=' -e ' OLDPWD=' -e ' SHLVL=' > {state}.new\n"
                      f"mv {state}.new {state}\n")
            p = user.popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = p.communicate(timeout=300)
            first = text.strip().splitlines()[0]
            R.check(p.returncode == 0, f"{doc}:{line}: {first}" +
                    ("" if p.returncode == 0 else f"\n--- exit {p.returncode}\n{out.decode()[-1500:]}\n"
                                                  f"{err.decode()[-1500:]}"))
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGTERM)
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
        shutil.rmtree(user.home, ignore_errors=True)
    R.finish()


if __name__ == "__main__":
    main()
