/* Pointsman dashboard: per-plugin score tables, a decision's detail, Explain and Config. */
(function () {
  "use strict";

  const { $, el, fix, ms, clock, getJSON } = window.PM;
  let detailSeq = null;

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
    detailSeq = seq;
    const box = $("#detail-body");
    box.replaceChildren(el("p", { class: "dim" }, "loading decision " + seq + "…"));
    $("#detail").hidden = false;
    const r = await getJSON("api/decisions/" + seq);
    if (detailSeq !== seq) return;
    if (!r.ok) { box.replaceChildren(el("div", { class: "error-box" }, r.body.error)); return; }
    const d = r.body;
    const parts = [el("h3", {}, "Decision #" + d.seq + (d.error ? " — rejected" : " → " + d.endpoint)),
      kvlist([["time", clock(d.t)], ["decision id", d.decision_id], ["trace id", d.trace_id],
        ["shadow pick", d.shadow], ["request id", d.id], ["model", d.model + (d.target !== d.model ? " → " + d.target : "")],
        ["config", d.config], ["profile", d.profile + (d.decision ? " (" + d.decision + ")" : "")],
        ["endpoint", d.endpoint], ["prefill", d.prefill], ["fallbacks", d.fallbacks && d.fallbacks.join(", ")],
        ["runner-up", d.runner_up ? d.runner_up + " (margin " + fix(d.margin, 3) + ")" : ""],
        ["session", d.session ? d.session.id + " (" + d.session.source + "), turn " + d.session.turn +
          (d.session.parallel ? " (parallel call)" : "") + ": " + d.session.why : ""],
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

  function pluginLine(p, extra) {
    const params = p.params && Object.keys(p.params).length ? JSON.stringify(p.params, null, 1) : "";
    const head = el("span", { class: "plugin" }, extra || "", p.name, p.type !== p.name ? el("span", { class: "dim" }, " (" + p.type + ")") : null);
    return params ? el("details", {}, el("summary", {}, head), el("pre", {}, params)) : el("div", {}, head);
  }
  async function loadConfig() {
    const r = await getJSON("api/config");
    if (!r.ok) return;
    const c = r.body;
    const scope = $("#scope");
    scope.hidden = !c.scope;
    if (c.scope) { scope.textContent = c.scope.label; scope.title = c.scope.note; }
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
    if (c.budgets && c.budgets.length) {  // LLMKube ModelRouter budgets (status.budgetUtilization)
      parts.push(el("h3", {}, "Budgets"));
      const fmt = (used, max, usd) => max == null ? "–" : (usd ? "$" + used.toFixed(4) + " / $" + max : used + " / " + max);
      parts.push(el("table", { class: "tbl", id: "budgets" },
        el("thead", {}, el("tr", {}, ...["budget", "scope", "tokens", "USD", "window", "used"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...c.budgets.map((b) => el("tr", {},
          el("td", { class: "mono" }, b.name), el("td", {}, b.scope || "–"),
          el("td", { class: "num" }, fmt(b.tokens_used, b.max_tokens, false)),
          el("td", { class: "num" }, fmt(b.usd_used, b.max_usd, true)),
          el("td", { class: "num" }, b.window_s == null ? "–" : b.window_s + " s"),
          el("td", { class: "num" }, el("span", { class: "pill " + (b.utilization >= 1 ? "pill-bad" : "pill-ok") },
            Math.round(100 * b.utilization) + "%")))))));
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

  function closeDetail() { $("#detail").hidden = true; detailSeq = null; }

  window.PMPanels = { showDecision: showDecision, closeDetail: closeDetail, explain: explain, loadConfig: loadConfig,
                      scoreTable: scoreTable, kvlist: kvlist };
})();
