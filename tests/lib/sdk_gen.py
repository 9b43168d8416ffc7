"""The Tinker Python SDK, generation by generation, as it looks on the wire: what each
version sends (headers, bootstrap calls, request bodies, encodings) and how strictly it
reads the answers. The official SDK cannot be installed where the tests run (no PyPI),
so this module stands in for it: a `Client` per generation drives a Loom over real HTTP
and raises `SdkError` wherever that SDK would raise.

    g = GENS["0.27"]
    c = Client(stack, g)              # ServiceClient(): client/config, create_session, ...
    m = c.create_lora_training_client("loom/tiny-llama", rank=8, seed=3)
    out = c.forward_backward(m, data, "cross_entropy")      # chunked, proto for 0.25+
    sc = c.save_weights_and_get_sampling_client(m)
    res = c.sample(sc, prompt, 4, {"max_tokens": 6})        # 0.27+: SdkError without ids

Where each generation's behaviour was read (public sources; SDK = the package
`tinker`, github.com/thinking-machines-lab/tinker):

| gen  | sdk_version | read from |
|------|-------------|-----------|
| 0.16 | 0.16.1 | the SDK source at that release (commit 07bd3c2) |
| 0.18 | 0.18.0 | the SDK source at 30517b6 |
| 0.24 | 0.24.1 | the SDK source at 6b02536 |
| 0.25 | 0.25.0 | the SDK source at d595dc2 |
| 0.27 | 0.27.1 | 0.25 source plus the 0.26.2 files (futures_retrieve, copy_weights, client flags at 0beab58/6889e5e); that 0.27 refuses a sample result whose submission carried no sample_sequence_ids is stated by SkyRL's and GMI tinker-cloud's protocol tests (sdk_version 0.27.1) |
| 0.30 | 0.30.4 | types/optimizer.py at 1e5777e (0.30.4), optim_step_request.py (adam_params / optimizer_params on the wire), sample_request.py and the protobuf descriptor at e5871ef (~0.30-0.31), training_client.py and sampling_client.py of 0.32.0 (958ce1d) for the unchanged call sites |
| 0.33 | 0.33.1 | no source: the 0.32.0 files above plus GMI tinker-cloud's tests for "the 0.33 SDK" (prompt_logprobs_last_n, sessions/{id}/finish, join_sampling_session, client/config with sample_join_sampling_session) |
| 0.38 | 0.38.0 | no source: as 0.33 plus the docs site's type reference generated from 0.34.0-0.39.0 (ServiceClient(display_name=...), CheckpointSearch*, ExternalWeightsUpload*, Checkpoint.base_model) |

Request bodies follow the SDK's serialisation: 0.16 dumps only the fields its call sites
set (`exclude_unset`: no `type` tags, no defaults, explicit nulls where a None was
passed); 0.18 and later dump every field with its default and drop the Nones
(`exclude_unset=False, exclude_none=True`). Answers are read the way the SDK's pydantic
models read them (strict response validation is on in every ServiceClient): required
fields present, types right (an int is a float, a str is not an int), Literals exact;
unknown fields ignored in response models, refused in StrictBase ones (TensorData).
"""
import datetime
import http.client as httpc
import json
import re
import struct
import time
import urllib.parse

import tinker_proto as tp

PROTO = "application/x-protobuf"


class SdkError(Exception):
    """What the SDK would raise; the message starts with the generation ("0.27: ...")."""


class HttpError(SdkError):
    """An error status from the route itself (the SDK's APIStatusError): .status, .detail
    (the JSON {"detail"} when there is one, else None), .route ("POST /api/v1/...")."""

    def __init__(self, msg, status, detail, route):
        super().__init__(msg)
        self.status, self.detail, self.route = status, detail, route


# ---- HTTP ---------------------------------------------------------------------------------
class Resp:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def header(self, name):
        return self.headers.get(name.lower())

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def __repr__(self):
        return f"HTTP {self.status} {self.body[:300]!r}"


def http(url, method, path, body=None, headers=(), timeout=60):
    """One request with headers as a list of (name, value): a name may repeat, as httpx
    sends it when a default and a call's header differ in case (0.16's archive URL)."""
    u = urllib.parse.urlsplit(url)
    conn = (httpc.HTTPSConnection if u.scheme == "https" else httpc.HTTPConnection)(
        u.hostname, u.port, timeout=timeout)
    try:
        conn.putrequest(method, (u.path.rstrip("/") + path) if u.path else path,
                        skip_accept_encoding=True)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        for k, v in headers:
            conn.putheader(k, v)
        if data is not None:
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        r = conn.getresponse()
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


# ---- request bodies -----------------------------------------------------------------------
REQUIRED = object()


class Model:
    """A pydantic request model of the SDK: its fields (in order) with their defaults."""

    def __init__(self, name, fields, type_tag=None):
        self.name, self.fields = name, list(fields)
        if type_tag:
            self.fields.append(("type", type_tag))

    def __call__(self, **passed):
        unknown = set(passed) - {f for f, _ in self.fields}
        assert not unknown, f"{self.name}: no fields {unknown}"
        return Inst(self, passed)


class Inst:
    def __init__(self, model, passed):
        self.model, self.passed = model, passed


