#!/usr/bin/env python3
"""api_errors_test.py: the api's error contract, end to end over HTTP against `loom up`.

Every error is a JSON {"detail": ...} with a 4xx status and a message naming the problem;
another tenant's objects are 404; resubmitting (model_id, seq_id) is idempotent, also
under concurrency; oversized bodies get 413 JSON; the process survives all of it.
A second `loom api` on the same database checks --path-prefix and --max-body-mb.
Prints "N passed, N failed" last; exits non-zero on failure.
"""
import http.client
import json
import os
import socket
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from apitest import is_detail, loom_cli, start_second_api  # noqa: E402
from stack import Results, Stack  # noqa: E402

R = Results()


def datum(tokens, targets=None, weights=None, **more):
    lfi = {}
    if targets is not None:
        lfi["target_tokens"] = {"data": targets, "dtype": "int64", "shape": [len(targets)]}
    if weights is not None:
        lfi["weights"] = {"data": weights, "dtype": "float32", "shape": [len(weights)]}
    lfi.update(more)
    return {"model_input": {"chunks": [{"tokens": tokens, "type": "encoded_text"}]},
            "loss_fn_inputs": lfi}


def with_weights(d, weights):
    """A datum with loss_fn_inputs.weights set to a TensorData as given."""
    d["loss_fn_inputs"]["weights"] = weights
    return d


def fwdbwd(model_id, seq_id, data, loss_fn="cross_entropy", **more):
    body = {"model_id": model_id, "forward_backward_input": {"loss_fn": loss_fn, "data": data},
            "type": "forward_backward"}
    if seq_id is not None:
        body["seq_id"] = seq_id
    body["forward_backward_input"].update(more)
    return body


def raw_http(url, request_bytes, timeout=30):
    """Sends raw bytes, returns (status, parsed JSON body or text) read until close."""
    u = urllib.parse.urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=timeout) as sock:
        sock.sendall(request_bytes)
        buf = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1]) if lines and lines[0].startswith(b"HTTP/") else 0
    headers = {l.split(b":", 1)[0].strip().lower(): l.split(b":", 1)[1].strip()
               for l in lines[1:] if b":" in l}
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            n = int(size_line.split(b";")[0], 16) if size_line.strip() else 0
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def oversized_request(path, key, length):
    """Headers announcing a body of `length` bytes; only a little of it is sent."""
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"X-API-Key: {key}\r\nContent-Length: {length}\r\n\r\n").encode() + b"{\"a\": \"" + b"x" * 1000


