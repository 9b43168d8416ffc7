"""A tenant training on the wire, for the observability tests: a session, models, and
steps of forward_backward + optim_step with known token counts."""

ADAM = {"learning_rate": 2e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
BASE = "loom/tiny-llama"


def datum(step, i, n_tokens=12):
    seq = [(11 * step + 5 * i + 3 * j * (i + 1)) % 250 + 1 for j in range(n_tokens + 1)]
    x, t = seq[:-1], seq[1:]
    return {"model_input": {"chunks": [{"tokens": x, "type": "encoded_text"}]},
            "loss_fn_inputs": {"target_tokens": {"data": t, "dtype": "int64", "shape": [len(t)]},
                               "weights": {"data": [1.0] * len(t), "dtype": "float32", "shape": [len(t)]}}}


class Trainer:
    def __init__(self, s, key, **session):
        """session: more create_session fields (display_name, user_metadata, project_id)."""
        self.s, self.key, self.seq, self.nmodels = s, key, {}, 0
        st, sess = s.post("/api/v1/create_session", dict({"tags": [], "sdk_version": "0.24.1"}, **session), key=key)
        assert st == 200, sess
        self.sid = sess["session_id"]

    def post(self, path, body):
        return self.s.post(path, body, key=self.key)

    def call(self, path, body):
        st, fut = self.post(path, body)
        assert st == 200, (path, st, fut)
        res = self.s.result(fut["request_id"], key=self.key)
        assert "error" not in res, (path, res)
        return res

    def create(self, rank=4):
        res = self.call("/api/v1/create_model", {"session_id": self.sid, "model_seq_id": self.nmodels,
                                                 "base_model": BASE, "lora_config": {"rank": rank, "seed": 3}})
        self.nmodels += 1
        self.seq[res["model_id"]] = 1
        return res["model_id"]

    def submit(self, mid, path, body):
        """Submits the model's next operation; returns its request_id."""
        st, fut = self.post(path, dict(body, model_id=mid, seq_id=self.seq[mid]))
        assert st == 200, (path, st, fut)
        self.seq[mid] += 1
        return fut["request_id"]

    def fb(self, mid, step, n_datums=2, n_tokens=12):
        return self.submit(mid, "/api/v1/forward_backward", {"forward_backward_input": {
            "data": [datum(step, i, n_tokens) for i in range(n_datums)], "loss_fn": "cross_entropy"}})

    def step(self, mid, step, n_datums=2, n_tokens=12, adam=ADAM):
        """One forward_backward + optim_step, submitted back to back; their results."""
        f1 = self.fb(mid, step, n_datums, n_tokens)
        f2 = self.submit(mid, "/api/v1/optim_step", {"adam_params": adam})
        return self.s.result(f1, key=self.key), self.s.result(f2, key=self.key)

    def op(self, mid, path, body):
        res = self.s.result(self.submit(mid, path, body), key=self.key)
        assert "error" not in res, (path, res)
        return res
