// The λ lab pages: fetch the figure's JSON twin (same query string), show progress while the
// server computes, then draw with Plotly. No inline scripts: state comes from #lab-state.
import { $, plot } from "./page.js";
import { el, fetchJSON, fmt, markOpen, readInitial } from "./util.js";

const state = readInitial("lab-state");
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
const COLORS = { exact: "#1b6ca8", stale: "#d98c00", none: "#b2182b" };

function status(text, busy) {
  const node = $("lab-status");
  node.replaceChildren();
  if (busy) node.append(el("span", { class: "lab-spinner", role: "progressbar", "aria-label": "computing" }));
  if (text) node.append(el("span", {}, text));
}

function showError(message) {
  const node = $("lab-error");
  node.textContent = message;
  node.hidden = false;
}

function figure(id, title, note) {
  const box = el("figure", { class: "fig" }, el("h3", {}, title), el("div", { id, class: "plot" }));
  if (note) box.append(el("p", { class: "hint" }, note));
  $("lab-figs").append(box);
  return id;
}

function card(label, value, hint) {
  $("lab-cards").append(
    el("div", { class: "card" }, el("div", { class: "hint" }, label), el("div", { class: "card-value" }, value), hint ? el("div", { class: "hint" }, hint) : null),
  );
}

function table(caption, headers, rows, rowClass) {
  const thead = el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col", class: h.num ? "num" : null }, h.label))));
  const tbody = el(
    "tbody",
    {},
    rows.map((r, i) =>
      el("tr", { class: rowClass ? rowClass(r, i) : null }, headers.map((h) => el("td", { class: h.num ? "num" : null }, h.get(r)))),
    ),
  );
  $("lab-tables").append(
    el("div", { class: "table-wrap" }, el("table", { class: "data lab-table" }, el("caption", {}, caption), thead, tbody)),
  );
}

const pct = (x) => (x === null || x === undefined ? "—" : `${Math.round(100 * x)}%`);
/** "mean ± SE" (just the mean when there is no SE, e.g. one seed). */
const pm = (mean, se, d = 3) => (se === null || se === undefined ? fmt(mean, d) : `${fmt(mean, d)} ± ${fmt(se, d)}`);
/** Plotly error bars of ± 1 SE (hidden when no point has one). */
function errorBars(ses) {
  const array = ses.map((x) => (x === null || x === undefined ? 0 : x));
  return { type: "data", array, visible: ses.some((x) => x !== null && x !== undefined) };
}

// ---- figure 1 ---------------------------------------------------------------------------------------
function drawLambda(r) {
  // λ on a number line (0.5 sits halfway between 0 and 1), ticks at the λs computed.
  const lamLabels = r.params.lams.map(Number);
  const bias = [];
  const variance = [];
  for (const s of r.series) {
    const c = COLORS[s.critic];
    bias.push({ x: lamLabels, y: s.points.map((p) => p.rel_bias), name: s.label, mode: "lines+markers", line: { color: c } });
    bias.push({
      x: lamLabels,
      y: s.points.map((p) => p.noise_floor),
      name: `noise floor (${s.critic})`,
      mode: "lines",
      line: { color: c, dash: "dot", width: 1 },
      showlegend: s.critic === "exact",
      legendgroup: "floor",
    });
    variance.push({ x: lamLabels, y: s.points.map((p) => p.variance), name: s.label, mode: "lines+markers", line: { color: c } });
  }
  // Lay out every box before drawing, so each plot measures its final width.
  const fb = figure("fig-bias", "Relative bias ‖mean ĝ − g*‖ / ‖g*‖");
  const fv = figure("fig-var", "Per-episode variance E‖ĝᵢ − mean ĝ‖²");
  plot(fb, bias, { xaxis: { title: { text: "λ" }, type: "linear", tickvals: lamLabels }, yaxis: { title: { text: "relative bias" }, rangemode: "tozero" } }, "lambda-bias");
  plot(fv, variance, { xaxis: { title: { text: "λ" }, type: "linear", tickvals: lamLabels }, yaxis: { title: { text: "variance" }, rangemode: "tozero" } }, "lambda-variance");
  const e = r.env;
  card("J (exact)", fmt(e.J, 4), `sampled mean return ${fmt(e.sampled_mean_return, 4)}`);
  card("E[episode length]", fmt(e.expected_length, 3), `sampled ${fmt(e.sampled_mean_length, 3)}`);
  card("‖g*‖ (exact gradient)", fmt(r.g_star_norm, 4));
  const tv = r.td_vs_mc;
  card("TD(0) vs G − V variance (exact critic)", `${fmt(tv.td_variance)} vs ${fmt(tv.mc_variance)}`, `ratio ${fmt(tv.ratio, 2)} over ${tv.visits} visits`);
  card("max |mean TD error − A|", fmt(tv.max_abs_mean_td_error, 4), `over ${tv.pairs_with_100_visits} (t, s, a) with ≥ 100 visits`);
  const rows = r.params.lams.map((lam, i) => ({ lam, pts: r.series.map((s) => s.points[i]) }));
  const headers = [{ label: "λ", get: (x) => String(x.lam) }];
  for (const [j, s] of r.series.entries()) {
    headers.push({ label: `bias, ${s.critic}`, num: true, get: (x) => fmt(x.pts[j].rel_bias) });
    headers.push({ label: `variance, ${s.critic}`, num: true, get: (x) => fmt(x.pts[j].variance) });
  }
  headers.push({ label: "noise floor (exact)", num: true, get: (x) => fmt(x.pts[0].noise_floor) });
  table(`Bias and variance on ${r.params.episodes} episodes (seed ${r.params.seed})`, headers, rows);
}

