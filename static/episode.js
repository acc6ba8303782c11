// Episode page: controls <-> URL query string <-> /api/episodes/{slug}/advantages -> strips.
import { Overview } from "./overview.js";
import { renderDrift } from "./drift.js";
import { TokenStrip, maxAbs } from "./strip.js";
import { $, SCHEME_COLORS, clip, plot } from "./page.js";
import { copyText, csvCell, debounce, download, el, fetchJSON, fmt, inkOn, markOpen, qnum, queryString, readInitial, rgb, signalColor, signalGradient, signalScale, urls, useSignals, viewPairs } from "./util.js";

const init = readInitial();
useSignals(init.signals); // how each signal row is drawn (app/core/signals.py)
const slug = init.slug;
const state = { ...init.view, open: new Set(init.view.open || []), signals: [...(init.view.signals || [])] };

const stripBox = $("strip");
let data = null;
const explicitCritic = new URLSearchParams(location.search).has("critic");
// A link without `scheme=` opens the episode's default rows (the uploaded advantages and the
// audit's reference when it has them, app/core/views.py default_rows).
const explicitSchemes = new URLSearchParams(location.search).has("scheme");
const AUDIT_ROWS = ["audit_reference", "audit_diff"];
let firstRender = true;
let inflight = null;

/** The canonical query string: EpisodeView.query()'s keys and order (init.query_keys). */
function query({ api = false } = {}) {
  return queryString(viewPairs(state, init.query_keys, { api }));
}

function apiUrl() {
  return urls.apiAdvantages(slug, query({ api: true }));
}

function syncUrl() {
  const url = `${location.pathname}?${query()}`;
  history.replaceState(null, "", url);
  $("json-link").href = `${location.pathname}?${query()}&format=json`;
}

const strip = new TokenStrip(stripBox, {
  // On a phone the prompt is one cell too (a click opens it): the calls come first.
  collapse: window.matchMedia("(max-width: 600px)").matches ? ["tool", "prompt"] : ["tool"],
  onToggleSpan: (_start, _open, openSet) => {
    state.open = openSet;
    syncUrl();
  },
  onCursor: (i) => {
    state.tok = i;
    syncUrl();
  },
});
window.__strip = strip; // test and console hook: cellAt(i), pixelAt(i, row)

const overview = new Overview($("overview"), {
  onPick: (i) => {
    strip.setCursor(i);
    strip.canvas.focus({ preventScroll: true });
  },
  status: $("overview-status"),
});
window.__overview = overview; // test hook: segs, pixelAt(k, row), pointOf(k)

/** The strips' visible token range -> the overview's frame. */
function syncOverview() {
  if (!strip.lines || !strip.lines.length) return;
  const s = strip.scroller;
  const L0 = Math.max(0, Math.min(strip.lines.length - 1, Math.floor(s.scrollTop / strip.blockH)));
  const L1 = Math.max(L0, Math.min(strip.lines.length - 1, Math.floor((s.scrollTop + s.clientHeight) / strip.blockH)));
  const first = strip.items[strip.lines[L0].first].i;
  const last = strip.items[strip.lines[L1].last - 1].end;
  overview.setView(first, last);
}
let ovRaf = 0;
strip.scroller.addEventListener(
  "scroll",
  () => {
    if (ovRaf) return;
    ovRaf = requestAnimationFrame(() => {
      ovRaf = 0;
      syncOverview();
    });
  },
  { passive: true },
);

function showError(msg) {
  const box = $("error");
  box.textContent = msg || "";
  box.hidden = !msg;
}

