"""Training survives anything (docs/architecture.md, "Durable training state").

Two tenants train at once, each a 40-step SFT loop on the wire (forward_backward +
optim_step back to back, then save_weights), once undisturbed and then through each of:
kill -9 of the executor while it runs a cycle, kill -9 of the scheduler, kill -9 of the
api, and PostgreSQL killed (-9 of the postmaster) for 10 s and started again. Every loop
must finish, and each tenant's per-step losses, optimizer steps and final checkpoint (the
blob is content-addressed: the same digest is the same weights and Adam state, bit for
bit) must equal the undisturbed run's; every optim_step is applied exactly once and no
operation is left pending. And once the service has recovered, steps take as long as
undisturbed ones (the median of the last 10 steps within 1.5x + 100 ms of the undisturbed
run's, measured in this run: a PostgreSQL restart that left the executor's session
without its LISTEN made every later step wait for the 500 ms poll).

Then each of api, scheduler and executor is paused (SIGSTOP) for 2 s and continued: none
of them is restarted (the api's event loops took the interrupted wait as fatal), and the
loops finish as above.

Last, the blob store fails for three steps (its tmp directory replaced by a file): the
snapshot due then is tried again with each step and written with the first step after the
store is mended, not --snapshot-every steps later; the failure is logged once. A
save_weights meanwhile fails with the reason, and no path of the server's file system.
"""
import os, signal, statistics, subprocess, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import Stack, Results, LOOM_BIN, wait_for
from apitest import loom_cli
from resilient import Client, Psql, sft_loop, datum, ADAM

STEPS = 40
DISRUPT_AT = 12   # tenant A's step after which the disruption starts
R = Results()


def scenario(s, keys, name, disrupt=None):
    out, errors, trigger = {}, [], threading.Event()

    def tenant(tag, key, seed):
        try:
            c = Client(s.url, key)
            hook = (lambda k: trigger.set() if k == DISRUPT_AT else None) if tag == "A" else None
            times = []
            out[tag] = sft_loop(c, tag, seed, STEPS, on_step=hook, times=times) + (c.retries, times)
        except Exception as e:   # reported below as a failed check
            errors.append(f"{tag}: {e}")
            trigger.set()

    t0 = time.time()
    ts = [threading.Thread(target=tenant, args=(tag, key, seed)) for tag, key, seed in
          (("A", keys[0], 101), ("B", keys[1], 202))]
    for t in ts:
        t.start()
    note = ""
    if disrupt:
        trigger.wait(120)
        note = disrupt(s)
    for t in ts:
        t.join(600)
    took = time.time() - t0
    R.check(not errors and len(out) == 2, f"{name}: both loops finish ({took:.1f} s{note}) {errors}")
    return out


def digest(s, path):
    return s.psql(f"SELECT blob_digest || ' step ' || step FROM adapter_versions"
                  f" WHERE tinker_path = '{path}' AND deleted_at IS NULL")


def compare(s, name, base, got):
    for tag in ("A", "B"):
        if tag not in got:
            continue
        mid, losses, steps, path, retries, times = got[tag]
        _, blosses, bsteps, bpath, _, btimes = base[tag]
        same = [i + 1 for i in range(STEPS) if losses[i] != blosses[i]]
        R.check(not same and steps == bsteps == list(range(1, STEPS + 1)),
                f"{name}: tenant {tag}'s {STEPS} losses and steps equal the undisturbed run's exactly"
                f" (client retried {retries} requests)" + (f"; differ at steps {same[:5]}" if same else ""))
        R.check(digest(s, path) == digest(s, bpath) != "",
                f"{name}: tenant {tag}'s final weights and Adam state are bitwise the undisturbed run's"
                f" ({digest(s, path)[:16]}...)")
        applied = s.psql(f"SELECT count(*) FROM operations WHERE model_id = '{mid}' AND kind = 'optim_step'"
                         f" AND state = 'done' AND applied")
        R.check(applied == str(STEPS), f"{name}: tenant {tag}: each of the {STEPS} optim_steps applied once ({applied})")
        after, before = statistics.median(times[-10:]), statistics.median(btimes[-10:])
        R.check(after < 1.5 * before + 0.1, f"{name}: tenant {tag}'s last 10 steps take as long as undisturbed ones"
                f" (median {after * 1000:.0f} ms, undisturbed {before * 1000:.0f} ms)")
    pending = s.psql("SELECT count(*) FROM operations WHERE state IN ('queued', 'claimed')")
    R.check(pending == "0", f"{name}: no operation left pending ({pending})")


def kill_executor_mid_cycle(s):
    """kill -9 of the executor while a cycle of it is running (watched in the database)."""
    q = Psql(s.db)
    deadline, hit = time.time() + 60, None
    while time.time() < deadline and not hit:
        rows = q.query("SELECT c.id, e.pid FROM cycles c JOIN executors e ON e.id = c.executor_id"
                       " WHERE c.state = 'running' LIMIT 1")
        if rows:
            cyc, pid = rows[0].split("|")
            os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.5)   # a COMMIT already sent completes without its process
            # Under load the cycle may have committed between the query and the kill: then
            # this was no mid-cycle kill; try again with the executor loom up restarts.
            if q.query(f"SELECT state FROM cycles WHERE id = {cyc}") != ["done"]:
                hit = cyc
    q.close()
    s.killed_cycle = hit
    return f", executor killed during cycle {hit}"


def kill_role(role):
    def go(s):
        pid = s.children().get(role)
        os.kill(pid, signal.SIGKILL)
        return f", {role} pid {pid} killed"
    return go


