#!/usr/bin/env python3
"""loss_check_test.py: one validation of a forward_backward, and losses that overflow.

- The api and the executor check a forward_backward with the same rules
  (contract/fb_check.h). A loss_fn_config with clip_low_threshold above
  clip_high_threshold is a 400 at submit (ppo and cispo), recorded as a refused seq_id.
- A payload that breaks a rule anyway (written past the api) fails its own operation in
  the executor and nothing else: another tenant's operation in the same packed batch
  completes.
- A loss that overflows float32 (importance_sampling with a sampler logprob of -1000 at
  one position, advantage 1) fails its operation with a message naming the datum and
  position, category user, and adds no gradient: the model's next optim_step succeeds
  with exactly the gradient norm of a twin model that never got the bad operation, while
  the other operations of the same packed batch complete. A `forward` with such a loss
  fails the same way.
Prints "N passed, N failed" last.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from apitest import is_detail, loom_cli  # noqa: E402
import packed  # noqa: E402
from stack import Results, Stack  # noqa: E402

R = Results()
BASE = "loom/tiny-llama"
TOKENS = [5, 6, 7, 8, 9]


def datum(loss, q=None, adv=1.0):
    n = len(TOKENS)
    lfi = {"target_tokens": {"data": [t + 1 for t in TOKENS], "dtype": "int64", "shape": [n]}}
    if loss == "cross_entropy":
        lfi["weights"] = {"data": [1.0] * n, "dtype": "float32", "shape": [n]}
    else:
        lfi["logprobs"] = {"data": q if q is not None else [-2.0] * n, "dtype": "float32", "shape": [n]}
        lfi["advantages"] = {"data": [adv] * n, "dtype": "float32", "shape": [n]}
    return {"model_input": {"chunks": [{"tokens": TOKENS, "type": "encoded_text"}]}, "loss_fn_inputs": lfi}


def main():
    with Stack() as s:
        secret = os.path.join(s.dir, "secret.key")
        loom_cli(s, "tenant", "create", "bob")
        key_b = loom_cli(s, "key", "create", "--tenant", "bob", "--secret-file", secret)

        def model(key, seed=None):
            sid = s.post("/api/v1/create_session", {}, key=key)[1]["session_id"]
            lc = {"rank": 4} if seed is None else {"rank": 4, "seed": seed}
            f = s.post("/api/v1/create_model", {"session_id": sid, "base_model": BASE, "lora_config": lc},
                       key=key)[1]
            return s.result(f["request_id"], key=key)["model_id"]

        def fb(key, m, seq, loss, data, config=None, route="forward_backward"):
            inp = {"loss_fn": loss, "data": data}
            if config is not None:
                inp["loss_fn_config"] = config
            return s.post(f"/api/v1/{route}", {"model_id": m, "seq_id": seq,
                                                 ("forward_input" if route == "forward" else
                                                  "forward_backward_input"): inp}, key=key)

        def cycle_of(request_id):
            return s.psql(f"SELECT cycle_id FROM operations WHERE request_id = '{request_id}'")

        def paused(submit):
            """Runs submit() with the queue held (the scheduler and the executor stopped), so
            that what it queues lands in one cycle (whatever would be built as they arrive
            one by one)."""
            with s.queue_held():
                return submit()

        a = model(s.key)
        b = model(key_b)

        # ---- clip bounds: a 400 at submit --------------------------------------------------
        for loss in ("ppo", "cispo"):
            r = fb(s.key, a, 1, loss, [datum(loss)], {"clip_low_threshold": 1.5, "clip_high_threshold": 0.5})
            R.check(is_detail(r, 400, "clip_low_threshold", "clip_high_threshold"),
                    f"{loss}: clip_low_threshold > clip_high_threshold is a 400 at submit")
        R.check(s.psql(f"SELECT state || ':' || error_category FROM operations WHERE model_id = '{a}' AND seq_id = 1")
                == "failed:user", "the refused seq_id is recorded as a failed operation (the next ones run)")
        st, f = fb(s.key, a, 2, "ppo", [datum("ppo")], {"clip_low_threshold": 0.9, "clip_high_threshold": 0.9})
        R.check(st == 200 and "loss_fn_outputs" in s.result(f["request_id"]), "ppo with equal clip bounds runs")

        # ---- the executor's defence fails one operation only --------------------------------
        good = datum("cross_entropy")
        bad_header = json.dumps({"loss_fn": "ppo", "loss_fn_config": {"clip_low_threshold": 1.5,
                                                                       "clip_high_threshold": 0.5}, "datums": 1})
        bad_bin = packed.payload_bytes("ppo", [{"tokens": TOKENS, "target_tokens": [t + 1 for t in TOKENS],
                                                "logprobs": [-2.0] * 5, "advantages": [1.0] * 5}],
                                       clip_low=1.5, clip_high=0.5).hex()

        def submit_both():
            st, f = fb(s.key, a, 3, "cross_entropy", [good])
            s.psql("INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, payload_bin,"
                   f" n_tokens) SELECT 'req-bad-payload', tenant_id, id, 1, 'forward_backward', '{bad_header}'::jsonb,"
                   f" decode('{bad_bin}', 'hex'), 5 FROM models WHERE id = '{b}'; NOTIFY loom_op_queued")
            return f["request_id"]
        good_req = paused(submit_both)
        rb = s.result("req-bad-payload", key=key_b)
        ra = s.result(good_req)
        R.check("clip_low_threshold" in rb.get("error", "") and rb.get("category") == "user",
                f"a payload past the api that breaks a rule fails in the executor: {rb}")
        R.check("loss_fn_outputs" in ra and cycle_of(good_req) == cycle_of("req-bad-payload"),
                "another tenant's operation in the same packed batch completes")

        # ---- an overflowing loss adds no gradient ------------------------------------------
        b2, twin = model(key_b, seed=7), model(key_b, seed=7)
        q = [-2.0, -1000.0, -2.0, -2.0, -2.0]   # one position overflows: exp(lp + 1000)

        def submit_batch():
            r1 = fb(key_b, b2, 1, "cross_entropy", [good])[1]["request_id"]
            r2 = fb(key_b, b2, 2, "importance_sampling", [datum("importance_sampling"),
                                                          datum("importance_sampling", q)])[1]["request_id"]
            r3 = fb(s.key, a, 4, "cross_entropy", [good])[1]["request_id"]
            return r1, r2, r3
        r1, r2, r3 = paused(submit_batch)
        o1, o2, o3 = s.result(r1, key=key_b), s.result(r2, key=key_b), s.result(r3)
        err = o2.get("error", "")
        R.check(o2.get("category") == "user" and "data[1] position 1" in err and "-1000" in err
                and "no gradient" in err, f"the overflowing operation fails with a message naming datum and position: {o2}")
        R.check("loss_fn_outputs" in o1 and "loss_fn_outputs" in o3 and cycle_of(r1) == cycle_of(r2) == cycle_of(r3),
                "the other operations of the packed batch (same model, another tenant) complete")
        st, f = s.post("/api/v1/optim_step", {"model_id": b2, "seq_id": 3, "adam_params": {"learning_rate": 1e-3}},
                       key=key_b)
        step = s.result(f["request_id"], key=key_b)
        fb(key_b, twin, 1, "cross_entropy", [good])
        st, f = s.post("/api/v1/optim_step", {"model_id": twin, "seq_id": 2, "adam_params": {"learning_rate": 1e-3}},
                       key=key_b)
        ref = s.result(f["request_id"], key=key_b)
        g, g_ref = step.get("metrics", {}).get("grad_norm:mean"), ref.get("metrics", {}).get("grad_norm:mean")
        R.check(g is not None and g_ref and abs(g - g_ref) <= 1e-5 * g_ref,
                f"the next optim_step succeeds with the twin's gradient norm ({g} vs {g_ref}): {step}")

        st, f = fb(key_b, b2, 4, "importance_sampling", [datum("importance_sampling", q)], route="forward")
        r = s.result(f["request_id"], key=key_b) if st == 200 else {}
        R.check(r.get("category") == "user" and "position 1" in r.get("error", ""),
                f"a forward with an overflowing loss fails with the message: {r}")
    R.finish()


if __name__ == "__main__":
    main()