async function load() {
  if (inflight) inflight.abort();
  const ctrl = new AbortController();
  inflight = ctrl;
  stripBox.dataset.ready = "0";
  stripBox.setAttribute("aria-busy", "true");
  try {
    // The first request is the server-built URL the page preloads (same URL, no extra headers).
    const first = apiUrl() === init.api;
    const d = await fetchJSON(apiUrl(), first ? { signal: ctrl.signal, headers: {} } : { signal: ctrl.signal });
    if (ctrl.signal.aborted) return;
    data = d;
    showError("");
    render();
    // The server showed a link's critic-reading rows with V = 0 (the episode has no values): say so.
    if (first && init.critic_fallback) $("copy-status").textContent = "This episode has no critic values: showing critic = zero.";
  } catch (err) {
    if (err.name === "AbortError") return;
    // A link without an explicit critic on an episode without values: fall back to V = 0, say so.
    const noCritic = init.schemes.no_critic;
    if (err.code === "no_values" && state.critic !== noCritic && !explicitCritic) {
      state.critic = noCritic;
      $("critic").value = noCritic;
      syncUrl();
      await load();
      $("copy-status").textContent = "This episode has no critic values: showing critic = zero.";
      return;
    }
    // The default rows' audit cannot run on this batch (e.g. too large): show the uploaded row alone.
    if (!data && !explicitSchemes && err.status === 422 && state.schemes.some((s) => AUDIT_ROWS.includes(s))) {
      restoreSchemes(state.schemes.filter((s) => !AUDIT_ROWS.includes(s)));
      await load();
      showError(`The audit rows are not available here: ${err.describe()}`);
      return;
    }
    // A row that cannot run on this episode (e.g. ReMax without baselines): keep the last good
    // view, untick the rows it did not have, and say why next to the controls.
    if (data && err.field === "scheme" && err.status === 422) {
      restoreSchemes(data.params.schemes);
      showError(err.describe());
      stripBox.dataset.ready = "1";
      return;
    }
    showError(err.describe ? err.describe() : String(err));
    stripBox.dataset.ready = "error";
  } finally {
    if (inflight === ctrl) inflight = null;
    stripBox.removeAttribute("aria-busy");
  }
}
const reload = debounce(load, 120);

function restoreSchemes(schemes) {
  state.schemes = [...schemes];
  const on = new Set(schemes);
  for (const b of document.querySelectorAll('input[name="scheme"]')) b.checked = on.has(b.value);
  $("n-rows").textContent = String(state.schemes.length + state.signals.length);
  syncUrl();
}

// Rows on their own diverging scale (not the shared one): uploaded − reference is near zero
// where the trainer agrees with the audit's best match, and would vanish on the advantages' scale.
const OWN_SCALE = new Set(["audit_diff", "loss_weights"]);
const DIFF_FLOOR = 1e-5; // the audit's per-token tolerance: smaller differences stay pale

function rowsOf(d) {
  const rows = d.schemes.map((s) => {
    // extras: per-token by-products a row carries (gigpo's step_group_size), shown in the tooltip.
    const row = { name: s.name, label: s.label || s.name, advantages: s.advantages, extras: s.extras || null };
    if (OWN_SCALE.has(s.name)) row.scale = Math.max(DIFF_FLOOR, maxAbs([row], d.kinds));
    // The trainer's numbers are served on every token: nonzero off-policy cells are outlined.
    if (s.name === "uploaded") row.everywhere = true;
    return row;
  });
  // Signal rows under the advantage rows, each on its own scale and colours (util.js).
  for (const g of d.signals || []) {
    const scale = signalScale(g.name, g.values, d.kinds);
    rows.push({ name: g.name, label: g.label, advantages: g.values, signal: g.scale, scale, color: (v) => signalColor(g.name, v, scale) });
  }
  return rows;
}

/** Per call, the mean of a row over the call's policy tokens (the API gives the advantage rows'
 * means; the signal rows' are computed here, once per answer). */
function callMean(d, row, t) {
  if (!row.signal) return t.means ? t.means[row.name] : null;
  let s = 0;
  let c = 0;
  for (let i = t.start; i < t.end; i++) {
    const v = row.advantages[i];
    if (d.kinds[i] !== "policy" || v === null || !Number.isFinite(v)) continue;
    s += v;
    c++;
  }
  return c ? s / c : null;
}

/** position -> [{code, severity, message}] of the audit findings naming this episode's tokens. */
function marksOf(d) {
  const marks = new Map();
  // The loss_weights row's clipped / zeroed tokens come as marks too (severity info).
  for (const m of [...((d.audit && d.audit.marks) || []), ...((d.loss && d.loss.marks) || [])]) {
    for (const p of m.positions) {
      if (!marks.has(p)) marks.set(p, []);
      marks.get(p).push({ code: m.code, severity: m.severity, message: m.message });
    }
  }
  return marks;
}

// What γ and λ change: rows that discount per step read them; rows with their own γ (GiGPO's) or
// no steps (outcome baselines, the uploaded and audit rows) do not, and the controls say so.
const CATALOG = new Map((init.schemes.schemes || []).map((s) => [s.name, s]));
const NO_STEPS = new Set(["uploaded", "audit_reference", "audit_diff", "loss_weights", "oracle", "monte_carlo"]);

