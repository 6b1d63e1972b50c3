// The analysts' page: the views over the query service's own HTTP API (the named reports
// and /v1/sql), with charts drawn as SVG here. No library, no build step: the service
// embeds this file as it is.
"use strict";

const HOUR = 3600e3;
const DAY = 24 * HOUR;
const RAW_DAYS = 7;
const SVG_NS = "http://www.w3.org/2000/svg";
const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
// The limit review's thresholds a link may set (`#…&min_keys=5`); the report's defaults
// otherwise.
const REVIEW_PARAMS = ["percentile", "too_low_share", "too_high_use", "constrained_share", "engaged_use", "min_keys", "headroom"];

const state = {
  token: sessionStorage.getItem("verdict.token") || "",
  loads: 0,
  asked: false,
};

// ------------------------------------------------------------------ DOM helpers

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  setAttrs(e, attrs);
  e.append(...children.flat().filter((c) => c !== null && c !== undefined));
  return e;
}

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  setAttrs(e, attrs);
  e.append(...children.flat().filter((c) => c !== null && c !== undefined));
  return e;
}

function setAttrs(e, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") e.textContent = v;
    else if (k === "onclick") e.addEventListener("click", v);
    else if (k === "dataset") Object.assign(e.dataset, v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
}

const $ = (sel, root = document) => root.querySelector(sel);

// ------------------------------------------------------------------ formats

const num = (v) => (v === null || v === undefined ? "" : Number(v).toLocaleString("en-US"));
const pct = (v) => (v === null || v === undefined ? "" : `${(100 * v).toFixed(v > 0 && v < 0.001 ? 3 : 1)} %`);
const ratio = (v) => (v === null || v === undefined ? "" : Number(v) >= 10 ? Number(v).toFixed(0) : Number(v).toPrecision(2));
const iso = (ms) => new Date(ms).toISOString().replace(".000Z", "Z");
const hourLabel = (ms) => iso(ms).slice(0, 16).replace("T", " ");
// The choice's parameters for the reports that take no key (the review, shadow mode's).
const withoutKey = ({ key: _key, ...rest }) => rest;
const limitName = (r) => `${r.tier ?? `tier ${r.tier_id}`} × ${r.route_class ?? `route ${r.route_class_id}`}`;

// ------------------------------------------------------------------ the API

class Unauthorized extends Error {}

async function api(path, init = {}) {
  const headers = { Accept: "application/json", ...(init.headers || {}) };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  const response = await fetch(path, { ...init, headers });
  const text = await response.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch (_) {
    body = null;
  }
  const message = (body && body.error && body.error.message) || text.slice(0, 300);
  if (response.status === 401) throw new Unauthorized(message);
  if (!response.ok) throw new Error(`${path.split("?")[0]}: ${response.status}: ${message}`);
  return body;
}

async function report(name, params) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) query.set(k, v);
  const body = await api(`/v1/reports/${name}?${query}`);
  return body.rows;
}

async function sql(text) {
  const body = await api("/v1/sql", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ sql: text }),
  });
  return body.rows;
}

// ------------------------------------------------------------------ the choice

// The choice lives in the address's fragment, so a view can be linked to.
function readChoice() {
  const h = new URLSearchParams(location.hash.slice(1));
  return {
    range: h.get("range") || (h.get("from") ? "custom" : "7d"),
    from: h.get("from") || "",
    to: h.get("to") || "",
    tier: h.get("tier") || "",
    route_class: h.get("route_class") || "",
    key: (h.get("key") || "").toLowerCase(),
    by_route: h.get("by_route") === "1",
    review: Object.fromEntries(REVIEW_PARAMS.filter((k) => h.get(k)).map((k) => [k, h.get(k)])),
  };
}

function writeChoice(c) {
  const h = new URLSearchParams();
  h.set("range", c.range);
  if (c.range === "custom") {
    h.set("from", c.from);
    h.set("to", c.to);
  }
  for (const k of ["tier", "route_class", "key"]) if (c[k]) h.set(k, c[k]);
  if (c.by_route) h.set("by_route", "1");
  for (const [k, v] of Object.entries(c.review || {})) h.set(k, v);
  const next = `#${h}`;
  if (location.hash === next) load();
  else location.hash = next;
}

// The time range a choice stands for, in ms. "last 7 days" is the 7 whole days (UTC) before
// today, whose answers the service keeps ready (its warming, once the closed days' parts
// are kept), so the page opens at once; the other presets end at the next whole hour.
function rangeOf(c) {
  if (c.range === "custom") {
    const from = Date.parse(`${c.from}Z`);
    const to = Date.parse(`${c.to}Z`);
    if (!Number.isFinite(from) || !Number.isFinite(to)) throw new Error("a custom range needs both times");
    if (from >= to) throw new Error("the range is empty: from must be before to");
    return { from, to };
  }
  const days = { "24h": 1, "7d": 7, "30d": 30 }[c.range] || 7;
  const to = days === 7 ? Math.floor(Date.now() / DAY) * DAY : Math.floor(Date.now() / HOUR) * HOUR + HOUR;
  return { from: to - days * DAY, to };
}

