#!/usr/bin/env python3
"""api_sampling_test.py: the sampling routes' side of the contract (docs/protocol.md §3.3, §3.4, §7.6
unnamed form, §11.1), over HTTP against `loom up`, checked in the database:

  * create_sampling_session from a base model or a readable checkpoint (own, public,
    granted; not deleted, expired or another tenant's private one), idempotent on
    (session_id, sampling_session_seq_id), id "<session>:sample:<n>"; GET samplers/{id};
  * the unnamed save_weights_for_sampler: a model operation in seq order plus its
    sampling session (source_model_id, source_seq_id) in one transaction, idempotent;
  * asample / sample: the exact operations.payload contract the executor reads (defaults,
    stop lists, source and blob_digest), n_tokens, de-duplication on
    (sampling_session_id, seq_id) also for seq_ids beyond 32 bits and under concurrency;
  * backpressure: 429 JSON with Retry-After: 1 past --max-queued-samples (second api).
Validation messages are in api_errors_test.py. Prints "N passed, N failed" last.
"""
import json
import os
import sys
import threading
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from apitest import loom_cli, start_second_api  # noqa: E402
from stack import Results, Stack  # noqa: E402

R = Results()
PAYLOAD_KEYS = {"prompt", "num_samples", "max_tokens", "temperature", "top_k", "top_p", "seed",
                "prompt_logprobs", "topk_prompt_logprobs", "source"}