function usesGamma(name) {
  const s = CATALOG.get(name);
  if (!s || NO_STEPS.has(name) || s.kind === "outcome" || "gamma" in (s.params || {})) return false;
  return (s.reads || []).includes("rewards");
}
const usesLam = (name) => usesGamma(name) && /gae/.test(name);

function renderControlNotes(d) {
  const names = d.schemes.map((s) => s.name);
  const note = (id, uses, what) => {
    const not = names.filter((n) => !uses(n));
    const own = what === "γ" ? not.filter((n) => "gamma" in ((CATALOG.get(n) || {}).params || {})) : [];
    const parts = [];
    if (!names.some(uses)) parts.push(`applies to no row shown`);
    else if (not.length) parts.push(`not used by ${not.filter((n) => !own.includes(n)).join(", ") || "—"}`);
    if (own.length && what === "γ") parts.push(`${own.join(", ")} uses its own γ (${own.map((n) => CATALOG.get(n).params.gamma).join(", ")})`);
    $(id).textContent = parts.filter((p) => !p.endsWith("—")).join("; ");
  };
  note("gamma-note", usesGamma, "γ");
  note("lam-note", usesLam, "λ");
  // The baseline picks the `outcome` row's; the critic feeds the rows that read values.
  $("baseline-note").textContent = names.includes("outcome") ? "" : "applies to the outcome row (not shown)";
  const readsValues = (n) => ((CATALOG.get(n) || {}).reads || []).includes("values");
  $("critic-note").textContent = names.some(readsValues) ? "" : "no row shown reads the critic";
}

/** The first position an error (else a warning) finding names: {position, code, severity} or null. */
function firstFinding(marks) {
  for (const sev of ["error", "warning"]) {
    const hits = [...marks].filter(([, ms]) => ms.some((m) => m.severity === sev)).map(([p]) => p);
    if (hits.length) {
      const p = Math.min(...hits);
      return { position: p, severity: sev, code: marks.get(p).find((m) => m.severity === sev).code };
    }
  }
  return null;
}

