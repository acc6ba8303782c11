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
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from sqlmodel import func, select

from app.core import urls
from app.core import views as st
from app.core.errors import ApiError
from app.http.web.internal import api_get
from app.storage.db import SessionDep
from app.storage.models import Batch, Episode

router = APIRouter(include_in_schema=False)

W, H = 1200, 630
MARGIN = 40
LABEL_W = 210
VERSION = "preview-2"  # bump when the drawing changes: old cache entries stop matching

# static/util.js: the strip's colour scale and grays (keep in step).
POS = (33, 102, 172)
NEG = (178, 24, 43)
GRAY = (196, 196, 196)
TOOL_GRAY = (150, 150, 150)
WHITE = (255, 255, 255)
INK = (17, 17, 17)
MUTED = (90, 90, 90)


def _js_round(x: float) -> int:
    """JavaScript's Math.round (halves go up), so the colours match the browser's exactly."""
    return math.floor(x + 0.5)


def adv_color(a: float | None, scale: float) -> tuple[int, int, int] | None:
    """The colour of advantage ``a`` on the symmetric scale ±``scale`` (static/util.js advColor)."""
    if a is None or not math.isfinite(a):
        return None
    t = min(1.0, abs(a) / scale) if scale > 0 else 0.0
    end = POS if a >= 0 else NEG
    return tuple(_js_round(255 + (c - 255) * t) for c in end)  # type: ignore[return-value]


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


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _fit(draw, text: str, font, width: int) -> str:
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


# ----------------------------------------------------------------------------------- layout


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


# ----------------------------------------------------------------------------------- drawing


def _header(draw, title: str, subtitle: str) -> None:
    draw.rectangle((0, 0, W, 8), fill=POS)
    draw.text((MARGIN, 34), _fit(draw, title, _font(44), W - 2 * MARGIN), font=_font(44), fill=INK)
    draw.text((MARGIN, 92), _fit(draw, subtitle, _font(24), W - 2 * MARGIN), font=_font(24), fill=MUTED)
    f = _font(20)
    draw.text((W - MARGIN - draw.textlength("creditlens", font=f), H - 34), "creditlens", font=f, fill=MUTED)


def _legend(draw, scale: float, kinds: bool = True) -> None:
    f = _font(18)
    x, y = MARGIN, H - 34
    keys = [("+", POS), ("-", NEG)] + ([("prompt", GRAY), ("tool", TOOL_GRAY)] if kinds else [])
    for label, col in keys:
        draw.rectangle((x, y + 3, x + 16, y + 19), fill=col)
        draw.text((x + 22, y), label, font=f, fill=MUTED)
        x += 34 + int(draw.textlength(label, font=f))
    draw.text((x + 10, y), f"scale ±{scale:.3g}", font=f, fill=MUTED)


def _png(img) -> bytes:
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


# The run image's panels: the run page's main metrics (static/run.js FIGURES), one colour each.
RUN_PANELS = (
    ("pass_rate", "pass rate"),
    ("mean_score", "mean score"),
    ("zero_variance_share", "zero-variance share"),
    ("mean_abs_advantage", "mean |A| on policy tokens"),
)
RUN_COLORS = (POS, NEG, (230, 120, 20), (27, 120, 55))
RUN_LINE_W = 4


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


# ----------------------------------------------------------------------------------- cache


