"""The two wire encodings a training loop can use (docs/protocol.md §1.6): JSON everywhere, or
protobuf forward_backward bodies with protobuf results (SDK 0.25). One place for both
the SFT and the RL end-to-end tests."""
import json, time, urllib.error, urllib.request
import tinker_proto as tp

PROTO = "application/x-protobuf"


def post_raw(s, path, body, ctype, accept):
    req = urllib.request.Request(s.url + path, data=body, method="POST",
                                 headers={"Content-Type": ctype, "Accept": accept, "X-API-Key": s.key})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def result(s, request_id, proto):
    """retrieve_future until done. With proto, asks for protobuf and decodes it (the
    result kind is told by the payload: ForwardBackwardOutput has field 1 a string)."""
    accept = f"{PROTO}, application/json" if proto else "application/json"
    body = json.dumps({"request_id": request_id}).encode()
    for _ in range(200):
        st, ct, raw = post_raw(s, "/api/v1/retrieve_future", body, "application/json", accept)
        if st != 200:
            raise RuntimeError(f"retrieve_future {st}: {raw[:300]}")
        if PROTO in ct:
            return ("proto", raw)
        j = json.loads(raw)
        if j.get("type") == "try_again":
            continue
        return ("json", j)
    raise TimeoutError(request_id)


def forward_backward(s, model_id, seq, data, loss_fn, proto):
    """data: list of (tokens, {name: (dtype, values)}). Returns (status, submit body)."""
    if proto:
        body = tp.fwdbwd_request(model_id, seq, data, loss_fn)
        st, ct, raw = post_raw(s, "/api/v1/forward_backward", body, PROTO, "application/json")
        return st, json.loads(raw)
    js = [{"model_input": {"chunks": [{"tokens": x, "type": "encoded_text"}]},
           "loss_fn_inputs": {k: {"data": v, "dtype": dt} for k, (dt, v) in inputs.items()}}
          for x, inputs in data]
    return s.post("/api/v1/forward_backward", {"model_id": model_id, "seq_id": seq,
                                               "forward_backward_input": {"data": js, "loss_fn": loss_fn}})


def fb_result(s, request_id, proto):
    kind, out = result(s, request_id, proto)
    return tp.decode_fwdbwd_output(out) if kind == "proto" else out


def sample_result(s, request_id, proto):
    kind, out = result(s, request_id, proto)
    return tp.decode_sample_response(out) if kind == "proto" else out


def raw_answer(s, rid, proto, timeout=20):
    """(status, raw bytes) of retrieve_future once it is not try_again, asking for protobuf
    or JSON; None if it is still try_again after timeout seconds. For byte-for-byte
    comparisons of the same future's answers (from memory, from the notification, from the
    row)."""
    accept = f"{PROTO}, application/json" if proto else "application/json"
    body = json.dumps({"request_id": rid}).encode()
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, ct, raw = post_raw(s, "/api/v1/retrieve_future", body, "application/json", accept)
        if st != 200 or PROTO in ct or json.loads(raw).get("type") != "try_again":
            return (st, raw)
    return None
