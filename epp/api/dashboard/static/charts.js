/* Pointsman dashboard: the 15-minute charts (uPlot), fed by api/series and one point per live tick. */
(function () {
  "use strict";

  const { fix, color } = window.PM;
  const WINDOW_S = 900;
  const charts = {};

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
    const old = charts[id];
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
    charts[id] = { labels: labels, u: new uPlot(opts, data, box) };
  }
  function drawCharts(s) {
    if (!s || typeof uPlot === "undefined") return;
    const specs = chartSpecs(s);
    for (const id of Object.keys(specs)) drawChart(id, specs[id], s.t);
  }
  function pushPoint(s, p) {
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

  function resize() {
    for (const id of Object.keys(charts)) {
      const box = document.getElementById(id);
      charts[id].u.setSize({ width: Math.max(300, box.clientWidth), height: 190 });
    }
  }

  window.PMCharts = { draw: drawCharts, push: pushPoint, resize: resize };
})();
