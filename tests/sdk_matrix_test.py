"""The compatibility matrix of the newest Tinker SDK surface (0.38 / 0.39): one row per
public method of ServiceClient, TrainingClient, SamplingClient and RestClient (an
`_async` twin shares its sync method's row), plus rows for the arguments that change what
goes on the wire (an optimizer family, the sampling knobs). The method lists are the
SDK 0.32.0 API reference (docs/api/*.md and sampling_client.py of
github.com/thinking-machines-lab/tinker at 958ce1d) with what the docs site's type
reference for 0.34 - 0.39 adds (RestClient.search_checkpoints,
external_weights_upload_start / _finish; ServiceClient(display_name=...)); requests are
sent as tests/lib/sdk_gen.py's 0.38 generation sends them and answers read as its types.

Each row ends in one of:
  supported  the call went over the wire and its answer read as the SDK's type, with the
             row's checks on what it means (a loss restored, ids distinct, ...);
  refused    the row's own route answered a 4xx with a JSON {"detail"} (never 408/409/429,
             which the SDK retries; never a 5xx, which it retries for minutes) naming what
             is refused, and README.md lists that route as missing: in its section whose
             heading says "Not implemented" (or "missing"), or a table row whose first
             cell says so;
  client     the method sends no request (SDK source cited in the row);
and the test fails for a row that is none of them (a 5xx, a 404 nobody documented, an
answer the SDK cannot parse, a check that does not hold). The matrix is printed at the
end as a Markdown table (method | route | result) and is the closing note of issue 19.
Prints "N passed, N failed" last.

Not from the SDK's own source (no copy after 0.32 was reachable): the route of
search_checkpoints (POST /api/v1/checkpoints/search is Loom's choice; the SDK's is
unpublished), the body of cancel_future ({"request_id"}, as GMI tinker-cloud's tests send
it) and the wire name of display_name in create_session.
"""
import io
import json
import os
import random
import re
import sys
import tarfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from sdk_gen import GENS, Client, HttpError, LoraConfig, SdkError  # noqa: E402
from stack import Results, Stack  # noqa: E402

R = Results()
G = GENS["0.38"]
README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")
SEQS = [[(5 * i + 7 * j) % 250 + 1 for j in range(12)] for i in range(3)]
PROMPT = [9, 21, 40, 3, 77, 12]

# The public methods the rows must cover (0.32.0 API reference + 0.34-0.39 docs).
METHODS = {
    "ServiceClient": ["__init__", "get_server_capabilities", "create_lora_training_client", "copy_weights",
                      "create_training_client_from_state", "create_training_client_from_state_with_optimizer",
                      "create_sampling_client", "create_rest_client", "get_console_url", "holder", "close"],
    "TrainingClient": ["forward", "forward_backward", "forward_backward_custom", "optim_step", "save_state",
                       "load_state", "load_state_with_optimizer", "save_weights_for_sampler",
                       "save_weights_external", "get_info", "get_tokenizer", "create_sampling_client",
                       "save_weights_and_get_sampling_client", "get_console_url", "get_telemetry"],
    "SamplingClient": ["sample", "compute_logprobs", "get_tokenizer", "get_base_model", "get_sampler_handle",
                       "from_sampler_handle", "get_telemetry"],
    "RestClient": ["get_training_run", "get_training_run_by_tinker_path", "get_weights_info_by_tinker_path",
                   "list_training_runs", "list_checkpoints", "get_checkpoint_archive_url",
                   "get_checkpoint_archive_url_from_tinker_path", "get_external_weights_urls", "delete_checkpoint",
                   "delete_checkpoint_from_tinker_path", "get_audit_log", "publish_checkpoint_from_tinker_path",
                   "unpublish_checkpoint_from_tinker_path", "set_checkpoint_ttl_from_tinker_path",
                   "list_user_checkpoints", "get_session", "list_sessions", "search_sessions", "assign_session_project",
                   "export_session_trace", "whoami", "get_sampler", "get_billing_usage",
                   "get_current_checkpoint_storage_usage", "search_checkpoints", "external_weights_upload_start",
                   "external_weights_upload_finish"],
}
# Methods without an _async twin in the 0.32 reference (the rest have one).
NO_TWIN = {"ServiceClient.__init__", "ServiceClient.create_rest_client", "ServiceClient.get_console_url",
           "ServiceClient.holder", "ServiceClient.close", "TrainingClient.get_tokenizer",
           "TrainingClient.get_console_url", "TrainingClient.get_telemetry", "SamplingClient.get_tokenizer",
           "SamplingClient.get_sampler_handle", "SamplingClient.from_sampler_handle",
           "SamplingClient.get_telemetry", "RestClient.whoami", "RestClient.search_checkpoints",
           "RestClient.search_sessions",
           "RestClient.external_weights_upload_start", "RestClient.external_weights_upload_finish",
           "RestClient.get_weights_info_by_tinker_path"}


class Row:
    def __init__(self, cls, methods, route, fn, label=None, readme=None, names=(), client=None, refuse_only=False):
        self.cls, self.methods, self.route, self.fn = cls, methods, route, fn
        self.label = label or " / ".join(methods)
        self.readme = readme            # how README.md names the route when it is missing
        self.names = names              # words a refusal's detail must contain
        self.client = client            # no request: why (SDK source)
        self.refuse_only = refuse_only  # a row that can only be refused (an unimplementable family)
        self.result = None


ROWS = []


def row(cls, methods, route, **kw):
    def deco(fn):
        ROWS.append(Row(cls, methods, route, fn, **kw))
        return fn
    return deco


def client_row(cls, methods, why):
    ROWS.append(Row(cls, methods, "(no request)", None, client=why))


class ClientRefused(Exception):
    """The SDK refuses the call itself, before any request, because of what the server
    told it (client/config); the README must still list what is missing."""


