"""The response types of the Tinker SDK (0.26 - 0.39) that the tests parse answers with,
written down from the SDK's published type reference (tinker-docs.thinkingmachines.ai,
"tinker.types.*"), and a checker that reads a JSON value the way the SDK's pydantic
models do: every required field present, each of its type (an int is a float, a str is
not an int), Literal values exact, None only where the field is optional; unknown fields
are ignored (the SDK's response BaseModel has extra="ignore"). The SDK itself cannot be
installed where the tests run (no PyPI), so this is its reading of the wire, by hand.

    problems = check(value, CHECKPOINT)   # [] when the SDK would accept it
"""
import datetime
import re

_ISO = re.compile(r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d{1,6})?)?(Z|[+-]\d\d:?\d\d)?$")


def opt(t):
    """Optional[t]: None or t, and absent is None."""
    return ("opt", t)


def lst(t):
    return ("list", t)


def lit(*values):
    return ("lit", values)


def union(*types):
    return ("union", types)


STR_MAP = ("str_map",)          # dict[str, str]
DATETIME = ("datetime", False)  # datetime (naive allowed)
AWARE = ("datetime", True)      # AwareDatetime: the time zone is required


def _time_ok(v, aware):
    if not isinstance(v, str) or not _ISO.match(v):
        return False
    try:
        t = datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        return False
    return t.tzinfo is not None or not aware


def check(v, t, where="$"):
    """Problems (a list of strings) reading v as type t; [] when it reads."""
    if isinstance(t, dict):   # a model: {field: type}
        if not isinstance(v, dict):
            return [f"{where}: expected an object, got {type(v).__name__}"]
        out = []
        for k, ft in t.items():
            if k not in v:
                if not (isinstance(ft, tuple) and ft[0] == "opt"):
                    out.append(f"{where}.{k}: required, missing")
                continue
            out += check(v[k], ft, f"{where}.{k}")
        return out
    if t is str:
        return [] if isinstance(v, str) else [f"{where}: expected a string, got {v!r}"]
    if t is bool:
        return [] if isinstance(v, bool) else [f"{where}: expected a bool, got {v!r}"]
    if t is int:
        return [] if isinstance(v, int) and not isinstance(v, bool) else [f"{where}: expected an int, got {v!r}"]
    if t is float:
        return [] if isinstance(v, (int, float)) and not isinstance(v, bool) else [f"{where}: expected a float, got {v!r}"]
    kind = t[0]
    if kind == "opt":
        return [] if v is None else check(v, t[1], where)
    if kind == "list":
        if not isinstance(v, list):
            return [f"{where}: expected a list, got {v!r}"]
        return [p for i, x in enumerate(v) for p in check(x, t[1], f"{where}[{i}]")]
    if kind == "lit":
        return [] if v in t[1] else [f"{where}: expected one of {t[1]}, got {v!r}"]
    if kind == "union":
        tries = [check(v, u, where) for u in t[1]]
        return [] if any(not p for p in tries) else [f"{where}: matches no member of the union: {tries}"]
    if kind == "str_map":
        if not isinstance(v, dict):
            return [f"{where}: expected dict[str, str], got {v!r}"]
        return [f"{where}.{k}: expected a string value, got {x!r}" for k, x in v.items() if not isinstance(x, str)]
    if kind == "datetime":
        return [] if _time_ok(v, t[1]) else [f"{where}: expected an ISO 8601 time{' with a zone' if t[1] else ''}, got {v!r}"]
    raise ValueError(t)


# tinker.types.Checkpoint (0.39: user_metadata, base_model; "external" checkpoints)
CHECKPOINT = {"checkpoint_id": str, "checkpoint_type": lit("training", "sampler", "external"), "time": DATETIME,
              "tinker_path": str, "size_bytes": opt(int), "public": opt(bool), "expires_at": opt(DATETIME),
              "user_metadata": opt(STR_MAP), "base_model": opt(str)}
