"""Checkpoint archive downloads over HTTP (a whole Loom from `loom up`):

1. The signed download answers with Accept-Ranges: bytes; HEAD gives the same headers
   (Content-Length of the whole archive) and no body; two GETs give identical bytes.
2. Range: bytes=a-b, bytes=a-, bytes=-n -> 206 with Content-Range and the matching
   Content-Length; ranges concatenated give the whole body, for the tinker and the peft
   format; a range starting at or past the end -> 416 with Content-Range: bytes */N;
   several ranges or a malformed one -> the whole body (200). A large archive (rank 64,
   streamed in chunks by the h2o layer) comes back intact, whole and in ranges.
3. One audit row per download, not per range.
4. `loom up` runs the registry GC child: its first pass is in the log.
5. The archive URL route answers what each SDK takes: SDK 0.15-0.22.1 send two Accept
   headers on one request (their client's default `Accept: application/json` and the
   call's own `accept: application/gzip`) and take only a 302; SDK 0.22.2 and later
   send application/json alone and read a 200 JSON body (a 302 works for them too).
"""
import http.client, io, json, os, sys, tarfile, time, urllib.error, urllib.parse, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import Stack, Results
from checkpoint_test import Client, archive_link


def fetch(url, method="GET", rng=None):
    req = urllib.request.Request(url, method=method, headers={"Range": rng} if rng else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def archive_request(s, run, ckpt, accepts):
    """GET .../archive with one Accept header per entry of accepts, in order, on one
    request (http.client: urllib folds headers into a dict): (status, headers, JSON body)."""
    u = urllib.parse.urlsplit(s.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.putrequest("GET", f"/api/v1/training_runs/{run}/checkpoints/{ckpt}/archive", skip_accept_encoding=True)
        conn.putheader("X-API-Key", s.key)
        for a in accepts:
            conn.putheader("Accept", a)
        conn.endheaders()
        r = conn.getresponse()
        body = r.read()
        return r.status, r.headers, json.loads(body) if body else None
    finally:
        conn.close()


def check_archive_accept(R, s, run, ckpt):
    # SDK 0.16.1 (to 0.22.1): httpx sends the client's default and the call's header both
    st, h, body = archive_request(s, run, ckpt, ["application/json", "application/gzip"])
    R.check(st == 302 and h.get("Location", "").startswith("http") and h.get("Expires") and
            isinstance(body, dict) and body.get("url") == h.get("Location"),
            f"two Accept headers, application/json then application/gzip (SDK 0.16.1): 302 with Location "
            f"and Expires ({st})")
    st, h, body = archive_request(s, run, ckpt, ["application/gzip", "application/json"])
    R.check(st == 302, f"... in the other order: 302 ({st})")
    st, h, body = archive_request(s, run, ckpt, ["application/json, application/gzip"])
    R.check(st == 302, f"... both in one header: 302 ({st})")
    # SDK 0.22.2 and later: the default and the call's header, both JSON
    st, h, body = archive_request(s, run, ckpt, ["application/json", "application/json"])
    R.check(st == 200 and h.get("Location") is None and isinstance(body, dict) and
            body.get("url", "").startswith("http") and "expires" in body,
            f"two Accept headers, both application/json (SDK 0.22.2+): 200 {{url, expires}} ({st})")
    st, h, body = archive_request(s, run, ckpt, ["application/json"])
    R.check(st == 200, f"Accept: application/json alone: 200 ({st})")
    st, h, body = archive_request(s, run, ckpt, ["application/json", "application/gzip;q=0"])
    R.check(st == 200, f"application/gzip refused with q=0 does not ask for gzip: 200 ({st})")
    st, h, body = archive_request(s, run, ckpt, ["*/*"])
    R.check(st == 302, f"Accept: */* (curl): 302 ({st})")
    st, h, body = archive_request(s, run, ckpt, [])
    R.check(st == 302, f"no Accept header: 302 ({st})")


def check_ranges(R, url, full, label):
    n = len(full)
    st, body, h = fetch(url, rng="bytes=0-99")
    R.check(st == 206 and body == full[:100] and h.get("Content-Range") == f"bytes 0-99/{n}" and
            int(h.get("Content-Length", -1)) == 100, f"{label}: bytes=0-99 -> 206, Content-Range {h.get('Content-Range')}")
    st, body, h = fetch(url, rng="bytes=100-")
    R.check(st == 206 and body == full[100:] and h.get("Content-Range") == f"bytes 100-{n - 1}/{n}" and
            int(h.get("Content-Length", -1)) == n - 100, f"{label}: bytes=100- -> the rest")
    st, body, h = fetch(url, rng="bytes=-50")
    R.check(st == 206 and body == full[-50:] and h.get("Content-Range") == f"bytes {n - 50}-{n - 1}/{n}",
            f"{label}: bytes=-50 -> the last 50 bytes")
    st, body, h = fetch(url, rng=f"bytes=0-{n + 1000}")
    R.check(st == 206 and body == full and h.get("Content-Range") == f"bytes 0-{n - 1}/{n}",
            f"{label}: a range past the end is clipped to it")
    # a download in pieces, as a resuming client does
    cuts = [0, 1, 511, 512, n // 3, n // 2 + 7, n - 1, n]
    parts = []
    for a, b in zip(cuts, cuts[1:]):
        st, body, h = fetch(url, rng=f"bytes={a}-{b - 1}")
        parts.append(body if st == 206 and int(h.get("Content-Length", -1)) == b - a else b"")
    R.check(b"".join(parts) == full, f"{label}: {len(parts)} ranges concatenated equal the whole {n} bytes")
    st, body, h = fetch(url, rng=f"bytes={n}-")
    R.check(st == 416 and h.get("Content-Range") == f"bytes */{n}", f"{label}: bytes={n}- -> 416, bytes */{n}")
    st, body, h = fetch(url, rng="bytes=-0")
    R.check(st == 416, f"{label}: bytes=-0 -> 416")
    st, body, h = fetch(url, rng="bytes=0-9, 20-29")
    R.check(st == 200 and body == full, f"{label}: several ranges -> the whole body (200)")
    st, body, h = fetch(url, rng="bytes=9-2")
    R.check(st == 200 and body == full, f"{label}: a malformed range is ignored (200)")
    st, body, h = fetch(url, "HEAD", rng="bytes=10-19")
    R.check(st == 206 and body == b"" and int(h.get("Content-Length", -1)) == 10, f"{label}: HEAD with a range")


def main():
    R = Results()
    with Stack() as s:
        st, caps = s.get("/api/v1/get_server_capabilities")
        base = caps["supported_models"][0]["model_name"]
        a = Client(s, s.key)
        m = a.create(base, rank=4)
        a.step(m, 0, "cross_entropy")
        r = a.op(m, "/api/v1/save_weights", {"path": "w1"})
        R.check(r.get("path") == f"tinker://{m}/weights/w1", f"save_weights: {r}")
        r = a.op(m, "/api/v1/save_weights_for_sampler", {"path": "s1"})
        R.check(r.get("path") == f"tinker://{m}/sampler_weights/s1", f"save_weights_for_sampler: {r}")

        check_archive_accept(R, s, m, "weights/w1")
        st, loc, _, _ = archive_link(s, s.key, m, "weights/w1")
        st, full, h = fetch(loc)
        R.check(st == 200 and h.get("Accept-Ranges") == "bytes" and int(h.get("Content-Length", -1)) == len(full) and
                "attachment" in h.get("Content-Disposition", ""),
                f"GET: 200, Accept-Ranges bytes, {len(full)} bytes, {h.get('Content-Disposition')}")
        st, body, h2 = fetch(loc, "HEAD")
        R.check(st == 200 and body == b"" and int(h2.get("Content-Length", -1)) == len(full) and
                h2.get("Accept-Ranges") == "bytes", "HEAD: same length and Accept-Ranges, no body")
        R.check(fetch(loc)[1] == full, "a second GET gives the same bytes (deterministic archive)")
        audits = int(s.psql("SELECT count(*) FROM audit_log WHERE action = 'checkpoint.download'"))
        check_ranges(R, loc, full, "tinker format")
        audits2 = int(s.psql("SELECT count(*) FROM audit_log WHERE action = 'checkpoint.download'"))
        # the ranges starting at byte 0: 0-99, 0-(n+1000), 0-0, the two whole-body fallbacks
        R.check(audits2 - audits == 5, f"audit: one row per download from byte 0, none per later range ({audits2 - audits})")

        st, ploc, _, _ = archive_link(s, s.key, m, "sampler_weights/s1", "?format=peft")
        st, pfull, h = fetch(ploc)
        names = sorted(t.name for t in tarfile.open(fileobj=io.BytesIO(pfull), mode="r:").getmembers()) if st == 200 else []
        R.check(st == 200 and names == ["adapter_config.json", "adapter_model.safetensors", "checkpoint_complete"],
                f"peft format: {names}")
        check_ranges(R, ploc, pfull, "peft format")

        big = a.create(base, rank=64)
        a.step(big, 0, "cross_entropy")
        a.op(big, "/api/v1/save_weights", {"path": "big"})
        st, bloc, _, _ = archive_link(s, s.key, big, "weights/big")
        st, bfull, h = fetch(bloc)
        members = tarfile.open(fileobj=io.BytesIO(bfull), mode="r:").getmembers() if st == 200 else []
        R.check(st == 200 and len(bfull) > 1 << 20 and int(h.get("Content-Length", -1)) == len(bfull) and
                len(members) == 5 and fetch(bloc)[1] == bfull,
                f"a large archive ({len(bfull)} bytes, streamed) arrives whole and identical twice")
        st, body, h = fetch(bloc, "HEAD")
        R.check(st == 200 and body == b"" and int(h.get("Content-Length", -1)) == len(bfull),
                "HEAD of the large archive: its length, no body")
        half = len(bfull) // 2
        p1 = fetch(bloc, rng=f"bytes=0-{half - 1}")[1]
        p2 = fetch(bloc, rng=f"bytes={half}-")[1]
        R.check(p1 + p2 == bfull, "... and in two ranges")

        deadline = time.time() + 20
        while time.time() < deadline and "blobs kept for live versions" not in s.read_log():
            time.sleep(0.5)
        R.check("blobs kept for live versions" in s.read_log(), "loom up runs `loom adapter gc --every 3600`: "
                "its first pass is in the log")
    R.finish()


if __name__ == "__main__":
    main()