def main():
    # The pending-future check below waits on a gap (seq_id 40 behind 2..39) for a whole
    # long poll: the scheduler must not give up on the gap meanwhile.
    with Stack(extra_args=["--seq-gap-timeout-s", "600"]) as s:
        secret = os.path.join(s.dir, "secret.key")
        loom_cli(s, "tenant", "create", "other-tenant")
        other_key = loom_cli(s, "key", "create", "--tenant", "other-tenant", "--secret-file", secret)

        # ---- no key needed (telemetry needs one: it is after authentication) -------------
        st, body = s.get("/api/v1/healthz", key=None)
        R.check(st == 200 and body == {"status": "ok"}, "healthz without a key")
        st, body = s.post("/api/v1/client/config", {"sdk_version": "0.24.1"}, key=None)
        R.check(st == 200 and body.get("use_pyqwest_transport") is False
                and body.get("pjwt_auth_enabled") is False, "client/config")
        st, body = s.request("POST", "/api/v1/telemetry", raw=b"{not json")
        R.check(st == 200 and body == {"status": "accepted"}, "telemetry accepts even garbage")

        # ---- authentication -------------------------------------------------------------
        R.check(is_detail(s.get("/api/v1/get_server_capabilities", key=None), 401, "api key"),
                "missing key -> 401 JSON")
        R.check(is_detail(s.get("/api/v1/get_server_capabilities", key="tml-" + "A" * 43), 401,
                          "invalid"), "unknown tml- key -> 401 JSON")
        R.check(is_detail(s.get("/api/v1/get_server_capabilities", key="not-a-key"), 401),
                "malformed key -> 401 JSON")
        st, caps = s.get("/api/v1/get_server_capabilities", key=None,
                         headers={"Authorization": "Bearer " + s.key})
        R.check(st == 200 and caps["supported_models"], "Authorization: Bearer accepted")
        base_model = caps["supported_models"][0]["model_name"]
        vocab, max_ctx = (int(x) for x in s.psql(
            f"SELECT vocab_size, max_context FROM base_models WHERE name = '{base_model}'").split("|"))
        revoked = loom_cli(s, "key", "create", "--tenant", "other-tenant", "--secret-file", secret)
        s.psql(f"UPDATE api_keys SET revoked_at = now() WHERE prefix = '{revoked[4:12]}'")
        R.check(is_detail(s.post("/api/v1/create_session", {}, key=revoked), 401, "revoked"),
                "revoked key -> 401 JSON")

        # ---- malformed bodies -------------------------------------------------------------
        resp = s.request("POST", "/api/v1/create_session", raw=b'{"tags": ["a",')
        R.check(is_detail(resp, 400, "malformed json", "line", "column"),
                "malformed JSON -> 400 saying where")
        R.check(is_detail(s.request("POST", "/api/v1/create_session", raw=b"[1, 2]"), 400, "object"),
                "non-object body -> 400")
        R.check(is_detail(s.post("/api/v1/create_session", {"tags": "a,b"}), 400, "tags"),
                "tags of the wrong type -> 400 naming tags")

        # ---- routes -------------------------------------------------------------------------
        R.check(is_detail(s.post("/api/v1/no_such_thing", {}), 404, "no such route"),
                "unknown route -> 404 JSON")
        R.check(is_detail(s.get("/api/v1/create_session"), 405, "GET"), "wrong method -> 405 JSON")
        sid0 = s.post("/api/v1/create_session", {})[1]["session_id"]
        R.check(is_detail(s.get(f"/api/v1/sessions/{sid0}/trace_export"), 404, "not implemented in Loom"),
                "GET sessions/{id}/trace_export (not offered) -> 404 JSON")
        R.check(is_detail(s.request("PUT", f"/api/v1/sessions/{sid0}/project", {}), 400, "project_id"),
                "PUT sessions/{id}/project without project_id -> 400 naming it")
        R.check(is_detail(s.request("PUT", f"/api/v1/sessions/{sid0}/project", {"project_id": ""}), 400, "project_id"),
                "PUT sessions/{id}/project with an empty project_id -> 400 (a project cannot be cleared)")
        R.check(is_detail(s.request("PUT", "/api/v1/sessions/no-such-session/project", {"project_id": "p"}), 404,
                          "not found"), "PUT sessions/{id}/project of an unknown session -> 404")
        st, moved = s.request("PUT", f"/api/v1/sessions/{sid0}/project", {"project_id": "p1"})
        R.check(st == 200 and moved == {"session_id": sid0, "project_id": "p1"}
                and s.get(f"/api/v1/sessions/{sid0}")[1].get("project_id") == "p1",
                f"PUT sessions/{{id}}/project moves the session: {st} {moved}")
        R.check(is_detail(s.post("/api/v1/auth/token", {}), 501, "not implemented"),
                "spec route not implemented yet -> 501 JSON")

        # ---- sessions and models --------------------------------------------------------------
        st, sess = s.post("/api/v1/create_session",
                          {"tags": ["t"], "user_metadata": None, "sdk_version": "0.24.1",
                           "type": "create_session", "unknown_field": 1})
        R.check(st == 200 and isinstance(sess.get("session_id"), str), "create_session (tolerant)")
        sid = sess["session_id"]
        R.check(not any(c in sid for c in "/?#: "), "session id is URL safe")
        R.check(is_detail(s.post("/api/v1/session_heartbeat", {"session_id": sid}, key=other_key),
                          404), "other tenant's session heartbeat -> 404")
        R.check(is_detail(s.post("/api/v1/session_heartbeat", {"session_id": "nope"}), 404),
                "unknown session heartbeat -> 404")

        cm = {"session_id": sid, "model_seq_id": 0, "base_model": base_model,
              "lora_config": {"rank": 8, "seed": 1}}
        R.check(is_detail(s.post("/api/v1/create_model", dict(cm, base_model="no/such-model")), 400,
                          "no/such-model", base_model), "unknown base_model -> 400 listing models")
        R.check(is_detail(s.post("/api/v1/create_model", dict(cm, lora_config={"rank": 0})), 400,
                          "rank"), "rank 0 -> 400")
        R.check(is_detail(s.post("/api/v1/create_model", dict(cm, lora_config={"rank": "8"})), 400,
                          "lora_config.rank", "integer"), "rank as a string -> 400")
        R.check(is_detail(s.post("/api/v1/create_model", dict(cm, lora_config={
            "train_attn": False, "train_mlp": False, "train_unembed": False})), 400, "at least one"),
            "nothing to train -> 400")
        R.check(is_detail(s.post("/api/v1/create_model", cm, key=other_key), 404, "session"),
                "create_model in another tenant's session -> 404")
        st, m1 = s.post("/api/v1/create_model", cm)
        st2, m2 = s.post("/api/v1/create_model", cm)
        R.check(st == 200 and st2 == 200 and m1["request_id"] == m2["request_id"]
                and m1["model_id"] == f"{sid}:train:0", "create_model idempotent on model_seq_id")
        mid = m1["model_id"]
        R.check(s.psql(f"SELECT count(*) FROM models WHERE session_id = '{sid}'") == "1",
                "one models row after a repeated create_model")
        R.check(is_detail(s.post("/api/v1/get_info", {"model_id": mid}, key=other_key), 404),
                "other tenant's get_info -> 404")
        st, info = s.post("/api/v1/get_info", {"model_id": mid})
        R.check(st == 200 and info["model_id"] == mid and "model_data" in info, "get_info")

        # ---- forward_backward validation --------------------------------------------------------
        good = datum([1, 2, 3], [2, 3, 4], [1.0, 1.0, 0.5])
        fb = lambda data, **kw: s.post("/api/v1/forward_backward", fwdbwd(mid, 5, data, **kw))
        R.check(is_detail(fb([datum(["a", 2, 3], [2, 3, 4])]), 400, "data[0]", "tokens[0]", "integer"),
                "token of the wrong type -> 400 naming it")
        R.check(is_detail(fb([good, datum([1, vocab, 3], [2, 3, 4])]), 400, "data[1]", "vocabulary",
                          str(vocab)), "out-of-range token -> 400")
        R.check(is_detail(fb([datum([1, 2, 3], [2, -1, 4])]), 400, "target_tokens", "vocabulary"),
                "out-of-range target -> 400")
        R.check(is_detail(fb([datum([1, 2, 3], [2, 3, 4], [1.0, 1.0])]), 400, "weights", "2 values",
                          "3 tokens"), "weights length mismatch -> 400")
        R.check(is_detail(fb([datum([1, 2, 3], [2, 3])]), 400, "target_tokens"),
                "target length mismatch -> 400")
        R.check(is_detail(fb([good], loss_fn="mse"), 400, "unknown loss", "mse"),
                "unknown loss_fn -> 400")
        R.check(is_detail(fb([good], loss_fn="ppo"), 400, "logprobs", "ppo"),
                "ppo without logprobs -> 400")
        R.check(is_detail(fb([datum([1, 2, 3], [2, 3, 4], logprobs=[0.0, 0.0, 0.0])],
                             loss_fn="importance_sampling"), 400, "advantages"),
                "importance_sampling without advantages -> 400")
        img = {"model_input": {"chunks": [{"type": "image", "data": "AAAA", "format": "png"}]},
               "loss_fn_inputs": {}}
        R.check(is_detail(fb([img]), 400, "only text chunks"), "image chunk -> 400")
        # 2-D loss inputs: cross_entropy target_tokens / weights [N, K] only (docs/protocol.md §8)
        t2 = {"data": [1, 2, 3, 4], "dtype": "int64", "shape": [2, 2]}
        w2 = {"data": [1.0, 0.5, 1.0, 0.5], "dtype": "float32", "shape": [2, 2]}
        rl2 = {"data": [0.0, 0.0, 0.0, 0.0], "dtype": "float32", "shape": [2, 2]}
        R.check(is_detail(fb([datum([1, 2], [2, 3], None, logprobs=rl2, advantages=[1.0, 1.0])],
                             loss_fn="ppo"), 400, "logprobs", "2-d",
                          "cross_entropy"), "2-D logprobs for ppo -> 400 (2-D only for cross_entropy)")
        R.check(is_detail(fb([datum([1, 2], None, None, target_tokens=t2, logprobs=[0.0, 0.0],
                                    advantages=[1.0, 1.0])], loss_fn="importance_sampling"), 400,
                          "target_tokens", "2-d", "cross_entropy"),
                "2-D target_tokens for importance_sampling -> 400")
        R.check(is_detail(fb([datum([1, 2], [2, 3], None, logprobs=[0.0, 0.0],
                                    advantages=dict(rl2, sparse_crow_indices=[0, 0, 0],
                                                    sparse_col_indices=[], data=[]))],
                             loss_fn="cispo"), 400, "2-d", "cross_entropy"),
                "sparse CSR advantages for cispo -> 400")
        R.check(is_detail(fb([datum([1, 2], None, [1.0, 1.0], target_tokens=t2)]), 400, "weights",
                          "1-D", "[2, 2]"), "2-D targets with 1-D weights -> 400 saying so")
        R.check(is_detail(fb([with_weights(datum([1, 2], None, None, target_tokens=t2), {
            "data": [1.0] * 6, "dtype": "float32", "shape": [2, 3]})]), 400, "weights", "K = 3", "K = 2"),
            "2-D weights with another K than target_tokens -> 400")
        R.check(is_detail(fb([with_weights(datum([1, 2], [2, 3]), w2)]), 400, "weights", "1-D"),
                "2-D weights with 1-D targets -> 400")
        R.check(is_detail(fb([with_weights(datum([1, 2, 3], None, None, target_tokens=t2), w2)]), 400,
                          "target_tokens", "[2, 2]", "3 tokens"), "2-D rows != input tokens -> 400")
        R.check(is_detail(fb([datum([1, 2], None, None, target_tokens=dict(t2, shape=[2, 3]))]), 400,
                          "shape [2, 3]", "6 values"), "2-D shape that does not match the data -> 400")
        R.check(is_detail(fb([datum([1, 2], None, None, target_tokens={
            "data": [1] * 2050, "dtype": "int64", "shape": [2, 1025]})]), 400, "1024"),
            "K = 1025 -> 400 (K <= 1024)")
        R.check(is_detail(fb([datum([1, 2], None, None, target_tokens=dict(t2, data=[1, 2, vocab, 4]))]),
                          400, "target_tokens", "vocabulary", "[1, 0]"), "2-D target outside the vocabulary -> 400")
        R.check(is_detail(fb([datum([1, 2], None, None, target_tokens=dict(t2, shape=[1, 2, 2]))]), 400,
                          "dimensions"), "3-D loss input -> 400")
        R.check(is_detail(fb([datum([1, 2], None, None, target_tokens={"data": [[1, 2], [3, 4]],
                                                                        "dtype": "int64", "shape": [2, 2]})]),
                          400, "flat", "row-major"), "nested lists -> 400 (2-D is flat with a shape)")
        csr = lambda **kw: dict({"data": [5, 6, 7], "dtype": "int64", "shape": [2, 3],
                                 "sparse_crow_indices": [0, 2, 3], "sparse_col_indices": [0, 2, 1]}, **kw)
        bad_csr = [
            (csr(sparse_crow_indices=[0, 3]), "crow_indices has 2 entries", "crow of the wrong length"),
            (csr(sparse_crow_indices=[0, 1, 2]), "end at the number of values 3", "crow ending short"),
            (csr(sparse_crow_indices=[1, 2, 3]), "start at 0", "crow not starting at 0"),
            (csr(sparse_col_indices=[0, 3, 1]), "outside [0, 3)", "col out of range"),
            (csr(sparse_col_indices=[0, -1, 1]), "outside [0, 3)", "negative col"),
            (csr(sparse_col_indices=[0, 0, 1]), "twice", "repeated col in a row"),
            (csr(sparse_col_indices=[0, 2]), "col_indices has 2 entries", "col shorter than the values"),
            (csr(shape=None), "shape", "CSR without a shape"),
            (csr(shape=[6]), "shape", "CSR with a 1-D shape"),
            (csr(sparse_col_indices=None), "sparse_col_indices", "CSR without col indices"),
            (csr(sparse_crow_indices=[0, "a", 3]), "sparse_crow_indices[1]", "CSR index of the wrong type"),
        ]
        for t, word, what in bad_csr:
            R.check(is_detail(fb([datum([1, 2], None, None, target_tokens=t)]), 400, "target_tokens", word),
                    f"bad sparse CSR ({what}) -> 400")
        dec = csr(sparse_crow_indices=[0, 2, 1, 3], shape=[3, 3], sparse_col_indices=[0, 2, 1])
        R.check(is_detail(fb([datum([1, 2, 3], None, None, target_tokens=dec)]), 400, "must not decrease"),
                "bad sparse CSR (decreasing crow) -> 400")
        R.check(is_detail(fb([datum([1, 2], None, None, target_tokens=csr(data=[5, 6, vocab]))]), 400,
                          "vocabulary", "[1, 1]"), "CSR target outside the vocabulary -> 400")
        R.check(is_detail(fb([datum(list(range(1, max_ctx + 2)), list(range(1, max_ctx + 2)))]), 400,
                          "context"), "longer than the context -> 400")
        R.check(is_detail(fb([datum([1, 2, 3], [2, 3, 4], [1.0, 1e39, 1.0])]), 400, "finite"),
                "float32 overflow -> 400")
        R.check(is_detail(fb([]), 400, "at least one datum"), "empty data -> 400")
        R.check(is_detail(s.post("/api/v1/forward_backward", fwdbwd(mid, 0, [good])), 400, "seq_id"),
                "seq_id 0 -> 400")
        R.check(is_detail(s.post("/api/v1/forward_backward", fwdbwd(mid, 5, [good]), key=other_key),
                          404), "other tenant's model -> 404")
        R.check(is_detail(s.post("/api/v1/forward_backward", fwdbwd(mid + "x", 5, [good])), 404),
                "unknown model -> 404")
        R.check(is_detail(s.post("/api/v1/forward", {"model_id": mid, "seq_id": 5}), 400,
                          "forward_input"), "forward without forward_input -> 400")

        # ---- optim_step validation ------------------------------------------------------------
        opt = lambda ap: s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": 6, "adam_params": ap})
        R.check(is_detail(opt({"learning_rate": -1}), 400, "learning_rate"), "negative lr -> 400")
        R.check(is_detail(opt({"beta1": 1.0}), 400, "beta1"), "beta1 = 1 -> 400")
        R.check(is_detail(opt({"eps": 0}), 400, "eps"), "eps = 0 -> 400")
        # Sane ranges (docs/protocol.md §7.5): 1e17 used to be taken and turned the model to NaN.
        for ap, field in (({"learning_rate": 1e17}, "learning_rate"), ({"learning_rate": 11}, "learning_rate"),
                          ({"eps": 2}, "eps"), ({"weight_decay": 10.5}, "weight_decay"),
                          ({"beta2": -0.1}, "beta2")):
            R.check(is_detail(opt(ap), 400, "adam_params." + field, "must be in"), f"{ap} -> 400 naming {field}")
        R.check(is_detail(opt({"learning_rate": "fast"}), 400, "learning_rate", "number"),
                "lr as a string -> 400")

        # ---- sampling sessions ------------------------------------------------------------------
        css = lambda body, **kw: s.post("/api/v1/create_sampling_session", body, **kw)
        R.check(is_detail(css({"session_id": "nope", "base_model": base_model}), 404, "session nope"),
                "create_sampling_session in an unknown session -> 404")
        R.check(is_detail(css({"session_id": sid}), 400, "base_model", "model_path"),
                "create_sampling_session without a source -> 400 naming both fields")
        R.check(is_detail(css({"session_id": sid, "base_model": "no/such"}), 400, "no/such", base_model),
                "create_sampling_session with an unknown base_model -> 400 listing models")
        R.check(is_detail(css({"session_id": sid, "model_path": "s3://x/y"}), 400, "tinker://"),
                "model_path that is not tinker:// -> 400")
        R.check(is_detail(css({"session_id": sid, "model_path": "tinker://x:train:0/sampler_weights/1"}), 404,
                          "not found"), "model_path of an unknown checkpoint -> 404")
        R.check(is_detail(css({"session_id": sid, "sampling_session_seq_id": -1, "base_model": base_model}),
                          400, "sampling_session_seq_id"), "negative sampling_session_seq_id -> 400")
        R.check(is_detail(css({"session_id": sid, "sampling_session_seq_id": "0", "base_model": base_model}),
                          400, "sampling_session_seq_id", "integer"), "sampling_session_seq_id as a string -> 400")
        st, ss = css({"session_id": sid, "sampling_session_seq_id": 0, "base_model": base_model})
        R.check(st == 200, "create_sampling_session")
        ssid = ss["sampling_session_id"]
        R.check(is_detail(css({"session_id": sid, "sampling_session_seq_id": 0,
                               "model_path": "tinker://x:train:0/weights/1"}), 404),
                "a taken seq with an unknown model_path -> 404 (the path is checked first)")
        R.check(is_detail(s.get("/api/v1/samplers/nope:sample:0"), 404, "not found"), "unknown sampler -> 404")
        R.check(is_detail(s.get(f"/api/v1/samplers/{ssid}", key=other_key), 404),
                "another tenant's sampler -> 404")

        # ---- asample validation ---------------------------------------------------------------
        def smp(params=None, **top):
            body = {"sampling_session_id": ssid, "seq_id": 3, "num_samples": 1,
                    "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
                    "sampling_params": params if params is not None else {"max_tokens": 4}}
            body.update(top)
            return s.post("/api/v1/asample", body)
        R.check(is_detail(s.post("/api/v1/asample", {"base_model": base_model, "prompt": {"chunks": []}}), 400,
                          "create a sampling session", "create_sampling_session"),
                "legacy asample with base_model -> 400 saying to create a sampling session")
        R.check(is_detail(s.post("/api/v1/asample", {"model_path": "tinker://a/sampler_weights/b"}), 400,
                          "sampling session"), "legacy asample with model_path -> 400")
        R.check(is_detail(s.post("/api/v1/asample", {}), 400, "sampling_session_id is required"),
                "asample without a sampling session -> 400")
        R.check(is_detail(smp(sampling_session_id="nope:sample:0"), 404, "sampling session"),
                "unknown sampling session -> 404")
        R.check(is_detail(smp(num_samples=0), 400, "num_samples", "128"), "num_samples 0 -> 400")
        R.check(is_detail(smp(num_samples=129), 400, "num_samples"), "num_samples 129 -> 400")
        R.check(is_detail(smp(prompt=None), 400, "prompt is required"), "no prompt -> 400")
        R.check(is_detail(smp(prompt={"chunks": []}), 400, "prompt has no tokens"), "empty prompt -> 400")
        R.check(is_detail(smp(prompt={"chunks": [{"tokens": [1, vocab]}]}), 400, "prompt", "vocabulary"),
                "prompt token outside the vocabulary -> 400")
        R.check(is_detail(smp(prompt={"chunks": [{"tokens": ["a"]}]}), 400, "prompt.chunks[0].tokens[0]"),
                "prompt token of the wrong type -> 400 naming it")
        R.check(is_detail(smp(prompt={"chunks": [{"type": "image", "data": "AA", "format": "png"}]}), 400,
                          "only text chunks"), "image prompt -> 400")
        R.check(is_detail(smp({"max_tokens": max_ctx}), 400, "max_tokens", "context"),
                "prompt + max_tokens over the context -> 400")
        R.check(is_detail(smp(prompt={"chunks": [{"tokens": [1] * max_ctx}]}, sampling_params={}), 400,
                          "no room"), "prompt filling the whole context -> 400")
        R.check(is_detail(smp({"max_tokens": 0}), 400, "max_tokens"), "max_tokens 0 -> 400")
        R.check(is_detail(smp({"temperature": -0.1}), 400, "temperature"), "negative temperature -> 400")
        R.check(is_detail(smp({"temperature": "hot"}), 400, "temperature", "number"), "temperature string -> 400")
        R.check(is_detail(smp({"top_p": 0}), 400, "top_p", "(0, 1]"), "top_p 0 -> 400")
        R.check(is_detail(smp({"top_p": 1.5}), 400, "top_p"), "top_p 1.5 -> 400")
        R.check(is_detail(smp({"top_k": 0}), 400, "top_k", "-1"), "top_k 0 -> 400")
        R.check(is_detail(smp({"seed": -5}), 400, "seed"), "negative seed -> 400")
        R.check(is_detail(smp(topk_prompt_logprobs=21), 400, "topk_prompt_logprobs", "20"),
                "topk_prompt_logprobs 21 -> 400")
        R.check(is_detail(smp(prompt_logprobs="yes"), 400, "prompt_logprobs"), "prompt_logprobs string -> 400")
        R.check(is_detail(smp({"stop": ["\n", 13]}), 400, "mixes strings and token ids"),
                "mixed stop list -> 400")
        R.check(is_detail(smp({"stop": [13, vocab]}), 400, "stop[1]", "vocabulary"),
                "stop token outside the vocabulary -> 400")
        R.check(is_detail(smp({"stop": {"a": 1}}), 400, "stop"), "stop of the wrong type -> 400")
        R.check(is_detail(smp({"stop": [""]}), 400, "non-empty"), "empty stop string -> 400")
        R.check(is_detail(smp(seq_id=-1), 400, "seq_id"), "negative seq_id -> 400")
        # SDK >= 0.29 outputs (docs/protocol.md §11.1): bounds and shapes, each naming its field
        for field in ("topk_sample_logprobs", "prompt_alt_tokens_k"):
            R.check(is_detail(smp(**{field: 21}), 400, field, "20"), f"{field} 21 -> 400")
            R.check(is_detail(smp(**{field: -1}), 400, field), f"{field} -1 -> 400")
            R.check(is_detail(smp(**{field: "3"}), 400, field, "integer"), f"{field} as a string -> 400")
        R.check(is_detail(smp({"max_tokens": 2000}, num_samples=128, topk_sample_logprobs=20), 400,
                          "topk_sample_logprobs", "num_samples"),
                "topk_sample_logprobs x num_samples x max_tokens over 2^22 -> 400")
        R.check(is_detail(smp(prompt_logprobs_last_n=2), 400, "prompt_logprobs_last_n", "prompt_logprobs"),
                "prompt_logprobs_last_n without prompt_logprobs -> 400")
        R.check(is_detail(smp(prompt_logprobs=True, prompt_logprobs_last_n=-1), 400, "prompt_logprobs_last_n"),
                "negative prompt_logprobs_last_n -> 400")

        def tpl(**t):
            return smp(target_prompt_logprobs=dict({"dtype": "int64", "shape": [2, 2], "data": [5, -1, -1, 7]}, **t))
        R.check(is_detail(tpl(shape=[3, 2], data=[5] * 6), 400, "target_prompt_logprobs.shape", "[2, K]"),
                "target_prompt_logprobs with len(prompt) rows instead of len(prompt) - 1 -> 400")
        R.check(is_detail(tpl(shape=[2, 1025], data=[5] * 2050), 400, "target_prompt_logprobs.shape", "1024"),
                "target_prompt_logprobs K over 1024 -> 400")
        R.check(is_detail(tpl(shape=[2]), 400, "target_prompt_logprobs.shape"), "1-D target_prompt_logprobs -> 400")
        R.check(is_detail(tpl(data=[5, -1, 7]), 400, "target_prompt_logprobs", "needs 4 values"),
                "dense target_prompt_logprobs with the wrong number of values -> 400")
        R.check(is_detail(tpl(dtype="float32"), 400, "target_prompt_logprobs.dtype"),
                "float target_prompt_logprobs -> 400")
        R.check(is_detail(tpl(data=[5, -1, -1, vocab]), 400, "target_prompt_logprobs.data[3]", "vocabulary"),
                "target id outside the vocabulary -> 400 naming the cell")
        R.check(is_detail(tpl(data=[5, -2, -1, 7]), 400, "target_prompt_logprobs.data[1]"),
                "target id below -1 -> 400")
        R.check(is_detail(tpl(data=[-1, -1, -1, -1]), 400, "target_prompt_logprobs", "no token id"),
                "target_prompt_logprobs of -1 only -> 400")
        R.check(is_detail(tpl(data=[5, 7], sparse_crow_indices=[0, 1, 3], sparse_col_indices=[0, 1]), 400,
                          "sparse CSR", "end at the number of values"), "CSR crow not ending at nnz -> 400")
        R.check(is_detail(tpl(data=[5, 7], sparse_crow_indices=[0, 1], sparse_col_indices=[0, 1]), 400,
                          "sparse CSR", "rows + 1"), "CSR crow of the wrong length -> 400")
        R.check(is_detail(tpl(data=[5, 7], sparse_crow_indices=[0, 2, 2], sparse_col_indices=[1, 1]), 400,
                          "sparse_col_indices[1]", "rise"), "CSR column repeated in a row -> 400")
        R.check(is_detail(tpl(data=[5, 7], sparse_crow_indices=[0, 1, 2], sparse_col_indices=[0, 2]), 400,
                          "sparse_col_indices[1]", "[0, 2)"), "CSR column outside [0, K) -> 400")
        R.check(is_detail(tpl(data=[5, 7], sparse_crow_indices=[0, 1, 2]), 400, "sparse CSR", "both"),
                "CSR with crow but without col -> 400")
        R.check(is_detail(smp(prompt={"chunks": [{"tokens": [1]}]},
                              target_prompt_logprobs={"data": [], "shape": [0, 1]}), 400,
                          "target_prompt_logprobs", "at least 2 tokens"), "target_prompt_logprobs of a 1-token prompt")
        R.check(is_detail(smp(target_prompt_logprobs=[1, 2]), 400, "target_prompt_logprobs", "TensorData"),
                "target_prompt_logprobs as a bare list -> 400")
        R.check(s.psql(f"SELECT count(*) FROM operations WHERE sampling_session_id = '{ssid}'") == "0",
                "no sample operation written by any rejected request")

        # ---- save_weights_for_sampler / unload_model validation ---------------------------------
        swfs = lambda body, **kw: s.post("/api/v1/save_weights_for_sampler", body, **kw)
        R.check(is_detail(swfs({"seq_id": 3}), 400, "model_id is required"), "save_weights_for_sampler without model_id")
        R.check(is_detail(swfs({"model_id": mid + "x", "seq_id": 3}), 404), "save_weights_for_sampler unknown model")
        R.check(is_detail(swfs({"model_id": mid, "seq_id": 0}), 400, "seq_id"), "save_weights_for_sampler seq_id 0")
        R.check(is_detail(swfs({"model_id": mid, "seq_id": 3, "sampling_session_seq_id": -2}), 400,
                          "sampling_session_seq_id"), "negative sampling_session_seq_id -> 400")
        R.check(is_detail(swfs({"model_id": mid, "seq_id": 3, "sampling_session_seq_id": 0}), 400,
                          "already used"), "sampling_session_seq_id already used -> 400")
        R.check(is_detail(s.post("/api/v1/unload_model", {}), 400, "model_id"), "unload_model without model_id")
        R.check(is_detail(s.post("/api/v1/unload_model", {"model_id": "nope"}), 404), "unload_model unknown model")

        # ---- REST query parameters --------------------------------------------------------------
        R.check(is_detail(s.get("/api/v1/training_runs?limit=0"), 400, "limit"), "limit=0 -> 400")
        R.check(is_detail(s.get("/api/v1/sessions?limit=abc"), 400, "limit"), "limit=abc -> 400")
        R.check(is_detail(s.get("/api/v1/sessions?offset=-1"), 400, "offset"), "offset=-1 -> 400")
        R.check(is_detail(s.get("/api/v1/training_runs?access_scope=everything"), 400, "access_scope"),
                "unknown access_scope -> 400")
        R.check(is_detail(s.get("/api/v1/sessions/nope"), 404, "session nope"), "unknown session -> 404")
        R.check(is_detail(s.get(f"/api/v1/sessions/{sid}", key=other_key), 404), "another tenant's session -> 404")

        # ---- bodies: encodings and content types ------------------------------------------------
        R.check(is_detail(s.request("POST", "/api/v1/create_session", raw=b"{}",
                                    headers={"Content-Encoding": "gzip"}), 415, "content-encoding"),
                "Content-Encoding gzip -> 415 JSON")
        R.check(is_detail(s.request("POST", "/api/v1/create_session", raw=b"{}",
                                    headers={"Content-Encoding": "zstd"}), 400, "zstd"),
                "Content-Encoding zstd with a body that is not zstd -> 400 JSON")
        R.check(is_detail(s.request("POST", "/api/v1/optim_step", raw=b"\x0a\x01x",
                                    headers={"Content-Type": "application/x-protobuf"}), 415, "json"),
                "protobuf body on a JSON-only route -> 415 JSON")
        st, body = s.request("POST", "/api/v1/create_session", raw=b"{}", headers={"Content-Encoding": "identity"})
        R.check(st == 200, "Content-Encoding identity accepted")

        # ---- key scopes -------------------------------------------------------------------------
        ro_key = loom_cli(s, "key", "create", "--tenant", "default", "--scopes", "read", "--secret-file", secret)
        R.check(s.post("/api/v1/forward_backward", fwdbwd(mid, 3, [datum([1, 2], [2, 3])]), key=ro_key)
                == (403, {"detail": "this API key is read-only"}), "read-only key: submit -> 403 JSON")
        R.check(s.post("/api/v1/asample", {"sampling_session_id": ssid}, key=ro_key)
                == (403, {"detail": "this API key is read-only"}), "read-only key: asample -> 403 JSON")
        R.check(s.get("/api/v1/get_server_capabilities", key=ro_key)[0] == 200, "read-only key: reads work")

        # ---- a valid submission, idempotency ------------------------------------------------
        body = fwdbwd(mid, 1, [good])
        st, f1 = s.post("/api/v1/forward_backward", body)
        st2, f2 = s.post("/api/v1/forward_backward", body)
        R.check(st == 200 and st2 == 200 and f1["request_id"] == f2["request_id"],
                "forward_backward resubmission returns the same request_id")
        R.check(s.psql(f"SELECT count(*) FROM operations WHERE model_id = '{mid}' AND seq_id = 1") == "1",
                "one operations row for a resubmitted seq_id")
        R.check(is_detail(s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": 1}), 400,
                          "seq_id 1", "already used"), "seq_id reused by another kind -> 400")

        # the same (model_id, seq_id) from 8 threads at once
        ids, barrier = [], threading.Barrier(8)

        def submit():
            barrier.wait()
            ids.append(s.post("/api/v1/forward_backward", fwdbwd(mid, 40, [good])))
        threads = [threading.Thread(target=submit) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        R.check(len(ids) == 8 and all(st == 200 for st, _ in ids)
                and len({b["request_id"] for _, b in ids}) == 1,
                "concurrent resubmission: one request_id")
        R.check(s.psql(f"SELECT count(*) FROM operations WHERE model_id = '{mid}' AND seq_id = 40") == "1",
                "concurrent resubmission: exactly one row")

        # ---- futures ---------------------------------------------------------------------------
        R.check(is_detail(s.post("/api/v1/retrieve_future", {"request_id": f1["request_id"]},
                                 key=other_key), 404), "another tenant's future -> 404")
        R.check(is_detail(s.post("/api/v1/retrieve_future", {"request_id": "req-nope"}), 404),
                "unknown future -> 404")
        R.check(is_detail(s.post("/api/v1/retrieve_future", {}), 400, "request_id"),
                "retrieve_future without request_id -> 400")
        # seq 40 waits for 2..39 forever: its future stays pending
        pending = ids[0][1]["request_id"]
        t0 = time.time()
        st, body = s.post("/api/v1/retrieve_future", {"request_id": pending})
        took = time.time() - t0
        R.check(st == 200 and body.get("type") == "try_again" and body.get("request_id") == pending
                and 20 <= took <= 30, f"pending future long-polls, then try_again ({took:.1f} s)")
        # a client that gives up in the middle of a long poll
        u = urllib.parse.urlparse(s.url)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
        c.request("POST", "/api/v1/retrieve_future", json.dumps({"request_id": pending}),
                  {"X-API-Key": s.key, "Content-Type": "application/json"})
        time.sleep(0.5)
        c.close()
        time.sleep(1.5)  # past the next recheck of the abandoned request
        R.check(s.get("/api/v1/healthz", key=None)[0] == 200, "alive after an abandoned long poll")

        # ---- body limits --------------------------------------------------------------------------
        st, body = raw_http(s.url, oversized_request("/api/v1/forward_backward", s.key, 65 << 20))
        R.check(st == 413 and isinstance(body, dict) and "detail" in body, "65 MiB body -> 413 JSON")

        api2, url2 = start_second_api(s, "--path-prefix", "/x/y/", "--max-body-mb", "1")
        try:
            st, body = raw_http(url2, b"GET /x/y/api/v1/healthz HTTP/1.1\r\nHost: t\r\n"
                                      b"Connection: close\r\n\r\n")
            R.check(st == 200 and body == {"status": "ok"}, "--path-prefix: healthz under /x/y")
            st, body = raw_http(url2, oversized_request("/x/y/api/v1/create_session", s.key, 2 << 20))
            R.check(st == 413 and "1 MiB" in body.get("detail", ""), "--max-body-mb 1: 2 MiB -> 413 JSON")
            ok = json.dumps(fwdbwd(mid, 7, [good])).encode()
            st, body = raw_http(url2, (f"POST /x/y/api/v1/forward_backward HTTP/1.1\r\nHost: t\r\n"
                                       f"X-API-Key: {s.key}\r\nContent-Length: {len(ok)}\r\n"
                                       f"Connection: close\r\n\r\n").encode() + ok)
            R.check(st == 200 and "request_id" in body, "--path-prefix: submit under /x/y")
        finally:
            api2.terminate()
            api2.wait()

        # Bad UTF-8 inside a JSON string: a 400 that says so, not a crash or a stored row.
        st, body = s.request("POST", "/api/v1/create_session", raw=b'{"tags": ["ok", "\xff\xfe bad"]}')
        R.check(st == 400 and isinstance(body, dict) and "detail" in body, f"invalid UTF-8 in a body -> 400 JSON: {body}")
        st, body = s.post("/api/v1/client/dynamic_config", {"sdk_version": "0.25.0"}, key=None)
        R.check(st == 200 and body.get("refresh_interval_sec") == 300, f"client/dynamic_config: {body}")
        # Nothing half-written after the whole bad-input suite: every model has its
        # create_model operation, every operation belongs to a live model or sampler,
        # and no submit left a row without its payload.
        orphans = s.psql("SELECT (SELECT count(*) FROM models m WHERE NOT EXISTS (SELECT 1 FROM operations o"
                         "  WHERE o.model_id = m.id AND o.seq_id = 0 AND o.kind = 'create_model'))"
                         " + (SELECT count(*) FROM operations WHERE model_id IS NULL AND sampling_session_id IS NULL)"
                         " + (SELECT count(*) FROM operations WHERE payload IS NULL OR payload = 'null'::jsonb)")
        R.check(orphans == "0", f"no half-written rows after the bad-input suite ({orphans})")
        st, body = s.get("/api/v1/healthz", key=None)
        R.check(st == 200 and body == {"status": "ok"}, "healthz still answers after all of it")
    R.finish()


if __name__ == "__main__":
    main()