def dump(v, style):
    """model_dump(mode="json") as the generation calls it: "unset" (0.16:
    exclude_unset=True) or "full" (0.18+: exclude_unset=False, exclude_none=True)."""
    if isinstance(v, Inst):
        out = {}
        for name, default in v.model.fields:
            if style == "unset":
                if name in v.passed:
                    out[name] = dump(v.passed[name], style)
            else:
                x = v.passed.get(name, default)
                assert x is not REQUIRED, f"{v.model.name}.{name} is required"
                if x is not None:
                    out[name] = dump(x, style)
        return out
    if isinstance(v, dict):
        return {k: dump(x, style) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [dump(x, style) for x in v]
    return v


EncodedTextChunk = Model("EncodedTextChunk", [("tokens", REQUIRED)], "encoded_text")
ModelInput = Model("ModelInput", [("chunks", REQUIRED)])
TensorData16 = Model("TensorData", [("data", REQUIRED), ("dtype", REQUIRED), ("shape", None)])
TensorData18 = Model("TensorData", [("data", REQUIRED), ("dtype", REQUIRED), ("shape", None),
                                    ("sparse_crow_indices", None), ("sparse_col_indices", None)])
Datum = Model("Datum", [("loss_fn_inputs", REQUIRED), ("model_input", REQUIRED)])
SamplingParams = Model("SamplingParams", [("max_tokens", None), ("seed", None), ("stop", None),
                                          ("temperature", 1), ("top_k", -1), ("top_p", 1)])
LoraConfig = Model("LoraConfig", [("rank", REQUIRED), ("seed", None), ("train_unembed", True),
                                  ("train_mlp", True), ("train_attn", True)])
AdamParams = Model("AdamParams", [("learning_rate", 0.0001), ("beta1", 0.9), ("beta2", 0.95), ("eps", 1e-12),
                                  ("weight_decay", 0.0), ("grad_clip_norm", 0.0)])


def _requests(gen):
    """The request models of one generation (fields as in its types/*.py)."""
    v = gen.v
    r = {}
    r["create_session"] = Model("CreateSessionRequest", [
        ("tags", REQUIRED), ("user_metadata", REQUIRED), ("sdk_version", REQUIRED), ("project_id", None)]
        # display_name: ServiceClient(display_name=...) (0.34+ docs); the wire name is the
        # constructor's (not published; SessionSummary.display_name carries it back)
        + ([("display_name", None)] if v >= (0, 34) else []), "create_session")
    r["create_model"] = Model("CreateModelRequest", [
        ("session_id", REQUIRED), ("model_seq_id", REQUIRED), ("base_model", REQUIRED), ("user_metadata", None),
        ("lora_config", None)] + ([("optimizer_config", None)] if v >= (0, 30) else []), "create_model")
    r["get_info"] = Model("GetInfoRequest", [("model_id", REQUIRED)], "get_info")
    r["fwdbwd"] = Model("ForwardBackwardRequest", [("forward_backward_input", REQUIRED), ("model_id", REQUIRED),
                                                   ("seq_id", None)])
    r["forward"] = Model("ForwardRequest", [("forward_input", REQUIRED), ("model_id", REQUIRED), ("seq_id", None)])
    r["fb_input"] = Model("ForwardBackwardInput", [("data", REQUIRED), ("loss_fn", REQUIRED),
                                                   ("loss_fn_config", None)])
    r["optim_step"] = Model("OptimStepRequest", [("adam_params", REQUIRED), ("model_id", REQUIRED),
                                                 ("seq_id", None)], "optim_step")
    r["save_weights"] = Model("SaveWeightsRequest", [
        ("model_id", REQUIRED), ("path", None), ("seq_id", None), ("ttl_seconds", None)]
        + ([("overwrite", False)] if v >= (0, 20) else [])
        + ([("user_metadata", None)] if v >= (0, 30) else []), "save_weights")
    r["save_for_sampler"] = Model("SaveWeightsForSamplerRequest", [
        ("model_id", REQUIRED), ("path", None), ("sampling_session_seq_id", None), ("seq_id", None),
        ("ttl_seconds", None)] + ([("user_metadata", None)] if v >= (0, 30) else []), "save_weights_for_sampler")
    r["load_weights"] = Model("LoadWeightsRequest", (
        [("model_id", REQUIRED), ("path", REQUIRED), ("seq_id", None), ("optimizer", REQUIRED)] if v < (0, 18) else
        [("model_id", None), ("seq_id", None), ("session_id", None), ("model_seq_id", None), ("base_model", None),
         ("user_metadata", None), ("path", REQUIRED), ("optimizer", REQUIRED)]
        + ([("optimizer_config", None)] if v >= (0, 30) else []) + [("weights_access_token", None)]),
        "load_weights")
    r["create_sampling_session"] = Model("CreateSamplingSessionRequest", [
        ("session_id", REQUIRED), ("sampling_session_seq_id", REQUIRED), ("base_model", None), ("model_path", None)],
        "create_sampling_session")
    sample = [("num_samples", 1), ("prompt", REQUIRED), ("sampling_params", REQUIRED), ("base_model", None),
              ("model_path", None), ("sampling_session_id", None), ("seq_id", None), ("prompt_logprobs", None),
              ("topk_prompt_logprobs", 0)]
    if v >= (0, 30):
        sample += [("topk_sample_logprobs", 0), ("target_prompt_logprobs", None), ("prompt_alt_tokens_k", 0)]
    if v >= (0, 33):
        sample += [("prompt_logprobs_last_n", None)]
    if v >= (0, 30):
        sample += [("record_stability_info", None)]
    r["sample"] = Model("SampleRequest", sample, "sample")
    r["retrieve_future"] = Model("FutureRetrieveRequest", [("request_id", REQUIRED), ("allow_metadata_only", False)])
    r["heartbeat"] = Model("SessionHeartbeatRequest", [("session_id", REQUIRED)], "session_heartbeat")
    r["client_config"] = Model("ClientConfigRequest", [("sdk_version", REQUIRED)])
    r["unload_model"] = Model("UnloadModelRequest", [("model_id", REQUIRED)], "unload_model")
    return r


# ---- reading answers the way the SDK's pydantic models do -----------------------------------
class Strict(dict):
    """A StrictBase model (extra="forbid"): an unknown key is an error."""


def may(t):
    """A field with a default: it may be absent (present, it must read as t)."""
    return ("may", t)


def opt(t):
    return ("opt", t)


def lst(t):
    return ("list", t)


def dict_of(t):
    return ("dict", t)


def lit(*values):
    return ("lit", values)


def tup(*types):
    return ("tuple", types)


def union(*types):
    return ("union", types)


STR_MAP = dict_of(str)
DATETIME = ("datetime",)
_ISO = re.compile(r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)?$")


def check(v, t, where="$"):
    """Problems reading v as t (pydantic's lax mode, with str never coerced); [] if it reads."""
    if isinstance(t, dict):
        if not isinstance(v, dict):
            return [f"{where}: expected an object, got {type(v).__name__}"]
        out = []
        for k, ft in t.items():
            absent_ok = isinstance(ft, tuple) and ft[0] == "may"
            if absent_ok:
                ft = ft[1]
            if k not in v:
                if not absent_ok:
                    out.append(f"{where}.{k}: required field missing")
                continue
            out += check(v[k], ft, f"{where}.{k}")
        if isinstance(t, Strict):
            out += [f"{where}.{k}: extra field not permitted" for k in v if k not in t]
        return out
    if t is str:
        return [] if isinstance(v, str) else [f"{where}: expected a string, got {v!r:.80}"]
    if t is bool:
        return [] if isinstance(v, bool) else [f"{where}: expected a bool, got {v!r:.80}"]
    if t is int:
        ok = (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
        return [] if ok else [f"{where}: expected an int, got {v!r:.80}"]
    if t is float:
        return [] if isinstance(v, (int, float)) and not isinstance(v, bool) else [f"{where}: expected a number, got {v!r:.80}"]
    if t == "any":
        return []
    kind = t[0]
    if kind == "opt":
        return [] if v is None else check(v, t[1], where)
    if kind == "list":
        if not isinstance(v, list):
            return [f"{where}: expected a list, got {v!r:.80}"]
        return [p for i, x in enumerate(v) for p in check(x, t[1], f"{where}[{i}]")]
    if kind == "dict":
        if not isinstance(v, dict):
            return [f"{where}: expected an object, got {v!r:.80}"]
        return [p for k, x in v.items() for p in check(x, t[1], f"{where}.{k}")]
    if kind == "tuple":
        if not isinstance(v, list) or len(v) != len(t[1]):
            return [f"{where}: expected a {len(t[1])}-tuple, got {v!r:.80}"]
        return [p for i, (x, tt) in enumerate(zip(v, t[1])) for p in check(x, tt, f"{where}[{i}]")]
    if kind == "lit":
        return [] if v in t[1] else [f"{where}: expected one of {t[1]}, got {v!r:.80}"]
    if kind == "union":
        tries = [check(v, u, where) for u in t[1]]
        return [] if any(not p for p in tries) else [f"{where}: matches no member: {tries}"]
    if kind == "datetime":
        ok = isinstance(v, str) and _ISO.match(v)
        if ok:
            try:
                datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
            except ValueError:
                ok = False
        return [] if ok else [f"{where}: expected an ISO 8601 datetime, got {v!r:.80}"]
    raise ValueError(t)


def _types(gen):
    """The response types of one generation ({name: spec})."""
    v = gen.v
    T = {}
    T["future"] = {"request_id": str, "model_id": may(opt(str))}
    if v >= (0, 27):
        T["future"]["sample_sequence_ids"] = may(opt(lst(str)))
    T["create_session"] = {"type": may(lit("create_session")), "info_message": may(opt(str)),
                           "warning_message": may(opt(str)), "error_message": may(opt(str)), "session_id": str}
    T["heartbeat"] = {"type": may(lit("session_heartbeat"))}
    T["client_config"] = {"pjwt_auth_enabled": may(bool), "use_pyqwest_transport": may(bool),
                          "parallel_fwdbwd_chunks": may(bool), "proto_compress_fwdbwd": may(bool),
                          "proto_write_fwdbwd": may(bool), "fwd_via_fwdbwd": may(bool),
                          "fwdbwd_max_chunk_len": may(int), "fwdbwd_max_chunk_bytes_count": may(int),
                          "sample_use_retrieve_futures": may(bool), "sample_join_sampling_session": may(bool),
                          "create_model_via_load_weights": may(bool), "sample_max_concurrent_requests": may(int)}
    T["dynamic_config"] = {"refresh_interval_sec": may(int), "sample_cancel_enabled": may(bool),
                           "sample_cancel_max_batch_size": may(int)}
    T["capabilities"] = {"supported_models": lst({"model_name": may(opt(str)), "max_context_length": may(opt(int))})}
    T["create_model"] = {"model_id": str, "type": may(lit("create_model"))}
    T["get_info"] = {"type": may(opt(lit("get_info"))), "model_id": str, "is_lora": may(opt(bool)),
                     "lora_rank": may(opt(int)), "model_name": may(opt(str)),
                     "model_data": {"arch": may(opt(str)), "model_name": may(opt(str)), "tokenizer_id": may(opt(str))}}
    tensor = Strict({"data": union(lst(int), lst(float)), "dtype": lit("int64", "float32"), "shape": may(opt(lst(int)))})
    if v >= (0, 18):
        tensor.update({"sparse_crow_indices": may(opt(lst(int))), "sparse_col_indices": may(opt(lst(int)))})
    T["tensor"] = tensor
    T["fb_output"] = {"loss_fn_output_type": str, "loss_fn_outputs": lst(dict_of(tensor)), "metrics": dict_of(float)}
    T["optim_step"] = {"metrics": may(opt(dict_of(float)))}
    T["save_weights"] = {"path": str, "type": may(opt(lit("save_weights")))}
    T["save_for_sampler"] = {"path": may(opt(str)), "sampling_session_id": may(opt(str)),
                             "type": may(opt(lit("save_weights_for_sampler")))}
    T["load_weights"] = {"path": may(opt(str)), "type": may(opt(lit("load_weights")))}
    if v >= (0, 24):
        T["load_weights"]["model_id"] = may(opt(str))
    T["sampling_session"] = {"type": may(lit("create_sampling_session")), "sampling_session_id": str}
    T["sample_json"] = {"sequences": lst({"stop_reason": lit("length", "stop"), "tokens": lst(int),
                                          "logprobs": may(opt(lst(float)))}),
                        "type": may(lit("sample")), "prompt_logprobs": may(opt(lst(opt(float)))),
                        "topk_prompt_logprobs": may(opt(lst(opt(lst(tup(int, float))))))}
    T["sampler"] = {"sampler_id": str, "base_model": str, "model_path": may(opt(str))}
    T["weights_info"] = {"base_model": str, "is_lora": bool, "lora_rank": may(opt(int)), "train_unembed": may(opt(bool)),
                         "train_mlp": may(opt(bool)), "train_attn": may(opt(bool))}
    kinds = ("training", "sampler", "external") if v >= (0, 28) else ("training", "sampler")
    ckpt = {"checkpoint_id": str, "checkpoint_type": lit(*kinds), "time": DATETIME, "tinker_path": str,
            "size_bytes": may(opt(int)), "public": may(bool), "expires_at": may(opt(DATETIME))}
    if v >= (0, 30):
        ckpt["user_metadata"] = may(opt(STR_MAP))
    if v >= (0, 39):
        ckpt["base_model"] = may(opt(str))
    T["checkpoint"] = ckpt
    T["cursor"] = {"offset": int, "limit": int, "total_count": int}
    T["checkpoints"] = {"checkpoints": lst(ckpt), "cursor": may(opt(T["cursor"]))}
    T["training_run"] = {"training_run_id": str, "base_model": str, "model_owner": str, "is_lora": bool,
                         "corrupted": may(bool), "lora_rank": may(opt(int)), "last_request_time": DATETIME,
                         "last_checkpoint": may(opt(ckpt)), "last_sampler_checkpoint": may(opt(ckpt)),
                         "user_metadata": may(opt(STR_MAP))}
    T["training_runs"] = {"training_runs": lst(T["training_run"]), "cursor": T["cursor"]}
    T["session"] = {"training_run_ids": lst(str), "sampler_ids": lst(str)}
    if v >= (0, 30):
        T["session"]["user_metadata"] = may(opt(STR_MAP))
    T["sessions"] = {"sessions": lst(str)}
    T["archive_url"] = {"url": str, "expires": DATETIME}
    # 0.26+ (futures.py retrieve_multi, future_completion.py at 6889e5e)
    T["futures_retrieve"] = {"completions": lst(union(
        {"state": lit("finished"), "request_id": str, "response_payload_uncompressed_size": may(opt(int))},
        {"state": lit("failed"), "request_id": str})), "cursor": int}
    T["join"] = {"type": may(lit("join_sampling_session")), "client_counter": int}
    T["copy_weights"] = {"tinker_path": str}
    T["save_external"] = {"path": may(opt(str)), "size_bytes": may(opt(int))}
    T["external_urls"] = {"urls": STR_MAP, "expires": DATETIME}
    T["storage_usage"] = {"effective_rate_usd_per_gigabyte_month": may(opt(float)), "data": lst({
        "project_id": may(opt(str)), "org_user_urn": may(opt(str)), "user_email": may(opt(str)),
        "user_name": may(opt(str)), "checkpoint_count": int, "size_bytes": int, "size_gigabytes": float,
        "estimated_monthly_cost_usd": may(opt(float))})}
    T["search_cursor"] = {"last_created_at": DATETIME, "last_checkpoint_uuid": str}
    T["search"] = {"checkpoints": lst(ckpt), "next_cursor": may(opt(T["search_cursor"]))}
    T["upload_start"] = {"upload_id": str, "urls": STR_MAP, "expires": DATETIME}
    T["upload_finish"] = {"tinker_path": str}
    T["any"] = "any"
    return T


# ---- protobuf results (ForwardBackwardOutput: tinker_proto; SampleResponse with 0.30 fields) --
def _f32(b):
    return list(struct.unpack(f"<{len(b) // 4}f", b))


def _i32(b):
    return list(struct.unpack(f"<{len(b) // 4}i", b))


def _topk(buf):
    """TopkLogprobs -> rows of [(id, lp)] (None where the row starts with the sentinel), or
    None when length or k is 0 (response_conv)."""
    ids = lps = b""
    k = n = 0
    for f, w, v in tp.fields(buf):
        if f == 1:
            ids = v
        elif f == 2:
            lps = v
        elif f == 3:
            k = v
        elif f == 4:
            n = v
    if not n or not k:
        return None
    ids, lps = _i32(ids), _f32(lps)
    if len(ids) != n * k or len(lps) != n * k:
        raise ValueError(f"TopkLogprobs of {n}x{k} with {len(ids)} ids and {len(lps)} logprobs")
    rows = []
    for i in range(n):
        cells = list(zip(ids[i * k:(i + 1) * k], lps[i * k:(i + 1) * k]))
        if cells[0] == (0, -99999.0):
            rows.append(None)
            continue
        while cells and cells[-1] == (0, -99999.0):
            cells.pop()
        rows.append(cells)
    return rows


def _tensor(buf):
    """A Tensor -> {"data", "dtype", "shape"} (+ the CSR indices when sparse)."""
    out, raw, dt, csr = {"shape": []}, b"", 0, None
    for f, w, v in tp.fields(buf):
        if f == 1:
            raw = v
        elif f == 2:
            csr = {}
            for f2, w2, v2 in tp.fields(v):
                csr[f2] = v2
        elif f == 3:
            dt = v
        elif f == 4:
            out["shape"] += [tp._signed64(x) for x in tp._varints(w, v)]
    fmt = {1: ("f", 4, "float32"), 2: ("q", 8, "int64"), 3: ("i", 4, "int64")}.get(dt)
    if fmt is None:
        raise ValueError(f"Unsupported proto dtype: {dt}")
    if csr is not None:
        raw = csr.get(1, b"")
        out["sparse_crow_indices"] = list(struct.unpack(f"<{len(csr.get(2, b'')) // 8}q", csr.get(2, b"")))
        out["sparse_col_indices"] = list(struct.unpack(f"<{len(csr.get(3, b'')) // 8}q", csr.get(3, b"")))
    out["data"] = list(struct.unpack(f"<{len(raw) // fmt[1]}{fmt[0]}", raw))
    out["dtype"] = fmt[2]
    return out


def decode_sample_response(buf, v):
    """SampleResponse as response_conv builds it (0.25; with v >= 0.30 also the sampled
    top-k, target_prompt_logprobs and prompt_alt_tokens)."""
    out = {"sequences": [], "prompt_logprobs": None, "topk_prompt_logprobs": None, "prompt_cache_hit_tokens": 0,
           "target_prompt_logprobs": None, "prompt_alt_tokens": None}
    for f, w, val in tp.fields(buf):
        if f == 1:
            seq = {"stop_reason": "stop", "tokens": [], "logprobs": None, "topk_logprobs": None}
            for f2, w2, v2 in tp.fields(val):
                if f2 == 1:
                    if v2 not in (0, 1):
                        raise ValueError(f"Unknown stop_reason enum value {v2} in proto SampleResponse")
                    seq["stop_reason"] = "length" if v2 == 1 else "stop"
                elif f2 == 2:
                    seq["tokens"] = _i32(v2)
                elif f2 == 3:
                    seq["logprobs"] = _f32(v2) if v2 else None
                elif f2 == 4 and v >= (0, 29):
                    seq["topk_logprobs"] = _topk(v2)
            out["sequences"].append(seq)
        elif f == 2:
            out["prompt_logprobs"] = [None if x != x else x for x in _f32(val)] if val else None
        elif f == 3:
            out["topk_prompt_logprobs"] = _topk(val)
        elif f == 4:
            out["prompt_cache_hit_tokens"] = val
        elif f == 5 and v >= (0, 30):
            out["target_prompt_logprobs"] = _tensor(val)
        elif f == 6 and v >= (0, 30):
            alt = {}
            for f2, w2, v2 in tp.fields(val):
                alt["tokens" if f2 == 1 else "logprobs"] = _tensor(v2)
            out["prompt_alt_tokens"] = alt
    return out


def provenance_span(sequence_id, offset, length):
    """Datum.model_input_spans entry (0.30+ proto): ProvenanceSpan{sampled_tokens}."""
    return tp.f_bytes(2, tp.f_str(1, sequence_id) + tp.f_varint(2, offset) + tp.f_varint(3, length))


# ---- the generations ----------------------------------------------------------------------
class Gen:
    def __init__(self, name, version, source, **kw):
        self.name, self.version, self.source = name, version, source
        self.v = tuple(int(x) for x in version.split(".")[:2])
        v = self.v
        # bootstrap: client/config from 0.18, client/dynamic_config from 0.25
        self.client_config = v >= (0, 18)
        self.dynamic_config = v >= (0, 25)
        self.style = "unset" if v < (0, 18) else "full"
        # forward_backward: JSON until 0.24 (protobuf with the proto_write_fwdbwd flag from
        # 0.19), always protobuf from 0.25; forward via forward_backward(forward_only) when
        # fwd_via_fwdbwd and proto_write_fwdbwd (0.22.3+), always from 0.25
        self.proto_always = v >= (0, 25)
        self.proto_flag = v >= (0, 19)
        # chunking: 1024 datums / 5 MB constants until 0.24, client/config values from 0.25;
        # chunks in parallel with the first one last from 0.18.2 (parallel_fwdbwd_chunks)
        self.chunk_from_config = v >= (0, 25)
        self.parallel_chunks = v >= (0, 19)
        # retrieve_future of ForwardBackwardOutput / SampleResponse: JSON only (0.16, 0.18.0),
        # "protobuf, json" (0.18.1 - 0.24), protobuf only and JSON refused (0.25+)
        self.accept = (None if v < (0, 19) else
                       PROTO + ", application/json" if v < (0, 25) else PROTO)
        self.json_results_refused = v >= (0, 25)
        self.needs_sample_ids = v >= (0, 27)
        self.flags = v >= (0, 26)            # sample_use_retrieve_futures, cancel, join
        self.optimizer_families = v >= (0, 30)
        self.new_sampling = v >= (0, 30)     # topk_sample_logprobs, target_prompt_logprobs, prompt_alt_tokens_k
        self.last_n = v >= (0, 33)           # prompt_logprobs_last_n
        self.close = v >= (0, 29)            # ServiceClient.close -> sessions/{id}/finish
        # get_checkpoint_archive_url: the client's default Accept: application/json plus the
        # call's accept: application/gzip (0.16 - 0.22.1) or application/json, one request with
        # both; follow_redirects off. Until 0.22.1 only a 302 is understood.
        self.archive_accepts = ["application/json", "application/gzip" if v < (0, 22) else "application/json"]
        self.archive_needs_302 = v < (0, 22)
        self.__dict__.update(kw)
        self.requests = _requests(self)
        self.types = _types(self)

    def __repr__(self):
        return f"SDK {self.version}"


GEN_LIST = [
    Gen("0.16", "0.16.1", "SDK source 0.16.1 (07bd3c2)"),
    Gen("0.18", "0.18.0", "SDK source 0.18.0 (30517b6)"),
    Gen("0.24", "0.24.1", "SDK source 0.24.1 (6b02536)"),
    Gen("0.25", "0.25.0", "SDK source 0.25.0 (d595dc2)"),
    Gen("0.27", "0.27.1", "0.25 source + 0.26.2 files; ids required per SkyRL / tinker-cloud tests"),
    Gen("0.30", "0.30.4", "optimizer.py 0.30.4, optim_step_request.py, sample_request/proto ~0.30, 0.32 clients"),
    Gen("0.33", "0.33.1", "modelled: 0.32 source + tinker-cloud tests for the 0.33 SDK"),
    Gen("0.38", "0.38.0", "modelled: 0.32 source + docs type reference 0.34-0.39"),
]
GENS = {g.name: g for g in GEN_LIST}


# ---- a client of one generation -------------------------------------------------------------
class Client:
    """One ServiceClient of generation `gen` against `stack` (a tests/lib/stack.py Stack, or
    anything with .url and .key). Methods are the SDK's; answers are read as it reads them."""

    def __init__(self, stack, gen, user_metadata=None, project_id=None, display_name=None, key=None):
        self.s, self.g, self.key = stack, gen, key or stack.key
        self.R, self.T = gen.requests, gen.types
        self.config, self.dyn = {}, {}
        self.model_seq = self.sampler_seq = 0
        self.req = {}            # model_id -> next request id (the SDK's _request_id_counter)
        self.sample_seq = {}     # (sampling_session_id, clone) -> next seq_id
        self.cursor = {}         # sampling_session_id -> retrieve_futures cursor
        self.log = []            # (method, path, body) of every request, for the tests
        if gen.client_config:
            self.config = self.parse(self.post("/api/v1/client/config", self.body(
                "client_config", sdk_version=gen.version), auth=False), "client_config", "client/config")
        body = dict(tags=[], user_metadata=user_metadata or {}, sdk_version=gen.version, project_id=project_id)
        if display_name is not None:
            body["display_name"] = display_name
        sess = self.parse(self.post("/api/v1/create_session", self.body("create_session", **body)),
                          "create_session", "create_session")
        self.session_id = sess["session_id"]
        if gen.dynamic_config:
            self.dyn = self.parse(self.post("/api/v1/client/dynamic_config", {}), "dynamic_config",
                                  "client/dynamic_config")
        self.heartbeat()

    # -- transport --
    def headers(self, extra=(), content_type="application/json"):
        h = [("Accept", "application/json"), ("Content-Type", content_type),
             ("User-Agent", f"AsyncTinker/Python {self.g.version}"),
             ("X-Stainless-Package-Version", self.g.version), ("X-Stainless-OS", "Linux"),
             ("X-Stainless-Arch", "x64"), ("X-Stainless-Runtime", "CPython"),
             ("X-Stainless-Runtime-Version", "3.12.3"), ("X-Stainless-Async", "async:asyncio"),
             ("x-stainless-retry-count", "0"), ("x-stainless-read-timeout", "60.0")]
        names = {k.lower() for k, _ in extra}
        h = [(k, v) for k, v in h if k.lower() not in names]   # the call's header replaces the default
        return h + list(extra)

    def request(self, method, path, body=None, extra=(), auth=True, content_type="application/json"):
        h = self.headers(extra, content_type)
        if auth:
            h.append(("X-API-Key", self.key))
        self.log.append((method, path, body))
        return http(self.s.url, method, path, body, h)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def body(self, kind, **passed):
        return dump(self.R[kind](**passed), self.g.style)

    def fail(self, what):
        raise SdkError(f"{self.g.name}: {what}")

    def http_error(self, r, what):
        j = r.json()
        detail = j.get("detail") if isinstance(j, dict) and isinstance(j.get("detail"), str) else None
        method, path, _ = self.log[-1] if self.log else ("?", "?", None)
        raise HttpError(f"{self.g.name}: {what}: HTTP {r.status} {r.body[:300]!r}", r.status, detail,
                        f"{method} {path}")

    def parse(self, r, tname, what):
        """A direct answer: 2xx and readable as the type (else what the SDK raises)."""
        if not 200 <= r.status < 300:
            self.http_error(r, what)
        v = r.json()
        problems = check(v, self.T[tname])
        if problems:
            self.fail(f"{what}: the answer does not read as {tname}: {problems[:4]}")
        return v

    # -- futures --
    def submit(self, path, body, what, **kw):
        r = self.post(path, body, **kw)
        return self.parse(r, "future", what)

    def result(self, fut, tname, what, proto_kind=None):
        """retrieve_future until done, as api_future_impl does for this generation."""
        accept = self.g.accept if proto_kind else None
        extra = [("X-Tinker-Request-Iteration", "0"), ("X-Tinker-Request-Type", what)]
        if accept:
            extra.append(("Accept", accept))
        body = self.body("retrieve_future", request_id=fut["request_id"], allow_metadata_only=True)
        deadline = time.time() + 180
        while time.time() < deadline:
            r = self.post("/api/v1/retrieve_future", body, extra=extra)
            if r.status == 408 or r.status >= 500:
                continue
            if r.status != 200:
                self.http_error(r, f"{what}: retrieve_future")
            if PROTO in (r.header("content-type") or ""):
                if not proto_kind:
                    self.fail(f"{what}: protobuf answer to a client that did not accept it")
                try:
                    return (tp.decode_fwdbwd_output(r.body) if proto_kind == "fb"
                            else decode_sample_response(r.body, self.g.v))
                except Exception as e:  # noqa: BLE001 - the SDK wraps any decode error
                    self.fail(f"{what}: Proto deserialization failed: {e}")
            v = r.json()
            if not isinstance(v, dict):
                self.fail(f"{what}: retrieve_future answered {r.body[:200]!r}")
            if v.get("type") == "try_again":
                continue
            if "error" in v:
                self.fail(f"{what}: RequestFailedError: {v['error']} (category {v.get('category')})")
            if proto_kind and self.g.json_results_refused:
                self.fail(f"{what}: Server returned a JSON payload for {tname}, which this SDK version "
                          "only supports as proto")
            problems = check(v, self.T[tname])
            if problems:
                self.fail(f"{what}: the result does not read as {tname}: {problems[:4]}")
            return v
        self.fail(f"{what}: no result within 180 s")

    # -- ServiceClient --
    def heartbeat(self):
        return self.parse(self.post("/api/v1/session_heartbeat", self.body("heartbeat", session_id=self.session_id)),
                          "heartbeat", "session_heartbeat")

    def get_server_capabilities(self):
        return self.parse(self.get("/api/v1/get_server_capabilities"), "capabilities", "get_server_capabilities")

    def create_lora_training_client(self, base_model, rank=32, seed=None, user_metadata=None, optimizer=None,
                                    train_mlp=True, train_attn=True, train_unembed=True):
        lora = LoraConfig(rank=rank, seed=seed, train_unembed=train_unembed, train_mlp=train_mlp,
                          train_attn=train_attn)
        passed = dict(session_id=self.session_id, model_seq_id=self.model_seq, base_model=base_model,
                      lora_config=lora, user_metadata=user_metadata)
        if optimizer is not None:
            if not self.g.optimizer_families:
                raise ValueError(f"{self.g.name} has no optimizer argument")
            passed["optimizer_config"] = optimizer
        self.model_seq += 1
        fut = self.submit("/api/v1/create_model", self.body("create_model", **passed), "create_model")
        res = self.result(fut, "create_model", "create_model")
        self.req[res["model_id"]] = 0
        return res["model_id"]

    def create_sampling_client(self, model_path=None, base_model=None):
        seq = self.sampler_seq
        self.sampler_seq += 1
        res = self.parse(self.post("/api/v1/create_sampling_session", self.body(
            "create_sampling_session", session_id=self.session_id, sampling_session_seq_id=seq,
            model_path=model_path, base_model=base_model)), "sampling_session", "create_sampling_session")
        return res["sampling_session_id"]

    def close(self, status="success", detail=None):
        """ServiceClient.close (0.29.1+): the SDK casts the answer to None (any 2xx)."""
        r = self.post(f"/api/v1/sessions/{self.session_id}/finish", {"reason": {"type": status}, "detail": detail})
        if not 200 <= r.status < 300:
            self.http_error(r, "close: sessions/{id}/finish")
        return r

    # -- TrainingClient --
    def _next(self, model_id):
        rid = self.req[model_id]
        self.req[model_id] += 1
        return rid

    def _json_datum(self, tokens, inputs):
        td = TensorData16 if self.g.v < (0, 18) else TensorData18
        li = {}
        for name, spec in inputs.items():
            dtype, values = spec[0], spec[1]
            shape = spec[2] if len(spec) > 2 else [len(values)]
            li[name] = td(data=values, dtype=dtype, shape=shape)
        return Datum(model_input=ModelInput(chunks=[EncodedTextChunk(tokens=list(tokens))]), loss_fn_inputs=li)

    def _chunks(self, indexed):
        """_chunked_requests_generator: split by datum count and estimated bytes."""
        if self.g.chunk_from_config:
            n_max = self.config.get("fwdbwd_max_chunk_len", 1024)
            b_max = self.config.get("fwdbwd_max_chunk_bytes_count", 5_000_000)
        else:
            n_max, b_max = 1024, 5_000_000
        out, cur, cur_b = [], [], 0
        for d in indexed:
            tokens, inputs = d[1]
            b = 4 * len(tokens) + sum(len(s[1]) * (8 if s[0] == "int64" else 4) for s in inputs.values())
            if cur and (cur_b + b > b_max or len(cur) == n_max):
                out.append(cur)
                cur, cur_b = [], 0
            cur.append(d)
            cur_b += b
        if cur:
            out.append(cur)
        return out

    def _fwd(self, model_id, data, loss_fn, loss_fn_config, forward_only, spans=None):
        """forward / forward_backward: chunks, each its own seq_id, sent in order or (parallel
        chunks, 0.18.2+) the first one last; the per-chunk results concatenated (loss:sum added).
        spans: per datum, [(sequence_id, offset, length)] sent as model_input_spans (0.30+ proto)."""
        g, cfg = self.g, self.config
        proto = g.proto_always or (g.proto_flag and bool(cfg.get("proto_write_fwdbwd")))
        if forward_only and not g.proto_always:
            # 0.22.3 - 0.24: forward rides forward_backward only with both flags on
            proto = proto and g.v >= (0, 22) and bool(cfg.get("fwd_via_fwdbwd"))
        indexed = list(enumerate(data))
        chunks = self._chunks(indexed)
        subs = [(self._next(model_id) + 1, c) for c in chunks]
        what = "forward" if forward_only else "forward_backward"
        parallel = g.parallel_chunks and cfg.get("parallel_fwdbwd_chunks", True) and len(subs) > 1
        futs = {}
        for seq, chunk in (subs[1:] + subs[:1] if parallel else subs):
            if proto:
                datums = []
                for i, (tokens, inputs) in chunk:
                    d = tp.datum(tokens, {k: tuple(s) for k, s in inputs.items()})
                    for sp in (spans[i] if spans and g.v >= (0, 30) else []):
                        d += tp.f_bytes(3, provenance_span(*sp))
                    datums.append(d)
                body = tp.fwdbwd_request(model_id, seq, datums, loss_fn, loss_fn_config, forward_only)
                futs[seq] = self.submit("/api/v1/forward_backward", body, what, content_type=PROTO)
                continue
            inp = self.R["fb_input"](data=[self._json_datum(*d) for _, d in chunk], loss_fn=loss_fn,
                                     loss_fn_config=loss_fn_config)
            if forward_only:
                body = self.body("forward", forward_input=inp, model_id=model_id, seq_id=seq)
                futs[seq] = self.submit("/api/v1/forward", body, what)
            else:
                body = self.body("fwdbwd", forward_backward_input=inp, model_id=model_id, seq_id=seq)
                futs[seq] = self.submit("/api/v1/forward_backward", body, what)
        outs = [self.result(futs[seq], "fb_output", what, proto_kind="fb") for seq, _ in subs]
        combined = {"loss_fn_output_type": outs[0]["loss_fn_output_type"], "loss_fn_outputs": [], "metrics": {},
                    "chunks": len(subs)}
        for o in outs:
            combined["loss_fn_outputs"] += o["loss_fn_outputs"]
            for k, x in o["metrics"].items():
                combined["metrics"][k] = combined["metrics"].get(k, 0.0) + x if k.endswith(":sum") else x
        if len(combined["loss_fn_outputs"]) != len(data):
            self.fail(f"{what}: {len(combined['loss_fn_outputs'])} outputs for {len(data)} datums")
        return combined

    def forward_backward(self, model_id, data, loss_fn, loss_fn_config=None, spans=None):
        """data: [(tokens, {name: (dtype, values[, shape])})]."""
        return self._fwd(model_id, data, loss_fn, loss_fn_config, False, spans)

    def forward(self, model_id, data, loss_fn="cross_entropy", loss_fn_config=None):
        return self._fwd(model_id, data, loss_fn, loss_fn_config, True)

    def optim_step(self, model_id, learning_rate, **adam):
        """optim_step(AdamParams(...)): the wire key is adam_params in every generation (0.30+
        serialises its optim_params field under adam_params for Adam, optimizer_params otherwise)."""
        params = AdamParams(learning_rate=learning_rate, **adam)
        body = self.body("optim_step", adam_params=params, model_id=model_id, seq_id=self._next(model_id) + 1)
        return self.result(self.submit("/api/v1/optim_step", body, "optim_step"), "optim_step", "optim_step")

    def optim_step_params(self, model_id, params):
        """optim_step(DimuonParams(...)) and other families (0.30+): optimizer_params {"type": ...}."""
        body = dump(self.R["optim_step"](adam_params=None, model_id=model_id, seq_id=self._next(model_id) + 1),
                    "full")
        body.pop("adam_params", None)
        body["optimizer_params"] = params
        return self.post("/api/v1/optim_step", body)

    def save_state(self, model_id, name, ttl_seconds=None, user_metadata=None, overwrite=False):
        p = dict(model_id=model_id, path=name, seq_id=self._next(model_id) + 1, ttl_seconds=ttl_seconds)
        if self.g.v >= (0, 20):
            p["overwrite"] = overwrite
        if self.g.v >= (0, 30):
            p["user_metadata"] = user_metadata
        fut = self.submit("/api/v1/save_weights", self.body("save_weights", **p), "save_state")
        return self.result(fut, "save_weights", "save_state")["path"]

    def load_state(self, model_id, path, optimizer=False):
        p = dict(model_id=model_id, path=path, seq_id=self._next(model_id) + 1, optimizer=optimizer)
        if self.g.v >= (0, 18):
            p["weights_access_token"] = None
        fut = self.submit("/api/v1/load_weights", self.body("load_weights", **p), "load_state")
        return self.result(fut, "load_weights", "load_state")

    def save_weights_for_sampler(self, model_id, name, ttl_seconds=None, user_metadata=None):
        p = dict(model_id=model_id, path=name, seq_id=self._next(model_id) + 1, ttl_seconds=ttl_seconds)
        if self.g.v >= (0, 30):
            p["user_metadata"] = user_metadata
        fut = self.submit("/api/v1/save_weights_for_sampler", self.body("save_for_sampler", **p),
                          "save_weights_for_sampler")
        res = self.result(fut, "save_for_sampler", "save_weights_for_sampler")
        if not isinstance(res.get("path"), str):   # SaveWeightsForSamplerResponse(path=result.path)
            self.fail(f"save_weights_for_sampler: the result has no path: {res}")
        return res["path"]

    def save_weights_and_get_sampling_client(self, model_id):
        seq = self.sampler_seq
        self.sampler_seq += 1
        p = dict(model_id=model_id, seq_id=self._next(model_id) + 1, sampling_session_seq_id=seq, ttl_seconds=None)
        if self.g.v >= (0, 30):
            p["user_metadata"] = None
        fut = self.submit("/api/v1/save_weights_for_sampler", self.body("save_for_sampler", **p),
                          "save_weights_and_get_sampling_client")
        res = self.result(fut, "save_for_sampler", "save_weights_and_get_sampling_client")
        if not isinstance(res.get("sampling_session_id"), str):
            self.fail(f"save_weights_and_get_sampling_client: no sampling_session_id in {res}")
        return res["sampling_session_id"]

    def get_info(self, model_id):
        return self.parse(self.post("/api/v1/get_info", self.body("get_info", model_id=model_id)), "get_info",
                          "get_info")

    # -- SamplingClient --
    def sample_submit(self, sampling_session_id, prompt, num_samples, sampling_params, seq_id=None, **fields):
        """The asample submit alone: (http answer, body sent)."""
        if seq_id is None:
            seq_id = self.sample_seq.get((sampling_session_id, 0), 0)
            self.sample_seq[(sampling_session_id, 0)] = seq_id + 1
        p = dict(sampling_session_id=sampling_session_id, seq_id=seq_id, num_samples=num_samples,
                 prompt=ModelInput(chunks=[EncodedTextChunk(tokens=list(prompt))]),
                 sampling_params=SamplingParams(**sampling_params),
                 prompt_logprobs=fields.pop("prompt_logprobs", False),
                 topk_prompt_logprobs=fields.pop("topk_prompt_logprobs", 0))
        if self.g.new_sampling:
            p.update(topk_sample_logprobs=0, target_prompt_logprobs=None, prompt_alt_tokens_k=0,
                     record_stability_info=False)
        p.update(fields)
        body = self.body("sample", **p)
        return self.post("/api/v1/asample", body, extra=[("X-Tinker-Sampling-Backpressure", "1")]), body

    def sample(self, sampling_session_id, prompt, num_samples, sampling_params, cloned_sampler_id=0, **fields):
        """SamplingClient.sample(...).result(): submit (429 -> back off and resubmit the same
        seq_id), wait (retrieve_futures when client/config says so), fetch, parse, and from
        0.27 stamp the submission's sample_sequence_ids onto the sequences. A clone
        (cloned_sampler_id n) numbers its samples from n * 10^9."""
        seq_id = self.sample_seq.get((sampling_session_id, cloned_sampler_id), cloned_sampler_id * 10 ** 9)
        self.sample_seq[(sampling_session_id, cloned_sampler_id)] = seq_id + 1
        for _ in range(60):
            r, body = self.sample_submit(sampling_session_id, prompt, num_samples, sampling_params,
                                         seq_id=seq_id, **dict(fields))
            if r.status != 429:
                break
            time.sleep(1)
        fut = self.parse(r, "future", "asample")
        if self.g.flags and self.config.get("sample_use_retrieve_futures"):
            self.wait_via_retrieve_futures(sampling_session_id, fut["request_id"], cloned_sampler_id)
        res = self.result(fut, "sample_json", "sample", proto_kind="sample")
        if self.g.needs_sample_ids:
            ids = fut.get("sample_sequence_ids")
            if ids is None:
                self.fail("asample answer has no sample_sequence_ids (AssertionError: asample promises always "
                          "carry sample_sequence_ids)")
            if len(ids) != len(res["sequences"]):
                self.fail(f"asample answer has {len(ids)} sample_sequence_ids for {len(res['sequences'])} sequences")
            for s, i in zip(res["sequences"], ids):
                s["sequence_id"] = i
        if self.g.new_sampling and fields.get("prompt_alt_tokens_k", 0) > 0 and res.get("prompt_alt_tokens") is None:
            self.fail(f"prompt_alt_tokens_k={fields['prompt_alt_tokens_k']} was requested but the server returned "
                      "no prompt_alt_tokens; it may predate this feature")
        res["_future"] = fut
        return res

    def wait_via_retrieve_futures(self, sampling_session_id, request_id, cloned_sampler_id=0):
        """SessionFuturesPoller: long-poll retrieve_futures from the session's cursor until
        request_id is reported (finished or failed)."""
        key = (sampling_session_id, cloned_sampler_id)
        deadline = time.time() + 120
        while time.time() < deadline:
            body = {"target": {"type": "sampling_session", "sampling_session_id": sampling_session_id,
                               "cloned_sampler_id": cloned_sampler_id}, "prev_cursor": self.cursor.get(key, 0)}
            res = self.parse(self.post("/api/v1/retrieve_futures", body), "futures_retrieve", "retrieve_futures")
            self.cursor[key] = res["cursor"]
            for c in res["completions"]:
                if c["request_id"] == request_id:
                    return c
        self.fail(f"retrieve_futures never reported {request_id}")

    def compute_logprobs(self, sampling_session_id, prompt, **fields):
        res = self.sample(sampling_session_id, prompt, 1, {"max_tokens": 1}, prompt_logprobs=True, **fields)
        return res["prompt_logprobs"]

    def get_sampler(self, sampling_session_id):
        return self.parse(self.get(f"/api/v1/samplers/{sampling_session_id}"), "sampler", "get_sampler")

    def join_sampling_session(self, sampling_session_id):
        """A shadow SamplingClient's first step when client/config says
        sample_join_sampling_session (0.32 sampling_client._join_sampling_session)."""
        return self.parse(self.post("/api/v1/join_sampling_session", {
            "sampling_session_id": sampling_session_id, "type": "join_sampling_session"}), "join",
            "join_sampling_session")

    def cancel_future(self, request_id):
        """What a 0.26+ SDK told sample_cancel_enabled sends for an abandoned sample (the
        body as GMI tinker-cloud's tests send it; the SDK's own request type is unpublished)."""
        r = self.post("/api/v1/cancel_future", {"request_id": request_id})
        if not 200 <= r.status < 300:
            self.http_error(r, "cancel_future")
        return r

    # -- ServiceClient / TrainingClient, 0.26+ --
    def copy_weights(self, source_path, ttl_seconds=None):
        seq = self.model_seq
        self.model_seq += 1
        body = dump(Model("CopyWeightsRequest", [("session_id", REQUIRED), ("model_seq_id", REQUIRED),
                                                  ("source_path", REQUIRED), ("ttl_seconds", None),
                                                  ("weights_access_token", None)])(
            session_id=self.session_id, model_seq_id=seq, source_path=source_path, ttl_seconds=ttl_seconds), "full")
        return self.parse(self.post("/api/v1/copy_weights", body), "copy_weights", "copy_weights")["tinker_path"]

    def save_weights_external(self, model_id, name, ttl_seconds=None):
        body = dump(Model("SaveWeightsExternalRequest", [("model_id", REQUIRED), ("path", REQUIRED),
                                                          ("seq_id", None), ("ttl_seconds", None)])(
            model_id=model_id, path=name, seq_id=self._next(model_id) + 1, ttl_seconds=ttl_seconds), "full")
        fut = self.submit("/api/v1/save_weights_external", body, "save_weights_external")
        res = self.result(fut, "save_external", "save_weights_external")
        if not isinstance(res.get("path"), str):
            self.fail(f"save_weights_external: the result has no path: {res}")
        return res["path"]

    def weights_info(self, tinker_path):
        return self.parse(self.post("/api/v1/weights_info", {"tinker_path": tinker_path}), "weights_info",
                          "get_weights_info_by_tinker_path")

    # -- RestClient --
    def rest(self, method, path, tname, what, body=None, extra=()):
        return self.parse(self.request(method, path, body, extra=extra), tname, what)

    def rest_none(self, method, path, what, body=None):
        """A RestClient call whose answer the SDK casts to None: any 2xx."""
        r = self.request(method, path, body)
        if not 200 <= r.status < 300:
            self.http_error(r, what)
        return r

    def get_checkpoint_archive_url(self, run, checkpoint_id, query=""):
        """weights.get_checkpoint_archive_url: two Accept headers, no redirects followed;
        0.16 - 0.22.1 accept only the 302 (a 200 raises), later ones either."""
        path = f"/api/v1/training_runs/{run}/checkpoints/{checkpoint_id}/archive{query}"
        # the client's default "Accept" and the call's "accept": httpx keeps both
        h = self.headers() + [("accept", self.g.archive_accepts[1]), ("X-API-Key", self.key)]
        self.log.append(("GET", path, None))
        r = http(self.s.url, "GET", path, None, h)
        if r.status == 302:
            loc = r.header("location")
            if not loc:
                self.fail("get_checkpoint_archive_url: 302 without Location")
            return {"url": loc, "expires": r.header("expires")}
        if r.status == 200 and self.g.archive_needs_302:
            self.fail("get_checkpoint_archive_url: 200 answer, but this SDK takes only the 302 redirect "
                      "(TypeError: API Response types must subclass AsyncAPIResponse)")
        return self.parse(r, "archive_url", "get_checkpoint_archive_url")

