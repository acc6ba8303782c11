// Run page: the stored per-step metrics of /api/runs/{id} as Plotly timelines (one figure per
// family of metrics); a click on a point opens that step's batch page. One request, no episodes.
// The figures on the first screen are drawn first; the rest, and the steps table, right after.
import { $ } from "./page.js";
import { el, fetchJSON, fmt, plotlyConfig, readInitial, urls } from "./util.js";

const init = readInitial();
const FONT = { family: "system-ui, DejaVu Sans, sans-serif", size: 13, color: "#111" };
const COLORS = ["rgb(33,102,172)", "rgb(178,24,43)", "rgb(90,90,90)"];

// Figures and their metrics, from the page state: names, labels and formats are defined once, in
// app/core/metrics.py ([{id, title, percent, metrics: [{name, label, format}]}]).
export const FIGURES = init.figures || [];
const LABELS = init.labels || {};
const label = (name) => LABELS[name] || name.replace(/_/g, " ");

/** [{figure, traces}] for the figures that have at least one value; customdata = batch ids. */
export function timelineTraces(steps) {
  const out = [];
  for (const f of FIGURES) {
    const traces = [];
    f.metrics.forEach(({ name, label }, i) => {
      const pts = steps.filter((s) => s.metrics && s.metrics[name] !== null && s.metrics[name] !== undefined);
      if (!pts.length) return;
      traces.push({
        type: "scatter",
        mode: pts.length <= 300 ? "lines+markers" : "lines",
        name: label,
        x: pts.map((s) => s.step),
        y: pts.map((s) => s.metrics[name]),
        customdata: pts.map((s) => s.batch_ref ?? s.batch_id),
        line: { color: COLORS[i % COLORS.length], width: 1.5 },
        marker: { size: 6 },
        hovertemplate: `step %{x}<br>${label}: %{y:.4g}<extra></extra>`,
      });
    });
    if (traces.length) out.push({ figure: f, traces });
  }
  return out;
}

// After a frame is painted, so what was drawn before is on screen while the rest is drawn.
const nextTask = () => new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));

function drawFigure({ figure, traces, plot }) {
  if (!window.Plotly) {
    plot.textContent = `Plotly is not available (${urls.plotlyBasic}).`;
    return;
  }
  const layout = {
    font: FONT,
    margin: { l: 56, r: 16, t: 10, b: 40 },
    height: 310,
    paper_bgcolor: "#fff",
    plot_bgcolor: "#fff",
    hovermode: "closest",
    xaxis: { title: { text: "step", standoff: 4 }, zeroline: false },
    // exponentformat "e": float noise such as -3e-14 must not read as "-30f".
    yaxis: figure.percent ? { tickformat: ".0%", rangemode: "tozero" } : { zeroline: true, exponentformat: "e" },
    legend: { orientation: "h", y: -0.3 },
    showlegend: traces.length > 1,
  };
  window.Plotly.newPlot(plot, traces, layout, plotlyConfig(`run-${init.run_id}-${figure.id}`));
  plot.dataset.drawn = "1";
  plot.on("plotly_click", (ev) => {
    const p = ev && ev.points && ev.points[0];
    if (p && p.customdata !== undefined) window.location.assign(urls.batch(p.customdata));
  });
}

/** Lay out every figure's box, draw the ones on the first screen; returns the others. */
function drawTimeline(steps) {
  const box = $("timeline");
  const figs = timelineTraces(steps).map(({ figure, traces }) => {
    const plot = el("div", { class: "plot", id: `fig-${figure.id}` });
    box.append(el("figure", { class: "fig" }, el("h3", {}, figure.title), plot));
    return { figure, traces, plot };
  });
  if (!figs.length) box.append(el("p", { class: "hint" }, "No steps yet: post one to ", el("code", {}, urls.apiRunStep(init.run_id, 0)), "."));
  // Every box is in the grid before the first plot is drawn, so each takes its final width and
  // we know which are on the first screen: those are drawn now, the rest one per task after.
  const fold = window.innerHeight;
  const first = figs.filter(({ plot }) => plot.getBoundingClientRect().top < fold);
  first.forEach(drawFigure);
  return figs.filter((f) => !first.includes(f));
}

// The steps table shows the latest steps first; a long run's whole table (1,000 rows cost a
// browser ~0.3 s of layout) only when asked for.
const STEPS_SHOWN = 100;
const STEP_COLUMNS = ["pass_rate", "mean_score", "zero_variance_share"];

function stepRow(s) {
  return el(
    "tr",
    {},
    el("td", { class: "num" }, String(s.step)),
    el("td", {}, el("a", { href: urls.batch(s.batch_ref ?? s.batch_id) }, `batch ${s.batch_id}`)),
    el("td", { class: "num" }, s.n_episodes_seen > s.n_episodes ? `${s.n_episodes} of ${s.n_episodes_seen} kept` : String(s.n_episodes)),
    ...STEP_COLUMNS.map((name) => el("td", { class: "num" }, fmt(s.metrics[name]))),
  );
}

function drawSteps(steps, all = false) {
  const head = el("tr", {}, ...["step", "batch", "episodes", ...STEP_COLUMNS.map(label)].map((h) => el("th", { scope: "col" }, h)));
  const newest = steps.slice().reverse();
  const shown = all ? newest : newest.slice(0, STEPS_SHOWN);
  $("steps").replaceChildren(el("thead", {}, head), el("tbody", {}, ...shown.map(stepRow)));
  const more = $("steps-more");
  more.replaceChildren();
  if (shown.length < steps.length) {
    const button = el("button", { type: "button", id: "steps-all" }, `Show all ${steps.length} steps`);
    button.addEventListener("click", () => drawSteps(steps, true));
    more.append(`The latest ${shown.length} of ${steps.length} steps. `, button);
  }
}

async function main() {
  const timeline = $("timeline");
  let later = [];
  let steps = [];
  try {
    const run = await fetchJSON(init.api);
    steps = run.steps;
    performance.mark("run:fetched");
    const last = steps.length ? steps[steps.length - 1].step : null;
    $("r-meta").textContent = `${steps.length} step${steps.length === 1 ? "" : "s"}${last === null ? "" : ` (last: ${last})`} · created ${run.created_at}`;
    $("r-config").textContent = JSON.stringify(run.config, null, 2);
    later = drawTimeline(steps);
    performance.mark("run:first-screen");
  } catch (e) {
    const box = $("error");
    box.hidden = false;
    box.textContent = e.describe ? e.describe() : String(e);
    $("r-meta").textContent = "";
  }
  // "ready": the first screen is drawn and clickable (what the user sees open). "drawn": every
  // figure below it and the steps table too; each is its own task, so the page paints between.
  timeline.dataset.ready = "1";
  await nextTask();
  // A frame has been produced since "ready": the first screen is on screen (bench/runs.py reads
  // this mark's time since the navigation started).
  performance.mark("run:open");
  performance.mark("page:open"); // the mark every page sets (util.js markOpen)
  for (const [i, fig] of later.entries()) {
    if (i) await nextTask();
    drawFigure(fig);
  }
  await nextTask();
  drawSteps(steps);
  performance.mark("run:drawn");
  timeline.dataset.drawn = "all";
}

main();