def need(cond, what):
    if not cond:
        raise SdkError(f"{G.name}: {what}")


class X:
    """What the rows share: the stack, the 0.38 client, a model and its checkpoints."""


def scratch():
    """A second model for the rows whose refusal may leave a seq_id the server never saw
    (a 404 route): the SDK's counter moves on, the server waits 30 s for the gap, so such
    rows must not share the main model."""
    if getattr(X, "scratch", None) is None:
        X.scratch = X.c.create_lora_training_client(X.base, rank=4, seed=6)
    return X.scratch


def nll(c, model, data):
    out = c.forward(model, data)
    return -sum(sum(o["logprobs"]["data"]) for o in out["loss_fn_outputs"]), out


def ce(seq, w=1.0):
    return (seq[:-1], {"target_tokens": ("int64", seq[1:]), "weights": ("float32", [w] * (len(seq) - 1))})


def checkpoint_of(path):
    run, kind_name = path[len("tinker://"):].split("/", 1)
    return run, kind_name


def find_ckpt(c, path):
    run, cid = checkpoint_of(path)
    lst = c.rest("GET", f"/api/v1/training_runs/{run}/checkpoints", "checkpoints", "list_checkpoints")
    return next((k for k in lst["checkpoints"] if k["tinker_path"] == path), None)


def fetch(url, method="GET"):
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# ---- ServiceClient -------------------------------------------------------------------------
@row("ServiceClient", ["__init__"], "POST /api/v1/create_session",
     label="ServiceClient(user_metadata, project_id, display_name)")
def service_init():
    X.c2 = Client(X.s, G, user_metadata={"team": "loom", "run": "7"}, project_id="matrix-project",
                  display_name="matrix session")
    r = X.c2.post("/api/v1/telemetry", {"events": [], "platform": "linux", "sdk_version": G.version,
                                        "session_id": X.c2.session_id})
    need(r.status == 200, f"telemetry answered {r.status}")
    return (f"client/config, create_session (display_name, user_metadata, project_id), client/dynamic_config, "
            f"session_heartbeat, telemetry")


@row("ServiceClient", ["get_server_capabilities"], "GET /api/v1/get_server_capabilities")
def capabilities():
    caps = X.c.get_server_capabilities()
    need(X.base in [m.get("model_name") for m in caps["supported_models"]], f"{X.base} not listed")
    return f"{len(caps['supported_models'])} model(s)"


@row("ServiceClient", ["create_lora_training_client"], "POST /api/v1/create_model",
     label="create_lora_training_client(optimizer=AdamOptimizerConfig)")
def create_lora():
    X.model = X.c.create_lora_training_client(X.base, rank=4, seed=5, user_metadata={"purpose": "matrix"},
                                              optimizer={"type": "adamw"})
    info = X.c.get_info(X.model)
    need(info["lora_rank"] == 4, f"get_info lora_rank {info['lora_rank']}")
    return "LoRA rank 4, optimizer_config adamw"


@row("ServiceClient", [], "POST /api/v1/create_model", readme="dimuon", names=("dimuon",), refuse_only=True,
     label="create_lora_training_client(optimizer=DimuonOptimizerConfig)")
def create_dimuon():
    seq = X.c.model_seq
    X.c.model_seq += 1
    body = X.c.body("create_model", session_id=X.c.session_id, model_seq_id=seq, base_model=X.base,
                    lora_config=LoraConfig(rank=4), optimizer_config={"type": "dimuon", "version": 1})
    fut = X.c.submit("/api/v1/create_model", body, "create_model")
    res = X.c.result(fut, "create_model", "create_model")
    raise SdkError(f"{G.name}: create_model with optimizer_config dimuon was accepted ({res['model_id']}): "
                   "Adam would train it in Dimuon's place; it must be refused by name")


# ---- TrainingClient ------------------------------------------------------------------------
@row("TrainingClient", ["forward_backward"], "POST /api/v1/forward_backward")
def forward_backward():
    data = [ce(q) for q in SEQS]
    X.fb = X.c.forward_backward(X.model, data, "cross_entropy")
    outs = X.fb["loss_fn_outputs"]
    need(len(outs) == 3 and all(len(o["logprobs"]["data"]) == 11 for o in outs), "outputs per datum")
    need("loss:sum" in X.fb["metrics"], f"metrics {X.fb['metrics']}")
    return "protobuf body and result, loss:sum"


@row("TrainingClient", ["forward"], "POST /api/v1/forward_backward")
def forward():
    _, out = nll(X.c, X.model, [ce(q) for q in SEQS])
    same = all(a["logprobs"]["data"] == b["logprobs"]["data"]
               for a, b in zip(out["loss_fn_outputs"], X.fb["loss_fn_outputs"]))
    need(same, "forward logprobs differ from forward_backward's on the same weights")
    return "forward_only, logprobs equal forward_backward's"


@row("TrainingClient", ["forward_backward_custom"], "POST /api/v1/forward_backward")
def forward_backward_custom():
    # forward with weights 0, then C(lp) = -0.5 * sum(lp): weights = -dC/dlp = 0.5
    data = [ce(q, 0.0) for q in SEQS]
    fwd = X.c.forward(X.model, data)
    lp = [o["logprobs"]["data"] for o in fwd["loss_fn_outputs"]]
    custom = -0.5 * sum(sum(x) for x in lp)
    out = X.c.forward_backward(X.model, [ce(q, 0.5) for q in SEQS], "cross_entropy")
    need(abs(out["metrics"]["loss:sum"] - custom) < 1e-3 * max(1.0, abs(custom)),
         f"surrogate loss:sum {out['metrics']['loss:sum']} != custom loss {custom}")
    return "forward + forward_backward with weights = -dC/dlogprobs"


