"""PEFT export checked against an independent PyTorch PEFT implementation.

Train a LoRA on Loom (`loom up`, CPU backend) for a few steps, save sampler weights,
download the archive with ?format=peft (the signed-URL flow of docs/protocol.md §17.7), extract it
and check: the tar layout (§17.1), the adapter_config.json fields PEFT and vLLM need
(§17.6), the key names and shapes PEFT writes for these target modules, and that
tests/ref/peft_ref.py (PEFT's LoRA math on the float64 reference model of torch_ref.py)
gives the same log-probs as Loom's own forward to 1e-5 relative. The Tinker-format archive
(unembed_tokens naming) must give the same numbers, &unembed=0 must drop the head, and
`loom adapter import` of the PEFT archive followed by `loom adapter export` must give
back the same adapter file.
"""
import io, json, os, subprocess, sys, tarfile, tempfile
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
sys.path.insert(0, os.path.join(HERE, "ref"))
from stack import Stack, Results, LOOM_BIN
from apitest import download_archive
import peft_ref

RTOL = 1e-5


def datum(seq, weights=None):
    x, t = seq[:-1], seq[1:]
    return {"model_input": {"chunks": [{"tokens": x, "type": "encoded_text"}]},
            "loss_fn_inputs": {"target_tokens": {"data": t, "dtype": "int64", "shape": [len(t)]},
                               "weights": {"data": weights or [1.0] * len(t), "dtype": "float32",
                                           "shape": [len(t)]}}}


