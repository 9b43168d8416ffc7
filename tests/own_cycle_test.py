"""An idle executor builds its own cycle, and a small result travels in its notification
(issue 25, the shorter path for a lone operation; docs/architecture.md, "One
forward_backward, end to end").

`loom up`; a model's first operation places it on the executor (the scheduler's work).
Then the scheduler is stopped (SIGSTOP): forward_backwards of the placed model still run,
one after another, since a submit wakes the idle executor, which claims and starts the
cycle itself (before, every one waited for the scheduler). Every answer that came
through the notification (the first retrieve_future, parked until the result's commit) is
byte for byte the answer read back from the row afterwards, in JSON and in protobuf, for
forward_backward (the packed result) and optim_step (the stored JSON). Steps of a model
that sends its optim_step right after its forward_backward (rule 5) are held and paired by
the executor itself: both in one cycle, and a forward_backward whose step never comes runs
once the hold ends, the scheduler still stopped. A model that is not placed yet still
needs the scheduler: its submit waits while the scheduler is stopped and runs once it is
back. Each lone forward_backward, and each paired step, is claimed from its submits'
hints in one round trip (`claim=hint` in the executor's cycle line). Work submitted while
the executor runs a cycle of the scheduler's is claimed by the executor's own pass right
after that cycle's commit, the scheduler stopped (within 250 ms: the executor's poll, the
fallback, is 500 ms).
"""
import os, re, signal, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import Stack, Results
from wire import forward_backward, raw_answer as answer

SEQ = [(5 * j + 3) % 250 + 1 for j in range(13)]


def claims(s, request_ids):
    """How the cycles of these operations were claimed, by the executor's "cycle done"
    lines (claim=scheduler, own: its own pass, hint: planned from the submits' hints)."""
    ids = ",".join(f"'{r}'" for r in request_ids)
    cycles = set(s.psql(f"SELECT DISTINCT cycle_id FROM operations WHERE request_id IN ({ids})").split())
    with open(os.path.join(s.dir, "up.log"), errors="replace") as f:
        found = dict(re.findall(r"cycle done.* cycle=(\d+) claim=(\w+)", f.read()))
    return [found.get(c) for c in sorted(cycles)]
DATA = [(SEQ[:-1], {"target_tokens": ("int64", SEQ[1:])})]
ADAM = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}


