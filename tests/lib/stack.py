"""A whole Loom on this machine for a test: `loom up` on a fresh data directory
(its own PostgreSQL cluster, api, scheduler, an executor on the backend named by
LOOM_TEST_BACKEND, default cpu), real HTTP over loopback.

    with Stack() as s:
        s.post("/api/v1/create_session", {...}) -> (status, json)
        s.psql("SELECT count(*) FROM operations") -> "3"
"""
import contextlib, json, os, re, select, shutil, signal, subprocess, tempfile, time, urllib.request, urllib.error

LOOM_BIN = os.environ.get("LOOM_BIN", "build/loom")


def wait_for(cond, timeout, step=0.2):
    """Whether cond() became true within timeout seconds, asked every step seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(step)
    return False


def backend_args():
    """The executor backend the tests run on: LOOM_TEST_BACKEND (default cpu) on device
    LOOM_TEST_DEVICE (default 0), so that every suite can check any backend."""
    return ["--backend", os.environ.get("LOOM_TEST_BACKEND") or "cpu",
            "--device", os.environ.get("LOOM_TEST_DEVICE") or "0"]


class Stack:
    def __init__(self, extra_args=(), env=None, start_timeout=120, data_dir=None):
        """data_dir: an existing data directory (e.g. another Stack's), kept at the end."""
        self.extra_args = list(extra_args)
        self.given_dir = data_dir
        self.env = dict(os.environ, **(env or {}))
        self.start_timeout = start_timeout
        self.url = self.key = self.db = None

    def __enter__(self):
        # Under /tmp so that an unprivileged cluster owner can reach it when we are root.
        self.dir = self.given_dir or tempfile.mkdtemp(prefix="loomt-", dir="/tmp")
        os.chmod(self.dir, 0o755)
        self.log = open(os.path.join(self.dir, "up.log"), "ab")
        self.proc = subprocess.Popen(
            [LOOM_BIN, "up", "--data-dir", self.dir, "--port", "0"] + backend_args() + self.extra_args,
            stdout=subprocess.PIPE, stderr=self.log, env=self.env, start_new_session=True)
        deadline = time.time() + self.start_timeout
        buf = b""
        while time.time() < deadline and (self.url is None or self.key is None):
            r, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if r:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                for line in buf.decode(errors="replace").splitlines():
                    if line.startswith("TINKER_BASE_URL="):
                        self.url = line.split("=", 1)[1].strip()
                    elif line.startswith("TINKER_API_KEY="):
                        self.key = line.split("=", 1)[1].strip()
                    elif line.startswith("DATABASE_URL="):
                        self.db = line.split("=", 1)[1].strip()
            if self.proc.poll() is not None:
                break
        if self.url is None or self.key is None:
            self.__exit__(None, None, None)
            raise RuntimeError("loom up did not become ready; log:\n" + self.read_log()[-6000:])
        # Every child exec'd, so that tests comparing children() before and after see
        # the same set (the GC child may start a moment after the URL is printed).
        roles = {"api", "scheduler", "executor", "adapter"}
        while time.time() < deadline and not roles <= set(self.children()):
            time.sleep(0.05)
        return self

    def read_log(self):
        """The whole log of loom up and its children (text)."""
        try:
            with open(os.path.join(self.dir, "up.log"), "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        if os.environ.get("LOOM_KEEP_TEST_DIR"):
            print("kept", self.dir)
        elif not self.given_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        return False

    # ---- HTTP ----------------------------------------------------------------------
    def request(self, method, path, body=None, key="default", headers=None, raw=None, timeout=60):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json"}
        if key == "default":
            key = self.key
        if key is not None:
            h["X-API-Key"] = key
        h.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, _parse(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, _parse(e.read())

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body if body is not None else {}, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def result(self, request_id, timeout=120, key="default"):
        """Polls retrieve_future the way the SDK does until the future is complete."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            st, body = self.post("/api/v1/retrieve_future", {"request_id": request_id}, key=key)
            if st != 200:
                raise RuntimeError(f"retrieve_future {st}: {body}")
            if isinstance(body, dict) and body.get("type") == "try_again":
                continue
            return body
        raise TimeoutError(request_id)

    def children(self):
        """{role: pid} of `loom up`'s child processes (api, scheduler, executor, adapter)."""
        out = {}
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
                ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            # cmd[1] == "up": forked by `loom up` but not yet exec'd.
            if len(cmd) > 1 and ppid == self.proc.pid and cmd[1] != b"up":
                out[cmd[1].decode()] = int(p)
        return out

    def forget_notes(self, timeout=30):
        """Makes the api forget every operation it knows without its row (its futures cache,
        tinker/api_futures_cache.h), as after a lost LISTEN connection: the api's LISTEN
        backend is terminated, and this returns once a new one listens (its reconnect
        empties the cache). The next retrieve_future of any operation reads its row."""
        q = "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN loom_api_keys'"
        old = self.psql(q).split()
        if old:
            self.psql(f"SELECT pg_terminate_backend({old[0]})")
        wait_for(lambda: [p for p in self.psql(q).split() if p not in old], timeout, 0.05)
        time.sleep(0.2)   # the new connection's LISTENs run before the cache is emptied

    @contextlib.contextmanager
    def queue_held(self):
        """Work submitted inside stays queued: the scheduler and the executors are stopped
        (SIGSTOP; an idle executor claims its models' work itself, so stopping the scheduler
        alone no longer holds it). On the way out the scheduler is continued and woken, and
        the executors only once nothing is queued any more (or after 10 s): what was queued
        inside is claimed by one pass, a cycle per executor, as it would have been had it
        all arrived at once."""
        kids = [(r, int(p)) for p in filter(str.isdigit, os.listdir("/proc")) for r in [self._role(int(p))] if r]
        sched = [p for r, p in kids if r == "scheduler"]
        exes = [p for r, p in kids if r == "executor"]
        for p in sched + exes:
            os.kill(p, signal.SIGSTOP)
        try:
            yield
        finally:
            for p in sched:
                os.kill(p, signal.SIGCONT)
            try:
                self.psql("NOTIFY loom_op_queued")
                wait_for(lambda: self.psql("SELECT count(*) FROM operations WHERE state = 'queued'") == "0", 10)
            finally:
                for p in exes:
                    os.kill(p, signal.SIGCONT)

    def _role(self, pid):
        """The role of one of `loom up`'s children (api, scheduler, executor, adapter), or None."""
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return cmd[1].decode() if len(cmd) > 1 and ppid == self.proc.pid and cmd[1] != b"up" else None

    # ---- SQL -----------------------------------------------------------------------
    def psql(self, sql):
        out = subprocess.run(["psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", self.db, "-c", sql],
                             check=True, capture_output=True, text=True)
        return out.stdout.strip()


def _parse(b):
    try:
        return json.loads(b)
    except ValueError:
        return b


class Results:
    """Counts checks and prints the closing line the CI reads: 'N passed, N failed'."""
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, cond, what):
        if cond:
            self.passed += 1
            print("ok   ", what)
        else:
            self.failed += 1
            print("FAIL ", what)
        return cond

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        raise SystemExit(1 if self.failed or not self.passed else 0)
