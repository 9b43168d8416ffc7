#!/usr/bin/env python3
"""isolation_test.py: tenants cannot see or touch each other's resources.

Tenant A (the stack's first key) creates a session, a model with futures, sampling
sessions (base model, checkpoint, live-weights snapshot), samples and a checkpoint row.
Tenant B (created with `loom tenant create` / `loom key create`) then tries every one of
them by id: each attempt is a 404 JSON (never 403, which would confirm the id exists),
nothing of A changes, and B's listings show only B's rows (and A's only A's).
Prints "N passed, N failed" last.
"""
import json
import os
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from apitest import loom_cli  # noqa: E402
from stack import Results, Stack  # noqa: E402
import tinker_proto as tp  # noqa: E402

R = Results()


def is_404(resp, what):
    st, body = resp
    ok = st == 404 and isinstance(body, dict) and isinstance(body.get("detail"), str)
    if not ok:
        print("      got", st, str(body)[:300])
    return R.check(ok, f"tenant B: {what} -> 404")


def datum(tokens):
    return {"model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
            "loss_fn_inputs": {"target_tokens": {"data": tokens[1:] + [1], "dtype": "int64",
                                                 "shape": [len(tokens)]}}}


def raw_post(s, key, path, body, content_type):
    req = urllib.request.Request(s.url + path, data=body, method="POST",
                                 headers={"Content-Type": content_type, "X-API-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def main():
    with Stack() as s:
        secret = os.path.join(s.dir, "secret.key")
        out = loom_cli(s, "tenant", "create", "tenant-b")
        R.check(out.startswith("tenant tenant-b id="), "loom tenant create tenant-b")
        kb = loom_cli(s, "key", "create", "--tenant", "tenant-b", "--name", "b", "--secret-file", secret)
        R.check(kb.startswith("tml-"), "loom key create for tenant B")
        A, B = s.key, kb
        base = s.get("/api/v1/get_server_capabilities")[1]["supported_models"][0]["model_name"]

        # ---- tenant A's resources ------------------------------------------------------
        sid = s.post("/api/v1/create_session", {"tags": ["a"]}, key=A)[1]["session_id"]
        st, cm = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": base,
                                                 "lora_config": {"rank": 4}}, key=A)
        mid = cm["model_id"]
        s.result(cm["request_id"])
        st, fb = s.post("/api/v1/forward_backward", {"model_id": mid, "seq_id": 1, "forward_backward_input": {
            "loss_fn": "cross_entropy", "data": [datum([3, 4, 5])]}}, key=A)
        R.check(st == 200, "tenant A: forward_backward submitted")
        st, ss = s.post("/api/v1/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0,
                                                            "base_model": base}, key=A)
        ssid = ss["sampling_session_id"]
        st, snap = s.post("/api/v1/save_weights_for_sampler", {"model_id": mid, "seq_id": 2,
                                                               "sampling_session_seq_id": 1}, key=A)
        R.check(st == 200, "tenant A: snapshot sampling session")
        snap_id = f"{sid}:sample:1"
        st, smp = s.post("/api/v1/asample", {"sampling_session_id": ssid, "seq_id": 0, "num_samples": 1,
                                             "prompt": {"chunks": [{"tokens": [1, 2]}]},
                                             "sampling_params": {"max_tokens": 2}}, key=A)
        R.check(st == 200, "tenant A: asample submitted")
        ta = s.psql(f"SELECT tenant_id FROM sessions WHERE id = '{sid}'")
        path = f"tinker://{mid}/sampler_weights/a1"
        s.psql(f"INSERT INTO adapters (tenant_id, model_id, name) VALUES ({ta}, '{mid}', 'a-adapter');"
               "INSERT INTO adapter_versions (adapter_id, kind, name, tinker_path, step, base_model, lora_config,"
               f" blob_digest, size_bytes) SELECT id, 'sampler', 'a1', '{path}', 1, '{base}', '{{}}', '"
               + "ab" * 32 + "', 10 FROM adapters WHERE name = 'a-adapter'")
        st, cs = s.post("/api/v1/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 2,
                                                            "model_path": path}, key=A)
        R.check(st == 200, "tenant A: sampling session from its own checkpoint")
        before = s.psql("SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM"
                        " (SELECT id, last_heartbeat_at FROM sessions) t")
        ops_before = s.psql(f"SELECT count(*) FROM operations WHERE tenant_id = {ta}")

        # ---- tenant B tries all of it --------------------------------------------------
        is_404(s.post("/api/v1/session_heartbeat", {"session_id": sid}, key=B), "session_heartbeat on A's session")
        is_404(s.post("/api/v1/create_model", {"session_id": sid, "base_model": base}, key=B),
               "create_model in A's session")
        is_404(s.post("/api/v1/get_info", {"model_id": mid}, key=B), "get_info on A's model")
        is_404(s.post("/api/v1/forward_backward", {"model_id": mid, "seq_id": 3, "forward_backward_input": {
            "loss_fn": "cross_entropy", "data": [datum([3, 4, 5])]}}, key=B), "forward_backward on A's model")
        is_404(raw_post(s, B, "/api/v1/forward_backward",
                        tp.fwdbwd_request(mid, 3, [([3, 4], {"target_tokens": ("int64", [4, 1])})], "cross_entropy"),
                        "application/x-protobuf"), "protobuf forward_backward on A's model")
        is_404(s.post("/api/v1/forward", {"model_id": mid, "seq_id": 3, "forward_input": {
            "loss_fn": "cross_entropy", "data": [datum([3, 4, 5])]}}, key=B), "forward on A's model")
        is_404(s.post("/api/v1/optim_step", {"model_id": mid, "seq_id": 3}, key=B), "optim_step on A's model")
        is_404(s.post("/api/v1/save_weights_for_sampler", {"model_id": mid, "seq_id": 3,
                                                           "sampling_session_seq_id": 5}, key=B),
               "save_weights_for_sampler on A's model")
        is_404(s.post("/api/v1/unload_model", {"model_id": mid}, key=B), "unload_model on A's model")
        is_404(s.post("/api/v1/retrieve_future", {"request_id": fb["request_id"]}, key=B),
               "retrieve A's forward_backward future")
        is_404(s.post("/api/v1/retrieve_future", {"request_id": smp["request_id"]}, key=B),
               "retrieve A's sample future")
        for x in (ssid, snap_id, cs["sampling_session_id"]):
            is_404(s.get(f"/api/v1/samplers/{x}", key=B), f"samplers/{x.split(':', 1)[1]}")
            is_404(s.post("/api/v1/asample", {"sampling_session_id": x, "seq_id": 7, "num_samples": 1,
                                              "prompt": {"chunks": [{"tokens": [1, 2]}]}}, key=B),
                   f"asample on A's sampling session {x.split(':', 1)[1]}")
        is_404(s.post("/api/v1/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 9,
                                                          "base_model": base}, key=B),
               "create_sampling_session in A's session")
        sb = s.post("/api/v1/create_session", {}, key=B)[1]["session_id"]
        is_404(s.post("/api/v1/create_sampling_session", {"session_id": sb, "sampling_session_seq_id": 0,
                                                          "model_path": path}, key=B),
               "create_sampling_session from A's private checkpoint")
        is_404(s.get(f"/api/v1/sessions/{sid}", key=B), "sessions/{A's session}")
        is_404(s.get(f"/api/v1/training_runs/{mid}", key=B), "training_runs/{A's model}")
        is_404(s.get(f"/api/v1/training_runs/{mid}/checkpoints", key=B), "training_runs/{A's model}/checkpoints")

        # sharing is explicit: a public checkpoint of A is usable by B, a private one is not
        s.psql(f"UPDATE adapter_versions SET visibility = 'public' WHERE tinker_path = '{path}'")
        st, body = s.post("/api/v1/create_sampling_session", {"session_id": sb, "sampling_session_seq_id": 0,
                                                              "model_path": path}, key=B)
        R.check(st == 200 and s.get(f"/api/v1/samplers/{body.get('sampling_session_id')}", key=B)[1].get(
            "model_path") == path, "tenant B may sample from A's checkpoint once it is public")
        s.psql(f"UPDATE adapter_versions SET visibility = 'private' WHERE tinker_path = '{path}'")

        # nothing of A changed
        R.check(s.psql(f"SELECT count(*) FROM operations WHERE tenant_id = {ta}") == ops_before,
                "no operation was added to tenant A")
        R.check(s.psql("SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM"
                       f" (SELECT id, last_heartbeat_at FROM sessions WHERE id <> '{sb}') t") == before,
                "tenant A's session was not touched")
        R.check(s.psql(f"SELECT count(*) FROM sampling_sessions WHERE session_id = '{sid}'") == "3",
                "no sampling session was added to A's session")

        # ---- listings -------------------------------------------------------------------
        st, cb = s.post("/api/v1/create_model", {"session_id": sb, "base_model": base,
                                                 "lora_config": {"rank": 4}}, key=B)
        st, lb = s.get("/api/v1/sessions?limit=100", key=B)
        R.check(st == 200 and lb["sessions"] == [sb] and lb["cursor"]["total_count"] == 1,
                "tenant B's session list holds only its own session")
        st, la = s.get("/api/v1/sessions?limit=100", key=A)
        R.check(st == 200 and sb not in la["sessions"] and sid in la["sessions"],
                "tenant A's session list does not show B's session")
        st, rb = s.get("/api/v1/training_runs?limit=100", key=B)
        R.check(st == 200 and [r["training_run_id"] for r in rb["training_runs"]] == [cb["model_id"]]
                and rb["cursor"]["total_count"] == 1 and rb["training_runs"][0]["model_owner"] == "tenant-b",
                "tenant B's training runs: only its own")
        st, ra = s.get("/api/v1/training_runs?limit=100&access_scope=accessible", key=A)
        R.check(st == 200 and [r["training_run_id"] for r in ra["training_runs"]] == [mid],
                "tenant A's training runs (accessible) do not show B's")
        st, sess_b = s.get(f"/api/v1/sessions/{sb}", key=B)
        R.check(st == 200 and sess_b["training_run_ids"] == [cb["model_id"]]
                and all(x.startswith(sb) for x in sess_b["sampler_ids"]),
                "tenant B's session detail lists only its own runs and samplers")
        st, ck = s.get("/api/v1/checkpoints", key=B)
        R.check(st == 200 and path not in json.dumps(ck), "tenant B's checkpoint list does not show A's")
        R.check(s.get("/api/v1/healthz", key=None)[0] == 200, "api alive after all of it")
    R.finish()


if __name__ == "__main__":
    main()
