"""Executor pools (docs/architecture.md, "Pools and placement").

One `loom up` serves two base models (tiny Llama and tiny Qwen3, `--models`); a second
Llama executor joins from outside with the database URL, as one on another machine would.
Six Llama models spread over the two. Every model trains with the same seed and data, so
all must report the same losses at every step, wherever they run and whatever happens:

  - readiness counts an executor only while it beats within `--executor-timeout-s` (one
    stopped for longer is not counted, even before the scheduler writes it off);
  - kill -9 of the joined executor (no supervisor): after `--executor-timeout-s` its models
    continue on the other;
  - another joins with a small memory budget; `loom executor drain` of the first moves
    every model to it, and hands the sampler snapshot it holds over to the blob store (its
    samples run on the other, with the same tokens); a sample whose snapshot the draining
    executor did not hand over waits, and its future says why; over its budget the small
    executor evicts the idle models to the blob store, and they are loaded again (placed
    anew) with their next step;
  - a Qwen3 model trains on the Qwen3 executor.
"""
import os, shutil, signal, subprocess, sys, tempfile, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import wait_for, Stack, Results, LOOM_BIN, backend_args
from apitest import loom_cli
from resilient import Client, datum, ADAM

R = Results()
LLAMA, QWEN = "loom/tiny-llama", "loom/tiny-qwen"


class Model:
    def __init__(self, c, sid, n, base=LLAMA):
        self.c, self.seq, self.losses = c, 1, []
        self.id = c.call("/api/v1/create_model", {"session_id": sid, "model_seq_id": n, "base_model": base,
                                                  "lora_config": {"rank": 8, "seed": 5}})["model_id"]

    def step(self):
        k = len(self.losses) + 1
        fb = self.c.post("/api/v1/forward_backward", {"model_id": self.id, "seq_id": self.seq, "forward_backward_input": {
            "data": [datum("p", k, i) for i in range(4)], "loss_fn": "cross_entropy"}})
        op = self.c.post("/api/v1/optim_step", {"model_id": self.id, "seq_id": self.seq + 1, "adam_params": ADAM})
        r1, r2 = self.c.result(fb["request_id"]), self.c.result(op["request_id"])
        self.seq += 2
        assert "error" not in r1 and r2["metrics"]["step:max"] == k, (r1, r2)
        self.losses.append(r1["metrics"]["loss:sum"])


def join_executor(s, model_dir, name, *extra):
    p = subprocess.Popen([LOOM_BIN, "executor", "--config", "/dev/null", "--db", s.db, "--model-dir", model_dir,
                          "--model-name", LLAMA, "--blob-dir", os.path.join(s.dir, "blobs"), "--name", name,
                          "--snapshot-every", "3", "--evict-idle-s", "1"] + backend_args() + list(extra),
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(s.dir, name + ".log"), "wb"))
    ok = wait_for(lambda: s.psql(f"SELECT count(*) FROM executors WHERE pid = {p.pid} AND state = 'idle'") == "1", 60)
    R.check(ok, f"executor {name} joined with the database URL alone")
    return p, int(s.psql(f"SELECT id FROM executors WHERE pid = {p.pid}"))


def sample(c, sampler, k):
    """The tokens of one sample from the sampler (the same seed each time)."""
    r = c.call("/api/v1/asample", {"sampling_session_id": sampler, "seq_id": k, "num_samples": 1,
                                   "prompt": {"chunks": [{"tokens": [1, 2, 3, 4]}]},
                                   "sampling_params": {"max_tokens": 8, "seed": 11}})
    assert "sequences" in r, r
    return r["sequences"][0]["tokens"]


def snapshot(c, m):
    """An unnamed save_weights_for_sampler of the model: its sampling session id."""
    f = c.post("/api/v1/save_weights_for_sampler", {"model_id": m.id, "seq_id": m.seq})
    m.seq += 1
    return c.result(f["request_id"])["sampling_session_id"]


def readiness_follows_timeout(s, j1, up_llama):
    """The joined executor stopped for 7 s (the scheduler too, so that it is not written
    off): past the 5 s timeout readyz no longer counts it."""
    sched = s.children()["scheduler"]
    os.kill(sched, signal.SIGSTOP)
    j1.send_signal(signal.SIGSTOP)
    try:
        time.sleep(7)
        st, ready = s.get("/api/v1/readyz", key=None)
        served = {m["name"]: m["executors"] for m in ready.get("base_models", [])}
        R.check(st == 200 and served.get(LLAMA) == 1,
                f"readyz follows --executor-timeout-s 5: an executor silent for 7 s is not counted ({served})")
    finally:
        j1.send_signal(signal.SIGCONT)
        # its heartbeat first, then the scheduler: the reaper must not find it silent
        wait_for(lambda: s.psql(f"SELECT heartbeat_at > now() - interval '1 second' FROM executors"
                                f" WHERE pid = {j1.pid}") == "t", 10)
        os.kill(sched, signal.SIGCONT)
    R.check(s.psql(f"SELECT state FROM executors WHERE pid = {j1.pid}") != "gone", "and it comes back when it beats")


