// Home: batches (search + source filter, state in the URL), episodes per batch, the newest training
// runs, upload with drag and drop.
import { $, when } from "./page.js";
import { ApiError, el, fetchJSON, fetchJSONPage, fmt, markOpen, readInitial, urls } from "./util.js";

const init = readInitial();

function batchesOf(body) {
  if (Array.isArray(body)) return body;
  return body.batches || body.items || [];
}

async function loadBatches() {
  const q = $("q").value.trim();
  const source = $("source").value;
  const page = new URLSearchParams();
  if (q) page.set("q", q);
  if (source) page.set("source", source);
  // The search lives in the query string; the fragment (e.g. /#runs from the nav) is kept.
  history.replaceState(null, "", urls.home(page.toString()) + location.hash);
  // The API's filters of the "Show" choice (app/core/urls.py HOME_SHOWS), plus the search.
  const api = new URLSearchParams(init.shows[source] ?? init.shows[""]);
  if (q) api.set("q", q);
  const status = $("batches-status");
  status.textContent = "Loading…";
  try {
    const list = batchesOf(await fetchJSON(urls.apiBatches(api.toString())));
    renderBatches(list);
    document.body.dataset.ready = "1";
    status.textContent = list.length
      ? `${list.length} batch${list.length === 1 ? "" : "es"}${q ? ` matching “${q}”` : ""}.`
      : q || source
        ? "No batch matches."
        : "No uploads yet: upload a file (on the right), or sample one from the simulator.";
  } catch (err) {
    status.textContent = `Could not list batches: ${err.describe ? err.describe() : err}`;
  }
}

function renderBatches(list) {
  if (!list.length) {
    $("batches").replaceChildren();
    return;
  }
  const head = el(
    "tr",
    {},
    ["Batch", "Source", "Episodes", "Created", ""].map((h) => el("th", { scope: "col" }, h)),
  );
  const body = el("tbody");
  for (const b of list) {
    const toggle = el("button", { type: "button", "aria-expanded": "false" }, "episodes");
    const tr = el(
      "tr",
      {},
      el("td", {}, el("a", { href: urls.batch(b.ref ?? b.id) }, b.name || `batch ${b.id}`)),
      el("td", {}, b.source || ""),
      el("td", { class: "num" }, String(b.n_episodes ?? "")),
      el("td", {}, when(b.created_at)),
      el("td", {}, toggle),
    );
    let detail = null;
    toggle.addEventListener("click", async () => {
      if (detail) {
        detail.remove();
        detail = null;
        toggle.setAttribute("aria-expanded", "false");
        return;
      }
      toggle.setAttribute("aria-expanded", "true");
      detail = el("tr", { class: "detail" }, el("td", { colspan: "5" }, "Loading…"));
      tr.after(detail);
      try {
        const full = await fetchJSON(urls.apiBatch(b.ref ?? b.id));
        detail.firstChild.replaceChildren(episodeTable(full.episodes || []));
      } catch (err) {
        detail.firstChild.textContent = err.describe ? err.describe() : String(err);
      }
    });
    body.append(tr);
  }
  $("batches").replaceChildren(el("thead", {}, head), body);
}

function episodeTable(eps) {
  const t = el("table", { class: "data" });
  t.append(
    el("thead", {}, el("tr", {}, ["Episode", "Task", "Group", "Reward", "Tokens"].map((h) => el("th", { scope: "col" }, h)))),
  );
  const body = el("tbody");
  for (const e of eps) {
    body.append(
      el(
        "tr",
        {},
        el("td", {}, el("a", { href: urls.episode(e.slug) }, e.slug)),
        el("td", {}, e.task || "—"),
        el("td", {}, e.group ?? "—"),
        el("td", { class: "num" }, fmt(e.reward)),
        el("td", { class: "num" }, String(e.n_tokens ?? "")),
      ),
    );
  }
  t.append(body);
  return t;
}

// ---- training runs: the newest public ones, one request (GET /api/runs is paged) ----
const RUNS_SHOWN = 20;
const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;

// The sparklines' metrics (app/core/metrics.py names) and how each is shown.
const SPARKS = [
  { name: "pass_rate", label: "pass rate", color: "#4d9221" },
  { name: "nonpolicy_advantage_share", label: "|A| off policy", color: "#e08214" },
];

