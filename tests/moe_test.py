"""A Qwen3-MoE model end to end (docs/architecture.md, "Mixture of experts").

`loom mkmodel --arch qwen3_moe` (8 experts, 2 per token, 2 sparse layers), `loom up` serving
it on the CPU backend, then over real HTTP what the SDK sends:
  * create_model with LoRA on attention, every expert and the head; get_info states the
    adapter's parameters and bytes, counted here from the config independently;
  * 30 SFT steps (forward_backward + optim_step, JSON, one more in protobuf): the mean NLL
    falls by more than half; every forward_backward result carries the routing metrics the
    SDK documents for MoE models, in their ranges; the first step's (the adapter's B is
    still zero, so the model routes as the base model) equal the metrics computed from
    the float64 reference's own routing (tests/ref/torch_ref.py);
  * the operator's per-expert counts (executors.expert_tokens, the console's overview)
    add up to num_experts_per_tok times the tokens of the passes, layer by layer;
  * sampling from the trained weights: logprobs at temperature 1 equal forward's;
  * the PEFT export: per-expert keys (mlp.experts.E.gate_proj...), target_modules, shapes,
    and the reference PEFT LoRA on the float64 model gives Loom's log-probs to 1e-5;
    `loom adapter import` of it and export again give the same file; weights_info of the
    import states its size.
Prints "N passed, N failed" last.
"""
import io, json, math, os, subprocess, sys, tarfile, tempfile
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
sys.path.insert(0, os.path.join(HERE, "ref"))
from stack import Stack, Results, LOOM_BIN
from apitest import loom_cli, download_archive
from wire import forward_backward, fb_result
import peft_ref
import torch

NAME = "loom/tiny-qwen3-moe"
STEPS = 30
RANK = 8
SEQS = [[(7 * i + 3 * j) % 251 + 1 for j in range(24)] for i in range(4)]
METRICS = ("e_frac_with_tokens:mean", "e_frac_oversubscribed:mean", "e_max_violation:mean", "e_max_violation:max",
           "e_min_violation:mean")


def datum(seq):
    x, t = seq[:-1], seq[1:]
    return (x, {"target_tokens": ("int64", t), "weights": ("float32", [1.0] * len(t))})


def json_datum(seq):
    x, t = seq[:-1], seq[1:]
    return {"model_input": {"chunks": [{"tokens": x, "type": "encoded_text"}]},
            "loss_fn_inputs": {"target_tokens": {"data": t, "dtype": "int64", "shape": [len(t)]}}}


def ref_metrics(counts, E):
    """The SDK's definitions (ForwardBackwardOutput.metrics), from per-layer expert counts."""
    m = {k: [] for k in METRICS if k.endswith(":mean")}
    for c in counts:
        fair = sum(c) / E
        m["e_frac_with_tokens:mean"].append(sum(1 for x in c if x > 0) / E)
        m["e_frac_oversubscribed:mean"].append(sum(1 for x in c if x > fair) / E)
        m["e_max_violation:mean"].append((max(c) - fair) / fair)
        m["e_min_violation:mean"].append((min(c) - fair) / fair)
    out = {k: sum(v) / len(v) for k, v in m.items()}
    out["e_max_violation:max"] = max(m["e_max_violation:mean"])
    return out


def ref_lora_params(cfg, r, attn, mlp, head):
    H, V, E = cfg["hidden_size"], cfg["vocab_size"], cfg["num_experts"]
    qd = cfg["num_attention_heads"] * cfg["head_dim"]
    kvd = cfg["num_key_value_heads"] * cfg["head_dim"]
    n = 0
    for _ in range(cfg["num_hidden_layers"]):  # every layer sparse in this model
        if attn:
            n += r * (H + qd) + 2 * r * (H + kvd) + r * (qd + H)
        if mlp:
            n += E * 3 * r * (H + cfg["moe_intermediate_size"])
    return n + (r * (H + V) if head else 0)


