"""A simulated fleet: one PostgreSQL, one api, one scheduler, and N executors on the sim
backend (backend/sim/: an H100 training LoRA on Qwen3-8B, in time only: a step of 2 x 2048
tokens takes 250 ms), N growing. Two passes, each on a fresh `loom up`:

idle   the fleet with no work, size by size: the CPU its executors cost PostgreSQL, the
       executors and the scheduler by being there; a lone forward_backward's queue
       (created -> claimed) and dispatch (claimed -> started), goal 2.5 ms together; at the
       largest size, what one NOTIFY costs PostgreSQL per listening connection.
load   simulated clients train over HTTP as the SDK's plain loop does (forward_backward of
       2 x 2048 tokens, optim_step, await both, again), a few per executor, from several
       load processes. For each size:

  cycles/s, ops/s  what the fleet ran, against what it would run if the queue cost nothing
                   (the same cycles with every executor computing all the time: measured
                   / busy fraction)
  claim ms         per cycle: from the moment its executor was free and its work was
                   queued to the cycle's start (scheduler wake-up, cycle build, notify,
                   the executor's start): GPU time the queue costs per cycle; p50 / p99
  commit ms        per cycle: the executor's commit after computing (p50), also GPU idle
  busy %           each executor's modelled-GPU time (its cycles' forward_backward tokens at
                   the profile's rate) over the window: mean and worst
  CPU (cores)      PostgreSQL (postmaster and its backends), the api, the scheduler, all
                   executors, the load processes, and the whole machine (of os.cpu_count())
  PG ms/op         PostgreSQL CPU per operation

then the claim's parts and PostgreSQL's CPU by whom it served, for each figure the fleet
size where it first missed its goal, and how many GPUs one PostgreSQL serves by its
measured CPU (a fit: a constant, per operation, per executor woken per cycle, per idle
executor). Prints figures; never passes or fails. On a small machine PostgreSQL, the api,
the scheduler, every executor and the load processes share its cores: the wall-clock
figures are a lower bound on what dedicated hardware does.

    /usr/bin/python3 bench/fleet_bench.py [--sizes 1,4,16,64,128,256] [--clients-per-executor 2]
        [--seconds 15] [--parts idle,load] [--scale 1] [--load-procs 4] [--flush-ms 0]

--scale multiplies the modelled times (LOOM_SIM_SCALE): 0 = infinitely fast GPUs, the
queue's own ceiling.
"""
import argparse, json, multiprocessing as mp, os, shutil, signal, statistics, subprocess, sys, tempfile, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_bench  # noqa: E402  (Conn: one keep-alive HTTP connection, as an SDK client holds)

MODEL = "sim/qwen3-8b"
ADAM = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
HZ = os.sysconf("SC_CLK_TCK")
GOAL_CLAIM_MS = 2.5       # 1 % of a 250 ms step
# The modelled GPU's forward_backward (backend/sim/sim_profile.c, h100-qwen3-8b): what
# "busy" counts, the GPU's own time.
SIM_PASS_S, SIM_FB_S_PER_TOKEN = 2e-3, 60.5e-6
GOAL_BUSY = 0.95          # of each modelled GPU's time
GOAL_MACHINE = 0.90       # the machine itself not saturated (else every figure is the machine's)


# ---- the load: simulated SDK clients --------------------------------------------------------

def fb_suffix(cid, datums, tokens):
    """Everything of a forward_backward body after its seq_id, encoded once per client."""
    data = []
    for i in range(datums):
        seq = [(cid * 31 + i * 7 + j) % 256 for j in range(tokens + 1)]
        data.append({"model_input": {"chunks": [{"tokens": seq[:-1], "type": "encoded_text"}]},
                     "loss_fn_inputs": {"target_tokens": {"data": seq[1:], "dtype": "int64"}}})
    return (", " + json.dumps({"forward_backward_input": {"data": data, "loss_fn": "cross_entropy"}})[1:]).encode()


