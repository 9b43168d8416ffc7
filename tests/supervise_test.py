#!/usr/bin/env python3
"""supervise_test.py: `loom up` keeps the service running.

- An executor that stops heartbeating (SIGSTOP: a hung device) is written off by the
  scheduler after 30 s and never scheduled again; loom up kills it and starts a fresh one,
  and training goes on.
- A child that dies again and again is restarted with a growing backoff and never given
  up on: kill -9 of the api six times within a minute (what six size bombs did before
  they were refused) leaves Loom up, on the same URL.
- The backoff stays low and starts over after a healthy run: the executor killed eight
  times in a row waits at most 4 s to be restarted (it reached 30 s, stalling every
  tenant), and killed again after 12 s of running, 0.25 s (a minute used to be needed).
- One `loom up` per data directory: a second one is refused, naming the first (it used to
  start a second api and executors of the same names on the shared PostgreSQL).
- kill -9 of `loom up`: its children stop with it (they kept running, and the next
  `loom up` started a second set beside them); one that outlives it (here: stopped with
  SIGSTOP, so that it cannot act on its SIGTERM) is stopped by the next `loom up` of the
  directory before it starts its own.
Prints "N passed, N failed" last.
"""
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from stack import LOOM_BIN, Results, Stack, backend_args  # noqa: E402

R = Results()
DATA = [{"model_input": {"chunks": [{"tokens": [1, 2, 3, 4]}]},
         "loss_fn_inputs": {"target_tokens": {"data": [2, 3, 4, 5], "dtype": "int64"}}}]


def wait_for(cond, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if cond():
                return True
        except Exception:  # the api restarting: connection refused
            pass
        time.sleep(0.2)
    return False


def train_step(s):
    """A new model and one forward_backward + optim_step; True if both complete."""
    try:
        sid = s.post("/api/v1/create_session", {})[1]["session_id"]
        fut = s.post("/api/v1/create_model", {"session_id": sid, "base_model": "loom/tiny-llama",
                                              "lora_config": {"rank": 4}})[1]
        model = s.result(fut["request_id"], timeout=90)["model_id"]
        fb = s.post("/api/v1/forward_backward", {"model_id": model, "seq_id": 1, "forward_backward_input": {
            "data": DATA, "loss_fn": "cross_entropy"}})[1]
        op = s.post("/api/v1/optim_step", {"model_id": model, "seq_id": 2})[1]
        return "metrics" in s.result(fb["request_id"], timeout=90) and "metrics" in s.result(op["request_id"], timeout=90)
    except (OSError, RuntimeError, TimeoutError, KeyError) as e:
        print("      train_step:", e)
        return False


def main():
    with Stack() as s:
        R.check(train_step(s), "training works")

        # ---- an executor that stops ----------------------------------------------------------
        exe = s.children().get("executor")
        os.kill(exe, signal.SIGSTOP)
        t0 = time.time()
        try:
            replaced = wait_for(lambda: s.psql(
                f"SELECT count(*) FROM executors WHERE state = 'idle' AND pid <> {exe}"
                f" AND heartbeat_at > now() - interval '10 seconds'") == "1", 75)
            took = time.time() - t0
            R.check(replaced, f"a stopped executor is replaced ({took:.0f} s)")
            R.check(not os.path.exists(f"/proc/{exe}") or
                    open(f"/proc/{exe}/stat").read().rsplit(")", 1)[1].split()[0] == "Z",
                    "the stopped executor was killed")
            R.check(s.children().get("executor") not in (None, exe), "loom up runs a new executor")
            R.check(train_step(s), "training completes on the new executor")
        finally:
            try:
                os.kill(exe, signal.SIGCONT)
            except ProcessLookupError:
                pass

        # ---- a crash loop of the api ---------------------------------------------------------
        t0 = time.time()
        restarted = 0
        for _ in range(6):
            pid = s.children().get("api")
            if not pid:
                break
            os.kill(pid, signal.SIGKILL)
            if not wait_for(lambda: s.children().get("api") not in (None, pid)
                            and s.get("/api/v1/healthz", key=None, timeout=2)[0] == 200, 40):
                break
            restarted += 1
        R.check(restarted == 6 and s.proc.poll() is None,
                f"the api killed 6 times in {time.time() - t0:.0f} s: restarted each time, loom up still up"
                f" ({restarted} restarts)")
        log = s.read_log()
        R.check("stopping Loom" not in log and "restarting it in" in log,
                "the log shows restarts with a backoff, and no giving up")
        R.check(train_step(s), "training works through the restarted api")

        executor_crash_loop(s)
        data_dir_lock(s)
        parent_killed(s)
    R.finish()


def restart_delays(log):
    return [float(x) for x in re.findall(r"executor exited unexpectedly .*?restarting it in ([0-9.]+) s", log)]


def executor_crash_loop(s):
    """kill -9 of each new executor as soon as it runs, eight times; then once more after
    it ran 12 s."""
    seen = len(restart_delays(s.read_log()))
    for _ in range(8):
        pid = s.children().get("executor")
        if not pid:
            break
        os.kill(pid, signal.SIGKILL)
        if not wait_for(lambda: s.children().get("executor") not in (None, pid), 30):
            break
    delays = restart_delays(s.read_log())[seen:]
    R.check(len(delays) == 8 and max(delays) <= 4.0,
            f"the executor killed 8 times in a row was restarted after at most 4 s each time ({delays})")
    wait_for(lambda: s.children().get("executor"), 60)
    pid = s.children().get("executor")
    R.check(pid and wait_for(lambda: s.psql(f"SELECT count(*) FROM executors WHERE pid = {pid} AND state = 'idle'")
                             == "1", 60), "the last one came up")
    if not pid:
        return
    time.sleep(12)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: len(restart_delays(s.read_log())) > seen + 8, 10)
    after = restart_delays(s.read_log())[seen + 8:]
    R.check(after == [0.25], f"after a healthy run of 12 s the backoff starts over: restarted in {after} s")
    R.check(train_step(s), "training works on the executor restarted last")