// ---- figure 2 ---------------------------------------------------------------------------------------
function drawDifficulty(r) {
  const p = r.curve.map((c) => c.p);
  const fa = figure("fig-abs", `Expected total |advantage| of a group of ${r.params.G}`);
  const fr = figure("fig-ratio", "Ratio: extra weight from std normalisation");
  const fz = figure("fig-zero", "Zero-variance probability pᴳ + (1 − p)ᴳ");
  plot(
    fa,
    [
      { x: p, y: r.curve.map((c) => c.expected_abs_plain), name: "mean-centred (Dr. GRPO)", mode: "lines" },
      { x: p, y: r.curve.map((c) => c.expected_abs_normalised), name: `÷ ${r.params.std} std (GRPO)`, mode: "lines" },
    ],
    { xaxis: { title: { text: "pass rate p" } }, yaxis: { title: { text: "E[Σ|A|]" } } },
    "difficulty-abs",
  );
  plot(
    fr,
    [{ x: p, y: r.curve.map((c) => c.ratio), name: "normalised / plain", mode: "lines" }],
    { xaxis: { title: { text: "pass rate p" } }, yaxis: { title: { text: "ratio" } } },
    "difficulty-ratio",
  );
  plot(
    fz,
    r.zero_variance_curves.map((c) => ({ x: r.p_grid, y: c.zero_variance, name: `G = ${c.G}`, mode: "lines" })),
    { xaxis: { title: { text: "pass rate p" } }, yaxis: { title: { text: "P(zero variance)" }, range: [0, 1] } },
    "difficulty-zero-variance",
  );
  for (const c of r.checkpoints) card(`ratio at p = ${c.p}`, fmt(c.ratio, 2));
  const n = r.group_size_needed;
  card(
    `group size for P(zero variance) < ${n.target} at p = ${n.p}`,
    n.G === null ? "—" : `G = ${n.G}`,
    n.G === null ? null : `${fmt(n.zero_variance_at_G)} (G − 1: ${fmt(n.zero_variance_at_G_minus_1)}); ${n.rollouts_per_step} rollouts per step for ${n.tasks} tasks`,
  );
  table(
    `Conditional scale factor of a group of ${r.params.G} with k successes`,
    [
      { label: "successes k", get: (x) => x.successes },
      { label: "std", num: true, get: (x) => fmt(x.std) },
      { label: "scale 1/(std + eps)", num: true, get: (x) => fmt(x.scale, 2) },
      { label: "Σ|A| without normalisation", num: true, get: (x) => fmt(x.total_abs_plain) },
    ],
    r.conditional_scale,
  );
}

