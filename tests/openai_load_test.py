"""Load on the OpenAI routes (docs/protocol.md §18): 64 concurrent streaming chat
completions across 8 adapters (sampler checkpoints of 8 trained models) on `loom up`'s
CPU executor, while a training run keeps submitting forward_backward + optim_step:
  * every stream completes: chunks as the openai client reads them, a finish_reason per
    choice, data: [DONE], usage;
  * the samples are decoded together: cycles carry many of them at once, across adapters;
  * training progresses meanwhile: optimizer steps finish while the streams run.
Prints the time to first token and the throughput it saw, then "N passed, N failed".
"""
import os, statistics, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import Stack, Results
import trainer
from openai_wire import Client, run_streams

R = Results()
N_ADAPTERS, N_STREAMS = 8, 64


def main():
    with Stack() as s:
        t = trainer.Trainer(s, s.key)
        paths = []
        for a in range(N_ADAPTERS):
            mid = t.create(rank=4)
            t.step(mid, a)
            paths.append(t.op(mid, "/api/v1/save_weights_for_sampler", {"path": f"a{a}"})["path"])
        R.check(len(set(paths)) == N_ADAPTERS, f"{N_ADAPTERS} adapters saved for sampling")
        learner = t.create(rank=4)
        steps, stop = [], threading.Event()

        def train():
            k = 0
            while not stop.is_set():
                fb, opt = t.step(learner, k)
                if "error" not in opt:
                    steps.append(time.time())
                k += 1

        trainer_thread = threading.Thread(target=train)
        client = Client(s.url, s.key)
        bodies = [{"model": paths[i % N_ADAPTERS], "messages": [{"role": "user", "content": f"stream {i}"}],
                   "max_tokens": 48, "seed": i} for i in range(N_STREAMS)]
        first_op = s.psql("SELECT coalesce(max(id), 0) FROM operations")
        trainer_thread.start()
        time.sleep(0.3)
        t0 = time.time()
        res = run_streams(client, "/v1/chat/completions", bodies)
        t1 = time.time()
        time.sleep(0.5)
        stop.set()
        trainer_thread.join(120)
        errors = [r["error"] for r in res if r is None or r["error"]]
        R.check(not errors, f"all {N_STREAMS} streams completed ({errors[:2]})")
        R.check(all(r and len(r["finish"]) == 1 and r["tokens"] > 0 for r in res),
                "each stream: one finish_reason and a usage with its tokens")
        during = [x for x in steps if t0 <= x <= t1 + 0.5]
        R.check(len(during) >= 1, f"training progressed while the streams ran: {len(during)} optimizer steps")
        batched = s.psql(f"SELECT coalesce(max(n), 0) FROM (SELECT count(*) n FROM operations WHERE id > {first_op} "
                         "AND kind = 'sample' GROUP BY cycle_id) q")
        adapters = s.psql(f"SELECT coalesce(max(n), 0) FROM (SELECT count(DISTINCT p.sampling_session_id) n FROM "
                          f"operations p WHERE p.id > {first_op} AND p.kind = 'sample' GROUP BY p.cycle_id) q")
        R.check(int(batched) >= 8 and int(adapters) >= 2,
                f"samples decoded together: up to {batched} requests and {adapters} adapters in one cycle")
        mixed = s.psql(f"SELECT count(*) FROM (SELECT cycle_id FROM operations WHERE id > {first_op} GROUP BY cycle_id "
                       "HAVING bool_or(kind = 'sample') AND bool_or(kind <> 'sample')) q")
        print(f"     cycles with training and sampling together: {mixed}")
        ttft = sorted(r["ttft"] for r in res if r and r["ttft"] is not None)
        tokens = sum(r["tokens"] for r in res if r)
        if ttft:
            print(f"     {N_STREAMS} streams: time to first token median {statistics.median(ttft):.3f} s, max "
                  f"{ttft[-1]:.3f} s; {tokens} tokens in {t1 - t0:.2f} s ({tokens / (t1 - t0):.0f} tokens/s); "
                  f"{len(during)} optimizer steps meanwhile")
    R.finish()


if __name__ == "__main__":
    main()
