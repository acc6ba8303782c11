// Small shared helpers. Everything that puts data into the DOM goes through el()/text nodes:
// token, task, meta and file-name text is never parsed as HTML.

const enc = encodeURIComponent;
const withQuery = (path, qs) => (qs ? `${path}?${qs}` : path);

/** Every URL a script builds: the same paths as app/core/urls.py (URLs are public contracts). A batch or
 * run is named by its `ref`: its integer id when public, its random slug when unlisted. */
export const urls = {
  home: (qs = "") => withQuery("/", qs),
  runs: "/#runs",
  episode: (slug, qs = "") => withQuery(`/e/${enc(slug)}`, qs),
  batch: (ref) => `/b/${enc(ref)}`,
  group: (batchRef, group) => `/b/${enc(batchRef)}/g/${enc(group)}`,
  talk: (step) => `/talk/${step}`,
  run: (ref) => `/r/${enc(ref)}`,
  plotly: "/vendor/plotly.min.js",
  plotlyBasic: "/vendor/plotly-basic.min.js",
  apiBatches: (qs = "") => withQuery("/api/batches", qs),
  apiBatch: (ref) => `/api/batches/${enc(ref)}`,
  apiAudit: (ref) => `/api/batches/${enc(ref)}/audit`,
  apiGroup: (batchRef, group) => `/api/batches/${enc(batchRef)}/groups/${enc(group)}`,
  apiEpisode: (slug) => `/api/episodes/${enc(slug)}`,
  apiAdvantages: (slug, qs) => withQuery(`/api/episodes/${enc(slug)}/advantages`, qs),
  apiUploads: "/api/uploads",
  apiFormats: "/api/formats",
  apiSamples: (qs = "") => withQuery("/api/samples", qs),
  apiRuns: (qs = "") => withQuery("/api/runs", qs),
  apiRun: (ref) => `/api/runs/${enc(ref)}`,
  apiRunMetrics: (ref) => `/api/runs/${enc(ref)}/metrics`,
  apiRunStep: (ref, step) => `/api/runs/${enc(ref)}/steps/${step}`,
  apiRunEpisodes: (ref, qs = "") => withQuery(`/api/runs/${enc(ref)}/episodes`, qs),
  apiRunPrompts: (ref, qs = "") => withQuery(`/api/runs/${enc(ref)}/prompts`, qs),
  runPrompt: (ref, key) => `/r/${enc(ref)}/prompts/${enc(key)}`,
  compare: (refs) => `/r/compare?runs=${refs.map(enc).join(",")}`,
  apiCompare: (refs) => `/api/runs/compare?runs=${refs.map(enc).join(",")}`,
};

/** An episode view's canonical query as [[key, value], ...]: `keys` is EpisodeView's QUERY_KEYS
 * (app/core/views.py, sent in the page state as `query_keys`), so this writes what
 * EpisodeView.query() writes. `api`: without the page-only keys (open, tok, chart). */
export function viewPairs(v, keys, { api = false } = {}) {
  const out = [];
  for (const [key, attr, kind, gate] of keys) {
    let x = v[attr];
    if (x instanceof Set) x = [...x].sort((a, b) => a - b);
    const isDict = x !== null && typeof x === "object" && !Array.isArray(x);
    const unset = x === null || x === undefined || x === false || (Array.isArray(x) && !x.length) || (isDict && !Object.keys(x).length);
    if ((gate === "page" && api) || (gate !== "always" && unset)) continue;
    if (gate.startsWith("row:") && !(v.schemes || []).includes(gate.slice(4))) continue;
    if (kind === "list") out.push([key, x.join(",")]);
    else if (kind === "num") out.push([key, qnum(x)]);
    else if (kind === "flag") out.push([key, "1"]);
    else if (kind === "params") for (const [k, val] of Object.entries(x)) out.push([k, String(val)]); // the loss's own parameters
    else out.push([key, String(x)]);
  }
  return out;
}

