// The Argosy dashboard: polls /dashboard/data every 2 s and redraws tables and uPlot charts in place.
// After each poll, each chart's element carries data-points (non-null values drawn) and data-series,
// and <body> carries data-polls: the browser test reads them.
"use strict";

const POLL_MS = 2000;
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const charts = {};  // name -> {plot, signature}
let polls = 0;

// Each chart: which series of the JSON it draws, their labels, and a scale for the unit shown.
function chartSeries(name, s) {
  const pick = (key, label = (k) => k, scale = 1) =>
    Object.entries(s[key] || {}).map(([k, v]) => ({label: label(k), values: v.map((x) => x == null ? null : x * scale)}));
  switch (name) {
    case "ttft": return [...pick("ttft_p50_s", (m) => `${m} p50`), ...pick("ttft_p99_s", (m) => `${m} p99`)];
    case "itl": return [...pick("itl_p50_s", (m) => `${m} p50`), ...pick("itl_p99_s", (m) => `${m} p99`)];
    case "kv_cache_usage": return pick("kv_cache_usage", (u) => u.replace(/^https?:\/\//, ""), 100);
    case "device_busy": return pick("device_busy", (u) => u.replace(/^https?:\/\//, ""), 100);
    case "device_memory": return pick("device_memory", (u) => u.replace(/^https?:\/\//, ""), 100);
    case "replicas": return [...pick("replicas_desired", (m) => `${m} desired`),
                             ...pick("replicas_ready", (m) => `${m} ready`)];
    default: return pick(name);
  }
}

function draw(el, t, series) {
  const name = el.dataset.chart, unit = el.dataset.unit;
  const signature = series.map((x) => x.label).join("|");
  const data = [t, ...series.map((x) => x.values)];
  let c = charts[name];
  if (!c || c.signature !== signature) {  // the set of series changed: build the chart again
    if (c) c.plot.destroy();
    el.innerHTML = `<h3>${el.dataset.title} (${unit})</h3>`;
    if (!series.length) {
      el.insertAdjacentHTML("beforeend", `<div class="empty">${name === "errors_per_s" ? "no errors" : "no data yet"}</div>`);
      charts[name] = {plot: {destroy() {}, setData() {}}, signature};
    } else {
      const opts = {
        width: Math.max(400, el.clientWidth - 12), height: 210,
        scales: {x: {time: true}, y: {range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1]}},
        axes: [{}, {label: unit, size: 60}],
        series: [{}, ...series.map((x, i) => ({label: x.label, stroke: COLORS[i % COLORS.length], width: 1.5,
                                                 spanGaps: false, points: {show: false}}))],
      };
      charts[name] = {plot: new uPlot(opts, data, el), signature};
    }
  } else {
    c.plot.setData(data);
  }
  el.dataset.series = String(series.length);
  el.dataset.points = String(series.reduce((n, x) => n + x.values.filter((v) => v != null).length, 0));
  el.dataset.nonzero = String(series.some((x) => x.values.some((v) => v != null && v > 0)));
}

function cell(text, cls = "") { return `<td class="${cls}">${text == null ? "-" : text}</td>`; }
function esc(s) { return String(s).replace(/[&<>"]/g, (ch) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[ch])); }
function pct(x) { return x == null ? null : (100 * x).toFixed(1) + " %"; }

function renderModels(models) {
  const html = models.map((m) => {
    const head = `<h2>${esc(m.model)}: ${m.ready} ready` + (m.desired != null ? `, desired ${m.desired}` : "") +
      `; ${m.in_flight} in flight, ${m.queued} queued` + (m.held ? `, ${m.held} held for a cold start` : "") +
      (m.panic ? "; <b>panic</b>" : "") + (m.unplaceable ? `; cannot place: ${esc(m.unplaceable)}` : "") + "</h2>";
    const rows = m.replicas.map((r) => "<tr>" + cell(esc(r.id) + (r.revision ? ` (${esc(r.revision)})` : "")) +
      cell(esc(r.state) + (r.pooled ? " (pool)" : ""), "state-" + r.state) +
      cell(r.url ? esc(r.url) : null) + cell(r.in_flight, "num") + cell(r.running, "num") + cell(r.waiting, "num") +
      cell(pct(r.kv_cache_usage), "num") + cell(pct(r.device_busy), "num") + cell(pct(r.device_memory), "num") +
      cell(r.throttled == null ? null : (r.throttled ? "<b>throttled</b>" : "no"), r.throttled ? "state-throttled" : "") +
      cell(r.age_s == null ? null : r.age_s.toFixed(0) + " s", "num") +
      cell(r.cold_start_s == null ? null : r.cold_start_s.toFixed(1) + " s", "num") +
      // regions (docs/regions.md): where it runs, on what capacity kind, at what price
      cell(r.region ? esc(r.region) + " (" + esc(r.provider) + ")" : null) + cell(r.capacity_kind ? esc(r.capacity_kind) : null) +
      cell(r.usd_per_hour == null ? null : "$" + r.usd_per_hour.toFixed(2) + "/h", "num") + "</tr>").join("");
    return head + "<table class=\"replicas\"><thead><tr><th>replica</th><th>state</th><th>url</th><th>in flight (gateway)</th>" +
      "<th>running</th><th>waiting</th><th>KV cache</th><th>device busy</th><th>device memory</th><th>GPU throttled</th>" +
      "<th>age</th><th>cold start</th><th>region (provider)</th><th>capacity</th><th>cost</th></tr></thead><tbody>" +
      (rows || '<tr><td colspan="15">no replicas</td></tr>') + "</tbody></table>";
  }).join("");
  document.getElementById("models").innerHTML = html;
}

function renderDecisions(decisions) {
  const rows = decisions.slice(-20).reverse().map((d) => "<tr>" + cell(esc(d.at)) + cell(esc(d.model)) + cell(esc(d.direction)) +
    cell(`${d.actual} &rarr; ${d.desired}`) + cell(d.panic ? "yes" : "no") + cell(esc(d.reason), "reason") + "</tr>").join("");
  document.querySelector("#decisions tbody").innerHTML = rows || '<tr><td colspan="6">none yet</td></tr>';
}

function renderRollouts(rollouts) {
  const rows = rollouts.map((m) => {
    const r = m.rollout;
    const split = Object.entries(m.split).map(([rev, w]) => `${esc(rev)} ${w}%`).join(", ");
    if (!r) return "<tr>" + cell(esc(m.model)) + cell(esc(m.stable)) + cell(split) + '<td colspan="5">none</td></tr>';
    const progress = r.strategy === "canary" ? `step ${r.step + 1}, ${r.weight}%` :
      r.strategy === "rolling" ? `${r.replaced}/${r.size} replaced` : `${r.weight}%`;
    const a = r.analyses;
    const last = r.reason ? esc(r.reason) : r.last_analysis ? esc(r.last_analysis.verdict + ": " +
      r.last_analysis.gates.map((g) => `${g.metric} ${g.candidate} (stable ${g.stable}) ${g.bound}`).join("; ")) : null;
    return "<tr>" + cell(esc(m.model)) + cell(esc(m.stable)) + cell(split) +
      cell(`${esc(r.strategy)} ${esc(r.from_revision)} &rarr; ${esc(r.to_revision)}`) +
      cell(esc(r.phase) + (r.paused ? " (paused)" : ""), "state-" + r.phase) + cell(progress) +
      cell(`${a.pass || 0} pass, ${a.fail || 0} fail, ${a.inconclusive || 0} inconclusive`) + cell(last, "reason") + "</tr>";
  }).join("");
  document.querySelector("#rollouts tbody").innerHTML = rows || '<tr><td colspan="8">no managed models</td></tr>';
}

function renderShadow(shadow) {
  const rows = [];
  for (const [model, revs] of Object.entries(shadow || {})) {
    for (const [rev, s] of Object.entries(revs)) {
      for (const [bucket, x] of [["all", s], ...Object.entries(s.by_prompt_tokens)]) {
        rows.push("<tr>" + cell(esc(model)) + cell(esc(rev)) + cell(esc(bucket)) + cell(x.pairs, "num") +
          cell(x.greedy_pairs, "num") + cell(pct(x.identical_greedy), "num") + cell(x.mean_first_diff_token, "num") +
          cell(x.mean_length_ratio, "num") + cell(pct(x.same_finish_reason), "num") +
          cell(x.mean_logprob_divergence, "num") + cell(pct(x.judge_mean), "num") + "</tr>");
      }
    }
  }
  document.querySelector("#shadow tbody").innerHTML = rows.join("") || '<tr><td colspan="11">no shadow pairs yet</td></tr>';
}

// A gateway that listens beyond loopback serves the data (it names replicas) only with the admin key:
// the page asks for it once and keeps it for this tab (sessionStorage), sent as a bearer token.
const KEY_ITEM = "argosy-admin-key";

function askForKey() {
  if (document.getElementById("key-form")) return;
  const form = document.createElement("form");
  form.id = "key-form";
  form.innerHTML = '<input type="password" id="admin-key" placeholder="admin key" autocomplete="off"> <button>show</button>';
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY_ITEM, document.getElementById("admin-key").value.trim());
    form.remove();
  });
  document.querySelector("header").appendChild(form);
}

function renderKeys(keys) {
  const section = document.getElementById("keys");
  section.hidden = !keys || !keys.length;
  if (section.hidden) return;
  const usd = (x) => x == null ? null : "$" + x.toFixed(4);
  const rows = keys.map((k) => "<tr>" + cell(esc(k.name)) + cell(k.requests, "num") + cell(k.input_tokens, "num") +
    cell(k.output_tokens, "num") + cell(usd(k.spend_usd), "num") + cell(usd(k.budget_usd), "num") +
    cell(k.expires_at == null ? null : esc(new Date(k.expires_at * 1000).toISOString().slice(0, 16).replace("T", " ")) + " UTC") +
    "</tr>").join("");
  section.querySelector("tbody").innerHTML = rows;
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const key = sessionStorage.getItem(KEY_ITEM);
    const r = await fetch("/dashboard/data", {cache: "no-store", headers: key ? {authorization: `Bearer ${key}`} : {}});
    if (r.status === 401 || r.status === 403) {
      sessionStorage.removeItem(KEY_ITEM);
      askForKey();
      throw new Error(`HTTP ${r.status}: this gateway shows its data with the admin key`);
    }
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const d = await r.json();
    renderModels(d.models);
    renderDecisions(d.decisions);
    renderKeys(d.keys);
    renderRollouts(d.rollouts || []);
    renderShadow(d.shadow);
    for (const el of document.querySelectorAll(".chart")) draw(el, d.t, chartSeries(el.dataset.chart, d.series));
    polls += 1;
    document.body.dataset.polls = String(polls);
    status.textContent = `updated ${new Date(d.now * 1000).toLocaleTimeString()}, every ${d.poll_s} s`;
    status.className = "";
  } catch (e) {
    status.textContent = `cannot reach the gateway (${e.message}); retrying`;
    status.className = "stale";
  }
  setTimeout(poll, POLL_MS);
}

poll();
