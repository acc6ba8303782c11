// The batch figures (a library: batch.js and talk.js draw them; importing runs no page code):
// the reward histogram, batch whitening vs group centering, the pass rate per group.
import { $, SCHEME_COLORS, clip, plot } from "./page.js";

// Blue and red mean the sign of an advantage on every page: these figures' series are not signs.
const COUNT = "#5a5a5a"; // counts and shares
const [WHITEN, CENTER] = SCHEME_COLORS;
const ZERO_VARIANCE = "#9a9a9a";
// A zero-variance group's bar is drawn at least this tall (an all-fail group's pass rate is 0).
const MIN_BAR = 0.04;

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
      return [{ type: "bar", x, y: counts, width, marker: { color: COUNT }, name: "episodes" }];
    }
    if (Array.isArray(h.values) && Array.isArray(counts)) {
      return [{ type: "bar", x: h.values, y: counts, marker: { color: COUNT }, name: "episodes" }];
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

// Group names stand upright under the axis: a label then takes one line's height (11 px text,
// 13 px with a gap) of the axis, whatever its length, so 20 groups fit in 260 px.
const TICK_GAP = 13;
const TICK_CHARS = 18; // longer names are cut on the axis (the hover has the whole name)

export function figWhiten(node, b, height = 320) {
  const wvc = wvcRows(b.diagnostics, b.episodes || []).slice().sort((p, q) => String(p.group).localeCompare(String(q.group)) || p.reward - q.reward);
  const labels = wvc.map((r, i) => `${r.group} · ${i}`);
  const target = typeof node === "string" ? $(node) : node;
  // The plot area: the box less the margins (56 + 16 px).
  const width = Math.max(200, (target.clientWidth || 640) - 72);
  const groups = wvc.map((r) => String(r.group));
  const ticks = sparseTicks(groups, width, TICK_GAP);
  plot(
    node,
    [
      { type: "bar", name: "batch whitening", x: labels, y: wvc.map((r) => r.whiten), marker: { color: WHITEN }, customdata: wvc.map((r) => r.slug), hovertemplate: "%{x}<br>batch whiten %{y:.3f}<extra>%{customdata}</extra>" },
      { type: "bar", name: "group centering", x: labels, y: wvc.map((r) => r.center), marker: { color: CENTER }, customdata: wvc.map((r) => r.slug), hovertemplate: "%{x}<br>group center %{y:.3f}<extra>%{customdata}</extra>" },
    ],
    {
      height,
      barmode: "group",
      // One tick per group (at its first episode), fewer when they would not fit.
      xaxis: {
        type: "category",
        tickmode: "array",
        tickvals: ticks.map((i) => labels[i]),
        ticktext: ticks.map((i) => clip(groups[i], TICK_CHARS)),
        tickangle: -90,
        tickfont: { size: 11 },
        automargin: true,
        title: { text: "group (episodes in it side by side)" },
      }, yaxis: { title: { text: "outcome advantage" } }, legend: { orientation: "h", y: 1.12 } },
    `batch-${b.id}-whiten-vs-center`,
  );
}

/** A group's label for display: ungrouped episodes (group null) are groups of one, each its own. */
export function groupLabel(g, i) {
  return g.group ?? `(no group ${i + 1})`;
}

export function figGroups(node, b, height = 320) {
  // One bar per group, sideways, so every group's name is on its axis however many there are;
  // a zero-variance group's bar is grey, hatched and never thinner than MIN_BAR.
  const groups = (b.diagnostics && b.diagnostics.groups) || [];
  const y = groups.map((g, i) => String(groupLabel(g, i)));
  const trace = (zv) => {
    const pick = groups.map((g) => Boolean(g.zero_variance) === zv);
    return {
      type: "bar",
      orientation: "h",
      name: zv ? "zero variance: no gradient" : "mixed outcomes",
      y: y.filter((_, i) => pick[i]),
      x: groups.filter((_, i) => pick[i]).map((g) => (zv ? Math.max(MIN_BAR, g.pass_rate) : g.pass_rate)),
      customdata: groups.filter((_, i) => pick[i]).map((g) => g.pass_rate),
      marker: zv ? { color: ZERO_VARIANCE, pattern: { shape: "/", fgcolor: "#333" }, line: { color: "#333", width: 1 } } : { color: CENTER },
      hovertemplate: `group %{y}<br>pass rate %{customdata:.2f}${zv ? " (zero variance)" : ""}<extra></extra>`,
    };
  };
  const rows = Math.max(1, y.length);
  plot(
    node,
    [trace(false), trace(true)],
    {
      height: Math.max(height, 60 + 18 * rows),
      barmode: "overlay",
      xaxis: { title: { text: "pass rate" }, range: [0, 1.05] },
      yaxis: { type: "category", categoryarray: y.slice().reverse(), categoryorder: "array", automargin: true, title: { text: "group" }, dtick: 1 },
      legend: { orientation: "h", y: 1.02, yanchor: "bottom" },
      margin: { l: 60, r: 20, t: 30, b: 50 },
    },
    `batch-${b.id}-groups`,
  );
}
