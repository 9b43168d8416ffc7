"""The simulated GPU (`--backend sim`, backend/sim/) through the whole stack, so that the
fleet benchmark (bench/fleet_bench.py) keeps running on what CI checks.

`loom up --backend sim` on a fresh data directory, then over HTTP:
  - the executor's row describes the modelled GPU (H100, 80 GiB) and counts adapters in
    the modelled Qwen3-8B's bytes (adapter_bytes_per_rank);
  - an SFT loop (forward_backward + optim_step) on text that counts upwards, which the
    sim's model can learn: the mean NLL falls by more than half;
  - a forward_backward of 2 x 512 tokens takes at least its modelled time (2 ms + 60.5 us
    per token) in its cycle's compute_s, and a lone one of 8 tokens far less;
  - save_weights -> a new model -> load_weights(optimizer) gives the same logprobs bit for
    bit, and one more step on each the same loss;
  - a sampler from save_weights_for_sampler: the same seed gives the same samples, another
    seed others, logprobs at temperature 1 equal forward's, and greedy decoding continues
    the counting the model learned;
  - an unknown LOOM_SIM_PROFILE stops the executor with a message naming the profiles.
"""
import os, subprocess, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
os.environ["LOOM_TEST_BACKEND"] = "sim"
os.environ.pop("LOOM_SIM_SCALE", None)
os.environ.pop("LOOM_SIM_PROFILE", None)
from stack import Stack, Results, LOOM_BIN  # noqa: E402

BASE = "loom/tiny-llama"
ADAM = {"learning_rate": 2e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}


def counting(start, n):
    """n + 1 tokens that count upwards from start over the tiny model's 256 tokens."""
    return [(start + j) % 256 for j in range(n + 1)]


def datum(seq):
    x, t = seq[:-1], seq[1:]
    return {"model_input": {"chunks": [{"tokens": x, "type": "encoded_text"}]},
            "loss_fn_inputs": {"target_tokens": {"data": t, "dtype": "int64", "shape": [len(t)]},
                               "weights": {"data": [1.0] * len(t), "dtype": "float32", "shape": [len(t)]}}}


class Client:
    def __init__(self, s):
        self.s, self.seq = s, {}
        st, sess = s.post("/api/v1/create_session", {"tags": [], "sdk_version": "0.24.1"})
        assert st == 200, sess
        self.sid = sess["session_id"]
        self.nmodels = 0

    def call(self, path, body):
        st, fut = self.s.post(path, body)
        if st != 200 or "request_id" not in fut:
            raise RuntimeError(f"{path}: {st} {fut}")
        return fut["request_id"], self.s.result(fut["request_id"], timeout=120)

    def create(self, rank=8):
        _, res = self.call("/api/v1/create_model", {"session_id": self.sid, "model_seq_id": self.nmodels,
                                                    "base_model": BASE, "lora_config": {"rank": rank, "seed": 3}})
        self.nmodels += 1
        self.seq[res["model_id"]] = 1
        return res["model_id"]

    def op(self, mid, path, body):
        """The model's next operation: (request_id, result)."""
        seq = self.seq[mid]
        self.seq[mid] += 1
        return self.call(path, dict(body, model_id=mid, seq_id=seq))

    def fb(self, mid, seqs, path="/api/v1/forward_backward"):
        key = "forward_input" if path.endswith("/forward") else "forward_backward_input"
        rid, res = self.op(mid, path, {key: {"data": [datum(q) for q in seqs], "loss_fn": "cross_entropy"}})
        assert "error" not in res, res
        lps = [o["logprobs"]["data"] for o in res["loss_fn_outputs"]]
        return rid, lps

    def step(self, mid, seqs):
        _, lps = self.fb(mid, seqs)
        _, res = self.op(mid, "/api/v1/optim_step", {"adam_params": ADAM})
        assert "error" not in res, res
        return -sum(map(sum, lps)) / sum(map(len, lps))

    def sample(self, ssid, prompt, n, max_tokens, seed=None, temperature=1.0):
        params = {"max_tokens": max_tokens, "temperature": temperature}
        if seed is not None:
            params["seed"] = seed
        k = self.seq.setdefault(ssid, 0)
        self.seq[ssid] += 1
        _, res = self.call("/api/v1/asample", {
            "sampling_session_id": ssid, "seq_id": k, "num_samples": n,
            "prompt": {"chunks": [{"tokens": prompt, "type": "encoded_text"}]}, "sampling_params": params})
        assert "error" not in res, res
        return res["sequences"]


def modelled_bytes_per_rank():
    """sim_profile.c's h100-qwen3-8b: a trainable rank-1 adapter on every module and the
    head of Qwen3-8B, fp32, params + grads + Adam m and v."""
    H, q, kv, inter, layers, vocab = 4096, 4096, 1024, 12288, 36, 151936
    per_layer = (H + q) + 2 * (H + kv) + (q + H) + 3 * (H + inter)
    return int(4 * 4.0 * (layers * per_layer + H + vocab))


def compute_s(s, rid):
    return float(s.psql(f"SELECT c.compute_s FROM operations o JOIN cycles c ON c.id = o.cycle_id"
                        f" WHERE o.request_id = '{rid}'"))


