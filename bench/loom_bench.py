"""The whole stack's figures: a fresh `loom up` (its own PostgreSQL, the tiny
model, the CPU backend or --backend sim) driven over HTTP like the SDK drives it. Prints figures; never
passes or fails.

  latency     submit -> result of a lone forward_backward (1 datum of 8 tokens), p50/p99,
              split into api (submit -> row), queue (row -> claimed into a cycle),
              dispatch (claimed -> the executor starts the cycle), execution (the
              backend's work), commit + notify + answer; and of forward_backward +
              optim_step sent back to back (cycles per step)
  throughput  queue operations per second: 64 models submitting forward_backwards at once
  tenants     1, 8, 32 tenants each stepping (forward_backward + optim_step) with small
              batches, the same total tokens per round: aggregate tokens/s, cycles per
              step, per-tenant step latency
  durability  the cost of durable state per optim_step, end to end: steps with a snapshot
              every step against the default
  churn       (not run by default) 3,000 lone forward_backwards in a row, autovacuum as
              PostgreSQL has it: per 500, the operations table's dead row versions, the
              overhead p50 and the shared buffers per call of every per-operation statement
              (dead versions must cost nothing: goal flat)
  statements  (not run by default) PostgreSQL's time per lone forward_backward, statement by
              statement, with the shared buffers each touches and the WAL it writes
              (pg_stat_statements: the bench's cluster is restarted with it)
  history     (not run by default) a lone forward_backward's latency and the idle stack's
              CPU (every loom process and PostgreSQL backend, from /proc) on an empty
              database, then after 200k operations of history are inserted (copies of the
              run's own rows, in bulk, then checkpointed), with the statistics taken before
              (stale) and after a VACUUM (ANALYZE) (fresh)

The client speaks as SDK 0.25 and later do (protobuf forward_backward bodies and results);
`--wire json` as SDK 0.16-0.24 do by default (JSON both ways).

    /usr/bin/python3 bench/loom_bench.py [--loom build/loom] [--backend cpu|sim] [--wire proto|json] [--flush-ms MS] [--parts latency,throughput,tenants,durability,statements,history,churn]
"""
import argparse, contextlib, http.client, json, os, statistics, sys, threading, time, urllib.parse
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
import stack  # noqa: E402
import tinker_proto  # noqa: E402

ADAM = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
BASE = "loom/tiny-llama"


class Conn:
    """One keep-alive HTTP connection (as an SDK client holds one)."""
    def __init__(self, url, key):
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.key = u.hostname, u.port, key
        self.c = http.client.HTTPConnection(self.host, self.port, timeout=120)

    def post(self, path, body, accept="application/json"):
        """body: JSON-able, bytes already encoded as JSON (bench/fleet_bench.py encodes its
        big forward_backward bodies once), or a Proto (a protobuf body). A protobuf answer
        comes back as {"proto": its bytes}."""
        data = body if isinstance(body, bytes) else json.dumps(body)
        ctype = "application/x-protobuf" if isinstance(body, Proto) else "application/json"
        for attempt in range(3):
            try:
                self.c.request("POST", path, data, {"Content-Type": ctype, "Accept": accept, "X-API-Key": self.key})
                r = self.c.getresponse()
                raw = r.read()
                if (r.getheader("Content-Type") or "").startswith("application/x-protobuf") and r.status == 200:
                    return {"proto": raw}
                out = json.loads(raw)
                if r.status != 200:
                    raise RuntimeError(f"{path}: {r.status} {out}")
                return out
            except (http.client.HTTPException, ConnectionError):
                self.c.close()
                self.c = http.client.HTTPConnection(self.host, self.port, timeout=120)
        raise RuntimeError(f"{path}: connection failed")

    def result(self, rid):
        while True:
            r = self.post("/api/v1/retrieve_future", {"request_id": rid}, ACCEPT[WIRE])
            if r.get("type") != "try_again":
                if "error" in r:
                    raise RuntimeError(r["error"])
                return r

    def model(self, sid, n, rank=4):
        fut = self.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": n, "base_model": BASE,
                                                 "lora_config": {"rank": rank, "seed": n}})
        return self.result(fut["request_id"])["model_id"]


# How the client speaks (--wire): "proto" as the SDK does since 0.25 (protobuf
# forward_backward bodies, and protobuf results asked for with Accept), or "json" as SDK
# 0.16-0.24 do by default (JSON both ways: the api parses the body's JSON and writes each
# result's logprobs and losses as JSON numbers).
WIRE = "proto"
ACCEPT = {"proto": "application/x-protobuf", "json": "application/json"}


class Proto(bytes):
    """A protobuf request body."""


def datum(k, i, n):
    seq = [(7 * k + 13 * i + 5 * j) % 250 + 1 for j in range(n + 1)]
    return {"model_input": {"chunks": [{"tokens": seq[:-1], "type": "encoded_text"}]},
            "loss_fn_inputs": {"target_tokens": {"data": seq[1:], "dtype": "int64"}}}


_PROTO_DATUMS = {}


