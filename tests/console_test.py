"""The web console in a real browser: Debian's headless Chromium driven through
chromedriver (Debian's python3-selenium) against `loom up` on loopback.

1. /console serves the page and its files from the binary, with a CSP that allows only
   Loom's own files; nothing is fetched from anywhere else (the browser's resource list).
2. Sign in with an API key: the key is kept in sessionStorage and never appears in a URL
   the page requested.
3. Runs: the tenant's run with its steps and last loss; another tenant's run is not listed,
   and opening it by id says not found (404).
4. A run: the loss curve has one point per step, the gradient-norm curve too, with the
   values of the operations; checkpoints with their lineage (parent) and user_metadata;
   the session's display name, project, metadata and how its client finished it
   (sessions/{id}/finish), also in the runs list; a download link fetched from the page
   gives the archive (a tar with the adapter).
5. The playground's tokenizer (with the chat template) round-trips; it samples from the
   run's sampler checkpoint: the samples the page shows
   are the tokens the future returned.
6. An operator key sees every tenant, the executor, the queue and recent cycles as a
   timeline naming the tenants that shared a cycle.
Screenshots of every page go to <build>/test-artifacts/console/.
"""
import base64, io, json, os, sys, tarfile, time, urllib.parse, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from stack import Stack, Results, LOOM_BIN
from apitest import loom_cli
from trainer import ADAM, Trainer

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

STEPS = 5
RESUMED = 2
ART = os.environ.get("LOOM_TEST_ARTIFACTS") or os.path.join(os.path.dirname(os.path.abspath(LOOM_BIN)),
                                                             "test-artifacts", "console")


def browser():
    o = webdriver.ChromeOptions()
    o.binary_location = "/usr/bin/chromium"
    for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1000", "--no-first-run", "--disable-extensions",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--lang=en-US"]:
        o.add_argument(a)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)


def shot(d, name):
    """A screenshot of the whole page, beyond the window (Chrome DevTools protocol)."""
    m = d.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    png = d.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
        "x": 0, "y": 0, "width": m["width"], "height": min(m["height"], 4000), "scale": 1}})
    path = os.path.join(ART, name)
    with open(path, "wb") as f:
        f.write(base64.b64decode(png["data"]))
    print("      screenshot", path)


def wait(d, cond, what, timeout=30):
    try:
        return WebDriverWait(d, timeout, poll_frequency=0.1).until(lambda drv: cond(drv))
    except Exception:
        print("      timed out waiting for", what, "; toast:", toast_text(d))
        return None


def toast_text(d):
    try:
        t = d.find_element(By.ID, "toast")
        return t.text if t.is_displayed() else ""
    except Exception:
        return ""


def sign_in(d, url, key):
    d.get(url + "/console")
    wait(d, lambda x: x.find_element(By.ID, "view-signin").is_displayed(), "sign-in form")
    k = d.find_element(By.ID, "key")
    k.clear()
    k.send_keys(key)
    d.find_element(By.ID, "signin-submit").click()


def ck_step_col(d):
    """The checkpoint table's Step column."""
    heads = [h.text for h in d.find_elements(By.CSS_SELECTOR, "#ckpt-table thead th")]
    return heads.index("Step") if "Step" in heads else -1