function showChoice(c) {
  $("#range").value = c.range;
  $("#from").value = c.from;
  $("#to").value = c.to;
  $("#key").value = c.key;
  $("#by_route").checked = c.by_route;
  for (const k of ["tier", "route_class"]) {
    const select = $(`#${k}`);
    if (c[k] && ![...select.options].some((o) => o.value === c[k])) select.append(el("option", { value: c[k], text: c[k] }));
    select.value = c[k];
  }
  document.body.classList.toggle("custom-range", c.range === "custom");
}

function choiceFromForm() {
  return {
    range: $("#range").value,
    from: $("#from").value,
    to: $("#to").value,
    tier: $("#tier").value,
    route_class: $("#route_class").value,
    key: $("#key").value.trim().toLowerCase(),
    by_route: $("#by_route").checked,
    review: readChoice().review,
  };
}

// ------------------------------------------------------------------ tables and CSV

// A table of `rows` with `columns` ([label, value of a row, format]), one click away, and
// the same rows as CSV. The table is built when first opened (a week of hours is
// thousands of rows); `block.showTable()` opens and builds it.
function dataBlock(title, columns, rows) {
  const details = el("details", {}, el("summary", { text: `Data as a table (${rows.length} rows)` }));
  let built = false;
  const build = () => {
    if (built) return;
    built = true;
    details.append(
      el(
        "table",
        {},
        el("caption", { text: title }),
        el("thead", {}, el("tr", {}, columns.map(([label]) => el("th", { scope: "col", text: label })))),
        el("tbody", {}, rows.map((r) => el("tr", {}, columns.map(([, get, fmt]) => el("td", { text: (fmt || String)(get(r) ?? "") }))))),
      ),
    );
  };
  details.addEventListener("toggle", () => details.open && build());
  const csv = () => {
    const cell = (v) => {
      const s = v === null || v === undefined ? "" : String(v);
      return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
    };
    const lines = [columns.map(([label]) => cell(label)).join(",")];
    for (const r of rows) lines.push(columns.map(([, get]) => cell(get(r))).join(","));
    const url = URL.createObjectURL(new Blob([`${lines.join("\n")}\n`], { type: "text/csv" }));
    const a = el("a", { href: url, download: `${title.replace(/[^a-z0-9]+/gi, "-").toLowerCase()}.csv` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  };
  const block = el(
    "div",
    { class: "data-block" },
    details,
    el("button", { type: "button", class: "csv", onclick: csv, text: "Download CSV" }),
  );
  block.showTable = () => {
    details.open = true;
    build();
  };
  return block;
}

// ------------------------------------------------------------------ charts

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function timeTicks(from, to) {
  const steps = [HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 7 * DAY, 14 * DAY, 28 * DAY];
  const step = steps.find((s) => (to - from) / s <= 8) || 28 * DAY;
  const ticks = [];
  for (let t = Math.ceil(from / step) * step; t <= to; t += step) ticks.push(t);
  return { ticks, daily: step >= DAY };
}

// A line chart over time: `series` [{label, colour, dash, points: [[ms, value]]}],
// vertical `marks` [{t, label, hot, data}] (policy versions), on [from, to).
function lineChart({ series, marks = [], from, to, yFormat, yLabel, title }) {
  const W = 920, H = 260, L = 62, R = 16, T = 22, B = 34;
  const max = niceMax(Math.max(0, ...series.flatMap((s) => s.points.map((p) => p[1]))));
  const x = (t) => L + ((t - from) / Math.max(1, to - from)) * (W - L - R);
  const y = (v) => T + (1 - v / max) * (H - T - B);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "line-chart", role: "img", "aria-label": title });
  root.append(svg("title", { text: title }));
  const mantissa = max / 10 ** Math.floor(Math.log10(max));
  const divisions = mantissa === 2.5 || mantissa === 5 ? 5 : 4;
  for (let i = 0; i <= divisions; i++) {
    const v = (max * i) / divisions;
    root.append(
      svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }),
      svg("text", { x: L - 6, y: y(v) + 4, class: "y-tick", text: yFormat(v) }),
    );
  }
  root.append(svg("text", { x: 4, y: 12, class: "axis-label", text: yLabel }));
  const { ticks, daily } = timeTicks(from, to);
  for (const t of ticks) {
    const label = daily ? iso(t).slice(5, 10) : hourLabel(t).slice(5);
    root.append(
      svg("line", { x1: x(t), x2: x(t), y1: H - B, y2: H - B + 4, class: "axis" }),
      svg("text", { x: x(t), y: H - B + 16, class: "x-tick", text: label }),
    );
  }
  root.append(svg("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
  for (const m of marks) {
    root.append(
      svg(
        "g",
        { class: m.hot ? "mark hot" : "mark", dataset: m.data },
        svg("title", { text: m.title }),
        svg("line", { x1: x(m.t), x2: x(m.t), y1: T - 8, y2: H - B }),
        svg("text", { x: x(m.t) + 3, y: T - 10, text: m.label }),
      ),
    );
  }
  series.forEach((s, i) => {
    const colour = s.colour || COLOURS[i % COLOURS.length];
    const pts = s.points.slice().sort((a, b) => a[0] - b[0]);
    // Consecutive hours are joined; a gap of more than an hour breaks the line.
    let d = "";
    pts.forEach(([t, v], j) => {
      const joined = j > 0 && t - pts[j - 1][0] <= HOUR;
      d += `${joined ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
    });
    const g = svg("g", { class: "series", dataset: { label: s.label } });
    g.append(svg("path", { d, stroke: colour, "stroke-dasharray": s.dash ? "5 4" : null, class: "line" }));
    if (pts.length <= 72) {
      for (const [t, v] of pts) {
        g.append(svg("circle", { cx: x(t), cy: y(v), r: 2.6, fill: colour }, svg("title", { text: `${s.label}, ${hourLabel(t)}: ${yFormat(v)}` })));
      }
    }
    root.append(g);
  });
  const legend = el(
    "ul",
    { class: "legend" },
    series.map((s, i) =>
      el("li", {}, el("span", { class: s.dash ? "swatch dashed" : "swatch", dataset: { colour: s.colour || COLOURS[i % COLOURS.length] } }), s.label),
    ),
  );
  for (const sw of legend.querySelectorAll(".swatch")) sw.style.borderColor = sw.dataset.colour;
  return el("figure", {}, root, legend);
}

// A limit's demand distributions on a log scale against its line at 1: per key, the
// busiest hour over the hourly quota, and the busiest span of the bucket's time scale over
// its capacity. Box from p50 to p99, a bar at p90, a whisker to the max.
function demandStrip(r) {
  const W = 560, L = 92, R = 10, ROW = 24;
  const rows = [
    ["hour / quota", [r.demand_p50, r.demand_p90, r.demand_p99, r.demand_max].map(Number)],
    ["burst / bucket", [r.burst_p50, r.burst_p90, r.burst_p99, r.burst_max].map(Number)],
  ];
  const H = 8 + rows.length * ROW + 16;
  const lo = 0.01;
  const hi = Math.max(10, niceMax(Math.max(...rows.flatMap(([, v]) => v).filter(Number.isFinite))));
  const x = (v) => L + (Math.log10(Math.min(hi, Math.max(lo, v)) / lo) / Math.log10(hi / lo)) * (W - L - R);
  const label = ([name, [p50, p90, p99, max]]) => `${name}: p50 ${ratio(p50)}, p90 ${ratio(p90)}, p99 ${ratio(p99)}, max ${ratio(max)}`;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "strip", role: "img", "aria-label": rows.map(label).join("; ") });
  const axisY = 8 + rows.length * ROW;
  for (let d = lo; d <= hi * 1.001; d *= 10) {
    root.append(
      svg("line", { x1: x(d), x2: x(d), y1: axisY, y2: axisY + 4, class: "axis" }),
      svg("text", { x: x(d), y: axisY + 14, class: "x-tick", text: d >= 1 ? `${Math.round(d)}×` : String(Number(d.toPrecision(1))) }),
    );
  }
  rows.forEach(([name, [p50, p90, p99, max]], i) => {
    const top = 8 + i * ROW, mid = top + ROW / 2 - 2;
    root.append(
      svg("text", { x: 0, y: mid + 4, class: "row-label", text: name }),
      svg("line", { x1: x(p99), x2: x(max), y1: mid, y2: mid, class: "whisker" }),
      svg("rect", { x: x(p50), y: mid - 7, width: Math.max(2, x(p99) - x(p50)), height: 14, class: "box" }),
      svg("line", { x1: x(p90), x2: x(p90), y1: mid - 7, y2: mid + 7, class: "p90" }),
      svg("line", { x1: x(max), x2: x(max), y1: mid - 5, y2: mid + 5, class: "whisker" }),
    );
  });
  root.append(
    svg("line", { x1: x(1), x2: x(1), y1: 2, y2: axisY, class: "quota" }),
    svg("text", { x: x(1) + 3, y: 9, class: "quota-label", text: "the limit" }),
  );
  return root;
}

// ------------------------------------------------------------------ the views

function view(id) {
  const section = $(`#${id}`);
  return {
    section,
    note: $(".note", section),
    chart: $(".chart", section),
    data: $(".data", section),
    detail: $(".detail", section),
  };
}

function sourceNote(rows, range) {
  const source = rows.length ? rows[0].source : range.from >= Date.now() - RAW_DAYS * DAY ? "raw" : "rollup";
  return source === "raw"
    ? "From the raw decisions (the range starts within the raw table's 7 days)."
    : "From the hourly rollup (the range starts more than 7 days ago; a policy version is known only for hours with refusals).";
}

// 1. The denial rate per tier (or tier × route class) per hour, policy versions marked.
async function rateView(c, range, params) {
  const v = view("view-rate");
  const rows = await report("denial-rate", params);
  const byRoute = c.by_route;
  const group = (r) => (byRoute ? limitName(r) : r.tier ?? `tier ${r.tier_id}`);
  const sums = new Map();
  const versions = new Map();
  for (const r of rows) {
    const t = Date.parse(r.hour);
    const k = `${group(r)}\u0000${t}`;
    const s = sums.get(k) || { name: group(r), t, requests: 0, denied: 0, would_deny: 0 };
    s.requests += Number(r.requests);
    s.denied += Number(r.denied);
    s.would_deny += Number(r.would_deny);
    sums.set(k, s);
    if (r.policy_version !== null) versions.set(t, Math.max(versions.get(t) || 0, Number(r.policy_version)));
  }
  const names = [...new Set([...sums.values()].map((s) => s.name))].sort();
  const series = [];
  names.forEach((name, i) => {
    const points = [...sums.values()].filter((s) => s.name === name);
    const colour = COLOURS[i % COLOURS.length];
    series.push({ label: `${name}: denied`, colour, points: points.map((s) => [s.t, s.denied / s.requests]) });
    if (points.some((s) => s.would_deny > 0)) {
      series.push({ label: `${name}: would deny (shadow)`, colour, dash: true, points: points.map((s) => [s.t, s.would_deny / s.requests]) });
    }
  });
  // A mark where the newest version seen first rises; the policy-changes report (raw
  // decisions only) says which limits' rates jumped with it.
  let jumps = [];
  if (rows.length && rows[0].source === "raw") {
    jumps = (await report("policy-changes", withoutKey(params))).filter((j) => j.jumped);
  }
  const marks = [];
  let seen = null;
  for (const t of [...versions.keys()].sort((a, b) => a - b)) {
    const version = versions.get(t);
    if (seen !== null && version > seen) {
      const hot = jumps.filter((j) => Number(j.version) === version).map(limitName);
      marks.push({
        t,
        label: `v${version}${hot.length ? " ⚠" : ""}`,
        hot: hot.length > 0,
        title: `policy version ${version} from ${hourLabel(t)} UTC${hot.length ? `; the denial rate jumped for ${hot.join(", ")}` : ""}`,
        data: { version: String(version), hour: iso(t), jumped: hot.join("; ") },
      });
    }
    seen = Math.max(seen ?? 0, version);
  }
  v.note.textContent = `${sourceNote(rows, range)} ${marks.length ? `Policy changes: ${marks.map((m) => m.title).join("; ")}.` : "No policy change in the range."}`;
  v.chart.replaceChildren(
    rows.length
      ? lineChart({ series, marks, from: range.from, to: range.to, yFormat: pct, yLabel: "refused / requests", title: "Denial rate per hour" })
      : el("p", { class: "empty", text: "No decisions in this range." }),
  );
  v.data.replaceChildren(
    dataBlock("denial rate per hour", [
      ["hour (UTC)", (r) => r.hour],
      ["tier", (r) => r.tier],
      ["route class", (r) => r.route_class],
      ["mode", (r) => r.mode],
      ["requests", (r) => r.requests, num],
      ["denied", (r) => r.denied, num],
      ["would deny", (r) => r.would_deny, num],
      ["denial rate", (r) => r.denial_rate, pct],
      ["would-deny rate", (r) => r.would_deny_rate, pct],
      ["policy version", (r) => r.policy_version],
      ["source", (r) => r.source],
    ], rows),
  );
  return rows;
}

// 2. The limit review.
async function reviewView(c, range, params) {
  const v = view("view-review");
  const p = withoutKey(params);
  const rows = await report("wrong-limits", { ...p, ...c.review });
  const set = Object.entries(c.review);
  v.note.textContent = `Each limit's per-key peak demand against the limit (the line at 1): its busiest hour over the hourly quota, and its busiest burst over the bucket; coloured by the verdict. Click a limit for its top keys and outliers. Thresholds: ${set.length ? set.map(([k, x]) => `${k} ${x}`).join(", ") : "the report's defaults"} (set them in the address, as #…&min_keys=5).`;
  const list = $(".limits", v.section);
  list.replaceChildren(
    ...rows.map((r) => {
      const name = `${limitName(r)}${r.override_key ? ` (override ${r.override_key})` : ""}`;
      const changed = r.verdict === "too low" || r.verdict === "too high";
      const rec = changed
        ? `Recommended: quota ${num(r.hourly_quota)} → ${num(r.recommended_quota)}/h; bucket ${num(r.capacity)} → ${num(r.recommended_capacity)} (refill ${ratio(r.refill_per_s)} → ${ratio(r.recommended_refill_per_s)}/s).`
        : `Keep: quota ${num(r.hourly_quota)}/h, bucket ${num(r.capacity)} (refill ${ratio(r.refill_per_s)}/s).`;
      const open = async () => {
        v.detail.replaceChildren(el("p", { text: `Loading the top keys of ${name}…` }));
        try {
          const q = { ...p, tier: r.tier, route_class: r.route_class };
          const keys = (await report("limit-outliers", q)).filter((k) => (k.override_key || "") === (r.override_key || ""));
          v.detail.replaceChildren(
            el("h3", { text: `Top keys of ${name}` }),
            keys.length
              ? dataBlock(`top keys of ${name}`, [
                  ["key", (k) => k.key_id],
                  ["requests", (k) => k.requests, num],
                  ["denied", (k) => k.denied, num],
                  ["would deny", (k) => k.would_deny, num],
                  ["share of the limit's refusals", (k) => k.share_of_refusals, pct],
                  ["demand", (k) => k.demand, ratio],
                  ["burst", (k) => k.burst, ratio],
                  ["busiest hour", (k) => k.peak_hour, num],
                ], keys)
              : el("p", { text: "No key of this limit was refused in the range." }),
          );
          const block = $(".data-block", v.detail);
          if (block) block.showTable();
        } catch (e) {
          showError(v.detail, e);
        }
      };
      return el(
        "li",
        {
          class: `limit verdict-${String(r.verdict).replace(/ /g, "-")}`,
          dataset: { tier: r.tier ?? "", routeClass: r.route_class ?? "", tierId: String(r.tier_id), routeClassId: String(r.route_class_id), verdict: r.verdict, override: r.override_key || "" },
        },
        el(
          "button",
          { type: "button", class: "limit-head", onclick: open, "aria-label": `${name}: ${r.verdict}; show its top keys` },
          el("span", { class: "limit-name", text: name }),
          el("span", { class: "badge", text: r.verdict }),
          el("span", { class: "mode", text: r.mode }),
        ),
        demandStrip(r),
        el("p", { class: "reason", text: r.reason }),
        el("p", { class: "recommendation", text: rec }),
        el("p", {
          class: "facts",
          text: `${num(r.keys)} active keys, ${num(r.constrained_keys)} constrained; refusal rate ${pct(r.refusal_rate)}; hourly demand p50 ${ratio(r.demand_p50)} · p90 ${ratio(r.demand_p90)} · p99 ${ratio(r.demand_p99)} · max ${ratio(r.demand_max)} of the quota; burst p50 ${ratio(r.burst_p50)} · p90 ${ratio(r.burst_p90)} · p99 ${ratio(r.burst_p99)} · max ${ratio(r.burst_max)} of the bucket.`,
        }),
      );
    }),
  );
  if (!rows.length) list.replaceChildren(el("li", { class: "empty", text: "No decisions in this range (the review reads the raw table's 7 days)." }));
  else proveRecommendations(list, { ...p, ...c.review });
  v.detail.replaceChildren();
  v.data.replaceChildren(
    dataBlock("limit review", [
      ["tier", (r) => r.tier],
      ["route class", (r) => r.route_class],
      ["override key", (r) => r.override_key],
      ["mode", (r) => r.mode],
      ["verdict", (r) => r.verdict],
      ["reason", (r) => r.reason],
      ["hourly quota", (r) => r.hourly_quota],
      ["demand p50", (r) => r.demand_p50, ratio],
      ["demand p90", (r) => r.demand_p90, ratio],
      ["demand p99", (r) => r.demand_p99, ratio],
      ["demand max", (r) => r.demand_max, ratio],
      ["burst p50", (r) => r.burst_p50, ratio],
      ["burst p90", (r) => r.burst_p90, ratio],
      ["burst p99", (r) => r.burst_p99, ratio],
      ["burst max", (r) => r.burst_max, ratio],
      ["keys", (r) => r.keys],
      ["keys sampled (percentiles)", (r) => r.sampled_keys],
      ["constrained keys", (r) => r.constrained_keys],
      ["refusal rate", (r) => r.refusal_rate, pct],
      ["recommended quota", (r) => r.recommended_quota],
      ["recommended capacity", (r) => r.recommended_capacity],
      ["recommended refill per s", (r) => r.recommended_refill_per_s],
    ], rows),
  );
}

// Each recommendation proven: the service replays the range under every candidate it tries
// and answers the roundest that meets the review's target, with what it refused. The
// limits the review judged too low or too high say so beside their recommendation.
async function proveRecommendations(list, params) {
  const judged = [...list.querySelectorAll("li.limit.verdict-too-low, li.limit.verdict-too-high")];
  if (!judged.length) return;
  for (const li of judged) {
    li.dataset.proven = "pending";
    $(".recommendation", li).textContent += " Replaying the range under it…";
  }
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) query.set(k, v);
  query.set("keys", "0");
  let answer;
  try {
    answer = await api(`/v1/recommendations?${query}`);
  } catch (e) {
    for (const li of judged) {
      li.dataset.proven = "failed";
      $(".recommendation", li).textContent = `The recommendation could not be replayed: ${e.message}`;
    }
    return;
  }
  const same = (li, r) =>
    String(r.tier_id) === li.dataset.tierId &&
    String(r.route_class_id) === li.dataset.routeClassId &&
    (r.override_key || "") === li.dataset.override;
  for (const li of judged) {
    const r = answer.proven.find((x) => same(li, x));
    if (!r) {
      li.dataset.proven = "missing";
      $(".recommendation", li).textContent = "The replay did not judge this limit (the range changed since the review); show it again.";
      continue;
    }
    const refused = (x) => (x ? `${pct(x.share_of_requests)} of requests and ${pct(x.share_of_keys)} of keys refused` : "not replayed");
    const what = `quota ${num(r.hourly_quota)} → ${num(r.recommended_quota)}/h; bucket ${num(r.capacity)} → ${num(r.recommended_capacity)} (refill ${ratio(r.refill_per_s)} → ${ratio(r.recommended_refill_per_s)}/s)`;
    const sample = r.sample_rate < 1 ? ` (a sample of ${pct(r.sample_rate)} of its ${num(r.keys)} keys, chosen by key)` : "";
    li.dataset.proven = r.met ? "met" : "unmet";
    $(".recommendation", li).textContent = r.met
      ? `Recommended, proven by replaying the range${sample}: ${what}. Replayed: ${refused(r.recommended)}; under the limit in force: ${refused(r.in_force)}.`
      : `No round value within the search's reach met the target; keep the limit in force (replayed${sample}: ${refused(r.in_force)}).`;
  }
  if (answer.commands && answer.commands.length) {
    list.after(el("div", { class: "commands" },
      el("p", { text: "To apply the proven recommendations to the PostgreSQL policy:" }),
      el("pre", { text: answer.commands.join("\n") })));
  }
}

// 3. Shadow mode: per shadow limit, the would-deny rate over time and the keys refused.
async function shadowView(c, range, params, rateRows) {
  const v = view("view-shadow");
  const p = withoutKey(params);
  const rows = await report("shadow-impact", p);
  // The keys a shadow limit would have refused, from the rollup's refused keys.
  const keysOf = async (r) => {
    v.detail.replaceChildren(el("p", { text: `Loading the keys ${limitName(r)} would refuse…` }));
    try {
      const keys = (await report("top-denied", { ...p, tier: r.tier, route_class: r.route_class, limit: "1000" })).filter((k) => Number(k.would_deny) > 0);
      v.detail.replaceChildren(
        el("h3", { text: `Keys ${limitName(r)} would refuse` }),
        keys.length
          ? dataBlock(`keys ${limitName(r)} would refuse`, [
              ["key", (k) => k.key_id],
              ["would deny", (k) => k.would_deny, num],
              ["allowed", (k) => k.allowed, num],
              ["hours", (k) => k.hours, num],
              ["quota", (k) => k.override_quota ?? k.tier_quota, num],
              ["first", (k) => k.first_denial],
              ["last", (k) => k.last_denial],
            ], keys)
          : el("p", { text: "No key would have been refused in this range." }),
      );
      const block = $(".data-block", v.detail);
      if (block) block.showTable();
    } catch (e) {
      showError(v.detail, e);
    }
  };
  v.detail.replaceChildren();
  $(".shadow-limits", v.section).replaceChildren(
    ...rows.map((r) =>
      el(
        "li",
        { dataset: { tier: r.tier, routeClass: r.route_class, wouldDenyRate: String(r.would_deny_rate), keysWouldDeny: String(r.keys_would_deny) } },
        el("strong", { text: limitName(r) }),
        `: enforcing would refuse ${pct(r.would_deny_rate)} of its requests (${num(r.would_deny)} of ${num(r.requests)}), `,
        `${num(r.keys_would_deny)} of ${num(r.keys)} keys at least once; ${num(r.would_deny_by_bucket)} by the bucket, ${num(r.would_deny_by_window)} by the hourly window. `,
        Number(r.keys_would_deny) > 0 ? el("button", { type: "button", class: "shadow-keys", onclick: () => keysOf(r), text: "Show the keys" }) : null,
      ),
    ),
  );
  const shadow = rateRows.filter((r) => r.mode === "shadow");
  const names = [...new Set(shadow.map(limitName))].sort();
  v.note.textContent = rows.length
    ? "Limits in shadow mode decide but do not refuse; this is the evidence for switching them to enforce."
    : "No limit in shadow mode had decisions in this range.";
  v.chart.replaceChildren(
    shadow.length
      ? lineChart({
          series: names.map((name) => ({ label: `${name}: would deny`, dash: true, points: shadow.filter((r) => limitName(r) === name).map((r) => [Date.parse(r.hour), Number(r.would_deny_rate)]) })),
          from: range.from,
          to: range.to,
          yFormat: pct,
          yLabel: "would deny / requests",
          title: "Would-deny rate of the shadow limits per hour",
        })
      : "",
  );
  v.data.replaceChildren(
    dataBlock("shadow impact", [
      ["tier", (r) => r.tier],
      ["route class", (r) => r.route_class],
      ["hourly quota", (r) => r.hourly_quota],
      ["requests", (r) => r.requests, num],
      ["would deny", (r) => r.would_deny, num],
      ["would-deny rate", (r) => r.would_deny_rate, pct],
      ["by bucket", (r) => r.would_deny_by_bucket, num],
      ["by window", (r) => r.would_deny_by_window, num],
      ["keys", (r) => r.keys, num],
      ["keys that would be refused", (r) => r.keys_would_deny, num],
    ], rows),
  );
}

// 4. Degraded decisions per region per hour.
async function degradedView(c, range, params) {
  const v = view("view-degraded");
  const rows = await report("degraded", { from: params.from, to: params.to });
  const regions = [...new Set(rows.map((r) => r.region))].sort((a, b) => a - b);
  const series = [];
  regions.forEach((region, i) => {
    const mine = rows.filter((r) => r.region === region);
    const at = (r) => Date.UTC(...r.date.split("-").map((x, j) => Number(x) - (j === 1 ? 1 : 0)), Number(r.hour));
    const colour = COLOURS[i % COLOURS.length];
    if (mine.some((r) => Number(r.local_fallback) > 0)) series.push({ label: `region ${region}: local fallback`, colour, points: mine.map((r) => [at(r), Number(r.local_fallback)]) });
    if (mine.some((r) => Number(r.kill_switch) > 0)) series.push({ label: `region ${region}: kill switch`, colour, dash: true, points: mine.map((r) => [at(r), Number(r.kill_switch)]) });
  });
  v.chart.replaceChildren(
    rows.length
      ? lineChart({ series, from: range.from, to: range.to, yFormat: (x) => num(Math.round(x)), yLabel: "decisions per hour", title: "Degraded decisions per region per hour" })
      : el("p", { class: "empty", text: "Every decision in this range was made on the shared counters." }),
  );
  v.data.replaceChildren(
    dataBlock("degraded decisions", [
      ["date", (r) => r.date],
      ["hour", (r) => r.hour],
      ["region", (r) => r.region],
      ["decisions", (r) => r.decisions, num],
      ["local fallback", (r) => r.local_fallback, num],
      ["kill switch", (r) => r.kill_switch, num],
      ["degraded share", (r) => r.degraded_share, pct],
    ], rows),
  );
}

// 5. The top denied keys; a key opens its hourly history.
async function keysView(c, range, params) {
  const v = view("view-keys");
  const rows = await report("top-denied", { ...params, limit: "20" });
  const history = async (r) => {
    v.detail.replaceChildren(el("p", { text: `Loading the history of ${r.key_id}…` }));
    try {
      const h = await report("denial-rate", { from: params.from, to: params.to, key: r.key_id });
      const names = [...new Set(h.map(limitName))].sort();
      const series = names.flatMap((name, i) => {
        const mine = h.filter((x) => limitName(x) === name);
        return [
          { label: `${name}: requests`, colour: COLOURS[i % COLOURS.length], points: mine.map((x) => [Date.parse(x.hour), Number(x.requests)]) },
          { label: `${name}: refused`, colour: COLOURS[(i + 1) % COLOURS.length], dash: true, points: mine.map((x) => [Date.parse(x.hour), Number(x.denied) + Number(x.would_deny)]) },
        ];
      });
      v.detail.replaceChildren(
        el("h3", { class: "key-history", dataset: { key: r.key_id }, text: `Key ${r.key_id}: hourly history` }),
        el("p", { class: "note", text: `${sourceNote(h, range)} Quota ${num(r.override_quota ?? r.tier_quota)}/h${r.override_quota !== null ? " (override)" : ""}.` }),
        h.length ? lineChart({ series, from: range.from, to: range.to, yFormat: (x) => num(Math.round(x)), yLabel: "requests per hour", title: `Hourly history of key ${r.key_id}` }) : "",
        dataBlock(`history of key ${r.key_id}`, [
          ["hour (UTC)", (x) => x.hour],
          ["tier", (x) => x.tier],
          ["route class", (x) => x.route_class],
          ["requests", (x) => x.requests, num],
          ["denied", (x) => x.denied, num],
          ["would deny", (x) => x.would_deny, num],
          ["hourly quota", (x) => x.hourly_quota, num],
          ["policy version", (x) => x.policy_version],
        ], h),
      );
    } catch (e) {
      showError(v.detail, e);
    }
  };
  const table = el(
    "table",
    { class: "keys" },
    el("caption", { text: "Keys with the most refusals (denied and would deny)" }),
    el("thead", {}, el("tr", {}, ["key", "tier", "route class", "denied", "would deny", "allowed", "hours", "quota", "override quota"].map((h) => el("th", { scope: "col", text: h })))),
    el(
      "tbody",
      {},
      rows.map((r) =>
        el(
          "tr",
          { dataset: { key: r.key_id } },
          el("td", {}, el("button", { type: "button", class: "key", onclick: () => history(r), text: r.key_id })),
          [r.tier, r.route_class, num(r.denied), num(r.would_deny), num(r.allowed), num(r.hours), num(r.tier_quota), num(r.override_quota)].map((t) => el("td", { text: t ?? "" })),
        ),
      ),
    ),
  );
  v.data.replaceChildren(
    rows.length ? table : el("p", { class: "empty", text: "No key was refused in this range." }),
    dataBlock("top denied keys", [
      ["key", (r) => r.key_id],
      ["tier", (r) => r.tier],
      ["route class", (r) => r.route_class],
      ["denied", (r) => r.denied],
      ["would deny", (r) => r.would_deny],
      ["allowed", (r) => r.allowed],
      ["hours", (r) => r.hours],
      ["first denial", (r) => r.first_denial],
      ["last denial", (r) => r.last_denial],
      ["tier quota", (r) => r.tier_quota],
      ["override quota", (r) => r.override_quota],
      ["override capacity", (r) => r.override_capacity],
    ], rows),
  );
  v.detail.replaceChildren();
  if (params.key && rows.length) await history(rows[0]);
}

function showError(target, e) {
  target.replaceChildren(el("p", { class: "error", role: "alert", text: e.message }));
}

// ------------------------------------------------------------------ loading

async function fillNames() {
  const rows = await sql("SELECT DISTINCT tier, route_class FROM policies WHERE kind = 'limit' ORDER BY tier, route_class");
  for (const k of ["tier", "route_class"]) {
    const select = $(`#${k}`);
    const current = select.value;
    const names = [...new Set(rows.map((r) => r[k]))].filter((n) => n !== "*");
    select.replaceChildren(el("option", { value: "", text: "all" }), ...names.map((n) => el("option", { value: n, text: n })));
    select.value = names.includes(current) ? current : "";
  }
}

async function load() {
  const c = readChoice();
  showChoice(c);
  state.loads += 1;
  const started = performance.now();
  const body = document.body;
  body.dataset.loads = String(state.loads);
  body.dataset.state = "loading";
  const status = $("#status");
  let range;
  try {
    range = rangeOf(c);
  } catch (e) {
    status.textContent = e.message;
    body.dataset.state = "error";
    return;
  }
  const params = { from: iso(range.from), to: iso(range.to), tier: c.tier, route_class: c.route_class, key: c.key };
  status.textContent = `Loading ${hourLabel(range.from)} to ${hourLabel(range.to)} UTC…`;
  const sections = ["view-rate", "view-review", "view-shadow", "view-degraded", "view-keys"].map((id) => view(id));
  for (const s of sections) s.section.dataset.state = "loading";
  const run = async (v, f) => {
    try {
      const out = await f();
      v.section.dataset.state = "ready";
      v.section.dataset.ms = String(Math.round(performance.now() - started));
      return out;
    } catch (e) {
      if (e instanceof Unauthorized) throw e;
      v.section.dataset.state = "error";
      showError(v.chart || v.data, e);
      return [];
    }
  };
  try {
    if (!state.namesLoaded) {
      await fillNames();
      state.namesLoaded = true;
      showChoice(c);
    }
    const [v1, v2, v3, v4, v5] = sections;
    const rates = run(v1, () => rateView(c, range, params));
    await Promise.all([
      rates,
      run(v2, () => reviewView(c, range, params)),
      rates.then((rows) => run(v3, () => shadowView(c, range, params, rows))),
      run(v4, () => degradedView(c, range, params)),
      run(v5, () => keysView(c, range, params)),
    ]);
  } catch (e) {
    if (e instanceof Unauthorized) {
      for (const s of sections) s.section.dataset.state = "idle";
      body.dataset.state = "unauthorized";
      status.textContent = "Waiting for a token.";
      askToken(e.message);
      return;
    }
    throw e;
  }
  const ms = Math.round(performance.now() - started);
  body.dataset.loadMs = String(ms);
  // Since the page was asked for: its files, the policy's names and every view.
  body.dataset.readyAt = String(Math.round(performance.now()));
  body.dataset.state = sections.some((s) => s.section.dataset.state === "error") ? "error" : "ready";
  status.textContent = `${hourLabel(range.from)} to ${hourLabel(range.to)} UTC${c.tier ? `, tier ${c.tier}` : ""}${c.route_class ? `, route class ${c.route_class}` : ""}${c.key ? `, key ${c.key}` : ""}: loaded in ${ms} ms.`;
}

function askToken(serverMessage) {
  const dialog = $("#token-dialog");
  $("#token-message").textContent = state.token
    ? `The service refused this token (401: ${serverMessage}). Check it and enter it again.`
    : "Enter a token the service accepts (`verdict query serve --tokens-file` holds them).";
  $("#token").value = "";
  if (!dialog.open) dialog.showModal();
}

function start() {
  $("#choice").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const c = choiceFromForm();
    if (c.key && !/^[0-9a-f]{32}$/.test(c.key)) {
      $("#status").textContent = "A key is 32 hex digits.";
      return;
    }
    if (c.range === "custom" && (!c.from || !c.to)) {
      const r = rangeOf({ ...c, range: "7d" });
      c.from = c.from || iso(r.from).slice(0, 16);
      c.to = c.to || iso(r.to).slice(0, 16);
    }
    writeChoice(c);
  });
  $("#range").addEventListener("change", () => document.body.classList.toggle("custom-range", $("#range").value === "custom"));
  $("#token-form").addEventListener("submit", () => {
    state.token = $("#token").value.trim();
    sessionStorage.setItem("verdict.token", state.token);
    load();
  });
  window.addEventListener("hashchange", load);
  load();
}

document.addEventListener("DOMContentLoaded", start);