class PreviewCache:
    """PNG files in a folder, named by the hash of what they show; at most ``max_files`` files
    and ``max_bytes`` bytes (oldest removed first)."""

    def __init__(self, folder: Path, max_files: int = 512, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.folder = folder
        self.max_files = max_files
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        p = self.folder / f"{key}.png"
        try:
            data = p.read_bytes()
        except OSError:
            return None
        os.utime(p)  # recently used: evicted last
        return data

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".{key}.{threading.get_ident()}.tmp"
            tmp.write_bytes(data)
            tmp.replace(self.folder / f"{key}.png")
            files = sorted(self.folder.glob("*.png"), key=lambda q: q.stat().st_mtime)
            total = sum(q.stat().st_size for q in files)
            while files and (len(files) > self.max_files or total > self.max_bytes):
                old = files.pop(0)
                total -= old.stat().st_size
                old.unlink(missing_ok=True)


def cache_for(request: Request) -> PreviewCache:
    """The app's preview cache: next to a SQLite database file, else in the temp folder."""
    app = request.app
    cache = getattr(app.state, "preview_cache", None)
    if cache is None:
        url = app.state.settings.database_url
        if url.startswith("sqlite:///") and not url.endswith(":memory:"):
            folder = Path(url.removeprefix("sqlite:///")).parent / "previews"
        else:
            folder = Path(tempfile.gettempdir()) / "creditlens-previews"
        cache = app.state.preview_cache = PreviewCache(folder)
    return cache


def cache_key(kind: str, drawn: Any) -> str:
    blob = json.dumps([VERSION, kind, drawn], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:40]


# ----------------------------------------------------------------------------------- data + routes


def _num(v: Any) -> str:
    return "—" if v is None else f"{v:.3g}"


async def episode_preview_data(request: Request, slug: str) -> dict:
    """What the episode image shows, from the advantages API with the default view."""

    status, body = await api_get(request, urls.api_advantages(slug, st.EpisodeView()))
    if status >= 400 or body is None:
        raise ApiError(404, "not_found", f"episode {slug!r} does not exist.", field="slug")
    kinds = body["kinds"]
    ep = body.get("episode") or {}
    title = ep.get("task") or f"Episode {slug}"
    n_policy = sum(k == "policy" for k in kinds)
    subtitle = f"reward {_num(ep.get('reward'))} · {len(kinds)} tokens ({n_policy} policy)"
    if body.get("group"):
        subtitle += f" · group {body['group']}"
    rows = [(s["label"], s["advantages"]) for s in body["schemes"]]
    return {"title": title, "subtitle": subtitle, "kinds": kinds, "rows": rows}


async def batch_preview_data(request: Request, batch_id: int | str) -> dict:

    status, body = await api_get(request, urls.api_batch(batch_id))
    if status >= 400 or body is None:
        raise ApiError(404, "not_found", f"batch {batch_id} does not exist.", field="batch_id")
    diag = body.get("diagnostics") or {}
    counts = (diag.get("reward_histogram") or {}).get("counts") or []
    adv = [e.get("group_center") for e in (diag.get("whiten_vs_center") or {}).get("episodes") or []]
    pr = diag.get("pass_rate")
    sub = f"{body.get('n_episodes', len(adv))} episodes · {len(diag.get('groups') or [])} groups"
    if pr is not None:
        sub += f" · pass rate {pr:.0%}"
    return {"title": body.get("name") or f"Batch {batch_id}", "subtitle": sub, "counts": counts, "adv": adv}


def _png_response(data: bytes, key: str, request: Request) -> Response:
    etag = f'"{key}"'
    headers = {"cache-control": "public, max-age=300", "etag": etag}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(data, media_type="image/png", headers=headers)


async def _cached(request: Request, kind: str, drawn: dict, draw) -> Response:
    key = cache_key(kind, drawn)
    cache = cache_for(request)
    data = cache.get(key)
    if data is None:
        data = await run_in_threadpool(draw)
        await run_in_threadpool(cache.put, key, data)
    return _png_response(data, key, request)


@router.get("/e/{slug}/preview.png")
async def episode_preview(request: Request, slug: str) -> Response:
    """The episode's link-preview image (1200×630 PNG)."""
    d = await episode_preview_data(request, slug)
    return await _cached(
        request, "episode", d, lambda: draw_episode(d["title"], d["subtitle"], d["kinds"], d["rows"])
    )


@router.get("/b/{batch_id}/preview.png")
async def batch_preview(request: Request, batch_id: str) -> Response:
    """The batch's link-preview image (1200×630 PNG); by id when public, by slug when unlisted."""
    ref = int(batch_id) if batch_id.isascii() and batch_id.isdigit() and len(batch_id) < 20 else batch_id
    d = await batch_preview_data(request, ref)
    return await _cached(
        request, "batch", d, lambda: draw_batch(d["title"], d["subtitle"], d["counts"], d["adv"])
    )


async def run_preview_data(request: Request, run_id: int | str) -> dict:
    """What the run image shows, from the run's API answer (metrics stored at ingest)."""

    status, body = await api_get(request, urls.api_run(run_id))
    if status >= 400 or body is None:
        raise ApiError(404, "not_found", f"run {run_id} does not exist.", field="run_id")
    steps = body.get("steps") or []
    series: dict[str, list[list[float]]] = {}
    for s in steps:
        for k, v in (s.get("metrics") or {}).items():
            if isinstance(v, int | float) and math.isfinite(v):
                series.setdefault(k, []).append([s["step"], v])
    sub = f"training run · {len(steps)} step{'s' if len(steps) != 1 else ''}"
    if steps:
        sub += f" · last step {steps[-1]['step']}"
    return {"title": body.get("name") or f"Run {run_id}", "subtitle": sub, "series": series}


@router.get("/r/{run_id}/preview.png")
async def run_preview(request: Request, run_id: str) -> Response:
    """The run's link-preview image (1200×630 PNG)."""
    d = await run_preview_data(request, run_id)
    return await _cached(request, "run", d, lambda: draw_run(d["title"], d["series"], d["subtitle"]))


# ----------------------------------------------------------------------------------- meta tags


def absolute(request: Request, path: str) -> str:
    """``path`` as an absolute URL on the host the request came to (crawlers need absolute URLs)."""
    return str(request.base_url).rstrip("/") + path


def og_tags(request: Request, title: str, description: str, image_path: str, alt: str) -> dict:
    """The Open Graph / Twitter card values templates/_og.html renders."""
    return {
        "title": title,
        "description": description,
        "url": absolute(request, request.url.path),
        "image": absolute(request, image_path),
        "image_alt": alt,
        "width": W,
        "height": H,
    }


def episode_og(request: Request, session: SessionDep, slug: str) -> dict | None:
    """Tags for /e/{slug}, from the episode row's small columns (None if it does not exist)."""
    row = session.exec(
        select(Episode.task, Episode.n_tokens, Episode.n_policy, Episode.reward, Episode.group).where(
            Episode.slug == slug
        )
    ).first()
    if row is None:
        return None
    task, n, n_policy, reward, group = row
    title = f"{task or 'Episode'} · creditlens"
    desc = f"Which tokens got the credit: reward {_num(reward)}, {n} tokens ({n_policy} policy)"
    desc += f", group {group}." if group else "."
    alt = f"Token strips of episode {slug}: blue tokens got positive advantage, red negative."
    return og_tags(request, title, desc, urls.episode_preview(slug), alt)


def batch_og(
    request: Request, session: SessionDep, batch_id: int, ref: int | str | None = None
) -> dict | None:
    """Tags for /b/{ref} (``ref``: what its URLs carry, its slug when unlisted; default the id)."""
    ref = batch_id if ref is None else ref
    row = session.exec(select(Batch.name, Batch.n_episodes).where(Batch.id == batch_id)).first()
    if row is None:
        return None
    name, n = row
    title = f"{name or f'Batch {ref}'} · creditlens"
    desc = f"{n} episodes: reward histogram, zero-variance groups and per-episode credit."
    alt = f"Batch {ref}: reward histogram and one cell per episode coloured by its advantage."
    return og_tags(request, title, desc, urls.batch_preview(ref), alt)


def run_og(request: Request, session: SessionDep, ref: int | str) -> dict | None:
    """Tags for /r/{ref} (its id, or its slug when unlisted), from the run's name and its number
    of steps (None if it does not exist)."""
    from app.storage.runs import run_by_ref

    run = run_by_ref(session, ref)
    if run is None:
        return None
    n = session.exec(select(func.count()).select_from(Batch).where(Batch.run_id == run.id)).one()
    title = f"{run.name} · creditlens"
    desc = f"Training run, {n} step{'s' if n != 1 else ''}: pass rate, mean score, zero-variance share and advantages per step."
    alt = f"Run {run.name}: its main metrics per training step, one small chart each."
    return og_tags(request, title, desc, urls.run_preview(ref), alt)
