// agentrt dashboard: renders the snapshots of api/events (see app.py for their fields).
// No framework, no build step; charts through uPlot (vendored). The DOM carries a few counters
// the browser test reads: body[data-updates], .chart[data-points], #timeline[data-turns].
"use strict";

const $ = (sel) => document.querySelector(sel);
const SVG = "http://www.w3.org/2000/svg";
const state = { history: [], charts: {}, updates: 0 };
window.agentrtDashboard = state; // (read by the browser test)

function el(tag, attrs = {}, text = "") {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== "") e.textContent = text;
  return e;
}

const fmt = (x, d = 0) => (x == null ? "–" : Number(x).toLocaleString(undefined, { maximumFractionDigits: d }));
const pct = (x) => (x == null ? "–" : (100 * x).toFixed(1) + "%");

// ---- cards ---------------------------------------------------------------------------------
function renderCards(s) {
  const st = s.stats;
  const cards = [
    ["waiting / running", `${st.waiting} / ${st.running}`],
    ["KV occupancy", pct(st.kv_occupancy)],
    ["prefix hit rate", pct(st.hit_rate)],
    ["sessions", fmt(st.sessions)],
    ["tier pages", fmt(st.tier_pages)],
    ["evicted / promoted pages", `${fmt(st.evicted_pages)} / ${fmt(st.promoted_pages)}`],
    ["preemptions", fmt(st.preemptions)],
    ["decoded tokens", fmt(st.decode_tokens)],
    ["scheduling", st.scheduling_policy || "–"],
  ];
  $("#cards").replaceChildren(...cards.map(([k, v]) => {
    const c = el("div", { class: "card" });
    c.append(el("div", { class: "v" }, v), el("div", { class: "k" }, k));
    return c;
  }));
}

// ---- charts (uPlot) --------------------------------------------------------------------------
const CHARTS = {
  kv: { el: "#chart-kv", series: [
    ["held (not evictable)", "#3d7be0", (p) => p.pages_used],
    ["evictable (cache, idle tails)", "#2fa36b", (p) => p.pages_cached],
    ["free", "#c3c9d4", (p) => p.pages_free],
    ["tier", "#e5b02e", (p) => p.tier_pages],
  ] },
  queue: { el: "#chart-queue", series: [
    ["hit rate %", "#2fa36b", (p) => 100 * p.hit_rate, "pct"],
    ["waiting", "#d64545", (p) => p.waiting],
    ["running", "#3d7be0", (p) => p.running],
  ] },
};

function chartData(spec) {
  const h = state.history;
  return [h.map((p) => p.t), ...spec.series.map(([, , get]) => h.map(get))];
}

function makeChart(spec) {
  const box = $(spec.el);
  const series = [{ label: "s" }, ...spec.series.map(([label, stroke, , scale]) =>
    ({ label, stroke, width: 2, scale: scale || "y" }))];
  const axes = [{ label: "seconds" }, { scale: "y" }];
  const scales = { x: { time: false } };
  if (spec.series.some((x) => x[3] === "pct")) {
    axes.push({ scale: "pct", side: 1, grid: { show: false } });
    scales.pct = { range: [0, 100] };
  }
  const opts = { width: Math.max(300, box.clientWidth), height: 220, series, axes, scales, legend: { live: false } };
  return new uPlot(opts, chartData(spec), box);
}

function renderCharts() {
  for (const [name, spec] of Object.entries(CHARTS)) {
    if (!state.charts[name]) state.charts[name] = makeChart(spec);
    else state.charts[name].setData(chartData(spec));
    $(spec.el).dataset.points = String(state.history.length);
  }
}

window.addEventListener("resize", () => {
  for (const [name, spec] of Object.entries(CHARTS)) {
    const c = state.charts[name];
    if (c) c.setSize({ width: Math.max(300, $(spec.el).clientWidth), height: 220 });
  }
});