// ---- figure 3 ---------------------------------------------------------------------------------------
function drawHorizon(r) {
  const ft = figure("fig-token", "Weight (γλ)ᴸ of an outcome L policy tokens away");
  const fu = figure("fig-turn", `Turn-level vs token-level (${r.params.tokens_per_turn} policy tokens per call)`);
  plot(
    ft,
    r.token_curves.map((c, i) => ({ x: r.token_distances, y: c.weights, name: `λ = ${c.lam}`, mode: "lines", line: { color: PALETTE[i % PALETTE.length] } })),
    { xaxis: { title: { text: "L (policy tokens)" }, type: "log" }, yaxis: { title: { text: "weight" }, range: [0, 1.02] } },
    "horizon-token",
  );
  const traces = [];
  for (const [i, c] of r.turn_curves.entries()) {
    const color = PALETTE[i % PALETTE.length];
    traces.push({ x: r.turns, y: c.turn_level, name: `turn-level, λ = ${c.lam}`, mode: "lines", line: { color } });
    traces.push({ x: r.turns, y: c.token_level, name: `token-level, λ = ${c.lam}`, mode: "lines", line: { color, dash: "dot" } });
  }
  plot(
    fu,
    traces,
    { xaxis: { title: { text: "outcome distance (turns)" } }, yaxis: { title: { text: "weight" }, range: [0, 1.02] } },
    "horizon-turn",
  );
  table(
    "Checkpoints",
    [
      { label: "what", get: (x) => x.what },
      { label: "λ", num: true, get: (x) => String(x.lam) },
      { label: "L", num: true, get: (x) => `${x.L} ${x.unit}` },
      { label: "weight", num: true, get: (x) => (x.weight > 0 && x.weight < 1e-3 ? x.weight.toExponential(1) : fmt(x.weight, 3)) },
    ],
    r.checkpoints,
  );
}

