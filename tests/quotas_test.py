"""Per-tenant limits and usage (docs/operating.md "Quotas and usage").

  - max queued operations: the submit past it is a 429 with Retry-After, not recorded (the
    SDK sends the same seq_id again, and then it runs);
  - tokens per minute: past it the tenant's work waits and its future answers try_again
    with queue_state paused_rate_limit and the reason; lifting the limit lets it run;
  - max live models: create_model past it is a 429 until a model is unloaded;
  - max checkpoint bytes: a save past it is a 400 that says so;
  - usage: GET /api/v1/usage gives the key's own tenant's train, prefill and sample tokens
    per run and its checkpoint storage (compact JSON); `loom usage` gives every tenant's;
    the views usage_tokens and usage_storage hold the same numbers.
"""
import json, os, sys, threading, time, urllib.error, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import Stack, Results
from apitest import loom_cli, is_detail
from resilient import datum, ADAM

R = Results()
BASE = "loom/tiny-llama"


def raw(s, path, body, key):
    """(status, headers with lower-case names, json) without retries."""
    req = urllib.request.Request(s.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "X-API-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, json.loads(e.read())


def fb(mid, seq, n=4, step=1):
    return {"model_id": mid, "seq_id": seq, "forward_backward_input": {
        "data": [datum("q", step, i) for i in range(n)], "loss_fn": "cross_entropy"}}


def new_model(s, key, sid, n):
    st, _, f = raw(s, "/api/v1/create_model", {"session_id": sid, "model_seq_id": n, "base_model": BASE,
                                               "lora_config": {"rank": 4, "seed": 1}}, key)
    if st != 200:
        return st, f
    return st, s.result(f["request_id"], key=key)["model_id"]


def main():
    with Stack() as s:
        secret = os.path.join(s.dir, "secret.key")
        keys = {"A": s.key}
        for t in ("b", "c"):
            loom_cli(s, "tenant", "create", f"tenant-{t}")
            keys[t.upper()] = loom_cli(s, "key", "create", "--tenant", f"tenant-{t}", "--secret-file", secret)
        sids = {t: s.post("/api/v1/create_session", {}, key=k)[1]["session_id"] for t, k in keys.items()}

        # ---- max queued operations (tenant A: the default tenant of loom up) ------------------
        out = loom_cli(s, "tenant", "set-limits", "default", "--max-queued-ops", "3")
        R.check("max queued operations 3" in out, f"loom tenant set-limits: {out}")
        _, ma = new_model(s, keys["A"], sids["A"], 0)
        futs = {}
        for seq in (2, 3, 4):   # they wait behind seq_id 1, which is not sent yet
            st, _, f = raw(s, "/api/v1/forward_backward", fb(ma, seq), keys["A"])
            futs[seq] = f["request_id"]
        st, hdr, body = raw(s, "/api/v1/forward_backward", fb(ma, 5), keys["A"])
        R.check(st == 429 and hdr.get("retry-after") == "1" and "max-queued-ops" in body.get("detail", ""),
                f"a 4th queued operation is a 429 with Retry-After 1: {st} {body}")
        R.check(s.psql(f"SELECT count(*) FROM operations WHERE model_id = '{ma}' AND seq_id = 5") == "0",
                "the refused submit is not recorded (its seq_id stays free)")
        loom_cli(s, "tenant", "set-limits", "default", "--max-queued-ops", "10")
        st, _, f1 = raw(s, "/api/v1/forward_backward", fb(ma, 1), keys["A"])
        st5, _, f5 = raw(s, "/api/v1/forward_backward", fb(ma, 5), keys["A"])
        done = [s.result(r, key=keys["A"]) for r in [f1["request_id"]] + list(futs.values()) + [f5["request_id"]]]
        R.check(st == st5 == 200 and all("metrics" in d for d in done),
                "under the raised limit the same seq_id is taken, and all five run in order")

        # ---- tokens per minute (tenant B) -------------------------------------------------------
        loom_cli(s, "tenant", "set-limits", "tenant-b", "--tokens-per-minute", "150")
        _, mb = new_model(s, keys["B"], sids["B"], 0)
        rids = [raw(s, "/api/v1/forward_backward", fb(mb, k, n=4, step=k), keys["B"])[2]["request_id"]
                for k in (1, 2, 3)]   # 96 tokens each
        first = s.result(rids[0], key=keys["B"])
        t0 = time.time()
        st, _, pending = raw(s, "/api/v1/retrieve_future", {"request_id": rids[2]}, keys["B"])
        waited = time.time() - t0
        R.check("metrics" in first and pending.get("type") == "try_again" and
                pending.get("queue_state") == "paused_rate_limit" and "tokens per minute" in
                pending.get("queue_state_reason", ""),
                f"past 150 tokens per minute the work waits, and its future says so after the long poll"
                f" ({waited:.0f} s): {pending}")
        loom_cli(s, "tenant", "set-limits", "tenant-b", "--tokens-per-minute", "0")
        R.check(all("metrics" in s.result(r, key=keys["B"]) for r in rids[1:]), "with the limit lifted they run")

        # ---- max live models, checkpoint bytes (tenant C) -------------------------------------------
        loom_cli(s, "tenant", "set-limits", "tenant-c", "--max-live-models", "2")
        _, m1 = new_model(s, keys["C"], sids["C"], 0)
        _, m2 = new_model(s, keys["C"], sids["C"], 1)
        st, hdr, body = raw(s, "/api/v1/create_model", {"session_id": sids["C"], "model_seq_id": 2, "base_model": BASE,
                                                        "lora_config": {"rank": 4}}, keys["C"])
        R.check(st == 429 and hdr.get("retry-after") == "10" and "max-live-models" in body.get("detail", ""),
                f"a third live model is a 429: {st} {body}")
        s.result(raw(s, "/api/v1/unload_model", {"model_id": m2}, keys["C"])[2]["request_id"], key=keys["C"])
        st, m3 = new_model(s, keys["C"], sids["C"], 2)
        R.check(st == 200, "after an unload the third model is created")
        s.result(raw(s, "/api/v1/forward_backward", fb(m1, 1), keys["C"])[2]["request_id"], key=keys["C"])
        sv = s.result(raw(s, "/api/v1/save_weights", {"model_id": m1, "seq_id": 2, "path": "one"}, keys["C"])[2]
                      ["request_id"], key=keys["C"])
        size = int(s.psql(f"SELECT size_bytes FROM adapter_versions WHERE tinker_path = '{sv['path']}'"))
        loom_cli(s, "tenant", "set-limits", "tenant-c", "--max-checkpoint-bytes", str(size))
        r = s.post("/api/v1/save_weights", {"model_id": m1, "seq_id": 3, "path": "two"}, key=keys["C"])
        R.check(is_detail(r, 400, "storage limit", "max-checkpoint-bytes"), f"a save past the storage limit is a 400")

        # ---- usage ---------------------------------------------------------------------------------
        samp = s.post("/api/v1/create_sampling_session", {"session_id": sids["A"], "sampling_session_seq_id": 0,
                                                          "base_model": BASE}, key=keys["A"])[1]
        res = s.result(s.post("/api/v1/asample", {"sampling_session_id": samp["sampling_session_id"], "seq_id": 0,
                                                   "num_samples": 2, "prompt": {"chunks": [{"tokens": [1, 2, 3, 4, 5]}]},
                                                   "sampling_params": {"max_tokens": 6, "seed": 1}},
                              key=keys["A"])[1]["request_id"], key=keys["A"])
        generated = sum(len(q["tokens"]) for q in res["sequences"])
        time.sleep(2.5)   # the scheduler folds usage every 2 s
        st, u = s.get("/api/v1/usage", key=keys["A"])
        runs = {r["run"]: r for r in u.get("runs", [])} if st == 200 else {}
        R.check(st == 200 and u["tenant"] == "default" and u["tokens"]["train"] == 5 * 4 * 24 and
                runs.get(ma, {}).get("train") == 5 * 4 * 24,
                f"GET /api/v1/usage: tenant A's train tokens, per run ({u.get('tokens') if st == 200 else u})")
        R.check(u["tokens"]["prefill"] == 5 and u["tokens"]["sample"] == generated and
                runs.get(f"base:{BASE}", {}).get("sample") == generated,
                f"a sample's prompt (prefilled once) and generated tokens: {u['tokens']}")
        st, uc = s.get("/api/v1/usage", key=keys["C"])
        R.check(st == 200 and uc["tenant"] == "tenant-c" and uc["storage"]["bytes"] == size and
                uc["limits"]["max_live_models"] == 2 and uc["limits"]["max_checkpoint_bytes"] == size and
                ma not in {r["run"] for r in uc["runs"]},
                f"another key sees only its own tenant's usage, storage and limits: {uc.get('storage')}")
        R.check(s.get("/api/v1/usage?days=0", key=keys["A"])[0] == 400, "?days=0 is a 400")
        req = urllib.request.Request(s.url + "/api/v1/usage", headers={"X-API-Key": keys["C"]})
        with urllib.request.urlopen(req, timeout=60) as r:
            wire = r.read().decode()
        R.check(wire == json.dumps(json.loads(wire), separators=(",", ":")),
                f"GET /api/v1/usage is compact JSON, as the other answers built in C: {wire[:60]}...")
        out = loom_cli(s, "usage")
        R.check(all(t in out for t in ("default", "tenant-b", "tenant-c")) and str(5 * 4 * 24) in out,
                "loom usage lists every tenant's tokens")
        cli = json.loads(loom_cli(s, "usage", "--tenant", "default", "--json"))
        R.check(cli["tokens"] == u["tokens"] and cli["runs"] == u["runs"], "loom usage --tenant --json = the api's answer")
        view = s.psql(f"SELECT sum(tokens) FROM usage_tokens WHERE tenant = 'default' AND kind = 'train'")
        R.check(view == str(5 * 4 * 24), f"the usage_tokens view holds them too ({view})")
        R.check(s.psql("SELECT bytes FROM usage_storage WHERE tenant = 'tenant-c'") == str(size),
                "and usage_storage the checkpoint bytes")
    R.finish()


if __name__ == "__main__":
    main()
