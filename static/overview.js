// The whole episode at a glance, on one canvas: one column per call (or per token when every
// token fits), one lane per shown row in the row's colours, computed once per answer from
// per-call aggregates (O(T · rows)); drawing is O(columns · rows), so a 120k-token, 400-call
// episode costs nothing per scroll. A click scrolls the strips to that call; the strips' visible
// range is drawn as a frame.
import { GRAY, el, fmt, rgb } from "./util.js";

const LANE_H = 11;
const FLAG_H = 4; // the lane of ticks above the rows: uploaded advantages nonzero off-policy
const FONT_PX = 10;

export class Overview {
  /** canvas: the <canvas>; opts.onPick(tokenIndex), opts.status (an element for hover text). */
  constructor(canvas, opts = {}) {
    this.canvas = canvas;
    this.opts = opts;
    this.ctx = canvas.getContext("2d");
    this.segs = [];
    this.rows = [];
    this.view = null;
    canvas.addEventListener("click", (e) => {
      const k = this.segAt(e.clientX);
      if (k !== null && this.opts.onPick) this.opts.onPick(this.segs[k].target, k);
    });
    canvas.addEventListener("mousemove", (e) => this._hover(this.segAt(e.clientX)));
    canvas.addEventListener("mouseleave", () => this._hover(null));
  }

  /**
   * d: the advantages API answer; rows: the strip's rows ({name, label, advantages, color?,
   * scale?, everywhere?}); strip: the TokenStrip (its label width and colour functions).
   */
  setData(d, rows, strip) {
    this.data = d;
    this.rows = rows;
    this.strip = strip;
    const T = d.kinds.length;
    this.labelW = strip.labelW;
    const width = Math.max(320, this.canvas.parentElement.clientWidth);
    const avail = width - this.labelW - 8;
    // Segments: per token when each gets at least one pixel, else per call (from one call's
    // first token to the next call's, so tool output between calls belongs to the call before).
    let bounds;
    let targets;
    this.perToken = T <= avail || !d.turns.length;
    if (this.perToken) {
      bounds = Array.from({ length: T + 1 }, (_, i) => i);
      targets = bounds.slice(0, T);
    } else {
      bounds = [0, ...d.turns.slice(1).map((t) => t.start), T];
      targets = d.turns.map((t) => t.start);
    }
    const n = bounds.length - 1;
    const kinds = d.kinds;
    const segs = new Array(n);
    for (let k = 0; k < n; k++) segs[k] = { start: bounds[k], end: bounds[k + 1], target: targets[k], turn: this.perToken ? null : d.turns[k].turn };
    // Per segment and row: mean over policy tokens; `everywhere` rows also flag off-policy values.
    this.means = rows.map((row) => {
      const a = row.advantages;
      const m = new Float64Array(n).fill(NaN);
      for (let k = 0; k < n; k++) {
        let s = 0;
        let c = 0;
        for (let i = segs[k].start; i < segs[k].end; i++) {
          if (kinds[i] !== "policy") continue;
          const v = a[i];
          if (v === null || v === undefined || !Number.isFinite(v)) continue;
          s += v;
          c++;
        }
        if (c) m[k] = s / c;
      }
      return m;
    });
    this.flags = new Uint8Array(n);
    for (const row of rows) {
      if (!row.everywhere) continue;
      for (let k = 0; k < n; k++) {
        for (let i = segs[k].start; i < segs[k].end; i++) {
          const v = row.advantages[i];
          if (kinds[i] !== "policy" && Number.isFinite(v) && v !== 0) {
            this.flags[k] = 1;
            break;
          }
        }
      }
    }
    this.segs = segs;
    this.width = width;
    this.avail = avail;
    this.height = FLAG_H + 2 + Math.max(1, rows.length) * LANE_H + 2;
    this.draw();
  }

  /** x (CSS px, canvas-relative) of segment k's left edge and its width. */
  colOf(k) {
    const n = this.segs.length;
    const x0 = Math.floor((k * this.avail) / n);
    const x1 = Math.floor(((k + 1) * this.avail) / n);
    return { x: this.labelW + x0, w: Math.max(1, x1 - x0) };
  }

