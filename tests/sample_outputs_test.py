"""The sampling outputs of SDK 0.27 - 0.39 end to end (docs/protocol.md §11), against the
float64 PyTorch reference (tests/ref/torch_ref.py, which shares no code with Loom): `loom up`
on the tiny Llama, asample over real HTTP, each result read as JSON and as protobuf (the
SDK's wire since 0.25), the base model's logits recomputed in float64.

  * sample_sequence_ids: one per sample, "<request_id>:<i>", unique, and the same for a
    resubmission of (sampling_session_id, seq_id); every result sequence carries its id;
  * topk_sample_logprobs: at every sampled position the k most likely tokens of the
    distribution the token was drawn from (temperature, top_k, top_p; greedy: the model's),
    their logprobs as the reference's; the sampled token's logprob where it is listed;
  * target_prompt_logprobs, dense and sparse CSR: the reference's log p(id) at each asked
    cell, 0.0 for -1, in the request's layout; the actual next token's equals prompt_logprobs;
  * prompt_logprobs_last_n: null before the last n positions, the reference's after (the
    top-k rows alike);
  * prompt_alt_tokens_k: [len(prompt) - 1, k] draws whose logprobs are the reference's, the
    very tokens that the documented stream (seed, row) gives on the reference's
    distribution at the request's temperature, reproducible by seed, the argmax at T = 0;
  * at 0 / null the result keeps the shape older SDKs parse.
Bars: 1e-4 on the CPU backend (fp32 against float64); 3e-2 on a bf16 backend
(LOOM_TEST_BACKEND). Prints "N passed, N failed" last.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import torch  # noqa: E402

import torch_ref  # noqa: E402
from stack import Results, Stack  # noqa: E402
from wire import sample_result  # noqa: E402

R = Results()
BF16 = (os.environ.get("LOOM_TEST_BACKEND") or "cpu") != "cpu"
TOL = 3e-2 if BF16 else 1e-4
PROMPT = [1, 17, 33, 90, 4, 120, 7, 201, 45, 3, 66, 150]
M64 = (1 << 64) - 1
PHI = 0x9e3779b97f4a7c15


# ---- the reference ---------------------------------------------------------------------

class Ref:
    def __init__(self, model_dir):
        self.m = torch_ref.RefModel(model_dir)   # float64

    def logits(self, tokens):
        with torch.no_grad():
            return self.m.forward(torch.tensor(tokens, dtype=torch.long))

    def lsm(self, tokens):
        return torch.log_softmax(self.logits(tokens), dim=-1)


def sampled_dist(z, temperature, top_k, top_p):
    """log p of the distribution a token is drawn from (§11.2): z / T, then top-k (ties at the
    k-th kept), then the top-p nucleus (the fewest most likely tokens whose mass reaches
    top_p), renormalised; -inf outside. Greedy: the model's own log-softmax."""
    if temperature == 0:
        return torch.log_softmax(z, -1)
    w = torch.exp((z - z.max()) / temperature)
    if 0 < top_k < len(w):
        w = torch.where(w < torch.topk(w, top_k).values[-1], torch.zeros_like(w), w)
    if top_p < 1:
        order = sorted(range(len(w)), key=lambda v: (-float(w[v]), -v))
        target, cum, keep = top_p * float(w.sum()), 0.0, set()
        for v in order:
            if w[v] == 0 or (keep and cum >= target):
                break
            keep.add(v)
            cum += float(w[v])
        w = torch.tensor([float(w[v]) if v in keep else 0.0 for v in range(len(w))], dtype=w.dtype)
    return torch.log(w / w.sum())