function render() {
  const d = data;
  const ep = d.episode || {};
  const meta = ep.meta || {};
  const task = ep.task || meta.task;
  $("ep-task").textContent = task ? `${task}` : "Episode";
  const nPolicy = d.kinds.filter((k) => k === "policy").length;
  const nTool = d.kinds.filter((k) => k === "tool").length;
  const parts = [
    `${d.n_tokens} ${meta.tokens === "words" ? "words" : "tokens"} (${nPolicy} policy, ${nTool} tool)`,
    `${d.turns.length} calls`,
    d.rewarded === false ? "no reward" : `reward ${fmt(ep.reward)}`,
    ep.truncated ? "truncated" : "terminated",
  ];
  if (d.group !== null && d.group !== undefined) parts.push(`group ${d.group}`);
  $("no-reward").hidden = d.rewarded !== false;
  // Token ids without a tokenizer are drawn as ⟨id⟩: say how to see text.
  $("no-text").hidden = !d.tokens.some((t) => /^⟨\d+⟩$/.test(t));
  $("word-tokens").hidden = meta.tokens !== "words"; // text split by the offline tokenizer
  const metaLine = $("ep-meta");
  metaLine.replaceChildren(parts.join(" · "), " · ");
  metaLine.append(el("a", { href: urls.batch(init.batch_ref ?? d.batch_id) }, `batch ${d.batch_id}`));
  if (d.group !== null && d.group !== undefined) {
    metaLine.append(" · ", el("a", { href: urls.group(init.batch_ref ?? d.batch_id, d.group) }, "compare the group"));
  }
  // The oracle row exists only for episodes that carry their true values.
  const oracle = document.querySelector('input[name="scheme"][value="oracle"]');
  if (oracle) oracle.closest("label").hidden = !Array.isArray(meta.turn_values);
  // Monte Carlo reads the same per-turn values.
  const mc = document.querySelector('input[name="scheme"][value="monte_carlo"]');
  if (mc) mc.closest("label").hidden = !Array.isArray(meta.turn_values);
  // The uploaded row and the audit rows need the trainer's own advantages (the API says so).
  for (const name of ["uploaded", "audit_reference", "audit_diff"]) {
    const box = document.querySelector(`input[name="scheme"][value="${name}"]`);
    if (box) box.closest("label").hidden = !d.has_advantages;
  }
  // Signal rows: offered only when the episode has their arrays.
  const have = new Set(d.available_signals || []);
  for (const box of document.querySelectorAll('input[name="signal"]')) box.closest("label").hidden = !have.has(box.value);
  $("no-signals").hidden = have.size > 0;

  const rows = rowsOf(d);
  const scale = maxAbs(rows.filter((r) => r.scale === undefined), d.kinds);
  $("legend-min").textContent = `−${fmt(scale)}`;
  $("legend-max").textContent = `+${fmt(scale)}`;
  const marks = marksOf(d);
  strip.setData(d, rows, { open: state.open, cursor: state.tok ?? null, scale, marks });
  renderAuditLegend(rows, marks);
  renderSignalLegend(rows);
  $("legend-off").hidden = !strip.offValues.some((m) => m.size);
  const flagged = firstRender ? firstFinding(marks) : null;
  firstRender = false;
  if (state.tok !== null && state.tok !== undefined) strip.scrollToToken(state.tok);
  else if (flagged) {
    // Opened without a cursor (a link from the run's episode search): start on the first token
    // an error or warning names, so the page opens on why the episode was flagged (its tool span open).
    const k = strip.spanOf[flagged.position];
    if (k >= 0 && !state.open.has(strip.spans[k].start)) {
      state.open.add(strip.spans[k].start);
      strip.setOpen(state.open);
    }
    strip.setCursor(flagged.position);
  }
  overview.setData(d, rows, strip);
  syncOverview();
  renderControlNotes(d);
  renderDrift($("drift-box"), d, (p) => strip.setCursor(p));
  jumps = jumpTables(d, rows);
  renderTopList(d, jumps.tokens);
  renderCalls(d, rows, scale);
  renderCallsChart();
  if (flagged && state.tok === flagged.position) $("overview-status").textContent = `cursor on the first token of the ${flagged.severity} ${flagged.code} (token ${flagged.position})`;
  stripBox.dataset.ready = "1";
  stripBox.dataset.query = query();
  markOpen();
}

/** The legend's note on the audit rows: the difference row's own scale and the finding marks. */
function renderAuditLegend(rows, marks) {
  let note = $("legend-audit");
  const own = rows.filter((r) => r.scale !== undefined && !r.signal); // signal rows: their own legend
  if (!own.length && !marks.size) {
    if (note) note.remove();
    return;
  }
  if (!note) {
    note = el("span", { class: "legend-note", id: "legend-audit" });
    $("legend").append(note);
  }
  const parts = own.map((r) => `${r.label}: own scale ±${fmt(r.scale)}`);
  if (marks.size) parts.push(`a bar under a token marks an audit finding (red error, orange warning, blue info)`);
  if (rows.some((r) => r.name === "loss_weights")) parts.push("loss weights: a blue bar marks a token the loss clipped, truncated or zeroed (hover it)");
  note.textContent = parts.join("; ");
}

/** The legend of the signal rows: each row's own scale, low to high. */
function renderSignalLegend(rows) {
  const box = $("legend-signals");
  const items = rows
    .filter((r) => r.signal)
    .map((r) => {
      const bar = el("span", { class: "legend-bar legend-bar-small", "aria-hidden": "true" });
      bar.style.background = signalGradient(r.name);
      let lo;
      let hi;
      if (r.name === "logprob") [lo, hi] = ["0", fmt(-r.scale)];
      else if (r.name === "entropy") [lo, hi] = ["0", fmt(r.scale)];
      else if (r.name === "ratio") [lo, hi] = [fmt(Math.exp(-r.scale)), fmt(Math.exp(r.scale))];
      else [lo, hi] = [fmt(-r.scale), `+${fmt(r.scale)}`];
      return el("span", { class: "legend-item", dataset: { signal: r.name } }, `${r.label}: `, el("span", { class: "legend-label" }, lo), bar, el("span", { class: "legend-label" }, hi));
    });
  box.replaceChildren(...items);
}

// ---- jumps: t/T by |advantage| of the token, n/N of the call, d/D where two rows disagree ----
let jumps = { ranking: [], disagree: [], tokens: [] };
let rankPos = -1;
let tokenPos = -1;
const TOP_TOKENS = 100; // ranked for t / T; the list shows the first TOP_SHOWN
const TOP_SHOWN = 8;

