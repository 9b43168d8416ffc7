"""Every Tinker SDK generation users install, on the wire: 0.16, 0.18, 0.24, 0.25, 0.27,
0.30, 0.33 and 0.38, each with the requests that version sends and the answers parsed the
way that version parses them (tests/lib/sdk_gen.py). Where each generation's behaviour
comes from (github.com/thinking-machines-lab/tinker unless said otherwise):

  0.16.1, 0.18.0, 0.24.1, 0.25.0  the SDK's source at those releases (07bd3c2, 30517b6,
                                  6b02536, d595dc2);
  0.27.1  0.25 plus the 0.26.2 files (retrieve_futures, copy_weights, client flags); its
          refusal of sample results without sample_sequence_ids is stated by SkyRL's and
          GMI tinker-cloud's protocol tests, which drive 0.27.1;
  0.30.4  types/optimizer.py and optim_step_request.py of 0.30.x, sample_request.py and the
          protobuf descriptor of ~0.30-0.31, and the 0.32.0 training/sampling clients;
  0.33.1  no source published: the 0.32.0 clients plus tinker-cloud's tests for "the 0.33
          SDK" (prompt_logprobs_last_n, sessions/{id}/finish, join_sampling_session);
  0.38.0  no source published: as 0.33 plus the docs site's type reference generated
          from 0.34-0.39 (ServiceClient(display_name), search and upload types).

One `loom up` for all of them; per generation a ServiceClient (client/config from 0.18,
create_session, client/dynamic_config from 0.25, a heartbeat) and then:

1. SFT: a LoRA model (0.30+: optimizer_config adamw), 6 steps of forward_backward
   (JSON until 0.24, protobuf from 0.25) + optim_step; the mean NLL must fall. A `forward`
   of 1025 datums is sent in the generation's chunks (1024 a chunk; 0.18.2+ send the
   chunks in parallel, the first one last) and must equal the unchunked outputs.
2. save_state, one more step, load_state_with_optimizer: the loss is back to the saved one.
3. save_weights_for_sampler + create_sampling_client(model_path) + compute_logprobs: the
   prompt logprobs equal the trained model's forward logprobs.
4. RL: save_weights_and_get_sampling_client, sample 4 completions (0.27+ refuse an answer
   without one sample_sequence_id per sequence), compute_logprobs of prompt + completion
   equals the sampled logprobs, and an importance_sampling (until 0.25) or ppo (0.27+,
   with provenance spans from 0.30) forward_backward whose learner logprobs equal the
   sampler's (ratio 1), then optim_step.
5. REST as the generation reads it: the run, its checkpoints, the archive URL (0.16/0.18
   send two Accept headers and take only a 302), the archive itself.
6. 0.30+: ServiceClient.close -> sessions/{id}/finish, after which a heartbeat is 410.

A failure names the generation and what is missing ("0.27: asample answer has no
sample_sequence_ids"). Prints "N passed, N failed" last.
"""
import math
import os
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from sdk_gen import GEN_LIST, Client, SdkError  # noqa: E402
from stack import Results, Stack  # noqa: E402

R = Results()
SEQS = [[(7 * i + 3 * j) % 251 + 1 for j in range(16)] for i in range(4)]
PROMPT = [5, 17, 33, 2]
GROUP, MAX_TOKENS = 4, 6


def ce_datum(seq):
    x, t = seq[:-1], seq[1:]
    return (x, {"target_tokens": ("int64", t), "weights": ("float32", [1.0] * len(t))})


def nll(out, n_tokens):
    return -sum(sum(o["logprobs"]["data"]) for o in out["loss_fn_outputs"]) / n_tokens


def close(a, b, tol):
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


class Phase:
    """Runs one part of a generation's loop; an SdkError (what that SDK would raise) or a
    broken expectation fails it with the generation's name, and the next part still runs."""

    def __init__(self, g, name):
        self.g, self.name = g, name

    def __enter__(self):
        return self

    def __exit__(self, typ, e, tb):
        if typ is None:
            return False
        if issubclass(typ, Exception):
            msg = str(e) if isinstance(e, SdkError) else f"{self.g.name}: {typ.__name__}: {e}"
            R.check(False, f"{self.name}: {msg}")
            return True
        return False


