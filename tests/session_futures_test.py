"""The per-sampling-session routes of SDK 0.26+ over real HTTP against `loom up`
(docs/protocol.md §2.1, §2.2, §4.4 - §4.6), each request as the SDK sends it, each answer
checked against the SDK's type:

1. client/config advertises sample_use_retrieve_futures and sample_join_sampling_session,
   client/dynamic_config sample_cancel_enabled (the SDK uses the routes only when told).
2. retrieve_futures as the SDK's SessionFuturesPoller uses it: every finished sample of
   the client exactly once along the cursor, FutureFinished with the size of the payload
   retrieve_future then gives; a replayed cursor gets the same batch again (a lost
   answer); a poll waits for the next completion and is woken by its NOTIFY
   ('ss:' || md5(session), seen with psql LISTEN); a completion committed after a later
   one (a slow executor's commit) still comes, with a later number.
3. join_sampling_session: clients 1, 2, ...; each client's samples are its own
   (seq_id // 10^9 = its number): its poll sees them, the others' do not, and a
   resubmitted (sampling_session_id, seq_id) is the same future.
4. cancel_future: a queued sample is canceled and never runs (FutureFailed, retrieve_future
   says why); a finished one is 204 and unchanged; a running one is 204 and still finishes;
   an unknown id or a training future is 404.
5. Another tenant: 404 for every route; bad input: 400 naming the field.
"""
import hashlib, json, os, subprocess, sys, threading, time, urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import Stack, Results, wait_for
from apitest import loom_cli, is_detail, start_second_api
import sdk_types as T

R = Results()
BLOCK = 1_000_000_000


def prompt(tokens):
    return {"chunks": [{"type": "encoded_text", "tokens": tokens}]}


class Sampler:
    """One client of a sampling session, as the SDK's SamplingClient: seq_ids from its block."""

    def __init__(self, s, key, ssid, counter=0):
        self.s, self.key, self.ssid, self.counter = s, key, ssid, counter
        self.next = counter * BLOCK
        self.cursor = 0

    def asample(self, seq=None, max_tokens=3):
        if seq is None:
            seq, self.next = self.next, self.next + 1
        st, f = self.s.post("/api/v1/asample", {
            "sampling_session_id": self.ssid, "seq_id": seq, "num_samples": 1, "prompt": prompt([3, 4, 5]),
            "sampling_params": {"max_tokens": max_tokens, "temperature": 1.0, "seed": 7}}, key=self.key)
        assert st == 200, (st, f)
        return f["request_id"]

    def poll(self, cursor=None, timeout=None, clone=None):
        body = {"target": {"type": "sampling_session", "sampling_session_id": self.ssid,
                           "cloned_sampler_id": self.counter if clone is None else clone},
                "prev_cursor": self.cursor if cursor is None else cursor}
        if timeout is not None:
            body["timeout"] = timeout
        return self.s.post("/api/v1/retrieve_futures", body, key=self.key, timeout=60)

    def collect(self, want, deadline_s=120):
        """Polls as the SDK's poller does (cursor carried over) until the request ids of want
        all came; {request_id: completion}, and whether every answer parsed as the SDK's."""
        got, typed = {}, True
        deadline = time.time() + deadline_s
        while not set(want) <= set(got) and time.time() < deadline:
            st, body = self.poll()
            typed &= st == 200 and T.parse(T.FUTURES_RETRIEVE_RESPONSE, body, "FuturesRetrieveResponse") is not None
            if st != 200:
                break
            for c in body["completions"]:
                typed &= c["request_id"] not in got   # each exactly once along the cursor
                got[c["request_id"]] = c
            self.cursor = body["cursor"]
        return got, typed


