#!/usr/bin/env python3
"""Time to first token and tokens/s of Loom's OpenAI routes (docs/protocol.md §18) for 1, 16
and 64 concurrent streaming completions, on `loom up` with the executor of this machine
(LOOM_TEST_BACKEND, default cpu), over real HTTP.

    python3 bench/openai_bench.py [--loom build/loom] [--model-dir DIR | --layers N --hidden H]
                                  [--max-tokens 128] [--streams 1,16,64]

Without --model-dir it benches loom up's default tiny model, or with --layers/--hidden a
random Llama of that size written by `loom mkmodel`. Per level: the median and worst time
to the first token (first chunk with text), the median tokens/s of one stream (its tokens
after the first / the time from its first to its last chunk), and the aggregate tokens/s
(all tokens / wall time of the level). Every request streams from its own adapter-less
base model with its own seed; prompts are short, so the figures are about decoding."""
import argparse, os, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loom", default=os.environ.get("LOOM_BIN", "build/loom"))
    ap.add_argument("--model-dir")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--streams", default="1,16,64")
    a = ap.parse_args()
    os.environ["LOOM_BIN"] = a.loom
    from stack import Stack
    from openai_wire import Client, run_streams
    with tempfile.TemporaryDirectory(prefix="oai-bench-", dir="/tmp") as tmp:
        args, name = [], "loom/tiny-llama"
        model_dir = a.model_dir
        if not model_dir and a.layers:
            model_dir = os.path.join(tmp, "model")
            subprocess.run([a.loom, "mkmodel", "--arch", "llama", "--out", model_dir, "--layers", str(a.layers),
                            "--hidden", str(a.hidden), "--inter", str(a.hidden * 3), "--heads", str(a.hidden // 64),
                            "--kv-heads", str(max(1, a.hidden // 256)), "--head-dim", "64", "--max-pos", "4096"],
                           check=True, capture_output=True)
        if model_dir:
            name = "bench"
            args = ["--model-dir", model_dir, "--model-name", name]
        with Stack(args + ["--max-streams", "1000"]) as s:
            client = Client(s.url, s.key)
            client.stream("/v1/completions", {"model": name, "prompt": "warm up", "max_tokens": 8})
            print(f"model {model_dir or name}; max_tokens {a.max_tokens}; backend "
                  f"{os.environ.get('LOOM_TEST_BACKEND') or 'cpu'}")
            print(f"{'streams':>7} {'TTFT median':>12} {'TTFT max':>9} {'tok/s per stream':>17} "
                  f"{'tok/s aggregate':>16} {'tokens':>7}")
            for n in [int(x) for x in a.streams.split(",")]:
                bodies = [{"model": name, "prompt": f"bench {i}", "max_tokens": a.max_tokens, "seed": 1000 + i}
                          for i in range(n)]
                t0 = time.time()
                res = run_streams(client, "/v1/completions", bodies)
                wall = time.time() - t0
                bad = [r["error"] for r in res if r is None or r["error"]]
                if bad:
                    print(f"{n:>7} failed: {bad[:2]}")
                    continue
                ttft = sorted(r["ttft"] for r in res if r["ttft"] is not None)
                per = sorted((r["tokens"] - 1) / (r["t_done"] - r["ttft"]) for r in res
                             if r["ttft"] is not None and r["tokens"] > 1 and r["t_done"] > r["ttft"])
                tokens = sum(r["tokens"] for r in res)
                print(f"{n:>7} {statistics.median(ttft):>11.3f}s {ttft[-1]:>8.3f}s "
                      f"{statistics.median(per) if per else 0:>17.1f} {tokens / wall:>16.1f} {tokens:>7}")


if __name__ == "__main__":
    main()
