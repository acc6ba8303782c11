// Token strips on one <canvas>: one sub-row per scheme, tokens wrapped into lines, only the
// visible lines drawn (32k-token episodes scroll smoothly). Token text is drawn with fillText,
// so it is never markup. One floating panel shows the token under the pointer or the cursor.
import { clip } from "./page.js";
import { GRAY, TOOL_GRAY, advColor, el, fmt, inkOn, rgb } from "./util.js";

const FONT_PX = 12;
const CELL_H = 20;
const PAD_X = 3;
const MAX_CHARS = 14;
const GAP_Y = 8;
const LABEL_W = 132;
const LABEL_W_MIN = 72;
// Prompt cells below the first row: paler and without text (the prompt is read once, on the top
// row; the rows below it carry no credit there).
const PROMPT_QUIET = [232, 232, 232];
const CAPTION_H = 26;
const MARK_H = 3; // the audit mark under a cell (drawn in the GAP_Y gap between lines, below
const MARK_OFF = 3; // the cursor's outline)
const SEVERITY_RANK = { info: 0, warning: 1, error: 2 };
const SEVERITY_COLOR = { info: "#2166ac", warning: "#e08214", error: "#d7191c" };
// A row with `everywhere` (the uploaded advantages) colours a prompt/tool cell whose value is
// nonzero and outlines it: a trainer advantage there is a bug the user must see.
export const OFF_OUTLINE = "#000";
const OFF_W = 3; // wide enough to read at a glance (and to cover pixelAt's probe row)

/** Visible form of a token: newline, tab and blank tokens get a glyph. */
export function displayText(tok) {
  if (tok === "") return "∅";
  let s = tok.replace(/\r/g, "␍").replace(/\n/g, "↵").replace(/\t/g, "⇥");
  if (/^ +$/.test(s)) s = "␣".repeat(Math.min(3, s.length));
  return s;
}

/** Maximal runs of tokens whose kind is in `collapsible`: [{start, end, kind}], end exclusive. */
export function toolSpans(kinds, collapsible = new Set(["tool"])) {
  const spans = [];
  for (let i = 0; i < kinds.length; i++) {
    if (!collapsible.has(kinds[i])) continue;
    let j = i;
    while (j < kinds.length && kinds[j] === kinds[i]) j++;
    spans.push({ start: i, end: j, kind: kinds[i] });
    i = j - 1;
  }
  return spans;
}

/** Naive GAE that steps through every position (the tool-span bug: the discount and the critic run through tool output). [T] */
export function naiveGae(rewards, values, gamma, lam) {
  const T = rewards.length;
  const adv = new Array(T).fill(0);
  let last = 0;
  for (let t = T - 1; t >= 0; t--) {
    const vNext = t + 1 < T ? values[t + 1] ?? 0 : 0;
    const delta = (rewards[t] ?? 0) + gamma * vNext - (values[t] ?? 0);
    last = delta + gamma * lam * last;
    adv[t] = last;
  }
  return adv;
}

