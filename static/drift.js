// Token-in/token-out drift on the episode page: for each turn whose prompt re-rendered tokens the
// model sampled (the episode's meta.drift), the sampled span as stored, and under it the ids the
// prompt holds instead (text when the upload came with a tokenizer; every id on hover). The
// sampled tokens without a counterpart are marked; a click puts the strip's cursor on the span.
import { el } from "./util.js";

function chip(text, title, cls) {
  return el("span", { class: `drift-tok ${cls}`, title }, text);
}

/** Fill `box` (a <section>, hidden when the episode has no drift) from `d` (the episode API
 * answer); `jump(position)` moves the strip's cursor. */
export function renderDrift(box, d, jump) {
  const drift = d?.episode?.meta?.drift;
  box.hidden = !Array.isArray(drift) || drift.length === 0;
  const list = box.querySelector(".drift-list");
  list.replaceChildren();
  if (box.hidden) return;
  for (const t of drift) {
    const at = new Set(t.at || []);
    const n = Math.max(0, Math.min(t.sampled ?? 0, d.tokens.length - t.position));
    const sampled = [];
    for (let k = 0; k < n; k++) {
      const p = t.position + k;
      const diff = at.has(p);
      sampled.push(chip(d.tokens[p], `token ${p}${diff ? ": no counterpart in the next prompt" : ""}`, diff ? "drift-diff" : "drift-same"));
    }
    const texts = Array.isArray(t.rerendered_tokens) ? t.rerendered_tokens : [];
    const rerendered = (t.rerendered_ids || []).map((id, k) => chip(texts[k] ?? `⟨${id}⟩`, `id ${id}`, "drift-re"));
    const [s, r] = t.first || [];
    list.append(
      el(
        "li",
        { class: "drift-turn", dataset: { position: t.position } },
        el(
          "button",
          { type: "button", class: "drift-jump", onclick: () => jump(t.position) },
          `call ${t.turn}: ${t.differing} of ${t.sampled} sampled tokens re-rendered differently (first: ${s} → ${r ?? "none"}), at token ${t.position}`,
        ),
        el("div", { class: "drift-row drift-sampled", "aria-label": "sampled" }, el("span", { class: "drift-label" }, "sampled"), ...sampled),
        el("div", { class: "drift-row drift-rerendered", "aria-label": "re-rendered" }, el("span", { class: "drift-label" }, "next prompt"), ...rerendered),
      ),
    );
  }
}
