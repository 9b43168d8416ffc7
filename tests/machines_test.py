"""docs/operating.md "Several machines", followed on one machine: each host is a directory
of its own (the service user's home and data directory, with its own config file, found
through LOOM_CONFIG as /etc/loom/loom.conf would be, and its own ~/.pgpass), and each process runs
as the units start them (`loom api`, `loom scheduler`, `loom executor --device 0`), with
nothing on its command line that the section does not put in the config file.

  - the database host: PostgreSQL on a TCP address of its own (127.0.0.N), TLS only, a
    password (scram-sha-256); every Loom host connects with sslmode=verify-full and the
    password from its ~/.pgpass, never through a socket or trust;
  - the api host (api and scheduler): the secret, the shared blob store; the GPU host
    (executor): the model, the shared blob store, no secret;
  - tenants and keys are made on the api host; a run trains, saves, samples and downloads
    its checkpoint through the api;
  - the api host without the model's tokenizer files: /v1/chat/completions and the
    playground's tokenizer answer 503 saying which files to copy where; with them, chat
    works;
  - each process opens at most the connections the section budgets for it;
  - a backup as the section takes it (pg_dump, then the blob store), restored into a new
    database and blob store, serves the same checkpoint archive, byte for byte.
Prints "N passed, N failed" last.
"""
import os, random, re, shutil, signal, subprocess, sys, tempfile, time, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from stack import LOOM_BIN, Results, Stack, wait_for  # noqa: E402
from trainer import Trainer  # noqa: E402

R = Results()
PASSWORD = "s3cret-" + "".join(random.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(12))


def run(cmd, env=None, **kw):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, **kw)


class Host:
    """A Loom host: HOME = data directory, its config file, its .pgpass."""

    def __init__(self, root, name, conf, ca):
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, mode=0o700)
        self.conf = os.path.join(self.dir, "loom.conf")
        shutil.copy(ca, os.path.join(self.dir, "db-ca.crt"))
        with open(self.conf, "w") as f:
            f.write(conf.replace("@HOST@", self.dir))
        self.env = dict(os.environ, HOME=self.dir, LOOM_CONFIG=self.conf)
        for k in ("DATABASE_URL", "LOOM_DATA_DIR", "LOOM_SECRET", "LOOM_SECRET_FILE", "LOOM_BLOB_DIR", "PGPASSFILE"):
            self.env.pop(k, None)

    def pgpass(self, addr):
        p = os.path.join(self.dir, ".pgpass")
        with open(p, "w") as f:
            f.write(f"{addr}:5432:loom:loom:{PASSWORD}\n")
        os.chmod(p, 0o600)

    def loom(self, *args):
        return run([LOOM_BIN] + list(args), env=self.env)

    def start(self, *args, stdout=subprocess.DEVNULL):
        log = open(os.path.join(self.dir, args[0] + ".log"), "wb")
        return subprocess.Popen([LOOM_BIN] + list(args), env=self.env, stdout=stdout, stderr=log,
                                start_new_session=True)