async function loadRuns() {
  const status = $("runs-status");
  try {
    const qs = `limit=${RUNS_SHOWN}&spark=${SPARKS.map((s) => s.name).join(",")}`;
    const { body, total } = await fetchJSONPage(urls.apiRuns(qs));
    const list = Array.isArray(body) ? body : body.runs || [];
    renderRuns(list);
    const n = total ?? list.length;
    status.textContent = !list.length
      ? "No training runs yet: log one from a training loop (POST /api/runs, or the creditlens client)."
      : n > list.length
        ? `The ${list.length} newest of ${n} runs.`
        : `${plural(n, "run", "runs")}.`;
    // "Start here" links the demo run with the credit bug when this server has it.
    const demo = list.find((r) => /credit bug/.test(r.name || ""));
    if (demo) $("start-demo-link").href = urls.run(demo.ref ?? demo.id);
    else $("start-demo").hidden = true;
  } catch (err) {
    status.textContent = `Could not list runs: ${err.describe ? err.describe() : err}`;
  }
  $("runs-table").dataset.ready = "1";
  $("runs").dataset.ready = "1";
  // Opened as /#runs: the table is drawn after the browser scrolled to the (then empty) section.
  if (location.hash === "#runs") $("runs").scrollIntoView();
}

const SVG = "http://www.w3.org/2000/svg";

/** A small line of [[step, value], ...] (0 to its max, or to 1 for shares), its last value beside it. */
function sparkline(points, spec) {
  const w = 96;
  const h = 22;
  const cell = el("td", { class: "spark", dataset: { metric: spec.name } });
  if (!points || !points.length) return cell.append("—"), cell;
  const ys = points.map((p) => p[1]);
  const top = Math.max(1e-12, ...ys.map(Math.abs));
  const x0 = points[0][0];
  const dx = Math.max(1, points[points.length - 1][0] - x0);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", String(w));
  svg.setAttribute("height", String(h));
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("role", "img");
  const last = ys[ys.length - 1];
  svg.setAttribute("aria-label", `${spec.label} over ${points.length} steps, last ${fmtShare(last)}`);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", spec.color);
  line.setAttribute("stroke-width", "1.5");
  line.setAttribute("points", points.map(([x, y]) => `${(((x - x0) / dx) * (w - 2) + 1).toFixed(1)},${(h - 2 - (Math.max(0, y) / top) * (h - 4)).toFixed(1)}`).join(" "));
  svg.append(line);
  cell.append(svg, el("span", { class: "spark-last" }, fmtShare(last)));
  return cell;
}

const fmtShare = (x) => (x === null || x === undefined ? "—" : `${Math.round(100 * x)}%`);

function renderRuns(list) {
  if (!list.length) {
    $("runs-table").replaceChildren();
    return;
  }
  const head = el("tr", {}, ["Run", "Steps", "Last step", ...SPARKS.map((s) => s.label), "Id", "Created"].map((h) => el("th", { scope: "col" }, h)));
  const body = el("tbody");
  for (const r of list) {
    const ref = r.ref ?? r.id;
    body.append(
      el(
        "tr",
        { dataset: { run: String(ref) } },
        el("td", {}, el("a", { href: urls.run(ref) }, r.name || `run ${r.id}`)),
        el("td", { class: "num" }, r.n_steps ? String(r.n_steps) : "no steps yet"),
        el("td", { class: "num" }, r.last_step ?? "—"),
        ...SPARKS.map((s) => sparkline(r.spark && r.spark[s.name], s)),
        el("td", { class: "num" }, String(ref)),
        el("td", {}, when(r.created_at)),
      ),
    );
  }
  $("runs-table").replaceChildren(el("thead", {}, head), body);
}

// "Start here": shown until the user hides it (remembered in this browser).
const START_KEY = "creditlens:start-hidden";
try {
  if (localStorage.getItem(START_KEY) === "1") $("start-here").hidden = true;
} catch (_) {}
$("start-hide").addEventListener("click", () => {
  $("start-here").hidden = true;
  try {
    localStorage.setItem(START_KEY, "1");
  } catch (_) {}
});

$("search").addEventListener("submit", (e) => {
  e.preventDefault();
  loadBatches();
});
$("source").addEventListener("change", loadBatches);

// ---- upload ----
const form = $("upload-form");
const input = $("file");
const zone = $("dropzone");
let pending = null;

function fileItem(file) {
  const item = el(
    "div",
    { class: "file-item", dataset: { name: file.name } },
    el("div", { class: "fname" }, file.name),
    el("div", { class: "hint" }, `${(file.size / 1024).toFixed(1)} KiB`),
  );
  $("files").prepend(item);
  return item;
}

