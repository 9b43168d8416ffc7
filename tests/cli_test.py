"""The command line never surprises (issue 14).

Without a database: every subcommand (found from `loom --help` and each command group's
usage, so a new one is covered as it is added) answers --help with its usage and status
0, an unknown option with status 2 naming it, and a missing argument by name; bad values
fail before anything starts (`loom up --port abc` creates no data directory); the config
file is checked line by line; and which data directory and database a command uses
follows one order (flag > environment > config file > default, `loom config`).

With a `loom up`: an unknown tenant is "unknown tenant" everywhere, names are validated,
no raw PostgreSQL error reaches the user, `adapter import` takes a .tar.gz with a
top-level folder, and `adapter show` prints 0.1 as 0.1.
"""
import io, json, os, re, shutil, subprocess, sys, tarfile, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
from stack import LOOM_BIN, Results, Stack  # noqa: E402

TMP = tempfile.mkdtemp(prefix="loom-cli-")
# No config file, no database, no data directory of the machine's: a clean environment.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_") and k != "DATABASE_URL"}
ENV.update(HOME=TMP, LOOM_CONFIG="/dev/null")

# What each leaf command cannot run without, and the word its message must name.
MISSING = {
    "executor": "--model-dir", "tenant create": "NAME", "key create": "--tenant", "key revoke": "ID",
    "adapter show": "PATH", "adapter lineage": "PATH", "adapter export": "PATH", "adapter import": "DIR|ARCHIVE",
    "adapter share": "RUN", "adapter publish": "PATH", "adapter delete": "PATH", "mkmodel": "--arch",
}


def loom(*args, env=None):
    return subprocess.run([LOOM_BIN, *args], capture_output=True, text=True, env=env or ENV, timeout=60)


def commands(out):
    """Command names of a usage's "commands:" list."""
    names, on = [], False
    for line in out.splitlines():
        if line.strip() == "commands:":
            on = True
        elif on and re.match(r"^  [a-z]", line):
            names.append(line.split()[0])
        elif on and not line.startswith(" "):
            on = False
    return names


def leaves(R):
    p = loom("--help")
    R.check(p.returncode == 0 and p.stdout.startswith("usage: loom"), "loom --help: usage, 0")
    out = []
    for c in commands(p.stdout):
        g = loom(c, "--help")
        sub = commands(g.stdout) if "<command>" in g.stdout.splitlines()[0] else []
        out += [f"{c} {v}" for v in sub] if sub else [c]
    return out


def check_cli(R):
    all_leaves = leaves(R)
    R.check(len(all_leaves) >= 24 and "adapter gc" in all_leaves and "key revoke" in all_leaves,
            f"{len(all_leaves)} commands found: {' '.join(all_leaves)}")
    for leaf in all_leaves:
        words = leaf.split()
        p = loom(*words, "--help")
        R.check(p.returncode == 0 and p.stdout.startswith(f"usage: loom {leaf}") and "--config" in p.stdout,
                f"loom {leaf} --help: its usage on stdout, 0")
        p = loom(*words, "--no-such-flag")
        R.check(p.returncode == 2 and "'--no-such-flag'" in p.stderr and f"usage: loom {leaf}" in p.stderr,
                f"loom {leaf} --no-such-flag: 2, names it, with the usage")
        if leaf in MISSING:
            p = loom(*words)
            R.check(p.returncode == 2 and f"missing {MISSING[leaf]}" in p.stderr,
                    f"loom {leaf} (nothing): 2, 'missing {MISSING[leaf]}' {p.stderr.splitlines()[:1]}")
    for group in ("tenant", "key", "adapter", "pg"):
        p = loom(group)
        R.check(p.returncode == 2 and "missing command" in p.stderr, f"loom {group}: missing command, 2")
        p = loom(group, "frobnicate")
        R.check(p.returncode == 2 and "'frobnicate'" in p.stderr, f"loom {group} frobnicate: unknown command, 2")
        R.check(loom("help", group).returncode == 0, f"loom help {group}: 0")
    p = loom("--version")
    R.check(p.returncode == 0 and re.match(r"^loom \d+\.\d+\.\d+$", p.stdout.strip()), f"loom --version: {p.stdout}")
    R.check(loom("help").returncode == 0 and loom("help", "up").stdout.startswith("usage: loom up"), "loom help [up]")
    p = loom("frobnicate")
    R.check(p.returncode == 2 and "'frobnicate'" in p.stderr, "loom frobnicate: unknown command, 2")
    p = loom("up", "--port")
    R.check(p.returncode == 2 and "--port needs a value" in p.stderr, "loom up --port: needs a value")
    p = loom("key", "create", "--tenant", "a", "--proto")
    R.check(p.returncode == 2 and "'--proto'" in p.stderr, "another command's option is unknown here")
    p = loom("adapter", "list", "--deleted=yes")
    R.check(p.returncode == 2 and "--deleted takes no value" in p.stderr, "a flag takes no value")
    p = loom("tokenize", "--data-dir", TMP, "hi")
    R.check(p.returncode == 1 and f"{TMP}/models/tiny-llama/tokenizer.json" in p.stderr and "loom up" in p.stderr,
            f"loom tokenize without --model-dir: the data directory's default model {p.stderr.strip()}")
    p = loom("key", "revoke", "1", "2")
    R.check(p.returncode == 2 and "unexpected argument '2'" in p.stderr, "an extra argument is named")