def client(url, key, cid, a, steps, errors, stop):
    try:
        c = loom_bench.Conn(url, key)
        sid = c.post("/api/v1/create_session", {})["session_id"]
        fut = c.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": MODEL,
                                              "lora_config": {"rank": a.rank, "seed": cid}})
        mid = c.result(fut["request_id"])["model_id"]
        suffix, head, seq = fb_suffix(cid, a.datums, a.tokens), b'{"model_id": "' + mid.encode() + b'", "seq_id": ', 1
        while not stop.is_set():
            f1 = c.post("/api/v1/forward_backward", head + str(seq).encode() + suffix)["request_id"]
            f2 = c.post("/api/v1/optim_step", {"model_id": mid, "seq_id": seq + 1, "adam_params": ADAM})["request_id"]
            c.result(f1)
            c.result(f2)
            seq += 2
            steps[cid] += 1
    except Exception as e:   # counted and shown; the bench goes on with the other clients
        errors.put(f"client {cid}: {e}")


def load_proc(url, a, cmds, steps, errors):
    """One load process: its clients as threads, started as the commands say."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop, ts = threading.Event(), []
    while True:
        cmd = cmds.get()
        if cmd is None:
            break
        for cid, key in cmd:
            t = threading.Thread(target=client, args=(url, key, cid, a, steps, errors, stop), daemon=True)
            t.start()
            ts.append(t)
    stop.set()


# ---- CPU and memory from /proc --------------------------------------------------------------

stat = loom_bench.proc_stat   # (ppid, own ticks, reaped children's ticks), or None


def children(ppid):
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        s = stat(p)
        if s and s[0] == ppid:
            out.append(int(p))
    return out


def ticks(pids, reaped=False):
    """CPU ticks of the processes; with reaped, also of their exited, waited-for children."""
    n = 0
    for p in pids:
        s = stat(p)
        if s:
            n += s[1] + (s[2] if reaped else 0)
    return n


def machine_ticks():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)    # busy (all but idle and iowait), all


def pss_mb(pids):
    n = 0
    for p in pids:
        try:
            for line in open(f"/proc/{p}/smaps_rollup"):
                if line.startswith("Pss:"):
                    n += int(line.split()[1])
        except OSError:
            pass
    return n / 1024


# ---- the stack -------------------------------------------------------------------------------

class Fleet:
    def __init__(self, a):
        self.a, self.loom = a, a.loom
        self.dir = tempfile.mkdtemp(prefix="loomfleet-", dir="/tmp")
        os.chmod(self.dir, 0o755)
        self.env = dict(os.environ, LOOM_SIM_SCALE=str(a.scale))
        self.env.pop("DATABASE_URL", None)
        self.execs, self.up = [], None
        self.log = open(os.path.join(self.dir, "fleet.log"), "wb")

    def run(self, *args, **kw):
        return subprocess.run([self.loom] + list(args), env=self.env, capture_output=True, text=True, check=True, **kw)

    def start(self):
        d = self.dir
        self.model = os.path.join(d, "models", "sim-qwen3")
        self.run("mkmodel", "--arch", "qwen3", "--preset", "tiny", "--max-pos", str(max(4096, self.a.tokens)),
                 "--out", self.model)
        # The private cluster, with room for every executor's connections (3 at rest, 4
        # with a streaming publisher) and the api's.
        out = self.run("pg", "start", "--data-dir", d).stdout
        self.db = next(l.split("=", 1)[1] for l in out.splitlines() if l.startswith("DATABASE_URL="))
        self.psql(f"ALTER SYSTEM SET max_connections = {4 * max(self.a.sizes) + 100}")
        if self.a.flush_ms:
            loom_bench.slow_flush(self, self.a.flush_ms)
        self.run("pg", "stop", "--data-dir", d)
        self.run("pg", "start", "--data-dir", d)
        self.up = subprocess.Popen([self.loom, "up", "--data-dir", d, "--port", "0", "--backend", "sim",
                                    "--model-dir", self.model, "--model-name", MODEL] + self.a.loom_arg,
                                   stdout=subprocess.PIPE, stderr=self.log, env=self.env, start_new_session=True)
        self.url = self.key = None
        for line in self.up.stdout:
            line = line.decode().strip()
            if line.startswith("TINKER_BASE_URL="):
                self.url = line.split("=", 1)[1]
            elif line.startswith("TINKER_API_KEY="):
                self.key = line.split("=", 1)[1]
                break
        if not self.url or not self.key:
            raise RuntimeError("loom up did not start; see " + os.path.join(d, "fleet.log"))
        self.pm = int(open(os.path.join(d, "pg", "postmaster.pid")).readline())
        deadline = time.time() + 30
        while time.time() < deadline and not {"api", "scheduler", "executor"} <= set(self.roles()):
            time.sleep(0.1)

    def roles(self):
        """{role: pid} of loom up's children."""
        out = {}
        for p in children(self.up.pid):
            try:
                out[open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[1].decode()] = p
            except (OSError, IndexError):
                pass
        return out

    def psql(self, sql):
        return subprocess.run(["psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.db, "-c", sql],
                              check=True, capture_output=True, text=True).stdout.strip()

    def grow(self, n):
        """n executors in all (loom up's up-0 and the bench's fleet-1 ...), each registered."""
        while len(self.execs) + 1 < n:
            i = len(self.execs) + 1
            self.execs.append(subprocess.Popen(
                [self.loom, "executor", "--backend", "sim", "--device", str(i), "--name", f"fleet-{i}",
                 "--db", self.db, "--data-dir", self.dir, "--model-dir", self.model, "--model-name", MODEL],
                stdout=subprocess.DEVNULL, stderr=self.log, env=self.env, start_new_session=True))
        deadline = time.time() + 60 + n
        while time.time() < deadline:
            if int(self.psql("SELECT count(*) FROM executors WHERE state <> 'gone'")) >= n:
                return
            time.sleep(0.5)
        raise RuntimeError(f"only {self.psql('SELECT count(*) FROM executors WHERE state <> ''gone''')} of {n}"
                           " executors registered; see " + os.path.join(self.dir, "fleet.log"))

    def keys(self, first, n):
        """API keys of new tenants bench-first .. bench-(first+n-1)."""
        out = []
        for i in range(first, first + n):
            self.run("tenant", "create", f"bench-{i}", "--data-dir", self.dir)
            out.append(self.run("key", "create", "--tenant", f"bench-{i}", "--data-dir", self.dir).stdout.strip())
        return out

    def stop(self):
        for p in self.execs:
            p.send_signal(signal.SIGTERM)
        for p in self.execs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.up and self.up.poll() is None:
            self.up.send_signal(signal.SIGTERM)
            try:
                self.up.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.up.pid, signal.SIGKILL)
        subprocess.run([self.loom, "pg", "stop", "--data-dir", self.dir], env=self.env, capture_output=True)
        self.log.close()
        if self.a.keep:
            print("kept", self.dir)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


