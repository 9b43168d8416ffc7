"""Checkpoint routes of SDK 0.26 - 0.39 over real HTTP against `loom up` (docs/protocol.md
§7.9, §7.10, §12.6, §12.7), each request as the SDK sends it and each answer parsed with
the SDK's type (tests/lib/sdk_types.py, written from the SDK's type files):

1. copy_weights: a copy is a new checkpoint of the caller's session naming the source's
   blob: no byte is added to the blob store; its parent is the source; a retry answers the
   same path; it samples; it survives the source's delete and a GC pass; the caller needs
   read access (another tenant's private checkpoint is 404 until shared) and its storage
   limit applies; bad input is a 4xx naming the field.
2. save_weights_external: an `external` checkpoint (external_weights/<name>); its
   external_weights_urls are one signed link per file of the PEFT layout, byte-identical
   to the files of the PEFT archive; links are refused once expired, when tampered with,
   and for another tenant's key (a link signed for it: that tenant cannot read the
   checkpoint).
3. external_weights_upload_start / PUT / _finish: an adapter import over HTTP that gives
   back the exported adapter; a bad adapter is a 400 naming the problem; a body over
   --max-body-mb is refused before it is read (413 on the headers alone); an upload not
   finished expires and the GC removes its staged bytes; cross-tenant probes; quotas.
"""
import hashlib, hmac, io, json, os, socket, struct, sys, tarfile, time, urllib.error, urllib.parse, urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
from stack import Stack, Results
from apitest import loom_cli, loom_cli_run, is_detail
from resilient import datum, ADAM
import sdk_types as T

R = Results()
MAX_BODY_MB = 2