export class TokenStrip {
  /**
   * container: an element the strip fills. opts.onToggleSpan(start, open), opts.onCursor(i),
   * opts.maxHeight (CSS px of the scroll viewport).
   */
  constructor(container, opts = {}) {
    this.opts = opts;
    this.fontPx = opts.fontPx ?? FONT_PX;
    this.cellH = opts.cellH ?? CELL_H;
    // A fixed label width when asked for; else each layout fits the longest row label (see relayout).
    this.fixedLabelW = opts.labelW ?? null;
    this.labelW = opts.labelW ?? LABEL_W;
    this.maxChars = opts.maxChars ?? MAX_CHARS;
    this.container = container;
    this.scroller = el("div", { class: "strip-scroller" });
    this.sizer = el("div", { class: "strip-sizer" });
    this.canvas = el("canvas", {
      class: "strip-canvas",
      tabindex: "0",
      role: "img",
      "aria-label": "Token strips. Arrow keys move the cursor token; Enter expands a tool span.",
    });
    // Announced only when the keyboard cursor moves (pointer hover would flood a screen reader).
    this.panel = el("div", { class: "hover-panel", role: "status", "aria-live": "off", hidden: true });
    this.scroller.append(this.sizer, this.canvas);
    container.append(this.scroller, this.panel);
    this.ctx = this.canvas.getContext("2d");
    this.data = null;
    this.rows = [];
    this.open = new Set();
    this.cursor = null;
    this.scale = 1;
    this.hover = null;
    this.marks = new Map();
    this.itemMark = new Map();
    this._raf = 0;
    this.scroller.addEventListener("scroll", () => this.requestDraw(), { passive: true });
    this.canvas.addEventListener("mousemove", (e) => this._onMove(e));
    this.canvas.addEventListener("mouseleave", () => {
      this.hover = null;
      this._showPanel();
    });
    this.canvas.addEventListener("click", (e) => this._onClick(e));
    this.canvas.addEventListener("keydown", (e) => this._onKey(e));
    this.canvas.addEventListener("focus", () => this._showPanel());
    this.canvas.addEventListener("blur", () => this._showPanel());
    this._ro = new ResizeObserver(() => this.relayout());
    this._ro.observe(container);
  }

  /**
   * data: the advantages API answer. rows: [{name, label, advantages: [T]}] top to bottom.
   * open: Set of expanded tool-span starts. cursor: token index or null. scale: max |adv|.
   */
  setData(data, rows, { open = new Set(), cursor = null, scale = null, marks = null } = {}) {
    this.data = data;
    // Audit findings: token position -> [{code, severity, message}], drawn as a bar under the cell.
    this.marks = marks || new Map();
    this.rows = rows;
    this.open = new Set(open);
    this.cursor = cursor;
    this.spans = toolSpans(data.kinds, new Set(this.opts.collapse || ["tool"]));
    this.spanOf = new Int32Array(data.tokens.length).fill(-1);
    this.spans.forEach((s, k) => {
      for (let i = s.start; i < s.end; i++) this.spanOf[i] = k;
    });
    this.scale = scale ?? maxAbs(rows, data.kinds);
    this.relayout();
  }

  setOpen(open) {
    this.open = new Set(open);
    this.relayout();
  }

