"""The OpenAI wire as the official `openai` Python client reads it, written independently
of Loom (the client itself cannot be installed here): its SSE decoder (openai._streaming:
fields split at the first ':', one leading space dropped, events dispatched at a blank
line, comments ignored, the stream ends at data '[DONE]', a chunk with "error" raises),
and the shapes its pydantic models require of ChatCompletion, ChatCompletionChunk,
Completion and error bodies. Every check raises WireError naming what is wrong."""
import http.client, json, time, urllib.parse


class WireError(Exception):
    pass


class APIError(Exception):
    """What the client raises for an error body (status, type, param, code, message)."""
    def __init__(self, status, err):
        super().__init__(f"{status} {err}")
        self.status, self.err = status, err


def need(cond, what):
    if not cond:
        raise WireError(what)


def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


FINISH = {"stop", "length", "tool_calls", "content_filter", "function_call"}


def check_usage(u):
    need(isinstance(u, dict), f"usage is not an object: {u!r}")
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        need(isinstance(u.get(k), int), f"usage.{k} is not an int: {u!r}")
    need(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], f"usage does not add up: {u!r}")


def check_top(t, chat):
    need(isinstance(t.get("token"), str) and is_num(t.get("logprob")), f"top logprob entry: {t!r}")
    if chat:
        need(t.get("bytes") is None or all(isinstance(b, int) and 0 <= b < 256 for b in t["bytes"]), f"bytes: {t!r}")


def check_chat_logprobs(lp):
    if lp is None:
        return
    need(isinstance(lp.get("content"), list), f"logprobs.content is not a list: {lp!r}")
    for e in lp["content"]:
        check_top(e, True)
        need(isinstance(e.get("top_logprobs"), list), f"top_logprobs is not a list: {e!r}")
        for t in e["top_logprobs"]:
            check_top(t, True)


def check_completion_logprobs(lp):
    if lp is None:
        return
    for k in ("tokens", "token_logprobs", "text_offset"):
        need(isinstance(lp.get(k), list), f"logprobs.{k} is not a list: {lp!r}")
    need(len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]), "logprobs lists differ in length")
    need(all(isinstance(t, str) for t in lp["tokens"]) and all(is_num(x) for x in lp["token_logprobs"]),
         "logprobs.tokens / token_logprobs types")
    tl = lp.get("top_logprobs")
    need(tl is None or (isinstance(tl, list) and all(isinstance(d, dict) for d in tl)), "logprobs.top_logprobs")


def check_common(o, obj):
    need(isinstance(o, dict), f"answer is not an object: {o!r}")
    need(o.get("object") == obj, f"object is {o.get('object')!r}, not {obj!r}")
    need(isinstance(o.get("id"), str) and o["id"], "id")
    need(isinstance(o.get("created"), int), "created")
    need(isinstance(o.get("model"), str), "model")
    need(isinstance(o.get("choices"), list), "choices")


def check_chat_completion(o):
    check_common(o, "chat.completion")
    for c in o["choices"]:
        need(isinstance(c.get("index"), int), f"choice.index: {c!r}")
        m = c.get("message")
        need(isinstance(m, dict) and m.get("role") == "assistant", f"message.role: {c!r}")
        need(m.get("content") is None or isinstance(m["content"], str), "message.content")
        need(c.get("finish_reason") in FINISH, f"finish_reason {c.get('finish_reason')!r}")
        check_chat_logprobs(c.get("logprobs"))
    check_usage(o.get("usage"))
    return o


def check_completion(o):
    check_common(o, "text_completion")
    for c in o["choices"]:
        need(isinstance(c.get("index"), int) and isinstance(c.get("text"), str), f"choice: {c!r}")
        need(c.get("finish_reason") in FINISH, f"finish_reason {c.get('finish_reason')!r}")
        check_completion_logprobs(c.get("logprobs"))
    check_usage(o.get("usage"))
    return o


def check_chunk(o, chat):
    check_common(o, "chat.completion.chunk" if chat else "text_completion")
    for c in o["choices"]:
        need(isinstance(c.get("index"), int), f"chunk choice.index: {c!r}")
        if chat:
            d = c.get("delta")
            need(isinstance(d, dict), f"delta: {c!r}")
            need(d.get("content") is None or isinstance(d["content"], str), "delta.content")
            need(d.get("role") in (None, "assistant"), "delta.role")
            check_chat_logprobs(c.get("logprobs"))
        else:
            need(isinstance(c.get("text"), str), f"chunk text: {c!r}")
            check_completion_logprobs(c.get("logprobs"))
        need(c.get("finish_reason") is None or c["finish_reason"] in FINISH, "chunk finish_reason")
    if o.get("usage") is not None:
        check_usage(o["usage"])
    return o


