"""Submits of one session that arrive together are all taken (a live session is never
refused as expired because another submit touched it at the same moment).

A submit touches its session (last_heartbeat_at, at most every 5 s) in its own statement
and takes the work only if the session is live (tinker/api_sql.h, SQL_SESSION_TOUCH_LIVE).
When several submits of one session arrive at once with the touch due, one of them
writes it; the others wait for that row, find it touched, and must still see the session
as live: reading it with their statement's older snapshot showed a heartbeat over 5 s old,
and they were refused with 400 "expired with its session", the model declared lost to a
client whose session was alive (seen with loom_bench's 64 clients, 2 of them).

`loom up`; one session with 24 models; three times: the session silent for 6 s (the
touch due), then all 24 models submit a forward_backward at the same moment (a barrier,
one thread and HTTP connection each). Every submit must be accepted and run.
"""
import os, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import Stack, Results
from wire import forward_backward

SEQ = [(11 * j + 7) % 250 + 1 for j in range(9)]
DATA = [(SEQ[:-1], {"target_tokens": ("int64", SEQ[1:])})]
MODELS = 24


def main():
    R = Results()
    with Stack() as s:
        sid = s.post("/api/v1/create_session", {})[1]["session_id"]
        mids = []
        for n in range(MODELS):
            st, fut = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": n,
                                                      "base_model": "loom/tiny-llama", "lora_config": {"rank": 4}})
            mids.append(s.result(fut["request_id"])["model_id"])
        for rnd in range(3):
            time.sleep(6)   # the session's touch is due again
            gate = threading.Barrier(MODELS)
            out = [None] * MODELS

            def submit(i):
                gate.wait()
                out[i] = forward_backward(s, mids[i], rnd + 1, DATA, "cross_entropy", False)
            ts = [threading.Thread(target=submit, args=(i,)) for i in range(MODELS)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            refused = [(st, body) for st, body in out if st != 200]
            R.check(not refused, f"round {rnd + 1}: {MODELS} submits at once, {len(refused)} refused"
                    + (f" (first: {refused[0]})" if refused else ""))
            done = [s.result(body["request_id"]) for st, body in out if st == 200]
            R.check(len(done) == MODELS and all("loss_fn_outputs" in d or "metrics" in d for d in done),
                    f"round {rnd + 1}: every accepted one ran ({len(done)})")
    R.finish()


if __name__ == "__main__":
    main()
