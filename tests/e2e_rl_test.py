"""End-to-end RL over real HTTP, in both wire encodings (docs/protocol.md §15 rl_loop).

Per step, as the cookbook's rl_loop does: unnamed save_weights_for_sampler (a snapshot
of the live weights as a sampling session), asample with num_samples = group size,
rewards, advantages = reward - group mean, forward_backward with importance_sampling
(sampler logprobs and advantages, prompt positions padded with 0), optim_step.
Once with JSON bodies and results, once with protobuf forward_backward bodies and
protobuf results (Accept: application/x-protobuf), as SDK 0.25 sends them.

Checks: importance ratios start at 1 (the learner's logprobs equal the sampler's for
the same weights, docs/protocol.md §9.1); the mean reward rises clearly; every op is a row.
Reward: the fraction of generated tokens whose id is below 64 (a quarter of the tiny
model's vocabulary, so a random model starts near 0.25).
"""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import Stack, Results
from wire import result, forward_backward, fb_result, sample_result

STEPS, GROUP, MAX_TOKENS = 16, 8, 8
PROMPT = [5, 17, 33, 2]


def run(s, R, proto):
    tag = "proto" if proto else "json"
    st, sess = s.post("/api/v1/create_session", {"tags": [], "sdk_version": "0.25.0"})
    sid = sess["session_id"]
    st, fut = s.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": "loom/tiny-llama",
                                              "lora_config": {"rank": 8, "seed": 11}})
    model_id = s.result(fut["request_id"])["model_id"]
    seq, sampler_seq = 1, 0
    rewards, ratio_err = [], None
    for step in range(STEPS):
        st, fut = s.post("/api/v1/save_weights_for_sampler", {"model_id": model_id, "seq_id": seq,
                                                              "sampling_session_seq_id": sampler_seq})
        seq += 1
        sampler_seq += 1
        kind, snap = result(s, fut["request_id"], False)
        if st != 200 or "sampling_session_id" not in snap:
            R.check(False, f"{tag} step {step}: snapshot {st} {fut} {snap}")
            return
        st, fut = s.post("/api/v1/asample", {"sampling_session_id": snap["sampling_session_id"], "seq_id": 0,
                                             "num_samples": GROUP, "prompt": {"chunks": [{"tokens": PROMPT}]},
                                             "sampling_params": {"max_tokens": MAX_TOKENS, "temperature": 1.0,
                                                                 "seed": 1000 + step}})
        res = sample_result(s, fut["request_id"], proto)
        if "sequences" not in res or len(res["sequences"]) != GROUP:
            R.check(False, f"{tag} step {step}: sample {res}")
            return
        group = [(q["tokens"], q["logprobs"]) for q in res["sequences"]]
        r = [sum(t < 64 for t in toks) / max(1, len(toks)) for toks, _ in group]
        mean = sum(r) / len(r)
        rewards.append(mean)
        data = []
        for (toks, lps), ri in zip(group, r):
            full = PROMPT + toks
            x, t = full[:-1], full[1:]
            npad = len(PROMPT) - 1
            q = [0.0] * npad + list(lps)
            adv = [0.0] * npad + [ri - mean] * len(toks)
            data.append((x, {"target_tokens": ("int64", t), "logprobs": ("float32", q),
                              "advantages": ("float32", adv)}))
        st, fb = forward_backward(s, model_id, seq, data, "importance_sampling", proto)
        st2, op = s.post("/api/v1/optim_step", {"model_id": model_id, "seq_id": seq + 1,
                                                "adam_params": {"learning_rate": 3e-2}})
        seq += 2
        if st != 200 or st2 != 200:
            R.check(False, f"{tag} step {step}: submit {st} {fb} {st2} {op}")
            return
        out = fb_result(s, fb["request_id"], proto)
        result(s, op["request_id"], False)
        if step == 0:
            # Same weights: learner logprobs of the generated tokens equal the sampler's.
            errs = []
            for (toks, lps), o in zip(group, out["loss_fn_outputs"]):
                learner = o["logprobs"]["data"][len(PROMPT) - 1:]
                errs += [abs(a - b) for a, b in zip(learner, lps)]
            ratio_err = max(errs)
        print(f"{tag} step {step:2d}  mean reward {mean:.3f}  loss:sum {out['metrics'].get('loss:sum', 0):.3f}")
    R.check(ratio_err is not None and ratio_err < 1e-3,
            f"{tag}: importance ratios start at 1 (max |learner - sampler| logprob {ratio_err:.2e})")
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    R.check(last > first + 0.2, f"{tag}: mean reward rose clearly: {first:.3f} -> {last:.3f}")
    n = int(s.psql(f"SELECT count(*) FROM operations WHERE model_id = '{model_id}' AND state = 'done'"))
    R.check(n == 1 + 3 * STEPS, f"{tag}: every model op is a done row ({n})")
    n = int(s.psql(f"SELECT count(*) FROM operations o JOIN sampling_sessions ss ON ss.id = o.sampling_session_id"
                   f" WHERE ss.source_model_id = '{model_id}' AND o.kind = 'sample' AND o.state = 'done'"))
    R.check(n == STEPS, f"{tag}: every sample op is a done row ({n})")


def main():
    R = Results()
    with Stack() as s:
        run(s, R, proto=False)
        run(s, R, proto=True)
    R.finish()


if __name__ == "__main__":
    main()
