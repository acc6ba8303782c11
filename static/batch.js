// Batch page: diagnostics from /api/batches/{id} as cards, Plotly figures and tables.
import { figGroups, figHist, figWhiten, groupLabel } from "./batch_charts.js";
import { $, plot, when } from "./page.js";
import { csvCell, download, el, fetchJSON, fmt, markOpen, readInitial, urls } from "./util.js";

const init = readInitial();
const pct = (x) => (x === null || x === undefined ? "—" : `${(100 * x).toFixed(0)}%`);
const NEUTRAL = "#5a5a5a"; // not a sign: blue and red mean the sign of an advantage

function card(big, what) {
  return el("div", { class: "card" }, el("div", { class: "big" }, big), el("div", { class: "what" }, what));
}

function render(b) {
  const diag = b.diagnostics || {};
  const eps = b.episodes || [];
  const groups = diag.groups || [];
  $("b-name").textContent = b.name || `Batch ${b.id}`;
  const stored = b.total ?? b.n_episodes ?? eps.length;
  // A run step with `keep`: its metrics and diagnostics count every episode, only some are stored.
  const count = b.n_episodes_seen > stored ? `${stored} of ${b.n_episodes_seen} episodes kept` : `${stored} episodes`;
  $("b-meta").textContent = `${count} · ${groups.length} groups · source ${b.source || "—"} · created ${when(b.created_at)}`;

  const zvGroups = diag.zero_variance_groups || groups.filter((g) => g.zero_variance).map((g) => g.group);
  const cards = [
    card(pct(diag.zero_variance_share), `of episodes sit in zero-variance groups (${zvGroups.length} of ${groups.length} groups): their outcome advantage is exactly 0`),
  ];
  if (diag.useless_credit_share !== null && diag.useless_credit_share !== undefined) {
    cards.push(card(pct(diag.useless_credit_share), "of the positive outcome credit lands on calls that neither fixed nor submitted"));
  }
  // The whole batch's mean from the per-group means (the episodes are one page of it).
  const nAll = groups.reduce((a, g) => a + g.n, 0);
  const mean = nAll ? groups.reduce((a, g) => a + g.n * g.mean_reward, 0) / nAll : null;
  cards.push(card(fmt(mean), "mean reward"));
  $("cards").replaceChildren(...cards);
  $("zv-banner").replaceChildren(
    ...(zvGroups.length
      ? [el("div", { class: "banner" }, `Zero-variance groups (no gradient from a group baseline): ${zvGroups.join(", ")}`)]
      : []),
  );

  figHist("fig-hist", b);
  figWhiten("fig-whiten", b);
  $("wvc-summary").textContent = (diag.whiten_vs_center && diag.whiten_vs_center.summary) || "";
  figGroups("fig-groups", b);
}

/** What is below the first screen: the credit-by-effect figure, the groups and episodes tables. */
function renderRest(b) {
  const diag = b.diagnostics || {};
  const groups = diag.groups || [];
  const cbe = diag.credit_by_effect;
  if (cbe && typeof cbe === "object" && Object.keys(cbe).length) {
    $("fig-effect-box").hidden = false;
    const keys = Object.keys(cbe);
    const vals = keys.map((k) => (typeof cbe[k] === "number" ? cbe[k] : (cbe[k].share ?? cbe[k].positive ?? null)));
    plot("fig-effect", [{ type: "bar", x: keys, y: vals, marker: { color: NEUTRAL } }], { height: 320, xaxis: { title: { text: "what the call did" } }, yaxis: { title: { text: "share of positive credit" } } }, `batch-${b.id}-credit-by-effect`);
  }

  const gt = el("table", { class: "data" });
  gt.append(el("thead", {}, el("tr", {}, ["Group", "Attempts", "Mean reward", "Pass rate", ""].map((h) => el("th", { scope: "col" }, h)))));
  const gb = el("tbody");
  groups.forEach((g, i) => {
    gb.append(
      el(
        "tr",
        {},
        el("td", {}, g.group === null ? groupLabel(g, i) : el("a", { href: urls.group(b.ref ?? b.id, g.group) }, String(g.group))),
        el("td", { class: "num" }, String(g.n)),
        el("td", { class: "num" }, fmt(g.mean_reward)),
        el("td", { class: "num" }, fmt(g.pass_rate, 2)),
        el("td", {}, g.zero_variance ? el("span", { class: "flag" }, "zero variance: no gradient") : ""),
      ),
    );
  });
  gt.append(gb);
  $("groups").replaceWith(Object.assign(gt, { id: "groups" }));
  renderEpisodes(b);
}