def main():
    R = Results()
    with Stack() as s:
        st, sess = s.post("/api/v1/create_session", {})
        sid = sess["session_id"]
        st, fut = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": "loom/tiny-llama",
                                                  "lora_config": {"rank": 4, "seed": 1}})
        mid = s.result(fut["request_id"])["model_id"]
        st, fut = forward_backward(s, mid, 1, DATA, "cross_entropy", False)
        R.check(st == 200 and answer(s, fut["request_id"], False) is not None, "the first forward_backward ran")
        sched = s.children()["scheduler"]
        os.kill(sched, signal.SIGSTOP)
        try:
            seq = 2
            lone = []
            for k in range(6):
                proto = k % 2 == 1
                t0 = time.time()
                st, fut = forward_backward(s, mid, seq, DATA, "cross_entropy", False)
                first = answer(s, fut["request_id"], proto) if st == 200 else None
                lone.append(fut["request_id"])
                R.check(first is not None and first[0] == 200,
                        f"forward_backward {seq} ran with the scheduler stopped ({time.time() - t0:.2f} s)")
                s.forget_notes()   # the second look reads the row (else the api answers from memory)
                again = answer(s, fut["request_id"], proto)
                R.check(first == again, f"forward_backward {seq} ({'protobuf' if proto else 'JSON'}): the answer"
                        " woken by the notification is the row's, byte for byte")
                seq += 1
            how = claims(s, lone)
            R.check(how == ["hint"] * 6, f"each lone forward_backward was planned from its submit's hint and claimed"
                    f" in one round trip: {how}")
            st, fut = s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": seq, "adam_params": ADAM})
            first = answer(s, fut["request_id"], False)
            R.check(first is not None and b"metrics" in first[1], f"optim_step ran with the scheduler stopped: {first}")
            s.forget_notes()
            R.check(first == answer(s, fut["request_id"], False), "optim_step: the notified answer is the row's")
            # A model not placed yet: placement is the scheduler's.
            st, fut = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 1,
                                                      "base_model": "loom/tiny-llama", "lora_config": {"rank": 4}})
            R.check(answer(s, fut["request_id"], False, timeout=2) is None,
                    "a new model's create_model waits while the scheduler is stopped")
        finally:
            os.kill(sched, signal.SIGCONT)
        R.check(answer(s, fut["request_id"], False) is not None, "and runs once the scheduler is back")

        # Rule 5 without the scheduler. Steps (forward_backward + optim_step back to back)
        # teach the model that its optim_step follows; then, the scheduler stopped, the
        # idle executor holds each forward_backward for its step itself (both in one
        # cycle), and a forward_backward whose step never comes still runs once its hold
        # ends: the executor looks again on its own (it used to wait for the scheduler).
        seq = int(s.psql(f"SELECT max(seq_id) + 1 FROM operations WHERE model_id = '{mid}'"))

        def step():
            nonlocal seq
            st, f1 = forward_backward(s, mid, seq, DATA, "cross_entropy", False)
            st2, f2 = s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": seq + 1, "adam_params": ADAM})
            a1, a2 = answer(s, f1["request_id"], False, timeout=5), answer(s, f2["request_id"], False, timeout=5)
            seq += 2
            cycles = s.psql(f"SELECT count(DISTINCT cycle_id) FROM operations WHERE request_id IN"
                            f" ('{f1['request_id']}', '{f2['request_id']}')")
            return a1 is not None and a2 is not None, cycles, [f1["request_id"], f2["request_id"]]
        for k in range(4):
            ran, _, _ = step()
            R.check(ran, f"step {k} ran")
        pair_p = float(s.psql(f"SELECT pair_p FROM models WHERE id = '{mid}'"))
        R.check(pair_p > 0.5, f"the model learned that its optim_step follows (pair_p {pair_p:.2f})")
        os.kill(sched, signal.SIGSTOP)
        try:
            for k in range(3):
                ran, cycles, rids = step()
                R.check(ran and cycles == "1", f"with the scheduler stopped, step {k} ran in one cycle ({cycles})")
                how = claims(s, rids)
                R.check(how == ["hint"], f"step {k}: its forward_backward, held, and its optim_step were claimed from"
                        f" their hints ({how})")
            t0 = time.time()
            st, fut = forward_backward(s, mid, seq, DATA, "cross_entropy", False)
            lone = answer(s, fut["request_id"], False, timeout=5)
            R.check(lone is not None and lone[0] == 200, "a forward_backward whose step never comes runs once its"
                    f" hold ends, the scheduler stopped ({time.time() - t0:.2f} s)")
        finally:
            os.kill(sched, signal.SIGCONT)

        # Work that waits while the executor runs a cycle of the scheduler's is claimed by
        # the executor itself right after that cycle's commit (SQL_EXE_WORK_WAITS), the
        # scheduler stopped: not after the executor's 500 ms poll. A new model's first
        # cycle is the scheduler's (placement); a long forward_backward keeps it busy while
        # the trained model's step is submitted (to the scheduler: the executor is busy).
        os.kill(sched, signal.SIGSTOP)
        try:
            st, fut_b = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 2,
                                                        "base_model": "loom/tiny-llama", "lora_config": {"rank": 4}})
            mb = f"{sid}:train:2"
            big = [([(7 * j + k) % 250 + 1 for j in range(64)],
                    {"target_tokens": ("int64", [(7 * j + k) % 250 + 1 for j in range(1, 65)])}) for k in range(256)]
            st, fb_b = forward_backward(s, mb, 1, big, "cross_entropy", False)
            R.check(st == 200, f"a long forward_backward of a model not placed yet is queued ({st})")
            os.kill(sched, signal.SIGCONT)
            for _ in range(500):
                if s.psql(f"SELECT state FROM operations WHERE request_id = '{fb_b['request_id']}'") != "queued":
                    break
                time.sleep(0.01)
            os.kill(sched, signal.SIGSTOP)
            seq += 1   # past the lone forward_backward above
            st, f1 = forward_backward(s, mid, seq, DATA, "cross_entropy", False)
            st2, f2 = s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": seq + 1, "adam_params": ADAM})
            rids = [f1["request_id"], f2["request_id"]]
            a1, a2 = answer(s, rids[0], False, timeout=10), answer(s, rids[1], False, timeout=10)
            R.check(a1 is not None and a2 is not None, "the step submitted meanwhile ran, the scheduler stopped")
            row = s.psql(f"SELECT (SELECT max(o.created_at) < c.finished_at FROM operations o WHERE o.request_id IN"
                         f" ('{rids[0]}', '{rids[1]}')), round(extract(epoch FROM (SELECT min(n.started_at) FROM cycles n"
                         f" JOIN operations o ON o.cycle_id = n.id WHERE o.request_id IN ('{rids[0]}', '{rids[1]}'))"
                         f" - c.finished_at) * 1000) FROM cycles c JOIN operations b ON b.cycle_id = c.id"
                         f" WHERE b.request_id = '{fb_b['request_id']}'").split("|")
            R.check(row[0] == "t" and claims(s, [fb_b["request_id"]]) == ["scheduler"],
                    f"it was queued while the executor ran the scheduler's cycle ({row}, {claims(s, [fb_b['request_id']])})")
            R.check(claims(s, rids) == ["own"] and int(row[1]) < 250,
                    f"and the executor's own pass claimed it {row[1]} ms after that cycle ended ({claims(s, rids)})")
        finally:
            os.kill(sched, signal.SIGCONT)
    R.finish()


if __name__ == "__main__":
    main()
