// The Loom console: hand-written, no framework, no external asset. Every text from the
// server goes into the page through textContent (never as HTML). The API key lives in
// sessionStorage (this tab only) and goes out as the X-API-Key header, never in a URL.
"use strict";
(() => {
  const KEY = "loom.key";
  const SVGNS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#1f5fa8", "#d9730d", "#0f8a5f", "#9b3fb5", "#c2410c", "#0e7490", "#a16207", "#be185d",
                   "#4d7c0f", "#6d28d9", "#b91c1c", "#155e75"];
  const $ = (id) => document.getElementById(id);
  let me = null;                 // console/whoami
  let refreshTimer = null;
  const play = { session: null, samplers: {}, seq: {}, checkpoints: [] };

  // ---- small helpers ------------------------------------------------------------------------
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
    return e;
  }
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function clear(node) { while (node.firstChild) node.firstChild.remove(); return node; }
  const fmtNum = (v, digits = 5) => (v === null || v === undefined) ? "–" :
    (Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0)) ? Number(v).toExponential(3) : Number(Number(v).toPrecision(digits)).toString();
  const fmtInt = (v) => (v === null || v === undefined) ? "–" : Number(v).toLocaleString("en-US");
  function fmtBytes(v) {
    if (v === null || v === undefined) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : v.toFixed(0)) + " " + u[i];
  }
  const fmtTime = (iso) => iso ? iso.replace("T", " ").replace(/\.\d+Z$/, " UTC") : "–";
  const badge = (s) => el("span", { class: "badge " + s, text: s });
  // user_metadata ({key: value} of strings) as chips; "–" when there is none
  const metaChips = (m) => (m && Object.keys(m).length)
    ? el("span", { class: "meta" }, ...Object.entries(m).map(([k, v]) => el("span", { class: "mono", text: k + "=" + v })))
    : "–";
  // a session's state: active, expired, or how its client finished it (ServiceClient.close)
  const sessionBadge = (state, reason) => badge(state === "finished" ? reason : state);
  function tenantColour(name) {
    let h = 0;
    for (const ch of name) h = (h * 31 + ch.codePointAt(0)) >>> 0;
    return PALETTE[h % PALETTE.length];
  }
  function toast(msg) {
    const t = $("toast");
    t.textContent = msg;
    t.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { t.hidden = true; }, 8000);
  }
  // tinker://<run>/<weights|sampler_weights>/<name> -> {run, id}
  function parsePath(p) {
    const m = /^tinker:\/\/(.+)\/(weights|sampler_weights)\/([^/]+)$/.exec(p || "");
    return m ? { run: m[1], id: m[2] + "/" + m[3] } : null;
  }

  // ---- the API ---------------------------------------------------------------------------------
  async function api(method, path, body) {
    const headers = { "X-API-Key": sessionStorage.getItem(KEY) || "" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const r = await fetch("../api/v1/" + path, {
      method, headers, cache: "no-store", body: body === undefined ? undefined : JSON.stringify(body) });
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) {
      const err = new Error((data && data.detail) || (r.status + " " + r.statusText));
      err.status = r.status;
      if (r.status === 401) signOut(err.message);
      throw err;
    }
    return data;
  }
  // A future's result (retrieve_future long-polls; try_again means ask again).
  async function result(requestId) {
    for (let i = 0; i < 40; i++) {
      const r = await api("POST", "retrieve_future", { request_id: requestId });
      if (r && r.type === "try_again") continue;
      if (r && r.error) throw new Error(r.error);
      return r;
    }
    throw new Error("no result after 40 polls");
  }

  // ---- sign in, navigation ---------------------------------------------------------------------
  async function signIn(key) {
    sessionStorage.setItem(KEY, key);
    try {
      me = await api("GET", "console/whoami");
    } catch (e) {
      sessionStorage.removeItem(KEY);
      me = null;
      throw e;
    }
    $("nav").hidden = false;
    $("who").hidden = false;
    $("who-name").textContent = me.tenant + (me.operator ? " · operator" : "");
    $("nav-operator").hidden = !me.operator;
    const tenantKey = me.scopes.some((s) => s === "train" || s === "sample" || s === "read");
    for (const a of document.querySelectorAll("#nav a[data-view=runs], #nav a[data-view=playground]")) a.hidden = !tenantKey;
  }
  function signOut(message) {
    sessionStorage.removeItem(KEY);
    me = null;
    Object.assign(play, { session: null, samplers: {}, seq: {}, checkpoints: [] });
    $("nav").hidden = true;
    $("who").hidden = true;
    if (location.hash !== "#/signin") location.hash = "#/signin";
    else route();
    if (message) { $("signin-error").textContent = message; $("signin-error").hidden = false; }
  }
  function show(view) {
    for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== "view-" + view;
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.view === view ||
      (view === "run" && a.dataset.view === "runs"));
  }
  async function route() {
    $("toast").hidden = true;   // a message belongs to the page it was shown on
    clearInterval(refreshTimer);
    refreshTimer = null;
    const hash = location.hash || "";
    if (!sessionStorage.getItem(KEY)) { show("signin"); $("key").focus(); return; }
    if (!me) {
      try { await signIn(sessionStorage.getItem(KEY)); } catch (e) { signOut(e.message); return; }
    }
    const tenantKey = me.scopes.some((s) => s === "train" || s === "sample" || s === "read");
    let m;
    try {
      if ((m = /^#\/runs\/(.+)$/.exec(hash))) { show("run"); await loadRun(decodeURIComponent(m[1])); }
      else if (hash.startsWith("#/playground")) { show("playground"); await loadPlayground(new URLSearchParams(hash.split("?")[1] || "")); }
      else if (hash === "#/operator" && me.operator) {
        show("operator");
        await loadOperator();
        refreshTimer = setInterval(() => loadOperator().catch((e) => toast(e.message)), 5000);
      } else if (tenantKey) { show("runs"); await loadRuns(); if (hash !== "#/runs") history.replaceState(null, "", "#/runs"); }
      else { location.hash = "#/operator"; }
    } catch (e) {
      toast(e.message);
    }
  }

  // ---- runs ------------------------------------------------------------------------------------
  async function loadRuns() {
    const data = await api("GET", "console/runs?limit=200");
    const body = clear($("runs-table").tBodies[0]);
    for (const r of data.runs) {
      body.append(el("tr", { "data-run": r.run_id },
        el("td", { class: "mono wrap" }, el("a", { href: "#/runs/" + encodeURIComponent(r.run_id), text: r.run_id })),
        el("td", { class: "session", title: r.session_id }, r.session_name || r.session_id.slice(0, 8), " ",
           sessionBadge(r.session_state, r.finish_reason)),
        el("td", { text: r.base_model }), el("td", {}, badge(r.status)),
        el("td", { class: "num", text: r.lora_rank }), el("td", { class: "num", text: fmtInt(r.steps) }),
        el("td", { class: "num", text: fmtNum(r.last_loss) }), el("td", { class: "num", text: fmtInt(r.queued) }),
        el("td", { text: fmtTime(r.last_request_at) })));
    }
    $("runs-table").hidden = data.runs.length === 0;
    $("runs-empty").hidden = data.runs.length !== 0;
  }

  async function loadRun(id) {
    $("run-crumb").textContent = id;
    $("run-title").textContent = "Run " + id;
    let data;
    try {
      data = await api("GET", "console/runs/" + encodeURIComponent(id));
    } catch (e) {
      $("run-body").hidden = true;
      $("run-missing").hidden = e.status !== 404;
      $("run-title").textContent = e.status === 404 ? "Run not found" : "Run";
      throw e;
    }
    $("run-body").hidden = false;
    $("run-missing").hidden = true;
    const r = data.run, curve = data.curve;
    // The optimizer's step, as the runs list and the checkpoints count it; a run resumed
    // from a checkpoint took fewer steps itself.
    const taken = data.operations["optim_step:done"] || 0;
    const lastLoss = [...curve].reverse().find((p) => p.loss !== null);
    const facts = clear($("run-facts"));
    const fact = (k, v) => facts.append(el("div", {}, el("dt", { text: k }), el("dd", {}, v)));
    fact("Status", badge(r.status));
    fact("Base model", r.base_model);
    fact("LoRA rank", String(r.lora_rank) + " (" + ["attn", "mlp", "unembed"].filter((k) => r["train_" + k]).join(", ") + ")");
    fact("Optimizer step", fmtInt(r.step) + (taken !== r.step ? ` (${fmtInt(taken)} taken in this run)` : ""));
    fact("Last loss", lastLoss ? fmtNum(lastLoss.loss) : "–");
    fact("Created", fmtTime(r.created_at));
    fact("Last request", fmtTime(r.last_request_at));
    const ss = data.session;
    fact("Session", ss.display_name ? ss.display_name + " (" + ss.session_id + ")" : ss.session_id);
    fact("Session state", el("span", {}, sessionBadge(ss.state, ss.finish_reason),
                              ss.state === "finished" ? " " + fmtTime(ss.finished_at) + (ss.finish_detail ? ": " + ss.finish_detail : "") : ""));
    fact("Project", ss.project_id || "–");
    fact("Optimizer", r.optimizer);
    fact("Run metadata", metaChips(r.user_metadata));
    fact("Session metadata", metaChips(ss.user_metadata));
    lineChart($("chart-loss"), curve.filter((p) => p.loss !== null).map((p) => [p.step, p.loss]), "loss", "loss");
    lineChart($("chart-grad"), curve.filter((p) => p.grad_norm !== null && p.grad_norm >= 0).map((p) => [p.step, p.grad_norm]), "grad", "grad norm");
    const ops = clear($("run-ops"));
    for (const [k, n] of Object.entries(data.operations).sort()) ops.append(el("span", { class: "mono", text: k + " " + n }));
    renderCheckpoints(r.run_id, data.checkpoints);
  }

  function renderCheckpoints(runId, cks) {
    const body = clear($("ckpt-table").tBodies[0]);
    for (const c of cks) {
      const parent = parsePath(c.parent_path);
      let parentCell = "–";
      if (parent) {
        parentCell = parent.run === runId ? el("span", { class: "mono", text: "← " + parent.id })
          : el("a", { class: "mono", href: "#/runs/" + encodeURIComponent(parent.run), title: c.parent_path,
                      text: "← " + parent.run + "/" + parent.id });
      }
      const linkCell = el("td", { class: "dl" });
      const fetchLink = async (format, button) => {
        button.disabled = true;
        try {
          const l = await api("GET", "console/download_link?path=" + encodeURIComponent(c.tinker_path) + "&format=" + format);
          for (const old of linkCell.querySelectorAll("a.download")) old.remove();
          linkCell.append(el("a", { class: "download", href: l.url, "data-format": format, download: true,
                                    text: "download " + format + " (valid until " + fmtTime(l.expires) + ")" }));
        } catch (e) { toast(e.message); } finally { button.disabled = false; }
      };
      for (const f of ["tinker", "peft"]) {
        const b = el("button", { type: "button", class: "small secondary", "data-format": f, text: f === "tinker" ? "Tinker tar" : "PEFT tar" });
        b.addEventListener("click", () => fetchLink(f, b));
        linkCell.append(b);
      }
      const sampleCell = el("td", {}, c.kind === "sampler" ? el("a", { href: "#/playground?path=" + encodeURIComponent(c.tinker_path), text: "Sample" }) : null);
      body.append(el("tr", { "data-path": c.tinker_path },
        el("td", {}, el("span", { class: "mono", text: c.checkpoint_id }), " ", c.public ? badge("public") : null),
        el("td", { class: "num", text: fmtInt(c.step) }), el("td", { text: fmtTime(c.time) }),
        el("td", { class: "num", text: fmtBytes(c.size_bytes) }), el("td", {}, parentCell),
        el("td", { class: "num", text: fmtNum(c.last_loss) }), el("td", {}, metaChips(c.user_metadata)), linkCell, sampleCell));
    }
    $("ckpt-table").hidden = cks.length === 0;
    $("ckpt-empty").hidden = cks.length !== 0;
  }

  // "Nice" tick values covering [lo, hi].
  function ticks(lo, hi, n) {
    if (hi === lo) { hi = lo + 1; lo = lo - (lo === 0 ? 0 : 1); }
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((f) => f * mag).find((s) => s >= raw);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  // A line chart of [x, y] points: axes, grid, the line, one circle per point (title: value).
  function lineChart(box, pts, cls, yName) {
    clear(box);
    const W = 560, H = 260, L = 58, R = 14, T = 12, B = 34;
    const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": yName + " per step", "data-points": pts.length });
    box.append(s);
    if (!pts.length) { s.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "none" }, "no steps yet")); return; }
    let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
    const yt = ticks(y0, y1, 5);
    y0 = Math.min(y0, yt[0]); y1 = Math.max(y1, yt[yt.length - 1]);
    if (y1 === y0) y1 = y0 + 1;
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    const X = (x) => L + (x - x0) / (x1 - x0) * (W - L - R), Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    for (const v of yt) {
      s.append(svg("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v), class: "gridline" }));
      s.append(svg("text", { x: L - 6, y: Y(v) + 4, "text-anchor": "end", class: "tick" }, fmtNum(v, 4)));
    }
    for (const v of ticks(x0, x1, 6).filter((v) => Number.isInteger(v) && v >= x0 && v <= x1))
      s.append(svg("text", { x: X(v), y: H - B + 16, "text-anchor": "middle", class: "tick" }, String(v)));
    s.append(svg("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "tick" }, "step"));
    s.append(svg("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
    s.append(svg("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
    s.append(svg("polyline", { class: "line " + cls, points: pts.map((p) => X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(" ") }));
    const r = pts.length > 200 ? 1.5 : 3;
    for (const p of pts) {
      const c = svg("circle", { cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r, class: "pt " + cls, "data-step": p[0], "data-value": p[1] });
      c.append(svg("title", {}, `step ${p[0]}: ${yName} ${fmtNum(p[1], 6)}`));
      s.append(c);
    }
  }

  // ---- playground --------------------------------------------------------------------------------
  async function loadPlayground(params) {
    const data = await api("GET", "console/checkpoints?limit=200");
    play.checkpoints = data.checkpoints;
    const sel = clear($("play-source"));
    for (const b of data.base_models) sel.append(el("option", { value: "base:" + b, text: "base model " + b }));
    for (const c of data.checkpoints)
      sel.append(el("option", { value: "path:" + c.tinker_path,
        text: c.tinker_path + " (" + c.owner + (c.public ? ", public" : "") + ", step " + c.step + ")" }));
    const want = params.get("path");
    if (want) {
      if (data.checkpoints.some((c) => c.tinker_path === want)) { sel.value = "path:" + want; $("play-path").value = ""; }
      else $("play-path").value = want;
    } else if (data.checkpoints.length) sel.value = "path:" + data.checkpoints[0].tinker_path;
  }

  async function samplerFor(source) {
    if (!play.session) {
      play.session = (await api("POST", "create_session", { tags: ["console"], sdk_version: "loom-console" })).session_id;
    }
    if (!play.samplers[source.key]) {
      const body = { session_id: play.session };
      if (source.path) body.model_path = source.path; else body.base_model = source.baseModel;
      play.samplers[source.key] = (await api("POST", "create_sampling_session", body)).sampling_session_id;
      play.seq[source.key] = 0;
    }
    return play.samplers[source.key];
  }

  async function sample(ev) {
    ev.preventDefault();
    const status = $("play-status"), out = $("play-results"), button = $("play-submit");
    const custom = $("play-path").value.trim(), picked = $("play-source").value;
    let source;
    if (custom) source = { key: "path:" + custom, path: custom };
    else if (picked.startsWith("path:")) source = { key: picked, path: picked.slice(5) };
    else source = { key: picked, baseModel: picked.slice(5) };
    button.disabled = true;
    try {
      status.textContent = "preparing…";
      if (source.path && !source.baseModel) {
        const known = play.checkpoints.find((c) => c.tinker_path === source.path);
        source.baseModel = known ? known.base_model : (await api("POST", "weights_info", { tinker_path: source.path })).base_model;
      }
      const sid = await samplerFor(source);
      const tok = await api("POST", "console/tokenize", { base_model: source.baseModel, text: $("play-prompt").value, chat: $("play-chat").checked });
      if (!tok.ids.length) throw new Error("the prompt is empty");
      status.textContent = "sampling…";
      const req = {
        sampling_session_id: sid, seq_id: play.seq[source.key]++, num_samples: Number($("play-n").value),
        prompt: { chunks: [{ type: "encoded_text", tokens: tok.ids }] },
        sampling_params: { max_tokens: Number($("play-max").value), temperature: Number($("play-temp").value), seed: Number($("play-seed").value),
          // a chat prompt's answer ends with the assistant's turn, as /v1/chat/completions ends it
          ...(tok.stop_tokens.length ? { stop: tok.stop_tokens } : {}) },
      };
      const t0 = performance.now();
      const fut = await api("POST", "asample", req);
      const res = await result(fut.request_id);
      const secs = ((performance.now() - t0) / 1000).toFixed(2);
      clear(out);
      out.append(el("p", { class: "meta" }, `${res.sequences.length} sample(s) from ${source.path || source.baseModel} in ${secs} s; prompt ${tok.ids.length} tokens`));
      let i = 0;
      for (const seq of res.sequences) {
        const text = (await api("POST", "console/detokenize", { base_model: source.baseModel, ids: seq.tokens })).text;
        const lp = seq.logprobs && seq.logprobs.length ? seq.logprobs.reduce((a, b) => a + b, 0) : null;
        out.append(el("div", { class: "sample card" },
          el("div", { class: "meta" }, `sample ${++i}: ${seq.tokens.length} tokens, stop: ${seq.stop_reason}` + (lp === null ? "" : `, logprob ${fmtNum(lp, 5)}`)),
          el("pre", {}, el("span", { class: "prompt", text: tok.text }), el("span", { class: "completion", text })),
          el("div", { class: "meta mono", text: "tokens: " + seq.tokens.join(" ") })));
      }
      status.textContent = "";
    } catch (e) {
      status.textContent = "";
      toast(e.message);
    } finally {
      button.disabled = false;
    }
  }

  // ---- operator ----------------------------------------------------------------------------------
  function meter(label, used, total, text) {
    const fill = el("div", { class: "fill" });
    fill.style.width = total > 0 ? Math.min(100, 100 * used / total).toFixed(1) + "%" : "0%";
    return el("div", { class: "meter" }, el("div", { class: "label" }, el("span", { text: label }), el("span", { text })),
      el("div", { class: "bar" }, fill));
  }

  // A MoE model's routing since the executor started: one row per sparse layer, one cell
  // per expert, darker for more tokens (relative to that layer's busiest expert); the line
  // under it names the layer furthest from balance.
  function expertStrip(rows) {
    const box = el("div", { class: "experts" });
    let worst = null;
    rows.forEach((row, layer) => {
      const total = row.reduce((a, b) => a + b, 0), max = Math.max(...row), min = Math.min(...row);
      const fair = total / row.length, line = el("div", { class: "experts-row" });
      for (const [i, n] of row.entries()) {
        const cell = el("span", { title: `layer ${layer}, expert ${i}: ${fmtInt(n)} tokens` });
        cell.style.opacity = max > 0 ? (0.08 + 0.92 * n / max).toFixed(3) : "0.08";
        line.append(cell);
      }
      box.append(line);
      if (fair > 0 && (!worst || max / fair > worst.ratio))
        worst = { layer, ratio: max / fair, idle: row.filter((n) => n === 0).length, min: min / fair };
    });
    const sub = worst ? `experts: layer ${worst.layer} is the least balanced (busiest ${fmtNum(worst.ratio, 3)}× its ` +
      `fair share, least ${fmtNum(worst.min, 3)}×, ${worst.idle} idle)` : "experts: no tokens routed yet";
    return el("div", {}, el("div", { class: "sub", text: `tokens per expert, ${rows.length} sparse layer(s)` }), box,
      el("div", { class: "sub", text: sub }));
  }

  async function loadOperator() {
    const [ov, cy] = await Promise.all([api("GET", "console/admin/overview"), api("GET", "console/admin/cycles?limit=80")]);
    $("op-updated").textContent = "updated " + fmtTime(ov.now) + " · every 5 s";
    const exes = clear($("op-executors"));
    for (const e of ov.executors) {
      const card = el("div", { class: "card exe", "data-executor": e.id },
        el("h3", {}, `${e.name} #${e.id}`, badge(e.state)),
        el("div", { class: "sub" }, `${e.host} · ${e.device} · ${e.backend} · ${e.base_model}`),
        meter("adapters in memory", e.memory_used, e.memory_budget, fmtBytes(e.memory_used) + " / " + fmtBytes(e.memory_budget)));
      if (e.gpu_utilization !== null) {
        card.append(meter("GPU utilisation", e.gpu_utilization, 100, fmtNum(e.gpu_utilization, 3) + " %"));
        card.append(meter("GPU memory", e.gpu_memory_used, e.gpu_memory_total, fmtBytes(e.gpu_memory_used) + " / " + fmtBytes(e.gpu_memory_total)));
        const extra = [e.gpu_temperature !== null ? e.gpu_temperature + " °C" : null, e.gpu_power_watts !== null ? fmtNum(e.gpu_power_watts, 4) + " W" : null].filter(Boolean);
        if (extra.length) card.append(el("div", { class: "sub", text: extra.join(" · ") }));
      } else {
        card.append(el("div", { class: "sub", text: "device memory " + fmtBytes(e.memory_total) + " · no GPU figures (CPU backend or no NVML)" }));
      }
      if (e.expert_tokens) card.append(expertStrip(e.expert_tokens));
      card.append(el("div", { class: "sub" }, `heartbeat ${e.heartbeat_age_s} s ago · ${e.training_slots} training slot(s), ` +
        `${e.sampler_snapshots} snapshot(s), ${e.cached_checkpoints} cached checkpoint(s)` + (e.cycle ? ` · running cycle ${e.cycle}` : "")));
      exes.append(card);
    }
    if (!ov.executors.length) exes.append(el("p", { class: "empty", text: "No executor has registered." }));
    timeline(cy.cycles);
    const cb = clear($("op-cycles").tBodies[0]);
    for (const c of cy.cycles.slice(0, 25)) {
      const who = el("td", {});
      for (const t of c.tenants) {
        const sw = el("span", { class: "swatch" });
        sw.style.background = tenantColour(t.tenant);
        who.append(sw, `${t.tenant} (${t.ops}, ${fmtInt(t.tokens)})  `);
      }
      cb.append(el("tr", { "data-cycle": c.id }, el("td", { class: "num", text: c.id }), el("td", { text: `${c.executor} #${c.executor_id}` }),
        el("td", {}, badge(c.state)), el("td", { class: "num", text: c.ms === null ? "–" : fmtNum(c.ms, 4) }),
        el("td", { class: "num", text: c.n_ops }), el("td", { class: "num", text: fmtInt(c.n_tokens) }), who));
    }
    const qb = clear($("op-queue").tBodies[0]);
    for (const q of ov.queue)
      qb.append(el("tr", {}, el("td", {}, badge(q.state)), el("td", { class: "mono", text: q.kind }), el("td", { text: q.base_model }),
        el("td", { text: q.tenant }), el("td", { class: "num", text: fmtInt(q.n) }), el("td", { class: "num", text: q.oldest_s + " s" })));
    $("op-queue").hidden = !ov.queue.length;
    $("op-queue-empty").hidden = !!ov.queue.length;
    const tb = clear($("op-tenants").tBodies[0]);
    for (const t of ov.tenants) {
      const tok = t.tokens || {};
      const sw = el("span", { class: "swatch" });
      sw.style.background = tenantColour(t.name);
      tb.append(el("tr", { "data-tenant": t.name }, el("td", {}, sw, t.name),
        el("td", { class: "num", text: t.runs }), el("td", { class: "num", text: t.active_runs }), el("td", { class: "num", text: t.pending }),
        el("td", { class: "num", text: t.keys }),
        el("td", { class: "usage" }, ["train", "prefill", "sample"].map((k) => fmtInt(tok[k] || 0)).join(" · "))));
    }
  }

  // Time -> x for the timeline: the stretches where some cycle ran keep their proportions;
  // each idle stretch between them (over 50 ms) takes a fixed 10 px, marked with a dashed
  // line. Writes the clock time at the start and the end; returns the mapping.
  function timeScale(cycles, x0, x1, s, top, bottom) {
    const iv = cycles.map((c) => [Date.parse(c.started_at), Math.max(Date.parse(c.finished_at), Date.parse(c.started_at) + 1)])
      .sort((a, b) => a[0] - b[0]);
    const blocks = [];
    for (const [a, b] of iv) {
      const last = blocks[blocks.length - 1];
      if (last && a - last[1] <= 50) last[1] = Math.max(last[1], b);
      else blocks.push([a, b]);
    }
    const GAP = 10, MIN = 4, busy = blocks.reduce((sum, b) => sum + b[1] - b[0], 0);
    const scale = (x1 - x0 - GAP * (blocks.length - 1) - MIN * blocks.length) / busy;
    const starts = [];
    let x = x0;
    for (const b of blocks) { starts.push(x); x += MIN + (b[1] - b[0]) * scale + GAP; }
    const map = (ms) => {
      let i = blocks.length - 1;
      while (i > 0 && ms < blocks[i][0]) i--;
      return starts[i] + MIN / 2 + (Math.min(Math.max(ms, blocks[i][0]), blocks[i][1]) - blocks[i][0]) * scale;
    };
    for (let i = 1; i < blocks.length; i++) {
      const gx = starts[i] - GAP / 2;
      s.append(svg("line", { x1: gx, x2: gx, y1: top, y2: bottom - 8, class: "gap" }));
    }
    const clock = (ms) => new Date(ms).toISOString().slice(11, 23);
    s.append(svg("text", { x: x0, y: bottom + 12, "text-anchor": "start", class: "tick" }, clock(blocks[0][0]) + " UTC"));
    s.append(svg("text", { x: x1, y: bottom + 12, "text-anchor": "end", class: "tick" }, clock(blocks[blocks.length - 1][1])));
    return map;
  }

  // Cycles on a time axis, one lane per executor; a cycle's bar is split by its tenants' shares of its operations.
  function timeline(cycles) {
    const box = clear($("op-timeline")), legend = clear($("op-legend"));
    const ran = cycles.filter((c) => c.started_at && c.finished_at);
    const W = 1000, laneH = 34, L = 120, R = 10, T = 8;
    const lanes = [...new Set(ran.map((c) => c.executor_id))].sort((a, b) => a - b);
    const H = T + Math.max(1, lanes.length) * (laneH + 6) + 22;
    const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "recent cycles", "data-cycles": ran.length });
    box.append(s);
    if (!ran.length) { s.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "tick" }, "no cycle yet")); return; }
    const t = (iso) => Date.parse(iso);
    lanes.forEach((id, i) => {
      const y = T + i * (laneH + 6), c = ran.find((x) => x.executor_id === id);
      s.append(svg("rect", { x: L, y, width: W - L - R, height: laneH, class: "lane" }));
      s.append(svg("text", { x: L - 8, y: y + laneH / 2 + 4, "text-anchor": "end", class: "lanelabel" }, `${c.executor} #${id}`));
    });
    const X = timeScale(ran, L, W - R, s, T, H - 20);
    const tenants = new Set();
    for (const c of ran) {
      const lane = lanes.indexOf(c.executor_id), y = T + lane * (laneH + 6);
      const x = X(t(c.started_at)), w = Math.max(3, X(t(c.finished_at)) - x);
      const total = c.tenants.reduce((a, b) => a + b.ops, 0) || 1;
      const g = svg("g", { class: "cycle", "data-cycle": c.id, "data-tenants": c.tenants.map((x) => x.tenant).join(",") });
      g.append(svg("title", {}, `cycle ${c.id} (${c.state}, ${c.ms} ms, ${c.n_tokens} tokens): ` +
        c.tenants.map((x) => `${x.tenant} ${x.ops} op(s), ${x.tokens} tokens, ${x.kinds.join("/")}`).join("; ")));
      let yy = y;
      for (const tn of c.tenants) {
        const h = laneH * tn.ops / total;
        g.append(svg("rect", { x: x.toFixed(1), y: yy.toFixed(1), width: w.toFixed(1), height: h.toFixed(1), fill: tenantColour(tn.tenant) }));
        yy += h;
        tenants.add(tn.tenant);
      }
      s.append(g);
    }
    for (const name of [...tenants].sort()) {
      const sw = el("i", {});
      sw.style.background = tenantColour(name);
      legend.append(el("span", {}, sw, name));
    }
  }

  // ---- wiring ---------------------------------------------------------------------------------------
  document.addEventListener("DOMContentLoaded", () => {
    $("signin-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      $("signin-error").hidden = true;
      const k = $("key").value.trim();
      try {
        await signIn(k);
        $("key").value = "";
        const target = me.scopes.some((s) => s === "train" || s === "sample" || s === "read") ? "#/runs" : "#/operator";
        if (location.hash === target) route();
        else location.hash = target;   // hashchange routes
      } catch (e) {
        $("signin-error").textContent = e.message;
        $("signin-error").hidden = false;
      }
    });
    $("signout").addEventListener("click", () => signOut());
    $("toast").addEventListener("click", () => { $("toast").hidden = true; });
    $("runs-refresh").addEventListener("click", () => loadRuns().catch((e) => toast(e.message)));
    $("run-refresh").addEventListener("click", () => route());
    $("play-form").addEventListener("submit", sample);
    window.addEventListener("hashchange", route);
    route();
  });
})();