# ---- one measurement --------------------------------------------------------------------------

def pg_role(app, btype):
    """Who a PostgreSQL backend works for."""
    if btype != "client backend":
        return "background"
    if app.startswith("loom-api"):
        return "api"
    if app.startswith("loom executor") and app != "loom executor stream":
        return "exec loops"
    return "sched+other"   # the scheduler and the executors' heartbeat and snapshot connections


def cpu_snapshot(f, loads):
    r = f.roles()
    backends = {}
    for line in f.psql("SELECT pid, application_name, backend_type FROM pg_stat_activity"
                       " WHERE pid <> pg_backend_pid()").splitlines():
        pid, app, btype = line.split("|")
        s = stat(int(pid))
        if s:
            backends[int(pid)] = (pg_role(app, btype), s[1])
    return {"pg_reaped": ticks([f.pm], reaped=True), "backends": backends, "api": ticks([r.get("api", 0)]),
            "sched": ticks([r.get("scheduler", 0)]),
            "execs": ticks([r.get("executor", 0)] + [p.pid for p in f.execs]),
            "load": ticks([p.pid for p in loads]), "machine": machine_ticks(), "t": time.time(),
            "wal": int(f.psql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))}


def pg_cores(c0, c1, wall):
    """PostgreSQL's CPU between two snapshots, in cores, by role and in all."""
    by = {"api": 0, "exec loops": 0, "sched+other": 0, "background": c1["pg_reaped"] - c0["pg_reaped"]}
    for pid, (role, t) in c1["backends"].items():
        by[role] += t - c0["backends"].get(pid, (role, 0))[1]
    return {k: v / HZ / wall for k, v in by.items()}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def measure(f, loads, n, seconds):
    t0 = float(f.psql("SELECT extract(epoch FROM clock_timestamp())"))
    c0 = cpu_snapshot(f, loads)
    time.sleep(seconds)
    c1 = cpu_snapshot(f, loads)
    t1 = float(f.psql("SELECT extract(epoch FROM clock_timestamp())"))
    win = f"to_timestamp({t0}) AND to_timestamp({t1})"
    cycles, ops = (int(x) for x in f.psql(
        f"SELECT (SELECT count(*) FROM cycles WHERE state = 'done' AND finished_at BETWEEN {win}),"
        f" (SELECT count(*) FROM operations WHERE state = 'done' AND finished_at BETWEEN {win})").split("|"))
    failed = int(f.psql(f"SELECT count(*) FROM operations WHERE state = 'failed' AND finished_at BETWEEN {win}"))
    # each executor's modelled-GPU time inside the window: a cycle's forward_backward
    # tokens at the profile's rate, from the cycle's start (not compute_s, which also holds
    # the executor's restore, database round trips included)
    busy = [float(x) for x in f.psql(
        "SELECT coalesce(sum(CASE WHEN c.id IS NOT NULL THEN greatest(0, least(extract(epoch FROM c.started_at) + {m},"
        " {t1}) - greatest(extract(epoch FROM c.started_at), {t0})) END), 0) / ({t1} - {t0})"
        " FROM executors e LEFT JOIN cycles c ON c.executor_id = e.id AND c.state IN ('done', 'running')"
        " AND c.started_at < to_timestamp({t1}) AND coalesce(c.finished_at, now()) > to_timestamp({t0})"
        " AND c.n_tokens > 0 WHERE e.state <> 'gone' GROUP BY e.id".format(
            t0=t0, t1=t1, m=f"{f.a.scale} * ({SIM_PASS_S} + {SIM_FB_S_PER_TOKEN} * c.n_tokens)")).split()]
    rows = f.psql(
        "WITH c AS (SELECT id, created_at, started_at, finished_at, compute_s,"
        " lag(finished_at) OVER (PARTITION BY executor_id ORDER BY started_at) AS prev_end,"
        " (SELECT min(created_at) FROM operations o WHERE o.cycle_id = cycles.id) AS first_op"
        f" FROM cycles WHERE state = 'done' AND started_at > to_timestamp({t0}) - interval '60 s')"
        " SELECT extract(epoch FROM started_at - greatest(prev_end, first_op)),"
        " extract(epoch FROM finished_at - started_at) - compute_s,"
        " extract(epoch FROM created_at - greatest(prev_end, first_op))"
        f" FROM c WHERE started_at BETWEEN {win} AND prev_end IS NOT NULL").split()
    claim = [1000 * float(r.split("|")[0]) for r in rows]
    commit = [1000 * float(r.split("|")[1]) for r in rows]
    wake = [1000 * float(r.split("|")[2]) for r in rows]
    wall = c1["t"] - c0["t"]
    cores = {k: (c1[k] - c0[k]) / HZ / wall for k in ("api", "sched", "execs", "load")}
    pg_by = pg_cores(c0, c1, wall)
    cores["pg"] = sum(pg_by.values())
    mb, ma = (c1["machine"][0] - c0["machine"][0]), (c1["machine"][1] - c0["machine"][1])
    cores["machine"] = mb / ma * os.cpu_count() if ma else 0
    span = t1 - t0
    return {"n": n, "cycles": cycles / span, "ops": ops / span, "failed": failed, "busy": busy,
            "claim": claim, "commit": commit, "wake": wake, "cores": cores, "pg_by": pg_by, "ops_n": ops,
            "wal_kb_op": (c1["wal"] - c0["wal"]) / 1024 / ops if ops else float("nan")}