// The episode table's columns: heading, the row's value to sort by, and the cell.
const EP_COLUMNS = [
  { key: "slug", label: "Episode", value: (e) => e.slug, cell: (e) => el("td", {}, el("a", { href: urls.episode(e.slug) }, e.slug)) },
  { key: "task", label: "Task", value: (e) => e.task ?? null, cell: (e) => el("td", {}, e.task || "—") },
  {
    key: "group",
    label: "Group",
    value: (e) => e.group ?? null,
    cell: (e, b) => el("td", {}, e.group !== null && e.group !== undefined ? el("a", { href: urls.group(b.ref ?? b.id, e.group) }, String(e.group)) : "—"),
  },
  { key: "reward", label: "Reward", num: true, value: (e) => e.reward, cell: (e) => el("td", { class: "num" }, fmt(e.reward)) },
  { key: "n_tokens", label: "Tokens", num: true, value: (e) => e.n_tokens, cell: (e) => el("td", { class: "num" }, String(e.n_tokens ?? "")) },
  {
    key: "max_abs_adv",
    label: "max |A|",
    num: true,
    title: "the largest |advantage| the trainer gave one of the episode's policy tokens: opens the episode on that token",
    value: (e) => e.max_abs_adv,
    cell: (e) =>
      el(
        "td",
        { class: "num" },
        e.max_abs_adv === null || e.max_abs_adv === undefined ? "—" : el("a", { href: urls.episode(e.slug, `tok=${e.max_abs_adv_at}`), class: "top-token" }, fmt(e.max_abs_adv)),
      ),
  },
];

/** The table's sort from the URL: {key, desc}; by default the most-credited episode first when
 * the batch has the trainer's advantages, else upload order. */
function episodeSort(b) {
  const raw = new URLSearchParams(location.search).get("sort");
  if (raw === "none") return null;
  if (raw) {
    const key = raw.replace(/^-/, "");
    if (EP_COLUMNS.some((c) => c.key === key)) return { key, desc: raw.startsWith("-") };
  }
  return (b.episodes || []).some((e) => e.max_abs_adv !== null && e.max_abs_adv !== undefined) ? { key: "max_abs_adv", desc: true } : null;
}

function sortedEpisodes(eps, sort) {
  if (!sort) return eps;
  const col = EP_COLUMNS.find((c) => c.key === sort.key);
  const dir = sort.desc ? -1 : 1;
  // Missing values last whichever the direction; ties keep upload order.
  return eps
    .map((e, i) => [e, i])
    .sort(([p, i], [q, j]) => {
      const a = col.value(p);
      const c = col.value(q);
      const na = a === null || a === undefined;
      const nc = c === null || c === undefined;
      if (na || nc) return na === nc ? i - j : na ? 1 : -1;
      const d = typeof a === "number" && typeof c === "number" ? a - c : String(a).localeCompare(String(c));
      return d ? dir * d : i - j;
    })
    .map(([e]) => e);
}

function setSort(key, b) {
  const cur = episodeSort(b);
  const params = new URLSearchParams(location.search);
  const desc = cur && cur.key === key ? !cur.desc : key === "max_abs_adv" || key === "reward" || key === "n_tokens";
  params.set("sort", `${desc ? "-" : ""}${key}`);
  history.replaceState(null, "", `${location.pathname}?${params}`);
  renderEpisodes(b);
}

