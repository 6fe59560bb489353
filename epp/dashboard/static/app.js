/* Pointsman dashboard: fleet, decisions, explain, charts and config, live over server-sent events.
   Every URL is relative to the page, so the page works under any path prefix. Data from requests (model names,
   ids) is only ever inserted as text, never as HTML. */
(function () {
  "use strict";

  const MAX_ROWS = 200;
  const WINDOW_S = 900;
  const PALETTE = ["#4fb3ff", "#3ecf8e", "#f2b84b", "#f06a6a", "#b48cff", "#4de0d0", "#ff8fc7", "#a0d468",
                   "#ffa86b", "#7f9cff", "#e6e17a", "#c08f6a"];
  const S = { seq: 0, rows: new Map(), colors: new Map(), series: null, charts: {}, fleet: [], es: null,
              bodyTouched: false, detailSeq: null };

  // ---- small helpers -------------------------------------------------------------------------------------
  const $ = (sel) => document.querySelector(sel);
  function el(tag, attrs, ...kids) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") n.className = v;
      else if (k === "text") n.textContent = v;
      else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
      else n.setAttribute(k, v === true ? "" : v);
    }
    for (const kid of kids) {
      if (kid === null || kid === undefined || kid === false) continue;
      n.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return n;
  }
  const fix = (v, d) => (v === null || v === undefined || Number.isNaN(v) ? "–" : Number(v).toFixed(d));
  const ms = (v) => (v === null || v === undefined ? "–" : v < 10 ? v.toFixed(2) + " ms" : v.toFixed(0) + " ms");
  const pct = (v) => (v === null || v === undefined ? "–" : (v * 100).toFixed(0) + "%");
  function clock(t) {
    const d = new Date(t * 1000);
    return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
  }
  function ago(s) {
    if (s === null || s === undefined) return "never";
    if (s < 1) return (s * 1000).toFixed(0) + " ms";
    if (s < 120) return s.toFixed(1) + " s";
    return (s / 60).toFixed(0) + " min";
  }
  function color(key) {
    if (!S.colors.has(key)) S.colors.set(key, PALETTE[S.colors.size % PALETTE.length]);
    return S.colors.get(key);
  }
  async function getJSON(url, opts) {
    const r = await fetch(url, Object.assign({ credentials: "same-origin", cache: "no-store" }, opts || {}));
    let body = null;
    try { body = await r.json(); } catch (e) { body = { error: "HTTP " + r.status }; }
    if (r.status === 401) { location.reload(); }
    return { ok: r.ok, status: r.status, body: body };
  }

  // ---- fleet ---------------------------------------------------------------------------------------------
  const HEALTH = { ok: ["pill-ok", "ok"], stale: ["pill-warn", "stale"], out: ["pill-bad", "out"],
                   unscraped: ["pill-wait", "not scraped"] };
  function spark(values) {
    const NS = "http://www.w3.org/2000/svg";
    const w = 120, h = 22;
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("class", "spark"); svg.setAttribute("width", w); svg.setAttribute("height", h);
    if (!values || !values.length) return svg;
    const max = Math.max(1, ...values);
    const step = values.length > 1 ? w / (values.length - 1) : w;
    const pts = values.map((v, i) => [(i * step).toFixed(1), (h - 1 - (v / max) * (h - 3)).toFixed(1)]);
    const area = document.createElementNS(NS, "path");
    area.setAttribute("d", "M0," + h + " L" + pts.map((p) => p.join(",")).join(" L") + " L" + pts[pts.length - 1][0] + "," + h + " Z");
    const line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", pts.map((p) => p.join(",")).join(" "));
    const title = document.createElementNS(NS, "title");
    title.textContent = "now " + values[values.length - 1] + ", max " + max + " (running + waiting)";
    svg.append(area, line, title);
    return svg;
  }
  function kvBar(kv) {
    const bar = el("span", { class: "kv" + (kv >= 0.9 ? " full" : kv >= 0.7 ? " hot" : "") }, el("i"));
    bar.firstChild.style.width = Math.max(0, Math.min(100, kv * 100)).toFixed(0) + "%";
    return bar;
  }
  function renderFleet(rows) {
    S.fleet = rows;
    const tb = $("#fleet-table tbody");
    tb.replaceChildren(...rows.map((r) => {
      const [cls, label] = HEALTH[r.health] || ["pill-wait", r.health];
      const loras = r.loras.length || r.waiting_loras.length
        ? r.loras.join(", ") + (r.waiting_loras.length ? " (+" + r.waiting_loras.length + " waiting)" : "")
        : "–";
      return el("tr", { "data-key": r.key },
        el("td", {}, r.pool),
        el("td", { class: "mono", title: (r.name ? r.name + " · " : "") + (r.models.join(", ") || "any model") },
          r.key, r.name ? el("span", { class: "dim" }, "  " + r.name) : null),
        el("td", {}, r.role || "–"),
        el("td", { class: "num" }, r.waiting),
        el("td", { class: "num" }, r.running),
        el("td", { class: "mono" }, kvBar(r.kv), pct(r.kv)),
        el("td", { class: "num" }, r.inflight),
        el("td", { class: "mono" }, loras),
        el("td", { class: "num" }, ago(r.age)),
        el("td", {}, el("span", { class: "pill " + cls }, label)),
        el("td", {}, spark(r.spark)));
    }));
    $("#st-endpoints").textContent = rows.length;
    const pools = [...new Set(rows.map((r) => r.pool))];
    $("#fleet-note").textContent = pools.length + (pools.length === 1 ? " pool" : " pools");
    const sel = $("#ex-pool");
    for (const p of pools) {
      if (![...sel.options].some((o) => o.value === p)) sel.append(el("option", { value: p }, p));
    }
    if (!S.bodyTouched && !$("#ex-body").value) {
      const model = rows.map((r) => r.models[0]).find(Boolean) || "my-model";
      $("#ex-body").value = JSON.stringify({ model: model, messages: [{ role: "user", content: "Hello!" }] });
    }
  }

  // ---- decisions -----------------------------------------------------------------------------------------
  function outcome(d) {
    if (d.error) return el("span", { class: "pill pill-bad" }, d.error);
    if (!d.done) return el("span", { class: "dim" }, "in flight…");
    const bad = d.status && d.status[0] >= "4";
    const bits = [d.status ? "HTTP " + d.status : "ended"];
    if (d.ttft_ms !== null) bits.push("TTFT " + ms(d.ttft_ms));
    else if (d.duration_ms !== null) bits.push(ms(d.duration_ms));
    return el("span", { class: bad ? "pill pill-bad" : "" }, bits.join(" · "));
  }
  function decisionRow(d) {
    const model = d.target && d.target !== d.model ? d.model + " → " + d.target : d.model || "–";
    const profile = d.profile ? d.profile + (d.decision ? " (" + d.decision + ")" : "") : "–";
    const endpoint = d.endpoint ? d.endpoint + (d.prefill ? "  ⇐ " + d.prefill : "") : "–";
    const margin = d.margin === null ? "–" : (d.margin >= 0 ? "+" : "") + d.margin.toFixed(3);
    return el("tr", { class: d.error ? "err" : null, "data-seq": d.seq, title: "request " + (d.id || "?") + " · " + d.config },
      el("td", { class: "mono" }, clock(d.t)),
      el("td", { class: "mono" }, model),
      el("td", {}, profile),
      el("td", { class: "mono" }, endpoint),
      el("td", { class: "mono dim" }, d.runner_up || "–"),
      el("td", { class: "num" }, margin),
      el("td", { class: "num" }, d.prefix ? d.prefix[0] + "/" + d.prefix[1] : "–"),
      el("td", { class: "num" }, ms(d.decide_ms)),
      el("td", {}, outcome(d)));
  }
  function addDecisions(list, flash) {
    const tb = $("#dec-table tbody");
    for (const d of list) {
      if (d.seq <= S.seq && S.rows.has(d.seq)) continue;
      S.seq = Math.max(S.seq, d.seq);
      const tr = decisionRow(d);
      if (flash) tr.classList.add("fresh-row");
      S.rows.set(d.seq, tr);
      tb.prepend(tr);
    }
    while (S.rows.size > MAX_ROWS) {
      const oldest = Math.min(...S.rows.keys());
      S.rows.get(oldest).remove();
      S.rows.delete(oldest);
    }
  }
  function updateOutcomes(list) {
    for (const d of list) {
      const tr = S.rows.get(d.seq);
      if (tr) tr.replaceWith(S.rows.set(d.seq, decisionRow(d)).get(d.seq));
    }
  }

  // ---- per-plugin score tables (decision detail and explain) ---------------------------------------------
  function scoreTable(run) {
    const totals = run.totals || {};
    const chosen = (run.targets || [])[0];
    let cols = Object.keys(totals).sort((a, b) => totals[b] - totals[a] || (b === chosen) - (a === chosen));
    if (!cols.length) cols = run.candidates || [];
    const runner = cols.find((k) => k !== chosen);
    const cls = (k) => (k === chosen ? "num chosen" : k === runner ? "num runner" : "num");
    const head = el("tr", {}, el("th", {}, "plugin"), el("th", { class: "num" }, "weight"),
      ...cols.map((k) => el("th", { class: cls(k), title: k === chosen ? "chosen" : k === runner ? "runner-up" : "" }, k)),
      el("th", { class: "num" }, "µs"));
    const body = [];
    for (const p of run.plugins || []) {
      const us = p.duration_us !== undefined ? p.duration_us : (p.duration_seconds || 0) * 1e6;
      if (p.kind === "scorer") {
        const scores = p.scores || {};
        body.push(el("tr", {},
          el("td", { title: p.type }, "scorer ", el("b", {}, p.name)),
          el("td", { class: "num" }, p.weight === undefined || p.weight === null ? "–" : p.weight),
          ...cols.map((k) => {
            const v = scores[k];
            const bar = el("span", { class: "bar" });
            bar.style.width = (v ? Math.round(v * 24) : 0) + "px";
            return el("td", { class: cls(k) }, v === undefined ? "–" : fix(v, 3), v ? bar : null);
          }),
          el("td", { class: "num dim" }, fix(us, 0))));
      } else {
        const kept = p.kept ? "kept " + p.kept.length + ": " + p.kept.join(", ") : "";
        body.push(el("tr", {},
          el("td", { title: p.type }, p.kind + " ", el("b", {}, p.name)),
          el("td", {}, ""),
          el("td", { class: "dim", colspan: cols.length }, kept),
          el("td", { class: "num dim" }, fix(us, 0))));
      }
    }
    body.push(el("tr", { class: "total" }, el("td", {}, "total"), el("td", {}, ""),
      ...cols.map((k) => el("td", { class: cls(k) }, totals[k] === undefined ? "–" : fix(totals[k], 3))),
      el("td", {}, "")));
    return el("div", { class: "scroll" },
      el("table", { class: "tbl scores" }, el("thead", {}, head), el("tbody", {}, ...body)));
  }
  function kvlist(pairs) {
    const dl = el("dl", { class: "kvlist" });
    for (const [k, v] of pairs) if (v !== null && v !== undefined && v !== "") dl.append(el("dt", {}, k), el("dd", {}, v));
    return dl;
  }

  async function showDecision(seq) {
    S.detailSeq = seq;
    const box = $("#detail-body");
    box.replaceChildren(el("p", { class: "dim" }, "loading decision " + seq + "…"));
    $("#detail").hidden = false;
    const r = await getJSON("api/decisions/" + seq);
    if (S.detailSeq !== seq) return;
    if (!r.ok) { box.replaceChildren(el("div", { class: "error-box" }, r.body.error)); return; }
    const d = r.body;
    const parts = [el("h3", {}, "Decision #" + d.seq + (d.error ? " — rejected" : " → " + d.endpoint)),
      kvlist([["time", clock(d.t)], ["request id", d.id], ["model", d.model + (d.target !== d.model ? " → " + d.target : "")],
        ["config", d.config], ["profile", d.profile + (d.decision ? " (" + d.decision + ")" : "")],
        ["endpoint", d.endpoint], ["prefill", d.prefill], ["fallbacks", d.fallbacks && d.fallbacks.join(", ")],
        ["runner-up", d.runner_up ? d.runner_up + " (margin " + fix(d.margin, 3) + ")" : ""],
        ["candidates", d.candidates], ["prefix blocks", d.prefix ? d.prefix[0] + " of " + d.prefix[1] + " matched" : ""],
        ["decide", ms(d.decide_ms)], ["error", d.error],
        ["outcome", d.done ? (d.status ? "HTTP " + d.status : "ended") + (d.ttft_ms !== null ? ", TTFT " + ms(d.ttft_ms) : "") +
          (d.duration_ms !== null ? ", " + ms(d.duration_ms) + " total" : "") : "in flight"],
        ["tokens", d.tokens ? d.tokens[0] + " prompt (" + d.tokens[2] + " cached), " + d.tokens[1] + " completion" : ""]])];
    if (!d.error && !d.scores_recorded) {
      parts.push(el("p", { class: "dim" }, "Per-plugin scores were not recorded for this decision (the scheduler ran without plugin detail); totals are shown where kept."));
    }
    for (const run of d.runs || []) {
      parts.push(el("div", { class: "runhead" }, "[" + run.profile + "] → " + run.targets.join(", ")), scoreTable(run));
    }
    box.replaceChildren(...parts);
  }

  // ---- explain -------------------------------------------------------------------------------------------
  async function explain(ev) {
    ev.preventDefault();
    const out = $("#ex-result");
    const btn = $("#ex-go");
    btn.disabled = true;
    out.replaceChildren(el("p", { class: "dim" }, "explaining…"));
    try {
      const r = await getJSON("api/explain", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ path: $("#ex-path").value, pool: $("#ex-pool").value,
                               headers: $("#ex-headers").value, body: $("#ex-body").value }) });
      if (!r.ok) { out.replaceChildren(el("div", { class: "error-box" }, r.body.error)); return; }
      const x = r.body;
      const parts = [];
      if (x.status !== 200) {
        parts.push(el("div", { class: "error-box" }, "status " + x.status + ": " + x.error));
      } else {
        parts.push(kvlist([["model", (x.model || "") + " → " + (x.target_model || "")], ["endpoint", x.endpoint],
          ["fallbacks", (x.fallbacks || []).join(", ")], ["prefill", x.prefill ? x.prefill + " (" + x.decision + ")" : ""],
          ["config", x.profile], ["candidates", (x.candidates || []).length]]));
        for (const run of x.profiles || []) {
          parts.push(el("div", { class: "runhead" }, "[" + run.profile + "] → " + (run.targets || []).join(", ")),
            scoreTable({ totals: run.totals, targets: run.targets, candidates: x.candidates, plugins: run.plugins }));
        }
      }
      parts.push(el("details", { open: true }, el("summary", { class: "dim" }, "as epp explain prints it"),
        el("pre", { class: "cli" }, x.text)));
      out.replaceChildren(...parts);
    } catch (e) {
      out.replaceChildren(el("div", { class: "error-box" }, "explain failed: " + e));
    } finally {
      btn.disabled = false;
    }
  }

  // ---- charts --------------------------------------------------------------------------------------------
  function chartSpecs(s) {
    const toMs = (arr) => arr.map((v) => (v === null || v === undefined ? null : v * 1000));
    const toPct = (arr) => arr.map((v) => (v === null || v === undefined ? null : v * 100));
    const keyed = (obj, f) => Object.keys(obj).map((k) => ({ label: k, stroke: color(k), data: f ? f(obj[k]) : obj[k] }));
    return {
      "ch-rate": [{ label: "decisions/s", stroke: "#4fb3ff", data: s.rate, fill: "rgba(79,179,255,.12)" }],
      "ch-ttft": keyed(s.ttft, toMs),
      "ch-hit": [{ label: "picker (prefix index)", stroke: "#3ecf8e", data: toPct(s.hit) },
                 { label: "engine (cached tokens)", stroke: "#b48cff", data: toPct(s.engine_hit) }],
      "ch-errors": keyed(s.errors).map((x) => Object.assign(x, { stroke: x.label.startsWith("HTTP") ? "#f06a6a" : color("err:" + x.label) })),
      "ch-queue": keyed(s.queue).concat([{ label: "in-flight (total)", stroke: "#e6e17a", data: s.inflight, dash: [4, 3] }]),
    };
  }
  function drawChart(id, spec, t) {
    const box = document.getElementById(id);
    const labels = spec.map((x) => x.label).join("\u0000");
    const data = [t, ...spec.map((x) => x.data)];
    const old = S.charts[id];
    if (old && old.labels === labels) { old.u.setData(data); return; }
    if (old) old.u.destroy();
    const axis = { stroke: "#8593a3", grid: { stroke: "#1e2731", width: 1 }, ticks: { stroke: "#263140", width: 1 } };
    const opts = {
      width: Math.max(300, box.clientWidth), height: 190,
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.15 : 1] } },
      axes: [Object.assign({}, axis), Object.assign({ size: 50 }, axis)],
      series: [{}].concat(spec.map((x) => ({ label: x.label, stroke: x.stroke, width: 1.5, spanGaps: true,
        fill: x.fill, dash: x.dash, points: { show: false }, value: (u, v) => (v === null ? "–" : fix(v, 2)) }))),
      legend: { live: true },
      cursor: { points: { size: 5 } },
    };
    box.replaceChildren();
    S.charts[id] = { labels: labels, u: new uPlot(opts, data, box) };
  }
  function drawCharts() {
    const s = S.series;
    if (!s || typeof uPlot === "undefined") return;
    const specs = chartSpecs(s);
    for (const id of Object.keys(specs)) drawChart(id, specs[id], s.t);
  }
  function pushPoint(p) {
    const s = S.series;
    const n = s.t.length;
    s.t.push(p.t); s.rate.push(p.rate); s.hit.push(p.hit); s.engine_hit.push(p.engine_hit); s.inflight.push(p.inflight);
    for (const [field, missing] of [["errors", 0], ["ttft", null], ["queue", null]]) {
      const cols = s[field];
      for (const k of Object.keys(p[field])) if (!cols[k]) cols[k] = new Array(n).fill(missing);
      for (const k of Object.keys(cols)) cols[k].push(k in p[field] ? p[field][k] : missing);
    }
    const cut = s.t.findIndex((t) => t >= p.t - WINDOW_S);
    if (cut > 0) {
      for (const k of ["t", "rate", "hit", "engine_hit", "inflight"]) s[k].splice(0, cut);
      for (const field of ["errors", "ttft", "queue"]) {
        for (const k of Object.keys(s[field])) {
          s[field][k].splice(0, cut);
          if (s[field][k].every((v) => v === null || v === 0)) delete s[field][k];
        }
      }
    }
  }

  // ---- header and config ---------------------------------------------------------------------------------
  function renderStats(p) {
    $("#st-rate").textContent = fix(p.rate, 1);
    $("#st-inflight").textContent = p.inflight;
    const hits = S.series ? S.series.hit.filter((v) => v !== null) : [];
    $("#st-hit").textContent = hits.length ? pct(hits[hits.length - 1]) : "–";
  }
  function pluginLine(p, extra) {
    const params = p.params && Object.keys(p.params).length ? JSON.stringify(p.params, null, 1) : "";
    const head = el("span", { class: "plugin" }, extra || "", p.name, p.type !== p.name ? el("span", { class: "dim" }, " (" + p.type + ")") : null);
    return params ? el("details", {}, el("summary", {}, head), el("pre", {}, params)) : el("div", {}, head);
  }
  async function loadConfig() {
    const r = await getJSON("api/config");
    if (!r.ok) return;
    const c = r.body;
    const parts = [kvlist([["source", c.source], ["running since", new Date(c.started_at * 1000).toLocaleString()],
      ["default config", c.default], ["served-model filter", c.filter_served_models ? "on" : "off"]])];
    parts.push(el("h3", {}, "Model bindings"));
    parts.push(c.bindings.length
      ? el("table", { class: "tbl" }, el("thead", {}, el("tr", {}, el("th", {}, "model"), el("th", {}, "profile"))),
          el("tbody", {}, ...c.bindings.map((b) => el("tr", {}, el("td", { class: "mono" }, b.model), el("td", {}, b.profile)))))
      : el("p", { class: "dim" }, "none: every model uses " + c.default));
    for (const sch of c.schedulers) {
      parts.push(el("h3", {}, "Scheduling config " + sch.name + (sch.handler ? " · handler " + sch.handler.type : "")));
      for (const prof of sch.profiles) {
        parts.push(el("details", { open: sch.profiles.length <= 2 },
          el("summary", {}, "profile ", el("b", {}, prof.name), el("span", { class: "dim" },
            "  " + prof.filters.length + " filters, " + prof.scorers.length + " scorers, " + prof.picker.type)),
          ...prof.filters.map((f) => pluginLine(f, "filter ")),
          ...prof.scorers.map((s) => pluginLine(s, "scorer ×" + s.weight + " ")),
          pluginLine(prof.picker, "picker ")));
      }
    }
    parts.push(el("h3", {}, "Reloads"));
    if (!c.reloads.length) parts.push(el("p", { class: "dim" }, "no hot-reloaded files: loaded at startup"));
    else parts.push(el("table", { class: "tbl" },
      el("thead", {}, el("tr", {}, ...["file", "last reload", "result", "applied", "rejected"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...c.reloads.map((w) => el("tr", { title: w.path },
        el("td", {}, w.what),
        el("td", { class: "mono" }, w.last_at ? new Date(w.last_at * 1000).toLocaleTimeString([], { hour12: false }) : "–"),
        el("td", {}, el("span", { class: "pill " + (w.last_result === "ok" ? "pill-ok" : "pill-bad"), title: w.last_error || "" }, w.last_result)),
        el("td", { class: "num" }, w.reloads), el("td", { class: "num" }, w.failures))))));
    const bad = c.reloads.find((w) => w.last_result !== "ok");
    if (bad) parts.push(el("div", { class: "error-box" }, bad.what + ": " + bad.last_error));
    $("#cfg-note").textContent = "as of " + new Date(c.now * 1000).toLocaleTimeString([], { hour12: false });
    $("#cfg-body").replaceChildren(...parts);
  }

  // ---- live updates --------------------------------------------------------------------------------------
  function setLive(state) {
    const pill = $("#live");
    pill.className = "pill " + (state === "live" ? "pill-ok" : state === "connecting" ? "pill-wait" : "pill-warn");
    pill.textContent = state;
  }
  function connect() {
    const es = new EventSource("api/events?since=" + S.seq);
    S.es = es;
    es.onopen = () => setLive("live");
    es.addEventListener("decisions", (e) => addDecisions(JSON.parse(e.data), true));
    es.addEventListener("outcomes", (e) => updateOutcomes(JSON.parse(e.data)));
    es.addEventListener("tick", (e) => {
      const m = JSON.parse(e.data);
      renderFleet(m.fleet);
      if (S.series && (!S.series.t.length || m.point.t > S.series.t[S.series.t.length - 1])) pushPoint(m.point);
      renderStats(m.point);
      drawCharts();
    });
    es.onerror = () => {
      es.close();
      setLive("reconnecting");
      setTimeout(connect, 2000);
    };
  }

  async function start() {
    $("#explain-form").addEventListener("submit", explain);
    $("#ex-body").addEventListener("input", () => { S.bodyTouched = true; });
    $("#detail-close").addEventListener("click", () => { $("#detail").hidden = true; S.detailSeq = null; });
    document.addEventListener("keydown", (e) => { if (e.key === "Escape") $("#detail").hidden = true; });
    $("#dec-table tbody").addEventListener("click", (e) => {
      const tr = e.target.closest("tr");
      if (tr && tr.dataset.seq) showDecision(Number(tr.dataset.seq));
    });
    window.addEventListener("resize", () => {
      for (const id of Object.keys(S.charts)) {
        const box = document.getElementById(id);
        S.charts[id].u.setSize({ width: Math.max(300, box.clientWidth), height: 190 });
      }
    });
    const [fleet, decisions, series] = await Promise.all([getJSON("api/fleet"), getJSON("api/decisions?since=0"),
                                                          getJSON("api/series")]);
    if (fleet.ok) renderFleet(fleet.body.endpoints);
    if (decisions.ok) {
      addDecisions(decisions.body.decisions.slice(-MAX_ROWS), false);
      S.seq = Math.max(S.seq, decisions.body.seq);
      $("#dec-note").textContent = "newest first · the last " + decisions.body.capacity +
        " are kept with their per-plugin scores · click one";
    }
    if (series.ok) {
      S.series = series.body;
      if (S.series.t.length) renderStats({ rate: S.series.rate[S.series.rate.length - 1],
                                           inflight: S.series.inflight[S.series.inflight.length - 1] });
      drawCharts();
    }
    connect();
    loadConfig();
    setInterval(loadConfig, 10000);
  }

  start();
})();