@row("TrainingClient", ["optim_step"], "POST /api/v1/optim_step", label="optim_step(AdamParams)")
def optim_step():
    res = X.c.optim_step(X.model, 1e-2)
    need(isinstance(res.get("metrics"), dict), f"metrics {res}")
    return "adam_params; metrics " + ", ".join(sorted(res["metrics"]))


@row("TrainingClient", [], "POST /api/v1/optim_step", readme="dimuon", names=("dimuon",), refuse_only=True,
     label="optim_step(DimuonParams)")
def optim_dimuon():
    r = X.c.optim_step_params(scratch(), {"type": "dimuon", "learning_rate": 0.01, "grad_clip_norm": 0.0,
                                        "beta1": 0.9})
    if not 200 <= r.status < 300:
        X.c.http_error(r, "optim_step")
    raise SdkError(f"{G.name}: optim_step with optimizer_params dimuon was accepted on an Adam model; "
                   "it must be refused by name")


@row("TrainingClient", ["save_state"], "POST /api/v1/save_weights",
     label="save_state(name, ttl_seconds, user_metadata)")
def save_state():
    X.state = X.c.save_state(X.model, "m-state", ttl_seconds=7200, user_metadata={"stage": "sft"})
    X.saved_loss, _ = nll(X.c, X.model, [ce(q) for q in SEQS])
    k = find_ckpt(X.c, X.state)
    need(k is not None, f"{X.state} not in list_checkpoints")
    need(k.get("expires_at") is not None, "Checkpoint.expires_at not set by ttl_seconds")
    need(k.get("user_metadata") == {"stage": "sft"}, f"Checkpoint.user_metadata is {k.get('user_metadata')!r}, "
                                                     "not the {'stage': 'sft'} saved with it")
    return "weights/ path; Checkpoint has the ttl and user_metadata"


def _step_then_load(optimizer):
    X.c.forward_backward(X.model, [ce(q) for q in SEQS], "cross_entropy")
    X.c.optim_step(X.model, 5e-2)
    moved, _ = nll(X.c, X.model, [ce(q) for q in SEQS])
    X.c.load_state(X.model, X.state, optimizer=optimizer)
    back, _ = nll(X.c, X.model, [ce(q) for q in SEQS])
    need(moved != X.saved_loss and abs(back - X.saved_loss) < 1e-4,
         f"loss after load {back:.5f}, saved {X.saved_loss:.5f} (moved to {moved:.5f})")
    return f"loss back to the saved {X.saved_loss:.3f}"


@row("TrainingClient", ["load_state"], "POST /api/v1/load_weights")
def load_state():
    return _step_then_load(False)


@row("TrainingClient", ["load_state_with_optimizer"], "POST /api/v1/load_weights")
def load_state_opt():
    return _step_then_load(True)


@row("TrainingClient", ["save_weights_for_sampler"], "POST /api/v1/save_weights_for_sampler",
     label="save_weights_for_sampler(name, ttl_seconds, user_metadata)")
def save_for_sampler():
    X.sampler_path = X.c.save_weights_for_sampler(X.model, "m-sampler", user_metadata={"stage": "rl"})
    X.sampler_fw = [o["logprobs"]["data"] for o in X.c.forward(X.model, [ce(SEQS[0])])["loss_fn_outputs"]][0]
    k = find_ckpt(X.c, X.sampler_path)
    need(k is not None and k["checkpoint_type"] == "sampler", f"{X.sampler_path} not listed as sampler")
    need(k.get("user_metadata") == {"stage": "rl"}, f"Checkpoint.user_metadata is {k.get('user_metadata')!r}")
    return "sampler_weights/ path; Checkpoint has the user_metadata"


@row("TrainingClient", ["save_weights_external"], "POST /api/v1/save_weights_external",
     readme="save_weights_external")
def save_external():
    X.external = X.c.save_weights_external(scratch(), "m-ext", ttl_seconds=7200)
    need(X.external == f"tinker://{X.scratch}/external_weights/m-ext", f"path {X.external}")
    k = find_ckpt(X.c, X.external)
    need(k is not None and k["checkpoint_type"] == "external", f"listed as {k and k['checkpoint_type']}")
    return "external_weights/ path, checkpoint_type external"


@row("TrainingClient", ["get_info"], "POST /api/v1/get_info")
def get_info():
    info = X.c.get_info(X.model)
    return f"model_data {info['model_data']}"


@row("TrainingClient", ["get_tokenizer"], "POST /api/v1/get_info")
def get_tokenizer():
    info = X.c.get_info(X.model)
    need(info["model_data"].get("model_name") is not None, "model_data.model_name is None (the SDK asserts it)")
    return (f"get_info gives {info['model_data'].get('tokenizer_id') or info['model_data']['model_name']}; "
            "the SDK loads that tokenizer from Hugging Face itself")


@row("TrainingClient", ["create_sampling_client"], "POST /api/v1/create_sampling_session")
def training_create_sampler():
    X.named_sampler = X.c.create_sampling_client(model_path=X.sampler_path)
    smp = X.c.get_sampler(X.named_sampler)
    need(smp.get("model_path") == X.sampler_path, f"GET samplers: {smp}")
    return "sampling session on the saved weights"


@row("TrainingClient", ["save_weights_and_get_sampling_client"], "POST /api/v1/save_weights_for_sampler")
def save_and_sampler():
    X.snap_fw = [o["logprobs"]["data"] for o in X.c.forward(X.model, [ce(SEQS[1])])["loss_fn_outputs"]][0]
    X.snap = X.c.save_weights_and_get_sampling_client(X.model)
    smp = X.c.get_sampler(X.snap)
    need(smp["base_model"] == X.base, f"GET samplers: {smp}")
    return "unnamed save -> sampling_session_id"


client_row("TrainingClient", ["get_console_url", "get_telemetry"],
           "client-side: a console URL string and the holder's telemetry (training_client.py 0.32)")