# ---- the report -------------------------------------------------------------------------------

HEAD = (f"{'GPUs':>4s} {'clients':>7s} | {'cycles/s':>8s} {'(goal)':>8s} | {'ops/s':>7s} {'(goal)':>7s} |"
        f" {'claim ms p50':>12s} {'p99':>6s} (goal <= {GOAL_CLAIM_MS}) | {'commit':>6s} |"
        f" {'busy mean':>9s} {'worst':>5s} (goal >= {100 * GOAL_BUSY:.0f}%) |"
        f" CPU cores: {'pg':>4s} {'api':>4s} {'sched':>5s} {'execs':>5s} {'load':>4s} {'machine':>7s} (of {os.cpu_count()}) |"
        f" {'PG ms/op':>8s}")


def row(m, clients):
    b = statistics.mean(m["busy"]) if m["busy"] else 0
    ideal = (lambda x: x / b if b > 0 else float("nan"))
    c = m["cores"]
    return (f"{m['n']:4d} {clients:7d} | {m['cycles']:8.1f} {ideal(m['cycles']):8.1f} | {m['ops']:7.1f}"
            f" {ideal(m['ops']):7.1f} | {pct(m['claim'], 50):12.2f} {pct(m['claim'], 99):6.1f}"
            f" {'met' if pct(m['claim'], 50) <= GOAL_CLAIM_MS else 'MISSED':>11s} | {pct(m['commit'], 50):6.2f} |"
            f" {100 * b:8.1f}% {100 * min(m['busy'] or [0]):4.0f}% {'met' if b >= GOAL_BUSY else 'MISSED':>13s} |"
            f" {'':10s} {c['pg']:4.2f} {c['api']:4.2f} {c['sched']:5.2f} {c['execs']:5.2f} {c['load']:4.2f}"
            f" {c['machine']:7.2f} {'' if c['machine'] < GOAL_MACHINE * os.cpu_count() else 'SATURATED':>9s} |"
            f" {1000 * c['pg'] / m['ops'] if m['ops'] else float('nan'):8.2f}"
            + (f"  ({m['failed']} failed)" if m["failed"] else ""))