def data_dir_lock(s):
    """A second loom up on the same data directory."""
    kids = s.children()
    p = subprocess.Popen([LOOM_BIN, "up", "--data-dir", s.dir, "--port", "0"] + backend_args(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:   # it started: stop it (and whatever it started)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=90)
        err = "still running after 30 s: " + err[-300:]
    R.check(p.returncode not in (0, None) and f"in use by another `loom up` (pid {s.proc.pid}" in err,
            f"a second loom up on the data directory is refused, naming the first: {err.strip()[-300:]}")
    R.check(s.children() == kids, "the first one's children run on untouched")


def parent_killed(s):
    """kill -9 of loom up, one child stopped (SIGSTOP) so that it outlives it."""
    kids = s.children()
    os.kill(kids["scheduler"], signal.SIGSTOP)
    os.kill(s.proc.pid, signal.SIGKILL)
    s.proc.wait()
    alive = lambda pid: os.path.exists(f"/proc/{pid}") and \
        open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    others = {r: p for r, p in kids.items() if r != "scheduler"}
    R.check(wait_for(lambda: not any(alive(p) for p in others.values()), 30),
            f"kill -9 of loom up: its children stop with it ({others})")
    R.check(alive(kids["scheduler"]), "the stopped scheduler is still there")
    with Stack(data_dir=s.dir) as s2:
        R.check(not alive(kids["scheduler"]), "the next loom up of the directory stopped the scheduler left behind")
        mine = s2.children()
        R.check(set(mine) >= {"api", "scheduler", "executor"} and not set(mine.values()) & set(kids.values()),
                f"and runs its own children, one set ({mine})")
        R.check(train_step(s2), "training works under the new loom up")
        R.check(s2.psql("SELECT count(*) FROM executors WHERE state <> 'gone'") == "1",
                "one live executor registration")
    for p in kids.values():   # on a build that leaves them behind
        try:
            os.kill(p, signal.SIGCONT)
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    main()