# ---- SamplingClient ------------------------------------------------------------------------
@row("SamplingClient", ["sample"], "POST /api/v1/asample",
     label="sample(num_samples=3) (+ retrieve_futures when advertised)")
def sample():
    res = X.c.sample(X.snap, PROMPT, 3, {"max_tokens": 5, "seed": 3})
    ids = [q["sequence_id"] for q in res["sequences"]]
    need(len(set(ids)) == 3, f"sample_sequence_ids not distinct: {ids}")
    # a resubmission of the same (sampling_session_id, seq_id) is the same future, same ids
    seq_id = X.c.sample_seq[(X.snap, 0)] - 1
    r, _ = X.c.sample_submit(X.snap, PROMPT, 3, {"max_tokens": 5, "seed": 3}, seq_id=seq_id)
    again = X.c.parse(r, "future", "asample")
    need(again["request_id"] == res["_future"]["request_id"] and again.get("sample_sequence_ids") == ids,
         f"a resubmitted sample has other ids: {again}")
    other = X.c.sample(X.snap, PROMPT, 2, {"max_tokens": 3, "seed": 4})
    need(not set(ids) & {q["sequence_id"] for q in other["sequences"]}, "ids repeat across requests")
    # the JSON result carries each sequence's id too
    jr = X.c.post("/api/v1/retrieve_future", {"request_id": res["_future"]["request_id"]})
    jseq = (jr.json() or {}).get("sequences", [])
    need([q.get("sequence_id") for q in jseq] == ids, "the JSON result's sequences lack their sequence_id "
         f"({[q.get('sequence_id') for q in jseq]})")
    X.sample_rid = res["_future"]["request_id"]
    via = "retrieve_futures" if X.c.config.get("sample_use_retrieve_futures") else "retrieve_future"
    return f"sample_sequence_ids distinct, stable on resubmit, in the JSON result; waited via {via}"


@row("SamplingClient", ["sample"], "POST /api/v1/asample", readme="topk_sample_logprobs",
     names=("topk_sample_logprobs",), label="sample(topk_sample_logprobs=3)")
def sample_topk():
    res = X.c.sample(X.snap, PROMPT, 2, {"max_tokens": 4, "seed": 5}, topk_sample_logprobs=3)
    for q in res["sequences"]:
        rows = q.get("topk_logprobs")
        need(rows is not None and len(rows) == len(q["tokens"]), f"topk_logprobs {rows!r:.120} for "
             f"{len(q['tokens'])} tokens")
        for r, tok, lp in zip(rows, q["tokens"], q["logprobs"]):
            need(r and len(r) <= 3 and all(a[1] >= b[1] for a, b in zip(r, r[1:])), f"row {r}")
            hit = [x for t, x in r if t == tok]
            need(not hit or abs(hit[0] - lp) < 1e-4, f"sampled token {tok}: top-k logprob {hit} != {lp}")
    return "k=3 rows per sampled token, most likely first"


@row("SamplingClient", ["sample"], "POST /api/v1/asample", readme="target_prompt_logprobs",
     names=("target_prompt_logprobs",), label="sample(target_prompt_logprobs=[len-1, K])")
def sample_target():
    ids = []
    for i in range(len(PROMPT) - 1):
        ids += [PROMPT[i + 1], -1]
    t = {"data": ids, "dtype": "int64", "shape": [len(PROMPT) - 1, 2]}
    res = X.c.sample(X.snap, PROMPT, 1, {"max_tokens": 1}, prompt_logprobs=True, target_prompt_logprobs=t)
    out = res.get("target_prompt_logprobs")
    need(out is not None, "no target_prompt_logprobs in the result")
    need(out["dtype"] == "float32" and out["shape"] == [len(PROMPT) - 1, 2], f"shape {out['shape']}")
    vals = out["data"]
    plp = res["prompt_logprobs"]
    need(all(abs(vals[2 * i] - plp[i + 1]) < 1e-4 and vals[2 * i + 1] == 0.0 for i in range(len(PROMPT) - 1)),
         f"values {vals} against prompt logprobs {plp}")
    return "[len-1, 2] float32; the prompt token's column equals prompt_logprobs, -1 cells 0.0"


@row("SamplingClient", ["sample"], "POST /api/v1/asample", readme="prompt_alt_tokens_k",
     names=("prompt_alt_tokens_k",), label="sample(prompt_alt_tokens_k=2)")
def sample_alt():
    res = X.c.sample(X.snap, PROMPT, 1, {"max_tokens": 1, "temperature": 1.0, "seed": 9}, prompt_alt_tokens_k=2)
    alt = res["prompt_alt_tokens"]
    tok, lps = alt["tokens"], alt["logprobs"]
    n = len(PROMPT) - 1
    need(tok["shape"] == [n, 2] and lps["shape"] == [n, 2], f"shapes {tok['shape']} {lps['shape']}")
    need(all(0 <= x < X.vocab for x in tok["data"]) and all(-1e4 < x <= 0 for x in lps["data"]),
         f"tokens {tok['data']} logprobs {lps['data']}")
    return "tokens int64 and logprobs float32, [len-1, 2]"


@row("SamplingClient", ["sample"], "POST /api/v1/asample", readme="prompt_logprobs_last_n",
     names=("prompt_logprobs_last_n",), label="sample(prompt_logprobs_last_n=2) (0.33+)")
def sample_last_n():
    full = X.c.sample(X.snap, PROMPT, 1, {"max_tokens": 1}, prompt_logprobs=True)["prompt_logprobs"]
    res = X.c.sample(X.snap, PROMPT, 1, {"max_tokens": 1}, prompt_logprobs=True, prompt_logprobs_last_n=2)
    got = res["prompt_logprobs"]
    need(got is not None and len(got) == len(PROMPT) and all(x is None for x in got[:-2])
         and all(abs(a - b) < 1e-4 for a, b in zip(got[-2:], full[-2:])),
         f"prompt_logprobs with last_n=2: {got} (full: {full})")
    return "None before the last 2 positions, the same values in them"