PARTS_HEAD = (f"{'GPUs':>4s} | claim p50 ms: {'wake':>5s} {'build+start':>11s} | PostgreSQL CPU ms per operation:"
              f" {'api':>5s} {'exec loops':>10s} {'sched+other':>11s} {'background':>10s} {'all':>6s} | {'WAL KB/op':>9s}")


def parts_row(m):
    """The claim's two parts (until the scheduler's transaction began; the cycle's build, its
    notify and the executor's start) and whose work PostgreSQL's CPU did."""
    per = lambda c: 1000 * c / m["ops"] if m["ops"] else float("nan")
    b = m["pg_by"]
    return (f"{m['n']:4d} | {'':13s} {pct(m['wake'], 50):5.2f} {pct(m['claim'], 50) - pct(m['wake'], 50):11.2f} |"
            f" {'':32s} {per(b['api']):5.2f} {per(b['exec loops']):10.2f} {per(b['sched+other']):11.2f}"
            f" {per(b['background']):10.2f} {per(m['cores']['pg']):6.2f} | {m['wal_kb_op']:9.1f}")


def summary(ms, idle):
    print()
    print("the queue's parts:")
    print(PARTS_HEAD)
    for m in ms:
        print(parts_row(m))
    print()
    firsts = {
        "claim latency p50 <= %.1f ms" % GOAL_CLAIM_MS: next((m["n"] for m in ms if pct(m["claim"], 50) > GOAL_CLAIM_MS), None),
        "busy >= %.0f%%" % (100 * GOAL_BUSY): next((m["n"] for m in ms if statistics.mean(m["busy"] or [0]) < GOAL_BUSY), None),
        "machine < %.0f%% busy" % (100 * GOAL_MACHINE): next((m["n"] for m in ms if m["cores"]["machine"] >= GOAL_MACHINE * os.cpu_count()), None),
    }
    best = max(ms, key=lambda m: m["cycles"])
    print(f"where each gives out (first fleet size that missed; '-': none up to {ms[-1]['n']} GPUs):")
    for k, v in firsts.items():
        print(f"  {k:28s} {v if v else '-'}")
    print(f"  cycles/s peaked at {best['cycles']:.1f} with {best['n']} GPUs"
          + (f" (then {ms[-1]['cycles']:.1f} at {ms[-1]['n']})" if best is not ms[-1] else ""))
    one_postgresql(ms, idle)


