"""Crashes: an acknowledged operation is never left pending forever, nor lost.

`loom up` restarts a child that dies. kill -9 of the executor: `loom up` marks it gone at
once, and the model's next operations run on the restarted executor, which restores the
model's state (docs/architecture.md, "Durable training state"; tests/durable_test.py
checks that bit for bit); no operation stays queued or claimed. kill -9 of the api: it
comes back on the same URL.
"""
import os, signal, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import wait_for, Stack, Results

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
        R.check("metrics" in f1 and f2.get("metrics", {}).get("step:max") == 2,
                f"the model's next step runs on the restarted executor, its state restored ({waited:.1f} s): {f1}, {f2}")
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
