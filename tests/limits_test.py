#!/usr/bin/env python3
"""limits_test.py: bad input never kills a process; every size is checked before memory
is taken for it.

The size bombs of issue 8 and their kin, over JSON and protobuf: a sparse CSR
target_tokens declared [4000000, 1024] with no data (densifying it took 32 GB and aborted
the api), a dense one of that shape, more datums than a request takes, bodies of millions
of tiny arrays / messages (the parse trees take many times the body), oversized stop
lists, tags and user_metadata. Each gets a 4xx JSON error; afterwards the same processes
are still running (no restart in `loom up`'s log) and training works.

Memory, measured on the api process (/proc: peak RSS reset before each case):
- 32 connections each declare a 60 MB body without a key (and 8 with a key that does not
  exist) and send 10 MB of it: each is answered 401 right after its head, nothing of the
  bodies is kept (they took 1.1 GB before the first 401).
- Four concurrent 33 MB forward_backward bodies with a valid key (they parse, then fail
  validation): the bytes in flight per key (--max-inflight-mb-per-key) and the memory of
  decoding (--max-decode-mb) are bounded, the extra ones answered 429 / 503 with
  Retry-After; the api's peak stays well under what it took (2.9 GB), and once idle it
  holds about what it held before (2.6 GB stayed).
- A refused body on a keep-alive connection is read and dropped: the client reads its
  answer, and the connection serves the next request.
Prints "N passed, N failed" last.
"""
import http.client
import json
import os
import socket
import struct
import sys
import threading
import time
import urllib.error
import urllib.parse
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


def status_kb(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak(pid):
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")   # VmHWM := VmRSS


def head_then_body(s, key, n_mb, total=60_000_000):
    """A POST that declares `total` bytes, sends its head and n_mb MiB of the body, then
    reads the answer: (status, seconds from the head to the answer)."""
    u = urllib.parse.urlparse(s.url)
    sock = socket.create_connection((u.hostname, u.port), timeout=60)
    head = (f"POST /api/v1/forward_backward HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {total}\r\n" + (f"X-API-Key: {key}\r\n" if key else "") + "\r\n").encode()
    t0 = time.time()
    sock.sendall(head)
    chunk = b"1," * (1 << 19)
    try:
        for _ in range(n_mb):
            sock.sendall(chunk)
        sock.settimeout(20)
        answer = sock.recv(4096)
        took = time.time() - t0
    except OSError:
        answer, took = b"", time.time() - t0
    sock.close()
    return (int(answer.split()[1]) if answer.startswith(b"HTTP/") else 0), took


def memory_bounds(s, model):
    api = s.children()["api"]
    # ---- bodies without a (valid) key are not read ------------------------------------------
    reset_peak(api)
    before = status_kb(api, "VmRSS")
    out = []
    ts = [threading.Thread(target=lambda k=k: out.append(head_then_body(s, k, 10)))
          for k in [None] * 32 + ["tml-" + "A" * 43] * 8]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    grew = (status_kb(api, "VmHWM") - before) // 1024
    print(f"      api RSS {before // 1024} MiB, peak +{grew} MiB; answers {sorted(set(st for st, _ in out))}")
    R.check(len(out) == 40 and all(st == 401 for st, _ in out),
            f"40 POSTs declaring 60 MB without a valid key, 10 MB of each sent: all 401 "
            f"({sum(st == 401 for st, _ in out)})")
    R.check(grew < 64, f"... and none of their bodies was kept: the api's peak grew {grew} MiB (400 MiB were sent)")

    # ---- four concurrent 33 MB bodies with a key ---------------------------------------------
    ints = b"1," * 8_250_000
    body = (b'{"model_id": "' + model.encode() + b'", "seq_id": %d, "forward_backward_input": {"loss_fn": '
            b'"cross_entropy", "data": [{"model_input": {"chunks": [{"tokens": [' + ints + b'1]}]}, '
            b'"loss_fn_inputs": {"target_tokens": {"data": [' + ints + b'1]}}}]}}')
    reset_peak(api)
    before = status_kb(api, "VmRSS")
    answers = []

    def big(i):
        answers.append(post(s, "/api/v1/forward_backward", body % (900 + i)))
    ts = [threading.Thread(target=big, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    peak = status_kb(api, "VmHWM") // 1024
    codes = sorted(st for st, _ in answers)
    print(f"      api RSS {before // 1024} MiB before, peak {peak} MiB; answers {codes}: "
          f"{[str(b)[:100] for _, b in answers]}")
    R.check(len(codes) == 4 and all(c in (400, 413, 429, 503) for c in codes) and 400 in codes,
            f"four 33 MB forward_backward bodies at once: refused with 400 (parsed), or 429/503 (bounded) {codes}")
    R.check(peak < 1600, f"... the api's peak RSS stays bounded: {peak} MiB (it reached 2.9 GB)")
    time.sleep(2)
    idle = status_kb(api, "VmRSS") // 1024
    R.check(idle < before // 1024 + 100, f"... and once idle it holds what it held before: {idle} MiB "
                                         f"(before: {before // 1024} MiB; 2.6 GB stayed held)")

    # ---- a refused body on a keep-alive connection -------------------------------------------
    u = urllib.parse.urlparse(s.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", "/api/v1/create_session", body=b'{"tags": ["' + b"x" * 300_000 + b'"]}',
                 headers={"X-API-Key": "tml-" + "B" * 43, "Content-Type": "application/json"})
    r = conn.getresponse()
    first = (r.status, r.read())
    conn.request("POST", "/api/v1/create_session", body=b"{}",
                 headers={"X-API-Key": s.key, "Content-Type": "application/json"})
    r = conn.getresponse()
    second = (r.status, r.read())
    conn.close()
    R.check(first[0] == 401 and b"not read" in first[1] and second[0] == 200,
            f"a 300 kB body with an unknown key on a keep-alive connection: 401, then the next request on the "
            f"same connection is served ({first[0]}, {second[0]})")


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

        memory_bounds(s, model)

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
