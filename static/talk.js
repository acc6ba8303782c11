// Talk mode: keys step through /talk/{n}; each step's view is resolved on the demo data by batch name.
import { attemptsTable } from "./attempts.js";
import { figGroups, figWhiten } from "./batch_charts.js";
import { TokenStrip, maxAbs, naiveGae } from "./strip.js";
import { el, fetchJSON, fmt, queryString, readInitial, urls, viewPairs } from "./util.js";

const init = readInitial();
const view = init.view || { type: "text" };
const box = document.getElementById("talk-view");
const defaults = init.schemes.defaults;

function go(url) {
  if (url) location.assign(url);
}

document.addEventListener("keydown", (e) => {
  if (e.altKey || e.ctrlKey || e.metaKey) return;
  // Inside the strip, arrows move the token cursor; PageUp/PageDown still step.
  const inStrip = e.target instanceof HTMLCanvasElement;
  const k = e.key;
  if (k === "PageDown" || (!inStrip && (k === "ArrowRight" || k === "ArrowDown" || k === " "))) {
    e.preventDefault();
    go(init.next);
  } else if (k === "PageUp" || (!inStrip && (k === "ArrowLeft" || k === "ArrowUp"))) {
    e.preventDefault();
    go(init.prev);
  } else if (k === "Home" && !inStrip) {
    go(urls.talk(1));
  } else if (k === "End" && !inStrip) {
    go(urls.talk(init.n_steps));
  } else if (k === "Escape" && !document.fullscreenElement) {
    go(urls.home());
  } else if ((k === "f" || k === "F") && !inStrip) {
    // Full screen on request (browsers only allow it from a user gesture).
    if (document.fullscreenElement) document.exitFullscreen();
    else document.documentElement.requestFullscreen().catch(() => {});
  }
});

/** The first batch whose name matches one of `names` (exact match first), with its episodes. */
async function findBatch(names) {
  for (const name of names) {
    const body = await fetchJSON(urls.apiBatches(`q=${encodeURIComponent(name)}`));
    const list = Array.isArray(body) ? body : body.batches || body.items || [];
    const hit = list.find((b) => b.name === name) || list.find((b) => (b.name || "").includes(name));
    if (hit) return fetchJSON(urls.apiBatch(hit.id));
  }
  throw new Error(`demo batch ${names.join(" / ")} not found: start the server with --demo (or upload it)`);
}

function pickEpisode(batch, pick) {
  const eps = batch.episodes || [];
  if (pick === "success") return eps.find((e) => e.passed) || eps[0];
  return eps[0];
}

async function showStrip() {
  const batch = await findBatch(view.batch);
  const ep = pickEpisode(batch, view.pick);
  let schemes = view.schemes.slice();
  const q = () => queryString(viewPairs({ ...defaults, ...view, schemes }, init.query_keys));
  let d;
  try {
    d = await fetchJSON(urls.apiAdvantages(ep.slug, q()));
  } catch (err) {
    // `oracle` needs the episode's true values; drop it rather than show nothing.
    if (!schemes.includes("oracle")) throw err;
    schemes = schemes.filter((s) => s !== "oracle");
    d = await fetchJSON(urls.apiAdvantages(ep.slug, q()));
  }
  const rows = d.schemes.map((s) => ({ name: s.name, label: s.label || s.name, advantages: s.advantages }));
  let naiveNote = null;
  if (view.naive) {
    // The API nulls values off-policy; the naive recursion needs the raw (garbage) tool values.
    const raw = await fetchJSON(urls.apiEpisode(ep.slug));
    const values = raw.values || d.tokens.map(() => 0);
    const naive = naiveGae(d.rewards, values, view.gamma, view.lam);
    rows.push({ name: "naive", label: "naive (bug)", advantages: naive.map((v, i) => (d.kinds[i] === "policy" ? v : null)) });
    const masked = rows[0].advantages;
    const ends = d.turns.map((t) => t.end - 1);
    naiveNote = el(
      "div",
      { class: "naive-box", id: "naive-box" },
      ends
        .slice(0, 3)
        .map((i, k) => `call ${k + 1}, last token (position ${i}): masked ${fmt(masked[i], 2)}, naive ${fmt(naive[i], 2)}`)
        .join(" · "),
    );
  }
  const holder = el("div", { class: "strip", id: "strip", "data-ready": "0" });
  const legend = el("p", { class: "hint" }, `Scale ±${fmt(maxAbs(rows, d.kinds))}: blue positive, red negative, gray = prompt / tool (click a tool cell to expand).`);
  const link = el("a", { href: urls.episode(ep.slug, q()) }, "Open this episode with all controls →");
  box.replaceChildren(holder, legend);
  if (naiveNote) box.append(naiveNote);
  box.append(el("p", {}, link));
  const strip = new TokenStrip(holder, { collapse: ["tool", "prompt"], fontPx: 18, cellH: 30, labelW: 170, maxChars: 16, maxHeight: Math.round(window.innerHeight * 0.42) });
  strip.setData(d, rows, {});
  window.__strip = strip;
  holder.dataset.ready = "1";
}

async function showGroup() {
  const batch = await findBatch(view.batch);
  const groups = (batch.diagnostics && batch.diagnostics.groups) || [];
  // The most instructive group: mixed outcomes with the fewest successes (std scaling is largest).
  const mixed = groups.filter((g) => !g.zero_variance).sort((a, b) => a.pass_rate - b.pass_rate);
  const g0 = mixed[0] || groups[0];
  if (!g0) throw new Error("the demo batch has no groups");
  const g = await fetchJSON(urls.apiGroup(batch.id, g0.group));
  box.replaceChildren(
    el("p", {}, `Task group ${g.group}: ${g.episodes.length} attempts, pass rate ${fmt(g0.pass_rate, 2)}.`),
    el("div", { class: "table-wrap" }, attemptsTable(g, init.schemes.group_baselines)),
    el("p", {}, el("a", { href: urls.group(batch.ref ?? batch.id, g.group) }, "Open the group page →")),
  );
}

async function showBatch() {
  const batch = await findBatch(view.batch);
  const diag = batch.diagnostics || {};
  const fig = el("div", { class: "plot" });
  const h = Math.round(window.innerHeight * 0.4);
  if (view.figure === "zero_variance") {
    const zv = (diag.groups || []).filter((g) => g.zero_variance).length;
    box.replaceChildren(
      el("p", { class: "big-number" }, `This batch: ${fmt(100 * (diag.zero_variance_share ?? 0), 0)}% of episodes in zero-variance groups (${zv} of ${(diag.groups || []).length} groups).`),
      fig,
    );
    figGroups(fig, batch, h);
  } else {
    box.replaceChildren(fig);
    figWhiten(fig, batch, h);
  }
  box.append(el("p", {}, el("a", { href: urls.batch(batch.ref ?? batch.id) }, "Open the batch page →")));
}

const shows = { strip: showStrip, group: showGroup, batch: showBatch };
if (shows[view.type]) {
  shows[view.type]()
    .then(() => (document.body.dataset.ready = "1"))
    .catch((err) => {
      box.replaceChildren(el("p", { class: "error", role: "alert" }, err.describe ? err.describe() : String(err.message || err)));
      document.body.dataset.ready = "error";
    });
} else {
  document.body.dataset.ready = "1";
}
