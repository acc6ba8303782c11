"""The preview images' colours: the strip's scale and grays, computed as static/util.js does.

``adv_color`` rounds like JavaScript's ``Math.round`` so that a preview pixel equals the page's cell.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# static/util.js: the strip's colour scale and grays (keep in step).
POS = (33, 102, 172)
NEG = (178, 24, 43)
GRAY = (196, 196, 196)
TOOL_GRAY = (150, 150, 150)
WHITE = (255, 255, 255)
INK = (17, 17, 17)
MUTED = (90, 90, 90)


def js_round(x: float) -> int:
    """JavaScript's Math.round (halves go up), so the colours match the browser's exactly."""
    return math.floor(x + 0.5)


def adv_color(a: float | None, scale: float) -> tuple[int, int, int] | None:
    """The colour of advantage ``a`` on the symmetric scale ±``scale`` (static/util.js advColor)."""
    if a is None or not math.isfinite(a):
        return None
    t = min(1.0, abs(a) / scale) if scale > 0 else 0.0
    end = POS if a >= 0 else NEG
    return tuple(js_round(255 + (c - 255) * t) for c in end)  # type: ignore[return-value]


def cell_color(kind: str, a: float | None, scale: float) -> tuple[int, int, int]:
    """static/strip.js cellColor: tool darker gray, prompt gray, policy by the scale (gray if no value)."""
    if kind == "tool":
        return TOOL_GRAY
    if kind != "policy":
        return GRAY
    return adv_color(a, scale) or GRAY


def max_abs(rows: Sequence[Sequence[float | None]], kinds: Sequence[str]) -> float:
    """max |advantage| over policy tokens of all rows (the strip's shared scale)."""
    m = 0.0
    for row in rows:
        for a, k in zip(row, kinds, strict=False):
            if k == "policy" and a is not None and math.isfinite(a):
                m = max(m, abs(a))
    return m