/** The policy tokens by largest |advantage| over the shown advantage rows on the shared scale
 * (not the difference or loss rows, which have their own): [{i, v, row}], the first TOP_TOKENS. */
function topTokens(d, rows) {
  const adv = rows.filter((r) => !r.signal && r.scale === undefined);
  const best = [];
  for (let i = 0; i < d.kinds.length; i++) {
    if (d.kinds[i] !== "policy") continue;
    let top = null;
    for (const r of adv) {
      const v = r.advantages[i];
      if (v !== null && Number.isFinite(v) && v !== 0 && (top === null || Math.abs(v) > Math.abs(top.v))) top = { i, v, row: r.label };
    }
    if (top) best.push(top);
  }
  best.sort((a, b) => Math.abs(b.v) - Math.abs(a.v) || a.i - b.i);
  return best.slice(0, TOP_TOKENS);
}

function renderTopList(d, tops) {
  const items = tops.slice(0, TOP_SHOWN).map((t, k) => {
    const b = el("button", { type: "button", class: "top-token", dataset: { tok: t.i } }, `#${k + 1} `, el("code", {}, clip(JSON.stringify(d.tokens[t.i]), 24)), ` ${t.v > 0 ? "+" : ""}${fmt(t.v)}`);
    b.title = `token ${t.i}, ${t.row}`;
    b.addEventListener("click", () => {
      tokenPos = k;
      jumpTo(t.i, `token ${t.i}: #${k + 1} by |advantage| (${fmt(t.v)} in ${t.row})`);
      strip.canvas.focus({ preventScroll: true });
    });
    return el("li", {}, b);
  });
  $("top-list").replaceChildren(...(items.length ? items : [el("li", { class: "hint" }, "No policy token has a nonzero advantage in the shown rows.")]));
}

/** Computed once per answer: calls ranked by |mean advantage| (over the shown advantage rows that
 * vary between calls, so a per-episode outcome row does not flatten the ranking), and the first
 * token of every run of policy tokens where two shown advantage rows have opposite signs. */
function jumpTables(d, rows) {
  const adv = rows.filter((r) => !r.signal);
  const varying = adv.filter((r) => {
    const ms = d.turns.map((t) => (t.means ? t.means[r.name] : null)).filter((v) => v !== null && Number.isFinite(v));
    return ms.some((v) => Math.abs(v - ms[0]) > 1e-12);
  });
  const use = varying.length ? varying : adv;
  const score = d.turns.map((t) => Math.max(0, ...use.map((r) => Math.abs((t.means && t.means[r.name]) ?? 0) || 0)));
  const ranking = d.turns.map((t, k) => ({ k, start: t.start, turn: t.turn, score: score[k] }));
  ranking.sort((a, b) => b.score - a.score || a.k - b.k);
  const disagree = [];
  const EPS = 1e-12;
  let prev = false;
  for (let i = 0; i < d.kinds.length; i++) {
    let pos = false;
    let neg = false;
    if (d.kinds[i] === "policy") {
      for (const r of adv) {
        const v = r.advantages[i];
        if (v > EPS) pos = true;
        else if (v < -EPS) neg = true;
      }
    }
    const both = pos && neg;
    if (both && !prev) disagree.push(i);
    prev = both;
  }
  rankPos = -1;
  tokenPos = -1;
  return { ranking, disagree, tokens: topTokens(d, rows) };
}

function jumpTo(i, note) {
  strip.setCursor(i);
  $("overview-status").textContent = note;
}