def topk_matches(row, dist, k):
    """A returned top-k row against the reference distribution: as many entries as it has
    allowed tokens (at most k), each listed logprob the reference's of that id, and the
    values the k best of the reference (so that near-ties may come in either order)."""
    allowed = int(torch.isfinite(dist).sum())
    best = torch.topk(dist, min(k, allowed)).values.tolist()
    if len(row) != len(best):
        return False, f"{len(row)} entries, expected {len(best)}"
    for (tid, lp), want in zip(row, best):
        if abs(lp - float(dist[tid])) > TOL or abs(lp - want) > TOL:
            return False, f"id {tid} lp {lp} vs reference {float(dist[tid])} (rank value {want})"
    return True, ""


# ---- the documented draw stream (sample_pick.c, docs/protocol.md §11.2) ---------------

def _rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


class Stream:
    """splitmix64-seeded xoshiro256**, as model/rng.h."""
    def __init__(self, seed):
        self.s = []
        x = seed & M64
        for _ in range(4):
            x = (x + PHI) & M64
            z = x
            z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
            z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
            self.s.append(z ^ (z >> 31))

    def uniform(self):
        s = self.s
        res = (_rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
        return (res >> 11) * 2.0 ** -53


def expected_draws(z, temperature, seed, row, k):
    """The k draws of prompt row `row`: stream (seed ^ φ·(2^32 + row + 1)), u·Σ against the
    running sum of p(·)^(1/T) in vocabulary order; T = 0: the argmax."""
    if temperature == 0:
        return [int(torch.argmax(z))] * k
    p = torch.softmax(z / temperature, -1)
    cdf = torch.cumsum(p, 0).tolist()
    st = Stream(seed ^ ((PHI * ((1 << 32) + row + 1)) & M64))
    out = []
    for _ in range(k):
        u = st.uniform() * cdf[-1]
        out.append(next((v for v, c in enumerate(cdf) if u < c), len(cdf) - 1))
    return out


# ---- the client side --------------------------------------------------------------------

class Sampler:
    def __init__(self, s, ssid):
        self.s, self.ssid, self.seq = s, ssid, 0

    def submit(self, prompt=PROMPT, n=1, seq_id=None, **body):
        params = body.pop("sampling_params", {})
        if seq_id is None:
            seq_id, self.seq = self.seq, self.seq + 1
        req = {"sampling_session_id": self.ssid, "seq_id": seq_id, "num_samples": n, "type": "sample",
               "prompt": {"chunks": [{"type": "encoded_text", "tokens": list(prompt)}]},
               "sampling_params": dict({"max_tokens": 6, "seed": 7}, **params)}
        req.update(body)
        st, ans = self.s.post("/api/v1/asample", req)
        if st != 200:
            raise RuntimeError(f"asample {st}: {ans}")
        return ans

    def run(self, **kw):
        """(submit answer, JSON result, decoded protobuf result)."""
        ans = self.submit(**kw)
        return ans, sample_result(self.s, ans["request_id"], False), sample_result(self.s, ans["request_id"], True)


def near(a, b, tol=TOL):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= tol


def main():
    with Stack() as s:
        base = s.get("/api/v1/get_server_capabilities")[1]["supported_models"][0]["model_name"]
        ref = Ref(s.psql(f"SELECT path FROM base_models WHERE name = '{base}'"))
        sid = s.post("/api/v1/create_session", {"sdk_version": "0.39.0"})[1]["session_id"]
        ssid = s.post("/api/v1/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0,
                                                          "base_model": base})[1]["sampling_session_id"]
        c = Sampler(s, ssid)
        lsm = ref.lsm(PROMPT)          # row i: the distribution over PROMPT[i + 1]
        z = ref.logits(PROMPT)

        # ---- sequence ids ------------------------------------------------------------------
        ans, res, pres = c.run(n=3, seq_id=50)
        ids = ans.get("sample_sequence_ids")
        R.check(ids == [f"{ans['request_id']}:{i}" for i in range(3)] and len(set(ids)) == 3,
                f"submit answer: one sequence id per sample, <request_id>:<i> ({ids})")
        R.check([q.get("sequence_id") for q in res["sequences"]] == ids,
                "the JSON result's sequences carry the same ids, in order")
        again = c.submit(n=3, seq_id=50)
        R.check(again == ans, "a resubmission of (sampling_session_id, seq_id) answers the same ids")
        other = c.submit(n=3, seq_id=51)
        R.check(bool(ids) and not set(other.get("sample_sequence_ids") or ids) & set(ids), "another seq_id: other ids")
        R.check(len(pres["sequences"]) == len(ids or []),
                "the protobuf result has one sequence per id (the SDK stamps them in order)")
        R.check(set(res) == {"type", "sequences", "prompt_cache_hit_tokens"} and
                all(set(q) == {"tokens", "logprobs", "stop_reason", "sequence_id"} for q in res["sequences"]),
                "without the new knobs the result keeps its shape (plus sequence_id)")

        # ---- topk_sample_logprobs ----------------------------------------------------------
        for params in ({"temperature": 1.0}, {"temperature": 0.7, "top_k": 4}, {"temperature": 1.3, "top_p": 0.7},
                       {"temperature": 0.8, "top_k": 12, "top_p": 0.9}, {"temperature": 0.0}):
            k = 5
            ans, res, pres = c.run(n=3, topk_sample_logprobs=k, sampling_params=dict(params, max_tokens=8, seed=11))
            ok, why, rows, listed = True, "", 0, 0
            for q, pq in zip(res["sequences"], pres["sequences"]):
                full = ref.logits(PROMPT + q["tokens"])
                tk = q.get("topk_logprobs") or []
                if len(tk) != len(q["tokens"]) or pq.get("topk_logprobs") is None or len(pq["topk_logprobs"]) != len(tk):
                    ok, why = False, f"{len(tk)} rows for {len(q['tokens'])} tokens"
                    break
                for t, (row, prow) in enumerate(zip(tk, pq["topk_logprobs"])):
                    dist = sampled_dist(full[len(PROMPT) - 1 + t], params["temperature"], params.get("top_k", -1),
                                        params.get("top_p", 1.0))
                    good, why = topk_matches(row, dist, k)
                    if not good or [r[0] for r in row] != [r[0] for r in prow] or \
                            any(abs(a[1] - b[1]) > 1e-6 for a, b in zip(row, prow)):
                        ok = False
                        why = why or "protobuf rows differ from JSON"
                        break
                    rows += 1
                    mine = [lp for tid, lp in row if tid == q["tokens"][t]]
                    if mine:
                        listed += 1
                        ok = ok and mine[0] == q["logprobs"][t]
                    if params["temperature"] == 0:
                        ok = ok and row[0][0] == q["tokens"][t]
                if not ok:
                    break
            R.check(ok and rows > 0, f"topk_sample_logprobs {params}: {rows} rows as the float64 reference "
                                     f"(the sampled token listed {listed}x with its own logprob) {why}")

        # ---- target_prompt_logprobs ------------------------------------------------------
        n = len(PROMPT) - 1
        K = 4
        dense = [[(PROMPT[i + 1] if j == 0 else (37 * i + 11 * j) % 256) if (i + j) % 5 else -1 for j in range(K)]
                 for i in range(n)]
        flat = [x for row in dense for x in row]
        ans, res, pres = c.run(prompt_logprobs=True, sampling_params={"max_tokens": 1},
                               target_prompt_logprobs={"data": flat, "dtype": "int64", "shape": [n, K]})
        t = res.get("target_prompt_logprobs", {})
        ok = t.get("shape") == [n, K] and t.get("dtype") == "float32" and len(t.get("data", [])) == n * K
        worst = 0.0
        for q, tid in enumerate(flat):
            got = t["data"][q] if ok else None
            if tid < 0:
                ok = ok and got == 0.0
            else:
                worst = max(worst, abs(got - float(lsm[q // K, tid])) if got is not None else 1.0)
        R.check(ok and worst <= TOL, f"target_prompt_logprobs dense [{n}, {K}]: the float64 reference at every cell, "
                                     f"0.0 at -1 (max gap {worst:.2e})")
        pl = res.get("prompt_logprobs") or []
        R.check(ok and len(pl) == len(PROMPT) and all(t["data"][i * K] == pl[i + 1] for i in range(n) if dense[i][0] >= 0),
                "the actual next token's target logprob equals its prompt_logprobs entry exactly")
        pt = pres.get("target_prompt_logprobs", {})
        R.check(ok and pt.get("wire_dtype") == 1 and pt.get("shape") == [n, K] and "sparse_crow_indices" not in pt and
                all(abs(a - b) <= 1e-6 for a, b in zip(pt.get("data", []), t.get("data", []))),
                "protobuf: target_prompt_logprobs a dense FLOAT32 Tensor of the same values")

        crow, col, vals = [0], [], []
        for i in range(n):
            for j in range(0, 300, 37 + i):      # rising columns, some rows empty or long
                if (i * 7 + j) % 3:
                    col.append(j)
                    vals.append(-1 if (i + j) % 11 == 0 else (i * 31 + j) % 256)
            crow.append(len(vals))
        ans, res, pres = c.run(sampling_params={"max_tokens": 1},
                               target_prompt_logprobs={"data": vals, "dtype": "int64", "shape": [n, 300],
                                                       "sparse_crow_indices": crow, "sparse_col_indices": col})
        t = res.get("target_prompt_logprobs", {})
        ok = (t.get("shape") == [n, 300] and t.get("sparse_crow_indices") == crow and
              t.get("sparse_col_indices") == col and len(t.get("data", [])) == len(vals))
        worst = 0.0
        for i in range(n):
            for q in range(crow[i], crow[i + 1]):
                if vals[q] < 0:
                    ok = ok and t["data"][q] == 0.0
                elif ok:
                    worst = max(worst, abs(t["data"][q] - float(lsm[i, vals[q]])))
        R.check(ok and worst <= TOL and -1 in vals,
                f"target_prompt_logprobs sparse CSR ({len(vals)} cells, K 300): the same indices back, the float64 "
                f"reference at each, 0.0 at -1 (max gap {worst:.2e})")
        pt = pres.get("target_prompt_logprobs", {})
        R.check(ok and pt.get("sparse_crow_indices") == crow and pt.get("sparse_col_indices") == col and
                pt.get("wire_dtype") == 1 and all(abs(a - b) <= 1e-6 for a, b in zip(pt.get("data", []), t.get("data", []))),
                "protobuf: target_prompt_logprobs a sparse_csr Tensor with the request's indices")

        # ---- prompt_logprobs_last_n ------------------------------------------------------
        ans, res, pres = c.run(prompt_logprobs=True, prompt_logprobs_last_n=4, topk_prompt_logprobs=3,
                               sampling_params={"max_tokens": 1})
        pl, tk = res.get("prompt_logprobs") or [], res.get("topk_prompt_logprobs") or []
        first = len(PROMPT) - 4
        ok = len(pl) == len(PROMPT) and len(tk) == len(PROMPT) and all(x is None for x in pl[:first]) and \
            all(x is None for x in tk[:first])
        for p in range(first, len(PROMPT)) if ok else ():
            ok = ok and near(pl[p], float(lsm[p - 1, PROMPT[p]]))
            good, _ = topk_matches(tk[p], lsm[p - 1], 3)
            ok = ok and good
        R.check(ok, "prompt_logprobs_last_n 4: null before the last 4 positions, the float64 reference after "
                    "(topk_prompt_logprobs rows alike)")
        R.check(pres.get("prompt_logprobs", [])[:first] == [None] * first and
                all(near(a, b, 1e-6) for a, b in zip(pres.get("prompt_logprobs", [])[first:], pl[first:])) and
                pres.get("topk_prompt_logprobs", [])[:first] == [None] * first,
                "protobuf: NaN prompt logprobs and null top-k rows before the last n")
        ans, res2, _ = c.run(prompt_logprobs=True, prompt_logprobs_last_n=1000, sampling_params={"max_tokens": 1})
        ans, res3, _ = c.run(prompt_logprobs=True, sampling_params={"max_tokens": 1})
        R.check(res2.get("prompt_logprobs") == res3.get("prompt_logprobs") and res3["prompt_logprobs"][1] is not None,
                "prompt_logprobs_last_n beyond the prompt: all of it")

        # ---- prompt_alt_tokens_k ---------------------------------------------------------
        k = 8
        draws = {}
        for temp, seed in ((1.0, 5), (0.6, 5), (1.0, 6), (0.0, 5)):
            ans, res, pres = c.run(prompt_alt_tokens_k=k, sampling_params={"max_tokens": 2, "seed": seed,
                                                                          "temperature": temp})
            a = res.get("prompt_alt_tokens", {})
            toks, lps = a.get("tokens", {}), a.get("logprobs", {})
            ok = (toks.get("shape") == [n, k] and toks.get("dtype") == "int64" and lps.get("shape") == [n, k] and
                  lps.get("dtype") == "float32" and len(toks.get("data", [])) == n * k)
            worst, agree = 0.0, 0
            for i in range(n) if ok else ():
                row = toks["data"][i * k:(i + 1) * k]
                for j, tid in enumerate(row):
                    worst = max(worst, abs(lps["data"][i * k + j] - float(lsm[i, tid])))
                want = expected_draws(z[i], temp, seed, i, k)
                agree += sum(x == y for x, y in zip(row, want))
            draws[(temp, seed)] = toks.get("data")
            R.check(ok and worst <= TOL, f"prompt_alt_tokens_k {k} (T {temp}, seed {seed}): [{n}, {k}], logprobs the "
                                         f"float64 reference's (max gap {worst:.2e})")
            need = n * k if temp == 0 or not BF16 else n * k - n * k // 10
            R.check(agree >= need - (0 if temp == 0 else 1),
                    f"prompt_alt_tokens_k (T {temp}, seed {seed}): {agree}/{n * k} draws are the documented stream's "
                    "on the reference distribution")
            pa = pres.get("prompt_alt_tokens", {})
            R.check(ok and pa.get("tokens", {}).get("data") == toks.get("data") and pa["tokens"].get("wire_dtype") == 3 and
                    all(abs(x - y) <= 1e-6 for x, y in zip(pa.get("logprobs", {}).get("data", []), lps.get("data", []))),
                    f"protobuf (T {temp}): prompt_alt_tokens as INT32 tokens and FLOAT32 logprobs")
        R.check(draws[(1.0, 5)] is not None and draws[(1.0, 5)] != draws[(1.0, 6)] and draws[(1.0, 5)] != draws[(0.6, 5)],
                "another seed or temperature draws other tokens")
        ans, res, _ = c.run(prompt_alt_tokens_k=k, n=4, prompt_logprobs=True, topk_sample_logprobs=2,
                            sampling_params={"max_tokens": 5, "seed": 5, "temperature": 1.0})
        R.check(draws[(1.0, 5)] is not None and
                res.get("prompt_alt_tokens", {}).get("tokens", {}).get("data") == draws[(1.0, 5)],
                "the same seed draws the same tokens in another request (other num_samples, other outputs)")
        ans, res, _ = c.run(prompt=[5], prompt_alt_tokens_k=3, sampling_params={"max_tokens": 1})
        R.check(res.get("prompt_alt_tokens", {}).get("tokens") == {"data": [], "dtype": "int64", "shape": [0, 3]},
                "a one-token prompt: prompt_alt_tokens of shape [0, k]")

        n_bad = s.psql("SELECT count(*) FROM operations WHERE kind = 'sample' AND state <> 'done'")
        R.check(n_bad == "0", f"every sample operation done ({n_bad} not)")
    R.finish()


if __name__ == "__main__":
    main()