/** A query string from [[key, value], ...]; commas and colons (a trainer's scheme, "verl:gae") stay
 * readable, as the server writes them. */
export function queryString(pairs) {
  return pairs.map(([k, v]) => `${k}=${encodeURIComponent(v).replace(/%2C/g, ",").replace(/%3A/g, ":")}`).join("&");
}

/** The page's initial state from <script type="application/json" id="initial-state">. */
/** Mark the page open, once: ``page:open`` one frame after its first screen is drawn, so the mark
 * means "on screen" (bench/pages.py reads its time since the navigation started). */
export function markOpen() {
  if (performance.getEntriesByName("page:open").length) return;
  requestAnimationFrame(() => setTimeout(() => performance.getEntriesByName("page:open").length || performance.mark("page:open"), 0));
}

export function readInitial(id = "initial-state") {
  const node = document.getElementById(id);
  return node ? JSON.parse(node.textContent) : {};
}

/** el("td", {class: "num", title: "x"}, "text", otherNode): attributes set with setAttribute. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

/** An error from our JSON API: the pinned {"error": {status, code, message, line, episode, field}}. */
export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || (body && typeof body.detail === "string" ? body.detail : `HTTP ${status}`));
    this.status = status;
    this.code = e.code || null;
    this.line = e.line ?? null;
    this.episode = e.episode ?? null;
    this.field = e.field ?? null;
  }
  /** "message (line 3, episode 2, field values)" */
  describe() {
    // Only the parts the server's sentence does not already say.
    const where = [];
    const m = this.message;
    if (this.line !== null && !m.includes(`line ${this.line}`)) where.push(`line ${this.line}`);
    if (this.episode !== null && !m.includes(`episode ${this.episode}`)) where.push(`episode ${this.episode}`);
    if (this.field !== null && !m.includes(`\`${this.field}\``) && !m.includes(`field ${this.field}`)) where.push(`field ${this.field}`);
    return where.length ? `${this.message} (${where.join(", ")})` : this.message;
  }
}

export async function fetchJSON(url, init = {}) {
  return (await fetchJSONPage(url, init)).body;
}

/** fetchJSON plus the X-Total-Count header of a paged list (GET /api/runs): {body, total}, total
 * null when the answer has none. */
export async function fetchJSONPage(url, init = {}) {
  const r = await fetch(url, { headers: { accept: "application/json" }, ...init });
  let body = null;
  try {
    body = await r.json();
  } catch (_) {
    body = null;
  }
  if (!r.ok) throw new ApiError(r.status, body);
  const total = r.headers.get("x-total-count");
  return { body, total: total === null ? null : Number(total) };
}

/** A number for humans: 3 significant decimals, "—" for null. */
export function fmt(x, digits = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "—";
  if (typeof x !== "number") return String(x);
  if (Math.abs(x) < 5e-10) return "0"; // float noise such as 1.1e-16 is a zero
  const a = Math.abs(x);
  if (a >= 1000 || a < 1e-3) return x.toExponential(2);
  return x.toFixed(digits);
}

/** Same short form as app/core/views.py's fmt_num (Python's "%.6g"): 0.95 -> "0.95", 1 -> "1". */
export function qnum(x) {
  return String(Number(Number(x).toPrecision(6)));
}

