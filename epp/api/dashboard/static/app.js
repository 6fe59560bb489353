/* Pointsman dashboard: fleet, decisions, explain, charts and config, live over server-sent events.
   Every URL is relative to the page, so the page works under any path prefix. Data from requests (model names,
   ids) is only ever inserted as text, never as HTML. Helpers: common.js; charts: charts.js; panels: panels.js. */
(function () {
  "use strict";

  const { $, el, fix, ms, pct, clock, ago, getJSON } = window.PM;
  const Charts = window.PMCharts;
  const Panels = window.PMPanels;
  const MAX_ROWS = 200;
  const S = { seq: 0, rows: new Map(), series: null, fleet: [], es: null, bodyTouched: false };

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
  const TRUST = { exact: "pill-ok", degraded: "pill-warn", approximate: "pill-wait" };
  function trustCell(m) {
    if (!m) return el("td", {}, "–");
    const label = m.trust + (m.belief < 1 ? " ×" + m.belief.toFixed(2) : "");
    const title = [m.trust_reason, m.outside != null ? pct(m.outside) + " of its prompt tokens bypass Pointsman" : ""]
      .filter(Boolean).join("; ");
    return el("td", {}, el("span", { class: "pill " + (TRUST[m.trust] || "pill-wait"), title: title }, label));
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
        trustCell(r.model),
        el("td", { class: "mono small" }, r.model ? r.model.timings : "–"),
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
    const endpoint = d.endpoint ? d.endpoint + (d.prefill ? "  ⇐ " + d.prefill : "") +
      (d.session ? "  · session " + d.session.id.slice(0, 6) + " turn " + d.session.turn + ": " + d.session.why : "") : "–";
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

  // ---- header and config ---------------------------------------------------------------------------------
  function renderStats(p) {
    $("#st-rate").textContent = fix(p.rate, 1);
    $("#st-inflight").textContent = p.inflight;
    const hits = S.series ? S.series.hit.filter((v) => v !== null) : [];
    $("#st-hit").textContent = hits.length ? pct(hits[hits.length - 1]) : "–";
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
      if (S.series && (!S.series.t.length || m.point.t > S.series.t[S.series.t.length - 1])) Charts.push(S.series, m.point);
      renderStats(m.point);
      Charts.draw(S.series);
    });
    es.onerror = () => {
      es.close();
      setLive("reconnecting");
      setTimeout(connect, 2000);
    };
  }

  async function start() {
    $("#explain-form").addEventListener("submit", Panels.explain);
    $("#ex-body").addEventListener("input", () => { S.bodyTouched = true; });
    $("#detail-close").addEventListener("click", Panels.closeDetail);
    document.addEventListener("keydown", (e) => { if (e.key === "Escape") Panels.closeDetail(); });
    $("#dec-table tbody").addEventListener("click", (e) => {
      const tr = e.target.closest("tr");
      if (tr && tr.dataset.seq) Panels.showDecision(Number(tr.dataset.seq));
    });
    window.addEventListener("resize", Charts.resize);
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
      Charts.draw(S.series);
    }
    connect();
    Panels.loadConfig();
    setInterval(Panels.loadConfig, 10000);
  }

  start();
})();