def main():
    R = Results()
    work = tempfile.mkdtemp(prefix="loom-moe-")
    mdir = os.path.join(work, "model")
    subprocess.run([LOOM_BIN, "mkmodel", "--arch", "qwen3_moe", "--out", mdir, "--seed", "1"], check=True,
                   capture_output=True)
    cfg = json.load(open(os.path.join(mdir, "config.json")))
    E, K, L = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["num_hidden_layers"]
    ref = peft_ref.RefModel(mdir)
    with Stack(["--model-dir", mdir, "--model-name", NAME]) as s:
        run(R, s, cfg, ref, E, K, L)
    subprocess.run(["rm", "-rf", work])
    R.finish()


def run(R, s, cfg, ref, E, K, L):
    st, caps = s.get("/api/v1/get_server_capabilities")
    R.check(st == 200 and [m["model_name"] for m in caps["supported_models"]] == [NAME], f"serves {NAME}: {caps}")
    sid = s.post("/api/v1/create_session", {"tags": [], "sdk_version": "0.25.0"})[1]["session_id"]
    flags = {"train_attn": True, "train_mlp": True, "train_unembed": True}
    res = s.result(s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": NAME,
                                                   "lora_config": dict(rank=RANK, seed=3, **flags)})[1]["request_id"])
    mid = res.get("model_id")
    R.check(mid == f"{sid}:train:0", f"create_model: {res}")
    st, info = s.post("/api/v1/get_info", {"model_id": mid})
    want = ref_lora_params(cfg, RANK, True, True, True)
    R.check(st == 200 and info.get("model_data", {}).get("arch") == "Qwen3MoeForCausalLM" and
            info.get("lora_parameters") == want and info.get("adapter_bytes") == 16 * want,
            f"get_info states the adapter: {want} parameters, {16 * want} bytes ({info})")

    # the base model's routing of the batch, in the float64 reference
    counts = [[0] * E for _ in range(L)]
    for q in SEQS:
        c = []
        ref.forward(torch.tensor(q[:-1]), None, c)
        for i, n in enumerate(c):
            counts[i // E][i % E] += n
    want_m = ref_metrics(counts, E)
    gap = getattr(ref, "min_route_gap", 1.0)

    data = [datum(q) for q in SEQS]
    ntok = sum(len(q) - 1 for q in SEQS)
    seq, losses, ok_metrics, tokens = 1, [], True, 0
    for step in range(STEPS + 1):
        proto = step == STEPS
        st, fb = forward_backward(s, mid, seq, data, "cross_entropy", proto)
        st2, op = s.post("/api/v1/optim_step", {"adam_params": {"learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.95,
                                                                "eps": 1e-8}, "model_id": mid, "seq_id": seq + 1})
        seq += 2
        if st != 200 or st2 != 200:
            R.check(False, f"step {step} submit: {st} {fb} / {st2} {op}")
            return
        out, opr = fb_result(s, fb["request_id"], proto), s.result(op["request_id"])
        if "error" in out or "error" in opr:
            R.check(False, f"step {step}: {out} {opr}")
            return
        tokens += ntok
        m = out["metrics"]
        losses.append(-sum(sum(o["logprobs"]["data"]) for o in out["loss_fn_outputs"]) / ntok)
        ok_metrics &= all(k in m for k in METRICS) and 0 < m[METRICS[0]] <= 1 and 0 <= m[METRICS[1]] <= 1 and \
            m[METRICS[2]] >= 0 and m[METRICS[3]] >= m[METRICS[2]] - 1e-12 and -1 <= m[METRICS[4]] <= 0
        if step == 0:
            worst = max(abs(m.get(k, 1e9) - want_m[k]) for k in METRICS)
            R.check(worst < 1e-6, f"step 0's routing metrics are the float64 reference's (worst {worst:.1e}; "
                                  f"smallest gap to the next expert {gap:.1e}): {m} vs {want_m}")
        if step % 10 == 0 or proto:
            print(f"step {step:2d} {'proto' if proto else 'json '} NLL {losses[-1]:.4f}  " +
                  "  ".join(f"{k[2:]}={m.get(k, float('nan')):.3f}" for k in METRICS))
    R.check(ok_metrics, "every forward_backward result has the five routing metrics, in their ranges "
                        "(JSON and protobuf)")
    R.check(abs(losses[0] - math.log(256)) < 1.0, f"initial NLL {losses[0]:.3f} near log(vocab)")
    R.check(losses[-1] < 0.5 * losses[0], f"NLL fell by more than half: {losses[0]:.3f} -> {losses[-1]:.3f}")

    # a forward pass of the trained weights (Loom's log-probs for the exports below)
    fwd = s.result(s.post("/api/v1/forward", {"forward_input": {"data": [json_datum(q) for q in SEQS],
                                                                "loss_fn": "cross_entropy"},
                                              "model_id": mid, "seq_id": seq})[1]["request_id"])
    seq += 1
    tokens += ntok
    loom_lp = [o["logprobs"]["data"] for o in fwd["loss_fn_outputs"]]
    R.check(all(k in fwd.get("metrics", {}) for k in METRICS), f"forward results carry them too: {fwd.get('metrics')}")

    # the operator's view: each sparse layer routed K x every token of those passes
    raw = s.psql("SELECT expert_tokens FROM executors WHERE state <> 'gone' AND expert_tokens IS NOT NULL")
    rows = json.loads(raw.replace("{", "[").replace("}", "]")) if raw else []
    R.check(len(rows) == L and all(len(r) == E and sum(r) == K * tokens for r in rows),
            f"executors.expert_tokens: {L} layers of {E} experts, each summing to {K} x {tokens} tokens: {rows}")
    secret = os.path.join(s.dir, "secret.key")
    loom_cli(s, "tenant", "create", "ops")
    op_key = loom_cli(s, "key", "create", "--tenant", "ops", "--scopes", "admin", "--secret-file", secret)
    st, ov = s.get("/api/v1/console/admin/overview", key=op_key)
    exes = [e for e in ov.get("executors", []) if e.get("expert_tokens")] if st == 200 else []
    R.check(len(exes) == 1 and exes[0]["expert_tokens"] == rows, f"the console's operator overview shows them ({st})")

    # sampling from the trained weights: temperature-1 logprobs are forward's
    snap = s.result(s.post("/api/v1/save_weights_for_sampler", {"model_id": mid, "seq_id": seq,
                                                                "sampling_session_seq_id": 1})[1]["request_id"])
    seq += 1
    ssid = snap.get("sampling_session_id")
    smp = s.result(s.post("/api/v1/asample", {"sampling_session_id": ssid, "seq_id": 0, "num_samples": 2,
                                              "prompt": {"chunks": [{"tokens": SEQS[0][:6], "type": "encoded_text"}]},
                                              "sampling_params": {"max_tokens": 10, "temperature": 1.0, "seed": 5}}
                          )[1]["request_id"], timeout=120)
    worst, n = 0.0, 0
    for sq in smp.get("sequences", []):
        toks = SEQS[0][:6] + sq["tokens"]
        f = s.result(s.post("/api/v1/forward", {"forward_input": {"data": [json_datum(toks)],
                                                                  "loss_fn": "cross_entropy"},
                                                "model_id": mid, "seq_id": seq})[1]["request_id"])
        seq += 1
        lp = f["loss_fn_outputs"][0]["logprobs"]["data"][5:]
        worst = max([worst] + [abs(a - b) for a, b in zip(lp, sq["logprobs"])])
        n += len(sq["tokens"])
    R.check(n == 20 and worst < 1e-4, f"samples of the trained MoE: {n} tokens, logprobs = forward's (worst {worst:.1e})")

    # PEFT export
    saved = s.result(s.post("/api/v1/save_weights_for_sampler", {"model_id": mid, "path": "export",
                                                                 "seq_id": seq})[1]["request_id"])
    seq += 1
    with tempfile.TemporaryDirectory() as d:
        tar = download_archive(s, mid, "sampler_weights/export", "?format=peft")
        tarfile.open(fileobj=io.BytesIO(tar), mode="r:").extractall(d)
        pc = json.load(open(os.path.join(d, "adapter_config.json")))
        R.check(pc["target_modules"] == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj", "lm_head"]) and pc["r"] == RANK and
                "target_parameters" not in pc,
                f"adapter_config.json: target_modules {pc['target_modules']} (the per-expert modules' leaves)")
        st_ = peft_ref.read_safetensors(os.path.join(d, "adapter_model.safetensors"))
        keys = set()
        for i in range(L):
            for leaf in ("q_proj", "k_proj", "v_proj", "o_proj"):
                keys |= {f"base_model.model.model.layers.{i}.self_attn.{leaf}.lora_{x}.weight" for x in "AB"}
            for e in range(E):
                for leaf in ("gate_proj", "up_proj", "down_proj"):
                    keys |= {f"base_model.model.model.layers.{i}.mlp.experts.{e}.{leaf}.lora_{x}.weight" for x in "AB"}
        keys |= {"base_model.model.lm_head.lora_A.weight", "base_model.model.lm_head.lora_B.weight"}
        R.check(set(st_) == keys, f"{len(st_)} keys, exactly PEFT's per-expert names ({len(keys)} expected)")
        Im, H = cfg["moe_intermediate_size"], cfg["hidden_size"]
        k0 = "base_model.model.model.layers.1.mlp.experts.5."
        R.check(st_[k0 + "gate_proj.lora_A.weight"].shape == (RANK, H) and
                st_[k0 + "gate_proj.lora_B.weight"].shape == (Im, RANK) and
                st_[k0 + "down_proj.lora_A.weight"].shape == (RANK, Im) and
                st_[k0 + "down_proj.lora_B.weight"].shape == (H, RANK), "an expert's A is [r, in], B [out, r]")
        ad = peft_ref.load_peft_adapter(d)
        rel = lambda a, b: ((torch.tensor(a, dtype=torch.float64) - b).abs() / b.abs().clamp_min(1e-3)).max().item()
        w = max(rel(loom_lp[i], peft_ref.logprobs(ref, q[:-1], q[1:], ad)) for i, q in enumerate(SEQS))
        w0 = max(rel(loom_lp[i], peft_ref.logprobs(ref, q[:-1], q[1:], {"scaling": 1.0, "mods": {}}))
                 for i, q in enumerate(SEQS))
        R.check(w <= 1e-5 and w0 > 1e-3, f"the PEFT reference (float64) gives Loom's log-probs: worst rel {w:.2e} "
                                          f"(without the adapter {w0:.2e})")
        tar_path = os.path.join(d, "peft.tar")
        open(tar_path, "wb").write(tar)
        env = dict(os.environ, DATABASE_URL=s.db)
        imp = subprocess.run([LOOM_BIN, "adapter", "import", tar_path, "--tenant", "default", "--base-model", NAME,
                              "--run", "moe-import", "--name", "peft", "--data-dir", s.dir], env=env,
                             capture_output=True, text=True)
        R.check(imp.returncode == 0, f"loom adapter import: {imp.stdout.strip()} {imp.stderr.strip()}")
        out_tar = os.path.join(d, "again.tar")
        exp = subprocess.run([LOOM_BIN, "adapter", "export", "tinker://moe-import/sampler_weights/peft", "--out",
                              out_tar, "--format", "peft", "--data-dir", s.dir], env=env, capture_output=True,
                             text=True)
        same = exp.returncode == 0 and tarfile.open(out_tar).extractfile("adapter_model.safetensors").read() == \
            tarfile.open(fileobj=io.BytesIO(tar)).extractfile("adapter_model.safetensors").read()
        R.check(same, f"import + export gives back the same adapter_model.safetensors {exp.stderr.strip()}")
        st, wi = s.post("/api/v1/weights_info", {"tinker_path": "tinker://moe-import/sampler_weights/peft"})
        R.check(st == 200 and wi.get("lora_parameters") == want and wi.get("adapter_bytes") == 16 * want,
                f"weights_info states the imported adapter's size: {wi}")


if __name__ == "__main__":
    main()