def run(s, g, base):
    tag = g.name
    c = None
    with Phase(g, "ServiceClient()"):
        c = Client(s, g, user_metadata={"generation": g.name})
        R.check(True, f"{tag}: client/config {'sent' if g.client_config else 'not sent'}, create_session "
                      f"{c.session_id[:8]}, dynamic_config {'sent' if g.dynamic_config else 'not sent'}, heartbeat")
    if c is None:
        return
    model = None
    with Phase(g, "SFT"):
        caps = c.get_server_capabilities()
        R.check(base in [m.get("model_name") for m in caps["supported_models"]], f"{tag}: capabilities list {base}")
        opt = {"type": "adamw"} if g.optimizer_families else None
        model = c.create_lora_training_client(base, rank=8, seed=3, user_metadata={"generation": g.name},
                                              optimizer=opt)
        info = c.get_info(model)
        R.check(info["model_id"] == model and info.get("lora_rank") == 8, f"{tag}: get_info {info.get('lora_rank')}")
        data = [ce_datum(q) for q in SEQS]
        ntok = sum(len(q) - 1 for q in SEQS)
        losses = []
        for step in range(6):
            out = c.forward_backward(model, data, "cross_entropy")
            c.optim_step(model, 2e-2, beta1=0.9, beta2=0.95, eps=1e-8)
            losses.append(nll(out, ntok))
        R.check(all(math.isfinite(x) for x in losses) and losses[-1] < 0.9 * losses[0],
                f"{tag}: SFT loss falls over 6 steps: {' '.join(f'{x:.3f}' for x in losses)}")

        many = [([(i * 13 + j) % 250 + 1 for j in range(3)], {"target_tokens": ("int64", [(i * 13 + j + 1) % 250 + 1
                for j in range(3)])}) for i in range(1025)]
        big = c.forward(model, many)
        small = c.forward(model, [many[0], many[1024]])
        pick = lambda o, i: o["loss_fn_outputs"][i]["logprobs"]["data"]  # noqa: E731
        R.check(big["chunks"] == 2 and len(big["loss_fn_outputs"]) == 1025
                and close(pick(big, 0), pick(small, 0), 1e-4) and close(pick(big, 1024), pick(small, 1), 1e-4),
                f"{tag}: forward of 1025 datums in {big['chunks']} chunks "
                f"({'parallel, first chunk last' if g.parallel_chunks else 'in order'}) equals the unchunked outputs")
    if model is None:
        return

    with Phase(g, "save_state / load_state"):
        path = c.save_state(model, f"sft-{tag}", ttl_seconds=None)
        saved = nll(c.forward(model, data), ntok)
        c.forward_backward(model, data, "cross_entropy")
        c.optim_step(model, 2e-2, beta1=0.9, beta2=0.95, eps=1e-8)
        moved = nll(c.forward(model, data), ntok)
        res = c.load_state(model, path, optimizer=True)
        back = nll(c.forward(model, data), ntok)
        R.check(path == f"tinker://{model}/weights/sft-{tag}" and moved != saved and abs(back - saved) < 1e-5,
                f"{tag}: save_state {path.split('/', 3)[-1]}, a step moves the loss {saved:.4f} -> {moved:.4f}, "
                f"load_state_with_optimizer brings it back: {back:.4f} ({res.get('path') == path})")

    with Phase(g, "sampler from saved weights"):
        spath = c.save_weights_for_sampler(model, f"sampler-{tag}")
        sc = c.create_sampling_client(model_path=spath)
        lp = c.compute_logprobs(sc, SEQS[0])
        fw = c.forward(model, [ce_datum(SEQS[0])])["loss_fn_outputs"][0]["logprobs"]["data"]
        R.check(lp[0] is None and close(lp[1:], fw, 1e-3),
                f"{tag}: save_weights_for_sampler + create_sampling_client: compute_logprobs equals the "
                f"model's forward (max diff {max(abs(a - b) for a, b in zip(lp[1:], fw)):.1e})")
        smp = c.get_sampler(sc)
        R.check(smp["sampler_id"] == sc and smp["base_model"] == base and smp.get("model_path") == spath,
                f"{tag}: GET samplers/{{id}} {smp}")

    with Phase(g, "RL step"):
        rl_step(c, g, model)

    with Phase(g, "REST"):
        run_info = c.rest("GET", f"/api/v1/training_runs/{model}", "training_run", "get_training_run")
        R.check(run_info["training_run_id"] == model and run_info.get("user_metadata") == {"generation": g.name},
                f"{tag}: get_training_run reads as TrainingRun, user_metadata kept")
        cks = c.rest("GET", f"/api/v1/training_runs/{model}/checkpoints", "checkpoints", "list_checkpoints")
        ids = sorted(k["checkpoint_id"] for k in cks["checkpoints"])
        R.check(ids == sorted([f"weights/sft-{tag}", f"sampler_weights/sampler-{tag}"]),
                f"{tag}: list_checkpoints reads as CheckpointsListResponse: {ids}")
        url = c.get_checkpoint_archive_url(model, f"weights/sft-{tag}")
        req = urllib.request.Request(url["url"], headers={"Range": "bytes=0-511"})
        with urllib.request.urlopen(req, timeout=60) as r:
            head = r.read()
        R.check(len(head) == 512 and head[257:262] == b"ustar",
                f"{tag}: get_checkpoint_archive_url ({' + '.join(g.archive_accepts)}) and the archive (a tar)")

    if g.close:
        with Phase(g, "close"):
            c.close("success", "sdk_generations_test")
            r = c.post("/api/v1/session_heartbeat", c.body("heartbeat", session_id=c.session_id))
            R.check(r.status == 410, f"{tag}: ServiceClient.close finished the session: a heartbeat now answers "
                                     f"{r.status} (410 expected)")


