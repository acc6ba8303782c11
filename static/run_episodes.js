// Run page, the episodes table: GET /api/runs/{id}/episodes with the page's own query string as
// its state (sort, limit, offset and FIELD__OP=value filters), so a copied address reopens the same
// view. A click on a column sorts by it (again: the other way); filters are added with the form
// and removed with their ×. Every change rewrites the address (replaceState) and asks again.
import { $ } from "./page.js";
import { el, fetchJSONPage, fmt, readInitial, urls } from "./util.js";

const init = readInitial();

// The API's fields (app/storage/episode_search.py), their operators and headings.
export const FIELDS = {
  step: { ops: ["eq", "ne", "gt", "lt"], label: "step" },
  group: { ops: ["eq", "ne", "contains"], label: "group" },
  reward: { ops: ["eq", "ne", "gt", "lt"], label: "reward" },
  passed: { ops: ["eq", "ne"], label: "passed" },
  n_tokens: { ops: ["eq", "ne", "gt", "lt"], label: "tokens" },
  n_tool_tokens: { ops: ["eq", "ne", "gt", "lt"], label: "tool tokens" },
  max_abs_adv: { ops: ["eq", "ne", "gt", "lt"], label: "max |A|" },
  nonpolicy_abs_adv_share: { ops: ["eq", "ne", "gt", "lt"], label: "|A| off policy" },
  max_ratio: { ops: ["eq", "ne", "gt", "lt"], label: "max ratio" },
  mean_entropy: { ops: ["eq", "ne", "gt", "lt"], label: "mean entropy" },
  findings: { ops: ["eq", "ne", "gt", "lt", "contains"], label: "findings" },
};
const INTS = new Set(["step", "n_tokens", "n_tool_tokens"]);
const OP_TEXT = { eq: "=", ne: "≠", gt: ">", lt: "<", contains: "contains" };
const PAGE = 50;

/** The table's state: the page's query pairs that the search API understands. */
export function tableState(search) {
  const q = new URLSearchParams(search);
  const out = new URLSearchParams();
  for (const [k, v] of q) {
    const name = k.split("__")[0];
    if (k === "sort" || k === "limit" || k === "offset" || name in FIELDS) out.append(k, v);
  }
  return out;
}

function setState(q) {
  const qs = q.toString();
  history.replaceState(null, "", `${location.pathname}${qs ? "?" + qs : ""}${location.hash}`);
  load();
}

function sortBy(field) {
  const q = tableState(location.search);
  const cur = q.get("sort");
  q.set("sort", cur === field ? `-${field}` : field);
  q.delete("offset");
  setState(q);
}

function cell(row, field) {
  const v = row[field];
  if (field === "findings") return v.length ? v.join(" ") : "—";
  if (field === "group") return v ?? "—";
  if (field === "passed") return v ? "yes" : "no";
  if (typeof v !== "number") return "—";
  return INTS.has(field) ? v.toLocaleString("en") : fmt(v);
}

function drawChips(q) {
  const box = $("eps-filters");
  box.replaceChildren();
  for (const [k, v] of q) {
    if (k === "sort" || k === "limit" || k === "offset") continue;
    const [name, op = "eq"] = k.split("__");
    const x = el("button", { type: "button", class: "chip-x", "aria-label": `remove filter ${k}` }, "×");
    x.addEventListener("click", () => {
      const next = tableState(location.search);
      next.delete(k);
      next.delete("offset");
      setState(next);
    });
    box.append(el("span", { class: "chip", "data-param": k }, `${FIELDS[name].label} ${OP_TEXT[op] ?? op} ${v} `, x), " ");
  }
}