// ---- agents and sessions -------------------------------------------------------------------
function agentRows(s) {
  const bySid = new Map(s.sessions.map((x) => [x.session, x]));
  const rows = s.agents.map((a) => ({ name: a.name, agent: a, session: bySid.get(a.session) }));
  const shown = new Set(rows.map((r) => r.session && r.session.session));
  for (const x of s.sessions) {
    if (!shown.has(x.session)) rows.push({ name: x.agent || `session ${x.session}`, agent: null, session: x });
  }
  return rows;
}

function stateOf(r) {
  const a = r.agent, x = r.session;
  if (a && a.stopped) return ["stopped", "stopped"];
  if ((a && a.busy) || (x && x.busy)) return ["busy", "busy"];
  if (a && a.session == null && a.tokens > 0) return ["passivated", "passive"];
  return ["idle", "idle"];
}

function pageBar(x, scale) {
  const bar = el("div", { class: "bar", title: `${x.resident_pages} resident, ${x.demoted_pages} demoted, ${x.dropped_pages} dropped` });
  for (const [cls, n] of [["res", x.resident_pages], ["dem", x.demoted_pages], ["drop", x.dropped_pages]]) {
    bar.append(el("span", { class: cls, style: `width:${(100 * n) / scale}%` }));
  }
  return bar;
}

function renderAgents(s) {
  const rows = agentRows(s);
  const scale = Math.max(1, ...s.sessions.map((x) => x.resident_pages + x.demoted_pages + x.dropped_pages));
  const body = $("#agents tbody");
  if (!rows.length) {
    body.replaceChildren(el("tr", {}, ""));
    body.firstChild.append(el("td", { colspan: "8", class: "empty" }, "no agents or sessions yet"));
    return;
  }
  body.replaceChildren(...rows.map((r) => {
    const x = r.session, [label, cls] = stateOf(r), tree = s.tree[r.name] || [0, 0];
    const tr = el("tr", { "data-agent": r.name });
    const st = el("td"); st.append(el("span", { class: `pill ${cls}` }, label));
    const bar = el("td"); if (x) bar.append(pageBar(x, scale));
    tr.append(el("td", {}, r.name), st, el("td", {}, r.agent ? fmt(r.agent.queued) : "–"),
      el("td", {}, x ? String(x.session) : "–"), el("td", {}, fmt(x ? x.tokens : r.agent && r.agent.tokens)), bar,
      el("td", {}, x && x.pinned_s > 0 ? `${x.pinned_s.toFixed(1)} s` : "–"), el("td", {}, `${tree[0]} / ${tree[1]}`));
    return tr;
  }));
}