def post_raw(url, key, path, body):
    """POST returning (status, headers, parsed body)."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "X-API-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def prompt(tokens):
    return {"chunks": [{"type": "encoded_text", "tokens": tokens}]}


def payload_of(s, request_id):
    return json.loads(s.psql(f"SELECT payload FROM operations WHERE request_id = '{request_id}'"))


def add_checkpoint(s, tenant_id, adapter, model_id, name, base, kind="sampler", digest="cd" * 32,
                   **cols):
    """An adapter version row as the registry writes it; returns its tinker path."""
    folder = "sampler_weights" if kind == "sampler" else "weights"
    path = f"tinker://{model_id}/{folder}/{name}"
    extra = "".join(f", {k}" for k in cols)
    vals = "".join(f", {v}" for v in cols.values())
    s.psql(f"INSERT INTO adapters (tenant_id, name) VALUES ({tenant_id}, '{adapter}') ON CONFLICT DO NOTHING;"
           "INSERT INTO adapter_versions (adapter_id, kind, name, tinker_path, step, base_model, lora_config,"
           f" blob_digest, size_bytes{extra}) SELECT id, '{kind}', '{name}', '{path}', 1, '{base}', '{{}}',"
           f" '{digest}', 10{vals} FROM adapters WHERE name = '{adapter}'")
    return path


def main():
    with Stack() as s:
        secret = os.path.join(s.dir, "secret.key")
        loom_cli(s, "tenant", "create", "other")
        other_key = loom_cli(s, "key", "create", "--tenant", "other", "--secret-file", secret)
        base = s.get("/api/v1/get_server_capabilities")[1]["supported_models"][0]["model_name"]
        vocab, ctx = (int(x) for x in s.psql(
            f"SELECT vocab_size, max_context FROM base_models WHERE name = '{base}'").split("|"))
        sid = s.post("/api/v1/create_session", {})[1]["session_id"]
        tid = s.psql(f"SELECT tenant_id FROM sessions WHERE id = '{sid}'")
        oid = s.psql("SELECT id FROM tenants WHERE name = 'other'")

        # ---- create_sampling_session from the base model ---------------------------------
        req = {"session_id": sid, "sampling_session_seq_id": 0, "base_model": base,
               "type": "create_sampling_session"}
        st, a = s.post("/api/v1/create_sampling_session", req)
        st2, b = s.post("/api/v1/create_sampling_session", req)
        R.check(st == 200 and a == {"type": "create_sampling_session", "sampling_session_id": f"{sid}:sample:0"},
                "create_sampling_session: id <session>:sample:<n>")
        R.check(st2 == 200 and b == a and s.psql(
            f"SELECT count(*) FROM sampling_sessions WHERE session_id = '{sid}'") == "1",
            "create_sampling_session is idempotent on (session, seq)")
        base_ss = a["sampling_session_id"]
        st, g = s.get(f"/api/v1/samplers/{base_ss}")
        R.check(st == 200 and g == {"sampler_id": base_ss, "base_model": base, "model_path": None},
                "GET samplers/{id} of a base-model sampler")
        st, g = s.get(f"/api/v1/samplers/{base_ss.replace(':', '%3A')}")
        R.check(st == 200 and g.get("sampler_id") == base_ss, "GET samplers/{id} with a percent-encoded id")
        st, c = s.post("/api/v1/create_sampling_session", {"session_id": sid, "base_model": base})
        R.check(st == 200 and c["sampling_session_id"] == f"{sid}:sample:1",
                "without sampling_session_seq_id the next free number is taken")

        # ---- a model, its snapshot sampler (unnamed save_weights_for_sampler) ------------
        st, cm = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": base,
                                                 "lora_config": {"rank": 4}})
        mid = cm["model_id"]
        s.result(cm["request_id"])
        body = {"model_id": mid, "seq_id": 1, "sampling_session_seq_id": 2, "type": "save_weights_for_sampler"}
        st, f1 = s.post("/api/v1/save_weights_for_sampler", body)
        st2, f2 = s.post("/api/v1/save_weights_for_sampler", body)
        R.check(st == 200 and st2 == 200 and f1["request_id"] == f2["request_id"] and f1["model_id"] == mid,
                "unnamed save_weights_for_sampler: a future, idempotent on (model, seq_id)")
        row = s.psql(f"SELECT kind, seq_id, payload FROM operations WHERE request_id = '{f1['request_id']}'")
        kind, seq, pl = row.split("|", 2)
        snap = f"{sid}:sample:2"
        R.check(kind == "save_weights_for_sampler" and seq == "1" and json.loads(pl) == {"sampling_session_id": snap},
                "its operation: kind save_weights_for_sampler, the model's seq_id, payload {sampling_session_id}")
        R.check(s.psql(f"SELECT base_model, source_model_id, source_seq_id, model_path IS NULL,"
                       f" adapter_version_id IS NULL FROM sampling_sessions WHERE id = '{snap}'")
                == f"{base}|{mid}|1|t|t", "its sampling session: source_model_id and source_seq_id")
        R.check(s.psql(f"SELECT count(*) FROM sampling_sessions WHERE id = '{snap}'") == "1",
                "one sampling session after a resubmission")
        st, g = s.get(f"/api/v1/samplers/{snap}")
        R.check(st == 200 and g == {"sampler_id": snap, "base_model": base, "model_path": None},
                "GET samplers/{id} of a snapshot sampler")
        st, e = s.post("/api/v1/save_weights_for_sampler", {"model_id": mid, "seq_id": 2,
                                                            "sampling_session_seq_id": 0})
        R.check(st == 400 and "already used" in e.get("detail", "") and s.psql(
            f"SELECT state || ' ' || (payload ? 'rejected')::text FROM operations WHERE model_id = '{mid}'"
            f" AND seq_id = 2") == "failed true",
            "a taken sampling_session_seq_id -> 400; the operation is rolled back, the refused seq_id recorded")
        st, f3 = s.post("/api/v1/save_weights_for_sampler", {"model_id": mid, "sampling_session_seq_id": 3})
        R.check(st == 200 and s.psql(f"SELECT seq_id FROM operations WHERE request_id = '{f3['request_id']}'") == "3",
                "without seq_id the model's next seq_id is allocated")
        st, f4 = s.post("/api/v1/save_weights_for_sampler", {"model_id": mid, "seq_id": 3,
                                                             "path": "named-one", "ttl_seconds": None})
        R.check(s.psql(f"SELECT count(*) FROM sampling_sessions WHERE source_model_id = '{mid}'") == "2",
                "with a path the request goes to the named form (no snapshot sampler)")

        # ---- checkpoints as model_path -----------------------------------------------------
        own = add_checkpoint(s, tid, "mine", mid, "own1", base, digest="11" * 32)
        gone = add_checkpoint(s, tid, "mine", mid, "gone1", base, deleted_at="now()")
        expired = add_checkpoint(s, tid, "mine", mid, "old1", base, expires_at="now() - interval '1 hour'")
        pub = add_checkpoint(s, oid, "theirs-public", "ext:train:0", "pub1", base, visibility="'public'")
        granted = add_checkpoint(s, oid, "theirs-shared", "ext:train:1", "g1", base, kind="training")
        private = add_checkpoint(s, oid, "theirs-private", "ext:train:2", "priv1", base)
        s.psql(f"INSERT INTO adapter_grants (adapter_id, tenant_id) SELECT id, {tid} FROM adapters"
               " WHERE name = 'theirs-shared'")
        seq = 10
        made = {}
        for name, path, code in (("own", own, 200), ("public", pub, 200), ("granted", granted, 200),
                                 ("another tenant's private", private, 404), ("deleted", gone, 404),
                                 ("expired", expired, 404)):
            st, r = s.post("/api/v1/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": seq,
                                                               "model_path": path})
            ok = st == code and (code != 200 or r.get("sampling_session_id") == f"{sid}:sample:{seq}")
            R.check(ok, f"model_path of a {name} checkpoint -> {code}")
            if not ok:
                print("      got", st, r)
            if st == 200:
                made[name] = r["sampling_session_id"]
            seq += 1
        if "own" in made:
            R.check(s.psql(f"SELECT s.base_model, s.model_path, v.blob_digest FROM sampling_sessions s JOIN"
                           f" adapter_versions v ON v.id = s.adapter_version_id WHERE s.id = '{made['own']}'")
                    == f"{base}|{own}|" + "11" * 32, "checkpoint sampler: adapter_version_id and base_model set")
            st, g = s.get(f"/api/v1/samplers/{made['own']}")
            R.check(g == {"sampler_id": made["own"], "base_model": base, "model_path": own},
                    "GET samplers/{id} shows the model_path")
        st, r = s.post("/api/v1/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 10,
                                                           "model_path": own})
        R.check(st == 200 and r.get("sampling_session_id") == f"{sid}:sample:10",
                "create_sampling_session from a checkpoint is idempotent too")
        st, r = s.post("/api/v1/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 10,
                                                           "base_model": base})
        R.check(st == 400 and "already used" in r.get("detail", ""),
                "the same seq with another source -> 400")

        # ---- asample payloads --------------------------------------------------------------
        st, f = s.post("/api/v1/asample", {"sampling_session_id": base_ss, "seq_id": 0, "num_samples": 3,
                                           "prompt": prompt([1, 2, 3, 4]), "type": "sample",
                                           "sampling_params": {"max_tokens": 5, "temperature": 0.7, "top_k": 20,
                                                               "top_p": 0.9, "seed": 42, "stop": ["\n\n", "END"]},
                                           "prompt_logprobs": True, "topk_prompt_logprobs": 3})
        R.check(st == 200 and f.get("sample_sequence_ids") == [f"{f.get('request_id')}:{i}" for i in range(3)],
                "asample answers {request_id, sample_sequence_ids}: one id per sample, <request_id>:<i>")
        if set(f) != {"request_id", "sample_sequence_ids"}:
            print("      got", f)
        p = payload_of(s, f["request_id"])
        R.check(p == {"prompt": [1, 2, 3, 4], "num_samples": 3, "max_tokens": 5, "temperature": 0.7, "top_k": 20,
                      "top_p": 0.9, "seed": 42, "stop_strings": ["\n\n", "END"], "prompt_logprobs": True,
                      "topk_prompt_logprobs": 3, "source": "base"}, "payload: every field as sent, source base")
        if set(p) != PAYLOAD_KEYS | {"stop_strings"}:
            print("      got", p)
        # SDK >= 0.29 sends the new knobs as 0 / null: the payload stays exactly as before
        st, f0 = s.post("/api/v1/asample", {"sampling_session_id": base_ss, "seq_id": 100, "prompt": prompt([1, 2]),
                                            "sampling_params": {"max_tokens": 2, "seed": 1}, "topk_sample_logprobs": 0,
                                            "target_prompt_logprobs": None, "prompt_alt_tokens_k": 0,
                                            "prompt_logprobs_last_n": None, "prompt_logprobs": False})
        R.check(st == 200 and set(payload_of(s, f0["request_id"])) == PAYLOAD_KEYS,
                "the new fields at 0 / null leave the payload as it was")
        st, f1 = s.post("/api/v1/asample", {"sampling_session_id": base_ss, "seq_id": 101, "prompt": prompt([1, 2, 3]),
                                            "sampling_params": {"max_tokens": 2, "seed": 1}, "topk_sample_logprobs": 4,
                                            "prompt_alt_tokens_k": 3, "prompt_logprobs": True,
                                            "prompt_logprobs_last_n": 9,
                                            "target_prompt_logprobs": {"data": [7, 1, 2], "dtype": "int64",
                                                                       "shape": [2, 5], "sparse_crow_indices": [0, 1, 3],
                                                                       "sparse_col_indices": [4, 0, 2]}})
        p1 = payload_of(s, f1["request_id"]) if st == 200 else {}
        R.check(p1.get("topk_sample_logprobs") == 4 and p1.get("prompt_alt_tokens_k") == 3
                and p1.get("prompt_logprobs_last_n") == 2
                and p1.get("target_prompt_logprobs") == {"shape": [2, 5], "data": [7, 1, 2], "crow": [0, 1, 3],
                                                         "col": [4, 0, 2]},
                "payload: topk_sample_logprobs, prompt_alt_tokens_k, prompt_logprobs_last_n (clamped to "
                "len(prompt) - 1), target_prompt_logprobs in its CSR layout")
        st, f2 = s.post("/api/v1/asample", {"sampling_session_id": base_ss, "seq_id": 102, "prompt": prompt([1, 2, 3]),
                                            "target_prompt_logprobs": {"data": [7, -1, -1, 1], "shape": [2, 2]}})
        R.check(st == 200 and payload_of(s, f2["request_id"]).get("target_prompt_logprobs") ==
                {"shape": [2, 2], "data": [7, -1, -1, 1]}, "payload: a dense target_prompt_logprobs as sent")
        R.check(s.psql(f"SELECT kind, model_id IS NULL, sampling_session_id, seq_id, n_tokens FROM operations"
                       f" WHERE request_id = '{f['request_id']}'") == f"sample|t|{base_ss}|0|27",
                "sample operation row: no model, the session, seq_id, n_tokens = 3 x (4 + 5)")
        # the raw JSON text: temperature and top_p are written as reals, also when whole
        st, f = s.post("/api/v1/asample", {"sampling_session_id": base_ss, "seq_id": 1, "prompt": prompt([5]),
                                           "sampling_params": {"temperature": 1, "stop": "\n"}})
        p = payload_of(s, f["request_id"])
        text = s.psql(f"SELECT payload::text FROM operations WHERE request_id = '{f['request_id']}'")
        R.check(p["num_samples"] == 1 and p["max_tokens"] == min(256, ctx - 1) and p["temperature"] == 1.0
                and p["top_k"] == -1 and p["top_p"] == 1.0 and p["prompt_logprobs"] is False
                and p["topk_prompt_logprobs"] == 0 and p["stop_strings"] == ["\n"] and "stop_tokens" not in p,
                "defaults: num_samples 1, max_tokens min(256, context - prompt), top_k -1, top_p 1; "
                "a single stop string becomes a list")
        R.check('"temperature": 1.0' in text and '"top_p": 1.0' in text, "temperature/top_p stored as reals")
        R.check(isinstance(p.get("seed"), int) and 0 <= p["seed"] < 2 ** 53, "seed drawn when absent")
        st, g = s.post("/api/v1/asample", {"sampling_session_id": base_ss, "seq_id": 2, "prompt": prompt([5]),
                                           "sampling_params": {"seed": None}})
        R.check(payload_of(s, g["request_id"])["seed"] != p["seed"], "a fresh random seed per request")
        long_prompt = [1 + i % (vocab - 1) for i in range(ctx - 10)]
        st, f = s.post("/api/v1/asample", {"sampling_session_id": base_ss, "seq_id": 3,
                                           "prompt": prompt(long_prompt), "sampling_params": {"max_tokens": None}})
        R.check(st == 200 and payload_of(s, f["request_id"])["max_tokens"] == 10,
                "max_tokens default fits the context (context - prompt length)")
        st, f = s.post("/api/v1/asample", {"sampling_session_id": base_ss, "seq_id": 4, "prompt": prompt([5, 6]),
                                           "sampling_params": {"max_tokens": 2, "stop": [7, 0, vocab - 1]}})
        p = payload_of(s, f["request_id"])
        R.check(p.get("stop_tokens") == [7, 0, vocab - 1] and "stop_strings" not in p,
                "stop token ids -> stop_tokens")
        st, f = s.post("/api/v1/sample", {"sampling_session_id": snap, "seq_id": 0, "prompt": prompt([5]),
                                          "sampling_params": {"max_tokens": 1}})
        R.check(st == 200 and payload_of(s, f["request_id"])["source"] == "snapshot" and "blob_digest" not in
                payload_of(s, f["request_id"]), "/sample alias; a snapshot sampler: source snapshot")
        if "own" in made:
            st, f = s.post("/api/v1/asample", {"sampling_session_id": made["own"], "seq_id": 0,
                                               "prompt": prompt([5]), "sampling_params": {"max_tokens": 1}})
            p = payload_of(s, f["request_id"])
            R.check(p["source"] == "checkpoint" and p["blob_digest"] == "11" * 32,
                    "a checkpoint sampler: source checkpoint with the blob digest")
            s.psql(f"UPDATE adapter_versions SET deleted_at = now() WHERE tinker_path = '{own}'")
            st, r = s.post("/api/v1/asample", {"sampling_session_id": made["own"], "seq_id": 1,
                                               "prompt": prompt([5])})
            R.check(st == 400 and "deleted" in r.get("detail", ""),
                    "sampling from a checkpoint deleted since -> 400 saying so")

        # ---- de-duplication ------------------------------------------------------------------
        big = 1_000_000_000 * 999_999_999
        body = {"sampling_session_id": base_ss, "seq_id": big, "prompt": prompt([9]),
                "sampling_params": {"max_tokens": 1}}
        st, a1 = s.post("/api/v1/asample", body)
        st2, a2 = s.post("/api/v1/asample", dict(body, prompt=prompt([9, 9]), num_samples=4))
        R.check(st == 200 and st2 == 200 and a1 == a2 and len(a1.get("sample_sequence_ids", [])) == 1 and s.psql(
            f"SELECT count(*) FROM operations WHERE sampling_session_id = '{base_ss}' AND seq_id = {big}") == "1",
            "seq_id of an unpickled client (~1e18) stored; a resubmission returns the first future and its "
            "sequence ids (however many samples it asks for)")
        res, barrier = [], threading.Barrier(8)

        def submit():
            barrier.wait()
            res.append(s.post("/api/v1/asample", {"sampling_session_id": base_ss, "seq_id": 77,
                                                  "prompt": prompt([3]), "sampling_params": {"max_tokens": 1}}))
        threads = [threading.Thread(target=submit) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        R.check(len(res) == 8 and all(st == 200 for st, _ in res) and len({json.dumps(b) for _, b in res}) == 1
                and s.psql(f"SELECT count(*) FROM operations WHERE sampling_session_id = '{base_ss}'"
                           " AND seq_id = 77") == "1",
                "8 concurrent resubmissions: one row, one request_id and the same sequence ids")
        st, n1 = s.post("/api/v1/asample", {"sampling_session_id": base_ss, "prompt": prompt([3])})
        st2, n2 = s.post("/api/v1/asample", {"sampling_session_id": base_ss, "prompt": prompt([3])})
        R.check(st == 200 and st2 == 200 and n1 != n2 and
                not set(n1["sample_sequence_ids"]) & set(n2["sample_sequence_ids"]),
                "without seq_id there is no de-duplication: other ids")
        st, o = s.post("/api/v1/asample", {"sampling_session_id": base_ss, "seq_id": 0, "prompt": prompt([3])},
                       key=other_key)
        R.check(st == 404, "another tenant cannot reuse the session's seq_ids (404)")

        # ---- backpressure (a second api with --max-queued-samples 2) --------------------------
        # Samples of a snapshot whose save_weights_for_sampler waits behind a seq gap stay queued.
        st, gap = s.post("/api/v1/save_weights_for_sampler", {"model_id": mid, "seq_id": 50,
                                                              "sampling_session_seq_id": 40})
        stuck = f"{sid}:sample:40"
        api2, url2 = start_second_api(s, "--max-queued-samples", "2")
        try:
            s.psql(f"UPDATE operations SET state = 'failed' WHERE kind = 'sample' AND state = 'queued'"
                   f" AND tenant_id = {tid}")
            got = [post_raw(url2, s.key, "/api/v1/asample", {"sampling_session_id": stuck, "seq_id": i,
                                                             "prompt": prompt([1]), "sampling_params": {"max_tokens": 1}})
                   for i in range(4)]
            R.check([g[0] for g in got] == [200, 200, 200, 429],
                    "more than 2 queued samples -> 429 (" + ",".join(str(g[0]) for g in got) + ")")
            st, hdr, body = got[3]
            R.check(hdr.get("Retry-After") == "1" and "queued" in body.get("detail", ""),
                    "429 carries Retry-After: 1 and a JSON message")
            st, hdr, body = post_raw(url2, s.key, "/api/v1/asample", {"sampling_session_id": stuck, "seq_id": 1,
                                                                      "prompt": prompt([1])})
            R.check(st == 200 and body == got[1][2], "a resubmission is answered even under backpressure")
            st, hdr, body = post_raw(url2, other_key, "/api/v1/create_session", {})
            osid = body["session_id"]
            st, hdr, body = post_raw(url2, other_key, "/api/v1/create_sampling_session",
                                     {"session_id": osid, "base_model": base})
            st, hdr, body = post_raw(url2, other_key, "/api/v1/asample", {
                "sampling_session_id": body["sampling_session_id"], "seq_id": 0, "prompt": prompt([1])})
            R.check(st == 200, "backpressure is per tenant: another tenant still submits")
        finally:
            api2.terminate()
            api2.wait()
        R.check(s.get("/api/v1/healthz", key=None)[0] == 200, "api alive")
    R.finish()


if __name__ == "__main__":
    main()
