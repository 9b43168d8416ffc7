"""Independent PEFT LoRA reference: loads an adapter directory the way Hugging Face PEFT
reads one (adapter_config.json + adapter_model.safetensors) and runs the base model with
it, in float64, on the independent PyTorch model of torch_ref.py.

PEFT semantics implemented here (peft/tuners/lora): for every nn.Linear whose leaf name
is in target_modules, y = x W^T + scaling * (x A^T) B^T with A = lora_A.weight [r, in],
B = lora_B.weight [out, r], scaling = lora_alpha / r (lora_alpha / sqrt(r) with
use_rslora); keys are "base_model.model." + the module path + ".lora_A.weight"; the
output head is the module "lm_head". Shares no code with Loom's C side.

    adapter = load_peft_adapter(dir)           -> {"scaling", "mods": {module: (A, B)}}
    logprobs(model, tokens, targets, adapter)  -> float64 tensor [n]
"""
import json
import math
import os

import torch

from torch_ref import RefModel, read_safetensors  # noqa: F401  (RefModel re-exported)

PEFT_PREFIX = "base_model.model."
LINEAR_LEAVES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}


class PeftFormatError(ValueError):
    pass


def load_peft_adapter(adapter_dir, dtype=torch.float64, allow_tinker_head=False):
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    for k in ("peft_type", "r", "lora_alpha", "target_modules"):
        if k not in cfg:
            raise PeftFormatError(f"adapter_config.json lacks {k}")
    if cfg["peft_type"] != "LORA":
        raise PeftFormatError(f"peft_type {cfg['peft_type']}")
    if cfg.get("use_dora") or cfg.get("modules_to_save") or cfg.get("bias", "none") != "none":
        raise PeftFormatError("DoRA / modules_to_save / bias adapters are not plain LoRA")
    if cfg.get("fan_in_fan_out"):
        raise PeftFormatError("fan_in_fan_out is for Conv1D models")
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    targets = cfg["target_modules"]
    tensors = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    pairs = {}
    for key, arr in tensors.items():
        if not key.startswith(PEFT_PREFIX):
            raise PeftFormatError(f"key {key} lacks the PEFT prefix")
        rest = key[len(PEFT_PREFIX):]
        for side in ("A", "B"):
            suffix = f".lora_{side}.weight"
            if rest.endswith(suffix):
                module = rest[:-len(suffix)]
                break
        else:
            raise PeftFormatError(f"key {key} is not a lora_A/lora_B weight")
        leaf = module.rsplit(".", 1)[-1]
        if allow_tinker_head and module == "model.unembed_tokens":
            leaf, module = "lm_head", "lm_head"
        # PEFT matches target_modules (a list) against the leaf name; "all-linear" = every Linear
        if targets != "all-linear" and leaf not in targets:
            raise PeftFormatError(f"{module} carries LoRA weights but {leaf} is not in target_modules")
        if leaf not in LINEAR_LEAVES:
            raise PeftFormatError(f"{module} is not a Linear module of a Llama/Qwen model")
        pairs.setdefault(module, {})[side] = torch.tensor(arr.astype("float64"), dtype=dtype)
    mods = {}
    for module, p in pairs.items():
        if set(p) != {"A", "B"}:
            raise PeftFormatError(f"{module} has lora_{list(p)[0]} only")
        A, B = p["A"], p["B"]
        if A.shape[0] != r or B.shape[1] != r:
            raise PeftFormatError(f"{module}: A {tuple(A.shape)}, B {tuple(B.shape)} do not have rank {r}")
        mods[module] = (A, B)
    return {"scaling": scaling, "mods": mods, "config": cfg}


def expected_shapes(model, module):
    """[out, in] of a module of the reference model (the HF nn.Linear weight shape)."""
    if module == "lm_head":
        return tuple(model.head.shape)
    return tuple(model.W[module + ".weight"].shape)


def logprobs(model, tokens, targets, adapter):
    """log p(targets[i] | tokens[..i]) with the PEFT adapter applied."""
    lora = {"scale": adapter["scaling"], "mods": {}}
    for module, (A, B) in adapter["mods"].items():
        out, inn = expected_shapes(model, module)
        if A.shape[1] != inn or B.shape[0] != out:
            raise PeftFormatError(f"{module}: A {tuple(A.shape)} / B {tuple(B.shape)} do not fit [{out}, {inn}]")
        # torch_ref applies the head LoRA under the name "model.unembed_tokens"
        lora["mods"]["model.unembed_tokens" if module == "lm_head" else module] = (A, B)
    t = torch.tensor(tokens, dtype=torch.long)
    logits = model.forward(t, lora)
    lp = torch.log_softmax(logits, dim=-1)
    return lp.gather(1, torch.tensor(targets, dtype=torch.long).view(-1, 1)).view(-1)
