#!/usr/bin/env python3
"""client_errors_test.py: client mistakes are 4xx, never a retryable 5xx, and a database
outage does not turn waiting clients into a flood.

- \\u0000 in user_metadata, tags or any other JSON string (PostgreSQL stores no NUL): 400.
- Invalid UTF-8 in a path (GET /api/v1/sessions/%ff), a query string or the API key: 4xx.
- A model whose weights diverged under the client's optimizer settings (learning_rate
  10, weight_decay 10: the model's outputs turn NaN within a few steps): its
  forward_backward and optim_step fail as `user` errors that name the settings (the
  optim_step's was a `server` error, which reads as Loom's fault).
- While PostgreSQL is stopped, retrieve_future is held (up to the long-poll deadline)
  instead of answered with an immediate 503 that the SDK re-polls at once; when the
  database is back the held request gets its answer and training goes on. Telemetry is
  answered 200 meanwhile (the batch is dropped: the key cannot be checked).
Prints "N passed, N failed" last.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from apitest import is_detail  # noqa: E402
from stack import LOOM_BIN, Results, Stack  # noqa: E402

R = Results()


def raw_status(url, request):
    """Sends raw request bytes; the status code of the answer."""
    u = urllib.parse.urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as sock:
        sock.sendall(request)
        head = sock.recv(4096)
    return int(head.split()[1]) if head.startswith(b"HTTP/") else 0


def main():
    with Stack() as s:
        # ---- NUL characters --------------------------------------------------------------
        for name, body in [("user_metadata", b'{"user_metadata": {"a": "x\\u0000y"}}'),
                           ("tags", b'{"tags": ["ok", "\\u0000"]}'),
                           ("a key of user_metadata", b'{"user_metadata": {"a\\u0000": 1}}'),
                           ("sdk_version", b'{"sdk_version": "0.25\\u0000"}')]:
            R.check(is_detail(s.request("POST", "/api/v1/create_session", raw=body), 400, "\\u0000"),
                    f"\\u0000 in {name} -> 400 naming it")
        sid = s.post("/api/v1/create_session", {})[1]["session_id"]
        R.check(is_detail(s.request("POST", "/api/v1/create_model", raw=json.dumps(
            {"session_id": sid, "base_model": "loom/tiny-llama"}).encode()[:-1] +
            b', "user_metadata": {"k": "\\u0000"}}'), 400, "\\u0000"), "\\u0000 in create_model's user_metadata -> 400")
        R.check(is_detail(s.request("POST", "/api/v1/retrieve_future", raw=b'{"request_id": "req-\\u0000"}'),
                          400, "\\u0000"), "\\u0000 in a request_id -> 400")

        # ---- invalid UTF-8 --------------------------------------------------------------------
        for path in ["/api/v1/sessions/%ff", "/api/v1/training_runs/%c3%28", "/api/v1/samplers/a%80b",
                     "/api/v1/training_runs/%ff/checkpoints", "/api/v1/models/%fe/checkpoints",
                     "/api/v1/training_runs?access_scope=%ff", "/api/v1/checkpoints?limit=%ed%a0%80"]:
            R.check(is_detail(s.get(path), 400, "UTF-8"), f"GET {path} -> 400")
        key = s.key.encode()
        st = raw_status(s.url, b"GET /api/v1/sessions HTTP/1.1\r\nHost: t\r\nX-API-Key: " + key[:10] +
                        b"\xff\xfe" + key[12:] + b"\r\nConnection: close\r\n\r\n")
        R.check(st == 401, f"an API key with invalid UTF-8 bytes -> 401 ({st})")
        st = raw_status(s.url, b"GET /api/v1/sessions HTTP/1.1\r\nHost: t\r\nX-API-Key: " + s.key.encode() +
                        b"\r\nX-Forwarded-Host: \xff\"<>\r\nConnection: close\r\n\r\n")
        R.check(st == 200, f"a garbage X-Forwarded-Host is ignored ({st})")

        # ---- a model diverged by its optimizer settings ------------------------------------------
        fut = s.post("/api/v1/create_model", {"session_id": sid, "base_model": "loom/tiny-llama",
                                              "lora_config": {"rank": 4, "seed": 5}})[1]
        wild = s.result(fut["request_id"])["model_id"]
        fails = []
        for k in range(1, 9):
            data = [{"model_input": {"chunks": [{"tokens": [(3 * k + 7 * i + j) % 250 + 1 for j in range(24)]}]},
                     "loss_fn_inputs": {"target_tokens": {"data": [(3 * k + 7 * i + j + 1) % 250 + 1
                                                                   for j in range(24)]}}} for i in range(4)]
            fb = s.post("/api/v1/forward_backward", {"model_id": wild, "seq_id": 2 * k - 1, "forward_backward_input": {
                "loss_fn": "cross_entropy", "data": data}})[1]
            op = s.post("/api/v1/optim_step", {"model_id": wild, "seq_id": 2 * k, "adam_params": {
                "learning_rate": 10, "weight_decay": 10}})[1]
            fails += [r for r in (s.result(fb["request_id"]), s.result(op["request_id"])) if "error" in r]
        R.check(len(fails) >= 2, f"learning_rate 10 with weight_decay 10 makes the model diverge ({len(fails)} failures)")
        R.check(fails and all(f.get("category") == "user" for f in fails),
                f"its failures are user errors: {sorted(set(f.get('category') for f in fails))}")
        R.check(any("learning_rate 10" in f["error"] and "weight_decay 10" in f["error"] for f in fails) and
                all("learning_rate" in f["error"] for f in fails),
                f"they name the settings: {[f['error'][:90] for f in fails[:2]]}")

        # ---- the database goes away -----------------------------------------------------------
        fut = s.post("/api/v1/create_model", {"session_id": sid, "base_model": "loom/tiny-llama",
                                              "lora_config": {"rank": 4}})[1]
        model = s.result(fut["request_id"])["model_id"]
        env = dict(os.environ)
        env.pop("DATABASE_URL", None)
        subprocess.run([LOOM_BIN, "pg", "stop", "--data-dir", s.dir], check=True, env=env,
                       capture_output=True)
        stopped = time.time()
        answers = []

        def poller():  # re-polls at once, as the SDK does
            while True:
                try:
                    st, body = s.post("/api/v1/retrieve_future", {"request_id": fut["request_id"]}, timeout=45)
                except OSError as e:
                    st, body = 0, str(e)
                answers.append((time.time(), st, body))
                if st == 200 and "model_id" in body:
                    return
                if time.time() - stopped > 60:
                    return
        t = threading.Thread(target=poller)
        t.start()
        time.sleep(3)
        tel = s.post("/api/v1/telemetry", {"session_id": sid, "events": []}, timeout=45)
        R.check(tel == (200, {"status": "accepted"}), f"telemetry while the database is down: 200, dropped ({tel})")
        st, ready = s.get("/api/v1/readyz", key=None, timeout=45)
        R.check(st == 503 and ready.get("database") is False and ready.get("ready") is False,
                f"readyz while the database is down: 503, not ready ({st} {ready})")
        R.check(s.get("/api/v1/healthz", key=None)[0] == 200, "healthz (liveness) still answers 200")
        time.sleep(5)
        during = len(answers)
        subprocess.run([LOOM_BIN, "pg", "start", "--data-dir", s.dir], check=True, env=env, capture_output=True)
        t.join(60)
        R.check(during <= 2, f"8 s of outage: {during} answers to a client that re-polls at once "
                             f"(held, not a 503 each)")
        last = answers[-1] if answers else (0, 0, None)
        R.check(last[1] == 200 and last[2].get("model_id") == model,
                f"the held request is answered once the database is back ({len(answers)} answers,"
                f" {last[0] - stopped:.1f} s after the stop): {str(last[2])[:120]}")
        fb = s.post("/api/v1/forward_backward", {"model_id": model, "seq_id": 1, "forward_backward_input": {
            "loss_fn": "cross_entropy", "data": [{"model_input": {"chunks": [{"tokens": [1, 2]}]},
                                                  "loss_fn_inputs": {"target_tokens": {"data": [2, 3]}}}]}})[1]
        R.check("metrics" in s.result(fb["request_id"], timeout=60), "training goes on after the outage")
    R.finish()


if __name__ == "__main__":
    main()