def database_host(root):
    """A PostgreSQL cluster (`loom pg start`), then TCP on 127.0.0.N with TLS and a password
    only. Returns (data dir, address, CA file)."""
    d = os.path.join(root, "db")
    os.makedirs(d)
    os.chmod(root, 0o755)
    env = dict(os.environ, HOME=d)
    env.pop("DATABASE_URL", None)
    p = run([LOOM_BIN, "pg", "start", "--config", "/dev/null", "--data-dir", d], env=env)
    if p.returncode:
        raise RuntimeError(p.stderr)
    pg = os.path.join(d, "pg")
    owner = os.stat(pg).st_uid
    addr = f"127.0.{random.randint(1, 254)}.{random.randint(2, 254)}"
    # A certificate for the database host's address, signed by itself (the CA the clients trust).
    p = run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=loom-db",
             "-addext", f"subjectAltName=IP:{addr}", "-keyout", os.path.join(pg, "server.key"),
             "-out", os.path.join(pg, "server.crt")])
    if p.returncode:
        raise RuntimeError(p.stderr)
    for f in ("server.key", "server.crt"):
        os.chown(os.path.join(pg, f), owner, -1)
        os.chmod(os.path.join(pg, f), 0o600)
    ca = os.path.join(root, "db-ca.crt")
    shutil.copy(os.path.join(pg, "server.crt"), ca)
    os.chmod(ca, 0o644)
    sock = f"host={pg} port=5432 dbname=loom user=loom"
    p = run(["psql", sock, "-qc", f"ALTER ROLE loom PASSWORD '{PASSWORD}'"])
    if p.returncode:
        raise RuntimeError(p.stderr)
    with open(os.path.join(pg, "postgresql.auto.conf"), "a") as f:
        f.write(f"listen_addresses = '{addr}'\nssl = on\npassword_encryption = 'scram-sha-256'\n")
    hba = os.path.join(pg, "pg_hba.conf")
    rules = open(hba).read()
    with open(hba, "w") as f:   # local socket for the test's own psql; TCP: TLS and a password, or nothing
        f.write("hostssl loom loom 127.0.0.0/8 scram-sha-256\nhostnossl all all 0.0.0.0/0 reject\n" + rules)
    for verb in ("stop", "start"):
        p = run([LOOM_BIN, "pg", verb, "--config", "/dev/null", "--data-dir", d], env=env)
        if p.returncode:
            raise RuntimeError(p.stderr)
    return d, addr, ca, sock


class Connections:
    """The most connections to the database each process held at the moments looked at
    (ss: TCP connections to the database's address, by process), and whether every TCP
    connection the database has is TLS."""

    def __init__(self, addr, sock):
        self.addr, self.sock, self.pids, self.most, self.all_tls = addr, sock, {}, {}, True

    def look(self):
        out = run(["ss", "-Htnp", "state", "established", "dst", f"{self.addr}:5432"]).stdout
        n = {}
        for pid in re.findall(r"pid=(\d+)", out):
            role = self.pids.get(int(pid))
            if role:
                n[role] = n.get(role, 0) + 1
        for role, k in n.items():
            self.most[role] = max(self.most.get(role, 0), k)
        p = run(["psql", self.sock, "-Atc", "SELECT count(*), bool_and(s.ssl) FROM pg_stat_activity a"
                 " JOIN pg_stat_ssl s ON s.pid = a.pid WHERE a.client_addr IS NOT NULL"])
        count, tls = p.stdout.strip().split("|")
        self.all_tls &= int(count) > 0 and tls == "t"