@row("SamplingClient", ["sample"], "POST /api/v1/cancel_future", readme="cancel_future",
     label="sample, abandoned (cancel_future when client/dynamic_config says sample_cancel_enabled)")
def sample_cancel():
    r, _ = X.c.sample_submit(X.snap, PROMPT, 1, {"max_tokens": 2, "seed": 1})
    fut = X.c.parse(r, "future", "asample")
    X.c.result(fut, "sample_json", "sample", proto_kind="sample")
    X.c.cancel_future(fut["request_id"])      # already done: nothing to do, 2xx
    r = X.c.post("/api/v1/cancel_future", {"request_id": "req-" + "0" * 32})
    need(r.status == 404, f"cancel_future of an unknown request answered {r.status}")
    flag = X.c.dyn.get("sample_cancel_enabled")
    return f"2xx for a finished sample, 404 for an unknown one; sample_cancel_enabled={flag}"


@row("SamplingClient", ["compute_logprobs"], "POST /api/v1/asample")
def compute_logprobs():
    lp = X.c.compute_logprobs(X.snap, SEQS[1])
    need(lp[0] is None and all(abs(a - b) < 1e-3 for a, b in zip(lp[1:], X.snap_fw)),
         "prompt logprobs differ from the snapshot model's forward")
    return "equals the model's forward logprobs"


@row("SamplingClient", ["get_tokenizer", "get_base_model"], "GET /api/v1/samplers/{id}")
def sampler_base_model():
    smp = X.c.get_sampler(X.named_sampler)
    need(smp["base_model"] == X.base, f"{smp}")
    return f"base_model {smp['base_model']}"


@row("SamplingClient", ["get_sampler_handle", "from_sampler_handle"], "POST /api/v1/join_sampling_session",
     readme="join_sampling_session", label="get_sampler_handle / from_sampler_handle (and pickling)")
def sampler_handle():
    if X.c.config.get("sample_join_sampling_session"):
        a = X.c.join_sampling_session(X.snap)["client_counter"]
        b = X.c.join_sampling_session(X.snap)["client_counter"]
        need(a >= 1 and b >= 1 and a != b, f"client_counter {a}, {b}")
        clone, how = a, f"joined as clients {a} and {b}"
    else:
        clone, how = random.randrange(1, 10 ** 9), "sample_join_sampling_session off: a random clone block"
    res = X.c.sample(X.snap, PROMPT, 2, {"max_tokens": 3, "seed": 1}, cloned_sampler_id=clone)
    need(len({q["sequence_id"] for q in res["sequences"]}) == 2, "the clone's sequence ids are not distinct")
    return f"{how}; samples with seq_id {clone}e9"


client_row("SamplingClient", ["get_telemetry"], "client-side (sampling_client.py 0.32)")


# ---- ServiceClient, continued (needs checkpoints) -------------------------------------------
@row("ServiceClient", ["copy_weights"], "POST /api/v1/copy_weights", readme="copy_weights")
def copy_weights():
    path = X.c.copy_weights(X.sampler_path, ttl_seconds=7200)
    need(path.startswith("tinker://") and path.endswith("/sampler_weights/m-sampler"), f"path {path}")
    info = X.c.weights_info(path)
    need(info["lora_rank"] == 4 and info["base_model"] == X.base, f"weights_info of the copy: {info}")
    return f"{path.split('/')[2]}/... readable, rank 4"


def _from_state(optimizer):
    info = X.c.weights_info(X.state)
    m = X.c.create_lora_training_client(info["base_model"], rank=info["lora_rank"],
                                        train_mlp=info.get("train_mlp", True), train_attn=info.get("train_attn", True),
                                        train_unembed=info.get("train_unembed", True))
    X.c.load_state(m, X.state, optimizer=optimizer)
    loss, _ = nll(X.c, m, [ce(q) for q in SEQS])
    need(abs(loss - X.saved_loss) < 1e-4, f"new model's loss {loss:.5f}, saved {X.saved_loss:.5f}")
    return f"weights_info + create_model + load_weights: loss {loss:.3f} as saved"


@row("ServiceClient", ["create_training_client_from_state"], "POST /api/v1/load_weights")
def from_state():
    return _from_state(False)


@row("ServiceClient", ["create_training_client_from_state_with_optimizer"], "POST /api/v1/load_weights")
def from_state_opt():
    return _from_state(True)


@row("ServiceClient", ["create_sampling_client"], "POST /api/v1/create_sampling_session",
     label="create_sampling_client(model_path | base_model)")
def service_create_sampler():
    a = X.c.create_sampling_client(model_path=X.sampler_path)
    b = X.c.create_sampling_client(base_model=X.base)
    sa, sb = X.c.get_sampler(a), X.c.get_sampler(b)
    need(sa.get("model_path") == X.sampler_path and sb["base_model"] == X.base and not sb.get("model_path"),
         f"{sa} {sb}")
    return "both forms"


client_row("ServiceClient", ["create_rest_client", "get_console_url", "holder"],
           "client-side (service_client.py 0.25; serviceclient.md 0.32)")


# ---- RestClient ----------------------------------------------------------------------------
@row("RestClient", ["get_training_run", "get_training_run_by_tinker_path"], "GET /api/v1/training_runs/{id}")
def get_training_run():
    run = X.c.rest("GET", f"/api/v1/training_runs/{X.model}?access_scope=owned", "training_run", "get_training_run")
    need(run["user_metadata"] == {"purpose": "matrix"}, f"user_metadata {run['user_metadata']}")
    return "TrainingRun"


@row("RestClient", ["get_weights_info_by_tinker_path"], "POST /api/v1/weights_info")
def weights_info():
    info = X.c.weights_info(X.state)
    need(info["lora_rank"] == 4, f"{info}")
    return "WeightsInfoResponse"