def proto_datum(k, i, n):
    """datum(k, i, n) as a protobuf Datum, encoded once (the SDK encodes with a compiled
    library; encoding in Python each time would bill the client for it)."""
    key = (k, i, n)
    if key not in _PROTO_DATUMS:
        seq = [(7 * k + 13 * i + 5 * j) % 250 + 1 for j in range(n + 1)]
        _PROTO_DATUMS[key] = tinker_proto.datum(seq[:-1], {"target_tokens": ("int64", seq[1:])})
    return _PROTO_DATUMS[key]


def fb_body(mid, seq, k, datums, tokens):
    if WIRE == "proto":
        return Proto(tinker_proto.fwdbwd_request(mid, seq, [proto_datum(k, i, tokens) for i in range(datums)],
                                                 "cross_entropy"))
    return {"model_id": mid, "seq_id": seq, "forward_backward_input": {
        "data": [datum(k, i, tokens) for i in range(datums)], "loss_fn": "cross_entropy"}}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def ms(x):
    return f"{1000 * x:7.2f}"


def op_times(s, rids):
    """Server-side times (epoch seconds) of operations: created, claimed, cycle started,
    finished (the executor's commit), the cycle's compute seconds."""
    ids = ",".join(f"'{r}'" for r in rids)
    rows = s.psql("SELECT o.request_id, extract(epoch FROM o.created_at), extract(epoch FROM o.claimed_at),"
                  " extract(epoch FROM c.started_at), extract(epoch FROM o.finished_at), coalesce(c.compute_s, 0),"
                  f" o.cycle_id FROM operations o JOIN cycles c ON c.id = o.cycle_id WHERE o.request_id IN ({ids})")
    out = {}
    for line in rows.splitlines():
        f = line.split("|")
        out[f[0]] = [float(x) for x in f[1:6]] + [int(f[6])]
    return out


HZ = os.sysconf("SC_CLK_TCK")


def proc_stat(pid):
    """(ppid, utime + stime, cutime + cstime) of a process in ticks, or None for one gone
    (bench/fleet_bench.py reads its processes with it too)."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(f[1]), int(f[11]) + int(f[12]), int(f[13]) + int(f[14])
    except (OSError, IndexError, ValueError):
        return None


def postmaster_pid(s):
    """The stack's PostgreSQL postmaster (pg_ctl detaches it from `loom up`), or None."""
    try:
        return int(open(os.path.join(s.dir, "pg", "postmaster.pid")).readline())
    except (OSError, ValueError):
        return None


def stack_procs(s):
    """The stack's processes, each after its parent: `loom up` and its processes, PostgreSQL's
    postmaster and its backends, as (pid, parent pid, own ticks, what its exited children
    left in its cutime). The bench's own client is not in it."""
    stats = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        st = proc_stat(p)
        if st:
            stats[int(p)] = st
    kids = {}
    for pid, st in stats.items():
        kids.setdefault(st[0], []).append(pid)
    out, todo, seen = [], [s.proc.pid, postmaster_pid(s)], set()
    while todo:
        p = todo.pop()
        if p in seen or p not in stats:
            continue
        seen.add(p)
        out.append((p,) + stats[p])
        todo += kids.get(p, [])
    return out


def stack_ticks(s):
    """CPU ticks of the whole stack (each alive process's own time, plus what exited
    children left in their parent's cutime)."""
    return sum(own + reaped for _, _, own, reaped in stack_procs(s))


def stack_parts(s):
    """CPU ticks of the stack's processes by part: a loom process by its command ("loom
    api"), a PostgreSQL backend by whose connection it is (its application_name, which
    every loom process sets: "loom api" -> "loom api's PostgreSQL"), PostgreSQL's own
    processes together. What exited children left in their parent's cutime counts with
    the parent. {part: ticks}"""
    names = {}
    for line in s.psql("SELECT pid, coalesce(application_name, ''), backend_type FROM pg_stat_activity").splitlines():
        pid, app, kind = line.split("|", 2)
        names[int(pid)] = (app.split(" executor ")[0] + " executor" if " executor " in app else app or "other") \
            + "'s PostgreSQL" if kind == "client backend" else "PostgreSQL's own processes"
    names[postmaster_pid(s)] = "PostgreSQL's own processes"
    out, part_of = {}, {}
    for p, ppid, own, reaped in stack_procs(s):   # a parent before its children
        part = names.get(p)
        if part is None:
            part = part_of.get(ppid)
            if part is None or part.startswith("loom "):
                try:
                    argv = open(f"/proc/{p}/cmdline").read().split("\0")
                    if len(argv) > 1 and argv[1] and not argv[1].startswith("-"):
                        part = "loom " + argv[1]
                except OSError:
                    pass
        part_of[p] = part
        out[part or "other"] = out.get(part or "other", 0) + own + reaped
    return out


