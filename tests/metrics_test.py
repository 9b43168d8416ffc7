"""/metrics, the access log, cycle lines and `loom status` against `loom up`.

1. Who may scrape: no key 401, a tenant key 403, a 'metrics' key and an 'admin' key 200.
2. The scrape is read by an independent, strict parser of the text format
   (tests/lib/promparse.py, itself checked on broken input first).
3. Counters move as operations run: operations by kind and state, tokens per tenant, the
   latency histograms (wait, run, latency), cycles and tenants per cycle, HTTP requests by
   route and status (a 400 too), by the exact amounts of the work done.
4. Gauges: queue depth (an operation held by a seq gap), live executor, GPU figures from
   the executors row, registry storage equal to what the database holds.
5. Route labels are patterns: many ids and junk paths give one series each.
6. Two api processes: the deployment's series are the same from both; the HTTP series
   are each process's own.
7. Access log: one line per request with method, route, status, tenant, request id
   (the client's X-Request-Id, echoed) and latency; 4xx with the reason; no key, no
   control character; cycle lines naming tenant, model and loss; JSON lines with
   LOOM_LOG_FORMAT=json; LOOM_LOG_LEVEL=warn drops the 2xx lines.
8. deploy/grafana/loom.json uses only metrics the scrape has.
9. `loom status` shows the executor, the queue and recent cycles with their tenants.
"""
import json, os, re, subprocess, sys, time, urllib.request, urllib.error
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from stack import Stack, Results, LOOM_BIN
from apitest import loom_cli
from trainer import Trainer, BASE
from promparse import parse, value, samples, ParseError


def scrape(url, key):
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": "Bearer " + key} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def parser_refuses(R):
    bad = {
        "no newline": "a 1",
        "blank line": "a 1\n\nb 2\n",
        "bad escape": 'a{x="\\q"} 1\n',
        "twice": "a 1\na 2\n",
        "split family": "# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na{x=\"1\"} 2\n",
        "negative counter": "# TYPE c counter\nc -1\n",
        "histogram without +Inf": "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",
        "not cumulative": "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
        "count != +Inf": "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n",
        "bad value": "a one\n",
    }
    for what, text in bad.items():
        try:
            parse(text)
            R.check(False, f"parser refuses {what}")
        except ParseError:
            R.check(True, f"parser refuses {what}")


def hist_count(f, fam, **labels):
    return value(f, fam + "_count", **labels) or 0


def one_token_count(R, s, mkey, akey, before):
    """Tokens are counted one way everywhere: the metric, the console's operator view,
    `loom status`, GET /api/v1/usage and `loom usage` all give what usage counts (train,
    prefill, sample), and one chat adds to them what its answer's usage says it used
    (not the prompt plus max_tokens that its cycle reserved)."""
    st, ans = s.post("/v1/chat/completions", {"model": BASE, "messages": [{"role": "user", "content": "Hello there"}],
                                              "max_tokens": 200, "seed": 3}, key=None,
                     headers={"Authorization": "Bearer " + s.key})
    used = ans.get("usage", {}).get("total_tokens") if st == 200 else None
    time.sleep(2.5)   # the scheduler folds usage every 2 s
    f = parse(scrape(s.url, mkey)[2])
    kinds = ("train", "prefill", "sample")
    metric = {k: value(f, "loom_tenant_tokens_total", tenant="default", kind=k) or 0 for k in kinds}
    grew = sum(metric[k] - (value(before, "loom_tenant_tokens_total", tenant="default", kind=k) or 0)
               for k in ("prefill", "sample"))
    R.check(used is not None and used < 200 + 20 and grew == used,
            f"one chat of {used} tokens adds {grew} to loom_tenant_tokens_total (prefill + sample)")
    st, u = s.get("/api/v1/usage")
    usage = {k: (u.get("tokens") or {}).get(k, 0) for k in kinds} if st == 200 else None
    cli = json.loads(loom_cli(s, "usage", "--tenant", "default", "--json"))
    cli = {k: (cli.get("tokens") or {}).get(k, 0) for k in kinds}
    status = next((t for t in json.loads(loom_cli(s, "status", "--json"))["tenants"] if t["name"] == "default"), {})
    status = {k: (status.get("tokens") or {}).get(k, 0) for k in kinds}
    st, ov = s.get("/api/v1/console/admin/overview", key=akey)
    con = next((t for t in ov.get("tenants", []) if t["name"] == "default"), {}) if st == 200 else {}
    con = {k: (con.get("tokens") or {}).get(k, 0) for k in kinds}
    R.check(metric["train"] > 0 and usage == metric == cli == status == con,
            f"the same tokens everywhere: metric {metric}, usage route {usage}, loom usage {cli}, loom status "
            f"{status}, console {con}")