CURSOR = {"offset": int, "limit": int, "total_count": int}
CHECKPOINTS_LIST = {"checkpoints": lst(CHECKPOINT), "cursor": opt(CURSOR)}
TRAINING_RUN = {"training_run_id": str, "base_model": str, "model_owner": str, "is_lora": bool, "corrupted": opt(bool),
                "lora_rank": opt(int), "last_request_time": DATETIME, "last_checkpoint": opt(CHECKPOINT),
                "last_sampler_checkpoint": opt(CHECKPOINT), "user_metadata": opt(STR_MAP)}
# search_checkpoints
CHECKPOINT_SEARCH_CURSOR = {"last_created_at": AWARE, "last_checkpoint_uuid": str}
CHECKPOINT_SEARCH_RESPONSE = {"checkpoints": lst(CHECKPOINT), "next_cursor": opt(CHECKPOINT_SEARCH_CURSOR)}
# sessions: GetSessionResponse, ListSessionsResponse, SessionStatus, SessionSummary
GET_SESSION = {"training_run_ids": lst(str), "sampler_ids": lst(str), "user_metadata": opt(STR_MAP)}
LIST_SESSIONS = {"sessions": lst(str)}
SESSION_STATUS = union(
    {"type": lit("active")},
    {"type": lit("cancelled")},
    {"type": lit("failed"), "category": lit("user", "internal"), "reason": {"type": str}, "message": str},
    {"type": lit("client_finished"), "reason": {"type": lit("success", "errored", "interrupted")},
     "detail": opt(str)})
SESSION_SUMMARY = {"session_id": str, "created_at": DATETIME, "owner": str, "project_id": str,
                   "status": opt(SESSION_STATUS), "checkpoints_count": int, "display_name": opt(str),
                   "user_metadata": opt(STR_MAP), "checkpoint_storage_bytes": opt(int)}
# billing/usage/checkpoints/current
STORAGE_ITEM = {"project_id": opt(str), "org_user_urn": opt(str), "user_email": opt(str), "user_name": opt(str),
                "checkpoint_count": int, "size_bytes": int, "size_gigabytes": float,
                "estimated_monthly_cost_usd": opt(float)}
STORAGE_USAGE = {"effective_rate_usd_per_gigabyte_month": opt(float), "data": lst(STORAGE_ITEM)}
# copy_weights
COPY_WEIGHTS_RESPONSE = {"tinker_path": str}
# save_weights_external: the future's result (SaveWeightsExternalResponseInternal) and the links
SAVE_WEIGHTS_EXTERNAL_RESULT = {"path": opt(str), "size_bytes": opt(int), "type": opt(lit("save_weights_external"))}
EXTERNAL_WEIGHTS_URLS = {"urls": STR_MAP, "expires": DATETIME}
# retrieve_futures: FutureFinished | FutureFailed (discriminated by "state"), FuturesRetrieveResponse
FUTURE_FINISHED = {"state": lit("finished"), "request_id": str, "response_payload_uncompressed_size": opt(int)}
FUTURE_FAILED = {"state": lit("failed"), "request_id": str}
FUTURES_RETRIEVE_RESPONSE = {"completions": lst(union(FUTURE_FINISHED, FUTURE_FAILED)), "cursor": int}
# join_sampling_session
JOIN_SAMPLING_SESSION = {"type": opt(lit("join_sampling_session")), "client_counter": int}
# client/config and client/dynamic_config (the flags the tests read)
CLIENT_CONFIG = {"sample_use_retrieve_futures": opt(bool), "pjwt_auth_enabled": opt(bool)}
CLIENT_DYNAMIC_CONFIG = {"refresh_interval_sec": opt(int), "sample_cancel_enabled": opt(bool),
                         "sample_cancel_max_batch_size": opt(int)}


def parse(t, body, name=""):
    """body when it reads as t, else None (the problems printed)."""
    problems = check(body, t)
    if not problems:
        return body
    print("      does not parse as", name or "the SDK's type", ":", "; ".join(problems)[:400])
    return None
