"""retrieve_future answers what the api already knows without reading the row (issue 25:
no statement for a future in the common cases; tinker/api_futures_cache.h).

`loom up`; forward_backwards and an optim_step of one model, answered in JSON and in
protobuf. Then:
- a second look at each finished operation is answered from the result its loom_op_done
  carried: the request_id index of `operations` is not read for them (its idx_scan count,
  which a control of unknown request_ids moves by one each, stays put);
- with every database worker of the api waiting (a lock held on `operations`), those
  second looks are still answered, the same bytes: by the event loop, from memory;
- another tenant asking for those request_ids gets 404, as from the row;
- once the api has forgotten them (its LISTEN connection is cut: a reconnect may have
  missed notifications, so the cache is emptied), every answer read back from the row is
  byte for byte the one that came from memory;
- an operation submitted and not yet run (the queue held) is not answered (its long poll
  waits), and once it runs, its result.
"""
import json, os, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import LOOM_BIN, Stack, Results
from wire import forward_backward, post_raw, raw_answer as answer

SEQ = [(7 * j + 2) % 250 + 1 for j in range(11)]
DATA = [(SEQ[:-1], {"target_tokens": ("int64", SEQ[1:])})]
ADAM = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}


def index_reads(s):
    """idx_scan of operations' request_id index, once every backend has reported its
    counts (PostgreSQL flushes a backend's statistics within 10 s of it going idle)."""
    time.sleep(11)
    return int(s.psql("SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'operations_request_id_key'"))


def main():
    R = Results()
    with Stack() as s:
        sid = s.post("/api/v1/create_session", {})[1]["session_id"]
        st, fut = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": "loom/tiny-llama",
                                                  "lora_config": {"rank": 4, "seed": 3}})
        mid = s.result(fut["request_id"])["model_id"]
        ops = []   # (request_id, proto, first answer)
        for seq in range(1, 9):
            proto = seq % 2 == 0
            st, fut = forward_backward(s, mid, seq, DATA, "cross_entropy", False)
            first = answer(s, fut["request_id"], proto) if st == 200 else None
            R.check(first is not None and first[0] == 200, f"forward_backward {seq} answered")
            ops.append((fut["request_id"], proto, first))
        st, fut = s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": 9, "adam_params": ADAM})
        first = answer(s, fut["request_id"], False)
        R.check(first is not None and b"metrics" in first[1], f"optim_step answered: {first}")
        ops.append((fut["request_id"], False, first))

        # Second looks: from memory. The control: unknown request_ids read the index once each.
        before = index_reads(s)
        for rid, proto, first in ops:
            R.check(answer(s, rid, proto) == first, f"{rid}: the second look gives the same answer")
        unknown = 6
        for i in range(unknown):
            st, _, _ = post_raw(s, "/api/v1/retrieve_future", json.dumps({"request_id": f"req-nosuch{i}"}).encode(),
                                "application/json", "application/json")
            R.check(st == 404, f"an unknown request_id is 404 ({st})")
        reads = index_reads(s) - before
        R.check(unknown <= reads < unknown + len(ops) // 2,
                f"{len(ops)} finished operations answered without their rows: the request_id index was read "
                f"{reads} times for them and {unknown} unknown ids (each of those reads it)")

        # Every database worker held (a lock on operations, which unknown request_ids wait
        # on): a finished future is still answered, by the event loop from memory, without
        # waiting for a worker (api_pool_first_look).
        holder = subprocess.Popen(["psql", "-X", "-q", "-d", s.db, "-c",
                                   "BEGIN; LOCK TABLE operations IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(30)"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        waiting, blocked = [], 8   # more than the api's database workers (4)

        def blocked_look(i):
            st, _, _ = post_raw(s, "/api/v1/retrieve_future", json.dumps({"request_id": f"req-held{i}"}).encode(),
                                "application/json", "application/json")
            waiting.append(st)
        import threading
        ts = [threading.Thread(target=blocked_look, args=(i,)) for i in range(blocked)]
        try:
            deadline = time.time() + 20
            while time.time() < deadline and int(s.psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type"
                                                         " = 'Lock' AND query LIKE '%operations%'")) < 1:
                time.sleep(0.1)
            for t in ts:
                t.start()
            while time.time() < deadline and int(s.psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type"
                                                         " = 'Lock' AND application_name LIKE '%api%'")) < 4:
                time.sleep(0.1)
            held = int(s.psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                              " AND application_name LIKE '%api%'"))
            R.check(held >= 4, f"every api worker waits on the lock ({held} of them)")
            for rid, proto, first in ops[:3]:
                t0 = time.time()
                got = answer(s, rid, proto, timeout=5)
                R.check(got == first and time.time() - t0 < 3,
                        f"{rid}: answered while every worker waits ({time.time() - t0:.2f} s), the same answer")
            R.check(not waiting, f"the unknown request_ids still wait for the rows ({waiting})")
        finally:   # the lock's backend goes, not only its client (a sleeping backend would keep it)
            s.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(30)%'"
                   " AND pid <> pg_backend_pid()")
            holder.wait()
        for t in ts:
            t.join(60)
        R.check(sorted(waiting) == [404] * blocked, f"and get their 404 once the lock is gone: {waiting}")

        # Another tenant: 404, as the row's lookup answers.
        env = dict(os.environ, DATABASE_URL=s.db)
        subprocess.run([LOOM_BIN, "tenant", "create", "other"], env=env, capture_output=True, check=True)
        kb = subprocess.run([LOOM_BIN, "key", "create", "--tenant", "other", "--secret-file",
                             os.path.join(s.dir, "secret.key")], env=env, capture_output=True, text=True,
                            check=True).stdout.strip()
        for rid, _, _ in ops[:3]:
            st, body = s.post("/api/v1/retrieve_future", {"request_id": rid}, key=kb)
            R.check(st == 404, f"another tenant asking for {rid}: {st}")

        # Forgotten: read back from the rows, byte for byte what memory answered.
        s.forget_notes()
        for rid, proto, first in ops:
            R.check(answer(s, rid, proto) == first,
                    f"{rid} ({'protobuf' if proto else 'JSON'}): the row's answer is the one memory gave")

        # Submitted, not run yet: the first look parks (no answer yet); then its result.
        with s.queue_held():
            st, fut = forward_backward(s, mid, 10, DATA, "cross_entropy", False)
            try:
                early = s.post("/api/v1/retrieve_future", {"request_id": fut["request_id"]}, timeout=3)
            except OSError:   # the long poll outlived the client's patience: parked
                early = None
            R.check(early is None, f"a queued operation's future waits (parked), not answered: {early}")
        done = answer(s, fut["request_id"], False)
        R.check(done is not None and b"loss" in done[1], "and its result once it runs")
    R.finish()


if __name__ == "__main__":
    main()
