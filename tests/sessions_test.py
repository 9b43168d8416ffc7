"""unload_model and session expiry give the executor's memory back; expired sessions.

20 clients each train a rank-64 model one step (the executor's resident memory grows by
their adapters). 10 unload: their slots are freed and the RSS falls by about what they
held. 9 others go silent (no heartbeat, no request) past `--session-timeout-s`: their
queued work is canceled with an error naming the session and the checkpoint, their state
is saved as tinker://<model>/weights/session-expired, their models expire (a later submit
is a 400 that says so, a heartbeat a 404) and the RSS falls back to about where it
started. The one session that keeps heartbeating stays, and so does one that only samples
(no heartbeat: its samples are its signs of life). An expired model's checkpoint loads
into a new model that then computes exactly what the live one computes.
"""
import os, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import wait_for, Stack, Results
from resilient import Client, datum, ADAM

R = Results()
TIMEOUT_S = 8   # above the 5 s in which the api counts a session's submits once
N = 20


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def post_status(c, path, body):
    try:
        c.post(path, body)
        return 200, ""
    except RuntimeError as e:   # 4xx: "path: status body"
        text = str(e)
        return int(text.split(": ", 1)[1].split(" ", 1)[0]), text


def main():
    with Stack(["--session-timeout-s", str(TIMEOUT_S)]) as s:
        c = Client(s.url, s.key)
        pid = int(s.psql("SELECT pid FROM executors WHERE state <> 'gone' ORDER BY id DESC LIMIT 1"))
        slots = lambda: int(s.psql(f"SELECT training_slots FROM executors WHERE pid = {pid} AND state <> 'gone'") or -1)
        used = lambda: int(s.psql(f"SELECT memory_used FROM executors WHERE pid = {pid} AND state <> 'gone'") or 0)
        rss0 = rss_mb(pid)

        # heartbeats keep every session alive while the test sets up; then only the last
        alive, stop = set(), threading.Event()

        def beat():
            while not stop.is_set():
                for sid in list(alive):
                    c.post("/api/v1/session_heartbeat", {"session_id": sid})
                stop.wait(1)
        hb = threading.Thread(target=beat)
        hb.start()
        clients = []
        for i in range(N):
            sid = c.post("/api/v1/create_session", {"tags": [f"c{i}"]})["session_id"]
            alive.add(sid)
            mid = c.call("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": "loom/tiny-llama",
                                                  "lora_config": {"rank": 64, "seed": 7}})["model_id"]
            fb = c.call("/api/v1/forward_backward", {"model_id": mid, "seq_id": 1, "forward_backward_input": {
                "data": [datum("s", 1, j) for j in range(4)], "loss_fn": "cross_entropy"}})
            st = c.call("/api/v1/optim_step", {"model_id": mid, "seq_id": 2, "adam_params": ADAM})
            assert "error" not in fb and "error" not in st, (fb, st)
            clients.append((sid, mid))
        R.check(wait_for(lambda: slots() == N, 10), f"{N} training slots on the executor ({slots()})")
        per = used() / N
        rss1 = rss_mb(pid)
        print(f"     executor RSS {rss0:.1f} MB -> {rss1:.1f} MB with {N} rank-64 adapters of {per / 1e6:.2f} MB")
        R.check(rss1 - rss0 > 0.8 * N * per / 2**20, "the adapters are resident")

        live_sid, live_mid = clients[-1]
        for sid, mid in clients[:10]:
            r = c.post("/api/v1/unload_model", {"model_id": mid})
            c.result(r["request_id"])
        R.check(wait_for(lambda: slots() == N - 10, 10), f"unload_model frees the 10 slots ({slots()} left)")
        time.sleep(0.5)
        rss2 = rss_mb(pid)
        print(f"     after 10 unloads: RSS {rss2:.1f} MB (-{rss1 - rss2:.1f} MB)")
        R.check(rss1 - rss2 > 0.9 * 10 * per / 2**20, f"and the RSS falls by about what they held ({rss1 - rss2:.1f} MB)")

        # from now on only the last session sends heartbeats (the api counts requests as
        # signs of life too); one silent client left work queued behind a seq_id it never sent
        gap_sampler = c.post("/api/v1/create_sampling_session", {"session_id": clients[10][0],
                                                                 "sampling_session_seq_id": 0,
                                                                 "base_model": "loom/tiny-llama"})["sampling_session_id"]
        alive.intersection_update({live_sid})
        t_silent = time.time()
        # a client that only samples, from a sampler of the base model in its own session
        samp_sid = c.post("/api/v1/create_session", {"tags": ["sampler"]})["session_id"]
        sampler = c.post("/api/v1/create_sampling_session", {"session_id": samp_sid, "sampling_session_seq_id": 0,
                                                             "base_model": "loom/tiny-llama"})["sampling_session_id"]
        samples = []

        def sample_loop():
            k = 0
            while not stop.is_set():
                try:
                    samples.append(c.call("/api/v1/asample", {
                        "sampling_session_id": sampler, "seq_id": k, "num_samples": 1,
                        "prompt": {"chunks": [{"tokens": [1, 2, 3]}]}, "sampling_params": {"max_tokens": 2}}))
                except RuntimeError as e:   # a 4xx
                    samples.append({"error": str(e)})
                k += 1
                stop.wait(0.5)
        sampling = threading.Thread(target=sample_loop)
        sampling.start()
        gap_sid, gap_mid = clients[10]
        gap = c.post("/api/v1/optim_step", {"model_id": gap_mid, "seq_id": 4, "adam_params": ADAM})
        t0 = time.time()
        silent = [mid for _, mid in clients[10:N - 1]]
        expired = lambda: int(s.psql("SELECT count(*) FROM models WHERE status = 'expired'"))
        R.check(wait_for(lambda: expired() == len(silent), 30),
                f"the {len(silent)} silent sessions' models expired after {time.time() - t0:.1f} s ({expired()})")
        res = c.result(gap["request_id"])
        R.check("expired" in res.get("error", "") and "session-expired" in res.get("error", "")
                and res.get("category") == "user", f"queued work is canceled, naming the checkpoint: {res}")
        ck = int(s.psql("SELECT count(*) FROM adapter_versions WHERE name = 'session-expired' AND kind = 'training'"
                        " AND deleted_at IS NULL AND expires_at > now() + interval '6 days'"))
        R.check(ck == len(silent), f"each expired model's state is saved as weights/session-expired, kept 7 days ({ck})")
        st, text = post_status(c, "/api/v1/forward_backward", {"model_id": gap_mid, "seq_id": 5,
                               "forward_backward_input": {"data": [datum("s", 2, 0)], "loss_fn": "cross_entropy"}})
        R.check(st == 400 and "expired" in text and "session-expired" in text, f"a submit to it is a 400: {text[:160]}")
        st, text = post_status(c, "/api/v1/session_heartbeat", {"session_id": gap_sid})
        R.check(st == 404 and "expired" in text, f"its session's heartbeat is a 404: {text[:120]}")
        st, text = post_status(c, "/api/v1/asample", {"sampling_session_id": gap_sampler, "num_samples": 1,
                                                      "prompt": {"chunks": [{"tokens": [1, 2]}]},
                                                      "sampling_params": {"max_tokens": 1}})
        R.check(st == 400 and "expired" in text, f"a sample from a sampler of it is a 400: {text[:120]}")
        R.check(wait_for(lambda: slots() == 1, 10), f"the executor freed their slots ({slots()} left)")
        time.sleep(0.5)
        rss3 = rss_mb(pid)
        print(f"     after the expiry: RSS {rss3:.1f} MB (started at {rss0:.1f}, peak {rss1:.1f})")
        R.check(rss1 - rss3 > 0.9 * (N - 1) * per / 2**20,
                f"the RSS falls back by about the {N - 1} adapters ({rss1 - rss3:.1f} MB of {rss1 - rss0:.1f})")
        R.check(s.psql(f"SELECT status FROM models WHERE id = '{live_mid}'") == "active",
                "the heartbeating session's model is still active")
        time.sleep(max(0.0, t_silent + 2 * TIMEOUT_S + 2 - time.time()))
        silent_for = time.time() - t_silent
        expired_at = s.psql(f"SELECT coalesce(expired_at::text, 'never') FROM sessions WHERE id = '{samp_sid}'")
        failed = [r for r in samples if "sequences" not in r]
        R.check(expired_at == "never" and samples and not failed,
                f"a session that only samples, without heartbeats, stays alive past the timeout "
                f"({silent_for:.0f} s, {len(samples)} samples; expired: {expired_at}; failed: {failed[:1]})")

        # an expired model's state continues in a new model, bit for bit
        new = c.call("/api/v1/create_model", {"session_id": live_sid, "model_seq_id": 1, "base_model": "loom/tiny-llama",
                                              "lora_config": {"rank": 64, "seed": 99}})["model_id"]
        ld = c.call("/api/v1/load_weights", {"model_id": new, "seq_id": 1, "optimizer": True,
                                             "path": f"tinker://{silent[0]}/weights/session-expired"})
        R.check("error" not in ld, f"load_weights of the expired model's checkpoint: {ld}")
        body = {"forward_backward_input": {"data": [datum("s", 9, j) for j in range(4)], "loss_fn": "cross_entropy"}}
        a = c.call("/api/v1/forward_backward", dict(body, model_id=new, seq_id=2))
        b = c.call("/api/v1/forward_backward", dict(body, model_id=live_mid, seq_id=3))
        R.check(a.get("metrics") == b.get("metrics") and "metrics" in a,
                f"the restored model computes what the live twin computes ({a.get('metrics')} == {b.get('metrics')})")
        stop.set()
        hb.join()
        sampling.join()
    R.finish()


if __name__ == "__main__":
    main()
