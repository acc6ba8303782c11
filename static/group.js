// Group page: the G attempts side by side, outcome advantage under every group baseline.
import { attemptsTable } from "./attempts.js";
import { $, SCHEME_COLORS, plot } from "./page.js";
import { csvCell, download, el, fetchJSON, fmt, markOpen, readInitial, urls } from "./util.js";

const init = readInitial();
// The baselines compared side by side come from the server (app/core/schemes.py), in its order.
const BASELINES = init.schemes.group_baselines;

function render(g) {
  const eps = g.episodes || [];
  $("g-name").textContent = String(g.group);
  const meta = $("g-meta");
  const passes = eps.filter((e) => e.passed).length;
  meta.replaceChildren(el("a", { href: urls.batch(init.batch_id) }, init.batch_name || `batch ${init.batch_id}`), ` · ${eps.length} attempts · ${passes} passed`);
  $("zv-banner").replaceChildren(
    ...(g.zero_variance ? [el("div", { class: "banner", id: "zv-why" }, g.why || "Zero-variance group: every advantage is exactly 0, this group contributes no gradient.")] : []),
  );
  $("attempts").replaceWith(attemptsTable(g, BASELINES));
  const x = eps.map((_, i) => `#${i + 1}`);
  // One colour per baseline, none of them blue or red: above, blue and red mean the sign.
  const traces = BASELINES.map((b, k) => ({ type: "bar", name: b, x, y: eps.map((e) => e.advantages?.[b] ?? null), marker: { color: SCHEME_COLORS[k % SCHEME_COLORS.length] } }));
  plot(
    "fig-adv",
    traces,
    { barmode: "group", height: 340, xaxis: { type: "category", title: { text: "attempt" } }, yaxis: { title: { text: "outcome advantage" } }, legend: { orientation: "h", y: 1.15 } },
    `group-${g.group}`,
  );
  renderCalls(eps);
  document.body.dataset.ready = "1";
  markOpen();
}

/** What each attempt did, call by call (the group API's `calls`, from each episode's meta.calls). */
function renderCalls(eps) {
  const box = $("calls");
  if (!box || !eps.length || !eps.some((e) => Array.isArray(e.calls))) return;
  const t = el("table", { class: "data", id: "calls-table" });
  t.append(el("thead", {}, el("tr", {}, ["attempt", "reward", "calls"].map((h) => el("th", { scope: "col" }, h)))));
  const body = el("tbody");
  eps.forEach((e, i) => {
    const calls = (Array.isArray(e.calls) ? e.calls : []).map((c) =>
      el("span", { class: `effect effect-${c.effect || "other"}`, title: c.effect || "" }, c.action || c.effect || "call"),
    );
    body.append(
      el(
        "tr",
        {},
        el("td", {}, el("a", { href: urls.episode(e.slug) }, `#${i + 1}`)),
        el("td", { class: "num" }, fmt(e.reward)),
        el("td", { class: "chips" }, calls),
      ),
    );
  });
  t.append(body);
  box.replaceChildren(el("h2", {}, "What each attempt did"), el("div", { class: "table-wrap" }, t));
}

let group = null;
fetchJSON(init.api, { headers: {} }) // the preloaded URL, asked for the same way
  .then((g) => {
    group = g;
    render(g);
  })
  .catch((err) => {
    $("error").textContent = err.describe ? err.describe() : String(err);
    $("error").hidden = false;
  });
$("csv-btn").addEventListener("click", () => {
  if (!group) return;
  const lines = [["slug", "reward", ...BASELINES].join(",")];
  for (const e of group.episodes) lines.push([csvCell(e.slug), csvCell(e.reward), ...BASELINES.map((b) => csvCell(e.advantages?.[b]))].join(","));
  download(new Blob([lines.join("\n") + "\n"], { type: "text/csv" }), `creditlens-group-${group.group}.csv`);
});