def main():
    root = tempfile.mkdtemp(prefix="loom-hosts-", dir="/tmp")
    procs = []
    dbdir = None
    try:
        dbdir, addr, ca, sock = database_host(root)
        db = f"host={addr} port=5432 dbname=loom user=loom sslmode=verify-full sslrootcert=@HOST@/db-ca.crt"
        shared = os.path.join(root, "nfs", "blobs")   # the shared file system of the section
        os.makedirs(shared)
        api = Host(root, "api", f"db = {db}\ndata-dir = @HOST@\nblob-dir = {shared}\n"
                                "[api]\nhost = 127.0.0.1\nport = 0\nthreads = 2\n[scheduler]\n", ca)
        gpu = Host(root, "executor", f"db = {db}\ndata-dir = @HOST@\nblob-dir = {shared}\n"
                                     "[executor]\nbackend = cpu\nmodel-dir = @HOST@/models/tiny-llama\n"
                                     "model-name = loom/tiny-llama\nthreads = 1\n", ca)
        for h in (api, gpu):
            h.pgpass(addr)
        with open(os.path.join(api.dir, "secret.key"), "w") as f:   # as the package's postinst makes it
            f.write(os.urandom(32).hex())
        os.chmod(os.path.join(api.dir, "secret.key"), 0o600)
        p = gpu.loom("mkmodel", "--arch", "llama", "--preset", "tiny", "--seed", "1",
                     "--out", os.path.join(gpu.dir, "models", "tiny-llama"))
        R.check(p.returncode == 0, f"the GPU host has the model {p.stderr[-300:]}")

        p = api.loom("config")
        R.check(p.returncode == 0 and api.conf in p.stdout and "sslmode=verify-full" in p.stdout,
                f"loom config on the api host reads its file: {p.stdout[-400:]} {p.stderr[-300:]}")
        # TLS and the password are required: without the password file, no connection.
        bare = dict(api.env, HOME=root)
        p = run([LOOM_BIN, "migrate"], env=bare)
        R.check(p.returncode == 1 and "password" in p.stderr, f"without ~/.pgpass the database refuses: {p.stderr[-200:]}")

        a = api.start("api", stdout=subprocess.PIPE)
        procs.append(a)
        procs.append(api.start("scheduler"))
        e = gpu.start("executor", "--device", "0", "--name", "gpu1-0")
        procs.append(e)
        conns = Connections(addr, sock)
        conns.pids = {a.pid: "api", procs[1].pid: "scheduler", e.pid: "executor"}
        line = a.stdout.readline().decode()
        R.check(line.startswith("LOOM_API_LISTENING port="), f"the api listens: {line!r}")
        url = "http://127.0.0.1:" + line.strip().split("=", 1)[1]
        ready = wait_for(lambda: _ok(url + "/api/v1/readyz"), 90)
        R.check(ready, "readyz: the executor on the other host serves the base model")
        R.check(not os.path.exists(os.path.join(gpu.dir, "secret.key")), "the GPU host has no secret")
        conns.look()

        # Tenants and keys are made on the api host.
        p = api.loom("tenant", "create", "alice")
        R.check(p.returncode == 0, f"loom tenant create on the api host {p.stderr}")
        p = api.loom("key", "create", "--tenant", "alice")
        key = p.stdout.strip()
        R.check(p.returncode == 0 and key.startswith("tml-"), f"loom key create on the api host {p.stderr}")
        p = gpu.loom("key", "create", "--tenant", "alice")
        R.check(p.returncode == 1 and "secret" in p.stderr, f"... not on the GPU host, which has no secret: {p.stderr}")

        s = Stack()
        s.url, s.key = url, key
        # Without the tokenizer files on the api host: 503, saying what to copy where.
        mdir = os.path.join(gpu.dir, "models", "tiny-llama")
        hidden = os.path.join(root, "hidden")
        os.makedirs(hidden)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            os.rename(os.path.join(mdir, f), os.path.join(hidden, f))
        chat = {"model": "loom/tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "seed": 1}
        st, body = s.post("/v1/chat/completions", chat, key=None, headers={"Authorization": "Bearer " + key})
        msg = (body.get("error") or {}).get("message", "") if isinstance(body, dict) else ""
        R.check(st == 503 and "copy the model's tokenizer.json and tokenizer_config.json" in msg and
                f"to {mdir} on this api host" in msg,
                f"no tokenizer on the api host: chat answers 503 naming the files and the directory: {st} {msg}")
        st, body = s.post("/api/v1/console/tokenize", {"base_model": "loom/tiny-llama", "text": "hi", "chat": True})
        R.check(st == 503 and mdir in body.get("detail", ""), f"... and so does the playground's tokenizer: {st}")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            os.rename(os.path.join(hidden, f), os.path.join(mdir, f))
        st, body = s.post("/v1/chat/completions", chat, key=None, headers={"Authorization": "Bearer " + key})
        R.check(st == 200 and body["choices"][0]["message"]["role"] == "assistant",
                f"with the tokenizer files copied there, chat answers: {st}")
        conns.look()

        # A run trains, saves, samples and downloads through the api.
        t = Trainer(s, key)
        mid = t.create()
        fb, opt = t.step(mid, 0)
        R.check("loss:sum" in fb["metrics"] and opt["metrics"]["step:max"] == 1, "a step trains on the GPU host")
        ck = t.op(mid, "/api/v1/save_weights_for_sampler", {"path": "s1"})["path"]
        st, samp = s.post("/api/v1/create_sampling_session", {"session_id": t.sid, "model_path": ck})
        st, fut = s.post("/api/v1/asample", {"sampling_session_id": samp["sampling_session_id"], "num_samples": 1,
                                              "prompt": {"chunks": [{"tokens": [1, 2, 3]}]},
                                              "sampling_params": {"max_tokens": 4, "seed": 1}})
        res = s.result(fut["request_id"])
        R.check(len(res.get("sequences", [{}])[0].get("tokens", [])) >= 1, "a sample from the checkpoint")
        conns.look()
        archive = download(s, mid)
        R.check(archive is not None and len(archive) > 1000, "the api host serves the archive from the shared store")

        # Connections: each process within the section's budget, all over TLS.
        conns.look()
        budget = {"api": 4 + 3, "scheduler": 1, "executor": 4}   # api: --db-workers (4 for 2 threads) + 3
        R.check(set(conns.most) == set(budget) and all(conns.most[k] <= budget[k] for k in budget),
                f"the most connections each process held: {conns.most}, within the budget {budget}")
        R.check(conns.all_tls, "every connection to the database is TLS")

        # Backup as the section takes it: the database, then the blob store; restored into a
        # new database and store, an api serves the same archive.
        backup = os.path.join(root, "backup")
        os.makedirs(backup)
        dump = os.path.join(backup, "loom.dump")
        p = run(["pg_dump", "-Fc", "-f", dump, db.replace("@HOST@", api.dir)], env=api.env)
        R.check(p.returncode == 0, f"pg_dump over TLS with the password file {p.stderr[-300:]}")
        p = run(["cp", "-a", shared, os.path.join(backup, "blobs")])
        R.check(p.returncode == 0, "the blob store copied after the dump")
        p = run(["psql", sock.replace("dbname=loom", "dbname=postgres"), "-qc", "CREATE DATABASE loom_restored OWNER loom"])
        p = run(["pg_restore", "--no-owner", "-d", sock.replace("dbname=loom", "dbname=loom_restored"), dump])
        R.check(p.returncode == 0, f"pg_restore into a new database {p.stderr[-300:]}")
        rdb = db.replace("dbname=loom", "dbname=loom_restored")
        restored = Host(root, "restored", f"db = {rdb}\ndata-dir = @HOST@\nblob-dir = {backup}/blobs\n"
                                          "[api]\nhost = 127.0.0.1\nport = 0\nthreads = 1\n", ca)
        restored.pgpass(addr)
        shutil.copy(os.path.join(api.dir, "secret.key"), os.path.join(restored.dir, "secret.key"))
        ra = restored.start("api", stdout=subprocess.PIPE)
        procs.append(ra)
        line = ra.stdout.readline().decode()
        s2 = Stack()
        s2.url, s2.key = "http://127.0.0.1:" + line.strip().split("=", 1)[-1], key
        R.check(line.startswith("LOOM_API_LISTENING") and download(s2, mid) == archive,
                "the restored database and blob store serve the same archive, byte for byte (the key works too)")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        if dbdir:
            run([LOOM_BIN, "pg", "stop", "--config", "/dev/null", "--data-dir", dbdir])
        shutil.rmtree(root, ignore_errors=True)
    R.finish()


def _ok(u):
    try:
        return urllib.request.urlopen(u).status == 200
    except Exception:
        return False


def download(s, run_id):
    st, link = s.request("GET", f"/api/v1/training_runs/{run_id}/checkpoints/sampler_weights/s1/archive",
                         headers={"Accept": "application/json"})
    if st != 200:
        return None
    with urllib.request.urlopen(link["url"]) as r:
        return r.read()


if __name__ == "__main__":
    main()