def least_squares(rows):
    """x minimising |A x - y| for rows (a_1 .. a_k, y): the normal equations, by Gaussian
    elimination (k is 3 here)."""
    k = len(rows[0]) - 1
    m = [[sum(r[i] * r[j] for r in rows) for j in range(k)] + [sum(r[i] * r[k] for r in rows)] for i in range(k)]
    for i in range(k):
        p = max(range(i, k), key=lambda r: abs(m[r][i]))
        m[i], m[p] = m[p], m[i]
        if not m[i][i]:
            return None
        for r in range(k):
            if r != i:
                f = m[r][i] / m[i][i]
                m[r] = [x - f * y for x, y in zip(m[r], m[i])]
    return [m[i][k] / m[i][i] for i in range(k)]


def one_postgresql(ms, idle):
    """How many GPUs one PostgreSQL serves, from its measured CPU. Its cores:
    k (what it does whatever the load: folds, background writers) + a·ops/s (each
    operation's own statements: submit, claim, start, commit, result) + b·N·cycles/s (every
    cycle's notify wakes every executor, each of which then asks for a cycle of its own)
    + g·N (each executor's idle polls and heartbeats, from the idle fleet). k, a and b by
    least squares over the sizes; a fully busy GPU makes the operations and cycles per
    second of the unsaturated sizes, divided by their busy fraction."""
    g = idle["cores"]["pg"] / idle["n"] if idle else 0.0
    rows = [(1.0, m["ops"], m["n"] * m["cycles"], m["cores"]["pg"] - g * m["n"]) for m in ms if m["ops"] > 0]
    if len(rows) < 3:
        return
    k, a, b = least_squares(rows) or (0, 0, 0)
    if b < 0 or a < 0:   # too few or too noisy sizes to tell the terms apart
        k, b = 0.0, 0.0
        a = sum(r[3] for r in rows) / sum(r[1] for r in rows)
        print("(the sizes do not tell the terms apart: all of PostgreSQL's CPU is counted per operation)")
    ok = [m for m in ms if m["cores"]["machine"] < GOAL_MACHINE * os.cpu_count() and statistics.mean(m["busy"] or [0]) > 0.5]
    ok = ok or ms[:1]
    r = statistics.median(m["ops"] / m["n"] / statistics.mean(m["busy"]) for m in ok)
    c = statistics.median(m["cycles"] / m["n"] / statistics.mean(m["busy"]) for m in ok)
    print(f"PostgreSQL's CPU, fitted: {k:.2f} cores + {1000 * a:.2f} ms per operation + {1e6 * b:.0f} us per executor"
          f" woken per cycle + {1000 * g:.2f} ms/s per idle executor" + (f" (the idle fleet of {idle['n']})" if idle else
                                                                        " (no idle pass: taken as 0)"))
    print(f"a fully busy modelled GPU: {r:.1f} operations/s in {c:.1f} cycles/s. GPUs one PostgreSQL serves at full speed"
          " (if its work spread over its cores):")

    def gpus(cores, herd):
        lo, hi = 0.0, 1e6
        for _ in range(100):
            n = (lo + hi) / 2
            woken = n * n if herd else n   # executor wake-ups per modelled cycle per GPU
            lo, hi = (n, hi) if k + a * r * n + b * c * woken + g * n <= cores else (lo, n)
        return lo
    for cores in (1, 16, 64):
        print(f"  {cores:3d} core(s): {gpus(cores, True):6.0f} as it is; {gpus(cores, False):6.0f} if each executor"
              " were woken only by its own cycles")