function onJumpKey(e) {
  if (!data || e.ctrlKey || e.metaKey || e.altKey) return;
  const tag = (e.target && e.target.tagName) || "";
  if (["INPUT", "SELECT", "TEXTAREA", "BUTTON"].includes(tag) || (e.target && e.target.isContentEditable)) return;
  const cur = state.tok ?? -1;
  if (e.key === "t" || e.key === "T") {
    const R = jumps.tokens;
    if (!R.length) return;
    if (!(tokenPos >= 0 && R[tokenPos] && R[tokenPos].i === cur)) tokenPos = e.key === "t" ? -1 : 0;
    tokenPos = e.key === "t" ? (tokenPos + 1) % R.length : (tokenPos - 1 + R.length) % R.length;
    const t = R[tokenPos];
    jumpTo(t.i, `token ${t.i}: #${tokenPos + 1} of ${R.length} by |advantage| (${fmt(t.v)} in ${t.row})`);
  } else if (e.key === "n" || e.key === "N") {
    const R = jumps.ranking;
    if (!R.length) return;
    // Continue the ranking from the call under the cursor, else start at the largest.
    if (!(rankPos >= 0 && R[rankPos] && R[rankPos].start === cur)) rankPos = e.key === "n" ? -1 : 0;
    rankPos = e.key === "n" ? (rankPos + 1) % R.length : (rankPos - 1 + R.length) % R.length;
    const c = R[rankPos];
    jumpTo(c.start, `call ${c.turn}: #${rankPos + 1} of ${R.length} by |advantage| (${fmt(c.score)})`);
  } else if (e.key === "d" || e.key === "D") {
    const D = jumps.disagree;
    if (!D.length) {
      $("overview-status").textContent = "No token where two shown advantage rows disagree in sign.";
      return;
    }
    let j;
    if (e.key === "d") {
      j = D.findIndex((p) => p > cur);
      if (j < 0) j = 0;
    } else {
      j = -1;
      for (let q = D.length - 1; q >= 0; q--) if (D[q] < cur) { j = q; break; }
      if (j < 0) j = D.length - 1;
    }
    jumpTo(D[j], `sign disagreement ${j + 1} of ${D.length} (token ${D[j]})`);
  } else return;
  e.preventDefault();
}
document.addEventListener("keydown", onJumpKey);

function renderCalls(d, rows, scale) {
  const table = $("calls");
  const head = el(
    "tr",
    {},
    el("th", { scope: "col" }, "Turn"),
    el("th", { scope: "col" }, "Call"),
    el("th", { scope: "col" }, "Effect"),
    el("th", { scope: "col", class: "num" }, "Reward"),
    el("th", { scope: "col", class: "num" }, "Value"),
    rows.map((r) => el("th", { scope: "col", class: "num" }, r.label)),
    d.loss ? el("th", { scope: "col", class: "num", title: "the call's share of the episode's |loss weight|" }, "Weight share") : [],
  );
  const body = el("tbody");
  const calls = Array.isArray(d.episode?.meta?.calls) ? d.episode.meta.calls : [];
  const MAX_ROWS = 500; // a DOM table, unlike the strips; the CSV export has every turn
  for (const t of d.turns.slice(0, MAX_ROWS)) {
    const tr = el(
      "tr",
      { tabindex: "0", dataset: { start: t.start } },
      el("td", {}, String(t.turn)),
      el("td", { class: "call-text" }, clip((calls[t.turn] && calls[t.turn].action) || t.text || "", 80)),
      el("td", {}, t.effect ? el("span", { class: `effect effect-${t.effect}` }, t.effect) : "—"),
      el("td", { class: "num" }, fmt(d.rewarded === false ? null : t.reward)), // no reward uploaded: no made-up 0
      el("td", { class: "num" }, fmt(t.value)),
      rows.map((r) => {
        const v = callMean(d, r, t);
        const col = r.color ? r.color(v) : strip.valueColor({ scale: r.scale ?? scale }, v);
        const td = el("td", { class: "num adv" }, fmt(v));
        if (col) {
          td.style.background = rgb(col);
          td.style.color = inkOn(col);
        }
        return td;
      }),
      d.loss ? el("td", { class: "num loss-share" }, t.loss_share === undefined || t.loss_share === null ? "—" : `${(100 * t.loss_share).toFixed(1)}%`) : [],
    );
    const go = () => {
      strip.canvas.focus();
      strip.setCursor(t.start);
    };
    tr.addEventListener("click", go);
    tr.addEventListener("keydown", (e) => {
      if (e.key === "Enter") go();
    });
    body.append(tr);
  }
  if (d.turns.length > MAX_ROWS) {
    body.append(el("tr", {}, el("td", { colspan: String(5 + rows.length) }, `… ${d.turns.length - MAX_ROWS} more turns (hover the strips, or export CSV/JSON).`)));
  }
  table.replaceChildren(el("thead", {}, head), body);
}

