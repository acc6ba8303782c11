// The batch figures (a library: batch.js and talk.js draw them; importing runs no page code):
// the reward histogram, batch whitening vs group centering, the pass rate per group.
import { $, plot } from "./page.js";

const POS = "rgb(33,102,172)";
const NEG = "rgb(178,24,43)";

/** Normalise the API's whiten_vs_center into [{slug, group, reward, whiten, center}] if we can. */
function wvcRows(diag, eps) {
  const w = diag && diag.whiten_vs_center;
  if (w && Array.isArray(w.episodes) && w.episodes.length && "batch_whiten" in w.episodes[0]) {
    return w.episodes.map((e) => ({ slug: e.slug, group: e.group, reward: e.score, whiten: e.batch_whiten, center: e.group_center }));
  }
  if (w && Array.isArray(w.batch_whiten) && Array.isArray(w.group_center) && w.batch_whiten.length === eps.length) {
    return eps.map((e, i) => ({ slug: e.slug, group: e.group, reward: e.reward, whiten: w.batch_whiten[i], center: w.group_center[i] }));
  }
  return [];
}

function histogram(diag) {
  const h = diag && diag.reward_histogram;
  if (h) {
    const edges = h.edges || h.bin_edges || h.bins;
    const counts = h.counts || h.count;
    if (Array.isArray(edges) && Array.isArray(counts) && edges.length === counts.length + 1) {
      const x = counts.map((_, i) => (edges[i] + edges[i + 1]) / 2);
      const width = counts.map((_, i) => edges[i + 1] - edges[i]);
      return [{ type: "bar", x, y: counts, width, marker: { color: POS }, name: "episodes" }];
    }
    if (Array.isArray(h.values) && Array.isArray(counts)) {
      return [{ type: "bar", x: h.values, y: counts, marker: { color: POS }, name: "episodes" }];
    }
  }
  return [];
}

export function figHist(node, b) {
  plot(node, histogram(b.diagnostics), { height: 320, xaxis: { title: { text: "reward" } }, yaxis: { title: { text: "episodes" } }, bargap: 0.05 }, `batch-${b.id}-rewards`);
}

/** Tick positions for a category axis of ``n`` bars in ``width`` px, at the first bar of each
 * run of equal keys, at most one per ``minGap`` px (the labels never overlap, whatever the
 * number of episodes: the hover names each bar's episode). */
export function sparseTicks(keys, width, minGap) {
  const step = width / Math.max(keys.length, 1);
  const out = [];
  let last = -Infinity;
  keys.forEach((k, i) => {
    if (i > 0 && k === keys[i - 1]) return;
    const x = (i + 0.5) * step;
    if (x - last < minGap) return;
    out.push(i);
    last = x;
  });
  return out;
}

// A tick label's width at 13 px, rotated by 30° (upper bound: 7.5 px per character).
const tickGap = (texts) => 0.87 * 7.5 * Math.max(1, ...texts.map((t) => t.length)) + 0.5 * 16 + 8;

export function figWhiten(node, b, height = 320) {
  const wvc = wvcRows(b.diagnostics, b.episodes || []).slice().sort((p, q) => String(p.group).localeCompare(String(q.group)) || p.reward - q.reward);
  const labels = wvc.map((r, i) => `${r.group} · ${i}`);
  const target = typeof node === "string" ? $(node) : node;
  // The plot area: the box less the margins (56 + 16 px).
  const width = Math.max(200, (target.clientWidth || 640) - 72);
  const groups = wvc.map((r) => String(r.group));
  const ticks = sparseTicks(groups, width, tickGap(groups));
  plot(
    node,
    [
      { type: "bar", name: "batch whitening", x: labels, y: wvc.map((r) => r.whiten), marker: { color: NEG }, customdata: wvc.map((r) => r.slug), hovertemplate: "%{x}<br>batch whiten %{y:.3f}<extra>%{customdata}</extra>" },
      { type: "bar", name: "group centering", x: labels, y: wvc.map((r) => r.center), marker: { color: POS }, customdata: wvc.map((r) => r.slug), hovertemplate: "%{x}<br>group center %{y:.3f}<extra>%{customdata}</extra>" },
    ],
    {
      height,
      barmode: "group",
      // One tick per group (at its first episode), fewer when they would not fit.
      xaxis: {
        type: "category",
        tickmode: "array",
        tickvals: ticks.map((i) => labels[i]),
        ticktext: ticks.map((i) => groups[i]),
        tickangle: -30,
        automargin: true,
      }, yaxis: { title: { text: "advantage" } }, legend: { orientation: "h", y: 1.12 } },
    `batch-${b.id}-whiten-vs-center`,
  );
}

/** A group's label for display: ungrouped episodes (group null) are groups of one, each its own. */
export function groupLabel(g, i) {
  return g.group ?? `(no group ${i + 1})`;
}

export function figGroups(node, b, height = 320) {
  const groups = (b.diagnostics && b.diagnostics.groups) || [];
  const x = groups.map((g, i) => String(groupLabel(g, i)));
  const target = typeof node === "string" ? $(node) : node;
  const ticks = sparseTicks(x, Math.max(200, (target.clientWidth || 640) - 72), tickGap(x));
  plot(
    node,
    [
      {
        type: "bar",
        x,
        y: groups.map((g) => g.pass_rate),
        marker: { color: groups.map((g) => (g.zero_variance ? "#999" : POS)), pattern: { shape: groups.map((g) => (g.zero_variance ? "/" : "")) } },
        hovertemplate: "group %{x}<br>pass rate %{y:.2f}<extra></extra>",
      },
    ],
    {
      height,
      yaxis: { title: { text: "pass rate" }, range: [0, 1.05] },
      // Every group's label while they fit, fewer (evenly spaced) beyond: the hover names each bar.
      xaxis: { type: "category", tickmode: "array", tickvals: ticks.map((i) => x[i]), ticktext: ticks.map((i) => x[i]), tickangle: -30, automargin: true },
    },
    `batch-${b.id}-groups`,
  );
}