export function download(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = el("a", { href: url, download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** CSV cell: quoted when needed; a leading = + - @ is neutralised so spreadsheets show text. */
export function csvCell(v, isText = false) {
  if (v === null || v === undefined) return "";
  let s = String(v);
  if (isText && /^[=+\-@\t\r]/.test(s)) s = "'" + s;
  return /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

/** Copy text; falls back to showing it selected in `field` (a readonly input). */
export async function copyText(text, field, status) {
  if (field) {
    field.value = text;
    field.hidden = false;
  }
  try {
    await navigator.clipboard.writeText(text);
    if (status) status.textContent = "Link copied.";
    return true;
  } catch (_) {
    if (field) {
      field.focus();
      field.select();
    }
    if (status) status.textContent = "Copy the link from the field (Ctrl+C).";
    return false;
  }
}

export function debounce(fn, ms) {
  let t = null;
  return (...args) => {
    clearTimeout(t);
    t = setTimeout(() => fn(...args), ms);
  };
}

/** Colour of an advantage on the shared symmetric scale: blue +, red -, white 0. */
export const POS = [33, 102, 172];
export const NEG = [178, 24, 43];
export const GRAY = [196, 196, 196];
export const TOOL_GRAY = [150, 150, 150];

export function advColor(a, scale) {
  if (a === null || a === undefined || !Number.isFinite(a)) return null;
  const t = scale > 0 ? Math.min(1, Math.abs(a) / scale) : 0;
  const end = a >= 0 ? POS : NEG;
  return end.map((c) => Math.round(255 + (c - 255) * t));
}

export function rgb(c) {
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

/** Text colour with enough contrast on background c. */
export function inkOn(c) {
  const lum = 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
  return lum < 140 ? "#fff" : "#111";
}

/** Plotly config shared by every figure: local only, PNG + an extra SVG download button. */
export function plotlyConfig(name) {
  return {
    responsive: true,
    displaylogo: false,
    toImageButtonOptions: { format: "png", filename: name, scale: 2 },
    modeBarButtonsToAdd: [
      {
        name: "Download as SVG",
        icon: window.Plotly.Icons.disk,
        click: (gd) => window.Plotly.downloadImage(gd, { format: "svg", filename: name }),
      },
    ],
  };
}

// Signal rows, each on its own scale, as app/core/signals.py declares them (the page state's
// `signals` catalogue: colours, what the colour is a function of, the floor below which a row stays
// pale). useSignals() takes the catalogue once; nothing about a signal is written here.
const SIGNALS = new Map();
const FALLBACK = { pos: [140, 81, 10], neg: [1, 102, 94], magnitude: "value", floor: 1e-6 };

/** Take the page state's signal catalogue ([{name, pos, neg, magnitude, floor, ...}]). */
export function useSignals(catalog) {
  for (const s of catalog || []) SIGNALS.set(s.name, s);
}

function signalSpec(name) {
  return SIGNALS.get(name) || FALLBACK;
}

/** The number a signal row's colour is a function of: −logp ("surprise"), log ratio ("log"), or the value. */
export function signalMagnitude(name, v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return null;
  const m = signalSpec(name).magnitude;
  if (m === "surprise") return -v;
  if (m === "log") return v > 0 ? Math.log(v) : null;
  return v;
}

/** The own scale of a signal row: max |magnitude| over policy tokens (with a floor). */
export function signalScale(name, values, kinds) {
  let m = 0;
  for (let i = 0; i < values.length; i++) {
    if (kinds[i] !== "policy") continue;
    const x = signalMagnitude(name, values[i]);
    if (x !== null && Math.abs(x) > m) m = Math.abs(x);
  }
  return Math.max(signalSpec(name).floor ?? 1e-6, m);
}

/** [r, g, b] of a signal value on its row's scale (null for null). */
export function signalColor(name, v, scale) {
  const x = signalMagnitude(name, v);
  if (x === null) return null;
  const c = signalSpec(name);
  const t = scale > 0 ? Math.min(1, Math.abs(x) / scale) : 0;
  const end = x >= 0 || !c.neg ? c.pos : c.neg;
  return end.map((e) => Math.round(255 + (e - 255) * (c.neg || x >= 0 ? t : 0)));
}

/** A CSS gradient of a signal row's scale, low to high, for the legend. */
export function signalGradient(name) {
  const c = signalSpec(name);
  const hi = rgb(c.pos);
  return c.neg ? `linear-gradient(to right, ${rgb(c.neg)}, #fff, ${hi})` : `linear-gradient(to right, #fff, ${hi})`;
}