// Plotly (its 1.2 MB basic bundle) is loaded only when the chart is opened, so long episodes open fast.
let plotlyLoading = null;
function loadPlotly() {
  if (window.Plotly) return Promise.resolve();
  if (!plotlyLoading) {
    plotlyLoading = new Promise((resolve, reject) => {
      const tag = el("script", { src: urls.plotlyBasic });
      tag.addEventListener("load", resolve);
      tag.addEventListener("error", reject);
      document.head.append(tag);
    });
  }
  return plotlyLoading;
}

async function renderCallsChart() {
  const box = $("calls-chart-box");
  if (!box.open || !data) return;
  const node = $("calls-chart");
  try {
    await loadPlotly();
  } catch (_) {
    node.textContent = `Plotly is not available (${urls.plotlyBasic}).`;
    return;
  }
  const rows = rowsOf(data);
  const calls = Array.isArray(data.episode?.meta?.calls) ? data.episode.meta.calls : [];
  const x = data.turns.map((t) => `${t.turn}: ${clip((calls[t.turn] && calls[t.turn].action) || t.text || "", 24)}`);
  const traces = rows.filter((r) => !r.signal).map((r, k) => ({
    type: "bar",
    name: r.label,
    x,
    y: data.turns.map((t) => (t.means ? t.means[r.name] : null)),
    marker: { color: SCHEME_COLORS[k % SCHEME_COLORS.length] }, // blue/red mean the sign
  }));
  plot(
    node,
    traces,
    { barmode: "group", height: 360, margin: { l: 56, r: 16, t: 10, b: 90 }, yaxis: { title: { text: "mean advantage of the call" } }, xaxis: { type: "category", tickangle: -30, automargin: true, title: { text: "call" } }, legend: { orientation: "h", y: 1.15 } },
    `creditlens-${slug}-calls`,
  );
  node.dataset.ready = "1";
}
$("calls-chart-box").addEventListener("toggle", () => {
  state.chart = $("calls-chart-box").open;
  syncUrl();
  renderCallsChart();
});

// ---- controls ----
function bindPair(rangeId, numId, key) {
  const range = $(rangeId);
  const num = $(numId);
  const set = (v, from) => {
    let x = Number(v);
    if (!Number.isFinite(x)) return;
    x = Math.min(1, Math.max(0, x));
    state[key] = x;
    if (from !== range) range.value = String(x);
    if (from !== num) num.value = String(x);
    syncUrl();
    reload();
  };
  range.addEventListener("input", () => set(range.value, range));
  num.addEventListener("change", () => set(num.value, num));
  num.addEventListener("input", () => {
    if (num.value !== "" && num.checkValidity()) set(num.value, num);
  });
}
bindPair("gamma-range", "gamma-num", "gamma");
bindPair("lam-range", "lam-num", "lam");
// The loss_weights row's controls: verl's (agg, rollout_is, threshold) for the losses that take
// them, the chosen loss's own (another trainer's) beside them (init.losses: app/core/losses.py).
const VERL_CONTROLS = ["agg", "rollout_is", "rollout_is_threshold"];
function drawLossControls() {
  const params = init.losses.losses[state.loss].params;
  for (const k of VERL_CONTROLS) $(k).closest("label").hidden = !params.some((p) => p.name === k);
  const own = params.filter((p) => !VERL_CONTROLS.includes(p.name));
  $("loss-params").replaceChildren(
    ...own.map((p) => {
      const input = p.choices ? el("select", { id: `loss-${p.name}`, name: p.name }, p.choices.map((x) => el("option", { value: x }, x))) : el("input", { id: `loss-${p.name}`, name: p.name, size: 8 });
      input.value = state.loss_params[p.name] ?? p.default;
      input.addEventListener("change", () => {
        state.loss_params = { ...state.loss_params, [p.name]: input.value.trim() || p.default };
        syncUrl();
        reload();
      });
      return el("label", { title: p.help }, `${p.name} `, input);
    }),
  );
}
if (init.losses) drawLossControls();
$("loss").addEventListener("change", (e) => {
  // A parameter the new loss takes keeps the value shown (or starts at its default); verl's that it does not take leave the URL.
  state.loss = e.target.value;
  const params = init.losses.losses[state.loss].params;
  for (const k of VERL_CONTROLS) {
    const p = params.find((q) => q.name === k);
    state[k] = p ? $(k).value.trim() || p.default : null;
  }
  const own = {};
  for (const p of params) {
    const cur = state.loss_params[p.name];
    if (!VERL_CONTROLS.includes(p.name)) own[p.name] = cur !== undefined && (!p.choices || p.choices.includes(cur)) ? cur : p.default;
  }
  state.loss_params = own;
  drawLossControls();
  syncUrl();
  reload();
});
for (const key of ["baseline", "critic", "agg", "rollout_is"]) {
  $(key).addEventListener("change", (e) => {
    state[key] = e.target.value;
    syncUrl();
    reload();
  });
}
$("rollout_is_threshold").addEventListener("change", (e) => {
  if (!/^\s*[0-9.eE+-]+(_[0-9.eE+-]+)?\s*$/.test(e.target.value)) return;
  state.rollout_is_threshold = e.target.value.trim();
  syncUrl();
  reload();
});
$("bypass").addEventListener("change", (e) => {
  state.bypass = e.target.checked;
  syncUrl();
  reload();
});
const boxes = [...document.querySelectorAll('input[name="scheme"]')];
for (const box of boxes) {
  box.addEventListener("change", () => {
    // At least one row: the API would silently fall back to the default three.
    if (!boxes.some((b) => b.checked)) {
      box.checked = true;
      return;
    }
    // Keep the user's order: existing rows stay put, new ones go to the bottom.
    const checked = new Set(boxes.filter((b) => b.checked).map((b) => b.value));
    state.schemes = state.schemes.filter((s) => checked.has(s));
    for (const b of boxes) if (b.checked && !state.schemes.includes(b.value)) state.schemes.push(b.value);
    $("n-rows").textContent = String(state.schemes.length + state.signals.length);
    syncUrl();
    reload();
  });
}
for (const box of document.querySelectorAll('input[name="signal"]')) {
  box.addEventListener("change", () => {
    const on = new Set([...document.querySelectorAll('input[name="signal"]')].filter((b) => b.checked).map((b) => b.value));
    state.signals = state.signals.filter((s) => on.has(s));
    for (const s of on) if (!state.signals.includes(s)) state.signals.push(s);
    $("n-rows").textContent = String(state.schemes.length + state.signals.length);
    syncUrl();
    reload();
  });
}
$("controls").addEventListener("submit", (e) => e.preventDefault());
$("copy-link").addEventListener("click", () => copyText(location.href, $("link-field"), $("copy-status")));

