#!/usr/bin/env python3
"""proto_test.py: the protobuf wire format (docs/protocol.md §1.6, §14) end to end against `loom up`.

Requests are encoded and results decoded by a small hand-written protobuf codec
(tests/lib/tinker_proto.py), independent of Loom's protobuf-c code. Checks:
  * `loom api --proto` advertises proto_write_fwdbwd / fwd_via_fwdbwd in client/config
    (off by default);
  * a protobuf ForwardBackwardRequest becomes the same operation payload as its JSON twin,
    and its result, fetched with Accept: application/x-protobuf and decoded, equals the
    JSON result of the same request; forward_only = true is a 'forward' operation;
    zstd-compressed bodies (Content-Encoding: zstd) decode to the same;
  * protobuf bodies are validated like JSON ones (400 JSON with the same messages);
  * stored sample results encode as SampleResponse (NaN at prompt position 0, top-k
    slots), and envelopes (errors) stay JSON even when protobuf is accepted.
Prints "N passed, N failed" last.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from apitest import start_second_api  # noqa: E402
from stack import Results, Stack  # noqa: E402
import tinker_proto as tp  # noqa: E402

R = Results()
PROTO = "application/x-protobuf"


def http(url, key, path, body, content_type="application/json", accept=None, encoding=None):
    """POST; returns (status, content type, raw body bytes)."""
    h = {"Content-Type": content_type}
    if key:
        h["X-API-Key"] = key
    if accept:
        h["Accept"] = accept
    if encoding:
        h["Content-Encoding"] = encoding
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="POST", headers=h)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def detail(resp, code, *words):
    st, ct, raw = resp
    try:
        body = json.loads(raw)
    except ValueError:
        body = raw
    ok = (st == code and ct.startswith("application/json") and isinstance(body, dict)
          and all(w.lower() in str(body.get("detail", "")).lower() for w in words))
    if not ok:
        print("      got", st, ct, str(body)[:300])
    return ok


def zstd_compress(data):
    """(bytes, None) or (None, reason to skip)."""
    try:
        import zstandard
        return zstandard.ZstdCompressor().compress(data), None
    except ImportError:
        pass
    if shutil.which("zstd"):
        return subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True,
                              check=True).stdout, None
    return None, "neither python3-zstandard nor the zstd command is installed"


def result(s, rid, accept=None, timeout=120):
    """Polls until done; returns (content type, raw body)."""
    import time
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, ct, raw = http(s.url, s.key, "/api/v1/retrieve_future", {"request_id": rid},
                           accept=accept)
        if st != 200:
            raise RuntimeError(f"retrieve_future {st}: {raw[:300]}")
        if ct.startswith("application/json"):
            body = json.loads(raw)
            if body.get("type") == "try_again":
                continue
        return ct, raw
    raise TimeoutError(rid)


def close(a, b, tol=1e-6):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return (a is None and b is None) or (
            a is not None and b is not None and math.isclose(a, b, rel_tol=tol, abs_tol=tol))
    return a == b


def outputs_equal(proto_out, json_out):
    """The decoded protobuf result against the JSON one: per-datum arrays and metrics."""
    pj = [{k: v["data"] for k, v in d.items()} for d in proto_out["loss_fn_outputs"]]
    jj = [{k: v["data"] for k, v in d.items()} for d in json_out["loss_fn_outputs"]]
    shapes_p = [{k: v["shape"] for k, v in d.items()} for d in proto_out["loss_fn_outputs"]]
    shapes_j = [{k: v.get("shape", [len(v["data"])]) for k, v in d.items()}
                for d in json_out["loss_fn_outputs"]]
    ok = close(pj, jj) and shapes_p == shapes_j and close(proto_out["metrics"], json_out["metrics"])
    if not ok:
        print("      proto:", str(proto_out)[:400])
        print("      json: ", str(json_out)[:400])
    return ok


def json_datum(tokens, targets, weights):
    return {"model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
            "loss_fn_inputs": {"target_tokens": {"data": targets, "dtype": "int64", "shape": [len(targets)]},
                               "weights": {"data": weights, "dtype": "float32", "shape": [len(weights)]}}}


def main():
    with Stack() as s:
        # ---- client/config --------------------------------------------------------------
        st, cfg = s.post("/api/v1/client/config", {"sdk_version": "0.24.1"}, key=None)
        R.check(st == 200 and not cfg.get("proto_write_fwdbwd") and not cfg.get("fwd_via_fwdbwd"),
                "client/config: protobuf requests off by default")
        api2, url2 = start_second_api(s, "--proto")
        try:
            st, ct, raw = http(url2, None, "/api/v1/client/config", {"sdk_version": "0.24.1"})
            cfg = json.loads(raw)
            R.check(st == 200 and cfg.get("proto_write_fwdbwd") is True
                    and cfg.get("fwd_via_fwdbwd") is True and cfg.get("use_pyqwest_transport") is False,
                    "loom api --proto: client/config asks for protobuf fwd/bwd")
        finally:
            api2.terminate()
            api2.wait()

        # ---- a model --------------------------------------------------------------------
        st, caps = s.get("/api/v1/get_server_capabilities")
        base = caps["supported_models"][0]["model_name"]
        vocab = int(s.psql(f"SELECT vocab_size FROM base_models WHERE name = '{base}'"))
        sid = s.post("/api/v1/create_session", {})[1]["session_id"]
        st, cm = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": base,
                                                 "lora_config": {"rank": 4, "seed": 3}})
        mid = cm["model_id"]
        s.result(cm["request_id"])

        d1 = ([5, 9, 11, 2], [9, 11, 2, 7], [0.0, 1.0, 1.0, 0.5])
        d2 = ([3, 4, 8], [4, 8, 1], [1.0, 1.0, 1.0])
        jdata = [json_datum(*d1), json_datum(*d2)]
        pdata = [(t, {"target_tokens": ("int64", g), "weights": ("float32", w)}) for t, g, w in (d1, d2)]

        # seq 1: JSON; seq 2: the same request as protobuf
        st, f1 = s.post("/api/v1/forward_backward", {"model_id": mid, "seq_id": 1, "forward_backward_input": {
            "loss_fn": "cross_entropy", "data": jdata}})
        R.check(st == 200, "JSON forward_backward submitted")
        body = tp.fwdbwd_request(mid, 2, pdata, "cross_entropy")
        st, ct, raw = http(s.url, s.key, "/api/v1/forward_backward", body, content_type=PROTO)
        f2 = json.loads(raw) if st == 200 else {}
        R.check(st == 200 and ct.startswith("application/json") and "request_id" in f2,
                "protobuf forward_backward accepted, JSON submit answer")
        st, ct, raw = http(s.url, s.key, "/api/v1/forward_backward", body, content_type=PROTO)
        R.check(st == 200 and json.loads(raw)["request_id"] == f2.get("request_id"),
                "protobuf resubmission returns the same request_id")
        R.check(s.psql(f"SELECT count(*) FROM (SELECT DISTINCT payload, payload_bin FROM operations WHERE model_id = '{mid}'"
                       f" AND seq_id IN (1, 2)) x") == "1"
                and s.psql(f"SELECT string_agg(kind, ',' ORDER BY seq_id) FROM operations WHERE model_id = '{mid}'"
                           f" AND seq_id IN (1, 2)") == "forward_backward,forward_backward",
                "protobuf and JSON requests give the identical operation payload")

        j1 = json.loads(result(s, f1["request_id"])[1])
        R.check("loss_fn_outputs" in j1, "JSON result of seq 1")
        ct, raw = result(s, f2["request_id"], accept=PROTO + ", application/json")
        R.check(ct.startswith(PROTO), "retrieve_future with Accept protobuf answers application/x-protobuf")
        p2 = tp.decode_fwdbwd_output(raw) if ct.startswith(PROTO) else {"loss_fn_outputs": [], "metrics": {}}
        R.check(len(p2["loss_fn_outputs"]) == 2 and outputs_equal(p2, j1),
                "decoded ForwardBackwardOutput equals the JSON result of the same request")
        R.check(p2.get("loss_fn_output_type", "").split(":")[-1] == j1.get("loss_fn_output_type"),
                "loss_fn_output_type carried over")
        ct, raw = result(s, f2["request_id"], accept="application/json")
        R.check(ct.startswith("application/json") and close(json.loads(raw)["loss_fn_outputs"], j1["loss_fn_outputs"]),
                "the same future as JSON when protobuf is not accepted")
        ct, raw = result(s, f2["request_id"], accept=PROTO)
        R.check(ct.startswith(PROTO) and outputs_equal(tp.decode_fwdbwd_output(raw), j1),
                "Accept: application/x-protobuf alone (SDK 0.25)")

        # seq 3: forward_only -> a forward operation
        body = tp.fwdbwd_request(mid, 3, pdata, "cross_entropy", forward_only=True)
        st, ct, raw = http(s.url, s.key, "/api/v1/forward_backward", body, content_type=PROTO)
        f3 = json.loads(raw) if st == 200 else {}
        R.check(st == 200 and s.psql(f"SELECT kind FROM operations WHERE model_id = '{mid}' AND seq_id = 3")
                == "forward", "forward_only = true is a 'forward' operation")
        if f3:
            ct, raw = result(s, f3["request_id"], accept=PROTO)
            R.check(ct.startswith(PROTO) and outputs_equal(tp.decode_fwdbwd_output(raw), j1),
                    "forward result (protobuf) equals the forward_backward logprobs and losses")

        # seq 4: zstd-compressed
        body = tp.fwdbwd_request(mid, 4, pdata, "cross_entropy")
        packed, why = zstd_compress(body)
        if packed is None:
            print(f"skip  zstd-compressed protobuf body: {why}")
        else:
            st, ct, raw = http(s.url, s.key, "/api/v1/forward_backward", packed, content_type=PROTO,
                               encoding="zstd")
            f4 = json.loads(raw) if st == 200 else {}
            R.check(st == 200 and "request_id" in f4, "zstd-compressed protobuf body accepted")
            R.check(s.psql(f"SELECT count(DISTINCT (payload, payload_bin)) FROM operations WHERE model_id = '{mid}'"
                           f" AND seq_id IN (1, 4)") == "1", "zstd body gives the same payload")
            if f4:
                ct, raw = result(s, f4["request_id"], accept=PROTO)
                R.check(ct.startswith(PROTO) and outputs_equal(tp.decode_fwdbwd_output(raw), j1),
                        "zstd request: decoded result equals the JSON result")
            resp = http(s.url, s.key, "/api/v1/forward_backward", b"\x28\xb5\x2f\xfd garbage",
                        content_type=PROTO, encoding="zstd")
            R.check(detail(resp, 400, "zstd"), "corrupt zstd body -> 400 JSON")
            bomb, _ = zstd_compress(b"\0" * (65 << 20))
            R.check(detail(http(s.url, s.key, "/api/v1/forward_backward", bomb, content_type=PROTO,
                                encoding="zstd"), 413, "MiB"),
                    f"a {len(bomb)}-byte zstd body that decodes past the 64 MiB limit -> 413 JSON")
            trunc = packed[:len(packed) // 2]
            R.check(detail(http(s.url, s.key, "/api/v1/forward_backward", trunc, content_type=PROTO,
                                encoding="zstd"), 400, "zstd"), "truncated zstd body -> 400 JSON")

        # ppo with loss_fn_config through the proto map; defaults filled like JSON
        rl = [(t, {"target_tokens": ("int64", g), "logprobs": ("float32", [-1.0] * len(t)),
                   "advantages": ("float32", [0.5] * len(t))}) for t, g, _ in (d1, d2)]
        body = tp.fwdbwd_request(mid, 5, rl, "ppo", config={"clip_low_threshold": 0.9})
        st, ct, raw = http(s.url, s.key, "/api/v1/forward_backward", body, content_type=PROTO)
        cfg = s.psql(f"SELECT payload->'loss_fn_config' FROM operations WHERE model_id = '{mid}' AND seq_id = 5")
        R.check(st == 200 and json.loads(cfg) == {"clip_low_threshold": 0.9, "clip_high_threshold": 1.2},
                "protobuf loss_fn_config map (ppo), defaults filled in")

        # ---- validation: same checks, JSON errors ------------------------------------------
        fb = lambda b, **kw: http(s.url, s.key, "/api/v1/forward_backward", b, content_type=PROTO, **kw)
        R.check(detail(fb(b"\xff\xff\xff\xff"), 400, "ForwardBackwardRequest"), "garbage protobuf -> 400 JSON")
        R.check(detail(fb(tp.fwdbwd_request(None, 6, pdata, "cross_entropy")), 400, "model_id"),
                "protobuf without model_id -> 400")
        R.check(detail(fb(tp.fwdbwd_request(mid, 6, pdata, "mse")), 400, "unknown loss", "mse"),
                "protobuf unknown loss_fn -> 400")
        bad = [([1, vocab, 3], {"target_tokens": ("int64", [1, 2, 3])})]
        R.check(detail(fb(tp.fwdbwd_request(mid, 6, bad, "cross_entropy")), 400, "data[0]", "vocabulary"),
                "protobuf token outside the vocabulary -> 400 (same validation as JSON)")
        short = [([1, 2, 3], {"target_tokens": ("int64", [1, 2])})]
        R.check(detail(fb(tp.fwdbwd_request(mid, 6, short, "cross_entropy")), 400, "target_tokens", "2 values"),
                "protobuf target length mismatch -> 400")
        img = [tp.datum([1], {}, chunk_kind="image")]
        R.check(detail(fb(tp.fwdbwd_request(mid, 6, img, "cross_entropy")), 400, "only text chunks"),
                "protobuf image chunk -> 400")
        sparse = [([1, 2], {"target_tokens": tp.tensor("int64", [1, 2], shape=[1, 2], sparse=True)})]
        R.check(detail(fb(tp.fwdbwd_request(mid, 6, sparse, "cross_entropy")), 400, "2-d"),
                "protobuf sparse tensor without its CSR indices -> 400")
        nan = [([1, 2], {"target_tokens": ("int64", [1, 2]), "weights": ("float32", [1.0, float("nan")])})]
        R.check(detail(fb(tp.fwdbwd_request(mid, 6, nan, "cross_entropy")), 400, "weights", "finite"),
                "protobuf NaN weight -> 400")
        wrong = [([1, 2], {"target_tokens": ("float32", [1.0, 2.0])})]
        R.check(detail(fb(tp.fwdbwd_request(mid, 6, wrong, "cross_entropy")), 400, "target_tokens", "dtype"),
                "protobuf float target_tokens -> 400")
        R.check(detail(fb(tp.fwdbwd_request(mid + "x", 6, pdata, "cross_entropy")), 404),
                "protobuf request for an unknown model -> 404")
        R.check(detail(http(s.url, s.key, "/api/v1/create_session", b"\x0a\x00", content_type=PROTO), 415,
                       "json"), "protobuf body on a JSON-only route -> 415")
        R.check(detail(fb(body, encoding="gzip"), 415, "content-encoding"), "Content-Encoding gzip -> 415")

        # ---- SampleResponse from a stored result -------------------------------------------
        st, ss = s.post("/api/v1/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0,
                                                            "base_model": base})
        ssid = ss["sampling_session_id"]
        tenant = s.psql(f"SELECT tenant_id FROM sessions WHERE id = '{sid}'")
        sample = {"type": "sample",
                  "sequences": [{"tokens": [11, 22, 5], "logprobs": [-0.5, -2.25, -0.125], "stop_reason": "stop"},
                                {"tokens": [7, 8], "logprobs": [-1.0, -3.0], "stop_reason": "length"}],
                  "prompt_logprobs": [None, -3.25, -1.5],
                  "topk_prompt_logprobs": [None, [[13, -0.25], [99, -2.0]], [[7, -0.5]]],
                  "prompt_cache_hit_tokens": 2}
        s.psql("INSERT INTO operations (request_id, tenant_id, sampling_session_id, seq_id, kind, payload,"
               f" state, result) VALUES ('req-proto-sample', {tenant}, '{ssid}', 900, 'sample', '{{}}', 'done',"
               f" '{json.dumps(sample)}')")
        ct, raw = result(s, "req-proto-sample", accept=PROTO + ", application/json")
        got = tp.decode_sample_response(raw) if ct.startswith(PROTO) else {}
        want = dict(sample)
        want.pop("type")
        R.check(ct.startswith(PROTO) and close(got, want),
                "stored sample result -> SampleResponse (NaN at position 0, top-k slots, stop reasons)")
        if not close(got, want):
            print("      got ", got)
        ct, raw = result(s, "req-proto-sample")
        R.check(ct.startswith("application/json") and json.loads(raw) == sample,
                "sample result as JSON without the protobuf Accept")
        s.psql("INSERT INTO operations (request_id, tenant_id, sampling_session_id, seq_id, kind, payload,"
               f" state, result) VALUES ('req-proto-bare', {tenant}, '{ssid}', 901, 'sample', '{{}}', 'done',"
               """ '{"sequences": [{"tokens": [1], "logprobs": [-0.5], "stop_reason": "length"}]}')""")
        ct, raw = result(s, "req-proto-bare", accept=PROTO)
        got = tp.decode_sample_response(raw) if ct.startswith(PROTO) else {}
        R.check(got.get("prompt_logprobs") is None and got.get("topk_prompt_logprobs") is None
                and got.get("sequences") == [{"tokens": [1], "logprobs": [-0.5], "stop_reason": "length"}],
                "SampleResponse without prompt logprobs leaves the optional fields out")
        # SDK >= 0.30 outputs at the SDK's field numbers: SampledSequence.topk_sampled_logprobs (4),
        # SampleResponse.target_prompt_logprobs (5, a Tensor in the request's layout) and
        # prompt_alt_tokens (6: tokens INT32, logprobs FLOAT32); sequence_id is not on this wire
        newer = {"type": "sample",
                 "sequences": [{"tokens": [4, 9], "logprobs": [-0.5, -1.5], "stop_reason": "length",
                                "sequence_id": "req-proto-newer:0",
                                "topk_logprobs": [[[4, -0.5], [3, -1.25]], [[2, -0.75]]]},
                               {"tokens": [], "logprobs": [], "stop_reason": "stop", "sequence_id": "req-proto-newer:1",
                                "topk_logprobs": []}],
                 "prompt_logprobs": [None, None, -2.5],
                 "target_prompt_logprobs": {"data": [-1.5, 0.0, -3.25], "dtype": "float32", "shape": [2, 4],
                                            "sparse_crow_indices": [0, 1, 3], "sparse_col_indices": [2, 0, 3]},
                 "prompt_alt_tokens": {"tokens": {"data": [5, 6, 7, 8], "dtype": "int64", "shape": [2, 2]},
                                       "logprobs": {"data": [-0.25, -1.0, -2.0, -4.0], "dtype": "float32",
                                                    "shape": [2, 2]}},
                 "prompt_cache_hit_tokens": 0}
        dense = dict(newer, target_prompt_logprobs={"data": [-1.5, 0.0, -3.25, -0.5], "dtype": "float32",
                                                    "shape": [2, 2]})
        for rid, res, what in (("req-proto-newer", newer, "sparse CSR"), ("req-proto-newer-d", dense, "dense")):
            s.psql("INSERT INTO operations (request_id, tenant_id, sampling_session_id, seq_id, kind, payload,"
                   f" state, result) VALUES ('{rid}', {tenant}, '{ssid}', {903 if what == 'dense' else 904},"
                   f" 'sample', '{{}}', 'done', '{json.dumps(res)}')")
            ct, raw = result(s, rid, accept=PROTO)
            got = tp.decode_sample_response(raw) if ct.startswith(PROTO) else {}
            want = json.loads(json.dumps(res))
            want.pop("type")
            for q in want["sequences"]:
                q.pop("sequence_id")
            want["sequences"][1]["topk_logprobs"] = []
            want["target_prompt_logprobs"]["wire_dtype"] = 1
            want["prompt_alt_tokens"]["tokens"]["wire_dtype"] = 3
            want["prompt_alt_tokens"]["logprobs"]["wire_dtype"] = 1
            want["topk_prompt_logprobs"] = None
            R.check(ct.startswith(PROTO) and close(got, want),
                    f"SampleResponse with topk_sampled_logprobs, target_prompt_logprobs ({what}), prompt_alt_tokens")
            if not close(got, want):
                print("      got ", got)
                print("      want", want)
        # the short row of the sampled top-k is padded with the SDK's sentinel (0, -99999.0)
        ct, raw = result(s, "req-proto-newer", accept=PROTO)
        seq0 = next(v for f, w, v in tp.fields(raw) if f == 1)
        topk = dict((f, v) for f, w, v in tp.fields(next(v for f, w, v in tp.fields(seq0) if f == 4)))
        R.check(topk.get(3) == 2 and topk.get(4) == 2 and topk[1][12:16] == b"\0\0\0\0"
                and struct.unpack("<f", topk[2][12:16])[0] == -99999.0,
                "TopkLogprobs: k 2, length 2, the missing slot is (0, -99999.0)")
        s.psql("INSERT INTO operations (request_id, tenant_id, sampling_session_id, seq_id, kind, payload,"
               f" state, error, error_category) VALUES ('req-proto-failed', {tenant}, '{ssid}', 902, 'sample',"
               " '{}', 'failed', 'boom', 'user')")
        st, ct, raw = http(s.url, s.key, "/api/v1/retrieve_future", {"request_id": "req-proto-failed"},
                           accept=PROTO)
        R.check(st == 200 and ct.startswith("application/json")
                and json.loads(raw) == {"error": "boom", "category": "user"},
                "failed future stays a JSON envelope under Accept protobuf")
        st, ct, raw = http(s.url, s.key, "/api/v1/retrieve_future", {"request_id": cm["request_id"]},
                           accept=PROTO)
        R.check(st == 200 and ct.startswith("application/json") and json.loads(raw).get("model_id") == mid,
                "create_model result stays JSON under Accept protobuf")
    R.finish()


if __name__ == "__main__":
    main()