// ---- per-turn timeline -----------------------------------------------------------------------
function renderTimeline(s) {
  const box = $("#timeline"), turns = s.turns;
  box.dataset.turns = String(turns.length);
  if (!turns.length) { box.replaceChildren(el("p", { class: "muted" }, "no finished turns yet")); return; }
  const t0 = Math.min(...turns.map((t) => t.start)), t1 = Math.max(...turns.map((t) => t.end));
  const W = Math.max(400, box.clientWidth), L = 150, R = 60, H = 16, span = Math.max(1e-3, t1 - t0);
  const x = (t) => L + ((t - t0) / span) * (W - L - R);
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${turns.length * H + 20}`, height: turns.length * H + 20 });
  turns.forEach((t, i) => {
    const y = i * H;
    svg.append(el("svg:text", { x: 4, y: y + 12 }, t.agent));
    for (const [kind, a, b] of t.segments) {
      const r = el("svg:rect", { x: x(a), y: y + 2, width: Math.max(1, x(b) - x(a)), height: H - 4, class: `seg ${kind}`,
        fill: getComputedStyle(document.body).getPropertyValue(`--${kind}`) });
      r.append(el("svg:title", {}, `${t.agent}: ${kind} ${((b - a) * 1000).toFixed(1)} ms`));
      svg.append(r);
    }
    svg.append(el("svg:text", { x: x(t.end) + 4, y: y + 12, fill: "#6b7384" }, `${((t.end - t.start) * 1000).toFixed(0)} ms`));
  });
  svg.append(el("svg:text", { x: L, y: turns.length * H + 15, fill: "#6b7384" }, `${span.toFixed(2)} s shown`));
  box.replaceChildren(svg);
}

// ---- workflow DAGs ---------------------------------------------------------------------------
function layers(stages, edges) {
  const depth = Object.fromEntries(stages.map((s) => [s, 0]));
  for (let i = 0; i < stages.length; i++) for (const [a, b] of edges) depth[b] = Math.max(depth[b], depth[a] + 1);
  return depth;
}

function renderWorkflow(wf) {
  const depth = layers(wf.stages, wf.edges), rows = {}, pos = {};
  for (const s of wf.stages) { const d = depth[s]; rows[d] = (rows[d] || 0) + 1; pos[s] = [d, rows[d] - 1]; }
  const NW = 150, NH = 40, GX = 70, GY = 16;
  const P = (s) => [10 + pos[s][0] * (NW + GX), 10 + pos[s][1] * (NH + GY)];
  const W = 20 + (Math.max(...Object.keys(rows).map(Number)) + 1) * (NW + GX), H = 20 + Math.max(...Object.values(rows)) * (NH + GY);
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, height: H, style: `max-width:${W}px` });
  const defs = el("svg:defs"), m = el("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto" });
  m.append(el("svg:path", { d: "M0,0 L10,5 L0,10 z", fill: "#9aa3b2" })); defs.append(m); svg.append(defs);
  for (const [a, b] of wf.edges) {
    const [ax, ay] = P(a), [bx, by] = P(b);
    svg.append(el("svg:path", { class: "edge", d: `M${ax + NW},${ay + NH / 2} C${ax + NW + GX / 2},${ay + NH / 2} ${bx - GX / 2},${by + NH / 2} ${bx},${by + NH / 2}` }));
  }
  for (const s of wf.stages) {
    const [x0, y0] = P(s), [run, tool] = wf.tasks[s] || [0, 0];
    const g = el("svg:g", { class: `node${run + tool ? " active" : ""}`, "data-stage": s });
    g.append(el("svg:rect", { x: x0, y: y0, width: NW, height: NH, rx: 6 }), el("svg:text", { x: x0 + 8, y: y0 + 16 }, s),
      el("svg:text", { x: x0 + 8, y: y0 + 32, fill: "#6b7384" }, `running ${run} · between ${tool}`));
    svg.append(g);
  }
  const box = el("div"); box.append(el("h2", { class: "muted" }, wf.name), svg);
  return box;
}

function renderWorkflows(s) {
  const box = $("#workflows");
  if (!s.workflows.length) { box.replaceChildren(el("p", { class: "muted" }, "no workflow declared or learned yet")); return; }
  box.replaceChildren(...s.workflows.map(renderWorkflow));
}

// ---- the stream ------------------------------------------------------------------------------
function render(s) {
  if (s.history) state.history = s.history;
  else if (s.point && (!state.history.length || s.point.t > state.history[state.history.length - 1].t)) state.history.push(s.point);
  if (state.history.length > 600) state.history.splice(0, state.history.length - 600);
  $("#model").textContent = s.model ? `model ${s.model}` : "";
  renderCards(s); renderCharts(); renderAgents(s); renderTimeline(s); renderWorkflows(s);
  document.body.dataset.updates = String(++state.updates);
}

function connect() {
  const status = $("#status"), es = new EventSource("api/events");
  es.addEventListener("open", () => { status.textContent = "live"; status.className = "status on"; });
  es.addEventListener("error", () => { status.textContent = "reconnecting"; status.className = "status off"; });
  es.addEventListener("snapshot", (e) => render(JSON.parse(e.data)));
}

connect();
