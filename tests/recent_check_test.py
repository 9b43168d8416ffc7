"""A training loop's submits skip the model check the api made a moment before (issue 25:
one statement less per forward_backward and optim_step; tinker/api_ops.h,
op_model_check_recent), and still refuse, with the same messages, what changed since.

`loom up`; a model steps (forward_backward + optim_step) ten times in a row: PostgreSQL's
statement log shows the model check once or twice (it is believed for 2 s), not twenty
times. Then, each right after a step that left the check remembered:
- the model unloaded: a forward_backward is refused, 400, "unloaded" (not run, not queued);
- its session finished by its client: 400, "finished by its client";
- a tenant with a queued-operations limit is checked every time (its count changes).
"""
import os, re, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import LOOM_BIN, Stack, Results
from wire import forward_backward

SEQ = [(3 * j + 5) % 250 + 1 for j in range(9)]
DATA = [(SEQ[:-1], {"target_tokens": ("int64", SEQ[1:])})]
ADAM = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
CHECK = "SELECT m.status, b.vocab_size"   # SQL_MODEL_FOR_OP's start


def new_model(s, seq, key="default"):
    sid = s.post("/api/v1/create_session", {}, key=key)[1]["session_id"]
    st, fut = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": "loom/tiny-llama",
                                              "lora_config": {"rank": 4, "seed": seq}}, key=key)
    return sid, s.result(fut["request_id"], key=key)["model_id"]


def step(s, mid, seq):
    """A forward_backward and an optim_step, both awaited: (status of each submit)."""
    st1, f1 = forward_backward(s, mid, seq, DATA, "cross_entropy", False)
    st2, f2 = s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": seq + 1, "adam_params": ADAM})
    if st1 == 200:
        s.result(f1["request_id"])
    if st2 == 200:
        s.result(f2["request_id"])
    return st1, st2


def statement_log(s):
    with open(os.path.join(s.dir, "postgres.log"), errors="replace") as f:
        return f.read()


def main():
    R = Results()
    with Stack() as s:
        sid, mid = new_model(s, 1)
        step(s, mid, 1)
        s.psql("ALTER SYSTEM SET log_min_duration_statement = 0")
        s.psql("SELECT pg_reload_conf()")
        time.sleep(0.5)
        mark = len(statement_log(s))
        t0 = time.time()
        seq, ok = 3, True
        for _ in range(10):
            ok &= step(s, mid, seq) == (200, 200)
            seq += 2
        took = time.time() - t0
        log = statement_log(s)[mark:]
        checks = len(re.findall(r"execute [^:]*: " + re.escape(CHECK), log))
        # The control: a model the api has not checked yet is checked (the log shows it).
        _, other = new_model(s, 9)
        mark = len(statement_log(s))
        step(s, other, 1)
        control = len(re.findall(r"execute [^:]*: " + re.escape(CHECK), statement_log(s)[mark:]))
        s.psql("ALTER SYSTEM RESET log_min_duration_statement")
        s.psql("SELECT pg_reload_conf()")
        R.check(ok, "ten steps submitted")
        R.check(control >= 1, f"a new model's first step is checked ({control} checks in the log)")
        R.check(checks <= 1 + int(took / 2.0),
                f"20 submits in {took:.1f} s checked the model {checks} times (believed for 2 s)")

        # Unloaded right after a step: refused as unloaded, not queued.
        step(s, mid, seq)
        seq += 2
        st, _ = s.post("/api/v1/unload_model", {"model_id": mid})
        R.check(st == 200, f"unload_model: {st}")
        st, body = forward_backward(s, mid, seq, DATA, "cross_entropy", False)
        R.check(st == 400 and "unloaded" in str(body), f"a forward_backward right after the unload: {st} {body}")
        queued = s.psql(f"SELECT count(*) FROM operations WHERE model_id = '{mid}' AND state IN ('queued', 'claimed')")
        R.check(queued.strip() == "0", f"nothing of the unloaded model waits in the queue ({queued.strip()})")

        # Its session finished right after a step.
        sid2, mid2 = new_model(s, 2)
        step(s, mid2, 1)
        st, _ = s.post(f"/api/v1/sessions/{sid2}/finish", {"reason": {"type": "success"}})
        R.check(st == 200, f"sessions/{{id}}/finish: {st}")
        st1, body = forward_backward(s, mid2, 3, DATA, "cross_entropy", False)
        R.check(st1 == 400 and "finished by its client" in str(body),
                f"a forward_backward right after its session finished: {st1} {body}")
        st2, body = s.post("/api/v1/optim_step", {"model_id": mid2, "seq_id": 4, "adam_params": ADAM})
        R.check(st2 == 400 and "finished by its client" in str(body), f"and an optim_step: {st2} {body}")

        # A tenant with a queued-operations limit: its count is read at every submit.
        env = dict(os.environ, DATABASE_URL=s.db)
        subprocess.run([LOOM_BIN, "tenant", "set-limits", "default", "--max-queued-ops", "1"], env=env,
                       capture_output=True, check=True)
        sid3, mid3 = new_model(s, 3)
        with s.queue_held():
            st1, _ = forward_backward(s, mid3, 1, DATA, "cross_entropy", False)
            st2, body = forward_backward(s, mid3, 2, DATA, "cross_entropy", False)
        R.check(st1 == 200 and st2 == 429, f"with --max-queued-ops 1 the second submit waits its turn: {st1} {st2} {body}")
    R.finish()


if __name__ == "__main__":
    main()
