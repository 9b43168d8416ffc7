#!/usr/bin/env python3
"""supervise_test.py: `loom up` keeps the service running.

- An executor that stops heartbeating (SIGSTOP: a hung device) is written off by the
  scheduler after 30 s and never scheduled again; loom up kills it and starts a fresh one,
  and training goes on.
- A child that dies again and again is restarted with a growing backoff and never given
  up on: kill -9 of the api six times within a minute (what six size bombs did before
  they were refused) leaves Loom up, on the same URL.
Prints "N passed, N failed" last.
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from stack import Results, Stack  # noqa: E402

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
    R.finish()


if __name__ == "__main__":
    main()
