"""A tiny hand-written protobuf reader/writer for the Tinker wire messages (docs/protocol.md §14),
independent of Loom's protobuf-c code: tests encode requests and decode results with it.

    body = fwdbwd_request("S:train:0", 3, [([1, 2, 3], {"target_tokens": ("int64", [2, 3, 4])})],
                          "cross_entropy")
    out = decode_fwdbwd_output(resp_bytes)   # {"loss_fn_output_type", "loss_fn_outputs", "metrics"}
"""
import struct

DTYPE = {"float32": 1, "int64": 2, "int32": 3, "bfloat16": 4}


# ---- writing ---------------------------------------------------------------------------
def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def key(field, wire):
    return varint(field << 3 | wire)


def f_varint(field, v):
    return key(field, 0) + varint(v)


def f_bytes(field, b):
    return key(field, 2) + varint(len(b)) + b


def f_str(field, s):
    return f_bytes(field, s.encode())


def f_double(field, d):
    return key(field, 1) + struct.pack("<d", d)


def packed_varints(field, values):
    return f_bytes(field, b"".join(varint(v) for v in values))


def tensor(dtype, values, shape=None, sparse=False, crow=None, col=None):
    """A Tensor: dense values (shape defaults to [len(values)]; pass [N, K] for 2-D,
    row-major), or with sparse=True a SparseCsr holding the nnz values and, when given,
    crow (N + 1 entries) / col (nnz entries) as int64 LE."""
    if dtype == "int64":
        raw = struct.pack(f"<{len(values)}q", *values)
    elif dtype == "int32":
        raw = struct.pack(f"<{len(values)}i", *values)
    else:
        raw = struct.pack(f"<{len(values)}f", *values)
    if sparse:
        csr = f_bytes(1, raw)
        if crow is not None:
            csr += f_bytes(2, struct.pack(f"<{len(crow)}q", *crow))
        if col is not None:
            csr += f_bytes(3, struct.pack(f"<{len(col)}q", *col))
        body = f_bytes(2, csr)
    else:
        body = f_bytes(1, raw)
    body += f_varint(3, DTYPE[dtype])
    body += packed_varints(4, shape if shape is not None else [len(values)])
    return body


def to_csr(dense):
    """A 2-D list (rows of K) as (values, crow, col): the non-zero entries, row-major."""
    values, crow, col = [], [0], []
    for row in dense:
        for j, x in enumerate(row):
            if x != 0:
                values.append(x)
                col.append(j)
        crow.append(len(values))
    return values, crow, col


def datum(tokens, inputs, chunk_kind="text"):
    """inputs: {name: (dtype, values) or (dtype, values, shape) or raw Tensor bytes}."""
    if chunk_kind == "text":
        chunk = f_bytes(1, f_bytes(1, struct.pack(f"<{len(tokens)}i", *tokens)))
    else:  # an image chunk
        chunk = f_bytes(2, f_bytes(1, b"\x89PNG") + f_str(2, "png"))
    out = f_bytes(1, chunk)
    for name, spec in inputs.items():
        t = spec if isinstance(spec, bytes) else tensor(*spec)
        out += f_bytes(2, f_str(1, name) + f_bytes(2, t))
    return out


def fwdbwd_request(model_id, seq_id, data, loss_fn, config=None, forward_only=False):
    """data: list of (tokens, inputs) or pre-encoded Datum bytes."""
    out = b""
    if model_id is not None:
        out += f_str(1, model_id)
    if seq_id:
        out += f_varint(2, seq_id)
    for d in data:
        out += f_bytes(3, d if isinstance(d, bytes) else datum(*d))
    if loss_fn:
        out += f_str(4, loss_fn)
    for k, v in (config or {}).items():
        out += f_bytes(5, f_str(1, k) + f_double(2, v))
    if forward_only:
        out += f_varint(6, 1)
    return out