def check_values_first(R):
    """Bad values fail before anything is created or started."""
    d = os.path.join(TMP, "never")
    for args, what in ((["--port", "abc"], "--port must be a whole number"),
                       (["--port=70000"], "--port must be a whole number"),
                       (["--max-body-mb", "0"], "--max-body-mb must be"), (["--backend", "nope"], "unknown backend"),
                       (["--memory-budget", "lots"], "--memory-budget 'lots'"),
                       (["--seq-gap-timeout-s", "-1"], "--seq-gap-timeout-s must be"),
                       (["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.pem"], "--tls-cert"),
                       (["--tls-cert", "/etc/hostname"], "go together"),
                       (["--model-dir", TMP], "no readable config.json")):
        p = loom("up", "--data-dir", d, *args)
        R.check(p.returncode == 2 and what in p.stderr and not os.path.exists(d),
                f"loom up {' '.join(args)}: 2, '{what}', nothing created")
    p = loom("api", "--threads", "0")
    R.check(p.returncode == 2 and "--threads must be a whole number from 1" in p.stderr, "loom api --threads 0")
    p = loom("scheduler", "--lease-s", "x")
    R.check(p.returncode == 2 and "--lease-s" in p.stderr, "loom scheduler --lease-s x")


def check_config(R):
    conf = os.path.join(TMP, "loom.conf")

    def with_conf(text, *args, env=None):
        open(conf, "w").write(text)
        return loom(*args, "--config", conf, env=env)

    p = with_conf("[api]\nprot = true\n", "api")
    R.check(p.returncode == 2 and f"{conf}:2" in p.stderr and "'prot'" in p.stderr, "config: unknown key, file:line")
    p = with_conf("[apі]\nport = 1\n", "api")   # a Cyrillic i
    R.check(p.returncode == 2 and "unknown section" in p.stderr, "config: unknown section")
    p = with_conf("port = 1\n", "config")
    R.check(p.returncode == 2 and "at the top" in p.stderr, "config: a command's option at the top is refused")
    p = with_conf("[api]\nport = abc\n", "api")
    R.check(p.returncode == 2 and "port must be a whole number" in p.stderr and f"{conf}:2" in p.stderr,
            "config: a bad value, file:line")
    p = with_conf("[up]\nport = abc\n", "up", "--data-dir", os.path.join(TMP, "never"))
    R.check(p.returncode == 2 and not os.path.exists(os.path.join(TMP, "never")), "config: [up] checked before start")
    p = with_conf("[api]\nproto = maybe\n", "api")
    R.check(p.returncode == 2 and "true or false" in p.stderr, "config: a flag is true or false")
    p = loom("api", "--config", os.path.join(TMP, "absent.conf"))
    R.check(p.returncode == 2 and "absent.conf" in p.stderr, "an explicit config file must exist")
    # [executor] options are checked by the executor only; the api reads past them.
    p = with_conf("db = host=/nowhere dbname=x\n[executor]\nbackend = cpu\n", "config")
    R.check(p.returncode == 0 and "host=/nowhere" in p.stdout, "config: the top is shared")

    def cfg_of(args, env_extra=None, text=None):
        env = dict(ENV, **(env_extra or {}))
        if text is not None:
            open(conf, "w").write(text)
            env["LOOM_CONFIG"] = conf
        p = loom("config", *args, env=env)
        return dict(re.findall(r"^([a-z-]+):\s+(.*)$", p.stdout, re.M))

    d1, d2 = os.path.join(TMP, "d1"), os.path.join(TMP, "d2")
    url = "host=/elsewhere dbname=loom user=loom"
    c = cfg_of([])
    home = "/var/lib/loom" if os.geteuid() == 0 else os.path.join(TMP, ".loom")
    R.check(c["data-dir"] == f"{home} (default)" and "private cluster" in c["db"]
            and c["secret"] == os.path.join(home, "secret.key"), f"defaults: {home} and its cluster {c}")
    c = cfg_of(["--data-dir", d1], {"DATABASE_URL": url})
    R.check(c["db"].startswith(f"host={d1}/pg ") and c["blob-dir"] == f"{d1}/blobs",
            f"--data-dir on the command line beats an exported DATABASE_URL: {c['db']}")
    c = cfg_of(["--data-dir", d1, "--db", url], {"DATABASE_URL": "host=/other"})
    R.check(c["db"].startswith(url) and c["blob-dir"] == f"{d1}/blobs", "--db with --data-dir: both")
    c = cfg_of([], {"DATABASE_URL": url}, f"data-dir = {d2}\n")
    R.check(c["db"].startswith(url) and "DATABASE_URL" in c["db"] and c["data-dir"].startswith(d2),
            f"DATABASE_URL beats a data directory of the config file: {c['db']}")
    c = cfg_of([], {"LOOM_DATA_DIR": d1}, f"db = {url}\n")
    R.check(c["db"].startswith(f"host={d1}/pg"), f"LOOM_DATA_DIR beats a db of the config file: {c['db']}")
    c = cfg_of([], {}, f"db = {url}\ndata-dir = {d2}\nblob-dir = /srv/blobs\n")
    R.check(c["db"].startswith(url) and c["blob-dir"] == "/srv/blobs" and c["secret"] == f"{d2}/secret.key",
            f"the config file alone: {c}")
    c = cfg_of(["--secret-file", "/etc/s.key"], {"LOOM_SECRET": "00" * 32})
    R.check(c["secret"] == "/etc/s.key", "--secret-file beats LOOM_SECRET")
    c = cfg_of([], {"LOOM_SECRET": "00" * 32})
    R.check(c["secret"] == "$LOOM_SECRET", "LOOM_SECRET beats the default secret file")
    p = loom("key", "list", "--data-dir", os.path.join(TMP, "nodb"))
    R.check(p.returncode == 1 and "no database" in p.stderr and "DATABASE_URL" in p.stderr,
            f"no database anywhere: a message that says where to set one {p.stderr.strip()}")