def postgres_outage(s):
    """kill -9 of the postmaster while a cycle runs (its commit then fails and is retried
    on a reset connection), down for 10 s."""
    with open(os.path.join(s.dir, "pg", "postmaster.pid")) as f:
        pid = int(f.readline())
    q = Psql(s.db)
    wait_for(lambda: q.query("SELECT count(*) FROM cycles WHERE state = 'running'") != ["0"], 30, step=0.01)
    os.kill(pid, signal.SIGKILL)
    q.close()
    time.sleep(10)
    for _ in range(30):   # the old backends leave within a moment of the postmaster
        p = subprocess.run([LOOM_BIN, "pg", "start", "--data-dir", s.dir], capture_output=True, text=True)
        if p.returncode == 0:
            return f", postmaster {pid} killed, down 10 s"
        time.sleep(0.5)
    raise RuntimeError("PostgreSQL did not start again: " + p.stderr)


def pause_each(s):
    """SIGSTOP for 2 s, then SIGCONT, of the api, the scheduler and the executor in turn."""
    s.paused = s.children()
    for role in ("api", "scheduler", "executor"):
        os.kill(s.paused[role], signal.SIGSTOP)
        time.sleep(2)
        os.kill(s.paused[role], signal.SIGCONT)
        time.sleep(1)
    return ", api, scheduler and executor each paused for 2 s"


def snapshot_write_fault(s):
    """Snapshots every 5 steps; the blob store cannot be written during steps 5-7."""
    c = Client(s.url, s.key)
    sid = c.post("/api/v1/create_session", {"tags": ["fault"]})["session_id"]
    mid = c.call("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": "loom/tiny-llama",
                                          "lora_config": {"rank": 4, "seed": 3}})["model_id"]

    def step(k, seq=None):
        seq = seq or 2 * k - 1
        fb = c.call("/api/v1/forward_backward", {"model_id": mid, "seq_id": seq, "forward_backward_input": {
            "data": [datum("f", k, i) for i in range(4)], "loss_fn": "cross_entropy"}})
        op = c.call("/api/v1/optim_step", {"model_id": mid, "seq_id": seq + 1, "adam_params": ADAM})
        assert "error" not in fb and op["metrics"]["step:max"] == k, (fb, op)

    snap = lambda: s.psql(f"SELECT step FROM model_snapshots WHERE model_id = '{mid}'")
    tmp = os.path.join(s.dir, "blobs", "tmp")
    for k in range(1, 5):
        step(k)
    logged = s.read_log().count("not written")
    os.rename(tmp, tmp + ".away")
    open(tmp, "w").close()   # every blob put makes its temporary file in tmp/: now none can
    try:
        for k in range(5, 8):
            step(k)
            time.sleep(0.3)   # the writer thread tries (and fails) before the next step
        # A checkpoint cannot be written either: the client hears why, not where.
        save = c.call("/api/v1/save_weights", {"model_id": mid, "seq_id": 15, "path": "while-broken"})
        msg = str(save.get("error", ""))
        R.check(msg and "blob store" in msg and s.dir not in msg and "/tmp" not in msg,
                f"a save while the blob store fails: the error gives the reason, no server path ({msg[:200]})")
        R.check(s.dir in s.read_log(), "the operator's log has the path")
    finally:
        os.remove(tmp)
        os.rename(tmp + ".away", tmp)
    R.check(snap() == "", "while the blob store fails no snapshot is recorded")
    step(8, seq=16)
    R.check(wait_for(lambda: snap() in ("7", "8"), 10),
            f"the snapshot due at step 5 is written with step 8, the first after the store is mended"
            f" (not at step 10): its step is {snap() or 'none'}")
    failures = s.read_log().count("not written") - logged
    R.check(failures == 1, f"the failed writes (steps 5 to 7) are logged once ({failures})")


def main():
    # Snapshots every 5 steps: the recovery below restores one and replays the rest.
    with Stack(["--snapshot-every", "5"]) as s:
        secret = os.path.join(s.dir, "secret.key")
        loom_cli(s, "tenant", "create", "tenant-b")
        kb = loom_cli(s, "key", "create", "--tenant", "tenant-b", "--secret-file", secret)
        keys = (s.key, kb)
        base = scenario(s, keys, "undisturbed")
        if len(base) != 2:
            R.finish()
        s.killed_cycle = None
        got = scenario(s, keys, "executor kill -9 mid-cycle", kill_executor_mid_cycle)
        R.check(s.killed_cycle is not None and s.psql(f"SELECT state FROM cycles WHERE id = {s.killed_cycle}")
                == "expired", f"the killed executor's cycle {s.killed_cycle} expired and its operations ran again")
        compare(s, "executor kill -9", base, got)
        log = s.read_log()
        R.check(log.count("restored from its snapshot after seq_id") >= 2 and "operation(s) replayed" in log,
                "the restarted executor restored both models from their snapshots and a replay")
        R.check("not written" not in log, "every snapshot was written")
        R.check("replaying forward_backward" not in log, "every replayed forward_backward reported its original loss")
        compare(s, "scheduler kill -9", base, scenario(s, keys, "scheduler kill -9", kill_role("scheduler")))
        compare(s, "api kill -9", base, scenario(s, keys, "api kill -9", kill_role("api")))
        compare(s, "PostgreSQL killed for 10 s", base, scenario(s, keys, "PostgreSQL killed for 10 s", postgres_outage))
        got = scenario(s, keys, "pause and continue of each process", pause_each)
        compare(s, "pause and continue", base, got)
        now = s.children()
        R.check(all(now.get(r) == s.paused[r] for r in ("api", "scheduler", "executor")),
                f"no paused process was restarted ({s.paused} -> {now})")
        exits = s.read_log().count("exited unexpectedly")
        print(f"     (loom up restarted children {exits} times in all)")
        snapshot_write_fault(s)
    R.finish()


if __name__ == "__main__":
    main()
