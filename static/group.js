// Group page: the G attempts side by side, outcome advantage under every group baseline.
import { advColor, csvCell, download, el, fetchJSON, fmt, inkOn, markOpen, plotlyConfig, readInitial, rgb, urls } from "./util.js";

const init = readInitial();
const $ = (id) => document.getElementById(id);
// The baselines compared side by side come from the server (app/core/schemes.py), in its order.
const BASELINES = init.schemes.group_baselines;
const PALETTE = ["#1d4f91", "#b2182b", "#e08214", "#4d9221", "#762a83", "#35978f"];

/** Rows = baselines, columns = attempts (the table a reader scans across). */
export function attemptsTable(g, batchId) {
  const eps = g.episodes || [];
  let scale = 0;
  for (const e of eps) for (const b of BASELINES) scale = Math.max(scale, Math.abs(e.advantages?.[b] ?? 0));
  const t = el("table", { class: "data attempts", id: "attempts" });
  t.append(
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        el("th", { scope: "col" }, "attempt"),
        eps.map((e, i) => el("th", { scope: "col", class: "num" }, el("a", { href: urls.episode(e.slug) }, `#${i + 1}`))),
      ),
    ),
  );
  const body = el("tbody");
  body.append(el("tr", {}, el("th", { scope: "row" }, "reward"), eps.map((e) => el("td", { class: "num" }, fmt(e.reward)))));
  for (const b of BASELINES) {
    body.append(
      el(
        "tr",
        { dataset: { baseline: b } },
        el("th", { scope: "row" }, b),
        eps.map((e) => {
          const v = e.advantages?.[b];
          const td = el("td", { class: "num adv" }, fmt(v));
          const c = advColor(v, scale);
          if (c) {
            td.style.background = rgb(c);
            td.style.color = inkOn(c);
          }
          return td;
        }),
      ),
    );
  }
  t.append(body);
  return t;
}

function render(g) {
  const eps = g.episodes || [];
  $("g-name").textContent = String(g.group);
  document.title = `Group ${g.group} · creditlens`;
  const meta = $("g-meta");
  const passes = eps.filter((e) => e.passed).length;
  meta.replaceChildren(el("a", { href: urls.batch(init.batch_id) }, `batch ${init.batch_id}`), ` · ${eps.length} attempts · ${passes} passed`);
  $("zv-banner").replaceChildren(
    ...(g.zero_variance ? [el("div", { class: "banner", id: "zv-why" }, g.why || "Zero-variance group: every advantage is exactly 0, this group contributes no gradient.")] : []),
  );
  $("attempts").replaceWith(attemptsTable(g, init.batch_id));
  if (window.Plotly) {
    const x = eps.map((_, i) => `#${i + 1}`);
    const traces = BASELINES.map((b, k) => ({ type: "bar", name: b, x, y: eps.map((e) => e.advantages?.[b] ?? null), marker: { color: PALETTE[k % PALETTE.length] } }));
    window.Plotly.newPlot(
      $("fig-adv"),
      traces,
      { barmode: "group", height: 340, xaxis: { type: "category" }, margin: { l: 56, r: 16, t: 10, b: 40 }, yaxis: { title: { text: "outcome advantage" } }, legend: { orientation: "h", y: 1.15 } },
      plotlyConfig(`group-${g.group}`),
    );
  } else {
    $("fig-adv").textContent = `Plotly is not available (${urls.plotlyBasic}).`;
  }
  document.body.dataset.ready = "1";
  markOpen();
  renderCalls(eps);
}

/** What each attempt did, call by call (meta.calls from each episode, when the data says). */
async function renderCalls(eps) {
  const box = $("calls");
  if (!box || !eps.length || eps.length > 64) return;
  const full = await Promise.all(eps.map((e) => fetchJSON(urls.apiEpisode(e.slug)).catch(() => null)));
  if (!full.some((f) => f && Array.isArray(f.meta?.calls))) return;
  const t = el("table", { class: "data", id: "calls-table" });
  t.append(el("thead", {}, el("tr", {}, ["attempt", "reward", "calls"].map((h) => el("th", { scope: "col" }, h)))));
  const body = el("tbody");
  full.forEach((f, i) => {
    const calls = (f && f.meta && Array.isArray(f.meta.calls) ? f.meta.calls : []).map((c) =>
      el("span", { class: `effect effect-${c.effect || "other"}`, title: c.effect || "" }, c.action || c.effect || "call"),
    );
    body.append(
      el(
        "tr",
        {},
        el("td", {}, el("a", { href: urls.episode(eps[i].slug) }, `#${i + 1}`)),
        el("td", { class: "num" }, fmt(eps[i].reward)),
        el("td", { class: "chips" }, calls),
      ),
    );
  });
  t.append(body);
  box.replaceChildren(el("h2", {}, "What each attempt did"), el("div", { class: "table-wrap" }, t));
}

let group = null;
if ($("g-name")) fetchJSON(init.api)
  .then((g) => {
    group = g;
    render(g);
  })
  .catch((err) => {
    $("error").textContent = err.describe ? err.describe() : String(err);
    $("error").hidden = false;
  });
$("g-name") && $("csv-btn").addEventListener("click", () => {
  if (!group) return;
  const lines = [["slug", "reward", ...BASELINES].join(",")];
  for (const e of group.episodes) lines.push([csvCell(e.slug), csvCell(e.reward), ...BASELINES.map((b) => csvCell(e.advantages?.[b]))].join(","));
  download(new Blob([lines.join("\n") + "\n"], { type: "text/csv" }), `creditlens-group-${group.group}.csv`);
});