// ---- exports ----
function exportName(ext) {
  return `creditlens-${slug}-lam${qnum(state.lam)}.${ext}`;
}

function toCSV(d) {
  const rows = rowsOf(d);
  const head = ["position", "token", "kind", "turn", "reward", "value", "td", ...rows.map((r) => r.name)];
  const lines = [head.join(",")];
  for (let i = 0; i < d.tokens.length; i++) {
    lines.push(
      [
        i,
        csvCell(d.tokens[i], true),
        d.kinds[i],
        d.turn_ids ? csvCell(d.turn_ids[i]) : "",
        d.rewards ? csvCell(d.rewards[i]) : "",
        d.values ? csvCell(d.values[i]) : "",
        d.td ? csvCell(d.td[i]) : "",
        ...rows.map((r) => csvCell(r.advantages[i])),
      ].join(","),
    );
  }
  return lines.join("\n") + "\n";
}

document.querySelectorAll("[data-export]").forEach((btn) =>
  btn.addEventListener("click", async () => {
    if (!data) return;
    const kind = btn.dataset.export;
    const ep = data.episode || {};
    const caption = `creditlens · ${ep.task || slug} · γ=${qnum(state.gamma)} λ=${qnum(state.lam)} · ${state.baseline} · critic ${state.critic}`;
    if (kind === "png") download(await strip.toPNG(caption), exportName("png"));
    else if (kind === "svg") download(new Blob([strip.toSVG(caption)], { type: "image/svg+xml" }), exportName("svg"));
    else if (kind === "csv") download(new Blob([toCSV(data)], { type: "text/csv" }), exportName("csv"));
    else if (kind === "json") {
      const body = JSON.stringify({ view: { ...state, open: [...state.open] }, url: location.href, data }, null, 1);
      download(new Blob([body], { type: "application/json" }), exportName("json"));
    }
  }),
);

window.addEventListener("resize", debounce(() => {
  if (!data) return;
  overview.setData(data, strip.rows, strip);
  syncOverview();
}, 150));

syncUrl();
load();