// ---- figure 4 ---------------------------------------------------------------------------------------
function drawRecovery(r) {
  const rows = r.rows;
  const names = rows.map((x) => x.name);
  const seeds = r.params.seeds || 1;
  const se = (x, k) => (x.se ? x.se[k] : null);
  plot(
    figure("fig-credit", seeds > 1 ? `Mean credit on successful BAD → RECOVER episodes (${seeds} seeds, ± 1 SE)` : "Mean credit on successful BAD → RECOVER episodes"),
    [
      { type: "bar", x: names, y: rows.map((x) => x.credit_bad), name: "credit(BAD)", error_y: errorBars(rows.map((x) => se(x, "credit_bad"))) },
      { type: "bar", x: names, y: rows.map((x) => x.credit_recover), name: "credit(RECOVER)", error_y: errorBars(rows.map((x) => se(x, "credit_recover"))) },
    ],
    { barmode: "group", xaxis: { tickangle: -35, automargin: true }, yaxis: { title: { text: "mean credit" } } },
    "recovery-credit",
  );
  card("exact A(BAD), A(RECOVER)", `${fmt(r.exact.A_bad, 2)} / ${fmt(r.exact.A_recover, 2)}`);
  card("episodes / successes / selected", `${r.batch.episodes} / ${r.batch.successes} / ${r.batch.selected}`);
  card("verl 0.9.1", r.verl);
  const seedText = seeds > 1 ? `seeds ${r.params.seed}–${r.params.seed + seeds - 1}, mean ± 1 SE` : `seed ${r.params.seed}`;
  table(
    `Recovery diagnostic (q = ${r.params.q}, batch ${r.params.batch}, ${seedText})`,
    [
      { label: "estimator", get: (x) => x.label },
      { label: "source", get: (x) => x.source },
      { label: "credit(BAD)", num: true, get: (x) => pm(x.credit_bad, se(x, "credit_bad"), 2) },
      { label: "credit(RECOVER)", num: true, get: (x) => pm(x.credit_recover, se(x, "credit_recover"), 2) },
      { label: "both positive on selected path", num: true, get: (x) => (seeds > 1 ? pm(x.both_positive, se(x, "both_positive"), 2) : pct(x.both_positive)) },
    ],
    rows,
    (x) => `src-${x.source}`,
  );
  const m = (x, k, d = 3) => pm(x.metrics[k], se(x, k), d);
  table(
    seeds > 1
      ? `Credit metrics: mean ± 1 SE over ${seeds} batches (gradient metrics on per-timestep parameters)`
      : "Credit metrics on the same batch (gradient metrics on per-timestep parameters)",
    [
      { label: "estimator", get: (x) => x.name },
      { label: "rmse", num: true, get: (x) => m(x, "rmse") },
      { label: "centred rmse", num: true, get: (x) => m(x, "centered_rmse") },
      { label: "spearman", num: true, get: (x) => m(x, "spearman") },
      { label: "sign accuracy", num: true, get: (x) => m(x, "sign_accuracy") },
      { label: "leakage", num: true, get: (x) => m(x, "leakage_ratio") },
      { label: "grad cosine", num: true, get: (x) => m(x, "gradient_cosine") },
      { label: "rel. mean-grad error", num: true, get: (x) => m(x, "relative_mean_gradient_error") },
      { label: "per-episode grad variance", num: true, get: (x) => m(x, "per_episode_gradient_variance") },
      { label: "bias t=0 / t=1", num: true, get: (x) => x.metrics.per_turn.map((t) => fmt(t.bias, 2)).join(" / ") },
      { label: "credit variance t=0 / t=1", num: true, get: (x) => x.metrics.per_turn.map((t) => fmt(t.variance, 2)).join(" / ") },
      { label: "residual variance t=0 / t=1", num: true, get: (x) => x.metrics.per_turn.map((t) => fmt(t.residual_variance, 2)).join(" / ") },
    ],
    rows,
    (x) => `src-${x.source}`,
  );
  if (seeds > 1) {
    table(
      `Across ${seeds} seeds: the gradient of the mean batch gradient, and the spread of batch gradients (AgentCreditBench's gradient variance)`,
      [
        { label: "estimator", get: (x) => x.name },
        { label: "mean-gradient cosine", num: true, get: (x) => fmt(x.across_seeds.mean_gradient_cosine, 4) },
        { label: "rel. error of the mean gradient", num: true, get: (x) => fmt(x.across_seeds.relative_mean_gradient_error, 3) },
        { label: "gradient variance across seeds", num: true, get: (x) => fmt(x.across_seeds.gradient_variance, 4) },
      ],
      rows,
      (x) => `src-${x.source}`,
    );
  }
  if (r.notes && r.notes.length) $("lab-tables").append(el("ul", { class: "lab-notes hint" }, r.notes.map((n) => el("li", {}, n))));
}

// ---- delayed-effect horizon sweep --------------------------------------------------------------------
function drawDelayedHorizon(r) {
  const p = r.params;
  const ests = p.estimators;
  const of = (e) => r.rows.filter((x) => x.estimator === e);
  const traces = (key) =>
    ests.map((e, i) => ({
      x: of(e).map((x) => x.horizon),
      y: of(e).map((x) => x[key].mean),
      error_y: errorBars(of(e).map((x) => x[key].se)),
      name: e,
      mode: "lines+markers",
      line: { color: PALETTE[i % PALETTE.length] },
    }));
  const fl = figure("fig-leakage", `Credit leakage onto the distractors (mean ± 1 SE over ${p.seeds} seeds)`);
  const fg = figure("fig-cosine", `Gradient cosine with the exact gradient (${r.gradient_params} parameters, mean ± 1 SE)`);
  const xaxis = { title: { text: "horizon H" }, type: "log", tickvals: p.horizons, ticktext: p.horizons.map(String) };
  plot(fl, traces("leakage_ratio"), { xaxis, yaxis: { title: { text: "leakage ratio" }, rangemode: "tozero" } }, "delayed-leakage");
  plot(fg, traces("gradient_cosine"), { xaxis, yaxis: { title: { text: "cosine(ĝ, g*)" } } }, "delayed-cosine");
  card("seeds × batch", `${p.seeds} × ${p.batch}`, `seeds ${p.seed}–${p.seed + p.seeds - 1}`);
  card("gradient parameters", r.gradient_params, r.gradient_params === "per_timestep" ? "one softmax table per step (AgentCreditBench)" : "one table shared by every step");
  card("critic", p.critic);
  table(
    `Per horizon and estimator (mean ± 1 SE over ${p.seeds} seeds)`,
    [
      { label: "H", num: true, get: (x) => String(x.horizon) },
      { label: "estimator", get: (x) => x.estimator },
      { label: "leakage", num: true, get: (x) => pm(x.leakage_ratio.mean, x.leakage_ratio.se) },
      { label: "gradient cosine", num: true, get: (x) => pm(x.gradient_cosine.mean, x.gradient_cosine.se) },
      { label: "mean-gradient cosine", num: true, get: (x) => fmt(x.mean_gradient_cosine, 4) },
      { label: "gradient variance across seeds", num: true, get: (x) => fmt(x.gradient_variance, 4) },
    ],
    r.rows,
  );
}

