#!/usr/bin/env python3
"""security_test.py: revocation takes effect at once, telemetry cannot be abused, stored
data is private.

- Tenant B samples from tenant A's checkpoint while it is public (or shared with B) and
  holds a signed download link. After unpublish (or share revoke) B's open sampling
  session is refused at the next sample and the earlier link no longer downloads; a
  load_weights of it that B queued before is refused when it runs. A link
  made with a key that is revoked since stops working too (archive links, the per-file links
  of external checkpoints, upload links); A's own links keep working.
- POST /api/v1/telemetry needs a key; a newline in session_id or error_message cannot
  forge a log line; an oversized batch and a flood of batches add only a few lines.
- Blobs (tenants' weights), the secret, the API key file and the data directory are
  readable by the service user only.
- A key in use is refused within a second of its revocation, expiry or deletion, though
  the api keeps keys it checked for 5 s: the change's NOTIFY (migration 0031) empties its
  cache; so does the LISTEN connection's reconnect (a revocation while it was away).
  Without a notification the key is refused once its 5 s are up.
- HTTP framing that two readers could take differently (request smuggling): two
  different Content-Length headers, Content-Length with Transfer-Encoding: chunked (whose
  "body" held a second request, which was served), two Transfer-Encoding headers: one
  400 answer each, and the connection closed. HTTP/2 is not offered (h2c).
Prints "N passed, N failed" last.
"""
import json
import os
import socket
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from apitest import loom_cli  # noqa: E402
from stack import Results, Stack  # noqa: E402

R = Results()
BASE = "loom/tiny-llama"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None


def fetch(url):
    """GET without a key: the status."""
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def raw_exchange(url, data):
    """Sends raw bytes; (every byte answered until the server closed, whether it closed
    within 10 s)."""
    u = urllib.parse.urlparse(url)
    out, closed = b"", False
    with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
        sock.sendall(data)
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    closed = True
                    break
                out += chunk
        except OSError:
            pass
    return out, closed