# ---- helpers ------------------------------------------------------------------------------
def raw(s, method, url, body=None, key=None, headers=None):
    """(status, headers, bytes) of one request to an absolute URL or a path."""
    h = dict(headers or {})
    if key:
        h["X-API-Key"] = key
    req = urllib.request.Request(url if url.startswith("http") else s.url + url, data=body, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def js(b):
    try:
        return json.loads(b)
    except ValueError:
        return b


def sign(secret, run, ckpt, fmt, expires, key_id):
    """The server's link token, computed independently (as tests/checkpoint_test.py does)."""
    sub = hashlib.blake2b(b"", digest_size=32, key=secret, salt=struct.pack("<Q", 1) + b"\0" * 8,
                          person=b"loomdlv1" + b"\0" * 8).digest()
    msg = b"".join(p.encode() + b"\0" for p in ["loom-download", run, ckpt, fmt, str(expires), str(key_id)])
    return hmac.new(sub, msg, hashlib.sha512).digest()[:32].hex()


def blob_files(s):
    """{digest: size} of the registry blob store on disk."""
    out = {}
    top = os.path.join(s.dir, "blobs", "sha256")
    for d, _, files in os.walk(top):
        for f in files:
            out[f] = os.path.getsize(os.path.join(d, f))
    return out


class Tenant:
    def __init__(self, s, key):
        self.s, self.key = s, key
        self.sid = s.post("/api/v1/create_session", {"tags": [], "sdk_version": "0.39.0"}, key=key)[1]["session_id"]
        self.nslots, self.seq = 0, {}

    def post(self, path, body):
        return self.s.post(path, body, key=self.key)

    def get(self, path):
        return self.s.get(path, key=self.key)

    def result(self, st_fut):
        st, fut = st_fut
        assert st == 200, (st, fut)
        return self.s.result(fut["request_id"], key=self.key)

    def model(self, base):
        res = self.result(self.post("/api/v1/create_model", {"session_id": self.sid, "model_seq_id": self.nslots,
                                                            "base_model": base, "lora_config": {"rank": 4, "seed": 3}}))
        self.nslots += 1
        mid = res["model_id"]
        self.seq[mid] = 1
        # one step, so the weights are not the initial ones
        fb = {"model_id": mid, "seq_id": 1, "forward_backward_input": {
            "data": [datum("x", 1, i) for i in range(2)], "loss_fn": "cross_entropy"}}
        self.result(self.post("/api/v1/forward_backward", fb))
        self.result(self.post("/api/v1/optim_step", {"model_id": mid, "seq_id": 2, "adam_params": ADAM}))
        self.seq[mid] = 3
        return mid

    def op(self, mid, path, body):
        body = dict(body, model_id=mid, seq_id=self.seq[mid])
        self.seq[mid] += 1
        return self.result(self.post(path, body))

    def copy(self, source, slot=None, **extra):
        if slot is None:
            slot = self.nslots
            self.nslots += 1
        body = {"session_id": self.sid, "model_seq_id": slot, "source_path": source, "ttl_seconds": None,
                "weights_access_token": None}
        body.update(extra)
        return self.post("/api/v1/copy_weights", body)

    def sample(self, model_path, seq=0):
        st, ss = self.post("/api/v1/create_sampling_session", {"session_id": self.sid, "model_path": model_path,
                                                                "sampling_session_seq_id": 100 + seq})
        if st != 200:
            return st, ss
        res = self.result(self.post("/api/v1/asample", {
            "sampling_session_id": ss["sampling_session_id"], "seq_id": seq, "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6, 7]}]},
            "sampling_params": {"max_tokens": 4, "temperature": 0.0, "seed": 1}}))
        return 200, res


def copy_checks(s, a, b, base, mid_a):
    s1 = a.op(mid_a, "/api/v1/save_weights_for_sampler", {"path": "s1"})["path"]
    w1 = a.op(mid_a, "/api/v1/save_weights", {"path": "w1"})["path"]
    src_digest = s.psql(f"SELECT blob_digest FROM adapter_versions WHERE tinker_path = '{s1}' AND deleted_at IS NULL")
    before = blob_files(s)

    st, body = a.copy(s1, slot=7)
    cp = T.parse(T.COPY_WEIGHTS_RESPONSE, body, "CopyWeightsResponse") if st == 200 else None
    want = f"tinker://{a.sid}:train:7/sampler_weights/s1"
    R.check(cp is not None and cp["tinker_path"] == want, f"copy_weights -> CopyWeightsResponse {want}: {st} {body}")
    row = s.psql(f"SELECT blob_digest, parent_id = (SELECT id FROM adapter_versions WHERE tinker_path = '{s1}'),"
                 f" provenance->>'copied_from', kind FROM adapter_versions WHERE tinker_path = '{want}'"
                 " AND deleted_at IS NULL").split("|")
    R.check(row == [src_digest, "t", s1, "sampler"],
            f"the copy names the source's blob, its parent is the source, provenance says so: {row}")
    R.check(blob_files(s) == before, "content-addressed: not one byte was added to the blob store")
    R.check(a.copy(s1, slot=7) == (200, body), "a retry of the same copy answers the same path")
    st, cw = a.copy(w1, slot=8, ttl_seconds=7200)
    exp = s.psql(f"SELECT expires_at > now() + interval '1 hour' AND expires_at < now() + interval '3 hours', kind"
                 f" FROM adapter_versions WHERE tinker_path = '{cw.get('tinker_path')}' AND deleted_at IS NULL")
    R.check(st == 200 and cw["tinker_path"] == f"tinker://{a.sid}:train:8/weights/w1" and exp == "t|training",
            f"a training checkpoint copies too, with the copy's own ttl_seconds: {st} {cw} {exp}")
    st, res = a.sample(want, seq=1)
    st0, res0 = a.sample(s1, seq=2)
    R.check(st == 200 and "sequences" in res and res["sequences"][0]["tokens"] == res0["sequences"][0]["tokens"],
            f"the copy samples like its source (greedy): {res.get('sequences', res)}")

    # bad input: a 4xx naming the field
    R.check(is_detail(a.copy(s1, weights_access_token="tok"), 400, "weights_access_token"),
            "weights_access_token: refused by name (no tokens between accounts)")
    R.check(is_detail(a.post("/api/v1/copy_weights", {"session_id": a.sid, "source_path": s1}), 400, "model_seq_id"),
            "model_seq_id missing: 400 naming it")
    R.check(is_detail(a.copy("tinker://x/bogus/y"), 400, "source_path"), "a malformed source_path: 400 naming it")
    R.check(is_detail(a.copy(s1, slot=0), 409, "training run"),
            "the slot of a training model is not a copy's: 409")
    R.check(is_detail(a.copy(s1, ttl_seconds=-5), 400, "ttl_seconds"), "a negative ttl_seconds: 400")
    R.check(is_detail(a.post("/api/v1/copy_weights", {"session_id": "nope", "model_seq_id": 1, "source_path": s1}),
                      404, "session"), "an unknown session: 404")
    R.check(is_detail(b.post("/api/v1/copy_weights", {"session_id": a.sid, "model_seq_id": 30, "source_path": s1}),
                      404, "session"), "another tenant's session: 404")

    # access: another tenant's private checkpoint is not copyable until shared
    R.check(is_detail(b.copy(s1), 404, "not found"), "tenant B cannot copy A's private checkpoint: 404")
    loom_cli(s, "adapter", "share", mid_a, "--tenant", "tenant-b", "--data-dir", s.dir)
    st, bc = b.copy(s1, slot=3)
    owner = s.psql(f"SELECT t.name FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id JOIN tenants t"
                   f" ON t.id = a.tenant_id WHERE v.tinker_path = '{bc.get('tinker_path')}' AND v.deleted_at IS NULL")
    R.check(st == 200 and owner == "tenant-b", f"once shared, B copies it and owns the copy: {st} {bc} {owner}")
    mine = [c["tinker_path"] for c in b.get("/api/v1/checkpoints")[1]["checkpoints"]]
    R.check(bc.get("tinker_path") in mine, "the copy is listed among B's own checkpoints")
    R.check(a.get(f"/api/v1/training_runs/{b.sid}:train:3/checkpoints")[0] == 404,
            "A cannot list B's copy")
    loom_cli(s, "adapter", "share", mid_a, "--tenant", "tenant-b", "--revoke", "--data-dir", s.dir)
    R.check(b.copy(s1)[0] == 404, "after the share is revoked, B cannot copy again")

    # the copy survives the source's delete and a GC pass
    st, _ = a.s.request("DELETE", f"/api/v1/training_runs/{mid_a}/checkpoints/sampler_weights/s1", key=a.key)
    gc = loom_cli_run(s, "adapter", "gc", "--orphan-grace-s", "0", "--data-dir", s.dir)
    R.check(st == 200 and gc.returncode == 0 and src_digest in blob_files(s),
            f"source deleted, GC ran ({gc.stdout.strip()}): the blob the copies name stays")
    st, res2 = b.sample(bc["tinker_path"], seq=3)
    R.check(st == 200 and res2["sequences"][0]["tokens"] == res0["sequences"][0]["tokens"],
            "B's copy still samples after the source is gone")
    R.check(b.post("/api/v1/weights_info", {"tinker_path": bc["tinker_path"]})[0] == 200, "and has weights_info")
    R.check(is_detail(b.copy(s1), 404, "not found"), "the deleted source cannot be copied any more")

    # storage quota: a copy counts towards the copier's limit
    used = int(s.psql("SELECT coalesce(sum(v.size_bytes), 0) FROM adapter_versions v JOIN adapters a ON"
                      " a.id = v.adapter_id JOIN tenants t ON t.id = a.tenant_id WHERE t.name = 'tenant-b'"
                      " AND v.deleted_at IS NULL"))
    loom_cli(s, "tenant", "set-limits", "tenant-b", "--max-checkpoint-bytes", str(max(used, 1)))
    R.check(is_detail(b.copy(bc["tinker_path"]), 400, "storage limit"), "a copy past the storage limit: 400")
    loom_cli(s, "tenant", "set-limits", "tenant-b", "--max-checkpoint-bytes", "0")
    return s1, w1


def external_checks(s, a, b, keyid_b, mid_a, secret):
    st, fut = a.post("/api/v1/save_weights_external", {"model_id": mid_a, "path": "ext1", "seq_id": a.seq[mid_a],
                                                        "ttl_seconds": None, "age_encryption_recipients": None,
                                                        "type": "save_weights_external"})
    a.seq[mid_a] += 1
    res = a.s.result(fut["request_id"], key=a.key) if st == 200 else fut
    r = T.parse(T.SAVE_WEIGHTS_EXTERNAL_RESULT, res, "SaveWeightsExternalResponseInternal")
    path = f"tinker://{mid_a}/external_weights/ext1"
    R.check(r is not None and r["path"] == path and r["type"] == "save_weights_external" and r["size_bytes"] > 0,
            f"save_weights_external -> SaveWeightsExternalResponseInternal: {res}")
    cks = [T.parse(T.CHECKPOINT, c, "Checkpoint") for c in
           a.get(f"/api/v1/training_runs/{mid_a}/checkpoints")[1]["checkpoints"]]
    ext = [c for c in cks if c and c["tinker_path"] == path]
    R.check(len(ext) == 1 and ext[0]["checkpoint_type"] == "external" and
            ext[0]["checkpoint_id"] == "external_weights/ext1",
            f"listed as checkpoint_type external, id external_weights/ext1: {ext}")

    urls_path = f"/api/v1/training_runs/{mid_a}/checkpoints/external_weights/ext1/external_weights_urls"
    st, body = a.get(urls_path)
    u = T.parse(T.EXTERNAL_WEIGHTS_URLS, body, "ExternalWeightsUrlsResponse") if st == 200 else None
    R.check(u is not None and set(u["urls"]) == {"adapter_config.json", "adapter_model.safetensors"},
            f"external_weights_urls -> ExternalWeightsUrlsResponse with the PEFT files: {st} {str(body)[:200]}")
    if u is None:
        return
    files = {}
    for name, url in u["urls"].items():
        st, h, data = raw(s, "GET", url)   # no key: the link is the credential
        files[name] = (st, data)
    st, _, tar = raw(s, "GET", f"/api/v1/training_runs/{mid_a}/checkpoints/external_weights/ext1/archive?format=peft",
                     key=a.key, headers={"Accept": "application/json"})
    tar_url = js(tar)["url"] if st == 200 else ""
    _, _, tarb = raw(s, "GET", tar_url)
    t = tarfile.open(fileobj=io.BytesIO(tarb), mode="r:")
    same = all(files[n][0] == 200 and files[n][1] == t.extractfile(n).read() for n in files)
    R.check(same, "each signed file is byte for byte the file of the PEFT archive (the layout `loom adapter export` "
                  "makes)")
    cfg = js(files["adapter_config.json"][1])
    R.check(isinstance(cfg, dict) and cfg.get("peft_type") == "LORA" and cfg.get("r") == 4,
            f"adapter_config.json is PEFT's: {str(cfg)[:120]}")

    # refusals: tampered, expired, another tenant's key, another tenant asking
    url = u["urls"]["adapter_model.safetensors"]
    parts = urllib.parse.urlsplit(url).path.split("/")
    i = parts.index("checkpoint_archives")
    tok = parts[i + 3]
    bad = url.replace(tok, ("0" if tok[0] != "0" else "1") + tok[1:])
    R.check(raw(s, "GET", bad)[0] == 403, "a tampered link: 403")
    run, ckpt = mid_a, "external_weights/ext1"
    past = int(time.time()) - 10
    expired = url.replace(parts[i + 1], str(past)).replace(tok, sign(secret, run, ckpt, parts[i + 2], past,
                                                                    int(parts[i + 4])))
    st, _, msg = raw(s, "GET", expired)
    R.check(st == 403 and b"expired" in msg, f"an expired link: 403 {msg[:100]}")
    exp = int(parts[i + 1])
    for_b = url.replace(tok, sign(secret, run, ckpt, parts[i + 2], exp, keyid_b)).replace(
        f"/{parts[i + 4]}/{run}/", f"/{keyid_b}/{run}/")
    R.check(raw(s, "GET", for_b)[0] == 404, "a link validly signed for another tenant's key: 404 (it cannot read it)")
    R.check(b.get(urls_path)[0] == 404, "another tenant asking for the links: 404")
    R.check(is_detail(b.post("/api/v1/save_weights_external", {"model_id": mid_a, "path": "ext9", "seq_id": 999}),
                      404), "another tenant's save_weights_external on A's model: 404")
    R.check(is_detail(a.get(f"/api/v1/training_runs/{mid_a}/checkpoints/sampler_weights/s1x/external_weights_urls"),
                      404, "external_weights"), "external_weights_urls of a sampler_weights path: 404 saying why")

    # bad requests
    for extra, word in (({"ttl_seconds": 60}, "ttl_seconds"),
                        ({"age_encryption_recipients": ["age1qqq"]}, "age_encryption_recipients")):
        body = dict({"model_id": mid_a, "path": "ext2", "seq_id": a.seq[mid_a]}, **extra)
        a.seq[mid_a] += 1
        R.check(is_detail(a.post("/api/v1/save_weights_external", body), 400, word), f"{word}: 400 naming it")


def upload(s, t, files, lora_config=None, base=None):
    """start, PUT each file, finish: (status, body) of finish (or of the first refusal)."""
    st, body = t.post("/api/v1/external_weights_upload_start",
                      {"base_model": base, "lora_config": lora_config, "destination_project_id": None})
    if st != 200:
        return st, body, None
    for name, data in files.items():
        pst, _, pb = raw(s, "PUT", body["urls"][name], data, headers={"Content-Type": "application/octet-stream"})
        if pst != 200:
            return pst, js(pb), body
    return t.post("/api/v1/external_weights_upload_finish", {"upload_id": body["upload_id"]}) + (body,)


def upload_checks(s, a, b, keyid_b, base, mid_a, secret):
    src = a.op(mid_a, "/api/v1/save_weights_for_sampler", {"path": "for-upload"})["path"]
    st, _, j = raw(s, "GET", f"/api/v1/training_runs/{mid_a}/checkpoints/sampler_weights/for-upload/archive?format=peft",
                   key=a.key, headers={"Accept": "application/json"})
    t = tarfile.open(fileobj=io.BytesIO(raw(s, "GET", js(j)["url"])[2]), mode="r:")
    files = {n: t.extractfile(n).read() for n in ("adapter_config.json", "adapter_model.safetensors")}

    st, body, start = upload(s, a, files, {"rank": 4, "train_attn": True}, base)
    R.check(st == 200 and body.get("tinker_path", "").endswith("/sampler_weights/imported") and
            start["upload_id"] in body["tinker_path"], f"upload start / PUT / finish -> {{tinker_path}}: {st} {body}")
    if st != 200:
        return
    up = body["tinker_path"]
    same = s.psql(f"SELECT (SELECT blob_digest FROM adapter_versions WHERE tinker_path = '{up}') ="
                  f" (SELECT blob_digest FROM adapter_versions WHERE tinker_path = '{src}' AND deleted_at IS NULL)")
    R.check(same == "t", "the upload of an exported adapter is the same weights (the same blob) as its source")
    st, res = a.sample(up, seq=11)
    R.check(st == 200 and "sequences" in res, "the uploaded adapter samples")
    R.check(a.post("/api/v1/external_weights_upload_finish", {"upload_id": start["upload_id"]}) == (200, body),
            "a retried finish answers the same path")
    staged = [f for f in os.listdir(os.path.join(s.dir, "blobs", "tmp")) if f.startswith("upload-")]
    R.check(staged == [], f"the staged files are gone once imported: {staged}")

    # bad adapters: a 4xx naming the problem, nothing imported; the upload stays open, and
    # a PUT of the right file then lets it finish
    st, start = a.post("/api/v1/external_weights_upload_start", {"base_model": base, "lora_config": {"rank": 8}})
    uid = start["upload_id"]

    def put(name, data):
        return raw(s, "PUT", start["urls"][name], data)[0]

    def finish():
        return a.post("/api/v1/external_weights_upload_finish", {"upload_id": uid})
    put("adapter_config.json", files["adapter_config.json"])
    R.check(is_detail(finish(), 400, "adapter_model.safetensors", "not uploaded"),
            "finish without the weights: 400 naming the file")
    # A body over the 64 KiB a request without a key may send: the signed link stands for
    # the key, so the api reads it (before: 401, the body unread); a tampered link does not.
    big = bytes(range(256)) * 1024
    R.check(put("adapter_model.safetensors", big) == 200, "a 256 KiB PUT to its signed link, without a key: staged")
    bad = start["urls"]["adapter_model.safetensors"].replace("/upl-", "/upl-0", 1)
    R.check(raw(s, "PUT", bad, big)[0] in (403, 404), "a 256 KiB PUT to a tampered link: refused")
    put("adapter_model.safetensors", files["adapter_model.safetensors"][:200])
    R.check(is_detail(finish(), 400, "cannot be imported"), "a truncated safetensors: 400")
    put("adapter_model.safetensors", files["adapter_model.safetensors"])
    put("adapter_config.json", json.dumps(dict(json.loads(files["adapter_config.json"]), r=8)).encode())
    R.check(is_detail(finish(), 400, "cannot be imported"), "a config whose rank does not match the tensors: 400")
    put("adapter_config.json", files["adapter_config.json"])
    R.check(is_detail(finish(), 400, "lora_config.rank"),
            "a declared lora_config that does not match the files: 400 naming lora_config.rank")
    R.check(s.psql(f"SELECT count(*) FROM adapter_versions WHERE tinker_path LIKE 'tinker://{uid}/%'") == "0",
            "nothing was imported by the refused finishes")
    R.check(is_detail(a.post("/api/v1/external_weights_upload_start", {"base_model": "nope/x"}), 400, "base_model"),
            "an unknown base_model: 400")
    R.check(is_detail(a.post("/api/v1/external_weights_upload_start", {"base_model": base, "lora_config": {"r": 4}}),
                      400, "lora_config.r"), "an unknown lora_config field: 400 naming it")

    # bounded before memory is taken
    st, start = a.post("/api/v1/external_weights_upload_start", {"base_model": base})
    url = urllib.parse.urlsplit(start["urls"]["adapter_model.safetensors"])
    with socket.create_connection((url.hostname, url.port), timeout=30) as c:
        c.sendall(f"PUT {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Length: {16 << 30}\r\n\r\n".encode())
        head = c.recv(4096).decode(errors="replace")
    R.check(head.startswith("HTTP/1.1 413"), f"a PUT declaring 16 GiB is refused on its headers (413), before a byte "
                                             f"of it is read: {head.splitlines()[0] if head else '(nothing)'}")
    st, _, msg = raw(s, "PUT", start["urls"]["adapter_config.json"], b"\x1f\x8b", headers={"Content-Encoding": "gzip"})
    R.check(st == 415 and b"Content-Encoding" in msg, f"an encoded upload body: 415 {msg[:100]}")
    big_cfg = b" " * ((1 << 20) + 10)
    st, _, msg = raw(s, "PUT", start["urls"]["adapter_config.json"], big_cfg)
    R.check(st == 413 and b"adapter_config.json" in msg, f"adapter_config.json over 1 MiB: 413 naming it {msg[:120]}")

    # links: tampered, another tenant, revoked key
    good = start["urls"]["adapter_config.json"]
    tok = urllib.parse.urlsplit(good).path.split("/")[-4]
    R.check(raw(s, "PUT", good.replace(tok, "f" * len(tok)), b"{}")[0] == 403, "a tampered upload link: 403")
    R.check(is_detail(b.post("/api/v1/external_weights_upload_finish", {"upload_id": start["upload_id"]}), 404,
                      "not found"), "another tenant finishing A's upload: 404")
    parts = urllib.parse.urlsplit(good).path.split("/")   # .../<expires>/<token>/<key id>/<upload id>/<file>
    exp, uid_, fname = parts[-5], parts[-2], parts[-1]
    for_b = good.replace(f"/{tok}/{parts[-3]}/", f"/{sign(secret, uid_, fname, 'upload', int(exp), keyid_b)}/{keyid_b}/")
    R.check(raw(s, "PUT", for_b, b"{}")[0] == 403, "a PUT link validly signed for another tenant's key on A's upload: 403")

    # quotas: open uploads per tenant
    opened = [b.post("/api/v1/external_weights_upload_start", {"base_model": base})[0] for _ in range(5)]
    R.check(opened[:4] == [200] * 4 and opened[4] == 429, f"a tenant has at most 4 uploads open: {opened}")
    # storage: the import must fit
    loom_cli(s, "tenant", "set-limits", "default", "--max-checkpoint-bytes", "100")
    R.check(is_detail(a.post("/api/v1/external_weights_upload_start", {"base_model": base}), 400, "storage limit"),
            "a tenant at its storage limit cannot start an upload")
    loom_cli(s, "tenant", "set-limits", "default", "--max-checkpoint-bytes", "0")

    # expiry: an unfinished upload's bytes go at the next GC
    st, body, start = upload(s, a, {"adapter_config.json": files["adapter_config.json"]}, None, base)
    uid = start["upload_id"]
    tmpdir = os.path.join(s.dir, "blobs", "tmp")
    R.check(any(f.startswith(f"upload-{uid}") for f in os.listdir(tmpdir)), "a PUT file is staged in the blob store")
    s.psql(f"UPDATE weight_uploads SET expires_at = now() - interval '1 second' WHERE id = '{uid}'")
    gc = loom_cli_run(s, "adapter", "gc", "--data-dir", s.dir)
    R.check("expired uploads dropped 1" in gc.stdout and not any(f.startswith(f"upload-{uid}") for f in os.listdir(tmpdir))
            and s.psql(f"SELECT count(*) FROM weight_uploads WHERE id = '{uid}'") == "0",
            f"GC drops the expired upload and its staged bytes: {gc.stdout.strip()}")
    R.check(is_detail(a.post("/api/v1/external_weights_upload_finish", {"upload_id": uid}), 404, "not found"),
            "finishing it afterwards: 404")


def main():
    with Stack(["--max-body-mb", str(MAX_BODY_MB)]) as s:
        secret = bytes.fromhex(open(os.path.join(s.dir, "secret.key")).read().strip())
        loom_cli(s, "tenant", "create", "tenant-b")
        key_b = loom_cli(s, "key", "create", "--tenant", "tenant-b", "--secret-file", os.path.join(s.dir, "secret.key"))
        keyid_b = int(s.psql("SELECT max(k.id) FROM api_keys k JOIN tenants t ON t.id = k.tenant_id"
                             " WHERE t.name = 'tenant-b'"))
        base = s.get("/api/v1/get_server_capabilities")[1]["supported_models"][0]["model_name"]
        a, b = Tenant(s, s.key), Tenant(s, key_b)
        mid_a = a.model(base)
        copy_checks(s, a, b, base, mid_a)
        external_checks(s, a, b, keyid_b, mid_a, secret)
        upload_checks(s, a, b, keyid_b, base, mid_a, secret)
    R.finish()


if __name__ == "__main__":
    main()