// ---- variable-horizon sweep ----------------------------------------------------------------------------
function drawVariableHorizon(r) {
  const p = r.params;
  const ests = p.estimators;
  const turns = [...new Set(r.rows.map((x) => x.t))].sort((a, b) => a - b);
  const MAX_PLOTS = 8; // the CSV and the table have every turn
  const ids = turns.slice(0, MAX_PLOTS).map((t) => [t, figure(`fig-bias-t${t}`, `Bias at turn t = ${t} (mean ± 1 SE over ${p.seeds} seeds)`)]);
  for (const [t, id] of ids) {
    const traces = ests.map((e, i) => {
      const pts = r.rows.filter((x) => x.estimator === e && x.t === t);
      return {
        x: pts.map((x) => x.p),
        y: pts.map((x) => x.bias_seeds.mean),
        error_y: errorBars(pts.map((x) => x.bias_seeds.se)),
        name: e,
        mode: "lines+markers",
        line: { color: PALETTE[i % PALETTE.length] },
        legendgroup: e,
        showlegend: t === turns[0],
      };
    });
    plot(id, traces, { xaxis: { title: { text: "stop probability p" }, range: [-0.02, 1.02] }, yaxis: { title: { text: "bias (credit − A)" } } }, `variable-horizon-bias-t${t}`);
  }
  card("seeds × batch", `${p.seeds} × ${p.batch}`, `seeds ${p.seed}–${p.seed + p.seeds - 1}`);
  card("horizon", String(r.horizon), `stop rewards ${p.stop_rewards.join(", ")}; continue ${p.continue_reward}`);
  card("critic", p.critic);
  table(
    `Per-turn bias (mean ± 1 SE over ${p.seeds} seeds; n = steps pooled over seeds)`,
    [
      { label: "p", num: true, get: (x) => String(x.p) },
      { label: "estimator", get: (x) => x.estimator },
      { label: "t", num: true, get: (x) => String(x.t) },
      { label: "n", num: true, get: (x) => String(x.n) },
      { label: "bias", num: true, get: (x) => pm(x.bias_seeds.mean, x.bias_seeds.se) },
    ],
    r.rows,
  );
}

const DRAW = {
  lambda: drawLambda,
  difficulty: drawDifficulty,
  horizon: drawHorizon,
  recovery: drawRecovery,
  delayed_horizon: drawDelayedHorizon,
  variable_horizon: drawVariableHorizon,
};

async function main() {
  if (state.error) {
    status("");
    return;
  }
  const started = performance.now();
  const tick = () => status(`Computing… ${((performance.now() - started) / 1000).toFixed(1)} s`, true);
  tick();
  const timer = setInterval(tick, 200);
  let result;
  try {
    result = await fetchJSON(state.api);
  } catch (err) {
    clearInterval(timer);
    status("");
    showError(err.describe ? err.describe() : String(err));
    return;
  }
  clearInterval(timer);
  const secs = ((performance.now() - started) / 1000).toFixed(2);
  status(result.cached ? `Loaded from the cache in ${secs} s.` : `Computed in ${secs} s.`);
  // A figure without a drawing here yet shows its JSON as text.
  const draw = DRAW[state.figure] || ((r) => $("lab-tables").append(el("pre", {}, JSON.stringify(r, null, 1))));
  draw(result);
  document.body.dataset.labReady = "1";
  markOpen();
}

main();