// ---- when no format fits: a mapping form filled from the file's first record ----
// The targets POST /api/uploads?mapping= can fill (app/ingest/_mapping.py) that a form offers.
const MAP_TARGETS = [
  ["messages", "chat messages"],
  ["prompt", "prompt text"],
  ["response", "response text"],
  ["reward", "reward"],
  ["group", "group"],
  ["truncated", "truncated"],
  ["task", "task label"],
];
const REWARD_NAMES = ["reward", "score", "rewards", "result", "return", "correct", "success", "passed", "pass", "acc", "accuracy"];
const GROUP_NAMES = ["group", "task_id", "instance_id", "uid", "prompt_id", "example_id", "task", "index", "id"];

/** The first record of a JSON/JSONL file, as the server's detection reads it: the first line when
 * it is a JSON object, else the first element of the document (files up to 64 MiB); null if none. */
async function firstRecord(file) {
  const head = await file.slice(0, 4 << 20).text();
  const line = head.split("\n").find((s) => s.trim());
  try {
    const obj = JSON.parse(line);
    if (obj && typeof obj === "object" && !Array.isArray(obj)) return obj;
  } catch {}
  if (file.size > 64 << 20) return null;
  try {
    let doc = JSON.parse(await file.text());
    if (doc && Array.isArray(doc.episodes)) doc = doc.episodes;
    const rec = Array.isArray(doc) ? doc[0] : doc;
    return rec && typeof rec === "object" ? rec : null;
  } catch {
    return null;
  }
}

function kindOf(v) {
  if (Array.isArray(v)) return v.length && v[0] && typeof v[0] === "object" && ("role" in v[0] || "content" in v[0]) ? "messages" : "list";
  if (v === null) return "null";
  return typeof v; // number, string, boolean, object
}

/** [key, kind] of a record's fields, one level into nested objects (as the server's 422 lists them). */
function fieldsOf(rec) {
  const out = [];
  for (const [k, v] of Object.entries(rec)) {
    out.push([k, kindOf(v)]);
    if (v && typeof v === "object" && !Array.isArray(v)) {
      for (const [k2, v2] of Object.entries(v)) if (!(v2 && typeof v2 === "object" && !Array.isArray(v2))) out.push([`${k}.${k2}`, kindOf(v2)]);
    }
  }
  return out;
}

function guessField(target, fields) {
  const last = (k) => k.split(".").pop();
  if (target === "messages") return (fields.find(([, t]) => t === "messages") || [""])[0];
  if (target === "reward") return (fields.find(([k, t]) => t === "number" && REWARD_NAMES.includes(last(k))) || [""])[0];
  if (target === "group") return (fields.find(([k]) => GROUP_NAMES.includes(last(k))) || [""])[0];
  return "";
}

let mapForms = 0; // each form's ids are its own (several files can fail)

function mappingForm(file, rec) {
  const n = ++mapForms;
  const fields = fieldsOf(rec);
  const form = el(
    "form",
    { class: "mapping-form", "aria-label": "Map the file's fields" },
    el("p", {}, "No known format fits this file. Map its fields (from its first record) onto the native fields:"),
  );
  for (const [target, label] of MAP_TARGETS) {
    const sel = el("select", { id: `map-${n}-${target}`, name: target });
    sel.append(el("option", { value: "" }, "— not mapped —"));
    for (const [k, t] of fields) sel.append(el("option", { value: k }, `${k} (${t})`));
    sel.value = guessField(target, fields);
    form.append(el("div", { class: "field" }, el("label", { for: `map-${n}-${target}` }, label), sel));
  }
  form.append(el("button", { type: "submit", class: "primary map-upload" }, "Upload with this mapping"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const mapping = {};
    for (const [target] of MAP_TARGETS) {
      const v = form.querySelector(`[name="${target}"]`).value;
      if (v) mapping[target] = v;
    }
    upload(file, mapping);
  });
  return form;
}

/** The mapping the server proposes in an unknown_format 422 ("Proposed mapping={...}"), with a
 * button that sends the file again through it; null when the message proposes none. */
function proposedMapping(file, message) {
  const m = /Proposed mapping=(\{.*?\}) — /.exec(message);
  if (!m) return null;
  let mapping;
  try {
    mapping = JSON.parse(m[1]);
  } catch {
    return null;
  }
  if (Object.values(mapping).some((v) => String(v).startsWith("<"))) return null; // a placeholder, not a proposal
  const use = el("button", { type: "button", class: "primary use-mapping" }, "Use this mapping");
  use.addEventListener("click", () => upload(file, mapping));
  return el("div", { class: "proposed-mapping" }, el("p", {}, "Proposed from what the file holds: ", el("code", {}, JSON.stringify(mapping))), use);
}

