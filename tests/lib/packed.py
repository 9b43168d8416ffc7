"""The packed columns of a forward / forward_backward (migration 0028), read and written
here from their description in contract/fb_payload.h and contract/fb_result.h, not from
Loom's C code: operations.payload_bin (the loss and every datum's arrays) and
operations.result_bin (metrics and outputs). Little-endian throughout."""
import json
import struct

LOSSES = ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]
INPUTS = ["target_tokens", "weights", "logprobs", "advantages"]


def payload_bytes(loss_fn, datums, clip_low=0.8, clip_high=1.2, beta=0.05):
    """payload_bin of datums [{"tokens": [...], "k"?: K, "target_tokens": [...], ...}]."""
    out = bytearray(b"LFB1")
    out += struct.pack("<IdddII", LOSSES.index(loss_fn), clip_low, clip_high, beta, len(datums), 0)
    for d in datums:
        k = d.get("k", 1)
        mask = sum(1 << i for i, name in enumerate(INPUTS) if name in d)
        out += struct.pack("<III", len(d["tokens"]), k, mask)
        out += struct.pack(f"<{len(d['tokens'])}i", *d["tokens"])
        for i, name in enumerate(INPUTS):
            if name in d:
                out += struct.pack(f"<{len(d[name])}{'i' if i == 0 else 'f'}", *d[name])
    return bytes(out)


def decode_payload(header, raw):
    """The header (JSON) and payload_bin as the payload of before migration 0028:
    {"loss_fn", "loss_fn_config", "data": [{"tokens", "k" (only when > 1), inputs...}]},
    plus "loss" (the loss_spec packed in payload_bin)."""
    p = dict(header)
    assert raw[:4] == b"LFB1", raw[:4]
    kind, lo, hi, beta, n_data, _ = struct.unpack_from("<IdddII", raw, 4)
    p["loss"] = {"kind": LOSSES[kind], "clip_low": lo, "clip_high": hi, "beta": beta}
    at, data = 40, []
    for _ in range(n_data):
        n, k, mask = struct.unpack_from("<III", raw, at)
        at += 12
        d = {"tokens": list(struct.unpack_from(f"<{n}i", raw, at))}
        at += 4 * n
        if k > 1:
            d["k"] = k
        for i, name in enumerate(INPUTS):
            if mask & (1 << i):
                m = n * k if i < 2 else n
                d[name] = list(struct.unpack_from(f"<{m}{'i' if i == 0 else 'f'}", raw, at))
                at += 4 * m
        data.append(d)
    assert at == len(raw), (at, len(raw))
    p["data"] = data
    return p


def payload_of(s, where):
    """The payload of the one forward / forward_backward row `where` selects (SQL)."""
    row = s.psql(f"SELECT payload::text || '|' || encode(payload_bin, 'hex') FROM operations WHERE {where}")
    header, hexbin = row.rsplit("|", 1)
    return decode_payload(json.loads(header), bytes.fromhex(hexbin))


def decode_result(raw):
    """result_bin as {"metrics": {...}, "loss_fn_outputs": [{"logprobs": {"data", "shape"},
    "elementwise_loss": {"data", "shape"}}]} (values as float32, metrics as stored)."""
    assert raw[:4] == b"LFR1", raw[:4]
    n_data, n_metrics, _ = struct.unpack_from("<III", raw, 4)
    at, metrics, outs = 16, {}, []
    for _ in range(n_metrics):
        key = raw[at:at + 32].rstrip(b"\0").decode()
        metrics[key] = struct.unpack_from("<d", raw, at + 32)[0]
        at += 40
    for _ in range(n_data):
        n, k = struct.unpack_from("<II", raw, at)
        lp = list(struct.unpack_from(f"<{n * k}f", raw, at + 8))
        el = list(struct.unpack_from(f"<{n}f", raw, at + 8 + 4 * n * k))
        at += 8 + 4 * n * (k + 1)
        outs.append({"logprobs": {"data": lp, "shape": [n, k] if k > 1 else [n]},
                     "elementwise_loss": {"data": el, "shape": [n]}})
    assert at == len(raw), (at, len(raw))
    return {"metrics": metrics, "loss_fn_outputs": outs}
