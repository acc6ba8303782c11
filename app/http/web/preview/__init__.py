"""Link previews: Open Graph / Twitter card tags for the episode, batch and run pages, and the
PNG (1200×630) they point to, drawn on the server with Pillow.

Routes: ``/e/{slug}/preview.png`` (the episode's token strips for the default view, one row per
default scheme, in the page's colours: blue positive, red negative, white zero on policy tokens,
gray prompt tokens, darker gray tool tokens), ``/b/{batch_id}/preview.png`` (the reward
histogram and one bar per episode coloured by its group-centred outcome advantage),
``/r/{run_id}/preview.png`` (small multiples of the run's main stored metrics per step: pass rate,
mean score, zero-variance share, mean |advantage|, one colour each).

The numbers come from our own JSON API, fetched in-process, so the image shows what the page
shows. PNGs are cached on disk, keyed by a hash of everything drawn (title, texts, kinds,
advantages, layout version), bounded in count and bytes, oldest evicted first.

Modules: :mod:`.colors` (the strip's colour maths), :mod:`.layout` (geometry), :mod:`.draw`
(Pillow), :mod:`.cache` (the disk cache), :mod:`.routes` (the three routes and their data),
:mod:`.og` (the pages' Open Graph tags).
"""

from app.http.web.preview.cache import VERSION, PreviewCache, cache_for, cache_key
from app.http.web.preview.colors import (
    GRAY,
    INK,
    MUTED,
    NEG,
    POS,
    TOOL_GRAY,
    WHITE,
    adv_color,
    cell_color,
    max_abs,
)
from app.http.web.preview.draw import RUN_COLORS, draw_batch, draw_episode, draw_run
from app.http.web.preview.layout import (
    LABEL_W,
    MARGIN,
    RUN_LINE_W,
    RUN_PANELS,
    Cell,
    H,
    W,
    batch_layout,
    episode_layout,
    run_panels,
    run_points,
    run_series,
)
from app.http.web.preview.og import absolute, batch_og, episode_og, og_tags, run_og
from app.http.web.preview.routes import router

__all__ = [
    "router",
    "episode_og",
    "batch_og",
    "run_og",
    "og_tags",
    "absolute",
    "W",
    "H",
    "MARGIN",
    "LABEL_W",
    "VERSION",
    "POS",
    "NEG",
    "GRAY",
    "TOOL_GRAY",
    "WHITE",
    "INK",
    "MUTED",
    "adv_color",
    "cell_color",
    "max_abs",
    "Cell",
    "episode_layout",
    "batch_layout",
    "RUN_PANELS",
    "RUN_COLORS",
    "RUN_LINE_W",
    "run_panels",
    "run_points",
    "run_series",
    "draw_episode",
    "draw_batch",
    "draw_run",
    "PreviewCache",
    "cache_for",
    "cache_key",
]
