// Run page: the stored per-step metrics of /api/runs/{id} as Plotly timelines (one figure per
// family of metrics); a click on a point opens that step's batch page. One request, no episodes
// (then, below them, the trainer's own logged metrics when the run has any).
// The figures on the first screen are drawn first; the rest, and the steps table, right after.
import { $, SCHEME_COLORS, plot, when } from "./page.js";
import { el, fetchJSON, fmt, readInitial, urls } from "./util.js";

const init = readInitial();
// Series colours: none blue or red (those mean the sign of an advantage), except the audit's
// severities, in the colours of the findings' marks on the episode page.
const COLORS = SCHEME_COLORS;
const METRIC_COLORS = { audit_errors: "#d7191c", audit_warnings: "#e08214" };

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
        line: { color: METRIC_COLORS[name] || COLORS[i % COLORS.length], width: 1.5 },
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

function drawFigure({ figure, traces, plot: box }) {
  const layout = {
    height: 310,
    margin: { l: 56, r: 16, t: 10, b: 40 },
    xaxis: { title: { text: "step", standoff: 4 }, zeroline: false },
    // exponentformat "e": float noise such as -3e-14 must not read as "-30f".
    yaxis: figure.percent ? { tickformat: ".0%", rangemode: "tozero" } : { zeroline: true, exponentformat: "e" },
    legend: { orientation: "h", y: -0.3 },
    showlegend: traces.length > 1,
  };
  if (figure.metrics.every((m) => m.format === "count")) {
    // Counts (the audit's findings): whole numbers on the axis, one tick each while few.
    const top = Math.max(1, ...traces.flatMap((t) => t.y));
    layout.yaxis = { rangemode: "tozero", tickformat: "d", ...(top <= 10 ? { dtick: 1 } : {}), title: { text: "findings" } };
  }
  if (plot(box, traces, layout, `run-${init.run_id}-${figure.id}`) === null) return;
  box.dataset.drawn = "1";
  box.on("plotly_click", (ev) => {
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
// drift_token_share: a loop that re-renders sampled tokens (token-in/token-out) shows in every step.
const STEP_COLUMNS = ["pass_rate", "mean_score", "zero_variance_share", "nonpolicy_advantage_share", "drift_token_share"];
const SHARES = new Set(["zero_variance_share", "nonpolicy_advantage_share", "drift_token_share"]);

/** A step's audit findings by severity, as the run's audit figure counts them ("—": not audited). */
function findingsCell(m) {
  const e = m.audit_errors;
  const w = m.audit_warnings;
  if ((e === null || e === undefined) && (w === null || w === undefined)) return el("td", { class: "num", title: "not audited (no trainer advantages)" }, "—");
  const parts = [];
  if (e) parts.push(el("span", { class: "sev sev-error" }, `${e} error${e === 1 ? "" : "s"}`));
  if (w) parts.push(el("span", { class: "sev sev-warning" }, `${w} warning${w === 1 ? "" : "s"}`));
  return el("td", { class: "num findings" }, ...(parts.length ? parts.flatMap((x, i) => (i ? [" ", x] : [x])) : ["0"]));
}

const cellOf = (name, v) => (SHARES.has(name) && typeof v === "number" ? `${(100 * v).toFixed(v && Math.abs(v) < 0.01 ? 2 : 0)}%` : fmt(v));

function stepRow(s) {
  return el(
    "tr",
    {},
    el("td", { class: "num" }, String(s.step)),
    el("td", {}, el("a", { href: urls.batch(s.batch_ref ?? s.batch_id) }, `batch ${s.batch_id}`)),
    el("td", { class: "num" }, s.n_episodes_seen > s.n_episodes ? `${s.n_episodes} of ${s.n_episodes_seen} kept` : String(s.n_episodes)),
    ...STEP_COLUMNS.map((name) => el("td", { class: "num" }, cellOf(name, s.metrics[name]))),
    findingsCell(s.metrics),
  );
}

function drawSteps(steps, all = false) {
  const head = el("tr", {}, ...["step", "batch", "episodes", ...STEP_COLUMNS.map(label), "audit findings"].map((h) => el("th", { scope: "col" }, h)));
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

// "Logged by the trainer": the run's logged metrics (GET /api/runs/{id}/logged-metrics), the
// trainer's own numbers from its metrics log, one series at a time with one of ours beside it on a
// second axis. Fetched after our figures are drawn: a run without a log costs one small request.
const LOGGED_COLOR = "#1b9e77";
const OURS_COLOR = "#7f7f7f";

/** The logged metric shown first: a reward or score when the log has one, else its first. */
export function defaultLogged(names) {
  return names.find((n) => /(^|\/)(reward|score)/i.test(n)) || names.find((n) => /reward|score/i.test(n)) || names[0];
}

async function drawLogged(steps, nLogged) {
  const section = $("logged");
  const base = `${init.api}/logged-metrics`;
  // The run's answer says whether it has any: a run without a log asks for nothing more.
  const head = nLogged ? await fetchJSON(`${base}?names=`) : { n_steps: 0 };
  if (!head.n_steps) {
    section.dataset.ready = "none";
    return;
  }
  section.hidden = false;
  $("logged-source").append(" ", `${head.n_steps} step${head.n_steps === 1 ? "" : "s"} from ${head.sources.join("; ")}.`);
  const pick = $("logged-metric");
  pick.replaceChildren(...head.names.map((n) => el("option", { value: n }, n)));
  pick.value = defaultLogged(head.names);
  const ours = $("logged-ours");
  const have = FIGURES.flatMap((f) => f.metrics).filter(({ name }) => steps.some((s) => s.metrics && typeof s.metrics[name] === "number"));
  ours.append(...have.map(({ name, label: l }) => el("option", { value: name }, l)));
  const cache = new Map();
  const seriesOf = async (name) => {
    if (!cache.has(name)) cache.set(name, (await fetchJSON(`${base}?names=${encodeURIComponent(name)}`)).metrics[name] || []);
    return cache.get(name);
  };
  const draw = async () => {
    section.dataset.ready = "0";
    const name = pick.value;
    const pts = await seriesOf(name);
    const traces = [
      {
        type: "scatter",
        mode: pts.length <= 300 ? "lines+markers" : "lines",
        name: `${name} (logged by the trainer)`,
        x: pts.map((p) => p[0]),
        y: pts.map((p) => p[1]),
        line: { color: LOGGED_COLOR, width: 1.5 },
        marker: { size: 5 },
        hovertemplate: `step %{x}<br>${name}: %{y:.4g}<br>logged by the trainer<extra></extra>`,
      },
    ];
    const mine = ours.value;
    if (mine) {
      const got = steps.filter((s) => s.metrics && typeof s.metrics[mine] === "number");
      traces.push({
        type: "scatter",
        mode: "lines+markers",
        name: `${label(mine)} (creditlens, from the episodes)`,
        x: got.map((s) => s.step),
        y: got.map((s) => s.metrics[mine]),
        yaxis: "y2",
        line: { color: OURS_COLOR, width: 1.5, dash: "dot" },
        marker: { size: 5 },
        hovertemplate: `step %{x}<br>${label(mine)}: %{y:.4g}<br>computed by creditlens<extra></extra>`,
      });
    }
    const layout = {
      height: 330,
      margin: { l: 56, r: mine ? 56 : 16, t: 10, b: 40 },
      xaxis: { title: { text: "step", standoff: 4 }, zeroline: false },
      yaxis: { zeroline: true, exponentformat: "e", title: { text: "logged by the trainer" } },
      legend: { orientation: "h", y: -0.3 },
      showlegend: true,
    };
    if (mine) layout.yaxis2 = { overlaying: "y", side: "right", showgrid: false, zeroline: false, exponentformat: "e", title: { text: "creditlens" } };
    plot("logged-plot", traces, layout, `run-${init.run_id}-logged`);
    section.dataset.ready = "1";
  };
  pick.addEventListener("change", draw);
  ours.addEventListener("change", draw);
  await draw();
}

async function main() {
  const timeline = $("timeline");
  let later = [];
  let steps = [];
  let nLogged = 0;
  try {
    const run = await fetchJSON(init.api);
    steps = run.steps;
    nLogged = run.n_logged_steps || 0;
    performance.mark("run:fetched");
    const last = steps.length ? steps[steps.length - 1].step : null;
    $("r-meta").textContent = `${steps.length} step${steps.length === 1 ? "" : "s"}${last === null ? "" : ` (last: ${last})`} · created ${when(run.created_at)}`;
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
  try {
    await drawLogged(steps, nLogged);
  } catch (e) {
    const box = $("error");
    box.hidden = false;
    box.textContent = `The trainer's logged metrics: ${e.describe ? e.describe() : String(e)}`;
    $("logged").dataset.ready = "error";
  }
}

// "Compare with": the server lists the other runs by name (with their ids) in the picker.
$("r-compare").addEventListener("submit", (e) => {
  e.preventDefault();
  const other = $("r-compare-with").value;
  if (other) window.location.assign(urls.compare([init.run_id, other]));
});

main();