  /** Wrap items into lines for the current width. Cost O(T), no DOM work per token. */
  relayout() {
    if (!this.data) return;
    const width = Math.max(320, this.container.clientWidth);
    const ctx = this.ctx;
    ctx.font = `${this.fontPx}px ui-monospace, "DejaVu Sans Mono", monospace`;
    this.charW = ctx.measureText("M").width;
    if (this.fixedLabelW === null) {
      // Wide enough for the longest label, never more than 30% of the strip (a phone keeps room
      // for the tokens; a label cut there has its whole text in the hover panel).
      const longest = Math.max(0, ...this.rows.map((r) => String(r.label ?? "").length));
      this.labelW = Math.round(Math.min(Math.max(LABEL_W_MIN, longest * this.charW + 14), Math.max(LABEL_W_MIN, 0.3 * width)));
    }
    const avail = width - this.labelW - 8;
    const { tokens, kinds } = this.data;
    const T = tokens.length;
    const items = []; // {type: "tok"|"span", i (first token), end, x, w, line, text}
    this.itemOf = new Int32Array(T);
    const lines = [];
    let x = 0;
    let lineStart = 0;
    const push = (it) => {
      if (x > 0 && x + it.w > avail) {
        lines.push({ first: lineStart, last: items.length });
        lineStart = items.length;
        x = 0;
      }
      it.x = x;
      it.line = lines.length;
      x += it.w;
      items.push(it);
    };
    for (let i = 0; i < T; i++) {
      const k = this.spanOf[i];
      if (k >= 0 && !this.open.has(this.spans[k].start)) {
        const s = this.spans[k];
        const text = `⟨${s.kind}: ${s.end - s.start} token${s.end - s.start === 1 ? "" : "s"}⟩`;
        for (let j = s.start; j < s.end; j++) this.itemOf[j] = items.length;
        push({ type: "span", i: s.start, end: s.end, w: text.length * this.charW + 2 * PAD_X + 1, text });
        i = s.end - 1;
        continue;
      }
      let text = displayText(tokens[i]);
      if (text.length > this.maxChars) text = text.slice(0, this.maxChars - 1) + "…";
      this.itemOf[i] = items.length;
      push({ type: "tok", i, end: i + 1, w: Math.max(1, text.length) * this.charW + 2 * PAD_X + 1, text });
      // Newlines in the text end the line, so code and prose keep their shape.
      if (tokens[i].endsWith("\n") && kinds[i] !== "tool") {
        lines.push({ first: lineStart, last: items.length });
        lineStart = items.length;
        x = 0;
      }
    }
    if (lineStart < items.length) lines.push({ first: lineStart, last: items.length });
    this.items = items;
    this.lines = lines;
    // Per row with `everywhere`: item -> the off-policy value of largest |v| it holds (nonzero).
    this.offValues = this.rows.map((row) => {
      const m = new Map();
      if (!row.everywhere) return m;
      const a = row.advantages;
      for (let i = 0; i < T; i++) {
        if (kinds[i] === "policy") continue;
        const v = a[i];
        if (v === null || v === undefined || !Number.isFinite(v) || v === 0) continue;
        const k = this.itemOf[i];
        const w = m.get(k);
        if (w === undefined || Math.abs(v) > Math.abs(w)) m.set(k, v);
      }
      return m;
    });
    // The worst severity of the findings naming a token of each item (a collapsed span included).
    this.itemMark = new Map();
    for (const [p, ms] of this.marks) {
      if (p >= T) continue;
      const k = this.itemOf[p];
      const worst = ms.reduce((w, m) => (SEVERITY_RANK[m.severity] > SEVERITY_RANK[w] ? m.severity : w), this.itemMark.get(k) || "info");
      this.itemMark.set(k, worst);
    }
    this.blockH = Math.max(1, this.rows.length) * this.cellH + GAP_Y;
    const total = lines.length * this.blockH + GAP_Y;
    this.sizer.style.height = `${total}px`;
    const maxH = this.opts.maxHeight ?? Math.max(240, Math.round(window.innerHeight * 0.62));
    this.scroller.style.height = `${Math.min(total, maxH)}px`;
    this.width = width;
    this.draw();
  }

  requestDraw() {
    if (this._raf) return;
    this._raf = requestAnimationFrame(() => {
      this._raf = 0;
      this.draw();
    });
  }

  /** Draw the visible lines into this.canvas (which follows the scroll position). */
  draw() {
    if (!this.items) return;
    const dpr = window.devicePixelRatio || 1;
    const viewH = this.scroller.clientHeight;
    const top = this.scroller.scrollTop;
    const c = this.canvas;
    if (c.width !== Math.round(this.width * dpr) || c.height !== Math.round(viewH * dpr)) {
      c.width = Math.round(this.width * dpr);
      c.height = Math.round(viewH * dpr);
      c.style.width = `${this.width}px`;
      c.style.height = `${viewH}px`;
    }
    c.style.top = `${top}px`;
    const ctx = this.ctx;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    this._paint(ctx, top, viewH, this.width);
    this.container.dataset.drawn = String((Number(this.container.dataset.drawn) || 0) + 1);
  }