def adapter_tgz(s, d):
    """An exported PEFT archive repacked as .tar.gz under a top-level folder, its config
    given a lora_dropout of 0.1 (kept in the provenance)."""
    st, sess = s.post("/api/v1/create_session", {"tags": []})
    mid = s.result(s.post("/api/v1/create_model", {"session_id": sess["session_id"], "model_seq_id": 0,
                                                   "base_model": "loom/tiny-llama",
                                                   "lora_config": {"rank": 2}})[1]["request_id"])["model_id"]
    path = s.result(s.post("/api/v1/save_weights_for_sampler", {"model_id": mid, "seq_id": 1, "path": "x"})[1]
                    ["request_id"])["path"]
    flat = os.path.join(d, "flat.tar")
    p = loom("adapter", "export", path, "--out", flat, "--format", "peft", "--data-dir", s.dir)
    if p.returncode:
        raise RuntimeError(p.stderr)
    tgz = os.path.join(d, "nested.tar.gz")
    with tarfile.open(flat) as src, tarfile.open(tgz, "w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            if m.name == "adapter_config.json":
                cfg = json.loads(data)
                cfg["lora_dropout"] = 0.1
                data = json.dumps(cfg).encode()
            info = tarfile.TarInfo("step100/" + m.name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    return tgz


def check_with_stack(R):
    with Stack() as s, tempfile.TemporaryDirectory() as d:
        env = dict(ENV, DATABASE_URL=s.db)
        dd = ["--data-dir", s.dir]
        names = s.psql("SELECT DISTINCT application_name FROM pg_stat_activity WHERE backend_type = 'client backend'"
                       " AND application_name LIKE 'loom %' ORDER BY 1").splitlines()
        R.check({"loom api", "loom scheduler", "loom executor", "loom up"} <= set(names)
                and any(re.fullmatch(r"loom executor \d+", n) for n in names),
                f"every loom process names its PostgreSQL connections (pg_stat_activity): {names}")
        p = loom("key", "create", "--tenant", "nobody", *dd, env=env)
        R.check(p.returncode == 1 and "unknown tenant 'nobody'" in p.stderr, f"key create --tenant nobody {p.stderr}")
        R.check(s.psql("SELECT count(*) FROM tenants WHERE name = 'nobody'") == "0", "... and creates no tenant")
        for args in (["key", "list", "--tenant", "nobody"], ["adapter", "list", "--tenant", "nobody"]):
            p = loom(*args, *dd, env=env)
            R.check(p.returncode == 1 and "unknown tenant 'nobody'" in p.stderr, f"{' '.join(args)}: unknown tenant")
        for bad in ("a/b", "", "-x", "x" * 65, "two words", "quote'"):
            p = loom("tenant", "create", *dd, "--", bad, env=env) if bad.startswith("-") else \
                loom("tenant", "create", bad, *dd, env=env)
            R.check(p.returncode in (1, 2) and ("invalid tenant name" in p.stderr or "needs a value" in p.stderr
                                                or "missing NAME" in p.stderr) and "constraint" not in p.stderr,
                    f"tenant name {bad!r} refused: {p.stderr.splitlines()[:1]}")
        R.check(s.psql("SELECT count(*) FROM tenants") == "1", "no odd tenant was created")
        p = loom("tenant", "create", "bob", *dd, env=env)
        p2 = loom("tenant", "create", "bob", *dd, env=env)
        R.check(p.returncode == 0 and re.fullmatch(r"tenant bob id=\d+\n", p.stdout) and not p.stderr,
                f"tenant create of a new tenant: created, nothing else said {p.stdout!r} {p.stderr!r}")
        R.check(p2.returncode == 0 and re.fullmatch(r"tenant bob id=\d+ \(exists already\)\n", p2.stdout)
                and not p2.stderr, f"tenant create twice: exists already {p2.stdout!r} {p2.stderr!r}")
        p = loom("key", "create", "--tenant", "bob", "--name", "n" * 200, *dd, env=env)
        R.check(p.returncode == 2 and "at most 128" in p.stderr, "a key name over 128 bytes: a message")
        p = loom("key", "revoke", "abc", *dd, env=env)
        R.check(p.returncode == 2 and "ID is a key's number" in p.stderr, "key revoke abc: a message")
        p = loom("key", "create", "--tenant", "bob", *dd, env=ENV)
        R.check(p.returncode == 0 and p.stdout.startswith("tml-"),
                "key create finds the secret and the database from --data-dir alone")

        tgz = adapter_tgz(s, d)
        imp = ["adapter", "import", tgz, "--tenant", "bob", "--base-model", "loom/tiny-llama", "--run", "imp",
               "--name", "n1", *dd]
        p = loom(*imp, env=env)
        R.check(p.returncode == 0 and "imported tinker://imp/sampler_weights/n1" in p.stdout,
                f"adapter import takes a .tar.gz with a top-level folder: {p.stdout} {p.stderr}")
        p = loom(*imp, env=env)
        R.check(p.returncode == 1 and "exists already" in p.stderr and "duplicate key" not in p.stderr,
                f"importing the same path again: a message, not PostgreSQL's {p.stderr.strip()}")
        other = ["adapter", "import", tgz, "--tenant", "default", "--base-model", "loom/tiny-llama", "--name", "n2", *dd]
        p = loom(*other, "--run", "imp", env=env)
        R.check(p.returncode == 1 and "run name imp is taken by another tenant" in p.stderr
                and s.psql("SELECT count(*) FROM adapters WHERE name = 'imp'") == "1",
                f"another tenant's import under the same --run is refused, nothing recorded: {p.stderr.strip()}")
        p = loom(*other, "--run", "imp-default", env=env)
        R.check(p.returncode == 0 and "imported tinker://imp-default/sampler_weights/n2" in p.stdout,
                f"... and under its own run name it is imported {p.stderr.strip()}")
        p = loom("adapter", "show", "tinker://imp/sampler_weights/n1", *dd, env=env)
        R.check(p.returncode == 0 and '"lora_dropout": 0.1' in p.stdout and "0.10000000000000001" not in p.stdout,
                "adapter show prints 0.1 as 0.1")
        R.check(json.loads(p.stdout)["provenance"]["source_config"]["lora_dropout"] == 0.1, "... and valid JSON")
        twice = os.path.join(d, "twice.tar")
        with tarfile.open(twice, "w") as t:
            for name in ("a/adapter_config.json", "b/adapter_config.json"):
                info = tarfile.TarInfo(name)
                info.size = 2
                t.addfile(info, io.BytesIO(b"{}"))
        p = loom("adapter", "import", twice, *imp[3:-2], "--name", "n2", *dd, env=env)
        R.check(p.returncode == 1 and "more than one adapter_config.json" in p.stderr, "two adapters in one tar")
        junk = os.path.join(d, "junk.tar")
        open(junk, "wb").write(os.urandom(3000))
        p = loom("adapter", "import", junk, *imp[3:-2], "--name", "n3", *dd, env=env)
        R.check(p.returncode == 1 and "junk.tar" in p.stderr, f"not an archive: a message {p.stderr.strip()}")
        p = loom("adapter", "share", "imp", "--tenant", "nobody", *dd, env=env)
        R.check(p.returncode == 1 and "unknown tenant" in p.stderr, "adapter share --tenant nobody")


def main():
    R = Results()
    try:
        check_cli(R)
        check_values_first(R)
        check_config(R)
        check_with_stack(R)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    R.finish()


if __name__ == "__main__":
    main()
