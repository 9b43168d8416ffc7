"""Crashes: an acknowledged operation is never left pending forever.

`loom up` restarts a child that dies. kill -9 of the executor loses the training state
it held in memory: the operations of that model fail with a message saying so (after the
reaper notices the silent executor), a new model trains on the restarted executor, and no
operation stays queued or claimed. kill -9 of the api: it comes back on the same URL.
"""
import os, signal, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import Stack, Results

DATA = [{"model_input": {"chunks": [{"tokens": [1, 2, 3, 4]}]},
         "loss_fn_inputs": {"target_tokens": {"data": [2, 3, 4, 5], "dtype": "int64"}}}]


def new_model(s):
    sid = s.post("/api/v1/create_session", {})[1]["session_id"]
    fut = s.post("/api/v1/create_model", {"session_id": sid, "base_model": "loom/tiny-llama",
                                          "lora_config": {"rank": 4}})[1]
    return s.result(fut["request_id"])["model_id"]


def step(s, model_id, seq):
    fb = s.post("/api/v1/forward_backward", {"model_id": model_id, "seq_id": seq,
                                             "forward_backward_input": {"data": DATA, "loss_fn": "cross_entropy"}})[1]
    op = s.post("/api/v1/optim_step", {"model_id": model_id, "seq_id": seq + 1})[1]
    return s.result(fb["request_id"], timeout=120), s.result(op["request_id"], timeout=120)


def wait_for(cond, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.5)
    return False


def main():
    R = Results()
    with Stack() as s:
        a = new_model(s)
        r1, r2 = step(s, a, 1)
        R.check("metrics" in r1 and "metrics" in r2, "a step before the crash")
        pid = int(s.psql("SELECT pid FROM executors WHERE state <> 'gone' ORDER BY id DESC LIMIT 1"))
        os.kill(pid, signal.SIGKILL)
        R.check(wait_for(lambda: s.psql(f"SELECT count(*) FROM executors WHERE state = 'idle' AND pid <> {pid}") == "1",
                         30), "loom up restarted the executor")
        t0 = time.time()
        f1, f2 = step(s, a, 3)
        waited = time.time() - t0
        R.check(f1.get("category") == "server" and "state is lost" in f1.get("error", ""),
                f"the lost model's next operation fails with a message after {waited:.0f} s: {f1}")
        R.check("error" in f2, "so does the optim_step after it")
        b = new_model(s)
        r1, r2 = step(s, b, 1)
        R.check("metrics" in r1 and "metrics" in r2, "a new model trains on the restarted executor")
        pending = s.psql("SELECT count(*) FROM operations WHERE state IN ('queued', 'claimed')")
        R.check(pending == "0", f"no operation left pending ({pending})")

        # The api: the `loom api` child of this stack's `loom up`.
        api = s.children().get("api")
        R.check(api is not None, f"found the api process ({api})")
        if api:
            os.kill(api, signal.SIGKILL)
            R.check(wait_for(lambda: _alive(s), 30),
                    f"the api came back on the same URL ({s.url})")
            r1, r2 = step(s, b, 3)
            R.check("metrics" in r1, "training goes on through the restarted api")
    R.finish()


def _alive(s):
    try:
        return s.get("/api/v1/healthz", timeout=2)[0] == 200
    except Exception:
        return False


if __name__ == "__main__":
    main()