# ---- reading ---------------------------------------------------------------------------
def fields(buf):
    """(field number, wire type, value) of one message: int for varints, bytes otherwise."""
    i, n = 0, len(buf)
    while i < n:
        k, i = _varint_at(buf, i)
        field, wire = k >> 3, k & 7
        if wire == 0:
            v, i = _varint_at(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 2:
            ln, i = _varint_at(buf, i)
            v, i = buf[i:i + ln], i + ln
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield field, wire, v


def _varint_at(buf, i):
    shift = v = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def _varints(wire, v):
    if wire == 0:
        return [v]
    out, i = [], 0
    while i < len(v):
        x, i = _varint_at(v, i)
        out.append(x)
    return out


def _signed64(x):
    return x - (1 << 64) if x >= 1 << 63 else x


def decode_fwdbwd_output(buf):
    """ForwardBackwardOutput -> the JSON shape of §7.3, the way the SDK rebuilds it."""
    out = {"loss_fn_output_type": "", "loss_fn_outputs": [], "metrics": {}}
    for f, w, v in fields(buf):
        if f == 1:
            out["loss_fn_output_type"] = v.decode()
        elif f == 2:
            out["loss_fn_outputs"].extend(_decode_array_record(v))
        elif f == 3:
            k, val = None, 0.0   # proto3: a map entry's value 0.0 is not on the wire
            for f2, w2, v2 in fields(v):
                if f2 == 1:
                    k = v2.decode()
                elif f2 == 2:
                    val = struct.unpack("<d", v2)[0]
            out["metrics"][k] = val
    return out


def _decode_array_record(buf):
    tensors, num = {}, None
    for f, w, v in fields(buf):
        if f == 2:
            name = bt = None
            for f2, w2, v2 in fields(v):
                if f2 == 1:
                    name = v2.decode()
                elif f2 == 2:
                    bt = v2
            tensors[name] = _decode_batched(bt)
        elif f == 3:
            num = v
    first = next(iter(tensors.values()), None)
    n = num if num is not None else (len(first[0]) if first else 0)
    datums = [{} for _ in range(n)]
    for name, (slices, dtype, trailing) in tensors.items():
        for i, values in enumerate(slices):
            inner = 1
            for d in trailing:
                inner *= d
            datums[i][name] = {"data": values, "dtype": dtype,
                               "shape": [len(values) // max(inner, 1)] + list(trailing)}
    return datums


def _decode_batched(buf):
    data, offsets, dtype, trailing = b"", b"", 0, []
    for f, w, v in fields(buf):
        if f == 1:
            data = v
        elif f == 2:
            offsets = v
        elif f == 3:
            dtype = v
        elif f == 4:
            trailing += [_signed64(x) for x in _varints(w, v)]
    offs = struct.unpack(f"<{len(offsets) // 8}q", offsets)
    fmt, size, name = {1: ("f", 4, "float32"), 2: ("q", 8, "int64"), 3: ("i", 4, "int64")}[dtype]
    slices = []
    for a, b in zip(offs, offs[1:]):
        chunk = data[a:b]
        slices.append(list(struct.unpack(f"<{len(chunk) // size}{fmt}", chunk)))
    return slices, name, trailing


def _decode_topk(v):
    """TopkLogprobs -> rows of [id, logprob] pairs, None where the first slot is empty (the
    SDK's topk_to_lists: trailing empty slots dropped)."""
    m = {f2: v2 for f2, w2, v2 in fields(v)}   # no repeated fields: the last value of each
    ids, lps, k, n = m.get(1, b""), m.get(2, b""), m.get(3, 0), m.get(4, 0)
    ids = struct.unpack(f"<{len(ids) // 4}i", ids)
    lps = struct.unpack(f"<{len(lps) // 4}f", lps)
    rows = []
    for p in range(n):
        row = [[ids[p * k + j], lps[p * k + j]] for j in range(k)
               if not (ids[p * k + j] == 0 and lps[p * k + j] == -99999.0)]
        rows.append(row if row and not (ids[p * k] == 0 and lps[p * k] == -99999.0) else None)
    return rows


def decode_tensor(buf):
    """Tensor -> a TensorData dict {"data", "dtype", "shape"} (+ "sparse_crow_indices",
    "sparse_col_indices" when it is sparse CSR); INT32 and INT64 both read as "int64", as
    the SDK's response_conv does. "wire_dtype" keeps the DType number sent."""
    dense = values = crow = col = None
    dtype, shape = 0, []
    for f, w, v in fields(buf):
        if f == 1:
            dense = v
        elif f == 2:
            for f2, w2, v2 in fields(v):
                if f2 == 1:
                    values = v2
                elif f2 == 2:
                    crow = list(struct.unpack(f"<{len(v2) // 8}q", v2))
                elif f2 == 3:
                    col = list(struct.unpack(f"<{len(v2) // 8}q", v2))
            values = values or b""
        elif f == 3:
            dtype = v
        elif f == 4:
            shape += [_signed64(x) for x in _varints(w, v)]
    raw = dense if dense is not None else (values or b"")
    fmt, size, name = {1: ("f", 4, "float32"), 2: ("q", 8, "int64"), 3: ("i", 4, "int64")}[dtype]
    out = {"data": list(struct.unpack(f"<{len(raw) // size}{fmt}", raw)), "dtype": name, "shape": shape,
           "wire_dtype": dtype}
    if values is not None:
        out["sparse_crow_indices"] = crow or []
        out["sparse_col_indices"] = col or []
    return out


def decode_sample_response(buf):
    """SampleResponse -> the JSON shape of §11.2 (NaN at prompt position 0 -> None; a
    sequence's topk_sampled_logprobs as its "topk_logprobs" rows)."""
    out = {"sequences": [], "prompt_logprobs": None, "topk_prompt_logprobs": None,
           "prompt_cache_hit_tokens": 0}
    for f, w, v in fields(buf):
        if f == 1:
            seq = {"stop_reason": "stop", "tokens": [], "logprobs": None}
            for f2, w2, v2 in fields(v):
                if f2 == 1:
                    seq["stop_reason"] = "length" if v2 == 1 else "stop"
                elif f2 == 2:
                    seq["tokens"] = list(struct.unpack(f"<{len(v2) // 4}i", v2))
                elif f2 == 3:
                    seq["logprobs"] = list(struct.unpack(f"<{len(v2) // 4}f", v2))
                elif f2 == 4:
                    seq["topk_logprobs"] = _decode_topk(v2)
            out["sequences"].append(seq)
        elif f == 2:
            vals = struct.unpack(f"<{len(v) // 4}f", v)
            out["prompt_logprobs"] = [None if x != x else x for x in vals]
        elif f == 3:
            out["topk_prompt_logprobs"] = _decode_topk(v)
        elif f == 4:
            out["prompt_cache_hit_tokens"] = v
        elif f == 5:
            out["target_prompt_logprobs"] = decode_tensor(v)
        elif f == 6:
            alt = {}
            for f2, w2, v2 in fields(v):
                if f2 == 1:
                    alt["tokens"] = decode_tensor(v2)
                elif f2 == 2:
                    alt["logprobs"] = decode_tensor(v2)
            out["prompt_alt_tokens"] = alt
    return out