def main():
    R = Results()
    with Stack() as s:
        row = s.psql("SELECT backend, device, memory_total, adapter_bytes_per_rank FROM executors"
                     " WHERE state <> 'gone'").split("|")
        R.check(row[0] == "sim" and row[1].startswith("sim:0 H100") and int(row[2]) == 80 << 30,
                f"the executor's row describes the modelled GPU: {row[:3]}")
        R.check(int(row[3]) == modelled_bytes_per_rank(),
                f"adapters are counted in the modelled model's bytes: {row[3]} per rank"
                f" (Qwen3-8B: {modelled_bytes_per_rank()})")

        c = Client(s)
        mid = c.create()
        data = [counting(3, 24), counting(100, 24)]
        nll = [c.step(mid, data) for _ in range(12)]
        R.check(nll[-1] < nll[0] / 2, f"SFT on counting text: mean NLL {nll[0]:.3f} -> {nll[-1]:.3f} in 12 steps")

        # time: the modelled GPU's, not the machine's
        rid_big, _ = c.fb(mid, [counting(7, 512), counting(9, 512)], "/api/v1/forward")
        rid_small, _ = c.fb(mid, [counting(7, 8)], "/api/v1/forward")
        big, small = compute_s(s, rid_big), compute_s(s, rid_small)
        want = 2e-3 + 1024 * 30.3e-6
        R.check(big >= want and small < big / 4,
                f"a forward of 1024 tokens computes for at least its modelled {1000 * want:.1f} ms"
                f" ({1000 * big:.1f} ms), one of 8 tokens far less ({1000 * small:.1f} ms)")
        rid_fb, _ = c.fb(mid, [counting(7, 512), counting(9, 512)])
        c.op(mid, "/api/v1/optim_step", {"adam_params": ADAM})
        fb = compute_s(s, rid_fb)
        R.check(fb >= 2e-3 + 1024 * 60.5e-6 and fb > 1.5 * big,
                f"forward_backward of 1024 tokens: {1000 * fb:.1f} ms, about twice the forward")

        # checkpoints round-trip every number
        probe = [counting(40, 16), counting(200, 16)]
        _, saved = c.op(mid, "/api/v1/save_weights", {"path": "mid"})
        m2 = c.create()
        _, ld = c.op(m2, "/api/v1/load_weights", {"path": saved.get("path"), "optimizer": True})
        R.check(ld.get("type") == "load_weights", f"load_weights {saved.get('path')}: {ld}")
        lp1 = c.fb(mid, probe, "/api/v1/forward")[1]
        lp2 = c.fb(m2, probe, "/api/v1/forward")[1]
        R.check(lp1 == lp2 and lp1 != c.fb(c.create(), probe, "/api/v1/forward")[1],
                "the loaded model's logprobs are the saved model's, bit for bit (and not a fresh model's)")
        R.check(c.step(mid, data) == c.step(m2, data), "one more step on each: the same loss, bit for bit")

        # sampling from the trained weights
        _, smp = c.op(mid, "/api/v1/save_weights_for_sampler", {"path": "final"})
        st, ss = s.post("/api/v1/create_sampling_session", {"session_id": c.sid, "sampling_session_seq_id": 0,
                                                            "model_path": smp.get("path")})
        R.check(st == 200, f"sampling session from {smp.get('path')}: {ss}")
        ssid = ss["sampling_session_id"]
        a = c.sample(ssid, [50, 51, 52], 3, 10, seed=5)
        b = c.sample(ssid, [50, 51, 52], 3, 10, seed=5)
        o = c.sample(ssid, [50, 51, 52], 3, 10, seed=6)
        R.check(all(len(q["tokens"]) == 10 and len(q["logprobs"]) == 10 for q in a),
                "3 samples of 10 tokens, each with its logprobs")
        R.check([q["tokens"] for q in a] == [q["tokens"] for q in b] and
                [q["tokens"] for q in a] != [q["tokens"] for q in o], "the same seed samples the same, another not")
        gap = 0.0
        for q in a:
            flp = c.fb(mid, [[50, 51, 52] + q["tokens"]], "/api/v1/forward")[1][0][2:]
            gap = max([gap] + [abs(x - y) for x, y in zip(q["logprobs"], flp)])
        R.check(gap < 1e-4, f"sampled logprobs (temperature 1) = forward's, max gap {gap:.1e}")
        g = c.sample(ssid, [50, 51, 52], 1, 8, temperature=0.0)[0]["tokens"]
        R.check(g == list(range(53, 61)), f"greedy decoding continues the count it learned: {g}")

        # an unknown profile is named
        env = dict(os.environ, LOOM_SIM_PROFILE="nope")
        p = subprocess.run([LOOM_BIN, "executor", "--backend", "sim", "--db", s.db, "--data-dir", s.dir,
                            "--model-dir", os.path.join(s.dir, "models", "tiny-llama"), "--model-name", BASE,
                            "--name", "bad"], env=env, capture_output=True, text=True, timeout=60)
        R.check(p.returncode != 0 and "LOOM_SIM_PROFILE=nope is not a profile (h100-qwen3-8b)" in p.stderr,
                f"LOOM_SIM_PROFILE=nope: exit {p.returncode}, {p.stderr.strip()[-200:]}")
    R.finish()


if __name__ == "__main__":
    main()