def placement(s, models):
    ids = ",".join(f"'{m.id}'" for m in models)
    rows = s.psql(f"SELECT coalesce(executor_id, 0) FROM models WHERE id IN ({ids})").split()
    return {int(e): rows.count(e) for e in set(rows)}


def main():
    tmp = tempfile.mkdtemp(prefix="loom-pools-", dir="/tmp")
    llama, qwen = os.path.join(tmp, "llama"), os.path.join(tmp, "qwen")
    for arch, d, seed in (("llama", llama, "1"), ("qwen3", qwen, "2")):
        subprocess.run([LOOM_BIN, "mkmodel", "--arch", arch, "--preset", "tiny", "--seed", seed, "--out", d],
                       check=True, capture_output=True)
    try:
        avail = mem_available()
        with Stack(["--models", f"{LLAMA}={llama},{QWEN}={qwen}", "--executor-timeout-s", "5",
                    "--snapshot-every", "3", "--evict-idle-s", "1"]) as s:
            shared_ram(s, max(avail, mem_available()))
            run(s, llama)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    R.finish()


def mem_available():
    with open("/proc/meminfo") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith("MemAvailable:"))


def shared_ram(s, avail):
    """The CPU executors of one `loom up` share the RAM: their adapter budgets add up to
    half of what was available, as one executor's default alone would be."""
    if (os.environ.get("LOOM_TEST_BACKEND") or "cpu") != "cpu":
        return
    budgets = [int(x) for x in s.psql("SELECT memory_budget FROM executors WHERE name LIKE 'up-%' "
                                      "AND state <> 'gone'").split()]
    R.check(len(budgets) == 2 and sum(budgets) <= 0.55 * avail and min(budgets) > 0.2 * avail / 2,
            f"two CPU executors budget half the available RAM between them: {[b >> 20 for b in budgets]} MiB "
            f"of {avail >> 20} MiB available")


