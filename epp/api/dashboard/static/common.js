/* Pointsman dashboard: shared helpers (window.PM). Data from requests is only ever inserted as text. */
(function () {
  "use strict";

  const PALETTE = ["#4fb3ff", "#3ecf8e", "#f2b84b", "#f06a6a", "#b48cff", "#4de0d0", "#ff8fc7", "#a0d468",
                   "#ffa86b", "#7f9cff", "#e6e17a", "#c08f6a"];
  const colors = new Map();
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
    if (!colors.has(key)) colors.set(key, PALETTE[colors.size % PALETTE.length]);
    return colors.get(key);
  }
  async function getJSON(url, opts) {
    const r = await fetch(url, Object.assign({ credentials: "same-origin", cache: "no-store" }, opts || {}));
    let body = null;
    try { body = await r.json(); } catch (e) { body = { error: "HTTP " + r.status }; }
    if (r.status === 401) { location.reload(); }
    return { ok: r.ok, status: r.status, body: body };
  }

  window.PM = { $: $, el: el, fix: fix, ms: ms, pct: pct, clock: clock, ago: ago, color: color, getJSON: getJSON };
})();