def main():
    os.makedirs(ART, exist_ok=True)
    R = Results()
    # The scheduler waits 30 ms after a wake-up (by default it builds at once), so that
    # alice's and bob's submits below, sent one after the other, share cycles.
    with Stack(["--gather-ms", "30"]) as s:
        secret = os.path.join(s.dir, "secret.key")
        loom_cli(s, "tenant", "create", "bob")
        bob_key = loom_cli(s, "key", "create", "--tenant", "bob", "--secret-file", secret)
        loom_cli(s, "tenant", "create", "ops")
        op_key = loom_cli(s, "key", "create", "--tenant", "ops", "--scopes", "admin", "--secret-file", secret)
        alice = Trainer(s, s.key, display_name="alice sft", project_id="demo",
                        user_metadata={"recipe": "sft", "data": "v2"})
        run = alice.create()
        fb_losses, grads = [], []
        for i in range(STEPS):
            # one batch again and again, gently: the curve shows the run learn
            fb, opt = alice.step(run, 0, adam=dict(ADAM, learning_rate=5e-3))
            fb_losses.append(fb["metrics"]["loss:sum"])
            grads.append(opt["metrics"]["grad_norm:mean"])
            if i == 2:
                alice.op(run, "/api/v1/save_weights", {"path": "step3"})
        smp = alice.op(run, "/api/v1/save_weights_for_sampler", {"path": "final", "user_metadata": {"stage": "final"}})
        # A run resumed from step3 with its optimizer state: it takes RESUMED steps, so the
        # optimizer (and its checkpoint) is at step 3 + RESUMED; then one forward_backward of
        # the next step, still being accumulated.
        resumed = alice.create()
        alice.op(resumed, "/api/v1/load_weights", {"path": f"tinker://{run}/weights/step3", "optimizer": True})
        for i in range(RESUMED):
            alice.step(resumed, 0, adam=dict(ADAM, learning_rate=5e-3))
        res_ck = alice.op(resumed, "/api/v1/save_weights", {"path": "resumed"})["path"]
        s.result(alice.fb(resumed, 0))
        bob = Trainer(s, bob_key)
        bob_run = bob.create()
        # Cycles that alice and bob share: both submit at once (the scheduler gathers 30 ms),
        # on another run of alice's so that `run` keeps its STEPS steps.
        other = alice.create()
        shared = 0
        for i in range(10):
            fa, fbb = alice.fb(other, 100 + i), bob.fb(bob_run, 100 + i)
            s.result(fa), s.result(fbb, key=bob_key)
            shared = int(s.psql("SELECT count(*) FROM (SELECT cycle_id FROM operations WHERE cycle_id IS NOT NULL"
                                " GROUP BY cycle_id HAVING count(DISTINCT tenant_id) > 1) x"))
            if shared:
                break
        R.check(shared > 0, f"alice and bob shared a cycle ({shared})")

        # alice's client is done (ServiceClient.close); the console shows how it finished
        st, fin = s.post(f"/api/v1/sessions/{alice.sid}/finish", {"reason": {"type": "errored"},
                                                                   "detail": "stopped after 5 steps"})
        R.check(st == 200 and fin["reason"] == "errored", f"alice's session finished: {fin}")

        # the playground's tokenizer routes
        st, tok = s.post("/api/v1/console/tokenize", {"base_model": "loom/tiny-llama", "text": "hi there", "chat": True})
        R.check(st == 200 and "<|im_start|>user" in tok["text"] and tok["text"].rstrip().endswith("<|im_start|>assistant"),
                f"tokenize with the chat template: {tok.get('text')!r}")
        im_end = json.loads(loom_cli(s, "tokenize", "--model-dir", os.path.join(s.dir, "models", "tiny-llama"),
                                     "<|im_end|>"))["ids"]
        R.check(tok.get("stop_tokens") == im_end and len(im_end) == 1,
                f"... and the answer's end, the template's end of turn <|im_end|> {im_end}: {tok.get('stop_tokens')}")
        st, plain = s.post("/api/v1/console/tokenize", {"base_model": "loom/tiny-llama", "text": "hi there"})
        R.check(st == 200 and plain.get("stop_tokens") == [], "without the chat template: no stop tokens")
        st, back = s.post("/api/v1/console/detokenize", {"base_model": "loom/tiny-llama", "ids": tok["ids"]})
        R.check(st == 200 and back["text"] == tok["text"], "detokenize gives the rendered prompt back")
        R.check(s.post("/api/v1/console/detokenize", {"base_model": "loom/tiny-llama", "ids": [-1]})[0] == 400,
                "detokenize of a negative id: 400")
        R.check(s.post("/api/v1/console/tokenize", {"base_model": "nope/model", "text": "x"})[0] == 404,
                "tokenize for a base model not served: 404")

        d = browser()
        try:
            # 1. the page and its files
            d.get(s.url + "/console")
            wait(d, lambda x: x.find_element(By.ID, "view-signin").is_displayed(), "sign-in form")
            R.check(d.current_url.endswith("/console/"), f"/console leads to /console/ ({d.current_url})")
            shot(d, "01-signin.png")
            req = urllib.request.Request(s.url + "/console/")
            with urllib.request.urlopen(req) as r:
                csp = r.headers.get("Content-Security-Policy", "")
                R.check("default-src 'self'" in csp and r.headers.get("Referrer-Policy") == "no-referrer",
                        f"the page is served with a CSP of its own files only: {csp}")

            # 2. sign in
            sign_in(d, s.url, s.key)
            rows = wait(d, lambda x: x.find_elements(By.CSS_SELECTOR, "#runs-table tbody tr"), "runs rows")
            R.check(rows and len(rows) == 3, "runs: alice's three runs listed")
            R.check(d.execute_script("return sessionStorage.getItem('loom.key')") == s.key,
                    "the key is kept in sessionStorage")
            row = d.find_element(By.CSS_SELECTOR, f"#runs-table tbody tr[data-run='{run}']")
            cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
            R.check(cells[0] == run and cells[3] == "active" and cells[5] == str(STEPS),
                    f"run row: id, status active, {STEPS} steps: {cells}")
            R.check(cells[1] == "alice sft errored", f"run row: the session's display name and how it finished: {cells[1]!r}")
            R.check(abs(float(cells[6]) - fb_losses[-1]) <= 1e-3 * abs(fb_losses[-1]),
                    f"last loss shown: {cells[6]} ~ {fb_losses[-1]}")
            R.check(bob_run not in d.page_source, "bob's run is not listed for alice")
            row = d.find_element(By.CSS_SELECTOR, f"#runs-table tbody tr[data-run='{resumed}']")
            R.check(row.find_elements(By.TAG_NAME, "td")[5].text == str(3 + RESUMED),
                    f"the resumed run is listed at step {3 + RESUMED}")
            shot(d, "02-runs.png")

            # the resumed run: its page, its curves and its checkpoint say the same step
            d.get(s.url + "/console/#/runs/" + urllib.parse.quote(resumed))
            d.refresh()
            wait(d, lambda x: len(x.find_elements(By.CSS_SELECTOR, "#chart-grad circle.pt")) == RESUMED, "grad points")
            facts = dict(zip([e.text for e in d.find_elements(By.CSS_SELECTOR, "#run-facts dt")],
                             [e.text for e in d.find_elements(By.CSS_SELECTOR, "#run-facts dd")]))
            loss_x = [int(p.get_attribute("data-step")) for p in d.find_elements(By.CSS_SELECTOR, "#chart-loss circle.pt")]
            grad_x = [int(p.get_attribute("data-step")) for p in d.find_elements(By.CSS_SELECTOR, "#chart-grad circle.pt")]
            ck = [r for r in d.find_elements(By.CSS_SELECTOR, "#ckpt-table tbody tr") if r.get_attribute("data-path") == res_ck]
            ck_step = ck[0].find_elements(By.TAG_NAME, "td")[ck_step_col(d)].text if ck else None
            last = 3 + RESUMED
            R.check(facts.get("Optimizer step", "").startswith(f"{last} ({RESUMED} taken in this run)")
                    and grad_x == list(range(4, last + 1)) and loss_x == list(range(4, last + 2)) and ck_step == str(last),
                    f"a resumed run: step {last} on its page ({facts.get('Optimizer step')!r}), steps {grad_x} on the "
                    f"chart and the one being accumulated after them ({loss_x}), {ck_step} on its checkpoint")
            shot(d, "02b-resumed-run.png")

            # 3. bob's run by id: not found
            d.get(s.url + "/console/#/runs/" + urllib.parse.quote(bob_run))
            d.refresh()
            wait(d, lambda x: x.find_element(By.ID, "run-title").text == "Run not found", "not found title")
            R.check(d.find_element(By.ID, "run-title").text == "Run not found" and "not found" in toast_text(d),
                    f"bob's run opened by id: not found ({toast_text(d)!r})")
            R.check(not d.find_elements(By.CSS_SELECTOR, "#chart-loss circle"), "nothing of bob's run is drawn")
            shot(d, "03-other-tenant.png")

            # 4. the run: curves and checkpoints
            d.get(s.url + "/console/#/runs")
            link = wait(d, lambda x: x.find_element(By.LINK_TEXT, run), "run link")
            link.click()
            wait(d, lambda x: x.find_elements(By.CSS_SELECTOR, "#chart-loss circle.pt"), "loss points")
            pts = d.find_elements(By.CSS_SELECTOR, "#chart-loss circle.pt")
            n_steps = STEPS
            loss_vals = [float(p.get_attribute("data-value")) for p in pts]
            R.check(len(pts) == n_steps, f"loss curve: one point per step ({len(pts)} points, {n_steps} steps)")
            R.check(all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(loss_vals, fb_losses)),
                    f"loss points are the forward_backward losses {loss_vals} ~ {fb_losses}")
            gpts = d.find_elements(By.CSS_SELECTOR, "#chart-grad circle.pt")
            gvals = [float(p.get_attribute("data-value")) for p in gpts]
            R.check(len(gpts) == n_steps and all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(gvals, grads)),
                    f"gradient-norm curve: {len(gpts)} points, the optim_step grad norms")
            ck_rows = d.find_elements(By.CSS_SELECTOR, "#ckpt-table tbody tr")
            paths = [r.get_attribute("data-path") for r in ck_rows]
            R.check(paths == [f"tinker://{run}/weights/step3", smp["path"]], f"checkpoints listed: {paths}")
            final_row = ck_rows[-1]
            R.check("weights/step3" in final_row.find_elements(By.TAG_NAME, "td")[4].text,
                    "lineage: the sampler checkpoint's parent is weights/step3")
            metas = [r.find_elements(By.TAG_NAME, "td")[6].text for r in ck_rows]
            R.check(metas == ["–", "stage=final"], f"checkpoint user_metadata shown: {metas}")
            facts = {f.find_element(By.TAG_NAME, "dt").text: f.find_element(By.TAG_NAME, "dd").text
                     for f in d.find_elements(By.CSS_SELECTOR, "#run-facts div")}
            R.check(facts.get("Session") == f"alice sft ({alice.sid})" and facts.get("Project") == "demo" and
                    facts.get("Optimizer") == "adamw" and facts.get("Session state", "").startswith("errored") and
                    facts.get("Session state", "").endswith(": stopped after 5 steps") and
                    set(facts.get("Session metadata", "").split()) == {"recipe=sft", "data=v2"},
                    f"run facts: session name, project, optimizer, finish reason and detail, metadata: {facts}")
            shot(d, "04-run.png")
            final_row.find_element(By.CSS_SELECTOR, "button[data-format=peft]").click()
            a = wait(d, lambda x: final_row.find_elements(By.CSS_SELECTOR, "a.download"), "download link")
            href = a[0].get_attribute("href") if a else ""
            R.check(href.startswith(s.url + "/api/v1/checkpoint_archives/") and s.key not in href,
                    "the page shows a signed download link without the key")
            with urllib.request.urlopen(href) as r:
                data = r.read()
            names = tarfile.open(fileobj=io.BytesIO(data)).getnames()
            R.check("adapter_model.safetensors" in names and "adapter_config.json" in names,
                    f"the download link gives the archive ({len(data)} bytes: {names})")
            shot(d, "05-run-download.png")

            # 5. the playground on the sampler checkpoint
            final_row.find_element(By.LINK_TEXT, "Sample").click()
            wait(d, lambda x: x.find_element(By.ID, "view-playground").is_displayed(), "playground")
            wait(d, lambda x: x.find_element(By.ID, "play-source").get_attribute("value") == "path:" + smp["path"],
                 "the checkpoint preselected")
            R.check(d.find_element(By.ID, "play-source").get_attribute("value") == "path:" + smp["path"],
                    "the playground opens on the checkpoint")
            mx = d.find_element(By.ID, "play-max")
            mx.clear()
            mx.send_keys("8")
            d.find_element(By.ID, "play-submit").click()
            samples = wait(d, lambda x: x.find_elements(By.CSS_SELECTOR, "#play-results .sample"), "samples", 90)
            R.check(samples and len(samples) == 2, f"two samples shown ({len(samples or [])}; {toast_text(d)!r})")
            shown = [x.find_element(By.CSS_SELECTOR, ".meta.mono").text for x in samples or []]
            db = s.psql("SELECT result::text FROM operations o JOIN sampling_sessions ss ON ss.id = o.sampling_session_id"
                        f" WHERE ss.model_path = '{smp['path']}' AND o.state = 'done' ORDER BY o.id DESC LIMIT 1")
            want = ["tokens: " + " ".join(map(str, q["tokens"])) for q in json.loads(db)["sequences"]] if db else []
            R.check(shown == want and all(1 <= len(w.split()) - 1 <= 8 for w in want),
                    f"the samples shown are the sampled tokens (<= 8 each): {shown}")
            shot(d, "06-playground.png")
            # with the chat template, the answer stops at the end of the assistant's turn
            d.find_element(By.ID, "play-chat").click()
            d.find_element(By.ID, "play-submit").click()
            wait(d, lambda x: "<|im_start|>assistant" in " ".join(
                e.text for e in x.find_elements(By.CSS_SELECTOR, "#play-results .sample .prompt")), "chat samples", 90)
            sent = s.psql("SELECT payload->'stop_tokens' FROM operations WHERE kind = 'sample' ORDER BY id DESC LIMIT 1")
            R.check(sent and json.loads(sent) == im_end, f"the playground's chat sample stops at <|im_end|>: {sent}")
            shot(d, "06b-playground-chat.png")

            # nothing left the page with the key in its URL, nothing came from elsewhere
            urls = d.execute_script("return performance.getEntriesByType('resource').map(e => e.name)"
                                    ".concat([location.href])")
            R.check(all(s.key not in u for u in urls), f"the key is in no URL the page requested ({len(urls)})")
            R.check(all(u.startswith(s.url) for u in urls), "every resource came from Loom itself")

            # 6. the operator
            d.find_element(By.ID, "signout").click()
            wait(d, lambda x: x.find_element(By.ID, "view-signin").is_displayed(), "signed out")
            R.check(d.execute_script("return sessionStorage.getItem('loom.key')") is None, "sign out forgets the key")
            sign_in(d, s.url, op_key)
            wait(d, lambda x: x.find_elements(By.CSS_SELECTOR, "#op-timeline g.cycle"), "timeline")
            tenants = [r.get_attribute("data-tenant") for r in d.find_elements(By.CSS_SELECTOR, "#op-tenants tbody tr")]
            R.check({"default", "bob", "ops"} <= set(tenants), f"operator: every tenant listed {tenants}")
            R.check(len(d.find_elements(By.CSS_SELECTOR, "#op-executors .exe")) >= 1, "operator: the executor card")
            bars = d.find_elements(By.CSS_SELECTOR, "#op-timeline g.cycle")
            both = [b for b in bars if set((b.get_attribute("data-tenants") or "").split(",")) >= {"default", "bob"}]
            R.check(len(bars) > 0 and len(both) > 0, f"timeline: {len(bars)} cycles, {len(both)} shared by default and bob")
            R.check(d.find_element(By.ID, "nav-operator").get_attribute("hidden") is None, "the Operator tab is shown")
            shot(d, "07-operator.png")
            # a tenant key cannot read the operator routes
            st, body = s.get("/api/v1/console/admin/overview")
            R.check(st == 403, f"a tenant key gets 403 on the operator routes ({st})")
        finally:
            d.quit()
    R.finish()


if __name__ == "__main__":
    main()