def main():
    R = Results()
    parser_refuses(R)
    with Stack() as s:
        secret = os.path.join(s.dir, "secret.key")
        loom_cli(s, "tenant", "create", "ops")
        mkey = loom_cli(s, "key", "create", "--tenant", "ops", "--scopes", "metrics", "--secret-file", secret)
        akey = loom_cli(s, "key", "create", "--tenant", "ops", "--scopes", "admin", "--secret-file", secret)

        # 1. who may scrape
        R.check(scrape(s.url, None)[0] == 401, "/metrics without a key: 401")
        st, _, body = scrape(s.url, s.key)
        R.check(st == 403 and "metrics" in body, f"/metrics with a tenant key: 403 ({body[:120]})")
        st, ctype, text0 = scrape(s.url, mkey)
        R.check(st == 200 and ctype.startswith("text/plain; version=0.0.4"), f"metrics key: 200, {ctype}")
        R.check(scrape(s.url, akey)[0] == 200, "admin key: 200")
        st, _ = s.get("/api/v1/training_runs", key=mkey)
        R.check(st == 403, "a metrics-only key reads no tenant data (403)")

        # 2. strict parse
        try:
            f0 = parse(text0)
            R.check(True, f"the scrape parses strictly ({len(f0)} families)")
        except ParseError as e:
            R.check(False, f"the scrape parses strictly: {e}")
            f0 = {}

        # 3. counters move by the work done
        t = Trainer(s, s.key)
        mid = t.create()
        before = parse(scrape(s.url, mkey)[2])
        N, DATUMS, TOK = 3, 2, 12
        for i in range(N):
            t.step(mid, i, DATUMS, TOK)
        st, _ = s.post("/api/v1/forward_backward", {"model_id": mid, "seq_id": 999, "forward_backward_input": {
            "data": [{"model_input": {"chunks": [{"type": "encoded_text", "tokens": [10 ** 9]}]},
                      "loss_fn_inputs": {}}], "loss_fn": "cross_entropy"}})
        R.check(st == 400, f"a bad forward_backward is a 400 ({st})")
        after = parse(scrape(s.url, mkey)[2])

        def delta(name, **labels):
            return (value(after, name, **labels) or 0) - (value(before, name, **labels) or 0)

        R.check(delta("loom_operations_total", kind="forward_backward", state="done") == N and
                delta("loom_operations_total", kind="optim_step", state="done") == N,
                "loom_operations_total: +3 forward_backward, +3 optim_step done")
        R.check(delta("loom_operations_total", kind="forward_backward", state="failed") == 1,
                "the refused submit counts as a failed forward_backward")
        R.check(delta("loom_tenant_tokens_total", tenant="default", kind="train") == N * DATUMS * TOK,
                f"loom_tenant_tokens_total: +{N * DATUMS * TOK} train tokens for the tenant")
        for fam in ("loom_operation_wait_seconds", "loom_operation_run_seconds", "loom_operation_latency_seconds"):
            d = hist_count(after, fam, kind="forward_backward") - hist_count(before, fam, kind="forward_backward")
            R.check(d == N, f"{fam}{{kind=forward_backward}} counted {d} = {N}")
        lat = value(after, "loom_operation_latency_seconds_sum", kind="optim_step")
        R.check(lat is not None and lat > 0, f"latency sum > 0 ({lat})")
        cyc = sum(v for l, v in samples(after, "loom_cycles_total") if l.get("state") == "done") - \
            sum(v for l, v in samples(before, "loom_cycles_total") if l.get("state") == "done")
        R.check(cyc >= N, f"loom_cycles_total grew by {cyc} (>= {N})")
        R.check(hist_count(after, "loom_cycle_tenants", base_model=BASE) - hist_count(before, "loom_cycle_tenants", base_model=BASE) == cyc,
                "every finished cycle is in the tenants-per-cycle histogram")
        busy = [v for l, v in samples(after, "loom_executor_busy_seconds_total")]
        R.check(busy and busy[0] > 0, f"executor busy seconds {busy}")
        fb_route = dict(method="POST", route="/api/v1/forward_backward")
        R.check(delta("loom_http_requests_total", status="200", **fb_route) == N and
                delta("loom_http_requests_total", status="400", **fb_route) == 1,
                "loom_http_requests_total: forward_backward +3 (200) and +1 (400)")
        R.check(hist_count(after, "loom_http_request_duration_seconds", **fb_route) -
                hist_count(before, "loom_http_request_duration_seconds", **fb_route) == N + 1,
                "request duration histogram counted the 4 forward_backward requests")

        one_token_count(R, s, mkey, akey, after)

        # 4. gauges
        gap = t.seq[mid] + 5   # a seq_id that has to wait for the ones before it
        st, fut = s.post("/api/v1/forward_backward", {"model_id": mid, "seq_id": gap, "forward_backward_input": {
            "data": [{"model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
                      "loss_fn_inputs": {"target_tokens": {"data": [2, 3, 4], "dtype": "int64", "shape": [3]}}}],
            "loss_fn": "cross_entropy"}})
        time.sleep(0.3)
        s.psql("UPDATE executors SET gpu_utilization = 42.5, gpu_memory_used = 1000, gpu_memory_total = 8000,"
               " gpu_temperature = 61, gpu_power_watts = 250.5, gpu_sampled_at = now() WHERE state <> 'gone'")
        f = parse(scrape(s.url, mkey)[2])
        q = value(f, "loom_queue_operations", state="queued", kind="forward_backward", base_model=BASE)
        R.check(q == 1, f"queue depth: the operation held by the seq gap is queued ({q})")
        R.check((value(f, "loom_queue_oldest_seconds", state="queued", kind="forward_backward", base_model=BASE) or 0) > 0,
                "its age is > 0")
        up = samples(f, "loom_executor_up")
        R.check(len(up) == 1 and up[0][1] == 1 and up[0][0]["backend"] == "cpu", f"one live cpu executor: {up}")
        ex = up[0][0] if up else {}
        R.check(value(f, "loom_executor_gpu_utilization_ratio", **ex) == 0.425 and
                value(f, "loom_executor_gpu_power_watts", **ex) == 250.5,
                "GPU figures of the executors row: utilisation 0.425, 250.5 W")
        R.check(value(f, "loom_models_active", base_model=BASE) == 1, "one active model")

        # registry storage after a save
        sess_seq = t.seq[mid]
        s.psql(f"DELETE FROM operations WHERE model_id = '{mid}' AND seq_id = {gap}")   # lift the gap
        t.seq[mid] = sess_seq
        t.op(mid, "/api/v1/save_weights_for_sampler", {"path": "m1"})
        t.op(mid, "/api/v1/save_weights", {"path": "s1"})
        f = parse(scrape(s.url, mkey)[2])
        db_bytes = int(s.psql("SELECT sum(size_bytes) FROM (SELECT DISTINCT blob_digest, size_bytes FROM adapter_versions"
                              " WHERE deleted_at IS NULL) x"))
        R.check(value(f, "loom_registry_checkpoints", tenant="default", kind="sampler") == 1 and
                value(f, "loom_registry_checkpoints", tenant="default", kind="training") == 1,
                "registry: one sampler and one training checkpoint")
        R.check(value(f, "loom_registry_stored_bytes") == db_bytes and db_bytes > 0,
                f"registry stored bytes {value(f, 'loom_registry_stored_bytes')} = {db_bytes}")

        # the Grafana dashboard reads only series that exist
        dash = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "grafana", "loom.json")))
        exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
        used = {re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"\b(?:loom|process)_[a-z_]+", e)}
        missing = sorted(n for n in used if n not in f)
        R.check(len(exprs) > 20 and not missing, f"deploy/grafana/loom.json: {len(used)} metrics, all exposed (missing {missing})")

        # 5. bounded route labels
        for i in range(20):
            s.get(f"/api/v1/training_runs/nope-{i}")
            s.get(f"/junk/{i}/x%C3%A9")
        f = parse(scrape(s.url, mkey)[2])
        routes = {l["route"] for l, v in samples(f, "loom_http_requests_total")}
        R.check("/api/v1/training_runs/{id}" in routes and "unmatched" in routes and
                not any("nope" in r or "junk" in r for r in routes), f"route labels are patterns: {sorted(routes)}")
        R.check(value(f, "loom_http_requests_total", method="other", route="unmatched", status="404") == 20,
                "the 20 junk paths are one series")

        # 6. two api processes
        env = dict(os.environ, LOOM_LOG_FORMAT="json")
        log2 = open(os.path.join(s.dir, "api2.log"), "wb")
        p2 = subprocess.Popen([LOOM_BIN, "api", "--db", s.db, "--data-dir", s.dir, "--port", "0", "--threads", "1",
                               "--secret-file", secret],
                              stdout=subprocess.PIPE, stderr=log2, env=env)
        try:
            line = p2.stdout.readline().decode()
            if "=" not in line:
                log2.flush()
                raise RuntimeError("the second api did not start: " + open(os.path.join(s.dir, "api2.log")).read()[-2000:])
            url2 = "http://127.0.0.1:" + line.split("=", 1)[1].strip()
            req = urllib.request.Request(url2 + "/api/v1/training_runs", headers={"X-API-Key": s.key, "X-Request-Id": "test-req-1"})
            with urllib.request.urlopen(req) as r:
                R.check(r.headers.get("x-request-id") == "test-req-1", "the client's X-Request-Id is echoed")
            try:
                urllib.request.urlopen(urllib.request.Request(url2 + "/api/v1/training_runs/x", headers={"X-API-Key": "tml-wrong"}))
            except urllib.error.HTTPError:
                pass
            fa, fb2 = parse(scrape(s.url, mkey)[2]), parse(scrape(url2, mkey)[2])
            same = all(value(fa, "loom_operations_total", **l) == v for l, v in samples(fb2, "loom_operations_total"))
            R.check(same and samples(fb2, "loom_operations_total"), "both apis give the same deployment series")
            R.check(value(fb2, "loom_http_requests_total", method="GET", route="/api/v1/training_runs", status="200") == 1 and
                    value(fb2, "loom_http_requests_total", method="POST", route="/api/v1/forward_backward", status="200") is None,
                    "the second api counts only its own requests")
            time.sleep(0.3)
        finally:
            p2.terminate()
            p2.wait()
            log2.close()
        lines = open(os.path.join(s.dir, "api2.log"), encoding="utf-8").read().splitlines()
        objs = []
        for l in lines:
            try:
                objs.append(json.loads(l))
            except ValueError:
                R.check(False, f"LOOM_LOG_FORMAT=json: every line is JSON: {l[:120]}")
        acc = [o for o in objs if o.get("msg") == "request" and o.get("request_id") == "test-req-1"]
        R.check(len(acc) == 1 and acc[0]["status"] == 200 and acc[0]["tenant"] == "default" and
                acc[0]["route"] == "/api/v1/training_runs" and acc[0]["method"] == "GET" and
                isinstance(acc[0]["ms"], (int, float)) and {"ts", "level", "role", "pid"} <= set(acc[0]),
                f"JSON access line: {acc}")
        bad = [o for o in objs if o.get("msg") == "request" and o.get("status") == 401]
        R.check(len(bad) == 1 and "invalid API key" in bad[0].get("reason", ""), f"JSON 401 line with its reason: {bad}")

        # 7. the text log of loom up
        s.request("GET", "/api/v1/sessions/%1b%5b31mred", headers={"X-Request-Id": "evil id"})
        # an OpenAI route's 4xx: its error has OpenAI's shape, the log line its reason
        st, _ = s.post("/v1/chat/completions", {"model": BASE, "messages": [{"role": "user", "content": "x"}],
                                                "logit_bias": {"1": 5}}, key=None,
                       headers={"Authorization": "Bearer " + s.key})
        st2, _ = s.post("/v1/completions", {"model": "no-such-model", "prompt": "x"}, key=None,
                        headers={"Authorization": "Bearer " + s.key})
        time.sleep(0.3)
        log = open(os.path.join(s.dir, "up.log"), encoding="utf-8", errors="replace").read()
        acc = [l for l in log.splitlines() if " request method=POST route=/api/v1/forward_backward status=200 " in l]
        R.check(len(acc) >= N and all("tenant=default request_id=r-" in l and " ms=" in l for l in acc),
                f"access lines for the forward_backward submits ({len(acc)})")
        rej = [l for l in log.splitlines() if "route=/api/v1/forward_backward status=400" in l]
        R.check(len(rej) == 1 and "reason=" in rej[0] and "vocabulary" in rej[0], f"the 400 with its reason: {rej}")
        oai = [l for l in log.splitlines() if re.search(r"route=/v1/(chat/)?completions status=4", l)]
        R.check(st == 400 and st2 == 404 and len(oai) == 2 and "logit_bias" in oai[0] and "reason=" in oai[0]
                and "reason=" in oai[1] and "no-such-model" in oai[1],
                f"the OpenAI routes' 4xx lines carry their reason too: {oai}")
        R.check(s.key not in log and mkey not in log and akey not in log, "no API key in the log")
        R.check(not any(ord(c) < 0x20 and c not in "\n" for c in log), "no control character in the log")
        R.check("route=/api/v1/sessions/{id} status=404" in log, "the escaped path's request is logged by its route")
        cyc_lines = [l for l in log.splitlines() if "executor[" in l and "cycle done" in l and f"models={mid}" in l
                     and "tenants=default(" in l]
        R.check(any(f'losses="{mid}=' in l for l in cyc_lines), f"cycle lines name tenant, model and loss ({len(cyc_lines)})")
        split = [tuple(float(v) for v in m.groups()) for l in cyc_lines for m in
                 [re.search(r" ms=([\d.]+) start_ms=([\d.]+) compute_ms=([\d.]+) commit_ms=([\d.]+) ", l)] if m]
        R.check(split and len(split) == len(cyc_lines) and all(t > 0 and a >= 0 and b >= 0 and c > 0
                                                               and abs(a + b + c - t) <= 0.35 for t, a, b, c in split),
                f"cycle lines split their time: start + compute + commit = ms, to the rounding ({split[:3]})")

        # LOOM_LOG_LEVEL=warn: no 2xx access lines
        env = dict(os.environ, LOOM_LOG_LEVEL="warn")
        log3 = open(os.path.join(s.dir, "api3.log"), "wb")
        p3 = subprocess.Popen([LOOM_BIN, "api", "--db", s.db, "--data-dir", s.dir, "--port", "0", "--threads", "1", "--secret-file", secret],
                              stdout=subprocess.PIPE, stderr=log3, env=env)
        try:
            url3 = "http://127.0.0.1:" + p3.stdout.readline().decode().split("=", 1)[1].strip()
            urllib.request.urlopen(urllib.request.Request(url3 + "/api/v1/training_runs", headers={"X-API-Key": s.key}))
            time.sleep(0.2)
        finally:
            p3.terminate()
            p3.wait()
            log3.close()
        R.check("request method=" not in open(os.path.join(s.dir, "api3.log")).read(), "LOOM_LOG_LEVEL=warn: no access lines")

        # 9. loom status
        out = loom_cli(s, "status", "--cycles", "5")
        R.check("EXECUTORS" in out and "cpu" in out and "QUEUE" in out and "RECENT CYCLES" in out and "default(" in out,
                "loom status: executors, queue, recent cycles with tenants")
        js = json.loads(loom_cli(s, "status", "--json"))
        R.check(len(js["executors"]) >= 1 and any(x["name"] == "default" for x in js["tenants"]) and js["cycles"],
                "loom status --json")
    R.finish()


if __name__ == "__main__":
    main()