function renderEpisodes(b) {
  const f = $("ep-filter").value.trim().toLowerCase();
  const sort = episodeSort(b);
  const eps = sortedEpisodes(
    (b.episodes || []).filter((e) => !f || [e.slug, e.task, e.group].some((v) => v !== null && v !== undefined && String(v).toLowerCase().includes(f))),
    sort,
  );
  const t = el("table", { class: "data", id: "episodes", dataset: { sort: sort ? `${sort.desc ? "-" : ""}${sort.key}` : "" } });
  const head = EP_COLUMNS.map((c) => {
    const on = sort && sort.key === c.key;
    const button = el("button", { type: "button", class: "sort", dataset: { sort: c.key }, title: c.title || null }, c.label, on ? (sort.desc ? " ▼" : " ▲") : "");
    button.addEventListener("click", () => setSort(c.key, b));
    return el("th", { scope: "col", class: c.num ? "num" : null, "aria-sort": on ? (sort.desc ? "descending" : "ascending") : "none" }, button);
  });
  t.append(el("thead", {}, el("tr", {}, head)));
  const body = el("tbody");
  for (const e of eps.slice(0, 2000)) body.append(el("tr", {}, EP_COLUMNS.map((c) => c.cell(e, b))));
  t.append(body);
  $("episodes").replaceWith(t);
  $("eps-sorted").textContent =
    sort && sort.key === "max_abs_adv" && sort.desc
      ? "Sorted by max |A|: the first row holds the token that got the most credit on this page; its number opens the episode on that token."
      : "Click a heading to sort.";
  renderPager(b);
  const params = new URLSearchParams(location.search);
  if (f) params.set("q", f);
  else params.delete("q");
  if (b.offset) params.set("offset", String(b.offset));
  else params.delete("offset");
  history.replaceState(null, "", `${location.pathname}${params.toString() ? "?" + params : ""}`);
}

/** The audit's best match as one sentence. */
function bestMatchText(bm, searched) {
  if (!bm || !bm.scheme) {
    const why = bm && bm.message ? bm.message.replace(/^no configuration explains these advantages:?\s*/, "") : "";
    return `No configuration explains these advantages${why ? ": " + why : ""}.`;
  }
  // A trainer's options are one level down ({options: {scale_rewards: "none"}}): shown as their own keys.
  const flat = (o) => Object.entries(o || {}).flatMap(([k, v]) => (v && typeof v === "object" && !Array.isArray(v) ? flat(v) : [`${k}=${v}`]));
  const params = flat(bm.params).join(", ");
  return `Best match: ${bm.scheme} (${params}); max |uploaded − reference| ${fmt(bm.max_abs_diff)}, ${searched} configurations searched.`;
}

/** The findings of GET /api/batches/{id}/audit: one row each, linking to its first token. */
function renderAudit(a) {
  $("audit-best").textContent = bestMatchText(a.best_match, a.searched);
  const t = $("audit-findings");
  const head = el("tr", {}, ["Severity", "Finding", "Message", "Episodes", "Tokens"].map((h) => el("th", { scope: "col" }, h)));
  const body = el("tbody");
  for (const f of a.findings) {
    const code = f.first && f.first.url ? el("a", { href: f.first.url, class: "finding-link" }, f.code) : f.code;
    body.append(
      el(
        "tr",
        { dataset: { code: f.code, severity: f.severity } },
        el("td", {}, el("span", { class: `sev sev-${f.severity}` }, f.severity)),
        el("td", {}, code),
        el("td", {}, f.message),
        el("td", { class: "num" }, String(f.episodes.length)),
        el("td", { class: "num" }, String(f.token_count)),
      ),
    );
  }
  if (!a.findings.length) body.append(el("tr", {}, el("td", { colspan: "5" }, "No findings: the uploaded advantages are what the best match computes.")));
  t.replaceChildren(el("thead", {}, head), body);
  t.hidden = false;
  $("cards").prepend(auditCard(a.findings));
}

/** The headline card of the audit: its findings by severity, as the run page counts them. */
function auditCard(findings) {
  const n = (sev) => findings.filter((f) => f.severity === sev).length;
  const parts = [["error", n("error")], ["warning", n("warning")]].filter(([, k]) => k).map(([sev, k]) => `${k} ${sev}${k === 1 ? "" : "s"}`);
  const worst = n("error") ? "error" : n("warning") ? "warning" : "none";
  const codes = [...new Set(findings.filter((f) => f.severity !== "info").map((f) => f.code))];
  return el(
    "div",
    { class: `card card-audit card-${worst}`, id: "audit-card" },
    el("div", { class: "big" }, parts.length ? parts.join(" · ") : "no findings"),
    el("div", { class: "what" }, "in the audit of the trainer's advantages", codes.length ? `: ${codes.join(", ")} ` : " ", el("a", { href: "#audit-h" }, "details")),
  );
}

