"""Drawing the preview PNGs with Pillow: the episode's token strips, the batch's histogram and
episode cells, the run's small multiples (geometry from .layout, colours from .colors)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.http.web.preview.colors import GRAY, INK, MUTED, NEG, POS, TOOL_GRAY, WHITE, cell_color, max_abs
from app.http.web.preview.layout import (
    LABEL_W,
    MARGIN,
    RUN_LINE_W,
    H,
    W,
    batch_layout,
    episode_layout,
    run_panels,
    run_points,
    run_series,
)

if TYPE_CHECKING:  # Pillow is imported when a preview is drawn, not at start-up
    from PIL.Image import Image
    from PIL.ImageDraw import ImageDraw
    from PIL.ImageFont import FreeTypeFont, ImageFont

RUN_COLORS = (POS, NEG, (230, 120, 20), (27, 120, 55))  # one per RUN_PANELS entry


def _font(size: int) -> FreeTypeFont | ImageFont:
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _fit(draw: ImageDraw, text: str, font: FreeTypeFont | ImageFont, width: int) -> str:
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


def _header(draw: ImageDraw, title: str, subtitle: str) -> None:
    draw.rectangle((0, 0, W, 8), fill=POS)
    draw.text((MARGIN, 34), _fit(draw, title, _font(44), W - 2 * MARGIN), font=_font(44), fill=INK)
    draw.text((MARGIN, 92), _fit(draw, subtitle, _font(24), W - 2 * MARGIN), font=_font(24), fill=MUTED)
    f = _font(20)
    draw.text((W - MARGIN - draw.textlength("creditlens", font=f), H - 34), "creditlens", font=f, fill=MUTED)


def _legend(draw: ImageDraw, scale: float, kinds: bool = True) -> None:
    f = _font(18)
    x, y = MARGIN, H - 34
    keys = [("+", POS), ("-", NEG)] + ([("prompt", GRAY), ("tool", TOOL_GRAY)] if kinds else [])
    for label, col in keys:
        draw.rectangle((x, y + 3, x + 16, y + 19), fill=col)
        draw.text((x + 22, y), label, font=f, fill=MUTED)
        x += 34 + int(draw.textlength(label, font=f))
    draw.text((x + 10, y), f"scale ±{scale:.3g}", font=f, fill=MUTED)


def _png(img: Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def draw_episode(
    title: str, subtitle: str, kinds: Sequence[str], rows: Sequence[tuple[str, Sequence[float | None]]]
) -> bytes:
    """PNG of an episode: one strip per (label, per-token advantages) row, shared colour scale."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (W, H), WHITE)
    draw = ImageDraw.Draw(img)
    _header(draw, title, subtitle)
    scale = max_abs([r for _, r in rows], kinds)
    cells = episode_layout(len(kinds), len(rows))
    f = _font(20)
    for r, (label, _) in enumerate(rows):
        first = next(c for c in cells if c.row == r)
        draw.text((MARGIN, first.y0), _fit(draw, label, f, LABEL_W - 12), font=f, fill=INK)
    for c in cells:
        col = cell_color(kinds[c.i], rows[c.row][1][c.i], scale)
        draw.rectangle((c.x0, c.y0, c.x1 - 1, c.y1 - 1), fill=col)
    _legend(draw, scale)
    return _png(img)


def draw_batch(
    title: str, subtitle: str, counts: Sequence[int], episode_adv: Sequence[float | None]
) -> bytes:
    """PNG of a batch: reward histogram (left) and a cell per episode coloured by its advantage."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (W, H), WHITE)
    draw = ImageDraw.Draw(img)
    _header(draw, title, subtitle)
    bars, cells = batch_layout(len(counts), len(episode_adv))
    peak = max(counts) if counts else 0
    for (x0, y0, x1, y1), n in zip(bars, counts, strict=True):
        h = 0 if peak == 0 else round((y1 - y0) * n / peak)
        draw.rectangle((x0, y1 - max(h, 2), x1, y1), fill=GRAY if n == 0 else (120, 120, 120))
    draw.text((MARGIN, H - 56), "reward histogram", font=_font(18), fill=MUTED)
    scale = max((abs(a) for a in episode_adv if a is not None and math.isfinite(a)), default=0.0)
    for c in cells:
        # outlined: a zero advantage is white, like the page's strip
        draw.rectangle(
            (c.x0, c.y0, c.x1 - 1, c.y1 - 1), fill=cell_color("policy", episode_adv[c.i], scale), outline=GRAY
        )
    draw.text((620, H - 56), "episodes: group-centred outcome advantage", font=_font(18), fill=MUTED)
    _legend(draw, scale, kinds=False)
    return _png(img)


def draw_run(
    title: str, series: dict[str, Sequence[Any]] | None = None, subtitle: str = "training run"
) -> bytes:
    """PNG of a run: small multiples of its main per-step metrics (pass rate, mean score,
    zero-variance share, mean |advantage|), one colour per metric; ``series`` maps a metric to
    [[step, value], ...] (or to bare values, one per step)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (W, H), WHITE)
    draw = ImageDraw.Draw(img)
    _header(draw, title, subtitle)
    panels = run_series(series or {})
    f, small = _font(20), _font(16)
    if not panels:
        draw.text((MARGIN, 200), "no steps yet", font=_font(28), fill=MUTED)
    for k, ((_name, label, pts), rect) in enumerate(zip(panels, run_panels(len(panels)), strict=True)):
        color = RUN_COLORS[k % len(RUN_COLORS)]
        x0, y0, x1, y1 = rect
        last = pts[-1][1]
        draw.text((x0, y0 - 28), _fit(draw, f"{label}  {last:.3g}", f, x1 - x0 - 160), font=f, fill=INK)
        lo, hi = min(p[1] for p in pts), max(p[1] for p in pts)
        rng = f"{lo:.3g} … {hi:.3g} · steps {pts[0][0]:.0f}-{pts[-1][0]:.0f}"
        draw.text((x1 - draw.textlength(rng, font=small), y0 - 24), rng, font=small, fill=MUTED)
        draw.rectangle((x0, y0, x1 - 1, y1 - 1), outline=GRAY)
        xy = run_points(rect, pts)
        if len(xy) > 1:
            draw.line(xy, fill=color, width=RUN_LINE_W, joint="curve")
        # A marker per step, like the run page's (beyond 300 steps only the ends: Pillow's wide
        # line leaves its last pixel out).
        r = RUN_LINE_W // 2 + 1
        for cx, cy in xy if len(xy) <= 300 else (xy[0], xy[-1]):
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=color)
    return _png(img)
