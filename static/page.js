// Helpers every page script shares: one `$`, one `clip`, one `plot` (Plotly with the page's
// colours, light or dark), one date format. A library module: importing it runs no page code.
import { plotlyConfig, urls } from "./util.js";

/** Colours of series that are not signs (schemes, baselines, runs): blue and red are kept for the
 * sign of an advantage, so none of these is blue or red. */
export const SCHEME_COLORS = ["#e08214", "#4d9221", "#762a83", "#35978f", "#8c510a", "#666666", "#c51b7d"];

/** The element with this id (null when the page has none). */
export const $ = (id) => document.getElementById(id);

/** `s` cut to `n` characters, the last one an ellipsis when cut. */
export function clip(s, n) {
  s = String(s ?? "");
  return s.length > n ? s.slice(0, n - 1) + "…" : s;
}

/** A CSS custom property (app.css) as it applies at `node` (default: the page), e.g. css("--ink"):
 * follows prefers-color-scheme and a box that sets its own (talk mode's white panel). */
export function css(name, fallback = "", node = document.documentElement) {
  const v = getComputedStyle(node).getPropertyValue(name).trim();
  return v || fallback;
}

/** The layout every Plotly figure starts from: the font and colours where it is drawn (dark mode too). */
export function baseLayout(node = document.documentElement) {
  const c = (name, fallback) => css(name, fallback, node);
  const ink = c("--ink", "#111");
  const grid = c("--grid", "#e5e5e5");
  const axis = { gridcolor: grid, zerolinecolor: c("--line", "#c9c9c9"), linecolor: grid };
  return {
    font: { family: "system-ui, DejaVu Sans, sans-serif", size: 13, color: ink },
    margin: { l: 60, r: 20, t: 10, b: 50 },
    legend: { orientation: "h", y: -0.25 },
    paper_bgcolor: c("--bg", "#fff"),
    plot_bgcolor: c("--bg", "#fff"),
    hovermode: "closest",
    xaxis: axis,
    yaxis: axis,
  };
}

/** Draw a Plotly figure into `target` (an element or its id): `layout` over baseLayout() (its
 * axes merged, not replaced); says so in the box when Plotly is not loaded. */
export function plot(target, traces, layout, name) {
  const node = typeof target === "string" ? $(target) : target;
  if (!window.Plotly) {
    node.textContent = `Plotly is not available (${urls.plotlyBasic}).`;
    return null;
  }
  const base = baseLayout(node);
  const merged = { ...base, ...layout };
  for (const ax of ["xaxis", "yaxis"]) merged[ax] = { ...base[ax], ...(layout[ax] || {}) };
  return window.Plotly.newPlot(node, traces, merged, plotlyConfig(name));
}

/** A date a person reads, in their locale and time zone: "5 Dec 2026, 07:00" (from ISO text). */
export function when(iso) {
  if (!iso) return "—";
  const d = new Date(/[zZ]|[+-]\d\d:?\d\d$/.test(iso) ? iso : `${iso}Z`);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toLocaleString(undefined, { day: "numeric", month: "short", year: "numeric", hour: "2-digit", minute: "2-digit" });
}