function loadAudit(id, audit) {
  if (audit && !audit.possible) {
    // The batch API says up front when there is nothing to audit (or too much): no request.
    $("audit-best").textContent = audit.code === "no_advantages" ? `Nothing to audit: ${audit.reason}` : audit.reason;
    $("audit-box").dataset.ready = "1";
    return Promise.resolve();
  }
  return fetchJSON(urls.apiAudit(id))
    .then(renderAudit)
    .catch((err) => {
      // 409: the batch has no uploaded advantages (the message says which field to upload).
      $("audit-best").textContent = err.status === 409 ? `Nothing to audit: ${err.message || err.describe()}` : (err.describe ? err.describe() : String(err));
    })
    .finally(() => {
      $("audit-box").dataset.ready = "1";
    });
}

/** "Episodes 501–1000 of 5000" with Previous / Next when the batch has more than one page. */
function renderPager(b) {
  const total = b.total ?? (b.episodes || []).length;
  const limit = b.limit || total || 1;
  const offset = b.offset || 0;
  $("ep-pager").hidden = total <= limit && offset === 0;
  const last = Math.min(offset + (b.episodes || []).length, total);
  $("ep-range").textContent = `Episodes ${total ? offset + 1 : 0}–${last} of ${total}`;
  $("ep-prev").disabled = offset <= 0;
  $("ep-next").disabled = !b.next;
}

/** The batch API's URL for the page at ``offset`` (the page size is the API's default). */
function pageURL(offset) {
  return offset > 0 ? `${init.api}?${new URLSearchParams({ offset: String(offset) })}` : init.api;
}

// The loss view: every registered loss grouped by trainer, with its parameters and defaults, from
// the page state (init.losses: app/core/losses.py client_config); the chosen loss's controls in the URL.
const LOSSES = init.losses;
const lossControls = (loss) => LOSSES.losses[loss].params.filter((c) => c.control);

function lossParams() {
  const q = new URLSearchParams(location.search);
  const loss = LOSSES.losses[q.get("loss")] ? q.get("loss") : LOSSES.default;
  const p = { loss, bypass: q.get("bypass") === "1" };
  for (const c of lossControls(loss)) p[c.name] = q.get(c.name) || c.default;
  return p;
}

function writeLossParams(p) {
  const q = new URLSearchParams(location.search);
  for (const k of ["loss", ...LOSSES.param_names]) q.delete(k);
  if (p.loss !== LOSSES.default) q.set("loss", p.loss);
  for (const c of lossControls(p.loss)) if (p[c.name] !== c.default) q.set(c.name, p[c.name]);
  if (p.bypass) q.set("bypass", "1");
  else q.delete("bypass");
  history.replaceState(null, "", `${location.pathname}${q.toString() ? "?" + q : ""}`);
}

/** The chosen loss's controls (a select for a parameter with choices, else a text box) with values from ``p``. */
function renderLossControls(p) {
  $("loss-params").replaceChildren(
    ...lossControls(p.loss).map((c) => {
      const input = c.choices ? el("select", { id: `loss-${c.name}`, name: c.name }, c.choices.map((x) => el("option", { value: x }, x))) : el("input", { id: `loss-${c.name}`, name: c.name, size: 8 });
      input.value = p[c.name];
      return el("label", { title: c.help }, `${c.name} `, input);
    }),
  );
}

function removedText(v) {
  const share = (x) => (x === null || x === undefined ? "—" : `${(100 * x).toFixed(1)}%`);
  const parts = [`Clipping removes ${share(v.clipped_share)} of the |A| on policy tokens; rollout-correction masking removes ${share(v.masked_share)}.`];
  if (!v.has_logprobs) parts.push("This batch has no log-probs: every ratio is 1, so nothing clips or is masked; the aggregation's length bias is still shown.");
  if (v.length_bias_slope !== null && v.length_bias_slope !== undefined) parts.push(`Length-bias slope ${fmt(v.length_bias_slope)} (0: none; −1: weight ∝ 1/length).`);
  return parts.join(" ");
}

