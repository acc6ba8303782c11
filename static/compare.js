// Runs side by side (GET /api/runs/compare?runs=a,b): one figure per metric, one colour per run,
// and a link back to each run. The runs are the page's `runs=` parameter (the URL is the state).
import { $ } from "./page.js";
import { el, fetchJSON, markOpen, plotlyConfig, readInitial } from "./util.js";

const init = readInitial();
const FONT = { family: "system-ui, DejaVu Sans, sans-serif", size: 13, color: "#111" };
// Colour-blind-safe, distinct in print (Okabe and Ito).
export const RUN_COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"];
const LABELS = init.labels || {};

function draw(body) {
  const runs = body.runs;
  const legend = runs.map((r, i) =>
    el("span", { class: "run-key" }, el("span", { class: "swatch", style: `background:${RUN_COLORS[i % RUN_COLORS.length]}` }), " ", el("a", { href: r.url, class: "run-link" }, r.name || `run ${r.ref}`), ` (${r.n_steps} steps)`),
  );
  $("c-runs").replaceChildren(...legend.flatMap((x, i) => (i ? [" · ", x] : [x])));
  document.title = `${runs.map((r) => r.name).join(" vs ")} · creditlens`;
  const box = $("c-figs");
  // Every box is in the grid before the first plot is drawn, so each takes its final width.
  const plots = Object.entries(body.metrics).map(([name, series]) => {
    const plot = el("div", { class: "plot", id: `fig-${name}` });
    box.append(el("figure", { class: "fig" }, el("h3", {}, LABELS[name] || name.replace(/_/g, " ")), plot));
    return [name, series, plot];
  });
  for (const [name, series, plot] of plots) {
    const traces = series.map((pts, i) => ({
      type: "scatter",
      mode: pts.length <= 300 ? "lines+markers" : "lines",
      name: runs[i].name || `run ${runs[i].ref}`,
      x: pts.map((p) => p[0]),
      y: pts.map((p) => p[1]),
      line: { color: RUN_COLORS[i % RUN_COLORS.length], width: 1.5 },
      marker: { size: 5 },
      hovertemplate: `${runs[i].name}<br>step %{x}: %{y:.4g}<extra></extra>`,
    }));
    if (!window.Plotly) {
      plot.textContent = "Plotly is not available.";
      continue;
    }
    window.Plotly.newPlot(
      plot,
      traces,
      {
        font: FONT,
        margin: { l: 56, r: 16, t: 10, b: 40 },
        height: 280,
        paper_bgcolor: "#fff",
        plot_bgcolor: "#fff",
        xaxis: { title: { text: "step", standoff: 4 }, zeroline: false },
        yaxis: { exponentformat: "e" },
        legend: { orientation: "h", y: -0.3 },
      },
      plotlyConfig(`compare-${name}`),
    );
  }
}

async function main() {
  try {
    draw(await fetchJSON(init.api));
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