  /** The segment under clientX (or null). */
  segAt(clientX) {
    if (!this.segs.length) return null;
    const rect = this.canvas.getBoundingClientRect();
    const x = clientX - rect.left - this.labelW;
    if (x < 0 || x >= this.avail) return null;
    return Math.min(this.segs.length - 1, Math.floor((x * this.segs.length) / this.avail));
  }

  /** The segment holding token i. */
  segOf(i) {
    let lo = 0;
    let hi = this.segs.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.segs[mid].start <= i) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  /** [r, g, b] of segment k in row r (gray when the segment has no policy token). */
  color(k, r) {
    const v = this.means[r][k];
    if (!Number.isFinite(v)) return GRAY;
    return this.strip.valueColor(this.rows[r], v) ?? GRAY;
  }

  /** Set the strips' visible token range [first, last) and redraw its frame. */
  setView(first, last) {
    this.view = [first, last];
    this.draw();
  }

  draw() {
    if (!this.segs.length) return;
    const dpr = window.devicePixelRatio || 1;
    const c = this.canvas;
    if (c.width !== Math.round(this.width * dpr) || c.height !== Math.round(this.height * dpr)) {
      c.width = Math.round(this.width * dpr);
      c.height = Math.round(this.height * dpr);
      c.style.width = `${this.width}px`;
      c.style.height = `${this.height}px`;
    }
    const ctx = this.ctx;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, this.width, this.height);
    ctx.font = `${FONT_PX}px ui-monospace, "DejaVu Sans Mono", monospace`;
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    const y0 = FLAG_H + 2;
    this.rows.forEach((row, r) => {
      ctx.fillStyle = "#222";
      // As many characters as the strips' label column holds at this font (the whole label, mostly).
      const fit = Math.max(4, Math.floor((this.labelW - 12) / ctx.measureText("M").width));
      ctx.fillText(row.label.length > fit ? row.label.slice(0, fit - 1) + "…" : row.label, this.labelW - 8, y0 + r * LANE_H + LANE_H / 2);
    });
    for (let k = 0; k < this.segs.length; k++) {
      const { x, w } = this.colOf(k);
      for (let r = 0; r < this.rows.length; r++) {
        ctx.fillStyle = rgb(this.color(k, r));
        ctx.fillRect(x, y0 + r * LANE_H, w, LANE_H - 1);
      }
      if (this.flags[k]) {
        ctx.fillStyle = "#000";
        ctx.fillRect(x, 0, w, FLAG_H);
      }
    }
    if (this.view) {
      const a = this.colOf(this.segOf(this.view[0]));
      const b = this.colOf(this.segOf(Math.max(this.view[0], this.view[1] - 1)));
      ctx.lineWidth = 1.5;
      ctx.strokeStyle = "#ffbf00";
      ctx.strokeRect(a.x - 1, y0 - 1.5, Math.max(3, b.x + b.w - a.x + 2), this.rows.length * LANE_H + 2);
    }
    this.canvas.dataset.drawn = String((Number(this.canvas.dataset.drawn) || 0) + 1);
  }

  /** Test hook: pixel [r, g, b, a] drawn in the middle of segment k's lane r. */
  pixelAt(k, r) {
    const { x, w } = this.colOf(k);
    const dpr = window.devicePixelRatio || 1;
    const px = Math.round((x + w / 2) * dpr);
    const py = Math.round((FLAG_H + 2 + r * LANE_H + LANE_H / 2) * dpr);
    return Array.from(this.ctx.getImageData(px, py, 1, 1).data);
  }

  /** Test hook: client point in the middle of segment k (row lane 0). */
  pointOf(k) {
    const rect = this.canvas.getBoundingClientRect();
    const { x, w } = this.colOf(k);
    return { x: rect.left + x + w / 2, y: rect.top + FLAG_H + 2 + LANE_H / 2 };
  }

  _hover(k) {
    const out = this.opts.status;
    if (!out) return;
    if (k === null) {
      out.textContent = "";
      return;
    }
    const s = this.segs[k];
    const what = this.perToken ? `token ${s.start}` : `call ${s.turn} (tokens ${s.start}–${s.end - 1})`;
    const parts = this.rows.map((row, r) => `${row.label} ${fmt(this.means[r][k])}`);
    out.replaceChildren(el("b", {}, what), " · ", parts.join(" · "), this.flags[k] ? " · uploaded ≠ 0 off-policy" : "");
  }
}