  /** Paint lines intersecting [top, top + h) with y offset -top. Shared by screen and exports. */
  _paint(ctx, top, h, width) {
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, width, h);
    ctx.font = `${this.fontPx}px ui-monospace, "DejaVu Sans Mono", monospace`;
    ctx.textBaseline = "middle";
    const first = Math.max(0, Math.floor(top / this.blockH));
    const last = Math.min(this.lines.length - 1, Math.floor((top + h) / this.blockH));
    const cursorItem = this.cursor !== null && this.cursor < this.itemOf.length ? this.itemOf[this.cursor] : -1;
    for (let L = first; L <= last; L++) {
      const line = this.lines[L];
      const y0 = GAP_Y / 2 + L * this.blockH - top;
      this.rows.forEach((row, r) => {
        const y = y0 + r * this.cellH;
        ctx.fillStyle = "#222";
        ctx.textAlign = "right";
        ctx.fillText(clip(row.label, Math.floor((this.labelW - 12) / this.charW)), this.labelW - 8, y + this.cellH / 2);
        ctx.textAlign = "left";
        for (let k = line.first; k < line.last; k++) {
          const it = this.items[k];
          const col = this.cellColor(it, row);
          const x = this.labelW + it.x;
          ctx.fillStyle = rgb(col);
          ctx.fillRect(x, y, it.w - 1, this.cellH - 1);
          if (this.offValues[r].has(k)) {
            ctx.lineWidth = OFF_W;
            ctx.strokeStyle = OFF_OUTLINE;
            ctx.strokeRect(x + OFF_W / 2, y + OFF_W / 2, it.w - 1 - OFF_W, this.cellH - 1 - OFF_W);
          }
          if (r > 0 && this.data.kinds[it.i] === "prompt" && !this.offValues[r].has(k)) continue;
          ctx.fillStyle = inkOn(col);
          ctx.fillText(it.text, x + PAD_X, y + this.cellH / 2);
        }
      });
      // Audit marks: a bar in the gap under the item's rows, coloured by the worst severity.
      for (let k = line.first; k < line.last; k++) {
        const sev = this.itemMark.get(k);
        if (!sev) continue;
        const it = this.items[k];
        ctx.fillStyle = SEVERITY_COLOR[sev];
        ctx.fillRect(this.labelW + it.x, y0 + this.rows.length * this.cellH + MARK_OFF, it.w - 1, MARK_H);
      }
      if (cursorItem >= line.first && cursorItem < line.last) {
        const it = this.items[cursorItem];
        const x = this.labelW + it.x;
        const hgt = this.rows.length * this.cellH;
        ctx.lineWidth = 3;
        ctx.strokeStyle = "#ffbf00";
        ctx.strokeRect(x - 1.5, y0 - 1.5, it.w + 2, hgt + 2);
        ctx.lineWidth = 1.5;
        ctx.strokeStyle = "#000";
        ctx.strokeRect(x - 0.5, y0 - 0.5, it.w, hgt);
      }
    }
  }

  /** [r, g, b] of an item in a row: gray off-policy (darker for tool spans), else the row's
   * scale; an `everywhere` row colours off-policy items that hold a nonzero value. */
  cellColor(it, row) {
    const kind = this.data.kinds[it.i];
    if (kind !== "policy") {
      const r = this.rows.indexOf(row);
      const off = r >= 0 && this.offValues ? this.offValues[r].get(this.itemOf[it.i]) : undefined;
      if (off !== undefined) return this.valueColor(row, off) ?? GRAY;
      if (kind === "prompt" && r > 0) return PROMPT_QUIET;
      return kind === "tool" ? TOOL_GRAY : GRAY;
    }
    return this.valueColor(row, row.advantages[it.i]) ?? GRAY;
  }

  /** Colour of value v in a row: the row's own colour function (signal rows), else the
   * diverging advantage scale (the row's own scale or the shared one). null for null. */
  valueColor(row, v) {
    if (v === null || v === undefined || !Number.isFinite(v)) return null;
    return row.color ? row.color(v) : advColor(v, row.scale ?? this.scale);
  }

  _itemAt(clientX, clientY) {
    const rect = this.canvas.getBoundingClientRect();
    const x = clientX - rect.left - this.labelW;
    const y = clientY - rect.top + this.scroller.scrollTop - GAP_Y / 2;
    if (x < 0 || y < 0) return null;
    const L = Math.floor(y / this.blockH);
    const r = Math.floor((y - L * this.blockH) / this.cellH);
    if (L >= this.lines.length || r >= this.rows.length) return null;
    const line = this.lines[L];
    let lo = line.first;
    let hi = line.last - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const it = this.items[mid];
      if (x < it.x) hi = mid - 1;
      else if (x >= it.x + it.w) lo = mid + 1;
      else return { item: mid, row: r };
    }
    return null;
  }

  _onMove(e) {
    const hit = this._itemAt(e.clientX, e.clientY);
    this.hover = hit ? { ...hit, clientX: e.clientX, clientY: e.clientY } : null;
    this.canvas.style.cursor = hit && this.items[hit.item].type === "span" ? "pointer" : "default";
    this._showPanel();
  }

  _onClick(e) {
    const hit = this._itemAt(e.clientX, e.clientY);
    if (!hit) return;
    const it = this.items[hit.item];
    this.setCursor(it.i, { scroll: false });
    if (it.type === "span") this._toggle(it.i, true);
    else if (this.spanOf[it.i] >= 0) this._toggle(this.spans[this.spanOf[it.i]].start, false);
  }

  _toggle(start, open) {
    if (open) this.open.add(start);
    else this.open.delete(start);
    if (this.opts.onToggleSpan) this.opts.onToggleSpan(start, open, new Set(this.open));
    this.relayout();
    if (this.cursor !== null) this.scrollToToken(this.cursor);
  }

  _onKey(e) {
    if (!this.items || !this.items.length) return;
    let k = this.cursor === null ? -1 : this.itemOf[this.cursor];
    const it = k >= 0 ? this.items[k] : null;
    switch (e.key) {
      case "ArrowRight":
        k = Math.min(this.items.length - 1, k + 1);
        break;
      case "ArrowLeft":
        k = Math.max(0, k - 1);
        break;
      case "ArrowDown":
      case "ArrowUp": {
        if (!it) {
          k = 0;
          break;
        }
        const L = it.line + (e.key === "ArrowDown" ? 1 : -1);
        if (L < 0 || L >= this.lines.length) return;
        k = this._nearestInLine(L, it.x + it.w / 2);
        break;
      }
      case "Home":
        k = 0;
        break;
      case "End":
        k = this.items.length - 1;
        break;
      case "Enter":
      case " ":
        if (!it) return;
        e.preventDefault();
        if (it.type === "span") this._toggle(it.i, true);
        else if (this.spanOf[it.i] >= 0) this._toggle(this.spans[this.spanOf[it.i]].start, false);
        return;
      case "Escape":
        this.hover = null;
        this.panel.hidden = true;
        return;
      default:
        return;
    }
    e.preventDefault();
    this.hover = null;
    this.setCursor(this.items[Math.max(0, k)].i);
  }

  _nearestInLine(L, cx) {
    const line = this.lines[L];
    let best = line.first;
    let bestD = Infinity;
    for (let k = line.first; k < line.last; k++) {
      const it = this.items[k];
      const d = Math.abs(it.x + it.w / 2 - cx);
      if (d < bestD) {
        bestD = d;
        best = k;
      }
    }
    return best;
  }

  setCursor(i, { scroll = true } = {}) {
    this.cursor = i;
    if (scroll) this.scrollToToken(i);
    this.draw();
    this._showPanel();
    if (this.opts.onCursor) this.opts.onCursor(i);
  }

  /** Scroll so token i's line is visible. */
  scrollToToken(i) {
    if (!this.items || i === null || i >= this.itemOf.length) return;
    const L = this.items[this.itemOf[i]].line;
    const y = L * this.blockH;
    const s = this.scroller;
    if (y < s.scrollTop || y + this.blockH > s.scrollTop + s.clientHeight) {
      s.scrollTop = Math.max(0, y - s.clientHeight / 3);
    }
    this.draw();
  }

  /** Client rect of an item's cell in row r (row 0 = top). */
  _cellRect(k, r = 0) {
    const it = this.items[k];
    const rect = this.canvas.getBoundingClientRect();
    const y = GAP_Y / 2 + it.line * this.blockH + r * this.cellH - this.scroller.scrollTop;
    return { x: rect.left + this.labelW + it.x, y: rect.top + y, w: it.w - 1, h: this.cellH - 1 };
  }

  _showPanel() {
    let k = null;
    let row = null;
    let anchor = null;
    if (this.hover) {
      k = this.hover.item;
      row = this.hover.row;
      anchor = { x: this.hover.clientX, y: this.hover.clientY + 16 };
    } else if (document.activeElement === this.canvas && this.cursor !== null) {
      k = this.itemOf[this.cursor];
      const r = this._cellRect(k, this.rows.length - 1);
      anchor = { x: r.x, y: r.y + r.h + 6 };
    }
    if (k === null || !this.items || !this.items[k]) {
      this.panel.hidden = true;
      return;
    }
    this.panel.setAttribute("aria-live", this.hover ? "off" : "polite");
    this.panel.replaceChildren(...this._panelContent(this.items[k], row));
    this.panel.hidden = false;
    const pw = this.panel.offsetWidth;
    const ph = this.panel.offsetHeight;
    const x = Math.min(anchor.x + 12, window.innerWidth - pw - 8);
    let y = anchor.y;
    if (y + ph > window.innerHeight - 8) y = Math.max(8, anchor.y - ph - 40);
    this.panel.style.left = `${Math.max(8, x)}px`;
    this.panel.style.top = `${y}px`;
  }

  _panelContent(it, hoverRow) {
    const d = this.data;
    const i = it.i;
    if (it.type === "span") {
      const text = d.tokens.slice(it.i, it.end).join("");
      return [
        el("div", { class: "hp-title" }, `${d.kinds[it.i] === "tool" ? "tool observation" : d.kinds[it.i]}: ${it.end - it.i} tokens (${it.i}–${it.end - 1})`),
        el("pre", { class: "hp-text" }, clip(text, 600)),
        ...this.rows
          .filter((row, r) => this.offValues[r].has(this.itemOf[it.i]))
          .map((row) => {
            let n = 0;
            for (let j = it.i; j < it.end; j++) if (Number.isFinite(row.advantages[j]) && row.advantages[j] !== 0) n++;
            const worst = this.offValues[this.rows.indexOf(row)].get(this.itemOf[it.i]);
            return el("div", { class: `hp-finding sev-${this._worstMark(it.i, it.end)}` }, `${row.label}: nonzero on ${n} of these tokens (largest ${fmt(worst)}): the loss trains on them unless it masks them`);
          }),
        el("div", { class: "hp-hint" }, "Click or press Enter to expand."),
      ];
    }
    const rows = [
      ["kind", d.kinds[i]],
      ["position", String(i)],
      ["turn", d.turn_ids && d.turn_ids[i] !== null ? String(d.turn_ids[i]) : "—"],
      ["reward", fmt(d.rewards ? d.rewards[i] : null)],
      ["value", fmt(d.values ? d.values[i] : null)],
      ["TD error", fmt(d.td ? d.td[i] : null)],
    ];
    const table = el("table", { class: "hp-table" });
    for (const [k, v] of rows) table.append(el("tr", {}, el("th", {}, k), el("td", {}, v)));
    this.rows.forEach((row, r) => {
      const v = row.advantages[i];
      const col = d.kinds[i] === "policy" || row.everywhere ? this.valueColor(row, v) : null;
      const sw = el("span", { class: "swatch" });
      if (col) sw.style.background = rgb(col);
      table.append(
        el("tr", { class: r === hoverRow ? "hp-hot" : null }, el("th", {}, row.label), el("td", {}, sw, fmt(v))),
      );
      // Per-token by-products of the row (e.g. GiGPO's step-group size), indented under it.
      for (const [key, vals] of Object.entries(row.extras || {})) {
        const x = vals ? vals[i] : null;
        if (x === null || x === undefined) continue;
        const shown = Number.isInteger(x) ? String(x) : fmt(x);
        table.append(el("tr", { class: "hp-extra" }, el("th", {}, key.replaceAll("_", " ")), el("td", {}, shown)));
      }
    });
    // An `everywhere` row's nonzero value on a prompt/tool token: say it is a bug.
    const offNotes = this.rows
      .filter((row) => row.everywhere && d.kinds[i] !== "policy" && Number.isFinite(row.advantages[i]) && row.advantages[i] !== 0)
      .map((row) => el("div", { class: `hp-finding sev-${this._worstMark(i, i + 1)}` }, `${row.label} is ${fmt(row.advantages[i])} on a ${d.kinds[i]} token: the loss trains on it unless it masks it`));
    const hint = this.spanOf[i] >= 0 ? el("div", { class: "hp-hint" }, `Click to collapse this ${d.kinds[i]} span.`) : null;
    const found = (this.marks.get(i) || []).map((m) => el("div", { class: `hp-finding sev-${m.severity}` }, `${m.severity}: ${m.code}`));
    return [el("div", { class: "hp-title" }, JSON.stringify(d.tokens[i])), table, ...found, ...offNotes, hint].filter(Boolean);
  }

  /** The worst severity of the findings naming a token of [start, end) ("warning" when none does:
   * an outlined cell is at least that). */
  _worstMark(start, end) {
    let worst = "warning";
    for (let j = start; j < end; j++) for (const m of this.marks.get(j) || []) if (m.severity === "error") worst = "error";
    return worst;
  }

  /** Test and export hook: item geometry (client px) and colours per row for token i. */
  cellAt(i) {
    if (!this.items || i < 0 || i >= this.itemOf.length) return null;
    const k = this.itemOf[i];
    const it = this.items[k];
    this.scrollToToken(i);
    const r0 = this._cellRect(k, 0);
    return {
      ...r0,
      type: it.type,
      start: it.i,
      end: it.end,
      text: it.text,
      line: it.line,
      mark: this.itemMark.get(k) || null,
      findings: (this.marks.get(i) || []).map((m) => m.code),
      rows: this.rows.map((row, r) => ({
        name: row.name,
        value: row.advantages[i],
        color: this.cellColor(it, row),
        outlined: this.offValues[r].has(k),
        rect: this._cellRect(k, r),
      })),
    };
  }

  /** Pixel [r, g, b, a] actually drawn at the top middle of token i's cell in row r (clear of
   * the text and of a neighbour's cursor outline). */
  pixelAt(i, r = 0) {
    const c = this.cellAt(i);
    if (!c) return null;
    const rect = this.canvas.getBoundingClientRect();
    const cell = c.rows[r].rect;
    const dpr = window.devicePixelRatio || 1;
    const px = Math.round((cell.x - rect.left + cell.w / 2) * dpr);
    const py = Math.round((cell.y - rect.top + 1.5) * dpr);
    return Array.from(this.ctx.getImageData(px, py, 1, 1).data);
  }

  /** Pixel [r, g, b, a] drawn in the middle of token i's audit mark bar (under its last row). */
  markPixelAt(i) {
    const c = this.cellAt(i);
    if (!c) return null;
    const rect = this.canvas.getBoundingClientRect();
    const last = c.rows[c.rows.length - 1].rect;
    const dpr = window.devicePixelRatio || 1;
    const px = Math.round((last.x - rect.left + last.w / 2) * dpr);
    const py = Math.round((last.y - rect.top + this.cellH + MARK_OFF + MARK_H / 2) * dpr);
    return Array.from(this.ctx.getImageData(px, py, 1, 1).data);
  }

  /** Lines to export: all of them when the strip is short, else the visible window. */
  _exportRange(limit = 8000) {
    const total = this.lines.length * this.blockH + GAP_Y;
    if (total <= limit) return { top: 0, h: total };
    return { top: this.scroller.scrollTop, h: this.scroller.clientHeight };
  }

  /** PNG of the strips (canvas.toBlob). */
  toPNG(caption = "") {
    const { top, h } = this._exportRange();
    const capH = caption ? CAPTION_H : 0;
    const dpr = 2;
    const c = document.createElement("canvas");
    c.width = this.width * dpr;
    c.height = Math.ceil((h + capH) * dpr);
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, this.width, h + capH);
    if (caption) this._paintCaption(ctx, caption);
    ctx.setTransform(dpr, 0, 0, dpr, 0, capH * dpr);
    const savedCursor = this.cursor;
    this.cursor = null;
    this._paint(ctx, top, h, this.width);
    this.cursor = savedCursor;
    return new Promise((resolve) => c.toBlob(resolve, "image/png"));
  }

  /** Caption line of an export: the text, then the colour scale (−max … +max). */
  _paintCaption(ctx, caption) {
    ctx.font = `${FONT_PX}px ui-monospace, "DejaVu Sans Mono", monospace`;
    ctx.textBaseline = "middle";
    ctx.textAlign = "left";
    ctx.fillStyle = "#111";
    const y = CAPTION_H / 2;
    ctx.fillText(caption, 8, y);
    const x0 = Math.min(this.width - 330, 16 + ctx.measureText(caption).width);
    ctx.fillText(`−${fmt(this.scale)}`, x0, y);
    const gx = x0 + 60;
    for (let k = 0; k < 160; k++) {
      const v = ((k / 159) * 2 - 1) * (this.scale || 1);
      ctx.fillStyle = rgb(advColor(v, this.scale || 1));
      ctx.fillRect(gx + k, y - 6, 1, 12);
    }
    ctx.fillStyle = "#111";
    ctx.fillText(`+${fmt(this.scale)}`, gx + 166, y);
  }

  /** SVG of the strips: rects and <text> nodes built through the DOM, so text is escaped. */
  toSVG(caption = "") {
    const { top, h: hStrip } = this._exportRange();
    const capH = caption ? CAPTION_H : 0;
    const h = hStrip + capH;
    const NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("xmlns", NS);
    svg.setAttribute("width", String(this.width));
    svg.setAttribute("height", String(Math.ceil(h)));
    svg.setAttribute("font-family", "DejaVu Sans Mono, monospace");
    svg.setAttribute("font-size", String(this.fontPx));
    const add = (tag, attrs, text) => {
      const n = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
      if (text !== undefined) n.textContent = text;
      svg.append(n);
      return n;
    };
    add("rect", { x: 0, y: 0, width: this.width, height: Math.ceil(h), fill: "#fff" });
    if (caption) {
      add("text", { x: 8, y: CAPTION_H / 2 + 4, fill: "#111" }, `${caption}   scale ±${fmt(this.scale)}: blue +, red −`);
    }
    const first = Math.max(0, Math.floor(top / this.blockH));
    const last = Math.min(this.lines.length - 1, Math.floor((top + hStrip) / this.blockH));
    for (let L = first; L <= last; L++) {
      const line = this.lines[L];
      const y0 = capH + GAP_Y / 2 + L * this.blockH - top;
      this.rows.forEach((row, r) => {
        const y = y0 + r * this.cellH;
        add("text", { x: this.labelW - 8, y: y + this.cellH / 2 + 4, "text-anchor": "end", fill: "#222" }, clip(row.label, Math.floor((this.labelW - 12) / this.charW)));
        for (let k = line.first; k < line.last; k++) {
          const it = this.items[k];
          const col = this.cellColor(it, row);
          const x = this.labelW + it.x;
          const g = add("rect", { x, y, width: it.w - 1, height: this.cellH - 1, fill: rgb(col) });
          if (this.offValues[r].has(k)) {
            add("rect", { x: x + OFF_W / 2, y: y + OFF_W / 2, width: it.w - 1 - OFF_W, height: this.cellH - 1 - OFF_W, fill: "none", stroke: OFF_OUTLINE, "stroke-width": OFF_W });
          }
          const v = row.advantages[it.i];
          if (it.type === "tok" && v !== null && v !== undefined) {
            const t = document.createElementNS(NS, "title");
            t.textContent = `${this.data.tokens[it.i]} ${row.name}=${v}`;
            g.append(t);
          }
          add("text", { x: x + PAD_X, y: y + this.cellH / 2 + 4, fill: inkOn(col) }, it.text);
        }
      });
    }
    return new XMLSerializer().serializeToString(svg);
  }
}

/** max |advantage| over policy tokens of all rows (the shared symmetric scale). */
export function maxAbs(rows, kinds) {
  let m = 0;
  for (const row of rows) {
    const a = row.advantages || [];
    for (let i = 0; i < a.length; i++) {
      if (kinds[i] !== "policy") continue;
      const v = a[i];
      if (v !== null && Number.isFinite(v) && Math.abs(v) > m) m = Math.abs(v);
    }
  }
  return m;
}