@row("RestClient", ["list_training_runs"], "GET /api/v1/training_runs")
def list_runs():
    runs = X.c.rest("GET", "/api/v1/training_runs?limit=50&offset=0&access_scope=owned", "training_runs",
                    "list_training_runs")
    need(X.model in [r["training_run_id"] for r in runs["training_runs"]], "the model is not listed")
    return f"{runs['cursor']['total_count']} runs"


@row("RestClient", ["list_checkpoints"], "GET /api/v1/training_runs/{id}/checkpoints")
def list_checkpoints():
    lst = X.c.rest("GET", f"/api/v1/training_runs/{X.model}/checkpoints", "checkpoints", "list_checkpoints")
    return ", ".join(sorted(f"{k['checkpoint_type']}" for k in lst["checkpoints"]))


@row("RestClient", ["get_checkpoint_archive_url", "get_checkpoint_archive_url_from_tinker_path"],
     "GET /api/v1/training_runs/{id}/checkpoints/{ckpt}/archive")
def archive_url():
    run, cid = checkpoint_of(X.state)
    url = X.c.get_checkpoint_archive_url(run, cid)
    st, body = fetch(url["url"])
    need(st == 200 and tarfile.open(fileobj=io.BytesIO(body)).getnames(), f"download {st}")
    return "200 JSON {url, expires}; the archive downloads"


@row("RestClient", ["get_external_weights_urls"],
     "GET /api/v1/training_runs/{id}/checkpoints/external_weights/{name}/external_weights_urls",
     readme="external_weights_urls")
def external_urls():
    run, cid = checkpoint_of(X.external)
    res = X.c.rest("GET", f"/api/v1/training_runs/{run}/checkpoints/{cid}/external_weights_urls",
                   "external_urls", "get_external_weights_urls")
    got = {}
    for name, url in res["urls"].items():
        st, body = fetch(url)
        need(st == 200 and body, f"{name}: {st}")
        got[name] = body
    need("adapter_config.json" in got and json.loads(got["adapter_config.json"]).get("r") == 4,
         f"files {sorted(got)}")
    X.peft_files = got
    return "one signed URL per file: " + ", ".join(sorted(got))


@row("RestClient", ["publish_checkpoint_from_tinker_path"], "POST /api/v1/training_runs/{id}/checkpoints/{ckpt}/publish")
def publish():
    run, cid = checkpoint_of(X.sampler_path)
    X.c.rest_none("POST", f"/api/v1/training_runs/{run}/checkpoints/{cid}/publish", "publish")
    need(find_ckpt(X.c, X.sampler_path)["public"] is True, "not public after publish")
    return "public: true"


@row("RestClient", ["unpublish_checkpoint_from_tinker_path"],
     "DELETE /api/v1/training_runs/{id}/checkpoints/{ckpt}/publish")
def unpublish():
    run, cid = checkpoint_of(X.sampler_path)
    X.c.rest_none("DELETE", f"/api/v1/training_runs/{run}/checkpoints/{cid}/publish", "unpublish")
    need(find_ckpt(X.c, X.sampler_path)["public"] is False, "still public after unpublish")
    return "public: false"


@row("RestClient", ["set_checkpoint_ttl_from_tinker_path"], "PUT /api/v1/training_runs/{id}/checkpoints/{ckpt}/ttl")
def set_ttl():
    run, cid = checkpoint_of(X.sampler_path)
    X.c.rest_none("PUT", f"/api/v1/training_runs/{run}/checkpoints/{cid}/ttl", "set_ttl", {"ttl_seconds": 86400})
    need(find_ckpt(X.c, X.sampler_path).get("expires_at"), "no expires_at after set_ttl")
    return "expires_at set"


@row("RestClient", ["list_user_checkpoints"], "GET /api/v1/checkpoints")
def list_user_checkpoints():
    lst = X.c.rest("GET", "/api/v1/checkpoints?limit=100&offset=0", "checkpoints", "list_user_checkpoints")
    need(X.state in [k["tinker_path"] for k in lst["checkpoints"]], "the saved state is not listed")
    return f"{len(lst['checkpoints'])} checkpoints"


@row("RestClient", ["get_session"], "GET /api/v1/sessions/{id}")
def get_session():
    s = X.c.rest("GET", f"/api/v1/sessions/{X.c2.session_id}?access_scope=owned", "session", "get_session")
    need(s.get("user_metadata") == {"team": "loom", "run": "7"},
         f"GetSessionResponse.user_metadata is {s.get('user_metadata')!r}, not the session's")
    need(s.get("display_name", "matrix session") == "matrix session", f"display_name {s.get('display_name')!r}")
    return "GetSessionResponse with the session's user_metadata"


@row("RestClient", ["list_sessions"], "GET /api/v1/sessions")
def list_sessions():
    lst = X.c.rest("GET", "/api/v1/sessions?limit=20&offset=0&access_scope=owned", "sessions", "list_sessions")
    need(X.c.session_id in lst["sessions"], "this session is not listed")
    return f"{len(lst['sessions'])} sessions"


@row("RestClient", ["search_sessions"], "POST /api/v1/sessions/search",
     readme="search_sessions")
def search_sessions():
    """SessionSearchRequest (0.38 type reference): the route is not in any available SDK
    source, so this row sends it where Loom would serve it; Loom answers 404 and the README
    lists it as not implemented."""
    X.c.rest_none("POST", "/api/v1/sessions/search", "search_sessions",
                  {"user_metadata": {}, "owner": {"type": "own"}, "limit": 20})
    return "2xx"


