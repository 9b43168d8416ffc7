"""The OpenAI-compatible routes end to end (docs/protocol.md §18), read the way the official
`openai` client reads them (tests/lib/openai_wire.py, an independent SSE decoder and the
shapes of its models), over real HTTP against `loom up` on an 8-layer model (slow enough
on the CPU that a long answer takes a while to decode):

  * /v1/models: the base model, the tenant's sampler checkpoints and aliases, none of
    another tenant's; aliases set with PUT /api/v1/aliases/{alias}, owner only;
  * chat and text completions, streamed and not: the same seed gives the same text both
    ways, usage adds up (prompt_tokens = the chat template's tokens), n choices, stop
    strings cut the text before them;
  * a completion's tokens and logprobs (prompt given as token ids, tokens returned as ids)
    equal asample's for the same checkpoint, prompt and seed, streamed or not; the
    top_logprobs are the distribution's most likely tokens, the sampled one among them
    with the same logprob;
  * streaming delivers tokens as they are made: the first chunk arrives long before the
    executor commits the operation, in many separate bursts;
  * `loom chat` holds a conversation through them (piped: one message a line);
  * isolation (another tenant's checkpoint or alias is a 404), errors in OpenAI's shape
    (401, 400 naming the param, 404 for an unknown route, context length);
  * bounds and clients that go away: while a long request keeps the executor busy,
    --max-streams requests are accepted and the next is 429; closing a stream's connection
    cancels its queued operation (its slot frees at once) and ends a running one at its
    next token; the rest complete, and nothing is wedged after.
Prints "N passed, N failed" last.
"""
import json, os, socket, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import LOOM_BIN, Stack, Results
from apitest import loom_cli
import trainer
from openai_wire import APIError, Client, WireError, assemble, check_chat_completion, check_completion, check_error

R = Results()
MAX_STREAMS = 3


def make_model(d):
    out = os.path.join(d, "m8")
    subprocess.run([LOOM_BIN, "mkmodel", "--arch", "llama", "--out", out, "--layers", "8", "--hidden", "512",
                    "--inter", "1536", "--heads", "8", "--kv-heads", "4", "--head-dim", "64", "--max-pos", "4096",
                    "--seed", "5"], check=True, capture_output=True)
    # As Qwen2.5's base models have it: the chat template ends a turn with <|im_end|>, the
    # tokenizer's eos_token is another token (<|endoftext|>, the model's EOS).
    tc = os.path.join(out, "tokenizer_config.json")
    conf = json.load(open(tc))
    conf["eos_token"] = "<|endoftext|>"
    json.dump(conf, open(tc, "w"), indent=1)
    return out


def expect_error(fn, status, param=None, code=None, what=""):
    try:
        fn()
    except APIError as e:
        ok = e.status == status and (param is None or e.err.get("param") == param) and \
             (code is None or e.err.get("code") == code)
        if not ok:
            print("      got", e.status, e.err)
        return R.check(ok, f"{what}: {status} param={param} code={code}")
    except WireError as e:
        return R.check(False, f"{what}: wire error {e}")
    return R.check(False, f"{what}: no error")


def asample(s, ssid, prompt, seed, max_tokens, temperature=1.0, top_k=-1, top_p=1.0, key="default"):
    st, f = s.post("/api/v1/asample", {"sampling_session_id": ssid, "num_samples": 1, "prompt": {"chunks": [
        {"type": "encoded_text", "tokens": prompt}]}, "sampling_params": {"max_tokens": max_tokens, "seed": seed,
        "temperature": temperature, "top_k": top_k, "top_p": top_p}}, key=key)
    assert st == 200, f
    return s.result(f["request_id"])["sequences"][0]


def ids_of(tokens):
    return [int(t.split(":", 1)[1]) for t in tokens]


def main():
    with tempfile.TemporaryDirectory(prefix="oai-model-", dir="/tmp") as tmp:
        run(make_model(tmp))
    R.finish()


