#!/usr/bin/env python3
"""twod_test.py: 2-D cross_entropy (docs/protocol.md §5.2, §8, §14; the cookbook's top-k distillation)
end to end against `loom up`.

target_tokens / weights of shape [N, K] sent as JSON dense, JSON sparse CSR, protobuf
dense and protobuf sparse CSR all become the same operation payload (packed: k = K, row-major)
and the same result: logprobs of shape [N, K] (protobuf: trailing_shape [K]),
elementwise_loss [N], equal loss:sum. The numbers are checked against 1-D forwards:
logprobs[i, j] equals the 1-D logprob of target t[i, j] (a forward with t[:, j] as the
targets), elementwise_loss[i] = -sum_j w[i, j] lp[i, j] and loss:sum is their total.
An [N, 1] input gives the payload and result of its 1-D twin; a request mixing a 2-D and
a 1-D datum encodes as protobuf with one ArrayRecord per shape.
Prints "N passed, N failed" last.
"""
import json
import math
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from stack import Results, Stack  # noqa: E402
import packed  # noqa: E402
import tinker_proto as tp  # noqa: E402
import wire  # noqa: E402

R = Results()
PROTO = wire.PROTO


def close(a, b, tol=1e-5):
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    return a is not None and b is not None and math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def flat(rows):
    return [x for r in rows for x in r]


def text(tokens):
    return {"chunks": [{"type": "encoded_text", "tokens": tokens}]}


def dense_td(rows, dtype):
    return {"data": flat(rows), "dtype": dtype, "shape": [len(rows), len(rows[0])]}


def sparse_td(rows, dtype):
    values, crow, col = tp.to_csr(rows)
    return {"data": values, "dtype": dtype, "shape": [len(rows), len(rows[0])],
            "sparse_crow_indices": crow, "sparse_col_indices": col}


def one_d_td(values, dtype):
    return {"data": values, "dtype": dtype, "shape": [len(values)]}