@row("RestClient", ["assign_session_project"], "PUT /api/v1/sessions/{id}/project", readme="sessions/{id}/project")
def assign_project():
    X.c.rest_none("PUT", f"/api/v1/sessions/{X.c.session_id}/project", "assign_session_project",
                  {"project_id": "other-project"})
    s = X.c.rest("GET", f"/api/v1/sessions/{X.c.session_id}", "session", "get_session")
    need(s.get("project_id") == "other-project", f"the session's project_id is {s.get('project_id')!r} after the move")
    # its runs moved with it: list_training_runs(project_id=...) finds them there, not elsewhere
    runs = X.c.rest("GET", "/api/v1/training_runs?limit=50&offset=0&project_id=other-project", "training_runs",
                    "list_training_runs")
    need(X.model in [r["training_run_id"] for r in runs["training_runs"]], "the moved session's run is not in its project")
    none = X.c.rest("GET", "/api/v1/training_runs?limit=50&offset=0&project_id=no-such-project", "training_runs",
                    "list_training_runs")
    need(none["training_runs"] == [] and none["cursor"]["total_count"] == 0, f"another project lists runs: {none}")
    return "moved, with its runs (list_training_runs(project_id=...))"


@row("RestClient", ["export_session_trace"], "GET /api/v1/sessions/{id}/trace_export",
     readme="sessions/{id}/trace_export")
def export_trace():
    X.c.rest_none("GET", f"/api/v1/sessions/{X.c.session_id}/trace_export", "export_session_trace")
    return "2xx"


@row("RestClient", ["whoami"], "(JWT claims: POST /api/v1/auth/token)", readme="auth/token",
     label="whoami")
def whoami():
    """rest_client.py 0.25: whoami reads the JWT the SDK holds; without JWT auth it raises
    RuntimeError("whoami requires JWT auth, but the server has it disabled ...")."""
    if X.c.config.get("pjwt_auth_enabled"):
        r = X.c.post("/api/v1/auth/token", {})
        need(r.status == 200, f"pjwt_auth_enabled is on but auth/token answered {r.status}")
        return "JWT exchange"
    raise ClientRefused("client/config says pjwt_auth_enabled false: the SDK raises 'whoami requires JWT auth, "
                        "but the server has it disabled' without a request")


@row("RestClient", ["get_sampler"], "GET /api/v1/samplers/{id}")
def get_sampler():
    smp = X.c.get_sampler(X.snap)
    return f"GetSamplerResponse {smp['sampler_id'][-10:]}"


@row("RestClient", ["get_billing_usage"], "GET /api/v1/billing/usage/events", readme="billing/usage/events")
def billing_usage():
    X.c.rest("GET", "/api/v1/billing/usage/events?starting_on=2026-01-01&ending_before=2026-01-02", "any",
             "get_billing_usage")
    return "2xx"


@row("RestClient", ["get_audit_log"], "GET /api/v1/audit", readme="GET audit")
def audit_log():
    X.c.rest("GET", "/api/v1/audit?event_type=all", "any", "get_audit_log")
    return "2xx"


@row("RestClient", ["get_current_checkpoint_storage_usage"], "GET /api/v1/billing/usage/checkpoints/current",
     readme="billing/usage/checkpoints/current")
def storage_usage():
    res = X.c.rest("GET", "/api/v1/billing/usage/checkpoints/current", "storage_usage",
                   "get_current_checkpoint_storage_usage")
    n = sum(d["checkpoint_count"] for d in res["data"])
    b = sum(d["size_bytes"] for d in res["data"])
    need(n >= 3 and b > 0, f"{n} checkpoints, {b} bytes")
    return f"{n} checkpoints, {b} bytes"


@row("RestClient", ["search_checkpoints"], "POST /api/v1/checkpoints/search", readme="search_checkpoints",
     label="search_checkpoints (0.39; route Loom's choice)")
def search():
    body = {"user_metadata": {"stage": "sft"}, "limit": 1}
    res = X.c.rest("POST", "/api/v1/checkpoints/search", "search", "search_checkpoints", body)
    need([k["tinker_path"] for k in res["checkpoints"]] == [X.state], f"found {res['checkpoints']}")
    both = X.c.rest("POST", "/api/v1/checkpoints/search", "search", "search_checkpoints",
                    {"user_metadata": {}, "limit": 1, "base_models": [X.base]})
    need(both["next_cursor"] is not None, "no next_cursor on a full page")
    nxt = X.c.rest("POST", "/api/v1/checkpoints/search", "search", "search_checkpoints",
                   {"user_metadata": {}, "limit": 1, "base_models": [X.base], "cursor": both["next_cursor"]})
    need(nxt["checkpoints"] and nxt["checkpoints"][0]["tinker_path"] != both["checkpoints"][0]["tinker_path"],
         "the next page repeats the first")
    return "by user_metadata; paged by next_cursor"


@row("RestClient", ["external_weights_upload_start", "external_weights_upload_finish"],
     "POST /api/v1/external_weights_upload_start", readme="external_weights_upload_start",
     label="external_weights_upload_start / _finish (0.39)")
def upload():
    files = getattr(X, "peft_files", None)
    if files is None:      # no external checkpoint: take the PEFT files from the sampler archive
        run, cid = checkpoint_of(X.sampler_path)
        url = X.c.get_checkpoint_archive_url(run, cid, query="?format=peft")["url"]
        st, body = fetch(url)
        tf = tarfile.open(fileobj=io.BytesIO(body))
        files = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.name.startswith("adapter_")}
    start = X.c.rest("POST", "/api/v1/external_weights_upload_start", "upload_start",
                     "external_weights_upload_start",
                     {"base_model": X.base, "lora_config": {"rank": 4, "train_unembed": True, "train_mlp": True,
                                                            "train_attn": True}})
    for name, url in start["urls"].items():
        need(name in files, f"asked for {name}, have {sorted(files)}")
        req = urllib.request.Request(url, data=files[name], method="PUT")
        with urllib.request.urlopen(req, timeout=60) as r:
            need(200 <= r.status < 300, f"PUT {name}: {r.status}")
    fin = X.c.rest("POST", "/api/v1/external_weights_upload_finish", "upload_finish",
                   "external_weights_upload_finish", {"upload_id": start["upload_id"]})
    info = X.c.weights_info(fin["tinker_path"])
    need(info["lora_rank"] == 4, f"weights_info of the upload {info}")
    return f"PUT {len(start['urls'])} files, finish -> {fin['tinker_path'].split('/', 3)[-1]}"