def check_error(status, body):
    """An error answer as the client turns it into an exception: {"error": {...}}."""
    need(isinstance(body, dict) and isinstance(body.get("error"), dict), f"error body: {body!r}")
    e = body["error"]
    need(isinstance(e.get("message"), str) and e["message"], "error.message")
    need(isinstance(e.get("type"), str), "error.type")
    need("param" in e and "code" in e, "error.param / error.code")
    return APIError(status, e)


def sse_events(lines):
    """openai._streaming.SSEDecoder over an iterator of (time, line bytes): yields
    (time, event, data) at each blank line that ends an event with data."""
    data, event = [], None
    for t, raw in lines:
        line = raw.decode("utf-8").rstrip("\n").rstrip("\r")
        if not line:
            if data or event:
                yield t, event, "\n".join(data)
            data, event = [], None
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value


class Client:
    """A minimal OpenAI client over http.client: Bearer key, JSON bodies."""
    def __init__(self, base_url, key, timeout=300):
        u = urllib.parse.urlparse(base_url)
        self.host, self.port, self.key, self.timeout = u.hostname, u.port, key, timeout

    def _conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def _headers(self):
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = "Bearer " + self.key
        return h

    def call(self, method, path, body=None):
        """(status, parsed body, headers)."""
        c = self._conn()
        c.request(method, path, json.dumps(body) if body is not None else None, self._headers())
        r = c.getresponse()
        raw = r.read()
        c.close()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw
        return r.status, parsed, dict(r.getheaders())

    def create(self, path, body):
        """A non-streamed completion; raises APIError as the client would."""
        st, o, _ = self.call("POST", path, body)
        if st != 200:
            raise check_error(st, o)
        return o

    def open_stream(self, path, body):
        """Starts a streamed completion: (connection, response, start time)."""
        c = self._conn()
        t0 = time.time()
        c.request("POST", path, json.dumps(dict(body, stream=True)), self._headers())
        r = c.getresponse()
        return c, r, t0

    def stream(self, path, body, on_chunk=None):
        """A streamed completion: [(arrival seconds, chunk)], as the client yields them
        (chunks checked; an error chunk raises APIError). The stream must end with [DONE]."""
        c, r, t0 = self.open_stream(path, body)
        if r.status != 200:
            raw = r.read()
            c.close()
            raise check_error(r.status, json.loads(raw))
        need(r.getheader("content-type", "").startswith("text/event-stream"), "content-type of a stream")
        chat = path.endswith("chat/completions")
        out, done = [], False

        def lines():
            while True:
                line = r.readline()
                if not line:
                    return
                yield time.time() - t0, line

        for t, _event, data in sse_events(lines()):
            if data.startswith("[DONE]"):
                done = True
                break
            o = json.loads(data)
            if isinstance(o, dict) and o.get("error"):
                c.close()
                raise check_error(200, o)
            check_chunk(o, chat)
            out.append((t, o))
            if on_chunk:
                on_chunk(t, o)
        c.close()
        need(done, "the stream ended without data: [DONE]")
        return out


def assemble(chunks, chat):
    """The choices of a stream: {index: {"text", "finish_reason", "logprobs": [...], "role"}}."""
    res = {}
    for _t, o in chunks:
        for c in o["choices"]:
            e = res.setdefault(c["index"], {"text": "", "finish_reason": None, "logprobs": [], "role": None})
            if chat:
                d = c["delta"]
                e["role"] = e["role"] or d.get("role")
                e["text"] += d.get("content") or ""
                if c.get("logprobs"):
                    e["logprobs"] += c["logprobs"]["content"]
            else:
                e["text"] += c["text"]
                if c.get("logprobs"):
                    lp = c["logprobs"]
                    e["logprobs"] += list(zip(lp["tokens"], lp["token_logprobs"]))
            if c.get("finish_reason"):
                e["finish_reason"] = c["finish_reason"]
    return res


def run_streams(client, path, bodies, timeout=600):
    """Streams every body at once (one thread each); per stream a dict: ttft (seconds to
    the first chunk with text), t_done, tokens (usage.completion_tokens), finish (the
    finish_reasons), text, error (None, or what went wrong)."""
    import threading
    out = [None] * len(bodies)
    start = threading.Barrier(len(bodies))

    def one(i):
        res = {"ttft": None, "t_done": None, "tokens": 0, "finish": [], "text": "", "error": None}
        chat = path.endswith("chat/completions")
        start.wait()
        t0 = time.time()

        def on_chunk(t, o):
            for c in o["choices"]:
                txt = (c["delta"].get("content") if chat else c["text"]) or ""
                if txt and res["ttft"] is None:
                    res["ttft"] = t
                res["text"] += txt
                if c.get("finish_reason"):
                    res["finish"].append(c["finish_reason"])
            if o.get("usage"):
                res["tokens"] = o["usage"]["completion_tokens"]
        try:
            client.stream(path, dict(bodies[i], stream_options={"include_usage": True}), on_chunk)
            res["t_done"] = time.time() - t0
        except Exception as e:  # noqa: BLE001 - reported per stream
            res["error"] = repr(e)
        out[i] = res

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return out