def main():
    rng = random.Random(7)
    with Stack() as s:
        st, caps = s.get("/api/v1/get_server_capabilities")
        base = caps["supported_models"][0]["model_name"]
        vocab = int(s.psql(f"SELECT vocab_size FROM base_models WHERE name = '{base}'"))
        sid = s.post("/api/v1/create_session", {})[1]["session_id"]
        st, cm = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": base,
                                                 "lora_config": {"rank": 4, "seed": 5}})
        R.check(st == 200, "create_model")
        mid = cm["model_id"]
        s.result(cm["request_id"])
        seq = [0]

        def next_seq():
            seq[0] += 1
            return seq[0]

        def submit_json(data, forward=False, loss_fn="cross_entropy"):
            n = next_seq()
            key = "forward_input" if forward else "forward_backward_input"
            st, body = s.post("/api/v1/forward" if forward else "/api/v1/forward_backward",
                              {"model_id": mid, "seq_id": n, key: {"loss_fn": loss_fn, "data": data}})
            if st != 200:
                print("      got", st, str(body)[:300])
            return n, body.get("request_id") if st == 200 else None

        def submit_proto(data):
            n = next_seq()
            st, ct, raw = wire.post_raw(s, "/api/v1/forward_backward",
                                        tp.fwdbwd_request(mid, n, data, "cross_entropy"), PROTO,
                                        "application/json")
            if st != 200:
                print("      got", st, raw[:300])
            return n, json.loads(raw).get("request_id") if st == 200 else None

        def payload(n):   # the header and the packed arrays, as one dict
            return packed.payload_of(s, f"model_id = '{mid}' AND seq_id = {n}")

        # N = 6 positions, K = 3 targets each; zeros in both (ids 0 and weights 0) so that
        # the sparse forms leave entries out; negative weights allowed (docs/protocol.md §8).
        N, K = 6, 3
        x = [rng.randrange(1, vocab) for _ in range(N)]
        T = [[rng.randrange(1, vocab) for _ in range(K)] for _ in range(N)]
        W = [[round(rng.uniform(-0.5, 1.5), 3) for _ in range(K)] for _ in range(N)]
        T[1][2] = 0
        T[4][0] = 0
        W[1][2] = 0.0
        W[2] = [0.0, 0.0, 0.0]
        W[5][1] = 0.0

        def jdatum(tt, ww):
            return {"model_input": text(x), "loss_fn_inputs": {"target_tokens": tt, "weights": ww}}

        runs = {}
        runs["json dense"] = submit_json([jdatum(dense_td(T, "int64"), dense_td(W, "float32"))])
        runs["json sparse"] = submit_json([jdatum(sparse_td(T, "int64"), sparse_td(W, "float32"))])
        runs["json dense targets, sparse weights"] = submit_json(
            [jdatum(dense_td(T, "int64"), sparse_td(W, "float32"))])
        tv, tc, tcol = tp.to_csr(T)
        wv, wc, wcol = tp.to_csr(W)
        runs["proto dense"] = submit_proto([(x, {"target_tokens": ("int64", flat(T), [N, K]),
                                                 "weights": ("float32", flat(W), [N, K])})])
        runs["proto sparse"] = submit_proto([(x, {
            "target_tokens": tp.tensor("int64", tv, shape=[N, K], sparse=True, crow=tc, col=tcol),
            "weights": tp.tensor("float32", wv, shape=[N, K], sparse=True, crow=wc, col=wcol)})])
        R.check(all(rid for _, rid in runs.values()), "2-D cross_entropy accepted: " + ", ".join(runs))

        p0 = payload(runs["json dense"][0])
        d0 = p0["data"][0]
        R.check(d0.get("k") == K and d0["target_tokens"] == flat(T) and close(d0["weights"], flat(W))
                and d0["tokens"] == x, "payload: \"k\": K with target_tokens / weights flattened row-major")
        R.check(all(payload(n) == p0 for n, _ in runs.values()),
                "JSON dense, JSON sparse CSR, protobuf dense and protobuf CSR give the identical payload")

        results = {}
        for name, (n, rid) in runs.items():
            if not rid:
                continue
            proto = name.startswith("proto")
            results[name] = wire.fb_result(s, rid, proto)
            if proto:  # the same future as JSON too
                results[name + " (as JSON)"] = s.result(rid)
        ref = results.get("json dense")
        R.check(ref is not None and "loss_fn_outputs" in ref, "result of the dense JSON request")
        if ref is None or "loss_fn_outputs" not in ref:
            print("      result:", str(ref)[:400])
            R.finish()
        out0 = ref["loss_fn_outputs"][0]
        lp = out0["logprobs"]
        el = out0["elementwise_loss"]
        R.check(lp["shape"] == [N, K] and len(lp["data"]) == N * K and lp["dtype"] == "float32",
                f"JSON logprobs has shape [N, K] = [{N}, {K}] and N*K values")
        R.check(el["shape"] == [N] and len(el["data"]) == N, "elementwise_loss stays 1-D [N]")
        for name, r in results.items():
            if name == "json dense":
                continue
            o = r["loss_fn_outputs"][0] if r.get("loss_fn_outputs") else {}
            ok = (len(r.get("loss_fn_outputs", [])) == 1
                  and o.get("logprobs", {}).get("shape") == [N, K]
                  and close(o["logprobs"]["data"], lp["data"])
                  and o.get("elementwise_loss", {}).get("shape") == [N]
                  and close(o["elementwise_loss"]["data"], el["data"])
                  and close(r["metrics"]["loss:sum"], ref["metrics"]["loss:sum"]))
            if not ok:
                print("      ", str(r)[:400])
            R.check(ok, f"{name}: same logprobs [N, K], elementwise_loss [N] and loss:sum as JSON dense")

        # ---- the numbers: against 1-D forwards of each column -------------------------------
        cols = []
        for j in range(K):
            n, rid = submit_json([{"model_input": text(x), "loss_fn_inputs": {
                "target_tokens": one_d_td([T[i][j] for i in range(N)], "int64")}}], forward=True)
            r = s.result(rid) if rid else {}
            cols.append(r["loss_fn_outputs"][0]["logprobs"]["data"] if r.get("loss_fn_outputs") else None)
        R.check(all(c is not None for c in cols), "1-D forwards of each column t[:, j]")
        if all(c is not None for c in cols):
            lp2 = [lp["data"][i * K:(i + 1) * K] for i in range(N)]
            R.check(all(close(lp2[i][j], cols[j][i], 1e-4) for i in range(N) for j in range(K)),
                    "logprobs[i, j] equals the 1-D forward logprob of target t[i, j]")
            want_el = [-sum(W[i][j] * cols[j][i] for j in range(K)) for i in range(N)]
            R.check(close(el["data"], want_el, 1e-4), "elementwise_loss[i] = -sum_j w[i, j] * lp[i, j]")
            want = -sum(W[i][j] * cols[j][i] for i in range(N) for j in range(K))
            got = ref["metrics"]["loss:sum"]
            R.check(math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-4),
                    f"loss:sum = -sum w * lp ({got:.6f} vs {want:.6f})")

        # ---- K = 1: an [N, 1] input is its 1-D twin ------------------------------------------
        t1 = [r[0] for r in T]
        w1 = [r[0] for r in W]
        n1, r1 = submit_json([{"model_input": text(x), "loss_fn_inputs": {
            "target_tokens": one_d_td(t1, "int64"), "weights": one_d_td(w1, "float32")}}])
        n2, r2 = submit_json([{"model_input": text(x), "loss_fn_inputs": {
            "target_tokens": dense_td([[v] for v in t1], "int64"),
            "weights": sparse_td([[v] for v in w1], "float32")}}])
        R.check(r1 and r2 and payload(n1) == payload(n2), "[N, 1] input: the same payload as the 1-D request")
        if r1 and r2:
            a, b = s.result(r1), s.result(r2)
            R.check(close(a["loss_fn_outputs"][0]["logprobs"]["data"], b["loss_fn_outputs"][0]["logprobs"]["data"])
                    and close(a["metrics"]["loss:sum"], b["metrics"]["loss:sum"])
                    and close(a["loss_fn_outputs"][0]["logprobs"]["data"], cols[0] if cols[0] else []),
                    "[N, 1] input: the same logprobs and loss:sum as the 1-D request")

        # ---- a 2-D and a 1-D datum in one request: protobuf has one ArrayRecord per shape ----
        y = [rng.randrange(1, vocab) for _ in range(4)]
        yt = [rng.randrange(1, vocab) for _ in range(4)]
        mixed = [(x, {"target_tokens": ("int64", flat(T), [N, K]), "weights": ("float32", flat(W), [N, K])}),
                 (y, {"target_tokens": ("int64", yt)}),
                 (x, {"target_tokens": ("int64", flat(T), [N, K]), "weights": ("float32", flat(W), [N, K])})]
        n, rid = submit_proto(mixed)
        if rid:
            kind, raw = wire.result(s, rid, True)
            recs = [v for f, w_, v in tp.fields(raw) if f == 2] if kind == "proto" else []
            p = tp.decode_fwdbwd_output(raw) if kind == "proto" else {}
            j = s.result(rid)
            shapes = [d["logprobs"]["shape"] for d in p.get("loss_fn_outputs", [])]
            jshapes = [d["logprobs"]["shape"] for d in j.get("loss_fn_outputs", [])]
            R.check(len(recs) == 3 and shapes == [[N, K], [4], [N, K]] and jshapes == shapes,
                    f"mixed 2-D / 1-D datums: protobuf in {len(recs)} ArrayRecords, shapes {shapes}")
            R.check(len(p.get("loss_fn_outputs", [])) == 3
                    and all(close(a["logprobs"]["data"], b["logprobs"]["data"])
                            and close(a["elementwise_loss"]["data"], b["elementwise_loss"]["data"])
                            for a, b in zip(p["loss_fn_outputs"], j["loss_fn_outputs"]))
                    and close(p["loss_fn_outputs"][0]["logprobs"]["data"], lp["data"])
                    and close(p["metrics"]["loss:sum"], j["metrics"]["loss:sum"]),
                    "mixed datums: protobuf result equals the JSON one")
        else:
            R.check(False, "mixed 2-D / 1-D request accepted")

        # ---- a forward (no gradient) takes 2-D targets too ----------------------------------
        n, rid = submit_json([jdatum(sparse_td(T, "int64"), dense_td(W, "float32"))], forward=True)
        r = s.result(rid) if rid else {}
        R.check(r.get("loss_fn_outputs") and close(r["loss_fn_outputs"][0]["logprobs"]["data"], lp["data"])
                and r["loss_fn_outputs"][0]["logprobs"]["shape"] == [N, K],
                "/forward with 2-D sparse targets: the same logprobs [N, K]")

        # ---- protobuf inputs are validated like JSON ones -----------------------------------
        def proto_detail(data, loss_fn, *words):
            st, ct, raw = wire.post_raw(s, "/api/v1/forward_backward",
                                        tp.fwdbwd_request(mid, 999, data, loss_fn), PROTO, "application/json")
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw
            ok = (st == 400 and isinstance(body, dict)
                  and all(w.lower() in str(body.get("detail", "")).lower() for w in words))
            if not ok:
                print("      got", st, str(body)[:300])
            return ok
        t2 = ("int64", flat(T), [N, K])
        R.check(proto_detail([(x, {"target_tokens": ("int64", x), "logprobs": ("float32", [0.0] * N * 2, [N, 2]),
                                   "advantages": ("float32", [1.0] * N)})], "ppo", "logprobs", "2-d", "cross_entropy"),
                "protobuf 2-D logprobs for ppo -> 400")
        R.check(proto_detail([(x, {"target_tokens": t2, "weights": ("float32", [1.0] * N)})], "cross_entropy",
                             "weights", "1-D", f"[{N}, {K}]"), "protobuf 2-D targets with 1-D weights -> 400")
        R.check(proto_detail([(x, {"target_tokens": t2, "weights": ("float32", [1.0] * N * 2, [N, 2])})],
                             "cross_entropy", "K = 2", f"K = {K}"), "protobuf weights with another K -> 400")
        bad_col = tcol[:-1] + [K]
        R.check(proto_detail([(x, {"target_tokens": tp.tensor("int64", tv, shape=[N, K], sparse=True, crow=tc,
                                                              col=bad_col)})], "cross_entropy",
                             "target_tokens", f"outside [0, {K})"), "protobuf CSR column out of range -> 400")
        R.check(proto_detail([(x, {"target_tokens": tp.tensor("int64", tv, shape=[N, K], sparse=True,
                                                              crow=tc[:-1], col=tcol)})], "cross_entropy",
                             "target_tokens", "crow_indices", f"{N + 1}"), "protobuf CSR crow of the wrong length -> 400")
        R.check(proto_detail([(x, {"target_tokens": tp.tensor("int64", tv, shape=[N, K], sparse=True, crow=tc,
                                                              col=tcol[:-1])})], "cross_entropy",
                             "col_indices"), "protobuf CSR col shorter than the values -> 400")
        R.check(proto_detail([(x, {"target_tokens": tp.tensor("int64", tv, sparse=True, crow=tc, col=tcol)})],
                             "cross_entropy", "shape"), "protobuf CSR without a 2-D shape -> 400")
        R.check(proto_detail([(x, {"target_tokens": ("int64", flat(T)[:-1], [N, K])})], "cross_entropy",
                             "target_tokens", f"[{N}, {K}]", f"{N * K} values"),
                "protobuf dense 2-D with too few values -> 400")
    R.finish()


if __name__ == "__main__":
    main()