@row("RestClient", ["delete_checkpoint", "delete_checkpoint_from_tinker_path"],
     "DELETE /api/v1/training_runs/{id}/checkpoints/{ckpt}")
def delete():
    run, cid = checkpoint_of(X.sampler_path)
    X.c.rest_none("DELETE", f"/api/v1/training_runs/{run}/checkpoints/{cid}", "delete_checkpoint")
    need(find_ckpt(X.c, X.sampler_path) is None, "still listed after delete")
    return "gone from the listing"


@row("ServiceClient", ["close"], "POST /api/v1/sessions/{id}/finish", readme="sessions/{id}/finish")
def close():
    X.c2.close("success", "matrix done")
    r = X.c2.post(f"/api/v1/sessions/{X.c2.session_id}/finish", {"reason": {"type": "errored"}, "detail": "late"})
    need(200 <= r.status < 300, f"a second finish answered {r.status}")
    hb = X.c2.post("/api/v1/session_heartbeat", X.c2.body("heartbeat", session_id=X.c2.session_id))
    need(hb.status == 410, f"a heartbeat after close answered {hb.status}, not 410")
    return "finished (first wins); heartbeat then 410"


# ---- running the rows ----------------------------------------------------------------------
def not_implemented_text():
    """README.md's list of what is missing: its section whose heading says "Not implemented"
    (or "missing"), and table rows whose first cell says so."""
    out, section = [], False
    for line in open(README).read().splitlines():
        if line.startswith("#"):
            section = bool(re.search(r"not implemented|missing", line, re.I))
            continue
        first = line.split("|")[1] if line.startswith("|") and line.count("|") > 2 else ""
        if section or re.search(r"not implemented|missing", first, re.I):
            out.append(line)
    return "\n".join(out)


def route_re(route):
    method, path = route.split(" ", 1)
    return re.compile("^" + re.escape(method) + " " + re.sub(r"\\\{[a-z_]+\\\}", "[^?]+", re.escape(path))
                      + r"(\?.*)?$")


def run_row(row, missing):
    if row.client:
        return "client", row.client, True
    try:
        note = row.fn()
        return "supported", note, not row.refuse_only
    except ClientRefused as e:
        if row.readme and row.readme.lower() in missing.lower():
            return "refused", f"client-side: {e}", True
        return "neither", f"refused client-side ({e}), but README.md does not list {row.readme}", False
    except HttpError as e:
        own = route_re(row.route).match(e.route)
        if not own:
            return "neither", f"{e} (from {e.route}, not this row's route)", False
        if not (400 <= e.status < 500) or e.status in (408, 409, 429):
            return "neither", (f"{e.status} from {e.route}: the SDK retries it"
                               + (" for minutes (5xx)" if e.status >= 500 else "")
                               + f"; a refusal must be a 4xx it does not retry ({e.detail})"), False
        if not e.detail:
            return "neither", f"{e.status} without a JSON detail", False
        if e.status == 404 and "not implemented" not in e.detail.lower():
            return "neither", f"404 that does not say Loom does not implement it ({e.detail[:160]})", False
        named = all(w.lower() in e.detail.lower() for w in row.names)
        listed = bool(row.readme) and row.readme.lower() in missing.lower()
        why = f"{e.status}: {e.detail[:160]}"
        if not named:
            return "neither", f"refused ({why}) without naming {', '.join(row.names)}", False
        if not listed:
            return "neither", f"refused ({why}), but README.md does not list {row.readme or row.route} as missing", False
        return "refused", why, True
    except Exception as e:  # noqa: BLE001 - any other failure makes the row "neither", named
        msg = str(e) if isinstance(e, SdkError) else f"{type(e).__name__}: {e}"
        if isinstance(e, AttributeError) and "X" in msg:
            msg = f"{G.name}: an earlier row it depends on failed ({msg})"
        return "neither", msg, False


def main():
    covered = {f"{r.cls}.{m}" for r in ROWS for m in r.methods}
    listed = {f"{c}.{m}" for c, ms in METHODS.items() for m in ms}
    R.check(covered == listed, f"every public method has a row ({len(listed)} methods, {len(ROWS)} rows)"
            + ("" if covered == listed else f": missing {sorted(listed - covered)}, extra {sorted(covered - listed)}"))
    missing = not_implemented_text()
    with Stack() as s:
        X.s = s
        st, caps = s.get("/api/v1/get_server_capabilities")
        X.base = caps["supported_models"][0]["model_name"]
        X.vocab = int(s.psql(f"SELECT vocab_size FROM base_models WHERE name = '{X.base}'"))
        X.c = Client(s, G, user_metadata={"suite": "matrix"})
        for r in ROWS:
            t = time.time()
            kind, note, ok = run_row(r, missing)
            r.result = (kind, note)
            R.check(ok, f"{r.cls}.{r.label}: {kind}: {note} ({time.time() - t:.1f} s)")
    print("\n| method | route | result |\n|---|---|---|")
    for r in ROWS:
        twins = "" if all(f"{r.cls}.{m}" in NO_TWIN for m in r.methods) or not r.methods else " (+ `_async`)"
        kind, note = r.result
        note = note.replace("|", "/").replace("\n", " ")
        print(f"| `{r.cls}.{r.label}`{twins} | `{r.route}` | {kind}: {note[:220]} |")
    R.finish()


if __name__ == "__main__":
    main()