def latency(s, n=300):
    c = Conn(s.url, s.key)
    sid = c.post("/api/v1/create_session", {})["session_id"]
    mid = c.model(sid, 0)
    for k in range(20):   # warm-up: buffers, the model's learned pattern (no optim_step follows)
        c.result(c.post("/api/v1/forward_backward", fb_body(mid, k + 1, k, 1, 8))["request_id"])
    seq, samples = 21, []
    parts0 = stack_parts(s)
    cpu0 = stack_ticks(s)
    for k in range(n):
        t0 = time.time()
        rid = c.post("/api/v1/forward_backward", fb_body(mid, seq, k, 1, 8))["request_id"]
        c.result(rid)
        samples.append((rid, t0, time.time()))
        seq += 1
    cpu_op = (stack_ticks(s) - cpu0) / HZ / n
    parts1 = stack_parts(s)
    by_part = {k: (v - parts0.get(k, 0)) / HZ / n for k, v in parts1.items()}
    times = op_times(s, [r for r, _, _ in samples])
    parts = {"total": [], "api": [], "queue": [], "dispatch": [], "execution": [], "commit+notify": [],
             "overhead": []}
    for rid, t0, t1 in samples:
        created, claimed, started, finished, compute, _ = times[rid]
        parts["total"].append(t1 - t0)
        parts["api"].append(created - t0)
        parts["queue"].append(claimed - created)
        parts["dispatch"].append(started - claimed)
        parts["execution"].append(compute)
        parts["commit+notify"].append(t1 - started - compute)
        parts["overhead"].append(t1 - t0 - compute)
    print(f"latency: a lone forward_backward (1 datum, 8 tokens), {n} in a row, ms")
    print(f"  {'':16s} {'p50':>7s} {'p99':>7s}")
    for k, v in parts.items():
        print(f"  {k:16s} {ms(pct(v, 50))} {ms(pct(v, 99))}")
    ov = pct(parts["overhead"], 50) * 1000
    print(f"  overhead beyond compute p50 {ov:.2f} ms   (goal <= 2 ms: {'met' if ov <= 2 else 'NOT met'})")
    cmp = statistics.mean(parts["execution"]) * 1000
    # the sim backend's compute is a sleep (a GPU's time, off the CPU): none of the CPU is it
    cpu_cmp = 0.0 if os.environ.get("LOOM_TEST_BACKEND") == "sim" else cmp
    print(f"  CPU of all processes per operation {1000 * cpu_op:.2f} ms for {cmp:.2f} ms of compute"
          f"{' (a sleep: none of the CPU is compute)' if cpu_cmp == 0 else ''}"
          f"   (goal <= 1 ms beyond compute: {'met' if 1000 * cpu_op - cpu_cmp <= 1 else 'NOT met'})")
    print("    by part, ms per operation: " + ", ".join(
        f"{k} {1000 * v:.2f}" for k, v in sorted(by_part.items(), key=lambda kv: -kv[1]) if 1000 * v >= 0.005)
        + "  (the executor's includes the compute; the client's own is not counted)")
    # forward_backward + optim_step back to back
    mid2 = c.model(sid, 1)
    steps, seq, cyc = [], 1, []
    for k in range(n // 3):
        t0 = time.time()
        f1 = c.post("/api/v1/forward_backward", fb_body(mid2, seq, k, 1, 8))["request_id"]
        f2 = c.post("/api/v1/optim_step", {"model_id": mid2, "seq_id": seq + 1, "adam_params": ADAM})["request_id"]
        c.result(f1)
        c.result(f2)
        steps.append(time.time() - t0)
        cyc += [f1, f2]
        seq += 2
    t = op_times(s, cyc)
    per_step = len({t[r][5] for r in cyc}) / (len(cyc) / 2)
    step_compute = [sum({t[r][5]: t[r][4] for r in cyc[i:i + 2]}.values()) for i in range(0, len(cyc), 2)]
    sc = 1000 * pct(step_compute, 50)
    sp = 1000 * pct(steps, 50)
    print(f"  forward_backward + optim_step back to back: p50 {ms(pct(steps, 50))} p99 {ms(pct(steps, 99))} ms,"
          f" {per_step:.2f} cycles per step; compute p50 {sc:.2f} ms"
          f"   (goal <= 4 ms + compute: {'met' if sp <= 4 + sc else 'NOT met'})")


def throughput(s, models=64, per_model=40):
    c0 = Conn(s.url, s.key)
    sid = c0.post("/api/v1/create_session", {})["session_id"]
    mids = [c0.model(sid, n) for n in range(models)]
    done, rids, lock = [], [], threading.Lock()

    def client(mid):
        c = Conn(s.url, s.key)
        mine = [c.post("/api/v1/forward_backward", fb_body(mid, k + 1, k, 1, 8))["request_id"] for k in range(per_model)]
        for r in mine:
            c.result(r)
        with lock:
            rids.extend(mine)
    t0 = time.time()
    ts = [threading.Thread(target=client, args=(m,)) for m in mids]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.time() - t0
    times = op_times(s, rids)
    first = min(v[0] for v in times.values())
    last = max(v[3] for v in times.values())
    cycles = len({v[5] for v in times.values()})
    n = len(rids)
    print(f"throughput: {models} models x {per_model} forward_backwards (1 datum, 8 tokens), submitted at once")
    print(f"  {n / (last - first):8.1f} operations/s in the queue (first row -> last commit), "
          f"{n / wall:8.1f} end to end; {cycles} cycles, {n / cycles:.1f} operations per cycle"
          f"   (goal >= 5,000 operations/s: {'met' if n / (last - first) >= 5000 else 'NOT met'})")


def tenants(s, counts=(1, 8, 32), round_tokens=8192, rounds=6, tokens=32, reps=5):
    """Each of T tenants steps with round_tokens/T tokens (of `tokens`-token datums) per
    step: the same total tokens per round whatever T. The tenant counts take turns, reps
    times over (1, 8, 32, 1, 8, 32, ...), and each ratio is taken within its turn: on a
    shared machine the backend's own speed drifts by a third from one second to the next,
    and a single pass of each count measured that drift more than the queue."""
    import subprocess
    secret = os.path.join(s.dir, "secret.key")
    keys = [s.key]
    env = dict(os.environ, DATABASE_URL=s.db)
    for i in range(1, max(counts)):
        subprocess.run([stack.LOOM_BIN, "tenant", "create", f"bench-{i}"], env=env, capture_output=True, check=True)
        keys.append(subprocess.run([stack.LOOM_BIN, "key", "create", "--tenant", f"bench-{i}", "--secret-file", secret],
                                   env=env, capture_output=True, text=True, check=True).stdout.strip())
    print(f"tenants: each steps (forward_backward + optim_step) {rounds} times; {round_tokens} tokens per round in all;"
          f" the counts take turns, {reps} times; medians, and each ratio's range over the turns")

    def phase(T):
        datums = max(1, round_tokens // T // tokens)
        lat, rids, lock = [], [], threading.Lock()
        ready = threading.Barrier(T + 1)

        def tenant(i):
            c = Conn(s.url, keys[i])
            sid = c.post("/api/v1/create_session", {})["session_id"]
            mid = c.model(sid, 0, rank=8)
            ready.wait()
            mine, seq = [], 1
            for k in range(rounds):
                t0 = time.time()
                f1 = c.post("/api/v1/forward_backward", fb_body(mid, seq, k, datums, tokens))["request_id"]
                f2 = c.post("/api/v1/optim_step", {"model_id": mid, "seq_id": seq + 1, "adam_params": ADAM})["request_id"]
                c.result(f1)
                c.result(f2)
                with lock:
                    lat.append(time.time() - t0)
                mine += [f1, f2]
                seq += 2
            with lock:
                rids.extend(mine)
        ts = [threading.Thread(target=tenant, args=(i,)) for i in range(T)]
        for t in ts:
            t.start()
        cpu0 = stack_parts(s)
        ready.wait()
        t0 = time.time()
        for t in ts:
            t.join()
        wall = time.time() - t0
        cpu = {k: (v - cpu0.get(k, 0)) / HZ * 1000 / rounds for k, v in stack_parts(s).items()}
        times = op_times(s, rids)
        cyc = sorted({v[5] for v in times.values()})
        busy, comp = map(float, s.psql("SELECT sum(extract(epoch FROM finished_at - started_at)), sum(compute_s)"
                                       " FROM cycles WHERE id IN (" + ",".join(map(str, cyc)) + ")").split("|"))
        tok = T * datums * tokens * rounds
        return {"datums": datums, "rate": tok / wall, "erate": tok / busy, "cycles": len(cyc) / rounds, "lat": lat,
                "round": [1000 * comp / rounds, 1000 * (busy - comp) / rounds, 1000 * (wall - busy) / rounds],
                "cpu": cpu}

    # A first, unmeasured pass of one tenant: the stack's first steps (buffers growing,
    # statements being prepared, pages faulted in) would otherwise count against the
    # one-tenant baseline and flatter every ratio to it.
    print(f"  (warm-up, one tenant: {phase(1)['rate']:8.0f} tokens/s, not counted)")
    runs = {T: [] for T in counts}
    for _ in range(reps):
        for T in counts:
            runs[T].append(phase(T))
    med = statistics.median
    for T in counts:
        rs = runs[T]
        ratio = [r["rate"] / b["rate"] for r, b in zip(rs, runs[counts[0]])]
        eratio = [r["erate"] / b["erate"] for r, b in zip(rs, runs[counts[0]])]
        lat = [x for r in rs for x in r["lat"]]
        print(f"  {T:3d} tenant(s) x {rs[0]['datums']:3d} datum(s): {med(r['rate'] for r in rs):8.0f} tokens/s"
              f" ({100 * med(ratio):5.1f}% of one tenant, {100 * min(ratio):.0f}..{100 * max(ratio):.0f};"
              f" executor {med(r['erate'] for r in rs):8.0f} tokens/s busy, {100 * med(eratio):5.1f}%),"
              f" {med(r['cycles'] for r in rs):5.2f} cycles per round ({med(r['cycles'] for r in rs) / T:.2f} per step),"
              f" step latency p50 {ms(pct(lat, 50))} p99 {ms(pct(lat, 99))} ms")
        rd = [med(r["round"][i] for r in rs) for i in range(3)]
        print(f"      a round: the executor computes {rd[0]:.1f} ms, spends {rd[1]:.1f} ms more in its cycles (reading"
              f" payloads, writing results, committing) and waits {rd[2]:.1f} ms between them (the clients' turnaround,"
              " the queue)")
        names = sorted({k for r in rs for k in r["cpu"]}, key=lambda k: -med(r["cpu"].get(k, 0) for r in rs))
        print("      the stack's CPU a round, ms: " + ", ".join(
            f"{k} {med(r['cpu'].get(k, 0) for r in rs):.1f}" for k in names if med(r["cpu"].get(k, 0) for r in rs) >= 0.05))
    r32 = [r["rate"] / b["rate"] for r, b in zip(runs[counts[-1]], runs[counts[0]])]
    print(f"  {counts[-1]} tenants: {100 * med(r32):.1f}% of one tenant's tokens/s   (goal >= 90%: {'met' if med(r32) >= 0.9 else 'NOT met'};"
          " the clients run on the same machine: their own work, 4 requests per step, is in the wall-clock figure)")


def durability(loom_args, steps=60):
    print(f"durability: {steps} steps (forward_backward of 8 datums x 32 tokens + optim_step), one tenant")
    res = {}
    for every in (1, 20):
        with stack.Stack(["--snapshot-every", str(every)] + loom_args) as s:
            c = Conn(s.url, s.key)
            sid = c.post("/api/v1/create_session", {})["session_id"]
            mid = c.model(sid, 0, rank=8)
            lat, seq = [], 1
            for k in range(steps):
                t0 = time.time()
                f1 = c.post("/api/v1/forward_backward", fb_body(mid, seq, k, 8, 32))["request_id"]
                f2 = c.post("/api/v1/optim_step", {"model_id": mid, "seq_id": seq + 1, "adam_params": ADAM})["request_id"]
                c.result(f1)
                c.result(f2)
                lat.append(time.time() - t0)
                seq += 2
            n = s.read_log().count("snapshot after seq_id")
            res[every] = pct(lat, 50)
            print(f"  snapshot every {every:2d} step(s): step p50 {ms(pct(lat, 50))} p99 {ms(pct(lat, 99))} ms,"
                  f" {n} snapshots written")
    print(f"  cost of a snapshot every step: {1000 * (res[1] - res[20]):+.2f} ms per step at p50"
          " (snapshots are written beside the compute; bench_backend prints the bytes and seconds of one)")


def stack_cpu(s):
    """CPU seconds used so far by each process of the stack (its own, not its exited
    children's): {pid: seconds}."""
    return {p: own / HZ for p, _, own, _ in stack_procs(s)}


def idle_cpu(s, secs=20):
    """CPU seconds the whole stack spends in secs of idling."""
    time.sleep(3)   # the last request's commits and notifications settle
    a = stack_cpu(s)
    time.sleep(secs)
    b = stack_cpu(s)
    return sum(v - a.get(p, 0) for p, v in b.items())


def lone_fbs(s, c, mid, seq, n):
    """n lone forward_backwards in a row from seq: p50 and p99 of the total latency and of
    the overhead beyond compute, seconds."""
    rids, tot = [], {}
    for k in range(n):
        t0 = time.time()
        rid = c.post("/api/v1/forward_backward", fb_body(mid, seq + k, k, 1, 8))["request_id"]
        c.result(rid)
        tot[rid] = time.time() - t0
        rids.append(rid)
    t = op_times(s, rids)
    over = [tot[r] - t[r][4] for r in rids]
    return pct(list(tot.values()), 50), pct(list(tot.values()), 99), pct(over, 50), pct(over, 99)


# The history: finished sessions, each with an unloaded model that ran 100 operations
# (forward_backward and optim_step in turn, in cycles of two), copied from the run's own
# rows (payload, packed payload and result, tokens) so that they are the size real ones are.
HISTORY_SQL = """
SET session_replication_role = replica;
SET synchronous_commit = off;
CREATE TEMP TABLE t AS SELECT
  (SELECT tenant_id FROM operations WHERE request_id = '{fb}') AS tenant,
  (SELECT executor_id FROM cycles WHERE id = (SELECT cycle_id FROM operations WHERE request_id = '{fb}')) AS exe,
  (SELECT coalesce(max(id), 0) + 1000 FROM cycles) AS c0;
INSERT INTO sessions (id, tenant_id, created_at, last_heartbeat_at, expired_at)
  SELECT 'hist-' || i, t.tenant, now() - interval '3 days', now() - interval '2 days', now() - interval '2 days'
  FROM t, generate_series(1, {models}) i;
INSERT INTO models (id, tenant_id, session_id, model_seq_id, base_model, lora_rank, lora_seed, train_attn,
                    train_mlp, train_unembed, status, next_seq, created_at)
  SELECT 'hist-' || i || ':train:0', m.tenant_id, 'hist-' || i, 0, m.base_model, m.lora_rank, m.lora_seed,
         m.train_attn, m.train_mlp, m.train_unembed, 'unloaded', {per} + 1, now() - interval '3 days'
  FROM models m, generate_series(1, {models}) i WHERE m.id = '{mid}';
INSERT INTO cycles (id, executor_id, state, n_ops, n_tokens, lease_expires_at, started_at, finished_at, compute_s)
  SELECT t.c0 + i, t.exe, 'done', 2, 8, now() - interval '2 days', now() - interval '2 days',
         now() - interval '2 days', 0.001 FROM t, generate_series(0, {models} * {per} / 2 - 1) i;
SELECT setval(pg_get_serial_sequence('cycles', 'id'), (SELECT max(id) FROM cycles));
INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, payload_bin, n_tokens, state,
                        cycle_id, result, result_bin, applied, created_at, claimed_at, finished_at)
  SELECT 'hist-' || i || '-' || k, o.tenant_id, 'hist-' || i || ':train:0', k, o.kind, o.payload, o.payload_bin,
         o.n_tokens, 'done', t.c0 + ((i - 1) * {per} + k - 1) / 2, o.result, o.result_bin, true,
         now() - interval '2 days', now() - interval '2 days', now() - interval '2 days'
  FROM t, generate_series(1, {models}) i, generate_series(1, {per}) k
  JOIN operations o ON o.request_id = CASE WHEN k % 2 = 1 THEN '{fb}' ELSE '{opt}' END;
"""


def history(loom_args, n=150, models=2000, per=100):
    """A lone forward_backward's latency and the idle stack's CPU per 20 s, on an empty
    database and after models * per operations of history (stale, then fresh statistics)."""
    print(f"history: a lone forward_backward (1 datum, 8 tokens), {n} in a row, ms; the idle stack's CPU"
          " (loom processes + PostgreSQL backends) per 20 s")
    rows = []
    with stack.Stack(loom_args) as s:
        c = Conn(s.url, s.key)
        sid = c.post("/api/v1/create_session", {})["session_id"]
        mid = c.model(sid, 0)
        fb = c.post("/api/v1/forward_backward", fb_body(mid, 1, 0, 1, 8))["request_id"]
        c.result(fb)
        opt = c.post("/api/v1/optim_step", {"model_id": mid, "seq_id": 2, "adam_params": ADAM})["request_id"]
        c.result(opt)
        for k in range(20):   # warm-up
            c.result(c.post("/api/v1/forward_backward", fb_body(mid, k + 3, k, 1, 8))["request_id"])
        seq = 23
        rows.append(("empty database",) + lone_fbs(s, c, mid, seq, n) + (idle_cpu(s),))
        seq += n
        # Stale: the statistics of the small database, and autovacuum kept from renewing them.
        tables = ["operations", "cycles", "models", "sessions"]
        s.psql("ANALYZE; " + "; ".join(f"ALTER TABLE {t} SET (autovacuum_enabled = off)" for t in tables))
        t0 = time.time()
        s.psql(HISTORY_SQL.format(fb=fb, opt=opt, mid=mid, models=models, per=per))
        ops = int(s.psql("SELECT count(*) FROM operations"))
        print(f"  inserted {models * per} operations of history in {time.time() - t0:.1f} s ({ops} in all)")
        # History comes over days, not in one statement: the bulk insert's WAL is
        # checkpointed, and the fresh case is after the vacuum that catches up with it (else
        # the measurement takes in that checkpoint's and that vacuum's one-off I/O: p99 15-25
        # ms against 5-6 with them done first).
        s.psql("CHECKPOINT")
        rows.append((f"{ops // 1000}k ops, stale stats",) + lone_fbs(s, c, mid, seq, n) + (idle_cpu(s),))
        seq += n
        s.psql("VACUUM (ANALYZE)")   # alone: VACUUM runs in no transaction block
        s.psql("; ".join(f"ALTER TABLE {t} RESET (autovacuum_enabled)" for t in tables))
        rows.append((f"{ops // 1000}k ops, fresh stats",) + lone_fbs(s, c, mid, seq, n) + (idle_cpu(s),))
    print(f"  {'':24s} {'p50':>7s} {'p99':>7s} {'overhead p50':>12s} {'p99':>7s} {'idle CPU s/20 s':>16s}")
    for name, p50, p99, o50, o99, cpu in rows:
        print(f"  {name:24s} {ms(p50)} {ms(p99)} {ms(o50):>12s} {ms(o99)} {cpu:16.2f}")
    base = rows[0][3]
    for name, _, _, o50, _, cpu in rows[1:]:
        print(f"  {name}: overhead p50 {100 * (o50 / base - 1):+.0f}% of the empty database's"
              f" (target: no growth); idle CPU {cpu:.2f} s per 20 s")


def pg_restart(s):
    """Restarts the stack's PostgreSQL (`loom pg stop` / `start`, as its owner); the loom
    processes reconnect as after any outage."""
    import subprocess
    subprocess.run([stack.LOOM_BIN, "pg", "stop", "--data-dir", s.dir], check=True, capture_output=True)
    for _ in range(60):   # the old backends leave within a moment of the postmaster
        p = subprocess.run([stack.LOOM_BIN, "pg", "start", "--data-dir", s.dir], capture_output=True, text=True)
        if p.returncode == 0:
            return
        time.sleep(0.5)
    raise RuntimeError("PostgreSQL did not start again: " + p.stderr)


def with_statements(s):
    """Restarts the stack's PostgreSQL with pg_stat_statements loaded (planning tracked
    too) -> a connection and a fresh session id, once every api worker has reconnected."""
    s.psql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    pg_restart(s)
    c = Conn(s.url, s.key)
    ok = 0
    for _ in range(200):   # every api worker's connection fails once after the restart
        try:
            sid = c.post("/api/v1/create_session", {})["session_id"]
            ok += 1
            if ok >= 16:
                break
        except RuntimeError:
            ok = 0
            time.sleep(0.2)
    s.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    s.psql("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
    s.psql("SELECT pg_reload_conf()")
    return c, sid


def churn(loom_args, rounds=6, per=500):
    """What the database's dead row versions cost the hot statements: rounds x per lone
    forward_backwards in a row on a fresh stack, autovacuum as PostgreSQL has it (on a
    table of any size it comes after a fifth of the rows changed: on a deployment's
    operations table, after days). Every operation leaves dead versions of its row and dead
    entries in the indexes its updates wrote; a statement that reaches live rows through
    them pays for every operation since the last vacuum. Per round: the operations' dead
    row versions (from PostgreSQL's counters), the lone operation's overhead p50 and the
    shared buffers per call of each statement run about once per operation. Not in the
    default run."""
    print(f"churn: {rounds} x {per} lone forward_backwards (1 datum, 8 tokens) in a row; shared buffers per call of"
          " each statement run about once per operation, per round (goal: flat)")
    with stack.Stack(loom_args) as s:
        c, sid = with_statements(s)
        mid = c.model(sid, 0)
        seq, cols, per_stmt = 1, [], {}
        for r in range(rounds):
            s.psql("SELECT pg_stat_statements_reset()")
            over = []
            for k in range(per):
                t0 = time.time()
                rid = c.post("/api/v1/forward_backward", fb_body(mid, seq, k, 1, 8))["request_id"]
                c.result(rid)
                over.append((rid, time.time() - t0))
                seq += 1
            t = op_times(s, [rid for rid, _ in over])
            o50 = pct([dt - t[rid][4] for rid, dt in over], 50)
            rows = s.psql(f"SELECT (shared_blks_hit + shared_blks_read)::float / calls,"
                          f" left(regexp_replace(query, '\\s+', ' ', 'g'), 56) FROM pg_stat_statements"
                          f" WHERE calls >= {int(0.8 * per)} AND query NOT LIKE '%pg_stat_statements%'")
            for line in rows.splitlines():
                b, q = line.split("|", 1)
                per_stmt.setdefault(q, {})[r] = float(b)
            dead = int(s.psql("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'operations'"))
            cols.append((f"{r * per}-{(r + 1) * per}", dead, o50))
    print(f"  {'operations':58s}" + "".join(f" {name:>10s}" for name, _, _ in cols))
    print(f"  {'dead row versions of operations at the end':58s}" + "".join(f" {d:10d}" for _, d, _ in cols))
    print(f"  {'overhead beyond compute p50, ms':58s}" + "".join(f" {1000 * o:10.2f}" for _, _, o in cols))
    grew = []
    for q, by in sorted(per_stmt.items(), key=lambda kv: -max(kv[1].values())):
        vals = [by.get(r) for r in range(rounds)]
        print(f"  {q:58s}" + "".join(f" {v:10.1f}" if v is not None else f" {'-':>10s}" for v in vals))
        if vals[0] and vals[-1]:
            grew.append((vals[-1] / vals[0], q))
    worst = max(grew) if grew else (1.0, "")
    print(f"  the statement that grew most: x{worst[0]:.2f} from the first round to the last ({worst[1][:40]})"
          f"   (goal: none grows: {'met' if worst[0] <= 1.5 else 'NOT met'})")


def statements(loom_args, n=500):
    """Where PostgreSQL's time goes for a lone forward_backward: each statement's execution
    and planning time and calls per operation, from pg_stat_statements (the bench's cluster
    is restarted with it loaded). The statements' own time, not the machine's: steadier
    than the wall-clock and CPU figures on a shared machine, so a change to one statement
    shows in its row. Not in the default run."""
    with stack.Stack(loom_args) as s:
        c, sid = with_statements(s)
        mid = c.model(sid, 0)
        for k in range(30):   # warm-up: statements prepared, their generic plans settled
            c.result(c.post("/api/v1/forward_backward", fb_body(mid, k + 1, k, 1, 8))["request_id"])
        s.psql("SELECT pg_stat_statements_reset()")
        for k in range(30, 30 + n):
            c.result(c.post("/api/v1/forward_backward", fb_body(mid, k + 1, k, 1, 8))["request_id"])
        rows = s.psql("SELECT (total_exec_time + total_plan_time) / " + str(n) + ", total_plan_time / " + str(n) +
                      ", calls::float / " + str(n) + ", (shared_blks_hit + shared_blks_read)::float / " + str(n) +
                      ", wal_records::float / " + str(n) + ", wal_bytes::float / " + str(n) +
                      ", left(regexp_replace(query, '\\s+', ' ', 'g'), 64)"
                      " FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'"
                      " ORDER BY total_exec_time + total_plan_time DESC")
    rows = [r.split("|", 6) for r in rows.splitlines() if r.count("|") >= 6]
    total = sum(float(r[0]) for r in rows)
    per_op = sum(float(r[2]) for r in rows)
    bufs, wrec, wbytes = (sum(float(r[k]) for r in rows) for k in (3, 4, 5))
    print(f"statements: a lone forward_backward (1 datum, 8 tokens), {n} in a row; PostgreSQL's time per operation"
          f" by statement (execution + planning), shared buffers touched and WAL written, pg_stat_statements")
    print(f"  {'ms/op':>7s} {'plan':>6s} {'calls':>5s} {'bufs':>5s} {'WAL':>4s} {'bytes':>5s}  statement")
    for t, plan, calls, b, wr, wb, q in rows[:16]:
        print(f"  {float(t):7.3f} {float(plan):6.3f} {float(calls):5.2f} {float(b):5.1f} {float(wr):4.1f}"
              f" {float(wb):5.0f}  {q}")
    print(f"  {total:7.3f} ms per operation in {per_op:.1f} statements (the rest of PostgreSQL's CPU is the"
          " protocol, commits, notifications)")
    print(f"  {bufs:7.1f} shared buffers, {wrec:.1f} WAL records, {wbytes:.0f} WAL bytes per operation (these move"
          " with the work done, not with the machine's load)")


def slow_flush(s, ms):
    """Every WAL flush of the stack's cluster takes `ms` longer, as on a disk whose flush
    takes that long (a network volume) or with a synchronous standby: commit_delay with
    commit_siblings 0 makes the backend that flushes sleep first, holding the WAL write
    lock, so that the commits arriving meanwhile share its flush (group commit), as they
    would share a slow disk's."""
    s.psql(f"ALTER SYSTEM SET commit_delay = {min(100000, round(ms * 1000))}")
    s.psql("ALTER SYSTEM SET commit_siblings = 0")
    s.psql("SELECT pg_reload_conf()")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=os.environ.get("LOOM_BIN", "build/loom"))
    ap.add_argument("--parts", default="latency,throughput,tenants,durability")
    ap.add_argument("--loom-arg", action="append", default=[], help="more `loom up` options")
    ap.add_argument("--backend", default=os.environ.get("LOOM_TEST_BACKEND") or "cpu",
                    help="the executor's backend: cpu (the default; the compute shares the machine's cores with"
                         " everything else), or sim (a modelled H100 on Qwen3-8B whose time is a sleep, as a GPU's"
                         " is spent off the CPU; LOOM_SIM_SCALE scales it)")
    ap.add_argument("--wire", choices=["proto", "json"], default="proto",
                    help="the client's wire format: proto as SDK 0.25 and later (the default), json as SDK 0.16-0.24")
    ap.add_argument("--flush-ms", type=float, default=0,
                    help="make every WAL flush of the shared stack's cluster (latency, throughput, tenants) take this"
                         " much longer, as on a network volume or with a synchronous standby (at most 100)")
    a = ap.parse_args()
    global WIRE
    WIRE = a.wire
    stack.LOOM_BIN = a.loom
    os.environ["LOOM_TEST_BACKEND"] = a.backend   # tests/lib/stack.py's `loom up --backend`
    parts = a.parts.split(",")
    be = ("the CPU backend" if a.backend == "cpu" else
          f"the sim backend (a modelled H100, Qwen3-8B, times x {os.environ.get('LOOM_SIM_SCALE', '1')})"
          if a.backend == "sim" else f"the {a.backend} backend")
    print(f"machine: {os.cpu_count()} CPUs; loom up ({be}, tiny Llama), its own PostgreSQL"
          f"{f' whose WAL flushes take {a.flush_ms:g} ms longer (--flush-ms)' if a.flush_ms else ''}; the client speaks"
          f" {'protobuf as SDK 0.25 and later' if WIRE == 'proto' else 'JSON as SDK 0.16-0.24'} (--wire)")
    # history starts stacks of its own: no shared one for it alone
    with stack.Stack(a.loom_arg) if {"latency", "throughput", "tenants"} & set(parts) else contextlib.nullcontext() as s:
        if s and a.flush_ms:
            slow_flush(s, a.flush_ms)
        if "latency" in parts:
            latency(s)
        if "throughput" in parts:
            throughput(s)
        if "tenants" in parts:
            tenants(s)
    if "durability" in parts:
        durability(a.loom_arg)
    if "history" in parts:
        history(a.loom_arg)
    if "statements" in parts:
        statements(a.loom_arg)
    if "churn" in parts:
        churn(a.loom_arg)


if __name__ == "__main__":
    main()