def raw_result(s, key, rid):
    """retrieve_future's JSON answer as bytes (what the SDK fetches after the poller)."""
    import urllib.request
    req = urllib.request.Request(s.url + "/api/v1/retrieve_future", data=json.dumps({"request_id": rid}).encode(),
                                 headers={"Content-Type": "application/json", "X-API-Key": key}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()


def main():
    with Stack() as s:
        loom_cli(s, "tenant", "create", "tenant-b")
        key_b = loom_cli(s, "key", "create", "--tenant", "tenant-b", "--secret-file", os.path.join(s.dir, "secret.key"))
        base = s.get("/api/v1/get_server_capabilities")[1]["supported_models"][0]["model_name"]

        # ---- 1. flags ---------------------------------------------------------------------------
        st, cc = s.post("/api/v1/client/config", {"sdk_version": "0.39.0"}, key=None)
        R.check(st == 200 and T.parse(T.CLIENT_CONFIG, cc, "ClientConfigResponse") is not None and
                cc.get("sample_use_retrieve_futures") is True and cc.get("sample_join_sampling_session") is True,
                f"client/config advertises the session poll and joins: {cc}")
        api2, url2 = start_second_api(s, "--proto")
        try:
            with urllib.request.urlopen(urllib.request.Request(url2 + "/api/v1/client/config", data=b"{}"),
                                        timeout=30) as r:
                cc2 = json.loads(r.read())
        finally:
            api2.terminate()
            api2.wait()
        R.check(cc2.get("proto_write_fwdbwd") is True and cc2.get("sample_use_retrieve_futures") is True and
                cc2.get("sample_join_sampling_session") is True, f"and so does `loom api --proto`'s: {cc2}")
        st, dc = s.post("/api/v1/client/dynamic_config", {}, key=None)
        R.check(st == 200 and T.parse(T.CLIENT_DYNAMIC_CONFIG, dc, "ClientDynamicConfigResponse") is not None
                and dc.get("sample_cancel_enabled") is True, f"client/dynamic_config enables cancel_future: {dc}")

        sid = s.post("/api/v1/create_session", {"sdk_version": "0.39.0"})[1]["session_id"]
        ssid = s.post("/api/v1/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0,
                                                          "base_model": base})[1]["sampling_session_id"]
        c0 = Sampler(s, s.key, ssid)

        # ---- 2. the poll ------------------------------------------------------------------------
        rids = [c0.asample() for _ in range(3)]
        got, typed = c0.collect(rids)
        R.check(set(got) == set(rids) and typed, f"every finished sample comes exactly once along the cursor, each "
                                                  f"answer a FuturesRetrieveResponse (cursor {c0.cursor})")
        sizes_ok = all(got.get(r, {}).get("state") == "finished" and
                       got[r].get("response_payload_uncompressed_size") == len(raw_result(s, s.key, r)) for r in rids)
        R.check(sizes_ok, "FutureFinished carries the size of the payload retrieve_future then gives")
        st, again = c0.poll(cursor=0)
        R.check(st == 200 and sorted(c["request_id"] for c in again["completions"]) == sorted(rids) and
                again["cursor"] == c0.cursor, "a replayed cursor (a lost answer) gets the same completions again")
        st, far = c0.poll(cursor=10**12, timeout=0)
        R.check(st == 200 and sorted(c["request_id"] for c in far["completions"]) == sorted(rids),
                "a cursor past every number the session gave is not its own: everything comes again, not nothing")
        t0 = time.time()
        st, empty = c0.poll(timeout=0)
        R.check(st == 200 and empty == {"completions": [], "cursor": c0.cursor} and time.time() - t0 < 20,
                f"nothing new with timeout 0: the empty answer at once, same cursor: {empty}")

        # the poll waits and is woken: by the NOTIFY of the finished sample
        listen = subprocess.Popen(["psql", "-X", "-q", "-d", s.db], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        listen.stdin.write("LISTEN loom_op_done;\nSELECT 1;\n")
        listen.stdin.flush()
        waited = {}

        def wait_poll():
            waited["t0"] = time.time()
            waited["answer"] = c0.poll(timeout=20)
            waited["t1"] = time.time()
        th = threading.Thread(target=wait_poll)
        th.start()
        time.sleep(0.5)
        r4 = c0.asample()
        th.join(60)
        listen.stdin.write("SELECT pg_sleep(0.5);\n\\q\n")
        listen.stdin.flush()
        out = listen.communicate(timeout=30)[0]
        key = "ss:" + hashlib.md5(ssid.encode()).hexdigest()
        st, ans = waited.get("answer", (0, {}))
        R.check(st == 200 and [c["request_id"] for c in ans.get("completions", [])] == [r4] and
                waited["t1"] - waited["t0"] < 20, f"a waiting poll returns with the sample that finished, not at the "
                                                  f"end of its hold ({waited.get('t1', 0) - waited.get('t0', 0):.1f} s)")
        R.check(f'payload "{key}"' in out, f"the finished sample sent NOTIFY loom_op_done '{key[:12]}...' (the key "
                                           f"its session's polls wait under)")
        c0.cursor = ans["cursor"] if st == 200 else c0.cursor

        # a completion committed after the poll moved past later ones is still reported
        late = "req-late" + "0" * 24
        s.psql(f"INSERT INTO operations (request_id, tenant_id, sampling_session_id, seq_id, kind, payload, state,"
               f" result, finished_at) SELECT '{late}', tenant_id, id, 777, 'sample', '{{}}', 'done',"
               f" '{{\"sequences\": []}}', now() - interval '1 hour' FROM sampling_sessions WHERE id = '{ssid}'")
        got, typed = c0.collect([late], deadline_s=30)
        R.check(late in got and typed, "a sample finished (and committed) late, with an old finished_at, comes with "
                                       "the next number: numbers are given when a poll first sees it")

        # ---- 3. clones ----------------------------------------------------------------------------
        st, j1 = s.post("/api/v1/join_sampling_session", {"sampling_session_id": ssid, "type": "join_sampling_session"})
        st2, j2 = s.post("/api/v1/join_sampling_session", {"sampling_session_id": ssid})
        R.check(st == st2 == 200 and T.parse(T.JOIN_SAMPLING_SESSION, j1, "JoinSamplingSessionResponse")
                and j1["client_counter"] == 1 and j2["client_counter"] == 2, f"join_sampling_session: {j1} {j2}")
        c1 = Sampler(s, s.key, ssid, counter=1)
        c2 = Sampler(s, s.key, ssid, counter=2)
        mine = [c1.asample(), c1.asample()]
        theirs = c2.asample()
        R.check(mine[0] != theirs and c1.asample(seq=BLOCK) == mine[0] and c2.asample(seq=2 * BLOCK) == theirs,
                "each client's seq_ids are its own; resubmitting (sampling_session_id, seq_id) is the same future")
        got1, typed1 = c1.collect(mine)
        got2, typed2 = c2.collect([theirs])
        st, z = c0.poll(timeout=0)
        R.check(set(got1) == set(mine) and set(got2) == {theirs} and typed1 and typed2 and
                st == 200 and z["completions"] == [], "each client's poll reports its own samples only")

        # ---- 4. cancel_future ---------------------------------------------------------------------
        loom_cli(s, "executor", "drain", "up-0")
        q1, q2 = c0.asample(), c0.asample()
        st, _ = s.post("/api/v1/cancel_future", {"request_id": q1})
        row = s.psql(f"SELECT state, error_category FROM operations WHERE request_id = '{q1}'")
        R.check(st == 204 and row == "canceled|user", f"a queued sample is canceled: 204, {row}")
        res = s.post("/api/v1/retrieve_future", {"request_id": q1})[1]
        R.check(res.get("category") == "user" and "cancel" in res.get("error", ""), f"retrieve_future says so: {res}")
        got, _ = c0.collect([q1], deadline_s=30)
        R.check(got.get(q1, {}).get("state") == "failed" and not T.check(got.get(q1), T.FUTURE_FAILED),
                "the poll reports it as FutureFailed")
        s.psql(f"UPDATE operations SET state = 'claimed' WHERE request_id = '{q2}'")   # as if it were running
        st, _ = s.post("/api/v1/cancel_future", {"request_id": q2})
        R.check(st == 204 and s.psql(f"SELECT state FROM operations WHERE request_id = '{q2}'") == "claimed",
                "a running sample: 204, and it is left to finish")
        s.psql(f"UPDATE operations SET state = 'queued' WHERE request_id = '{q2}'")
        loom_cli(s, "executor", "undrain", "up-0")
        got, _ = c0.collect([q2])
        R.check(got.get(q2, {}).get("state") == "finished", "it finishes, and its result comes")
        R.check(s.psql(f"SELECT state, claimed_at IS NULL, cycle_id IS NULL FROM operations WHERE request_id = '{q1}'")
                == "canceled|t|t", "the canceled one never ran (never claimed, in no cycle)")
        R.check(s.post("/api/v1/cancel_future", {"request_id": rids[0]})[0] == 204 and
                s.psql(f"SELECT state FROM operations WHERE request_id = '{rids[0]}'") == "done",
                "a finished sample: 204, unchanged")
        R.check(is_detail(s.post("/api/v1/cancel_future", {"request_id": "req-" + "0" * 32}), 404, "unknown"),
                "an unknown request_id: 404")
        cm = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": base,
                                             "lora_config": {"rank": 4}})[1]["request_id"]
        R.check(is_detail(s.post("/api/v1/cancel_future", {"request_id": cm}), 404, "sample"),
                "a training future is not a sample's: 404")

        # ---- 5. another tenant; bad input -----------------------------------------------------------
        b = Sampler(s, key_b, ssid)
        R.check(is_detail(b.poll(timeout=0), 404, "not found"), "tenant B polling A's sampling session: 404")
        R.check(is_detail(s.post("/api/v1/join_sampling_session", {"sampling_session_id": ssid}, key=key_b), 404,
                          "not found"), "tenant B joining A's sampling session: 404")
        q3 = c0.asample()
        R.check(is_detail(s.post("/api/v1/cancel_future", {"request_id": q3}, key=key_b), 404, "unknown"),
                "tenant B canceling A's sample: 404")
        R.check(c0.collect([q3])[0].get(q3, {}).get("state") == "finished", "and A's sample runs")
        for body, word in (({"prev_cursor": 0}, "target"),
                           ({"target": {"type": "model", "sampling_session_id": ssid}}, "target.type"),
                           ({"target": {"sampling_session_id": ssid, "cloned_sampler_id": -1}}, "cloned_sampler_id"),
                           ({"target": {"sampling_session_id": ssid}, "prev_cursor": -3}, "prev_cursor"),
                           ({"target": {"sampling_session_id": ssid}, "timeout": -1}, "timeout"),
                           ({"target": {"sampling_session_id": 5}}, "sampling_session_id")):
            R.check(is_detail(s.post("/api/v1/retrieve_futures", body), 400, word), f"retrieve_futures: 400 naming {word}")
        R.check(is_detail(s.post("/api/v1/join_sampling_session", {}), 400, "sampling_session_id"),
                "join_sampling_session without an id: 400")
        s.psql(f"UPDATE sessions SET expired_at = now() WHERE id = '{sid}'")
        R.check(is_detail(s.post("/api/v1/join_sampling_session", {"sampling_session_id": ssid}), 400, "expired"),
                "joining a sampler of an expired session: 400")
    R.finish()


if __name__ == "__main__":
    main()
