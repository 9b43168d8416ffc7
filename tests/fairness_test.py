"""Fairness (docs/architecture.md, rule 3): one tenant floods the queue, another steps one
at a time, and the stepping tenant's steps are not stuck behind the flood.

Tenant F submits 200 forward_backwards of 64 datums (2048 tokens: about four fit in a
cycle of the 8192-token budget, so the flood stays deep) as fast as it can; tenant S
meanwhile runs 12 steps (forward_backward + optim_step, waiting for each). Stated bound:
a step of S takes at most two cycles (the one running when it arrives and its own, in
which the round-robin gives S its share before F takes the rest) plus 250 ms, i.e. S never waits for F's queue to drain. The test
prints S's step latencies beside the longest cycle of the flood, and checks that F's
queue was still deep when S finished.
"""
import os, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import Stack, Results
from apitest import loom_cli
from resilient import Client, datum, ADAM

R = Results()
BASE = "loom/tiny-llama"


def model(c, sid):
    return c.call("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": BASE,
                                           "lora_config": {"rank": 8, "seed": 1}})["model_id"]


def main():
    # a small token budget keeps the cycles of this tiny model at a measurable length
    with Stack(["--token-budget", "8192"]) as s:
        secret = os.path.join(s.dir, "secret.key")
        loom_cli(s, "tenant", "create", "flooder")
        kf = loom_cli(s, "key", "create", "--tenant", "flooder", "--secret-file", secret)
        cf, cs = Client(s.url, kf), Client(s.url, s.key)
        mf = model(cf, cf.post("/api/v1/create_session", {})["session_id"])
        ms = model(cs, cs.post("/api/v1/create_session", {})["session_id"])
        flood_rids = []

        def flood():
            for k in range(1, 201):
                flood_rids.append(cf.post("/api/v1/forward_backward", {"model_id": mf, "seq_id": k,
                                          "forward_backward_input": {"data": [datum("f", k, i, 32) for i in range(64)],
                                                                     "loss_fn": "cross_entropy"}})["request_id"])
        t = threading.Thread(target=flood)
        t.start()
        while len(flood_rids) < 100:   # the flood is deep before S starts
            time.sleep(0.05)
        t_start = s.psql("SELECT now()")
        lat = []
        for k in range(1, 13):
            t0 = time.time()
            fb = cs.post("/api/v1/forward_backward", {"model_id": ms, "seq_id": 2 * k - 1, "forward_backward_input": {
                "data": [datum("s", k, 0)], "loss_fn": "cross_entropy"}})["request_id"]
            op = cs.post("/api/v1/optim_step", {"model_id": ms, "seq_id": 2 * k, "adam_params": ADAM})["request_id"]
            r1, r2 = cs.result(fb), cs.result(op)
            lat.append(time.time() - t0)
            assert "metrics" in r1 and "metrics" in r2, (r1, r2)
        left = int(s.psql(f"SELECT count(*) FROM operations WHERE model_id = '{mf}' AND state IN ('queued', 'claimed')"))
        longest = float(s.psql("SELECT max(extract(epoch FROM finished_at - started_at)) FROM cycles"
                               f" WHERE started_at >= '{t_start}'"))
        t.join()
        bound = 2 * longest + 0.25
        print(f"     S's step latencies (s): {' '.join(f'{x:.3f}' for x in lat)}; longest cycle {longest:.3f} s")
        R.check(left > 30, f"F's flood was still deep when S finished its 12 steps ({left} operations left)")
        R.check(max(lat) <= bound, f"every step of S took at most 2 cycles + 250 ms: max {max(lat):.3f} s,"
                                   f" bound {bound:.3f} s")
        R.check(all("metrics" in cf.result(r) for r in flood_rids), "and all of F's 200 operations completed")
    R.finish()


if __name__ == "__main__":
    main()
