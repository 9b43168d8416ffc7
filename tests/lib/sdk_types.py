"""The SDK's response types of SDK 0.26 - 0.39 (tinker/types/*.py, pydantic models there),
as a test reads them: a field is required or optional, of a type, a Literal or a nested
type; unknown fields are ignored, as the SDK's BaseModel does (extra="ignore"). The SDK
cannot be installed here, so each type is written out from its file, and `parse` refuses
what pydantic would refuse (a missing required field, a wrong type, a Literal not met, a
datetime that does not parse)."""
import datetime

REQ, OPT = "required", "optional"


def _datetime(v):
    if not isinstance(v, str):
        return False
    try:
        datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
        return True
    except ValueError:
        return False


def literal(*values):
    return lambda v: v in values


def dict_of(kt, vt):
    return lambda v: isinstance(v, dict) and all(isinstance(k, kt) and isinstance(x, vt) for k, x in v.items())


def list_of(item):
    return lambda v: isinstance(v, list) and all(check(item, x) for x in v)


def union(field, variants):
    """A discriminated union (pydantic Field(discriminator=field))."""
    def ok(v):
        if not isinstance(v, dict):
            return False
        t = variants.get(v.get(field))
        return t is not None and check(t, v)
    return ok


def check(t, v):
    """Whether v validates as t: a python type, a predicate, or a type dict."""
    if isinstance(t, dict):
        if not isinstance(v, dict):
            return False
        for name, (need, ft) in t.items():
            if name not in v:
                if need == REQ:
                    return False
                continue
            if v[name] is None and need == OPT:
                continue
            if not check(ft, v[name]):
                return False
        return True
    if t is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if isinstance(t, type):
        return isinstance(v, t)
    return bool(t(v))


# copy_weights_response.py
CopyWeightsResponse = {"tinker_path": (REQ, str)}
# _pydantic_types/save_weights_external_response.py (the future's result)
SaveWeightsExternalResponseInternal = {"path": (OPT, str), "size_bytes": (OPT, int),
                                       "type": (OPT, literal("save_weights_external"))}
# external_weights_urls_response.py
ExternalWeightsUrlsResponse = {"urls": (REQ, dict_of(str, str)), "expires": (REQ, _datetime)}
# checkpoint.py (the fields this server fills)
Checkpoint = {"checkpoint_id": (REQ, str), "checkpoint_type": (REQ, str), "time": (REQ, _datetime),
              "tinker_path": (REQ, str), "size_bytes": (OPT, int), "public": (OPT, bool),
              "expires_at": (OPT, _datetime)}
# future_completion.py, futures_retrieve_response.py
FutureFinished = {"state": (REQ, literal("finished")), "request_id": (REQ, str),
                  "response_payload_uncompressed_size": (OPT, int)}
FutureFailed = {"state": (REQ, literal("failed")), "request_id": (REQ, str)}
FuturesRetrieveResponse = {"completions": (REQ, list_of(union("state", {"finished": FutureFinished,
                                                                        "failed": FutureFailed}))),
                           "cursor": (REQ, int)}
# join_sampling_session_response.py
JoinSamplingSessionResponse = {"type": (OPT, literal("join_sampling_session")), "client_counter": (REQ, int)}
# client_config_response.py, client_dynamic_config_response.py (the flags the tests read)
ClientConfigResponse = {"sample_use_retrieve_futures": (OPT, bool), "pjwt_auth_enabled": (OPT, bool)}
ClientDynamicConfigResponse = {"refresh_interval_sec": (OPT, int), "sample_cancel_enabled": (OPT, bool),
                               "sample_cancel_max_batch_size": (OPT, int)}


def parse(t, body, name=""):
    """body when it validates as t, else None (printed)."""
    if check(t, body):
        return body
    print("      does not parse as", name or "the SDK's type", ":", str(body)[:300])
    return None