async function upload(file, mapping = null) {
  const item = fileItem(file);
  const status = el("div", { class: "file-status", role: "status" }, "Uploading…");
  item.append(status);
  const fd = new FormData();
  fd.append("file", file, file.name);
  if (mapping) fd.append("mapping", JSON.stringify(mapping));
  if ($("up-name").value.trim()) fd.append("name", $("up-name").value.trim());
  if ($("up-format").value) fd.append("format", $("up-format").value);
  if ($("up-visibility").value) fd.append("visibility", $("up-visibility").value);
  if ($("up-trainer").value) fd.append("trainer", $("up-trainer").value);
  // The tokenizer.json goes beside the file, as the API takes it (its checks answer as for the file).
  const tokenizer = $("up-tokenizer").files[0];
  if (tokenizer) fd.append("tokenizer", tokenizer, tokenizer.name);
  const config = $("up-config").files[0];
  if (config) fd.append("config", config, config.name);
  const headers = { accept: "application/json" };
  if ($("up-token").value) headers.authorization = `Bearer ${$("up-token").value}`;
  try {
    const body = await fetchJSON(urls.apiUploads, { method: "POST", body: fd, headers });
    item.classList.add("good");
    const n = body.episodes.length;
    const links = el("div", { class: "file-ok" });
    links.append(
      el("div", {}, `Stored ${n} episode${n === 1 ? "" : "s"} in `, el("a", { href: body.url || urls.batch(body.batch_id) }, `batch ${body.batch_id}`), ":"),
    );
    if (tokenizer) links.append(el("div", { class: "hint" }, `Token text from ${tokenizer.name}.`));
    body.episodes.slice(0, 50).forEach((e, k) =>
      links.append(el("a", { href: e.url || urls.episode(e.slug), class: "episode-link" }, `episode ${k + 1}`)),
    );
    if (n > 50) links.append(el("span", {}, `… and ${n - 50} more on the batch page.`));
    if (body.delete_token) {
      links.append(el("div", { class: "hint" }, "Delete token (keep it to delete this batch later): ", el("code", {}, body.delete_token)));
    }
    for (const w of body.warnings || []) links.append(el("div", { class: "hint upload-warning" }, `Note: ${w}`));
    status.replaceWith(links);
    loadBatches();
  } catch (err) {
    item.classList.add("bad");
    const msg = err instanceof ApiError ? err.describe() : `Upload failed: ${err}`;
    status.replaceWith(el("div", { class: "file-error", role: "alert" }, msg));
    if (err instanceof ApiError && err.code === "unknown_format") {
      const proposed = proposedMapping(file, err.message);
      if (proposed) item.append(proposed);
      const rec = await firstRecord(file);
      if (rec) item.append(mappingForm(file, rec));
    }
  }
}

input.addEventListener("change", () => {
  pending = input.files[0] || null;
  $("chosen").textContent = pending ? `Selected: ${pending.name}` : "";
});
form.addEventListener("submit", (e) => {
  e.preventDefault();
  const file = pending || input.files[0];
  if (!file) {
    $("files").prepend(el("div", { class: "file-item bad" }, el("div", { class: "file-error", role: "alert" }, "Choose a file first.")));
    return;
  }
  upload(file);
});
for (const ev of ["dragenter", "dragover"]) {
  zone.addEventListener(ev, (e) => {
    e.preventDefault();
    zone.classList.add("over");
  });
}
for (const ev of ["dragleave", "drop"]) zone.addEventListener(ev, () => zone.classList.remove("over"));
zone.addEventListener("drop", (e) => {
  e.preventDefault();
  const files = [...(e.dataTransfer?.files || [])];
  // Dropping uploads at once: one batch per file, each with its own result next to its name.
  files.forEach((f) => upload(f));
});
zone.addEventListener("keydown", (e) => {
  if (e.key === "Enter" || e.key === " ") {
    e.preventDefault();
    input.click();
  }
});
zone.setAttribute("tabindex", "0");

// The upload formats the server knows (GET /api/formats), with their descriptions as tooltips.
const formats = fetchJSON(urls.apiFormats)
  .then((formats) => {
    const sel = $("up-format");
    const keep = sel.value;
    sel.replaceChildren(el("option", { value: "" }, "detect automatically"));
    for (const f of formats) sel.append(el("option", { value: f.name, title: f.description }, `${f.name}: ${f.description}`));
    sel.value = keep;
  })
  .catch(() => {});

if (init.view) {
  $("q").value = init.view.q || "";
  $("source").value = init.view.source || "";
}
// The page is open when its three answers are drawn (no request of it is left in flight).
Promise.allSettled([loadBatches(), loadRuns(), formats]).then(() => markOpen());
