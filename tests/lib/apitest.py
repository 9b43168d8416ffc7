"""Helpers shared by the api tests: the loom CLI against a Stack's database, a second
`loom api` process on the same database (for flags `loom up` does not pass), the check
that an answer is a JSON error {"detail": ...} with given words, and a checkpoint archive
through its signed download URL."""
import os
import subprocess
import urllib.error
import urllib.request

from stack import LOOM_BIN


def loom_cli_run(s, *args):
    """`loom ARGS` with the stack's DATABASE_URL; the CompletedProcess (text)."""
    env = dict(os.environ, DATABASE_URL=s.db)
    return subprocess.run([LOOM_BIN] + list(args), env=env, capture_output=True, text=True)


def loom_cli(s, *args):
    """`loom ARGS`; its stdout, stripped. Raises if it fails."""
    p = loom_cli_run(s, *args)
    if p.returncode != 0:
        raise RuntimeError(f"loom {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p.stdout.strip()


def start_second_api(s, *args):
    """Another `loom api` on the same database; returns (process, base url)."""
    p = subprocess.Popen([LOOM_BIN, "api", "--db", s.db, "--port", "0", "--threads", "1",
                          "--data-dir", s.dir] + list(args),
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = p.stdout.readline().decode()
    if not line.startswith("LOOM_API_LISTENING port="):
        p.kill()
        raise RuntimeError("second api did not start: " + line)
    return p, "http://127.0.0.1:" + line.split("=", 1)[1].strip()


def is_detail(resp, code, *words):
    """resp = (status, body): status == code and body is {"detail": str} containing words
    (case-insensitive). Prints what came instead."""
    st, body = resp
    ok = st == code and isinstance(body, dict) and isinstance(body.get("detail"), str)
    if ok:
        d = body["detail"].lower()
        ok = all(w.lower() in d for w in words)
    if not ok:
        print("      got", st, str(body)[:300])
    return ok


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None


def download_archive(s, run, ckpt, query=""):
    """The bytes of a checkpoint's archive (docs/protocol.md §17.7): the archive route must
    answer 302 to a signed URL, which gives the tar."""
    req = urllib.request.Request(f"{s.url}/api/v1/training_runs/{run}/checkpoints/{ckpt}/archive{query}",
                                 headers={"X-API-Key": s.key})
    try:
        urllib.request.build_opener(_NoRedirect).open(req, timeout=60)
        raise RuntimeError("archive did not redirect")
    except urllib.error.HTTPError as e:
        if e.code != 302:
            raise RuntimeError(f"archive: {e.code} {e.read()}")
        loc = e.headers["Location"]
    with urllib.request.urlopen(loc, timeout=60) as r:
        return r.read()
