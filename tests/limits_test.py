#!/usr/bin/env python3
"""limits_test.py: bad input never kills a process; every size is checked before memory
is taken for it.

The size bombs of issue 8 and their kin, over JSON and protobuf: a sparse CSR
target_tokens declared [4000000, 1024] with no data (densifying it took 32 GB and aborted
the api), a dense one of that shape, more datums than a request takes, bodies of millions
of tiny arrays / messages (the parse trees take many times the body), oversized stop
lists, tags and user_metadata. Each gets a 4xx JSON error; afterwards the same processes
are still running (no restart in `loom up`'s log) and training works.
Prints "N passed, N failed" last.
"""
import json
import os
import struct
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import tinker_proto as tp  # noqa: E402
from stack import Results, Stack  # noqa: E402

R = Results()
BASE = "loom/tiny-llama"
PROTO = "application/x-protobuf"


def post(s, path, body, ctype="application/json"):
    """(status, parsed body); status 0 when the connection broke (the process died)."""
    req = urllib.request.Request(s.url + path, data=body, method="POST",
                                 headers={"Content-Type": ctype, "X-API-Key": s.key})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw
    except OSError as e:
        return 0, str(e)


def detail(resp, code, *words):
    st, body = resp
    ok = st == code and isinstance(body, dict) and all(w in body.get("detail", "") for w in words)
    if not ok:
        print("      got", st, str(body)[:300])
    return ok


def main():
    with Stack() as s:
        before = s.children()
        sid = s.post("/api/v1/create_session", {})[1]["session_id"]
        fut = s.post("/api/v1/create_model", {"session_id": sid, "base_model": BASE,
                                              "lora_config": {"rank": 4}})[1]
        model = s.result(fut["request_id"])["model_id"]
        seq = iter(range(1, 1000))

        def fb_json(data, extra=None):
            body = {"model_id": model, "seq_id": next(seq),
                    "forward_backward_input": {"data": data, "loss_fn": "cross_entropy"}}
            body.update(extra or {})
            return post(s, "/api/v1/forward_backward", json.dumps(body).encode())

        def fb_proto(data):
            return post(s, "/api/v1/forward_backward",
                        tp.fwdbwd_request(model, next(seq), data, "cross_entropy"), PROTO)

        rows = 4_000_000
        csr_json = {"data": [], "dtype": "int64", "shape": [rows, 1024],
                    "sparse_crow_indices": [0] * (rows + 1), "sparse_col_indices": []}
        d = {"model_input": {"chunks": [{"tokens": [1, 2], "type": "encoded_text"}]},
             "loss_fn_inputs": {"target_tokens": csr_json}}
        R.check(detail(fb_json([d]), 400, "target_tokens", "[4000000, 1024]"),
                "JSON: sparse CSR [4000000, 1024] with no data -> 400 (not densified)")
        csr_proto = tp.tensor("int64", [], shape=[rows, 1024], sparse=True, crow=[0] * (rows + 1), col=[])
        R.check(detail(fb_proto([([1, 2], {"target_tokens": csr_proto})]), 400, "[4000000, 1024]"),
                "protobuf: the same sparse CSR -> 400")
        # the same shape, as many rows as the input has tokens: the request-wide budget
        n = 20000
        big = {"data": [], "dtype": "int64", "shape": [n, 1024],
               "sparse_crow_indices": [0] * (n + 1), "sparse_col_indices": []}
        toks = [1] * n
        R.check(detail(fb_json([{"model_input": {"chunks": [{"tokens": toks}]},
                                 "loss_fn_inputs": {"target_tokens": big}}]), 400, "at most"),
                "JSON: [20000, 1024] matching the tokens but over the request's 2-D budget -> 400")
        big_p = tp.tensor("int64", [], shape=[n, 1024], sparse=True, crow=[0] * (n + 1), col=[])
        R.check(detail(fb_proto([(toks, {"target_tokens": big_p})]), 400, "at most"),
                "protobuf: the same -> 400")
        dense = tp.tensor("int64", [1, 2, 3, 4], shape=[rows, 1024])
        R.check(detail(fb_proto([([1, 2], {"target_tokens": dense})]), 400, "target_tokens"),
                "protobuf: dense [4000000, 1024] with 4 values -> 400")
        R.check(detail(fb_json([{"model_input": d["model_input"]}] * 5000), 400, "at most 4096"),
                "5000 datums -> 400 (at most 4096)")
        R.check(detail(fb_proto([([1, 2], {})] * 5000), 400, "at most 4096"),
                "protobuf: 5000 datums -> 400")
        junk = b'{"model_id": "x", "junk": [' + b"[]," * 3_000_000 + b"[]]}"
        R.check(detail(post(s, "/api/v1/forward_backward", junk), 413, "too complex"),
                "9 MB of empty JSON arrays -> 413 (the tree would take >24x the body)")
        R.check(detail(post(s, "/api/v1/forward_backward",
                            tp.f_str(1, model) + b"\x1a\x00" * 5_000_000, PROTO), 400, "too complex"),
                "protobuf: 5 million empty datums -> 400 (decoding would take >8x the body)")

        ss = s.post("/api/v1/create_sampling_session", {"session_id": sid, "base_model": BASE})[1]

        def sample(params):
            return s.post("/api/v1/asample", {"sampling_session_id": ss["sampling_session_id"], "num_samples": 1,
                                              "prompt": {"chunks": [{"tokens": [1, 2]}]},
                                              "sampling_params": params})
        R.check(detail(sample({"max_tokens": 2, "stop": [1] * 300}), 400, "at most 256"),
                "300 stop token ids -> 400")
        R.check(detail(sample({"max_tokens": 2, "stop": ["x" * 2000]}), 400, "1024 bytes"),
                "a 2000-byte stop string -> 400")
        R.check(detail(s.post("/api/v1/create_session", {"user_metadata": {"a": "x" * 70000}}), 400,
                       "user_metadata", "65536"), "70 kB of user_metadata -> 400")
        R.check(detail(s.post("/api/v1/create_session", {"tags": ["t" * 100] * 1000}), 400, "tags"),
                "100 kB of tags -> 400")
        R.check(detail(s.post("/api/v1/create_model", {"session_id": sid, "base_model": BASE,
                                                         "user_metadata": {"a": "x" * 70000}}), 400,
                       "user_metadata"), "create_model with 70 kB of user_metadata -> 400")

        after = s.children()
        R.check(after == before, f"no process was restarted ({before} -> {after})")
        log = s.read_log()
        R.check("exited unexpectedly" not in log and "abort" not in log.lower(), "loom up's log shows no crash")
        st, f = s.post("/api/v1/forward_backward", {
            "model_id": model, "seq_id": next(seq),
            "forward_backward_input": {"data": [{
                "model_input": d["model_input"],
                "loss_fn_inputs": {"target_tokens": {"data": [2, 3], "dtype": "int64"}}}],
                "loss_fn": "cross_entropy"}})
        r = s.result(f["request_id"], timeout=60) if st == 200 else {}
        R.check("metrics" in r, "training still works (the rejected seq_ids did not hold the model)")
    R.finish()


if __name__ == "__main__":
    main()