def run(model_dir):
    name = "loom/m8"
    trainer.BASE = name
    with Stack(["--model-dir", model_dir, "--model-name", name, "--max-streams", str(MAX_STREAMS)]) as s:
        secret = os.path.join(s.dir, "secret.key")
        loom_cli(s, "tenant", "create", "tenant-b")
        kb = loom_cli(s, "key", "create", "--tenant", "tenant-b", "--name", "b", "--secret-file", secret)
        A, B = Client(s.url, s.key), Client(s.url, kb)

        # ---- a checkpoint of tenant A -------------------------------------------------------
        t = trainer.Trainer(s, s.key)
        mid = t.create(rank=4)
        for step in range(3):
            t.step(mid, step)
        path = t.op(mid, "/api/v1/save_weights_for_sampler", {"path": "ft1"})["path"]
        R.check(path.startswith("tinker://") and "/sampler_weights/ft1" in path, f"checkpoint {path}")

        # ---- models and aliases ---------------------------------------------------------------
        st, m, _ = A.call("GET", "/v1/models")
        ids = [d["id"] for d in m.get("data", [])] if isinstance(m, dict) else []
        R.check(st == 200 and m.get("object") == "list" and name in ids and path in ids,
                "GET /v1/models: base model and the tenant's checkpoint")
        st, _, _ = A.call("PUT", "/api/v1/aliases/my-ft", {"model_path": path})
        R.check(st == 200, "PUT /api/v1/aliases/my-ft")
        st, m, _ = A.call("GET", "/v1/models")
        R.check("my-ft" in [d["id"] for d in m["data"]], "the alias is listed as a model")
        st, mb, _ = B.call("GET", "/v1/models")
        idsb = [d["id"] for d in mb["data"]]
        R.check(name in idsb and path not in idsb and "my-ft" not in idsb, "tenant B lists neither A's checkpoint nor alias")
        st, e, _ = B.call("PUT", "/api/v1/aliases/mine", {"model_path": path})
        R.check(st == 404, "tenant B cannot alias A's checkpoint (404)")
        st, one, _ = A.call("GET", "/v1/models/" + path)
        R.check(st == 200 and one.get("parent") == name, "GET /v1/models/{tinker path}")

        # ---- chat: not streamed, then streamed ----------------------------------------------------
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello, Loom! \u00e9\u4e16"}]
        body = {"model": "my-ft", "messages": msgs, "max_tokens": 20, "seed": 7, "n": 2, "logprobs": True,
                "top_logprobs": 3, "temperature": 0.8}
        whole = check_chat_completion(A.create("/v1/chat/completions", body))
        R.check(len(whole["choices"]) == 2, "chat n=2: two choices")
        toks = sum(len(c["logprobs"]["content"]) for c in whole["choices"])
        R.check(whole["usage"]["completion_tokens"] == toks, f"usage.completion_tokens = tokens generated ({toks})")
        rendered = subprocess.run([LOOM_BIN, "tokenize", "--model-dir", model_dir], input=json.dumps(
            {"messages": msgs, "add_generation_prompt": True}), capture_output=True, text=True, check=True)
        n_prompt = len(json.loads(rendered.stdout.splitlines()[-1])["ids"])
        R.check(whole["usage"]["prompt_tokens"] == n_prompt,
                f"usage.prompt_tokens = the chat template's tokens ({n_prompt})")
        streamed = A.stream("/v1/chat/completions", dict(body, stream_options={"include_usage": True}))
        got = assemble(streamed, True)
        R.check(all(got[i]["text"] == whole["choices"][i]["message"]["content"] for i in range(2)),
                "streamed chat text = the text of the same request not streamed")
        R.check(all(got[i]["role"] == "assistant" for i in range(2)), "each streamed choice opens with the role")
        R.check(all(got[i]["finish_reason"] == whole["choices"][i]["finish_reason"] for i in range(2)),
                "streamed finish_reason = not streamed")
        R.check(streamed[-1][1].get("usage") == whole["usage"] and streamed[-1][1]["choices"] == [],
                "include_usage: a last chunk with the usage")
        lp_whole = [[(e["token"], e["logprob"]) for e in c["logprobs"]["content"]] for c in whole["choices"]]
        lp_stream = [[(e["token"], e["logprob"]) for e in got[i]["logprobs"]] for i in range(2)]
        R.check(lp_whole == lp_stream, "streamed logprobs = not streamed")
        for c in whole["choices"]:
            for e in c["logprobs"]["content"]:
                tops = [x["logprob"] for x in e["top_logprobs"]]
                if tops != sorted(tops, reverse=True) or len(tops) > 3 or \
                        any(x["token"] == e["token"] and x["logprob"] != e["logprob"] for x in e["top_logprobs"]):
                    R.check(False, f"top_logprobs ordered, at most 3, the sampled token's equal: {e}")
                    break
        R.check(True, "top_logprobs checked")

        # ---- completions = asample -------------------------------------------------------------
        st, ss = s.post("/api/v1/create_sampling_session", {"session_id": t.sid, "model_path": path})
        ssid = ss["sampling_session_id"]
        prompt = [5, 17, 33, 60, 101, 7]
        ref = asample(s, ssid, prompt, seed=11, max_tokens=24, temperature=0.9, top_k=50, top_p=0.95)
        creq = {"model": path, "prompt": prompt, "max_tokens": 24, "seed": 11, "temperature": 0.9, "top_k": 50,
                "top_p": 0.95, "logprobs": 2, "return_tokens_as_token_ids": True}
        cw = check_completion(A.create("/v1/completions", creq))
        lp = cw["choices"][0]["logprobs"]
        R.check(ids_of(lp["tokens"]) == ref["tokens"], f"completion tokens = asample's ({len(ref['tokens'])})")
        R.check(lp["token_logprobs"] == ref["logprobs"], "completion logprobs = asample's, exactly")
        cs = A.stream("/v1/completions", creq)
        sl = assemble(cs, False)[0]["logprobs"]
        R.check(ids_of([x[0] for x in sl]) == ref["tokens"] and [x[1] for x in sl] == ref["logprobs"],
                "streamed completion tokens and logprobs = asample's")
        st, bs = s.post("/api/v1/create_sampling_session", {"session_id": t.sid, "base_model": name})
        refb = asample(s, bs["sampling_session_id"], prompt, seed=3, max_tokens=16)
        cb = A.create("/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 16, "seed": 3, "logprobs": 0,
                                          "return_tokens_as_token_ids": True})
        R.check(ids_of(cb["choices"][0]["logprobs"]["tokens"]) == refb["tokens"] and
                cb["choices"][0]["logprobs"]["token_logprobs"] == refb["logprobs"], "base model: completion = asample")

        # ---- chat ends at the template's end of turn ----------------------------------------------
        im_end = json.loads(subprocess.run([LOOM_BIN, "tokenize", "--model-dir", model_dir, "<|im_end|>"],
                                           capture_output=True, text=True, check=True).stdout)["ids"]
        hot = A.create("/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "Hi"}],
                                                "max_tokens": 200, "n": 4, "seed": 3, "temperature": 20,
                                                "logprobs": True, "return_tokens_as_token_ids": True})
        seqs = [(ids_of([e["token"] for e in c["logprobs"]["content"]]), c["finish_reason"]) for c in hot["choices"]]
        ended = [ids for ids, fin in seqs if fin == "stop" and len(ids) < 200]
        R.check(len(im_end) == 1 and len(ended) >= 1 and all(im_end[0] not in ids[:-1] for ids, _ in seqs),
                f"chat stops at <|im_end|> (id {im_end}), though eos_token is <|endoftext|>: "
                f"{[(len(ids), fin, im_end[0] in ids) for ids, fin in seqs]}")

        # ---- stop strings -----------------------------------------------------------------------
        free = A.create("/v1/completions", {"model": name, "prompt": "Once upon a time", "max_tokens": 40, "seed": 5})
        text = free["choices"][0]["text"]
        stop = next((text[i:i + 2] for i in range(4, len(text) - 2) if text[i:i + 2].isprintable() and
                     text[i:i + 2].strip() and "\ufffd" not in text[i:i + 2]), None)
        if stop:
            cut = A.create("/v1/completions", {"model": name, "prompt": "Once upon a time", "max_tokens": 40, "seed": 5,
                                               "stop": [stop]})["choices"][0]
            R.check(cut["text"] == text[:text.index(stop)] and cut["finish_reason"] == "stop",
                    f"stop {stop!r}: the text ends before it, finish_reason stop")
            sc = assemble(A.stream("/v1/completions", {"model": name, "prompt": "Once upon a time", "max_tokens": 40,
                                                       "seed": 5, "stop": stop}), False)[0]
            R.check(sc["text"] == cut["text"] and sc["finish_reason"] == "stop", "stop string, streamed")
        else:
            R.check(False, f"no stop string candidate in {text!r}")

        # ---- streaming delivers tokens as they are made -------------------------------------------
        # n=4 choices of up to 150 tokens: the operation lasts until the longest one ends
        before = s.psql("SELECT coalesce(max(id), 0) FROM operations")
        wall0 = time.time()
        chunks = A.stream("/v1/completions", {"model": name, "prompt": "Once", "max_tokens": 150, "n": 4, "seed": 1})
        done_at = float(s.psql(f"SELECT extract(epoch FROM finished_at) FROM operations WHERE id > {before} "
                               "ORDER BY id LIMIT 1"))
        content = [t for t, o in chunks if o["choices"] and o["choices"][0]["text"]]
        first, last = wall0 + content[0], wall0 + content[-1]
        bursts = len({round(t, 2) for t in content})
        print(f"     {len(content)} content chunks: the first at {content[0]:.3f} s, the last at {content[-1]:.3f} s, "
              f"the operation committed at {done_at - wall0:.3f} s; {bursts} arrival bursts")
        R.check(first < done_at - 0.3 and first < last - 0.3, "the first chunk arrives well before the last token "
                                                               "is generated")
        R.check(bursts >= 5, "tokens arrive in many separate bursts, not at the end")

        # ---- loom chat ---------------------------------------------------------------------------------
        chat = subprocess.run([LOOM_BIN, "chat", "my-ft", "--url", s.url, "--seed", "9", "--max-tokens", "12",
                               "--system", "be brief"], input="Hello there\nAnd again\n", capture_output=True,
                              text=True, env=dict(os.environ, TINKER_API_KEY=s.key), timeout=120)
        conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello there"}]
        want1 = A.create("/v1/chat/completions", {"model": "my-ft", "messages": conv, "seed": 9, "max_tokens": 12,
                                                  "temperature": 0.7})["choices"][0]["message"]["content"]
        conv += [{"role": "assistant", "content": want1}, {"role": "user", "content": "And again"}]
        want2 = A.create("/v1/chat/completions", {"model": "my-ft", "messages": conv, "seed": 9, "max_tokens": 12,
                                                  "temperature": 0.7})["choices"][0]["message"]["content"]
        R.check(chat.returncode == 0 and chat.stdout == want1 + "\n" + want2 + "\n",
                "loom chat: two turns, each answer streamed = the API's answer to the same conversation")
        bad = subprocess.run([LOOM_BIN, "chat", "nope", "--url", s.url, "--api-key", s.key], input="hi\n",
                             capture_output=True, text=True, timeout=60)
        R.check(bad.returncode == 1 and "does not exist" in bad.stderr, "loom chat: an unknown model is named")

        # ---- isolation and errors ------------------------------------------------------------------
        expect_error(lambda: B.create("/v1/chat/completions", {"model": path, "messages": msgs}), 404, "model",
                     "model_not_found", "tenant B: A's checkpoint")
        expect_error(lambda: B.create("/v1/chat/completions", {"model": "my-ft", "messages": msgs}), 404, "model",
                     "model_not_found", "tenant B: A's alias")
        expect_error(lambda: Client(s.url, None).create("/v1/chat/completions", {"model": name, "messages": msgs}),
                     401, what="no key")
        expect_error(lambda: Client(s.url, "tml-nope-nope-nope").create("/v1/completions", {"model": name}), 401,
                     what="unknown key")
        expect_error(lambda: A.create("/v1/chat/completions", {"model": name, "messages": msgs, "n": 0}), 400, "n",
                     what="n = 0")
        expect_error(lambda: A.create("/v1/chat/completions", {"model": name, "messages": msgs,
                                                               "frequency_penalty": 0.5}), 400, "frequency_penalty",
                     "unsupported_parameter", "frequency_penalty")
        expect_error(lambda: A.create("/v1/chat/completions", {"model": name, "messages": []}), 400, "messages",
                     what="no messages")
        expect_error(lambda: A.create("/v1/chat/completions", {"model": name, "messages": [{"role": "robot",
                                                                                           "content": "x"}]}), 400,
                     "messages[0]", what="unknown role")
        expect_error(lambda: A.create("/v1/completions", {"model": name, "prompt": "x", "max_tokens": 4096}), 400,
                     "max_tokens", "context_length_exceeded", "prompt + max_tokens over the context")
        expect_error(lambda: A.create("/v1/completions", {"model": name, "prompt": [1, 99999]}), 400, "prompt",
                     what="token id outside the vocabulary")
        expect_error(lambda: A.create("/v1/completions", {"model": name, "prompt": "x", "n": 128, "max_tokens": 4000}),
                     400, "n", what="n x max_tokens over the bound")
        st, e, _ = A.call("POST", "/v1/embeddings", {"model": name, "input": "x"})
        R.check(st == 404 and isinstance(e, dict) and "error" in e, "unknown /v1 route: 404 in OpenAI's shape")
        c = A._conn()
        c.request("POST", "/v1/chat/completions", "{not json", A._headers())
        r = c.getresponse()
        eb = json.loads(r.read())
        R.check(r.status == 400 and "error" in eb, "malformed JSON: 400 in OpenAI's shape")

        # ---- bounds, and clients that go away -----------------------------------------------------
        # A long request keeps the executor busy (16 choices of up to 3000 tokens), so the next
        # ones stay queued; with --max-streams 3 a fourth in flight is refused.
        long_c, long_r, _ = A.open_stream("/v1/completions", {"model": name, "prompt": "go", "max_tokens": 3000,
                                                               "n": 16, "seed": 2})
        long_r.readline()
        long_id = s.psql("SELECT max(id) FROM operations")
        held = [A.open_stream("/v1/chat/completions", {"model": name, "messages": msgs, "max_tokens": 8})
                for _ in range(MAX_STREAMS - 1)]
        R.check(all(r.status == 200 for _, r, _ in held), f"{MAX_STREAMS} requests in flight accepted")
        expect_error(lambda: A.create("/v1/chat/completions", {"model": name, "messages": msgs}), 429, None,
                     "rate_limit_exceeded", f"request {MAX_STREAMS + 1} while {MAX_STREAMS} are in flight")
        c0, r0, _ = held.pop(0)
        c0.sock.shutdown(socket.SHUT_RDWR)
        c0.close()
        deadline, accepted = time.time() + 20, None
        while time.time() < deadline and accepted is None:
            c2, r2, _ = A.open_stream("/v1/chat/completions", {"model": name, "messages": msgs, "max_tokens": 8})
            if r2.status == 200:
                accepted = (c2, r2, 0)
            else:
                r2.read()
                c2.close()
                time.sleep(0.3)
        R.check(accepted is not None, "a client that went away frees its slot at once")
        R.check(s.psql("SELECT count(*) FROM operations WHERE state = 'canceled' AND claimed_at IS NULL") == "1",
                "its queued operation is canceled, never run")
        if accepted:
            held.append(accepted)
        # the long one's client leaves: the executor ends its samples at the next token
        long_c.sock.shutdown(socket.SHUT_RDWR)
        long_c.close()
        deadline, res = time.time() + 120, ""
        while time.time() < deadline:
            res = s.psql(f"SELECT state || ' ' || coalesce(result->>'canceled', '-') || ' ' || coalesce((SELECT "
                         f"sum(jsonb_array_length(q->'tokens')) FROM jsonb_array_elements(result->'sequences') q), 0) "
                         f"FROM operations WHERE id = {long_id}")
            if not res.startswith(("queued", "claimed")):
                break
            time.sleep(0.2)
        parts = res.split()
        R.check(len(parts) == 3 and parts[0] == "done" and parts[1] == "true" and int(parts[2]) < 16 * 3000,
                f"a running request whose client left ends early: state, canceled, tokens = {res}")
        for c2, r2, _ in held:
            body = r2.read().decode()
            c2.close()
            R.check(body.rstrip().endswith("data: [DONE]"), "the queued streams complete after it")
        after = A.create("/v1/completions", {"model": name, "prompt": "ok", "max_tokens": 4})
        R.check(after["choices"][0]["finish_reason"] in ("stop", "length"), "the next request runs: nothing wedged")
        log = s.read_log()
        R.check("status=499" in log, "the access log shows the client that went away (499)")


if __name__ == "__main__":
    main()
