#!/usr/bin/env python3
"""ordering_test.py: per-model seq_id order cannot wedge a model (docs/protocol.md §4.3).

- A submit the api rejects (400) has used its seq_id up in the SDK: it is recorded as a
  failed operation with the error (the audit trail), and the next seq_ids run.
- A gap that stays open (a seq_id never sent) fails the waiting operations after the
  bound (`loom up --seq-gap-timeout-s`, 30 s by default) with a message naming the missing
  seq_id; the model goes on with what the client sends next; the missing one arriving
  late fails too.
- Chunks of one forward_backward sent out of order wait for each other and run in order.
- try_again carries the real queue_state and a reason: waiting for seq N, paused_capacity
  (no executor serves the base model), paused_rate_limit (the tenant is at its limit of
  queued samples).
Prints "N passed, N failed" last.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from apitest import start_second_api  # noqa: E402
from stack import Results, Stack  # noqa: E402

R = Results()
BASE = "loom/tiny-llama"


def datum(tokens):
    return {"model_input": {"chunks": [{"tokens": tokens, "type": "encoded_text"}]},
            "loss_fn_inputs": {"target_tokens": {"data": [t + 1 for t in tokens], "dtype": "int64"}}}


def fb(s, model, seq, tokens=(1, 2, 3, 4)):
    return s.post("/api/v1/forward_backward", {
        "model_id": model, "seq_id": seq,
        "forward_backward_input": {"data": [datum(list(tokens))], "loss_fn": "cross_entropy"}})


def new_model(s, base=BASE, wait=True):
    sid = s.post("/api/v1/create_session", {})[1]["session_id"]
    st, fut = s.post("/api/v1/create_model", {"session_id": sid, "base_model": base,
                                               "lora_config": {"rank": 4}})
    assert st == 200, fut
    if wait:
        s.result(fut["request_id"], timeout=60)
    return fut["model_id"], fut["request_id"], sid


def poll_once(s, request_id, url=None):
    """One retrieve_future (a long poll): (seconds, status, body)."""
    t0 = time.time()
    if url:
        import json, urllib.request
        req = urllib.request.Request(url + "/api/v1/retrieve_future", method="POST",
                                     data=json.dumps({"request_id": request_id}).encode(),
                                     headers={"X-API-Key": s.key, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return time.time() - t0, r.status, json.loads(r.read())
    st, body = s.post("/api/v1/retrieve_future", {"request_id": request_id})
    return time.time() - t0, st, body


def result(s, request_id, timeout):
    """The finished future, or {} if it does not finish in time."""
    try:
        return s.result(request_id, timeout=timeout)
    except TimeoutError:
        return {}


def in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.update(v=fn()))
    t.start()
    return t, out


def main():
    with Stack() as s:
        vocab = int(s.psql(f"SELECT vocab_size FROM base_models WHERE name = '{BASE}'"))

        # ---- a base model nobody serves, and one whose only executor is always busy ----------
        s.psql("INSERT INTO base_models (name, path, arch, max_context, vocab_size, config) VALUES"
               " ('test/unserved', '/none', 'LlamaForCausalLM', 128, 256, '{}'),"
               " ('test/busy', '/none', 'LlamaForCausalLM', 128, 256, '{}')")
        s.psql("INSERT INTO executors (name, hostname, pid, backend, device, base_model, token_budget, state,"
               " heartbeat_at) VALUES ('fake', 'nowhere', 0, 'cpu', 'cpu', 'test/busy', 100, 'busy',"
               " now() + interval '1 hour')")
        _, unserved_req, _ = new_model(s, "test/unserved", wait=False)
        t_cap, cap = in_thread(lambda: poll_once(s, unserved_req))
        api2, url2 = start_second_api(s, "--max-queued-samples", "2")
        sid = s.post("/api/v1/create_session", {})[1]["session_id"]
        st, ss = s.post("/api/v1/create_sampling_session", {"session_id": sid, "base_model": "test/busy"})
        sample_ids = [s.post("/api/v1/asample", {
            "sampling_session_id": ss["sampling_session_id"], "seq_id": i, "num_samples": 1,
            "prompt": {"chunks": [{"tokens": [1, 2], "type": "encoded_text"}]},
            "sampling_params": {"max_tokens": 2}})[1]["request_id"] for i in range(2)]
        t_rate, rate = in_thread(lambda: poll_once(s, sample_ids[0], url2))

        # ---- a gap: seq_id 1 is never sent ------------------------------------------------------
        gap_model, _, _ = new_model(s)
        st, waiting = fb(s, gap_model, 2)
        gap_sent = time.time()
        t_gap, gap = in_thread(lambda: poll_once(s, waiting["request_id"]))

        # ---- a rejected submit does not hold the model -----------------------------------------
        m, _, _ = new_model(s)
        st, body = fb(s, m, 1, tokens=(1, vocab + 5, 3))
        R.check(st == 400 and "vocabulary" in body.get("detail", ""), f"out-of-vocabulary token -> 400 ({st})")
        row = s.psql(f"SELECT state || '|' || error_category || '|' || kind || '|' || error FROM operations"
                     f" WHERE model_id = '{m}' AND seq_id = 1")
        R.check(row.startswith("failed|user|forward_backward|") and "vocabulary" in row,
                f"the rejected seq_id 1 is recorded as a failed operation with its error: {row[:140]}")
        st, opt = s.post("/api/v1/optim_step", {"model_id": m, "seq_id": 2,
                                                 "adam_params": {"learning_rate": -1}})
        R.check(st == 400, "a rejected optim_step (seq_id 2) -> 400")
        t0 = time.time()
        st1, f3 = fb(s, m, 3)
        st2, f4 = s.post("/api/v1/optim_step", {"model_id": m, "seq_id": 4,
                                                 "adam_params": {"learning_rate": 1e-3}})
        r3, r4 = result(s, f3["request_id"], 25), result(s, f4["request_id"], 25)
        R.check("metrics" in r3 and "metrics" in r4,
                f"the operations after two rejected seq_ids complete ({time.time() - t0:.1f} s)")
        R.check(s.psql(f"SELECT count(*) FROM operations WHERE model_id = '{m}' AND state = 'failed'"
                       f" AND error LIKE 'rejected when submitted (HTTP 400)%'") == "2",
                "both rejections are in the audit trail")

        # ---- chunks of one forward_backward, sent last-first -------------------------------------
        c, _, _ = new_model(s)
        ids = {}
        for seq in (3, 2):
            ids[seq] = fb(s, c, seq, tokens=(seq, 5, 6))[1]["request_id"]
        time.sleep(1.5)
        early = s.psql(f"SELECT string_agg(state, ',' ORDER BY seq_id) FROM operations"
                       f" WHERE model_id = '{c}' AND seq_id IN (2, 3)")
        R.check(early == "queued,queued", f"chunks 2 and 3 wait for chunk 1 ({early})")
        ids[1] = fb(s, c, 1, tokens=(1, 5, 6))[1]["request_id"]
        ids[4] = s.post("/api/v1/optim_step", {"model_id": c, "seq_id": 4})[1]["request_id"]
        res = {k: result(s, v, 60) for k, v in ids.items()}
        R.check(all("metrics" in r for r in res.values()), "all chunks and the optim_step complete")
        order = s.psql(f"SELECT string_agg(cycle_id::text, ',' ORDER BY seq_id) FROM operations"
                       f" WHERE model_id = '{c}' AND seq_id BETWEEN 1 AND 4")
        cyc = [int(x) for x in order.split(",")]
        R.check(cyc == sorted(cyc), f"they ran in seq_id order (cycles {order})")

        # ---- the pending answers: why an operation waits --------------------------------------
        def try_again(thread, out, state, word, what):
            thread.join()
            took, st, body = out["v"]
            R.check(st == 200 and body.get("type") == "try_again" and body.get("queue_state") == state
                    and word in body.get("queue_state_reason", ""), f"{what}: try_again {state} ({took:.0f} s): {body}")
        try_again(t_cap, cap, "paused_capacity", "test/unserved", "no executor for the base model")
        try_again(t_rate, rate, "paused_rate_limit", "limit", "the tenant at its queued-sample limit")
        api2.terminate()
        api2.wait()
        try_again(t_gap, gap, "active", "seq_id 1", "waiting behind a gap, it says for seq_id 1")
        deadline = gap_sent + 60
        body = {}
        while time.time() < deadline:
            _, st, body = poll_once(s, waiting["request_id"])
            if body.get("type") != "try_again":
                break
        waited = time.time() - gap_sent
        R.check("error" in body and body.get("category") == "user" and "seq_id 1" in body["error"]
                and "never arrived" in body["error"] and waited < 45,
                f"the gap is given up on after {waited:.0f} s with a message naming seq_id 1: {body}")
        st, f3 = fb(s, gap_model, 3)
        r3 = result(s, f3["request_id"], 30) if st == 200 else {}
        R.check("metrics" in r3, "the model goes on with the next seq_id")
        st, late = fb(s, gap_model, 1)
        r1 = result(s, late["request_id"], 30) if st == 200 else {}
        R.check("error" in r1 and "given up" in r1["error"], f"seq_id 1 arriving late fails: {r1}")
        odd = s.psql(f"SELECT count(*) FROM operations o JOIN models m ON m.id = o.model_id"
                     f" WHERE m.base_model = '{BASE}' AND o.state IN ('queued', 'claimed')")
        R.check(odd == "0", f"no operation of a served model is left pending ({odd})")
    R.finish()


if __name__ == "__main__":
    main()
