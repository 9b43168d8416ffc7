"""executor_test.py: the executor process against real PostgreSQL and real signals.

- Capacity and unload: the executor reports its backend, device and adapter store in its
  `executors` row; unload_model frees the model's training slot on the executor.
- A statement error on the executor's connection in a cycle (pg_cancel_backend,
  pg_terminate_backend), in the statement that starts the cycle and between marking it
  running and reading its operations (the executor's read made to wait on a lock), does
  not wedge the cycle: the operation completes and no cycle stays running.
- A clean stop (SIGTERM) hands the executor's sampler snapshots over to the blob store:
  a sample from one taken before the stop runs on the executor started next.
- An executor paused (SIGSTOP) past the 30 s after which the reaper writes it off as gone
  is fenced when it resumes: a standalone `loom executor` exits by itself (status 3)
  without touching a cycle, `loom up`'s executor is replaced, and training goes on.

Prints "N passed, N failed" last.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from stack import wait_for, LOOM_BIN, Results, Stack, backend_args  # noqa: E402

R = Results()
BASE = "loom/tiny-llama"
DATA = [{"model_input": {"chunks": [{"tokens": [1, 2, 3, 4]}]},
         "loss_fn_inputs": {"target_tokens": {"data": [2, 3, 4, 5], "dtype": "int64"}}}]


def new_model(s):
    sid = s.post("/api/v1/create_session", {})[1]["session_id"]
    fut = s.post("/api/v1/create_model", {"session_id": sid, "base_model": BASE, "lora_config": {"rank": 4}})[1]
    return s.result(fut["request_id"])["model_id"]


def submit_fb(s, model_id, seq):
    return s.post("/api/v1/forward_backward", {"model_id": model_id, "seq_id": seq,
                                               "forward_backward_input": {"data": DATA, "loss_fn": "cross_entropy"}})[1]


def executor_row(s, pid, cols):
    return s.psql(f"SELECT {cols} FROM executors WHERE pid = {pid} ORDER BY id DESC LIMIT 1")


def live_executor_pid(s):
    return int(s.psql("SELECT pid FROM executors WHERE state <> 'gone' ORDER BY id DESC LIMIT 1"))


def test_capacity_and_unload(s):
    pid = live_executor_pid(s)
    row = executor_row(s, pid, "backend, device_index, memory_budget > 0, memory_used, training_slots")
    R.check(row.startswith((os.environ.get("LOOM_TEST_BACKEND") or "cpu") + "|0|t|0|0"),
            f"the executors row reports backend, device, a budget and an empty store: {row}")
    m = new_model(s)
    fb = submit_fb(s, m, 1)
    R.check("loss_fn_outputs" in s.result(fb["request_id"]), "a step on the new model")
    row = executor_row(s, pid, "memory_used, training_slots")
    used, slots = (int(x) for x in row.split("|"))
    R.check(used > 0 and slots == 1, f"the training slot is counted: {used} bytes, {slots} slot")
    st, _ = s.post("/api/v1/unload_model", {"model_id": m})
    R.check(st == 200, "unload_model")
    R.check(wait_for(lambda: executor_row(s, pid, "training_slots, memory_used") == "0|0", 10),
            f"the executor freed the unloaded model's slot ({executor_row(s, pid, 'training_slots, memory_used')})")


# A cycle is marked running by the executor's start (an update of a cycle the scheduler
# built), or inserted running by the claim of the executor's own pass (SQL_INSERT_CYCLES_CLAIM),
# which starts it in the same transaction.
SLOW_START = """
CREATE OR REPLACE FUNCTION loom_test_slow_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state = 'running' AND (TG_OP = 'INSERT' OR OLD.state = 'assigned') THEN PERFORM pg_sleep(1.5); END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER loom_test_slow_start BEFORE INSERT OR UPDATE ON cycles FOR EACH ROW EXECUTE FUNCTION loom_test_slow_start();
"""


def backend_pid(s):
    """The PostgreSQL backend of the executor's loop connection (named 'loom executor <id>'
    in pg_stat_activity; the newest executor's)."""
    return s.psql("SELECT pid FROM pg_stat_activity WHERE application_name ~ '^loom executor [0-9]+$'"
                  " ORDER BY backend_start DESC LIMIT 1")


def activity(s, pid):
    return s.psql(f"SELECT coalesce(wait_event_type, '') || ':' || coalesce(wait_event, '') FROM pg_stat_activity"
                  f" WHERE pid = {pid}")


def test_interrupted_cycle(s, m, seq, how, where):
    """how: pg_cancel_backend | pg_terminate_backend; where: 'start' (inside the statement
    that marks the cycle running or inserts it running) or 'read' (after it, the read of the operations waiting
    on a lock the test holds on models)."""
    bpid = backend_pid(s)
    fb = submit_fb(s, m, seq)
    R.check(wait_for(lambda: activity(s, bpid) == "Timeout:PgSleep", 20),
            f"{how}/{where}: the executor is starting the cycle (backend {bpid})")
    locker = None
    if where == "read":
        # The old executor, having marked the cycle running, then waits on this lock; an
        # executor that starts the cycle in one statement already holds models, so the
        # lock is ours only once its start is done.
        locker = subprocess.Popen(["psql", "-X", "-q", "-d", s.db], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, text=True)
        locker.stdin.write("BEGIN;\nLOCK TABLE models IN ACCESS EXCLUSIVE MODE;\n")
        locker.stdin.flush()
        R.check(wait_for(lambda: activity(s, bpid) != "Timeout:PgSleep" and (
            activity(s, bpid).startswith("Lock:") or
            s.psql("SELECT count(*) FROM pg_locks WHERE relation = 'models'::regclass"
                   " AND mode = 'AccessExclusiveLock' AND granted") == "1"), 10),
            f"{how}/{where}: the cycle is marked running, and the executor reads on or has read its operations")
    s.psql(f"SELECT {how}({bpid})")
    if locker:
        locker.stdin.write("ROLLBACK;\n")
        locker.stdin.close()
        locker.wait(timeout=30)
    try:
        res = s.result(fb["request_id"], timeout=90)
    except TimeoutError:
        res = {"error": "still pending after 90 s"}
    running = s.psql("SELECT count(*) FROM cycles WHERE state IN ('assigned', 'running')")
    R.check("loss_fn_outputs" in res and running == "0",
            f"{how} {where}: the operation completes and no cycle stays running ({res.get('error', 'ok')},"
            f" {running} cycle(s) left)")


