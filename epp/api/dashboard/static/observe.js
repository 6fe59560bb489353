/* Pointsman dashboard: decision receipts (a past decision by its id) and the shadow profile's report. */
(function () {
  "use strict";

  const { $, el, fix, ms, pct, clock, getJSON } = window.PM;
  const Panels = window.PMPanels;

  // ---- receipts ------------------------------------------------------------------------------------------
  async function lookUp(ev) {
    ev.preventDefault();
    const id = $("#receipt-id").value.trim();
    const box = $("#receipt-result");
    if (!id) { box.replaceChildren(el("div", { class: "error-box" }, "enter a decision id")); return; }
    $("#receipt-go").disabled = true;
    box.replaceChildren(el("p", { class: "dim" }, "looking up " + id + "…"));
    try {
      const r = await getJSON("api/receipts/" + encodeURIComponent(id));
      box.replaceChildren(...(r.ok && r.body.found ? receipt(r.body)
        : [el("div", { class: "error-box" }, r.body.error || "not found")]));
    } finally {
      $("#receipt-go").disabled = false;
    }
  }
  function receipt(d) {
    const outcome = d.error_code ? "rejected: " + d.error_code
      : !d.done ? "in flight"
      : (d.status ? "HTTP " + d.status : "ended") + (d.ttft_seconds ? ", TTFT " + ms(d.ttft_seconds * 1e3) : "")
        + (d.duration_seconds ? ", " + ms(d.duration_seconds * 1e3) + " total" : "");
    const shadow = d.shadow_endpoint ? d.shadow_endpoint + (d.shadow_endpoint === d.endpoint ? " (agrees)" : " (disagrees)") : "";
    const parts = [
      el("h3", { class: "receipt-head" }, "Decision " + d.decision_id + (d.error_code ? " — rejected" : " → " + d.endpoint)),
      Panels.kvlist([["decided", clock(d.decided_at) + " (" + fix(d.age_seconds, 1) + " s ago)"], ["request id", d.request_id],
        ["trace id", d.trace_id], ["model", d.model + (d.target_model && d.target_model !== d.model ? " → " + d.target_model : "")],
        ["pool", d.pool], ["config", d.config], ["profile", d.profile], ["endpoint", d.endpoint],
        ["runner-up", d.runner_up ? d.runner_up + (d.margin !== undefined ? " (margin " + fix(d.margin, 3) + ")" : "") : ""],
        ["candidates", (d.candidates || []).join(", ")], ["shadow pick", shadow], ["outcome", outcome],
        ["tokens", d.prompt_tokens || d.completion_tokens ? d.prompt_tokens + " prompt (" + (d.cached_tokens || 0) + " cached), "
          + d.completion_tokens + " completion" : ""]])];
    for (const run of d.profiles || []) {
      const plugins = (run.plugins || []).map((p) => Object.assign({}, p, { duration_us: (p.duration_seconds || 0) * 1e6 }));
      parts.push(el("div", { class: "runhead" }, "[" + run.profile + "] → " + (run.targets || []).join(", ")),
        Panels.scoreTable({ totals: run.totals, targets: run.targets, candidates: d.candidates, plugins: plugins }));
    }
    return parts;
  }

  // ---- shadow report -------------------------------------------------------------------------------------
  async function loadShadow() {
    const r = await getJSON("api/shadow");
    const box = $("#shadow-body");
    if (!r.ok) { box.replaceChildren(el("div", { class: "error-box" }, r.body.error || "unavailable")); return; }
    const s = r.body;
    if (!s.enabled) {
      $("#shadow-note").textContent = "";
      box.replaceChildren(el("p", { class: "dim" }, "No shadow profile: start with --shadow-config FILE to evaluate " +
        "another scheduling config on the same requests, off the reply path."));
      return;
    }
    $("#shadow-note").textContent = s.source;
    const skipped = Object.entries(s.skipped || {}).map(([k, v]) => k + " " + v).join(", ");
    const errors = Object.entries(s.errors || {}).map(([k, v]) => k + " " + v).join(", ");
    const parts = [Panels.kvlist([
      ["agreement", s.agreement === null ? "–" : pct(s.agreement) + " (" + s.agree + " of " + s.shadowed + ")"],
      ["disagreements", String(s.disagree)], ["skipped", skipped || "none"], ["errors", errors],
      ["budget", fix(s.rate, 0) + "/s, " + pct(s.max_cpu) + " of loop time; " + fix(s.cpu_seconds, 2) + " s spent"],
      ["since", clock(s.since)]])];
    parts.push(el("h3", {}, "Disagreements: predicted vs realised (mean, " + s.disagreements_timed + " ended)"),
      el("table", { class: "tbl", id: "shadow-latency" },
        el("thead", {}, el("tr", {}, el("th", {}, "shadow's pick, predicted"), el("th", {}, "live pick, predicted"),
          el("th", {}, "live pick, realised"), el("th", {}, "all shadowed, realised"))),
        el("tbody", {}, el("tr", {}, el("td", { class: "num" }, ms(s.predicted_shadow_ms)),
          el("td", { class: "num" }, ms(s.predicted_live_ms)), el("td", { class: "num" }, ms(s.realised_live_ms)),
          el("td", { class: "num" }, ms(s.realised_all_ms))))));
    parts.push(el("h3", {}, "Where traffic would move"),
      el("div", { class: "scroll" }, el("table", { class: "tbl", id: "shadow-endpoints" },
        el("thead", {}, el("tr", {}, el("th", {}, "endpoint"), el("th", { class: "num" }, "live picks"),
          el("th", { class: "num" }, "shadow picks"), el("th", { class: "num" }, "change"))),
        el("tbody", {}, ...(s.endpoints || []).map((e) => el("tr", {},
          el("td", { class: "mono" }, e.endpoint), el("td", { class: "num" }, e.live + " (" + pct(e.live_share) + ")"),
          el("td", { class: "num" }, e.shadow + " (" + pct(e.shadow_share) + ")"),
          el("td", { class: "num " + (e.delta > 0 ? "up" : e.delta < 0 ? "down" : "") },
            (e.delta > 0 ? "+" : "") + e.delta)))))));
    if ((s.moves || []).length) {
      parts.push(el("p", { class: "dim small" }, "top moves: " +
        s.moves.slice(0, 6).map((m) => m.from + " → " + m.to + " (" + m.count + ")").join(", ")));
    }
    box.replaceChildren(...parts);
  }

  $("#receipt-form").addEventListener("submit", lookUp);
  loadShadow();
  setInterval(loadShadow, 5000);
})();
