// Every trainer's dialects on the canonical episodes (GET /api/trainers): one table per trainer,
// one row per estimator, one cell per case holding row 0's token strip (the trainer's advantages)
// over a thinner strip of the reference; an outlined box is a policy token where they differ.
import { $ } from "./page.js";
import { advColor, el, fetchJSON, fmt, GRAY, markOpen, readInitial, rgb, TOOL_GRAY } from "./util.js";

const init = readInitial();

function scaleOf(body) {
  let m = 0;
  for (const t of body.trainers)
    for (const e of t.estimators)
      for (const c of Object.values(e.cases)) for (const v of c.advantages || []) if (v !== null) m = Math.max(m, Math.abs(v));
  return m || 1;
}

function box(kind, v, scale, outlined, thin) {
  const b = el("span", { class: `tok${thin ? " tok-thin" : ""}${outlined ? " tok-departs" : ""}` });
  const c = kind === "policy" ? advColor(v, scale) : kind === "tool" ? TOOL_GRAY : GRAY;
  b.style.background = rgb(c || GRAY);
  b.title = kind === "policy" ? `${kind}: ${v === null ? "—" : fmt(v, 4)}${outlined ? " (departs from the reference)" : ""}` : kind;
  return b;
}

function strip(kinds, values, scale, departs, thin) {
  const set = new Set(departs);
  return el("span", { class: "mini-strip" }, ...kinds.map((k, i) => box(k, values ? values[i] : null, scale, set.has(i), thin)));
}

function cell(cs, cse, scale) {
  if (cs.error) return el("td", { class: "t-cell t-error", title: cs.error }, "cannot run: ", cs.error);
  const parts = [strip(cse.kinds, cs.advantages, scale, cs.departs, false)];
  if (cs.reference) parts.push(el("br"), strip(cse.kinds, cs.reference, scale, [], true));
  const n = cs.departs.length;
  parts.push(el("div", { class: "t-note" }, cs.reference === null ? "no reference" : n ? `departs on ${n} token${n > 1 ? "s" : ""}` : "as the reference"));
  return el("td", { class: `t-cell${n ? " t-departs" : ""}` }, ...parts);
}

function draw(body) {
  $("t-gamma").textContent = body.gamma;
  $("t-lam").textContent = body.lam;
  const scale = scaleOf(body);
  $("t-cases").replaceChildren(
    el("h2", {}, "The six episodes"),
    el("dl", { class: "t-case-list" }, ...body.cases.flatMap((c) => [el("dt", {}, c.title), el("dd", {}, c.text)])),
  );
  const cases = body.cases;
  const tables = body.trainers.map((t) => {
    const head = el("tr", {}, el("th", { scope: "col" }, "estimator"), ...cases.map((c) => el("th", { scope: "col", title: c.text }, c.title)));
    const rows = t.estimators.map((e) =>
      el(
        "tr",
        { id: `d-${e.name.replace(/[^a-z0-9_+-]/gi, "_")}` },
        el("th", { scope: "row", class: "t-name", title: e.description }, el("code", {}, e.name), el("div", { class: "t-desc" }, e.description)),
        ...cases.map((c) => cell(e.cases[c.key], c, scale)),
      ),
    );
    const body_ = rows.length ? rows : [el("tr", {}, el("td", { colspan: String(cases.length + 1) }, "No estimator of this trainer is reproduced yet."))];
    return el(
      "section",
      { class: "trainer", id: `t-${t.key}` },
      el("h2", {}, `${t.name} ${t.version}`),
      el("div", { class: "t-scroll" }, el("table", { class: "t-grid" }, el("thead", {}, head), el("tbody", {}, ...body_))),
    );
  });
  const box_ = $("t-table");
  box_.replaceChildren(...tables);
  box_.dataset.ready = "1";
  markOpen();
}

fetchJSON(init.api)
  .then(draw)
  .catch((err) => {
    const e = $("error");
    e.textContent = err.message || String(err);
    e.hidden = false;
    $("t-table").textContent = "";
  });
