// One prompt of a run over the steps (GET /api/runs/{id}/prompts/{key}): its pass rate and mean
// |A| per step, every episode of the step counted; a point or a row links to the prompt's group
// at that step when its episodes were kept.
import { $, SCHEME_COLORS, plot } from "./page.js";
import { el, fetchJSON, fmt, readInitial } from "./util.js";

const init = readInitial();

function figure(box, steps, name, y, percent) {
  const pts = steps.filter((s) => s[name] !== null && s[name] !== undefined);
  const trace = {
    type: "scatter",
    mode: "lines+markers",
    x: pts.map((s) => s.step),
    y: pts.map((s) => s[name]),
    customdata: pts.map((s) => s.group_url || s.batch_url),
    line: { color: SCHEME_COLORS[1], width: 1.5 }, // not blue: blue means a positive advantage
    marker: { size: 7 },
    hovertemplate: `step %{x}<br>${y}: %{y:.4g}<extra></extra>`,
  };
  const layout = {
    margin: { l: 56, r: 16, t: 10, b: 40 },
    height: 280,
    xaxis: { title: { text: "step", standoff: 4 }, zeroline: false },
    yaxis: percent ? { tickformat: ".0%", range: [0, 1.05], title: { text: y } } : { rangemode: "tozero", exponentformat: "e", title: { text: y } },
    showlegend: false,
  };
  if (plot(box, [trace], layout, `prompt-${init.key}-${name}`) === null) return;
  box.on("plotly_click", (ev) => {
    const p = ev && ev.points && ev.points[0];
    if (p && p.customdata) window.location.assign(p.customdata);
  });
}

function table(steps) {
  const head = el("tr", {}, ...["step", "episodes", "pass rate", "mean |A|", "group"].map((h) => el("th", { scope: "col" }, h)));
  const rows = steps.map((s) =>
    el(
      "tr",
      {},
      el("td", { class: "num" }, el("a", { href: s.batch_url }, String(s.step))),
      el("td", { class: "num" }, s.n_kept < s.n ? `${s.n} (${s.n_kept} kept)` : String(s.n)),
      el("td", { class: "num" }, fmt(s.pass_rate)),
      el("td", { class: "num" }, fmt(s.mean_abs_adv)),
      el("td", {}, s.group_url ? el("a", { href: s.group_url }, s.group) : `${s.group ?? "—"} (not kept)`),
    ),
  );
  $("p-steps").replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
}

async function main() {
  try {
    const p = await fetchJSON(init.api);
    $("p-text").textContent = p.prompt;
    const n = p.steps.length;
    $("p-meta").textContent = `in ${n} step${n === 1 ? "" : "s"} · ${p.steps.reduce((a, s) => a + s.n, 0)} episodes`;
    figure($("fig-pass"), p.steps, "pass_rate", "pass rate", true);
    figure($("fig-adv"), p.steps, "mean_abs_adv", "mean |A|", false);
    table(p.steps);
  } catch (e) {
    const box = $("error");
    box.hidden = false;
    box.textContent = e.describe ? e.describe() : String(e);
    $("p-meta").textContent = "";
  }
  $("p-figs").dataset.ready = "1";
}

main();