def lone_ops(f, n=30):
    """n forward_backwards of 8 tokens one after the other on an otherwise idle fleet:
    p50 ms of queue (created -> claimed), dispatch (claimed -> cycle started) and the
    client's submit -> result."""
    c = loom_bench.Conn(f.url, f.key)
    sid = c.post("/api/v1/create_session", {})["session_id"]
    fut = c.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": MODEL,
                                          "lora_config": {"rank": 4}})
    mid = c.result(fut["request_id"])["model_id"]
    rids, total = [], []
    for k in range(n):
        t0 = time.time()
        rid = c.post("/api/v1/forward_backward", loom_bench.fb_body(mid, k + 1, k, 1, 8))["request_id"]
        c.result(rid)
        total.append(time.time() - t0)
        rids.append(rid)
    times = loom_bench.op_times(f, rids).values()
    return (1000 * pct([v[1] - v[0] for v in times], 50), 1000 * pct([v[2] - v[1] for v in times], 50),
            1000 * pct(total, 50))


def notify_cost(f, n, rate=50, seconds=10):
    """PostgreSQL CPU per NOTIFY per listening connection: `rate` NOTIFYs a second on a
    channel nobody listens to, against the same statements without the NOTIFY."""
    k = int(rate * seconds)

    def pg_cpu(stmt):
        script = f"{stmt}; SELECT pg_sleep({1 / rate});\n" * k
        c0 = cpu_snapshot(f, [])
        subprocess.run(["psql", "-X", "-q", "-o", "/dev/null", "-d", f.db], input=script, text=True, check=True)
        c1 = cpu_snapshot(f, [])
        return sum(pg_cores(c0, c1, c1["t"] - c0["t"]).values()) * (c1["t"] - c0["t"])
    extra = pg_cpu("SELECT pg_notify('loom_bench_nobody', '')") - pg_cpu("SELECT ''")
    return extra / k, n + 3   # listening: each executor's loop, the api's two LISTEN connections, the scheduler


IDLE_HEAD = (f"{'GPUs':>4s} | idle CPU cores: {'pg':>5s} {'execs':>5s} {'sched':>5s} | lone forward_backward ms p50:"
             f" {'queue':>6s} {'dispatch':>8s} (goal: together <= {GOAL_CLAIM_MS}) {'submit->result':>14s}")


def idle_pass(a):
    """The fleet with no work: what its executors cost by being there, and the latency of a
    lone operation through the queue, size by size."""
    f, rows = Fleet(a), []
    try:
        f.start()
        print("the fleet idle:")
        print(IDLE_HEAD, flush=True)
        for n in a.sizes:
            f.grow(n)
            time.sleep(5)
            m = measure(f, [], n, a.seconds)
            q, d, t = lone_ops(f)
            m["lone"] = (q, d, t)
            rows.append(m)
            c = m["cores"]
            print(f"{n:4d} | {'':15s} {c['pg']:5.2f} {c['execs']:5.2f} {c['sched']:5.2f} | {'':29s} {q:6.2f} {d:8.2f}"
                  f" {'met' if q + d <= GOAL_CLAIM_MS else 'MISSED':>22s} {t:14.2f}", flush=True)
        per, listeners = notify_cost(f, a.sizes[-1])
        rows[-1]["notify"] = (per, listeners)
        print(f"a NOTIFY on a channel nobody listens to costs PostgreSQL {1000 * per:.2f} ms of CPU with {listeners}"
              f" connections listening ({1e6 * per / max(listeners, 1):.1f} us per listener): every NOTIFY wakes every"
              " listening backend", flush=True)
    finally:
        f.stop()
    return rows