def rl_step(c, g, model):
    tag = g.name
    sc = c.save_weights_and_get_sampling_client(model)
    res = c.sample(sc, PROMPT, GROUP, {"max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": 11})
    seqs = res["sequences"]
    R.check(len(seqs) == GROUP and all(len(q["tokens"]) == len(q["logprobs"]) > 0 for q in seqs),
            f"{tag}: sample num_samples={GROUP}: {[len(q['tokens']) for q in seqs]} tokens with logprobs")
    if g.needs_sample_ids:
        ids = [q["sequence_id"] for q in seqs]
        R.check(len(set(ids)) == GROUP, f"{tag}: one distinct sequence_id per sequence: {ids}")
    toks0, lps0 = seqs[0]["tokens"], seqs[0]["logprobs"]
    plp = c.compute_logprobs(sc, PROMPT + toks0)
    R.check(close(plp[len(PROMPT):], lps0, 1e-3),
            f"{tag}: compute_logprobs of prompt + completion equals the sampled logprobs")
    if g.last_n:
        # 0.33: compute_logprobs(prompt, prompt_logprobs_last_n=n) scores the completion only
        tail = c.compute_logprobs(sc, PROMPT + toks0, prompt_logprobs_last_n=len(toks0))
        R.check(all(x is None for x in tail[:len(PROMPT)]) and close(tail[len(PROMPT):], lps0, 1e-3),
                f"{tag}: compute_logprobs with prompt_logprobs_last_n={len(toks0)}: None before the completion, "
                f"the sampled logprobs on it")
    rewards = [sum(t < 64 for t in q["tokens"]) / len(q["tokens"]) for q in seqs]
    mean = sum(rewards) / len(rewards)
    data, spans = [], []
    npad = len(PROMPT) - 1
    for q, r in zip(seqs, rewards):
        full = PROMPT + q["tokens"]
        data.append((full[:-1], {"target_tokens": ("int64", full[1:]),
                                 "logprobs": ("float32", [0.0] * npad + q["logprobs"]),
                                 "advantages": ("float32", [0.0] * npad + [r - mean] * len(q["tokens"]))}))
        spans.append([(q["sequence_id"], 0, len(q["tokens"]))] if "sequence_id" in q else [])
    loss = "importance_sampling" if g.v < (0, 27) else "ppo"
    cfg = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2} if loss == "ppo" else None
    out = c.forward_backward(model, data, loss, cfg, spans=spans)
    err = max(abs(a - b) for q, o in zip(seqs, out["loss_fn_outputs"])
              for a, b in zip(o["logprobs"]["data"][npad:], q["logprobs"]))
    step = c.optim_step(model, 1e-2)
    R.check(err < 1e-3 and math.isfinite(out["metrics"].get("loss:sum", float("nan")))
            and "metrics" in step,
            f"{tag}: {loss} forward_backward with advantages{' and provenance spans' if g.v >= (0, 30) else ''}: "
            f"learner logprobs equal the sampler's (max diff {err:.1e}), optim_step done")


def main():
    with Stack() as s:
        st, caps = s.get("/api/v1/get_server_capabilities")
        base = caps["supported_models"][0]["model_name"]
        for g in GEN_LIST:
            print(f"---- SDK {g.version}: {g.source}")
            run(s, g, base)
    R.finish()


if __name__ == "__main__":
    main()
