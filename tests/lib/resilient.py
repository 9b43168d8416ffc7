"""A training client that rides out a service in trouble, as the SDK does: a refused
connection, a 5xx or a 503 is retried with the same seq_id (submits are idempotent on
(model_id, seq_id)), a pending future is polled again. And a persistent psql session for
tests that watch the database closely (a query costs a round trip, not a process)."""
import json, subprocess, time, urllib.error, urllib.request

ADAM = {"learning_rate": 2e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}


class Client:
    def __init__(self, url, key, deadline_s=300):
        self.url, self.key, self.deadline_s = url, key, deadline_s
        self.retries = 0

    def post(self, path, body):
        """The JSON answer of a 200 (4xx raise), retrying what a restart or outage causes."""
        deadline = time.time() + self.deadline_s
        data = json.dumps(body).encode()
        while True:
            req = urllib.request.Request(self.url + path, data=data, method="POST",
                                         headers={"Content-Type": "application/json", "X-API-Key": self.key})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                if e.code < 500:
                    raise RuntimeError(f"{path}: {e.code} {e.read()[:300]}")
                err = f"{e.code}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
                err = str(e)
            if time.time() > deadline:
                raise TimeoutError(f"{path}: still failing after {self.deadline_s} s: {err}")
            self.retries += 1
            time.sleep(0.2)

    def result(self, request_id):
        deadline = time.time() + self.deadline_s
        while time.time() < deadline:
            r = self.post("/api/v1/retrieve_future", {"request_id": request_id})
            if r.get("type") != "try_again":
                return r
        raise TimeoutError(request_id)

    def call(self, path, body):
        return self.result(self.post(path, body)["request_id"])


def datum(tag, step, i, n=24):
    seq = [(7 * step + 13 * i + 5 * j * (i + 1) + 11 * len(tag) * j) % 250 + 1 for j in range(n + 1)]
    return {"model_input": {"chunks": [{"tokens": seq[:-1], "type": "encoded_text"}]},
            "loss_fn_inputs": {"target_tokens": {"data": seq[1:], "dtype": "int64"},
                               "weights": {"data": [1.0] * n, "dtype": "float32"}}}


def sft_loop(c, tag, seed, steps, base="loom/tiny-llama", rank=4, datums=8, on_step=None, times=None):
    """An SFT loop on the wire: create_session, create_model, `steps` x (forward_backward +
    optim_step sent back to back), save_weights. Returns (model_id, [loss:sum per step],
    [step:max per step], checkpoint path); each step's seconds (submit to both results) are
    appended to `times` when given."""
    sid = c.post("/api/v1/create_session", {"tags": [tag]})["session_id"]
    fut = c.post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": base,
                                          "lora_config": {"rank": rank, "seed": seed}})
    mid = c.result(fut["request_id"])["model_id"]
    losses, steps_seen = [], []
    for k in range(1, steps + 1):
        t0 = time.time()
        fb = c.post("/api/v1/forward_backward", {"model_id": mid, "seq_id": 2 * k - 1, "forward_backward_input": {
            "data": [datum(tag, k, i) for i in range(datums)], "loss_fn": "cross_entropy"}})
        op = c.post("/api/v1/optim_step", {"model_id": mid, "seq_id": 2 * k, "adam_params": ADAM})
        r1, r2 = c.result(fb["request_id"]), c.result(op["request_id"])
        if "error" in r1 or "error" in r2:
            raise RuntimeError(f"{tag} step {k}: {r1.get('error')} {r2.get('error')}")
        if times is not None:
            times.append(time.time() - t0)
        losses.append(r1["metrics"]["loss:sum"])
        steps_seen.append(r2["metrics"]["step:max"])
        if on_step:
            on_step(k)
    save = c.call("/api/v1/save_weights", {"model_id": mid, "seq_id": 2 * steps + 1, "path": "final"})
    if "error" in save:
        raise RuntimeError(f"{tag} save: {save['error']}")
    return mid, losses, steps_seen, save["path"]


class Psql:
    """One psql process kept open: query() sends a statement and reads its rows."""
    def __init__(self, db):
        self.p = subprocess.Popen(["psql", "-X", "-A", "-t", "-q", "-d", db], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def query(self, sql):
        self.p.stdin.write(sql.rstrip().rstrip(";") + ";\n\\echo __end__\n")
        self.p.stdin.flush()
        rows = []
        while True:
            line = self.p.stdout.readline()
            if not line or line.strip() == "__end__":
                return rows
            if line.strip():
                rows.append(line.rstrip("\n"))

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=10)
