"""No durable commit holds PostgreSQL's notification lock across its WAL flush.

PostgreSQL queues a transaction's notifications at its commit under one lock of the whole
database, taken before the commit's WAL flush and released after it (its
PreCommit_Notify): a submit or a cycle's commit that notified inside its durable
transaction made every other notifying commit of the database wait out its flush, one at
a time (with a 2 ms flush, loom_bench's throughput part ran 330 operations/s instead of
930). Loom's durable writes leave their notification for a transaction of its own after
the commit, which does not wait for the disk (common/common_sql.h, SQL_NOTIFY_AFTER).

`loom up`, every WAL flush of its cluster made 100 ms slow (commit_delay with
commit_siblings 0: the flushing backend sleeps first, as on a slow disk); 6 clients at
once, each creating a model (the api's create_model and its scheduler wake-up),
training it (forward_backward and optim_step: the api's submit, the executor's cycle
commit and its futures' wake-up) and sampling from the base model (asample), while a
watcher reads pg_locks over and over for the notification lock (locktype object, classid
pg_database, objid 0). Held across 100 ms flushes, it is held most of the time (before
this change: in 99.8 % of 7,393 looks, mostly by a transaction older than 60 ms); held
for the microseconds of a commit that does not wait for the disk, almost never (0.0-0.3 %
of 2,000-3,000 looks): at most 5 % may find it held. Also checked: the slow flush is in force (a lone
submit takes at least 100 ms) and every operation completes (the notifications arrive).
"""
import os, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from resilient import Psql
from stack import Stack, Results
from wire import forward_backward

FLUSH_MS = 100
CLIENTS = 6
ADAM = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
LOCK = ("SELECT round(extract(epoch FROM clock_timestamp() - a.xact_start) * 1000), a.application_name,"
        " coalesce(a.wait_event, '-'), left(regexp_replace(a.query, '\\s+', ' ', 'g'), 60)"
        " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'object' AND l.classid = 'pg_database'::regclass AND l.objid = 0"
        " AND l.mode = 'AccessExclusiveLock' AND l.granted")


def client(s, sid, n, out):
    seq = [(7 * n + 5 * j) % 250 + 1 for j in range(9)]
    data = [(seq[:-1], {"target_tokens": ("int64", seq[1:])})]
    st, fut = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": n, "base_model": "loom/tiny-llama",
                                              "lora_config": {"rank": 4}})
    mid = s.result(fut["request_id"])["model_id"]
    st, ss = s.post("/api/v1/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": n,
                                                        "base_model": "loom/tiny-llama"})
    done = 0
    for k in range(3):
        st, fb = forward_backward(s, mid, 1 + 2 * k, data, "cross_entropy", False)
        st2, opt = s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": 2 + 2 * k, "adam_params": ADAM})
        st3, smp = s.post("/api/v1/asample", {"sampling_session_id": ss["sampling_session_id"], "seq_id": k,
                                              "num_samples": 1, "prompt": {"chunks": [{"type": "encoded_text",
                                                                                       "tokens": seq[:4]}]},
                                              "sampling_params": {"max_tokens": 3, "seed": k}})
        if st == 200 and st2 == 200 and st3 == 200:
            got = [s.result(f["request_id"]) for f in (fb, opt, smp)]
            done += sum(1 for g in got if isinstance(g, dict) and "error" not in g)
    out[n] = done


def main():
    R = Results()
    with Stack() as s:
        s.psql(f"ALTER SYSTEM SET commit_delay = {FLUSH_MS * 1000}")
        s.psql("ALTER SYSTEM SET commit_siblings = 0")
        s.psql("SELECT pg_reload_conf()")
        sid = s.post("/api/v1/create_session", {})[1]["session_id"]
        t0 = time.time()
        st, fut = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 99,
                                                  "base_model": "loom/tiny-llama", "lora_config": {"rank": 4}})
        lone = time.time() - t0
        R.check(st == 200 and lone >= FLUSH_MS / 1000,
                f"the slow flush is in force: a lone create_model answers in {lone * 1000:.0f} ms (>= {FLUSH_MS})")
        s.result(fut["request_id"])

        stop, looks, held, long_held, finished = threading.Event(), [0], [0], [], [False]

        def watch():
            q = Psql(s.db)
            while not stop.is_set():
                rows = q.query(LOCK)
                looks[0] += 1
                for row in rows:
                    held[0] += 1
                    age, who = row.split("|", 1)
                    if not age or float(age) > 60:   # no transaction start: not what the lock is
                        long_held.append((age, who))
            q.close()
            finished[0] = True
        w = threading.Thread(target=watch)
        w.start()
        out = [0] * CLIENTS
        ts = [threading.Thread(target=client, args=(s, sid, n, out)) for n in range(CLIENTS)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        stop.set()
        w.join()
        R.check(sum(out) == CLIENTS * 9, f"every operation of the {CLIENTS} clients completed ({sum(out)} of"
                f" {CLIENTS * 9}: create_model, forward_backward, optim_step and asample, woken by notifications)")
        R.check(looks[0] >= 20 and finished[0], f"the watcher looked at the locks {looks[0]} times during the load")
        share = held[0] / max(1, looks[0])
        R.check(share <= 0.05, f"the notification lock was held in {held[0]} of {looks[0]} looks ({100 * share:.1f} %,"
                f" at most 5 %: held across 100 ms flushes, it is held most of the time)"
                + (f"; {len(long_held)} holders older than 60 ms (first: {long_held[0][0]} ms, {long_held[0][1]})"
                   if long_held else ""))
    R.finish()


if __name__ == "__main__":
    main()
