// Runs side by side (GET /api/runs/compare?runs=a,b; ids, slugs or names): a summary of each
// metric's last value per run and their difference, then one figure per metric (one colour per
// run), with a smoothing control. The URL is the state: `runs=` and `smooth=`.
import { $, SCHEME_COLORS, plot } from "./page.js";
import { el, fetchJSON, fmt, markOpen, readInitial } from "./util.js";

const init = readInitial();
// One colour per run; none blue or red (those mean the sign of an advantage).
const RUN_COLORS = SCHEME_COLORS;
const LABELS = init.labels || {};
// Metric name -> {format, order} from the run page's figures (app/core/metrics.py).
const META = new Map();
(init.figures || []).forEach((f) => f.metrics.forEach((m) => META.set(m.name, { format: m.format, order: META.size })));
const SMOOTHING = [0, 0.5, 0.8, 0.9, 0.95];

let body = null;

function smoothing() {
  const x = Number(new URLSearchParams(location.search).get("smooth") || 0);
  return SMOOTHING.includes(x) ? x : 0;
}

/** An exponential moving average over the points in step order (a = 0: the points themselves). */
function ema(ys, a) {
  if (!a) return ys;
  let s = null;
  return ys.map((y) => {
    if (y === null || y === undefined) return s;
    s = s === null ? y : a * s + (1 - a) * y;
    return s;
  });
}

function show(name, v) {
  if (v === null || v === undefined) return "—";
  const f = (META.get(name) || {}).format;
  if (f === "share") return `${(100 * v).toFixed(1)}%`;
  if (f === "count" || (!f && Number.isInteger(v))) return Number.isInteger(v) ? String(v) : fmt(v);
  return fmt(v);
}

const lastOf = (pts) => (pts.length ? pts[pts.length - 1][1] : null);
const signed = (name, d) => (d === null ? "—" : `${d > 0 ? "+" : d < 0 ? "−" : "±"}${show(name, Math.abs(d))}`);

/** The metrics worth a figure, in the run page's order, and those equal everywhere (a constant). */
function split(metrics) {
  const names = Object.keys(metrics).sort((a, b) => (META.get(a)?.order ?? 1e9) - (META.get(b)?.order ?? 1e9) || a.localeCompare(b));
  const varying = [];
  const constant = [];
  for (const name of names) {
    const ys = metrics[name].flatMap((pts) => pts.map((p) => p[1]));
    if (!ys.length) continue;
    (ys.every((y) => y === ys[0]) ? constant : varying).push(name);
  }
  return { varying, constant };
}

function summary(runs, metrics, varying, constant) {
  const head = el(
    "tr",
    {},
    el("th", { scope: "col" }, "metric (last step)"),
    runs.map((r, i) => el("th", { scope: "col", class: "num" }, el("span", { class: "swatch", style: `background:${RUN_COLORS[i % RUN_COLORS.length]}` }), " ", r.name || `run ${r.ref}`)),
    runs.slice(1).map((r) => el("th", { scope: "col", class: "num" }, `${r.name || r.ref} − ${runs[0].name || runs[0].ref}`)),
  );
  const rows = varying.map((name) => {
    const last = metrics[name].map(lastOf);
    return el(
      "tr",
      { dataset: { metric: name } },
      el("th", { scope: "row" }, LABELS[name] || name.replace(/_/g, " ")),
      last.map((v) => el("td", { class: "num" }, show(name, v))),
      last.slice(1).map((v) => el("td", { class: "num diff" }, v === null || last[0] === null ? "—" : signed(name, v - last[0]))),
    );
  });
  $("c-summary").replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
  $("c-constant").textContent = constant.length
    ? `The same in every run and step (no figure): ${constant.map((n) => `${LABELS[n] || n} = ${show(n, metrics[n][0][0][1])}`).join("; ")}.`
    : "";
}

function drawFigures(runs, metrics, varying) {
  const a = smoothing();
  const box = $("c-figs");
  box.replaceChildren();
  // Every box is in the grid before the first plot is drawn, so each takes its final width.
  const plots = varying.map((name) => {
    const node = el("div", { class: "plot", id: `fig-${name}` });
    box.append(el("figure", { class: "fig" }, el("h3", {}, LABELS[name] || name.replace(/_/g, " ")), node));
    return [name, node];
  });
  for (const [name, node] of plots) {
    const traces = metrics[name].map((pts, i) => ({
      type: "scatter",
      mode: pts.length <= 300 && !a ? "lines+markers" : "lines",
      name: runs[i].name || `run ${runs[i].ref}`,
      x: pts.map((p) => p[0]),
      y: ema(pts.map((p) => p[1]), a),
      line: { color: RUN_COLORS[i % RUN_COLORS.length], width: 1.8 },
      marker: { size: 5 },
      hovertemplate: `${runs[i].name}<br>step %{x}: %{y:.4g}<extra></extra>`,
    }));
    const share = (META.get(name) || {}).format === "share";
    plot(
      node,
      traces,
      {
        height: 280,
        margin: { l: 56, r: 16, t: 10, b: 40 },
        xaxis: { title: { text: "step", standoff: 4 }, zeroline: false },
        // The figure's heading names the metric; the axis says what its numbers are.
        yaxis: share ? { tickformat: ".0%", title: { text: "share" } } : { exponentformat: "e", title: { text: (META.get(name) || {}).format === "count" ? "count" : "value" } },
        legend: { orientation: "h", y: -0.3 },
      },
      `compare-${name}`,
    );
  }
}

function draw() {
  const runs = body.runs;
  const legend = runs.map((r, i) =>
    el("span", { class: "run-key" }, el("span", { class: "swatch", style: `background:${RUN_COLORS[i % RUN_COLORS.length]}` }), " ", el("a", { href: r.url, class: "run-link" }, r.name || `run ${r.ref}`), ` (id ${r.ref}, ${r.n_steps} steps)`),
  );
  $("c-runs").replaceChildren(...legend.flatMap((x, i) => (i ? [" · ", x] : [x])));
  document.title = `${runs.map((r) => r.name).join(" vs ")} · creditlens`;
  const { varying, constant } = split(body.metrics);
  summary(runs, body.metrics, varying, constant);
  drawFigures(runs, body.metrics, varying);
}

$("c-smooth").value = String(smoothing());
$("c-smooth").addEventListener("change", () => {
  const q = new URLSearchParams(location.search);
  if (Number($("c-smooth").value)) q.set("smooth", $("c-smooth").value);
  else q.delete("smooth");
  history.replaceState(null, "", `${location.pathname}?${q.toString().replace(/%2C/g, ",")}`);
  if (body) drawFigures(body.runs, body.metrics, split(body.metrics).varying);
  $("c-figs").dataset.smooth = String(smoothing());
});

async function main() {
  try {
    body = await fetchJSON(init.api);
    draw();
  } catch (e) {
    const box = $("error");
    box.hidden = false;
    box.textContent = e.describe ? e.describe() : String(e);
    $("c-runs").textContent = "";
  }
  $("c-figs").dataset.ready = "1";
  markOpen();
}

main();
