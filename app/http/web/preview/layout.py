"""Where things are drawn on a 1200×630 preview: the episode's token cells, the batch's
histogram and episode cells, the run's small multiples (pure geometry, no Pillow)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core.metrics import METRICS

W, H = 1200, 630
MARGIN = 40
LABEL_W = 210


@dataclass(frozen=True)
class Cell:
    """One drawn token cell: token index ``i`` and its rectangle (x0, y0, x1, y1 inclusive-exclusive)."""

    row: int
    i: int
    x0: int
    y0: int
    x1: int
    y1: int


def episode_layout(n_tokens: int, n_rows: int, top: int = 150, bottom: int = H - 50) -> list[Cell]:
    """Where each token of each scheme row is drawn: rows stacked, tokens wrapped into lines of
    equal cells sized to fill the band (a token per cell; beyond one pixel per token, evenly
    spaced tokens are shown)."""
    left, right = MARGIN + LABEL_W, W - MARGIN
    width = right - left
    band = (bottom - top) // max(n_rows, 1)
    gap_row = 14
    best = None
    for lines in range(1, max(2, band // 3)):
        per_line = math.ceil(n_tokens / lines)
        cw = width / per_line
        lh = (band - gap_row) / lines
        size = min(cw * 1.6, lh)
        if best is None or size > best[0]:
            best = (size, lines)
        if cw < 1:
            break
    lines = best[1] if best else 1
    per_line = min(math.ceil(n_tokens / lines), width)
    n_cells = min(n_tokens, per_line * lines)
    cw = width / per_line
    lh = min((band - gap_row) / lines, 90)
    cells = []
    for r in range(n_rows):
        y_band = top + r * band
        for k in range(n_cells):
            i = k * n_tokens // n_cells
            line, col = divmod(k, per_line)
            x0 = left + round(col * cw)
            x1 = max(x0 + 1, left + round((col + 1) * cw) - (1 if cw >= 4 else 0))
            y0 = y_band + round(line * lh)
            y1 = max(y0 + 1, y_band + round((line + 1) * lh) - (2 if lh >= 6 else 0))
            cells.append(Cell(r, i, x0, y0, x1, y1))
    return cells


def batch_layout(n_bins: int, n_episodes: int) -> tuple[list[tuple[int, int, int, int]], list[Cell]]:
    """(histogram bar slots, one cell per episode): the histogram on the left, episodes on the right."""
    top, bottom = 150, H - 60
    hist_left, hist_right = MARGIN, 560
    slot = (hist_right - hist_left) / max(n_bins, 1)
    bars = [
        (hist_left + round(b * slot), top, hist_left + round((b + 1) * slot) - 4, bottom)
        for b in range(n_bins)
    ]
    left, right = 620, W - MARGIN
    n = max(n_episodes, 1)
    cols = max(1, math.ceil(math.sqrt(n * (right - left) / (bottom - top))))
    rows = math.ceil(n / cols)
    cw, ch = (right - left) / cols, (bottom - top) / rows
    cells = []
    for k in range(n_episodes):
        rr, cc = divmod(k, cols)
        x0, y0 = left + round(cc * cw), top + round(rr * ch)
        cells.append(
            Cell(
                0,
                k,
                x0,
                y0,
                max(x0 + 1, left + round((cc + 1) * cw) - 2),
                max(y0 + 1, top + round((rr + 1) * ch) - 2),
            )
        )
    return bars, cells


# The run image's panels: the run page's main metrics (labels: app/core/metrics.py), one colour each.
RUN_PANELS = tuple(
    (name, METRICS[name].label)
    for name in ("pass_rate", "mean_score", "zero_variance_share", "mean_abs_advantage")
)
RUN_LINE_W = 4  # the run image's line width (px)


def _as_points(ys: Sequence[Any]) -> list[tuple[float, float]]:
    """A series as (step, value) pairs: [[step, value], ...] as the metrics API gives it, or bare
    values (step = position); non-finite values left out."""
    pts = []
    for j, y in enumerate(ys):
        step, v = (y[0], y[1]) if isinstance(y, list | tuple) else (j, y)
        if v is not None and math.isfinite(v):
            pts.append((float(step), float(v)))
    return pts


def run_panels(n: int) -> list[tuple[int, int, int, int]]:
    """Plot areas (x0, y0, x1, y1) of ``n`` small multiples: one wide, or two columns of rows."""
    top, bottom = 150, H - 60
    cols = 1 if n <= 1 else 2
    rows = max(1, math.ceil(n / cols))
    gap_x, gap_y, label_h = 40, 16, 30
    cw = (W - 2 * MARGIN - gap_x * (cols - 1)) / cols
    rh = (bottom - top - gap_y * (rows - 1)) / rows
    out = []
    for k in range(n):
        r, c = divmod(k, cols)
        x0 = MARGIN + round(c * (cw + gap_x))
        y0 = top + round(r * (rh + gap_y)) + label_h
        out.append((x0, y0, x0 + round(cw), top + round(r * (rh + gap_y) + rh)))
    return out


def run_points(rect: tuple[int, int, int, int], pts: Sequence[tuple[float, float]]) -> list[tuple[int, int]]:
    """Pixel positions of (step, value) points in a panel: steps across, values up (a constant
    series in the middle), a line's half width kept inside the panel."""
    x0, y0, x1, y1 = rect
    pad = RUN_LINE_W
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    sx, sy = (max(xs) - min(xs)) if xs else 0.0, (max(ys) - min(ys)) if ys else 0.0
    out = []
    for x, y in pts:
        px = (x0 + x1) / 2 if sx == 0 else x0 + pad + (x - min(xs)) / sx * (x1 - x0 - 2 * pad)
        py = (y0 + y1) / 2 if sy == 0 else y1 - pad - (y - min(ys)) / sy * (y1 - y0 - 2 * pad)
        out.append((round(px), round(py)))
    return out


def run_series(series: dict[str, Sequence[Any]]) -> list[tuple[str, str, list[tuple[float, float]]]]:
    """(name, label, points) of the panels drawn: the main metrics the run has, else its first
    four series."""
    have = {k: _as_points(v) for k, v in series.items()}
    chosen = [(k, label, have[k]) for k, label in RUN_PANELS if have.get(k)]
    if not chosen:
        chosen = [(k, k.replace("_", " "), v) for k, v in have.items() if v][: len(RUN_PANELS)]
    return chosen