def load_pass(a, idle):
    f = Fleet(a)
    mgr = mp.get_context("fork")
    steps = mgr.Array("l", max(a.sizes) * a.clients_per_executor, lock=False)
    errors, cmds = mgr.Queue(), [mgr.Queue() for _ in range(a.load_procs)]
    loads, ms, err_seen = [], [], []
    try:
        f.start()
        loads = [mgr.Process(target=load_proc, args=(f.url, a, cmds[i], steps, errors)) for i in range(a.load_procs)]
        for p in loads:
            p.start()
        print(f"the fleet training: each client a forward_backward of {a.datums} x {a.tokens} tokens + optim_step,"
              f" awaited, again (rank {a.rank}); {a.clients_per_executor} clients per executor")
        print(HEAD, flush=True)
        clients = 0
        for n in a.sizes:
            f.grow(n)
            want = n * a.clients_per_executor
            new = list(range(clients, want))
            for cid, key in zip(new, f.keys(clients, len(new))):
                cmds[cid % a.load_procs].put([(cid, key)])
            clients = want
            deadline = time.time() + 120 + want / 4
            while time.time() < deadline and any(steps[c] == 0 for c in range(clients)):
                time.sleep(0.5)
            time.sleep(a.warmup)
            m = measure(f, loads, n, a.seconds)
            ms.append(m)
            print(row(m, clients), flush=True)
            while not errors.empty():
                err_seen.append(errors.get())
        r = f.roles()
        conns = f.psql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
        print(f"at {a.sizes[-1]} GPUs: {conns} PostgreSQL connections; memory (PSS): executors"
              f" {pss_mb([r.get('executor', 0)] + [p.pid for p in f.execs]):.0f} MiB in all,"
              f" PostgreSQL {pss_mb([f.pm] + children(f.pm)):.0f} MiB, api {pss_mb([r.get('api', 0)]):.0f} MiB")
        summary(ms, idle)
    finally:
        for q in cmds:
            q.put(None)
        for p in loads:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        f.stop()
    while not errors.empty():
        err_seen.append(errors.get())
    if err_seen:
        print(f"{len(err_seen)} client(s) stopped on an error, e.g. {err_seen[0]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", default=os.environ.get("LOOM_BIN", "build/loom"))
    ap.add_argument("--parts", default="idle,load", help="idle: the fleet with no work; load: training clients")
    ap.add_argument("--sizes", default="1,4,16,64,128,256", help="fleet sizes (executors), growing")
    ap.add_argument("--clients-per-executor", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=15, help="measurement window per size")
    ap.add_argument("--warmup", type=float, default=5, help="seconds after every client stepped once")
    ap.add_argument("--datums", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--scale", type=float, default=1.0, help="LOOM_SIM_SCALE (0: no modelled time)")
    ap.add_argument("--load-procs", type=int, default=4)
    ap.add_argument("--flush-ms", type=float, default=0,
                    help="make every WAL flush take this much longer, as on a network volume or with a synchronous"
                         " standby (at most 100)")
    ap.add_argument("--loom-arg", action="append", default=[], help="more `loom up` options")
    ap.add_argument("--keep", action="store_true", help="keep the data directories")
    a = ap.parse_args()
    a.sizes = [int(x) for x in a.sizes.split(",")]
    a.loom = os.path.abspath(a.loom)
    parts = a.parts.split(",")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"machine: {os.cpu_count()} CPUs ({cpu}), {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') >> 30} GiB;"
          f" one PostgreSQL, api, scheduler and every executor on it, with the load; {a.seconds:g} s per size")
    print(f"sim: H100 + Qwen3-8B timing x{a.scale:g} (a step of 2 x 2048 tokens: 250 ms)"
          + (f"; every WAL flush {a.flush_ms:g} ms longer (--flush-ms)" if a.flush_ms else ""), flush=True)
    idle = idle_pass(a) if "idle" in parts else None
    if "load" in parts:
        if idle:
            print()
        load_pass(a, idle[-1] if idle else None)


if __name__ == "__main__":
    main()
