// The attempts of one group side by side under every group baseline (a library: group.js and
// talk.js draw it; importing runs no page code).
import { advColor, el, fmt, inkOn, rgb, urls } from "./util.js";

/** Rows = baselines, columns = attempts (the table a reader scans across). */
export function attemptsTable(g, baselines) {
  const eps = g.episodes || [];
  let scale = 0;
  for (const e of eps) for (const b of baselines) scale = Math.max(scale, Math.abs(e.advantages?.[b] ?? 0));
  const t = el("table", { class: "data attempts", id: "attempts" });
  // The colour key: the cells use the strips' colours (the sign of the advantage).
  const key = el("span", { class: "legend-bar legend-bar-small", "aria-hidden": "true" });
  t.append(el("caption", { class: "colour-key" }, `Outcome advantage: red negative, white 0, blue positive (−${fmt(scale)} `, key, ` +${fmt(scale)}, one scale for the table)`));
  t.append(
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        el("th", { scope: "col" }, "attempt"),
        eps.map((e, i) => el("th", { scope: "col", class: "num" }, el("a", { href: urls.episode(e.slug) }, `#${i + 1}`))),
      ),
    ),
  );
  const body = el("tbody");
  body.append(el("tr", {}, el("th", { scope: "row" }, "reward"), eps.map((e) => el("td", { class: "num" }, fmt(e.reward)))));
  for (const b of baselines) {
    body.append(
      el(
        "tr",
        { dataset: { baseline: b } },
        el("th", { scope: "row" }, b),
        eps.map((e) => {
          const v = e.advantages?.[b];
          const td = el("td", { class: "num adv" }, fmt(v));
          const c = advColor(v, scale);
          if (c) {
            td.style.background = rgb(c);
            td.style.color = inkOn(c);
          }
          return td;
        }),
      ),
    );
  }
  t.append(body);
  return t;
}