def framing(s):
    key = s.key.encode()
    head = b"POST /api/v1/create_session HTTP/1.1\r\nHost: t\r\nX-API-Key: " + key + b"\r\n"
    smuggled = b"0\r\n\r\nGET /api/v1/healthz HTTP/1.1\r\nHost: t\r\n\r\n"
    cases = [
        ("two different Content-Length headers",
         head + b"Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}" + b" " * 38),
        ("Content-Length and Transfer-Encoding: chunked, a request in the body",
         head + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(smuggled) + smuggled),
        ("Transfer-Encoding: chunked and Content-Length, a request in the body",
         head + b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n" % len(smuggled) + smuggled),
        ("two Transfer-Encoding headers",
         head + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + smuggled),
    ]
    for name, data in cases:
        out, closed = raw_exchange(s.url, data)
        answers = out.count(b"HTTP/1.1 ")
        R.check(out.startswith(b"HTTP/1.1 400") and answers == 1 and closed and b"detail" in out,
                f"{name}: one 400, connection closed ({answers} answers, closed {closed}: {out[:60]!r})")
    out, closed = raw_exchange(s.url, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    R.check(not out.startswith(b"\x00") and b"HTTP/1.1 400" in out, f"no HTTP/2 with prior knowledge ({out[:40]!r})")
    R.check(fetch(s.url + "/api/v1/healthz") == 200, "still serving")


def key_changes(s, secret):
    """Each change is made right after the key's first use (so the api has just cached it,
    for 5 s); it must be refused well within that."""
    loom_cli(s, "tenant", "create", "carol")

    def refused_within(key, change, what, limit):
        R.check(s.get("/api/v1/get_server_capabilities", key=key)[0] == 200, f"{what}: the key works first")
        s.get("/api/v1/get_server_capabilities", key=key)   # a second use: answered from the cache
        prefix = key[4:12]
        kid = s.psql(f"SELECT id FROM api_keys WHERE prefix = '{prefix}'")
        t0 = time.time()
        change(kid)
        st = 200
        while st == 200 and time.time() - t0 < 6:
            st = s.get("/api/v1/get_server_capabilities", key=key)[0]
            if st == 200:
                time.sleep(0.02)
        took = time.time() - t0
        R.check(st == 401 and took < limit, f"{what}: refused after {took:.2f} s (limit {limit} s; the cache "
                                            f"keeps a key 5 s without a notification), status {st}")

    def key():
        return loom_cli(s, "key", "create", "--tenant", "carol", "--secret-file", secret)
    refused_within(key(), lambda kid: loom_cli(s, "key", "revoke", kid), "loom key revoke", 1.0)
    refused_within(key(), lambda kid: s.psql(f"UPDATE api_keys SET expires_at = now() WHERE id = {kid}"),
                   "expires_at set by hand", 1.0)
    refused_within(key(), lambda kid: s.psql(f"DELETE FROM api_keys WHERE id = {kid}"), "key deleted", 1.0)
    # The api's LISTEN connection dropped (its last statement was LISTEN loom_api_keys), the
    # key revoked before it is back: the reconnect empties the cache (it retries after 0.1 s).
    refused_within(key(), lambda kid: s.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN " + "loom_api_keys';"
        f" UPDATE api_keys SET revoked_at = now() WHERE id = {kid}"), "revoked while the api's LISTEN connection "
        "was down", 2.5)
    # Without a notification (triggers off for the session) the api goes on believing the
    # key until its 5 s are up, and no longer: the cache is there, and bounded.
    k = key()
    R.check(s.get("/api/v1/get_server_capabilities", key=k)[0] == 200, "no notification: the key works first")
    t0 = time.time()
    s.psql("SET session_replication_role = replica;"
           f" UPDATE api_keys SET revoked_at = now() WHERE prefix = '{k[4:12]}'")
    while s.get("/api/v1/get_server_capabilities", key=k)[0] == 200 and time.time() - t0 < 10:
        time.sleep(0.05)
    took = time.time() - t0
    R.check(1.5 < took < 7.5, f"no notification: refused after {took:.2f} s (the cache's 5 s)")


def main():
    with Stack() as s:
        framing(s)
        secret = os.path.join(s.dir, "secret.key")
        key_changes(s, secret)
        loom_cli(s, "tenant", "create", "bob")
        key_b = loom_cli(s, "key", "create", "--tenant", "bob", "--secret-file", secret)
        key_a2 = loom_cli(s, "key", "create", "--tenant", "default", "--secret-file", secret)

        # ---- tenant A: a model and a sampler checkpoint -----------------------------------------
        sid = s.post("/api/v1/create_session", {})[1]["session_id"]
        fut = s.post("/api/v1/create_model", {"session_id": sid, "base_model": BASE, "lora_config": {"rank": 4}})[1]
        run = s.result(fut["request_id"])["model_id"]
        sv = s.post("/api/v1/save_weights_for_sampler", {"model_id": run, "seq_id": 1, "path": "s1"})[1]
        path = s.result(sv["request_id"])["path"]
        ck = f"/api/v1/training_runs/{run}/checkpoints/sampler_weights/s1"

        def link(key):
            """The signed download URL the archive route hands out (302, not followed)."""
            req = urllib.request.Request(s.url + ck + "/archive", headers={"X-API-Key": key})
            try:
                urllib.request.build_opener(NoRedirect).open(req, timeout=60)
            except urllib.error.HTTPError as e:
                return e.headers.get("Location") if e.code == 302 else None
            return None

        def b_session():
            bsid = s.post("/api/v1/create_session", {}, key=key_b)[1]["session_id"]
            st, ss = s.post("/api/v1/create_sampling_session", {"session_id": bsid, "model_path": path}, key=key_b)
            return ss.get("sampling_session_id") if st == 200 else None

        bsid = s.post("/api/v1/create_session", {}, key=key_b)[1]["session_id"]
        bf = s.post("/api/v1/create_model", {"session_id": bsid, "base_model": BASE, "lora_config": {"rank": 4}},
                    key=key_b)[1]
        b_model = s.result(bf["request_id"], key=key_b)["model_id"]

        def b_load(seq):
            return s.post("/api/v1/load_weights", {"model_id": b_model, "seq_id": seq, "path": path,
                                                   "optimizer": False}, key=key_b)

        def b_sample(ssid, seq):
            return s.post("/api/v1/asample", {"sampling_session_id": ssid, "seq_id": seq, "num_samples": 1,
                                              "prompt": {"chunks": [{"tokens": [1, 2, 3]}]},
                                              "sampling_params": {"max_tokens": 2}}, key=key_b)

        # ---- public, then unpublished ------------------------------------------------------------
        R.check(s.post(ck + "/publish", {})[0] == 200, "A publishes the checkpoint")
        ssid = b_session()
        st, f = b_sample(ssid, 0)
        R.check(ssid and st == 200 and "sequences" in s.result(f["request_id"], key=key_b),
                "B samples from it while public")
        url_b = link(key_b)
        R.check(url_b and fetch(url_b) == 200, "B downloads it while public")
        url_a = link(s.key)
        with s.queue_held():     # so that B's next sample and load stay queued
            st, queued = b_sample(ssid, 2)
            lst, load = b_load(1)
            R.check(s.request("DELETE", ck + "/publish")[0] == 200, "A unpublishes it")
        r = s.result(queued["request_id"], key=key_b) if st == 200 else {}
        R.check("withdrawn" in r.get("error", ""), f"B's sample queued before the unpublish fails: {r}")
        r = s.result(load["request_id"], key=key_b) if lst == 200 else {}
        R.check(r.get("category") == "user" and "can no longer be loaded" in r.get("error", ""),
                f"B's load_weights queued before the unpublish is refused when it runs: {r}")
        st, body = b_sample(ssid, 1)
        R.check(st == 403 and "no longer shared" in body.get("detail", ""),
                f"B's open sampling session is refused at the next sample ({st})")
        R.check(fetch(url_b) in (403, 404), f"B's earlier download link is refused ({fetch(url_b)})")
        R.check(fetch(url_a) == 200, "A's own link still works")

        # ---- shared, then the share revoked -----------------------------------------------------
        loom_cli(s, "adapter", "share", run, "--tenant", "bob")
        ssid = b_session()
        st, f = b_sample(ssid, 0)
        url_b = link(key_b)
        R.check(ssid and st == 200 and url_b and fetch(url_b) == 200, "shared: B samples and downloads")
        with s.queue_held():
            lst, load = b_load(2)
            loom_cli(s, "adapter", "share", run, "--tenant", "bob", "--revoke")
        r = s.result(load["request_id"], key=key_b) if lst == 200 else {}
        R.check(r.get("category") == "user" and "can no longer be loaded" in r.get("error", ""),
                f"share revoked: B's load_weights queued before is refused when it runs: {r}")
        st, f = b_load(3)
        R.check(st == 404, f"share revoked: a new load_weights is a 404 ({st})")
        st, _ = b_sample(ssid, 1)
        R.check(st == 403, f"share revoked: B's open sampling session is refused ({st})")
        R.check(fetch(url_b) in (403, 404), "share revoked: B's earlier link is refused")

        # ---- a key revoked ------------------------------------------------------------------------
        url_a2 = link(key_a2)
        R.check(url_a2 and fetch(url_a2) == 200, "a link made with A's second key works")
        # the per-file links of an external checkpoint and an upload's PUT links: the same rule
        ext = s.post("/api/v1/save_weights_external", {"model_id": run, "seq_id": 2, "path": "e1"})[1]
        R.check("path" in s.result(ext["request_id"]), "A saves external weights")
        st, ext_urls = s.get(f"/api/v1/training_runs/{run}/checkpoints/external_weights/e1/external_weights_urls",
                             key=key_a2)
        file_url = ext_urls["urls"]["adapter_config.json"] if st == 200 else None
        st, up = s.post("/api/v1/external_weights_upload_start", {"base_model": BASE}, key=key_a2)
        put_url = up["urls"]["adapter_config.json"] if st == 200 else None

        def put(url):
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=b"{}", method="PUT"), timeout=60) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code
        R.check(file_url and fetch(file_url) == 200 and put_url and put(put_url) == 200,
                "a per-file link and an upload link of A's second key work")
        kid = s.psql(f"SELECT id FROM api_keys WHERE prefix = '{key_a2[4:12]}'")
        loom_cli(s, "key", "revoke", kid)
        R.check(fetch(url_a2) == 403, "after `loom key revoke` that key's earlier link is refused")
        R.check(fetch(file_url) == 403 and put(put_url) == 403,
                "and so are its per-file links and its upload links")
        R.check(fetch(url_a) == 200, "links of A's other key still work")

        # ---- telemetry ---------------------------------------------------------------------------
        ev = lambda msg, session="S": {"session_id": session, "events": [
            {"event": "UNHANDLED_EXCEPTION", "severity": "ERROR", "error_type": "ValueError",
             "error_message": msg}]}
        R.check(s.post("/api/v1/telemetry", ev("x"), key=None)[0] == 401, "telemetry without a key -> 401")
        R.check(s.post("/api/v1/telemetry", ev("x"), key="tml-" + "A" * 43)[0] == 401,
                "telemetry with an unknown key -> 401")
        st, body = s.post("/api/v1/telemetry", ev("boom\nFORGED-1 api[1] error: fake\r\nFORGED-2",
                                                  "S\nFORGED-3 injected"))
        R.check(st == 200 and body == {"status": "accepted"}, "telemetry with a key -> accepted")
        # every request has its access line; what is bounded is what telemetry adds besides
        def non_access_lines(text):
            return sum(1 for l in text.splitlines() if " request method=" not in l)
        lines_before = non_access_lines(s.read_log())
        st, _ = s.request("POST", "/api/v1/telemetry",
                          raw=json.dumps(ev("y" * (2 << 20))).encode())
        R.check(st == 200, "a 2 MiB telemetry batch is accepted (and ignored)")
        for i in range(50):
            s.post("/api/v1/telemetry", ev(f"flood {i}"))
        log = open(os.path.join(s.dir, "up.log"), "rb").read().decode(errors="replace")
        R.check(not any(l.startswith("FORGED") for l in log.splitlines()) and "boom\\x0aFORGED-1" in log,
                "control characters are escaped in the log: no forged line")
        added = non_access_lines(log) - lines_before
        R.check(added <= 15, f"a 2 MiB batch and 50 batches in a row add {added} log lines")

        # ---- file modes ----------------------------------------------------------------------------
        def mode(p):
            return stat.S_IMODE(os.stat(p).st_mode)
        blobs = os.path.join(s.dir, "blobs")
        files, dirs = [], [blobs]
        for root, ds, fs in os.walk(blobs):
            dirs += [os.path.join(root, d) for d in ds]
            files += [os.path.join(root, f) for f in fs]
        R.check(files and all(mode(f) == 0o600 for f in files), f"blobs are 0600 ({len(files)} files)")
        R.check(all(mode(d) == 0o700 for d in dirs), f"blob directories are 0700 ({len(dirs)})")
        for name in ("secret.key", "api-key"):
            R.check(mode(os.path.join(s.dir, name)) == 0o600, f"{name} is 0600")
        R.check(mode(os.path.join(s.dir, "models")) == 0o700, "the generated model's directory is 0700")
        dm = mode(s.dir)
        R.check(dm & 0o067 == 0, f"the data directory lets nobody else in ({oct(dm)}; as root the"
                                 f" cluster's user may only pass through to pg/)")
        R.check(fetch(s.url + "/api/v1/healthz") == 200, "still serving")
    R.finish()


if __name__ == "__main__":
    main()