def run(s, llama):
    c = Client(s.url, s.key)
    names = {m["model_name"] for m in c.post("/api/v1/get_server_capabilities", {})["supported_models"]}
    R.check({LLAMA, QWEN} <= names, f"one loom up serves both base models: {sorted(names)}")
    up_llama = int(s.psql(f"SELECT id FROM executors WHERE base_model = '{LLAMA}' AND state <> 'gone'"))
    # It shares this host's RAM with up's executors: the same budget as each of them.
    same = s.psql(f"SELECT memory_budget FROM executors WHERE id = {up_llama}")
    j1, j1_id = join_executor(s, llama, "joined-1", "--memory-budget", same)
    st, ready = s.get("/api/v1/readyz", key=None)
    served = {m["name"]: (m["ready"], m["executors"]) for m in ready.get("base_models", [])}
    R.check(st == 200 and ready.get("ready") and ready.get("database") and served == {LLAMA: (True, 2), QWEN: (True, 1)},
            f"readyz (no key): the database answers, and which base models live executors serve: {st} {ready}")
    readiness_follows_timeout(s, j1, up_llama)
    sid = c.post("/api/v1/create_session", {})["session_id"]
    models = [Model(c, sid, n) for n in range(6)]
    for m in models:
        m.step()
    spread = placement(s, models)
    R.check(spread.get(up_llama) == 3 and spread.get(j1_id) == 3,
            f"6 models spread over the 2 Llama executors by free memory: {spread}")

    # kill -9 of the joined executor: nobody restarts it; its models continue on the other
    moved = [m for m in models if s.psql(f"SELECT executor_id FROM models WHERE id = '{m.id}'") == str(j1_id)]
    j1.send_signal(signal.SIGKILL)
    j1.wait()
    t0 = time.time()
    for m in moved:
        m.step()
    R.check(placement(s, moved) == {up_llama: len(moved)},
            f"after kill -9 of the joined executor its {len(moved)} models continue on the other "
            f"({time.time() - t0:.1f} s, with the 5 s timeout)")
    for m in models:
        if m not in moved:
            m.step()

    # a small executor joins; draining the first moves everything to it, which evicts idle ones
    per_rank = int(s.psql(f"SELECT adapter_bytes_per_rank FROM executors WHERE id = {up_llama}"))
    budget = per_rank * 8 * 3   # three rank-8 adapters
    j2, j2_id = join_executor(s, llama, "joined-2", "--memory-budget", str(budget))
    holder = next(m for m in models if s.psql(f"SELECT executor_id FROM models WHERE id = '{m.id}'") == str(up_llama))
    sampler = snapshot(c, holder)
    first = sample(c, sampler, 0)
    R.check(s.psql(f"SELECT executor_id FROM sampling_sessions WHERE id = '{sampler}'") == str(up_llama),
            "a sampler snapshot of a model on up-0 is held there")
    out = loom_cli(s, "executor", "drain", "up-0", "--wait", "60")
    R.check("drained" in out, f"loom executor drain up-0 --wait: {out.splitlines()[-1] if out else out}")
    t0 = time.time()
    try:
        again = sample(Client(s.url, s.key, deadline_s=30), sampler, 1)
    except (TimeoutError, AssertionError) as e:
        again = f"not run: {e}"
    ran_on = s.psql(f"SELECT c.executor_id FROM operations o JOIN cycles c ON c.id = o.cycle_id"
                    f" WHERE o.sampling_session_id = '{sampler}' AND o.seq_id = 1")
    R.check(again == first and ran_on == str(j2_id),
            f"the draining executor handed the snapshot over: a sample from it runs on the other executor"
            f" ({time.time() - t0:.1f} s), with the same tokens ({again} == {first})")
    R.check(s.psql(f"SELECT executor_id IS NULL AND snapshot_digest IS NOT NULL FROM sampling_sessions"
                   f" WHERE id = '{sampler}'") == "t", "the sampling session names the snapshot's blob instead")
    # A snapshot the draining executor does not hold (evicted before the drain) cannot be
    # handed over: its sample waits, and the future says why (after its 25 s long poll).
    stuck = snapshot(c, models[1])
    s.psql(f"UPDATE sampling_sessions SET executor_id = {up_llama} WHERE id = '{stuck}'")
    stuck_rid = c.post("/api/v1/asample", {"sampling_session_id": stuck, "seq_id": 0, "num_samples": 1,
                                           "prompt": {"chunks": [{"tokens": [1, 2]}]},
                                           "sampling_params": {"max_tokens": 2}})["request_id"]
    waiting = {}
    poll = threading.Thread(target=lambda: waiting.update(c.post("/api/v1/retrieve_future",
                                                                 {"request_id": stuck_rid})))
    poll.start()
    st, ready = s.get("/api/v1/readyz", key=None)
    llama_row = [m for m in ready["base_models"] if m["name"] == LLAMA]
    R.check(st == 200 and llama_row and llama_row[0]["executors"] == 1 and llama_row[0]["draining"] == 1,
            f"readyz counts the draining executor apart: {llama_row}")
    # A model placed on the draining executor that holds nothing of it (placed just before
    # the drain, or its slot dropped): the executor lets go of it too.
    s.psql(f"UPDATE models SET executor_id = {up_llama} WHERE id = '{models[0].id}'")
    R.check(wait_for(lambda: s.psql(f"SELECT coalesce(executor_id, 0) FROM models WHERE id = '{models[0].id}'")
                     != str(up_llama), 10),
            "the draining executor lets go of a model placed there without a slot")
    for m in models:
        m.step()
    R.check(placement(s, models).get(up_llama, 0) == 0, f"no model runs on the drained executor: {placement(s, models)}")
    log = open(os.path.join(s.dir, "joined-2.log"), errors="replace").read()
    R.check(wait_for(lambda: "evicted: memory is short" in open(os.path.join(s.dir, "joined-2.log"),
                                                                  errors="replace").read(), 20),
            "over its memory budget the small executor evicts idle models to the blob store")
    evicted = int(s.psql(f"SELECT count(*) FROM models WHERE id IN ({','.join(repr(m.id) for m in models)})"
                         " AND executor_id IS NULL"))
    R.check(evicted >= 3, f"{evicted} models evicted (placed nowhere until their next operation)")
    poll.join()
    reason = waiting.get("queue_state_reason", "")
    R.check(waiting.get("type") == "try_again" and waiting.get("queue_state") == "paused_capacity" and
            "up-0" in reason and "draining" in reason and "loom executor undrain up-0" in reason,
            f"a sample whose snapshot only the draining executor holds waits, and its future says why: {waiting}")
    loom_cli(s, "executor", "undrain", "up-0")
    stuck_res = c.result(stuck_rid)   # up-0 takes it again, and no longer holds the weights
    R.check("no longer in this executor's memory" in stuck_res.get("error", ""),
            f"after undrain it runs there, and fails saying the weights are gone: {stuck_res}")
    for m in models:
        m.step()
    log = open(os.path.join(s.dir, "joined-2.log"), errors="replace").read() + s.read_log()
    R.check(log.count("restored from its snapshot") >= 3, "evicted and moved models are restored from their snapshots")
    same = all(m.losses == models[0].losses for m in models)
    R.check(same and len(models[0].losses) == 4,
            f"all 6 models report the same 4 losses, through kill, drain and eviction: {models[0].losses}")
    R.check(s.psql("SELECT count(*) FROM operations WHERE state IN ('queued', 'claimed')") == "0",
            "no operation left pending")

    q = Model(c, sid, 6, base=QWEN)
    q.step()
    exe = s.psql(f"SELECT e.base_model FROM models m JOIN executors e ON e.id = m.executor_id WHERE m.id = '{q.id}'")
    R.check(exe == QWEN and q.losses[0] != models[0].losses[0], f"a Qwen3 model trains on the Qwen3 executor ({exe})")
    j2.terminate()
    j2.wait(30)


if __name__ == "__main__":
    main()