function loadLoss(b) {
  const p = lossParams();
  $("loss-loss").value = p.loss;
  renderLossControls(p);
  $("loss-bypass").checked = p.bypass;
  if (b.audit && b.audit.code === "no_advantages") {
    // The batch API already says the trainer's advantages are missing: the loss view would 409.
    $("loss-removed").textContent = `Nothing to weigh: ${b.audit.reason}`;
    $("fig-loss").closest("figure").hidden = true; // no empty frame
    $("loss-box").dataset.ready = "1";
    return Promise.resolve();
  }
  const q = new URLSearchParams({ ...p, bypass: p.bypass ? "true" : "false" });
  return fetchJSON(`${init.api}/loss?${q}`)
    .then((v) => {
      $("loss-removed").textContent = removedText(v);
      $("loss-plotted").textContent = `Per-token loss weight per unit |A| (Σ|w| / Σ|A| over each episode's policy tokens) against response length, ${[v.loss, ...lossControls(v.loss).map((c) => v[c.name])].join(" × ")}`;
      const eps = v.episodes.filter((e) => e.weight_per_abs_advantage !== null);
      plot(
        "fig-loss",
        [{ type: "scatter", mode: "markers", x: eps.map((e) => e.length), y: eps.map((e) => e.weight_per_abs_advantage), customdata: eps.map((e) => e.slug), marker: { color: NEUTRAL }, hovertemplate: "%{customdata}<br>length %{x}<br>weight per |A| %{y:.3g}<extra></extra>" }],
        { height: 320, xaxis: { title: { text: "response length (policy tokens)" } }, yaxis: { title: { text: "Σ|w| / Σ|A|" }, rangemode: "tozero", exponentformat: "e" } },
        `batch-${b.id}-loss`,
      );
    })
    .catch((err) => {
      $("loss-removed").textContent = err.describe ? err.describe() : String(err);
    })
    .finally(() => {
      $("loss-box").dataset.ready = "1";
    });
}

let batch = null;
function load(offset, first) {
  // The first page is the preloaded URL: asked for the same way (no extra headers), it is reused.
  return fetchJSON(pageURL(offset), offset === startOffset && pageURL(offset) === init.api ? { headers: {} } : {})
    .then((b) => {
      batch = b;
      if (first) {
        $("ep-filter").value = (init.view && init.view.q) || "";
        render(b);
        // The audit's card is on the first screen; both requests run beside the drawing and the
        // page is open once they have answered (none left in flight), before the tables below.
        return Promise.all([loadAudit(b.ref ?? b.id, b.audit), loadLoss(b)]).then(async () => {
          markOpen();
          await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
          renderRest(b);
          document.body.dataset.ready = "1";
        });
      }
      figWhiten("fig-whiten", b); // its per-episode bars follow the page
      renderEpisodes(b);
      document.body.dataset.ready = "1";
    })
    .catch((err) => {
      $("error").textContent = err.describe ? err.describe() : String(err);
      $("error").hidden = false;
      $("b-meta").textContent = "";
    });
}
const startOffset = Math.max(0, parseInt(new URLSearchParams(location.search).get("offset") || "0", 10) || 0);
load(startOffset, true);
$("ep-prev").addEventListener("click", () => batch && load(Math.max(0, batch.offset - batch.limit), false));
$("ep-next").addEventListener("click", () => batch && batch.next && load(batch.offset + batch.limit, false));
$("ep-filter").addEventListener("input", () => batch && renderEpisodes(batch));
$("loss-form").addEventListener("change", () => {
  if (!batch) return;
  // The controls shown are read; a parameter the previous loss did not have (or a choice it cannot take) starts at its default.
  const loss = $("loss-loss").value;
  const p = { loss, bypass: $("loss-bypass").checked };
  for (const c of lossControls(loss)) {
    const shown = $(`loss-${c.name}`) ? $(`loss-${c.name}`).value.trim() : "";
    p[c.name] = shown && (!c.choices || c.choices.includes(shown)) ? shown : c.default;
  }
  writeLossParams(p);
  $("loss-box").dataset.ready = "";
  loadLoss(batch);
});
$("csv-btn").addEventListener("click", () => {
  if (!batch) return;
  const lines = ["slug,task,group,reward,n_tokens,max_abs_adv,max_abs_adv_at"];
  for (const e of batch.episodes || []) {
    lines.push([csvCell(e.slug), csvCell(e.task, true), csvCell(e.group, true), csvCell(e.reward), csvCell(e.n_tokens), csvCell(e.max_abs_adv), csvCell(e.max_abs_adv_at)].join(","));
  }
  download(new Blob([lines.join("\n") + "\n"], { type: "text/csv" }), `creditlens-batch-${batch.id}.csv`);
});