def extract(tar_bytes, where):
    t = tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:")
    members = t.getmembers()
    t.extractall(where, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(where)
    return [m.name for m in members]


def peft_keys(layers, targets, head):
    keys = set()
    for i in range(layers):
        for leaf in targets:
            part = "self_attn" if leaf in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            for side in "AB":
                keys.add(f"base_model.model.model.layers.{i}.{part}.{leaf}.lora_{side}.weight")
    if head:
        keys |= {"base_model.model.lm_head.lora_A.weight", "base_model.model.lm_head.lora_B.weight"}
    return keys


def rel_err(a, b):
    import torch
    a, b = torch.tensor(a, dtype=torch.float64), b.to(torch.float64)
    return ((a - b).abs() / b.abs().clamp_min(1e-3)).max().item()


def check_config(R, label, s, base, rank, flags, seqs, steps):
    sid = s.post("/api/v1/create_session", {"tags": []})[1]["session_id"]
    lc = dict(rank=rank, seed=3, **flags)
    res = s.result(s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": base,
                                                   "lora_config": lc})[1]["request_id"])
    mid, seq = res["model_id"], 1
    data = [datum(q) for q in seqs]
    for _ in range(steps):
        f1 = s.post("/api/v1/forward_backward", {"forward_backward_input": {"data": data, "loss_fn": "cross_entropy"},
                                                 "model_id": mid, "seq_id": seq})[1]
        f2 = s.post("/api/v1/optim_step", {"adam_params": {"learning_rate": 0.05}, "model_id": mid,
                                           "seq_id": seq + 1})[1]
        s.result(f1["request_id"]), s.result(f2["request_id"])
        seq += 2
    saved = s.result(s.post("/api/v1/save_weights_for_sampler", {"model_id": mid, "path": "export",
                                                                 "seq_id": seq})[1]["request_id"])
    seq += 1
    R.check(saved.get("path", "").endswith("/sampler_weights/export"), f"{label}: saved {saved}")
    fwd = s.result(s.post("/api/v1/forward", {"forward_input": {"data": data, "loss_fn": "cross_entropy"},
                                              "model_id": mid, "seq_id": seq})[1]["request_id"])
    loom_lp = [o["logprobs"]["data"] for o in fwd["loss_fn_outputs"]]

    model = peft_ref.RefModel(os.path.join(s.dir, "models", "tiny-llama"))
    L = model.L
    want_leaves = sorted(([] if not flags["train_attn"] else ["q_proj", "k_proj", "v_proj", "o_proj"]) +
                         ([] if not flags["train_mlp"] else ["gate_proj", "up_proj", "down_proj"]) +
                         (["lm_head"] if flags["train_unembed"] else []))
    with tempfile.TemporaryDirectory() as d:
        tar = download_archive(s, mid, "sampler_weights/export", "?format=peft")
        names = extract(tar, d)
        R.check(names == ["adapter_config.json", "adapter_model.safetensors", "checkpoint_complete"],
                f"{label}: peft archive members {names}")
        cfg = json.load(open(os.path.join(d, "adapter_config.json")))
        R.check(cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM" and cfg["r"] == rank and
                cfg["lora_alpha"] == 32 and cfg["target_modules"] == want_leaves and cfg["bias"] == "none" and
                cfg["fan_in_fan_out"] is False and cfg["use_rslora"] is False and cfg["use_dora"] is False and
                cfg["modules_to_save"] is None and cfg["base_model_name_or_path"] == base and
                cfg["inference_mode"] is True and "target_parameters" not in cfg,
                f"{label}: adapter_config.json as PEFT writes it (target_modules {cfg['target_modules']})")
        st = peft_ref.read_safetensors(os.path.join(d, "adapter_model.safetensors"))
        R.check(set(st) == peft_keys(L, [x for x in want_leaves if x != "lm_head"], flags["train_unembed"]),
                f"{label}: {len(st)} keys, exactly PEFT's names for these target modules")
        shapes_ok = all(
            (st[k].shape == (rank, peft_ref.expected_shapes(model, k[len('base_model.model.'):-len('.lora_A.weight')])[1])
             if ".lora_A." in k else
             st[k].shape == (peft_ref.expected_shapes(model, k[len('base_model.model.'):-len('.lora_B.weight')])[0], rank))
            and str(st[k].dtype) == "float32" for k in st)
        R.check(shapes_ok, f"{label}: A is [r, in], B is [out, r], float32")
        ad = peft_ref.load_peft_adapter(d)
        worst = max(rel_err(loom_lp[i], peft_ref.logprobs(model, q[:-1], q[1:], ad)) for i, q in enumerate(seqs))
        base_worst = max(rel_err(loom_lp[i], peft_ref.logprobs(model, q[:-1], q[1:], {"scaling": 1.0, "mods": {}}))
                         for i, q in enumerate(seqs))
        R.check(worst <= RTOL and base_worst > 1e-3,
                f"{label}: PEFT reference log-probs = Loom's (worst rel {worst:.2e}; without the adapter "
                f"{base_worst:.2e})")
        if flags["train_unembed"]:
            with tempfile.TemporaryDirectory() as d2:
                extract(download_archive(s, mid, "sampler_weights/export"), d2)
                ad2 = peft_ref.load_peft_adapter(d2, allow_tinker_head=True)
                w2 = max(rel_err(loom_lp[i], peft_ref.logprobs(model, q[:-1], q[1:], ad2)) for i, q in enumerate(seqs))
                keys2 = peft_ref.read_safetensors(os.path.join(d2, "adapter_model.safetensors"))
                cfg2 = json.load(open(os.path.join(d2, "adapter_config.json")))
                R.check(w2 <= RTOL and "base_model.model.model.unembed_tokens.lora_B.weight" in keys2 and
                        cfg2["target_modules"] == "all-linear" and cfg2["r"] == rank and cfg2["lora_alpha"] == 32,
                        f"{label}: Tinker-format archive (unembed_tokens, all-linear) gives the same numbers")
            with tempfile.TemporaryDirectory() as d3:
                extract(download_archive(s, mid, "sampler_weights/export", "?format=peft&unembed=0"), d3)
                keys3 = peft_ref.read_safetensors(os.path.join(d3, "adapter_model.safetensors"))
                cfg3 = json.load(open(os.path.join(d3, "adapter_config.json")))
                R.check(not any("lm_head" in k for k in keys3) and "lm_head" not in cfg3["target_modules"],
                        f"{label}: &unembed=0 leaves the head out")
        # import the PEFT archive as a new adapter, export it again: same adapter file
        tar_path = os.path.join(d, "peft.tar")
        open(tar_path, "wb").write(tar)
        env = dict(os.environ, DATABASE_URL=s.db)
        run = f"imported-{label}"
        imp = subprocess.run([LOOM_BIN, "adapter", "import", tar_path, "--tenant", "default", "--base-model", base,
                              "--run", run, "--name", "peft", "--data-dir", s.dir], env=env,
                             capture_output=True, text=True)
        R.check(imp.returncode == 0, f"{label}: loom adapter import: {imp.stdout.strip()} {imp.stderr.strip()}")
        out_tar = os.path.join(d, "again.tar")
        exp = subprocess.run([LOOM_BIN, "adapter", "export", f"tinker://{run}/sampler_weights/peft", "--out", out_tar,
                              "--format", "peft", "--data-dir", s.dir], env=env, capture_output=True, text=True)
        with tarfile.open(out_tar, "r:") as t1, tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as t0:
            same = (exp.returncode == 0 and t1.extractfile("adapter_model.safetensors").read() ==
                    t0.extractfile("adapter_model.safetensors").read())
        R.check(same, f"{label}: import + export gives back the same adapter_model.safetensors {exp.stderr.strip()}")
        st_, info = s.post("/api/v1/weights_info", {"tinker_path": f"tinker://{run}/sampler_weights/peft"})
        R.check(st_ == 200 and info["lora_rank"] == rank and info["train_unembed"] == flags["train_unembed"],
                f"{label}: the imported adapter is a checkpoint of the tenant: {info}")
        # Continue training from the imported adapter: a new model, load_weights (weights
        # only), the same logprobs as the model it was exported from, then a training step.
        ipath = f"tinker://{run}/sampler_weights/peft"
        st_, bad = s.post("/api/v1/load_weights", {"model_id": mid, "seq_id": seq + 1, "path": ipath,
                                                   "optimizer": True})
        R.check(st_ == 400 and "optimizer" in bad.get("detail", ""),
                f"{label}: a sampler checkpoint has no optimizer state to load: {st_} {bad}")
        sid2 = s.post("/api/v1/create_session", {"tags": []})[1]["session_id"]
        m2 = s.result(s.post("/api/v1/create_model", {"session_id": sid2, "model_seq_id": 0, "base_model": base,
                                                      "lora_config": dict(rank=rank, seed=99, **flags)})[1]
                      ["request_id"])["model_id"]
        lw = s.result(s.post("/api/v1/load_weights", {"model_id": m2, "seq_id": 1, "path": ipath,
                                                       "optimizer": False})[1]["request_id"])
        R.check(lw.get("type") == "load_weights" and "error" not in lw, f"{label}: load_weights of the import: {lw}")
        f2 = s.result(s.post("/api/v1/forward", {"forward_input": {"data": data, "loss_fn": "cross_entropy"},
                                                 "model_id": m2, "seq_id": 2})[1]["request_id"])
        lp2 = [o["logprobs"]["data"] for o in f2["loss_fn_outputs"]]
        w3 = max(max(abs(x - y) / max(abs(y), 1e-3) for x, y in zip(a, b)) for a, b in zip(lp2, loom_lp))
        R.check(w3 <= RTOL, f"{label}: a model loaded from the imported adapter gives the original's logprobs "
                            f"(worst rel {w3:.2e})")
        fb = s.result(s.post("/api/v1/forward_backward", {"forward_backward_input": {"data": data,
                                                          "loss_fn": "cross_entropy"}, "model_id": m2,
                                                          "seq_id": 3})[1]["request_id"])
        op = s.result(s.post("/api/v1/optim_step", {"adam_params": {"learning_rate": 0.05}, "model_id": m2,
                                                    "seq_id": 4})[1]["request_id"])
        f3 = s.result(s.post("/api/v1/forward", {"forward_input": {"data": data, "loss_fn": "cross_entropy"},
                                                 "model_id": m2, "seq_id": 5})[1]["request_id"])
        nll = lambda out: -sum(sum(o["logprobs"]["data"]) for o in out["loss_fn_outputs"])
        R.check("error" not in fb and op.get("metrics", {}).get("step:max") == 1 and nll(f3) < nll(f2),
                f"{label}: training continues from the import (fresh Adam, step 1; NLL {nll(f2):.3f} -> {nll(f3):.3f})")


def main():
    R = Results()
    seqs = [[(7 * i + 3 * j) % 251 + 1 for j in range(20)] for i in range(3)]
    with Stack() as s:
        base = s.get("/api/v1/get_server_capabilities")[1]["supported_models"][0]["model_name"]
        check_config(R, "all-modules-r4", s, base, 4,
                     {"train_attn": True, "train_mlp": True, "train_unembed": True}, seqs, 4)
        check_config(R, "attn-only-r8", s, base, 8,
                     {"train_attn": True, "train_mlp": False, "train_unembed": False}, seqs, 3)
    R.finish()


if __name__ == "__main__":
    main()