function drawTable(rows, q) {
  const sort = q.get("sort") || "";
  const head = el(
    "tr",
    {},
    ...Object.keys(FIELDS).map((f) => {
      const mark = sort === f ? " ▲" : sort === `-${f}` ? " ▼" : "";
      const b = el("button", { type: "button", class: "sort", "data-sort": f }, FIELDS[f].label + mark);
      b.addEventListener("click", () => sortBy(f));
      const aria = sort === f ? "ascending" : sort === `-${f}` ? "descending" : "none";
      return el("th", { scope: "col", "aria-sort": aria }, b);
    }),
    el("th", { scope: "col" }, "episode"),
  );
  const body = rows.map((r) =>
    el(
      "tr",
      {},
      ...Object.keys(FIELDS).map((f) =>
        f === "step"
          ? el("td", { class: "num" }, el("a", { href: r.batch_url }, String(r.step)))
          : el("td", { class: f === "group" || f === "findings" ? "" : "num" }, cell(r, f)),
      ),
      el("td", {}, el("a", { href: r.url }, "open")),
    ),
  );
  $("episodes").replaceChildren(el("thead", {}, head), el("tbody", {}, ...body));
}

async function load() {
  const table = $("episodes");
  table.dataset.ready = "0";
  const q = tableState(location.search);
  drawChips(q);
  const err = $("eps-error");
  try {
    const { body, total } = await fetchJSONPage(urls.apiRunEpisodes(init.run_id, q.toString()));
    err.hidden = true;
    const offset = Number(q.get("offset") || 0);
    const limit = Number(q.get("limit") || PAGE);
    $("eps-count").textContent = total
      ? `Episodes ${offset + 1}–${offset + body.length} of ${total.toLocaleString("en")}`
      : "No kept episode matches.";
    $("eps-prev").disabled = offset <= 0;
    $("eps-next").disabled = offset + body.length >= total;
    $("eps-prev").onclick = () => {
      q.set("offset", String(Math.max(0, offset - limit)));
      setState(q);
    };
    $("eps-next").onclick = () => {
      q.set("offset", String(offset + limit));
      setState(q);
    };
    drawTable(body, q);
  } catch (e) {
    err.hidden = false;
    err.textContent = e.describe ? e.describe() : String(e);
    $("episodes").replaceChildren();
    $("eps-count").textContent = "";
  }
  table.dataset.ready = "1";
}

function setupForm() {
  const field = $("eps-field");
  const op = $("eps-op");
  field.replaceChildren(...Object.entries(FIELDS).map(([k, f]) => el("option", { value: k }, f.label)));
  const ops = () => op.replaceChildren(...FIELDS[field.value].ops.map((o) => el("option", { value: o }, OP_TEXT[o])));
  field.addEventListener("change", ops);
  ops();
  $("eps-filter").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = tableState(location.search);
    q.set(op.value === "eq" ? field.value : `${field.value}__${op.value}`, $("eps-value").value);
    q.delete("offset");
    $("eps-value").value = "";
    setState(q);
  });
}

const PROMPTS_SHOWN = 10;

/** The prompts seen most often, each linking to its history page. */
async function loadPrompts() {
  const table = $("prompts");
  try {
    const { body, total } = await fetchJSONPage(urls.apiRunPrompts(init.run_id, `limit=${PROMPTS_SHOWN}`));
    if (!body.length) {
      $("prompts-count").textContent = "No prompt history (the run's steps were stored before it existed, or it has none yet).";
    } else if (total > body.length) {
      $("prompts-count").textContent = `The ${body.length} of ${total.toLocaleString("en")} prompts seen most often; open one to follow it through training.`;
    }
    const head = el("tr", {}, ...["prompt", "steps", "last pass rate"].map((h) => el("th", { scope: "col" }, h)));
    const rows = body.map((p) => {
      const last = p.steps[p.steps.length - 1];
      const text = p.prompt.length > 90 ? p.prompt.slice(0, 90) + "…" : p.prompt;
      return el(
        "tr",
        {},
        el("td", {}, el("a", { href: p.url }, text || p.key)),
        el("td", { class: "num" }, String(p.steps.length)),
        el("td", { class: "num" }, last ? fmt(last.pass_rate) : "—"),
      );
    });
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
  } catch (e) {
    $("prompts-count").textContent = e.describe ? e.describe() : String(e);
  }
  table.dataset.ready = "1";
}

// "Compare with run": the other run's ref joins this one's in /r/compare?runs=a,b.
$("r-compare").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const other = $("r-compare-with").value.trim();
  if (other) window.location.assign(urls.compare([String(init.run_id), ...other.split(",").map((x) => x.trim()).filter(Boolean)]));
});

setupForm();
load();
loadPrompts();
