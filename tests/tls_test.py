"""TLS: `loom api --tls-cert/--tls-key` serves the Tinker API over HTTPS (h2o + OpenSSL).

A self-signed certificate for 127.0.0.1 is made with the openssl command; the client
verifies it against that certificate (no verification turned off), authenticates, and
runs a forward_backward through the whole stack over HTTPS. A plain-HTTP request to
the TLS port gets no answer, and a wrong key still gets a 401 JSON body.
"""
import http.client, json, os, ssl, subprocess, sys, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import Stack, Results, LOOM_BIN


def main():
    R = Results()
    with Stack() as s, tempfile.TemporaryDirectory() as d:
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                        "-keyout", key, "-out", cert], check=True, capture_output=True)
        p = subprocess.Popen([LOOM_BIN, "api", "--db", s.db, "--port", "0", "--threads", "1",
                              "--data-dir", s.dir,
                              "--tls-cert", cert, "--tls-key", key],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            line = p.stdout.readline().decode()
            R.check(line.startswith("LOOM_API_LISTENING port="), f"TLS api started: {line.strip()}")
            port = int(line.split("=", 1)[1])
            ctx = ssl.create_default_context(cafile=cert)

            def call(method, path, body=None, key=s.key):
                c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=60)
                h = {"Content-Type": "application/json"}
                if key:
                    h["X-API-Key"] = key
                c.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
                r = c.getresponse()
                out = r.status, json.loads(r.read() or b"null")
                c.close()
                return out

            st, body = call("GET", "/api/v1/healthz")
            R.check(st == 200 and body == {"status": "ok"}, "healthz over verified HTTPS")
            st, body = call("POST", "/api/v1/create_session", {}, key="tml-wrong")
            R.check(st == 401 and "detail" in body, f"wrong key over HTTPS: 401 JSON ({st})")
            st, sess = call("POST", "/api/v1/create_session", {"tags": []})
            R.check(st == 200 and "session_id" in sess, "create_session over HTTPS")
            st, fut = call("POST", "/api/v1/create_model", {"session_id": sess["session_id"], "model_seq_id": 0,
                                                            "base_model": "loom/tiny-llama", "lora_config": {"rank": 4}})
            model_id = None
            for _ in range(100):
                st, res = call("POST", "/api/v1/retrieve_future", {"request_id": fut["request_id"]})
                if res.get("type") != "try_again":
                    model_id = res.get("model_id")
                    break
            R.check(model_id is not None, f"create_model over HTTPS: {model_id}")
            st, fut = call("POST", "/api/v1/forward_backward", {
                "model_id": model_id, "seq_id": 1,
                "forward_backward_input": {"loss_fn": "cross_entropy", "data": [{
                    "model_input": {"chunks": [{"tokens": [1, 2, 3]}]},
                    "loss_fn_inputs": {"target_tokens": {"data": [2, 3, 4], "dtype": "int64"}}}]}})
            res = {}
            for _ in range(100):
                st, res = call("POST", "/api/v1/retrieve_future", {"request_id": fut["request_id"]})
                if res.get("type") != "try_again":
                    break
            R.check("loss:sum" in res.get("metrics", {}), f"forward_backward result over HTTPS: {str(res)[:120]}")
            plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                plain.request("GET", "/api/v1/healthz")
                r = plain.getresponse()
                ok = r.status != 200
            except Exception:
                ok = True
            R.check(ok, "plain HTTP on the TLS port is not served")
        finally:
            p.terminate()
            p.wait(timeout=30)
    R.finish()


if __name__ == "__main__":
    main()