def test_fencing(s):
    """SIGSTOP a standalone executor and `loom up`'s own past the gone threshold; resumed,
    both stop by themselves and work goes on."""
    mdir = os.path.join(s.dir, "models", "tiny-llama")
    log = open(os.path.join(s.dir, "standalone-executor.log"), "wb")
    e2 = subprocess.Popen([LOOM_BIN, "executor", "--db", s.db, "--model-dir", mdir, "--model-name", BASE,
                           "--name", "standalone", "--threads", "1", "--blob-dir", os.path.join(s.dir, "blobs")]
                          + backend_args(), stdout=log, stderr=log)
    R.check(wait_for(lambda: executor_row(s, e2.pid, "state") == "idle", 60), "a second, standalone executor is up")
    e1 = int(s.psql(f"SELECT pid FROM executors WHERE state <> 'gone' AND pid <> {e2.pid} ORDER BY id DESC LIMIT 1"))
    e2_id = executor_row(s, e2.pid, "id")
    for pid in (e1, e2.pid):
        os.kill(pid, signal.SIGSTOP)
    gone = wait_for(lambda: executor_row(s, e1, "state") == "gone" and executor_row(s, e2.pid, "state") == "gone", 90, 1)
    R.check(gone, "both paused executors are written off as gone")
    for pid in (e1, e2.pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            # `loom up` kills an executor it finds written off (its watchdog may be first):
            # either way that one is gone and must be replaced, checked below.
            assert pid == e1
    try:
        rc = e2.wait(timeout=20)
    except subprocess.TimeoutExpired:
        rc = None
        e2.kill()
        e2.wait()
    log.close()
    R.check(rc == 3, f"the resumed standalone executor fenced itself and exited with status 3 (got {rc})")
    R.check(s.psql(f"SELECT count(*) FROM cycles WHERE executor_id = {e2_id} AND state IN ('assigned', 'running')") == "0"
            and executor_row(s, e2.pid, "state") == "gone", "it touched no cycle and stayed gone")
    R.check(wait_for(lambda: s.psql(f"SELECT count(*) FROM executors WHERE state = 'idle' AND pid NOT IN ({e1}, {e2.pid})")
                     == "1", 60), "`loom up` replaced its written-off executor with a new registration")
    m = new_model(s)
    fb = submit_fb(s, m, 1)
    R.check("loss_fn_outputs" in s.result(fb["request_id"], timeout=120), "training goes on")


def sample_tokens(s, sampler, k):
    """One sample's tokens from the sampler (the same seed each time), or its error."""
    st, f = s.post("/api/v1/asample", {"sampling_session_id": sampler, "seq_id": k, "num_samples": 1,
                                       "prompt": {"chunks": [{"tokens": [1, 2, 3, 4]}]},
                                       "sampling_params": {"max_tokens": 8, "seed": 11}})
    if st != 200:
        return f"submit {st}: {f}"
    r = s.result(f["request_id"], timeout=120)
    return r["sequences"][0]["tokens"] if isinstance(r, dict) and "sequences" in r else r


def test_clean_stop_hands_over_samplers(s):
    """SIGTERM: the executor stops cleanly and hands its sampler snapshots to the blob store,
    so a sample from one taken before the stop runs on the executor `loom up` starts next
    (it used to fail: the weights were only in the stopped executor's memory)."""
    m = new_model(s)
    R.check("loss_fn_outputs" in s.result(submit_fb(s, m, 1)["request_id"]), "a step before the sampler snapshot")
    st, f = s.post("/api/v1/save_weights_for_sampler", {"model_id": m, "seq_id": 2})
    sampler = s.result(f["request_id"])["sampling_session_id"]
    first = sample_tokens(s, sampler, 0)
    R.check(isinstance(first, list) and len(first) == 8, f"a sample from the snapshot: {first}")
    pid = live_executor_pid(s)
    os.kill(pid, signal.SIGTERM)
    R.check(wait_for(lambda: s.psql(f"SELECT count(*) FROM executors WHERE state = 'idle' AND pid <> {pid}") == "1",
                     60), "`loom up` started a new executor after the clean stop")
    R.check(s.psql(f"SELECT snapshot_digest IS NOT NULL FROM sampling_sessions WHERE id = '{sampler}'") == "t",
            "the stopped executor handed the sampler snapshot over to the blob store")
    again = sample_tokens(s, sampler, 1)
    R.check(again == first, f"a sample from it after the stop runs on the new executor, same tokens: {again}")


def main():
    with Stack() as s:
        test_capacity_and_unload(s)
        test_clean_stop_hands_over_samplers(s)
        m = new_model(s)
        s.psql(SLOW_START)
        seq = 1
        for how in ("pg_cancel_backend", "pg_terminate_backend"):
            for where in ("start", "read"):
                test_interrupted_cycle(s, m, seq, how, where)
                seq += 1
        s.psql("DROP TRIGGER loom_test_slow_start ON cycles")
        test_fencing(s)
    R.finish()


if __name__ == "__main__":
    main()
