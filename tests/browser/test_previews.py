"""Link previews, against the real server in headless Chromium: the episode, batch and run pages
carry Open Graph / Twitter card tags whose og:image is an absolute URL to a 1200×630 PNG; loaded
in the page (so the page's CSP applies), its pixels show the strip colours where the layout puts
each token (blue positive, red negative, gray prompt/tool) for the default view's numbers, and
for a run each metric's line in its colour where its stored values put it."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from app.core import urls
from app.core import views as st
from app.http.web import preview as pv
from tests.browser.browser_util import upload

pytestmark = pytest.mark.browser

T_PROMPT, T_POL1, T_TOOL, T_POL2 = 3, 4, 2, 3


def _ep(reward: float, values: list[float]) -> dict:
    kinds = ["prompt"] * T_PROMPT + ["policy"] * T_POL1 + ["tool"] * T_TOOL + ["policy"] * T_POL2
    return {
        "tokens": [f"t{i}" for i in range(len(kinds))],
        "kinds": kinds,
        "reward": reward,
        "values": values,
        "group": "g",
        "meta": {"task": "preview check"},
    }


# The failed attempt's critic swings up and down: its token-GAE row has blue and red tokens.
VALUES = [0, 0, 0, 0, 2, 0, 2, 0, 0, 0, 2, 0]


@pytest.fixture(scope="module")
def uploaded(server):
    return upload(server, "previews", [_ep(1.0, [0.5] * 12), _ep(0.0, VALUES)])


def _og(page) -> dict:
    return page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('meta[property^="og:"], meta[name^="twitter:"]')]
             .map(m => [m.getAttribute('property') || m.getAttribute('name'), m.content]))"""
    )


def _pixels(page, src: str, points: list[tuple[int, int]]) -> dict:
    """Load ``src`` as an <img> in the page, draw it on a canvas, read the RGB at ``points``."""
    return page.evaluate(
        """async ([src, points]) => {
             const img = new Image();
             await new Promise((ok, bad) => { img.onload = ok; img.onerror = bad; img.src = src; });
             const c = document.createElement('canvas');
             c.width = img.naturalWidth; c.height = img.naturalHeight;
             const ctx = c.getContext('2d');
             ctx.drawImage(img, 0, 0);
             const px = points.map(([x, y]) => Array.from(ctx.getImageData(x, y, 1, 1).data.slice(0, 3)));
             return {w: img.naturalWidth, h: img.naturalHeight, px};
           }""",
        [src, points],
    )


def _centre(c: pv.Cell) -> tuple[int, int]:
    return (c.x0 + c.x1) // 2, (c.y0 + c.y1) // 2


def test_episode_link_preview_shows_the_strip_colours(page, server, uploaded):
    slug = uploaded["episodes"][1]["slug"]
    page.goto(f"/e/{slug}")
    og = _og(page)
    assert og["twitter:card"] == "summary_large_image"
    assert og["og:image"] == f"{server}/e/{slug}/preview.png"  # absolute
    assert og["og:url"] == f"{server}/e/{slug}" and "preview check" in og["og:title"]
    assert og["og:image:width"] == "1200" and og["og:image:height"] == "630"
    assert og["twitter:image"] == og["og:image"]

    adv = httpx.get(server + urls.api_advantages(slug, st.EpisodeView())).json()
    kinds = adv["kinds"]
    rows = [s["advantages"] for s in adv["schemes"]]
    scale = pv.max_abs(rows, kinds)
    cells = pv.episode_layout(len(kinds), len(rows))
    assert len(cells) == len(kinds) * len(rows)  # a cell per token per row at this size
    got = _pixels(page, og["og:image"], [_centre(c) for c in cells])
    assert (got["w"], got["h"]) == (1200, 630)
    want = [list(pv.cell_color(kinds[c.i], rows[c.row][c.i], scale)) for c in cells]
    assert got["px"] == want
    # Exactly the strip's colours: RLOO gives the failed attempt -1 on every policy token (half
    # way to red on the shared scale, set by token GAE's -2); token GAE has positive (blue) and
    # negative (red) tokens in one row.
    assert scale == pytest.approx(2.0, abs=0.1)
    outcome = [px for c, px in zip(cells, got["px"], strict=True) if c.row == 0 and kinds[c.i] == "policy"]
    assert outcome and all(px == list(pv.adv_color(-1.0, scale)) for px in outcome)
    assert outcome[0][0] > outcome[0][2]
    gae = [
        (rows[1][c.i], px)
        for c, px in zip(cells, got["px"], strict=True)
        if c.row == 1 and kinds[c.i] == "policy"
    ]
    blue = [px for a, px in gae if a > 0.05]
    red = [px for a, px in gae if a < -0.05]
    assert blue and red
    assert all(px[2] > px[0] for px in blue) and all(px[0] > px[2] for px in red)
    prompt = [px for c, px in zip(cells, got["px"], strict=True) if kinds[c.i] == "prompt"]
    tool = [px for c, px in zip(cells, got["px"], strict=True) if kinds[c.i] == "tool"]
    assert all(px == list(pv.GRAY) for px in prompt) and all(px == list(pv.TOOL_GRAY) for px in tool)


def test_batch_link_preview_shows_each_episode_in_its_colour(page, server, uploaded):
    bid = uploaded["batch_id"]
    page.goto(f"/b/{bid}")
    og = _og(page)
    assert og["og:image"] == f"{server}/b/{bid}/preview.png" and og["twitter:card"] == "summary_large_image"
    diag = httpx.get(f"{server}/api/batches/{bid}").json()["diagnostics"]
    adv = [e["group_center"] for e in diag["whiten_vs_center"]["episodes"]]
    bars, cells = pv.batch_layout(len(diag["reward_histogram"]["counts"]), len(adv))
    got = _pixels(page, og["og:image"], [_centre(c) for c in cells])
    assert (got["w"], got["h"]) == (1200, 630)
    scale = max(abs(a) for a in adv)
    assert got["px"] == [list(pv.cell_color("policy", a, scale)) for a in adv]
    # the success is full blue, the failure full red
    assert sorted(map(tuple, got["px"])) == sorted([pv.POS, pv.NEG])


def test_preview_png_is_cached_and_revalidated(server, uploaded):
    slug = uploaded["episodes"][0]["slug"]
    a = httpx.get(f"{server}/e/{slug}/preview.png")
    b = httpx.get(f"{server}/e/{slug}/preview.png", headers={"if-none-match": a.headers["etag"]})
    assert a.status_code == 200 and a.headers["content-type"] == "image/png"
    assert b.status_code == 304 and b.headers["etag"] == a.headers["etag"]
    assert httpx.get(f"{server}/e/nosuchslug/preview.png").status_code == 404


def test_cache_is_bounded(tmp_path):
    cache = pv.PreviewCache(tmp_path, max_files=2)
    for k in ("a", "b", "c"):
        cache.put(k, b"x" * 10)
    assert cache.get("a") is None and cache.get("c") == b"x" * 10
    assert len(list(tmp_path.glob("*.png"))) == 2


def test_colour_scale_matches_the_strip():
    """util.js advColor: white at 0, the end colour at ±scale, JavaScript rounding in between."""
    assert pv.adv_color(0.0, 1.0) == (255, 255, 255)
    assert pv.adv_color(1.0, 1.0) == pv.POS and pv.adv_color(-2.0, 1.0) == pv.NEG
    # 255 + (33 - 255) * 0.5 = 144 exactly; (102 - 255) * 0.5 = -76.5 -> Math.round(178.5) = 179
    assert pv.adv_color(0.5, 1.0) == (144, 179, 214)
    assert pv.adv_color(None, 1.0) is None and pv.adv_color(math.nan, 1.0) is None


@pytest.fixture(scope="module")
def run(server):
    """A run of 4 steps (0, 5, 10, 15) whose pass rate climbs 0, 1/4, 1/2, 3/4."""
    r = httpx.post(f"{server}/api/runs", json={"name": "preview-run", "config": {}})
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    for k in range(4):
        eps = [_ep(float(i < k), [0.5] * 12) for i in range(4)]
        body = "".join(json.dumps(e) + "\n" for e in eps)
        got = httpx.post(f"{server}/api/runs/{rid}/steps/{5 * k}", content=body, params={"format": "native"})
        assert got.status_code == 201, got.text
    return rid


def test_run_link_preview_draws_each_metric_in_its_colour(page, server, run):
    page.goto(urls.run(run))
    og = _og(page)
    assert og["og:image"] == server + urls.run_preview(run) and og["twitter:card"] == "summary_large_image"
    assert "preview-run" in og["og:title"] and "4 steps" in og["og:description"]
    assert og["twitter:image"] == og["og:image"]

    steps = httpx.get(server + urls.api_run(run)).json()["steps"]
    series = {k: [[s["step"], s["metrics"][k]] for s in steps] for k in steps[0]["metrics"]}
    assert [v for _, v in series["pass_rate"]] == [0.0, 0.25, 0.5, 0.75]
    panels = pv.run_series(series)
    assert [name for name, _, _ in panels][:2] == ["pass_rate", "mean_score"]
    rects = pv.run_panels(len(panels))
    points, want = [], []
    for k, ((_, _, pts), rect) in enumerate(zip(panels, rects, strict=True)):
        xy = pv.run_points(rect, pts)
        # every vertex and the middle of every segment lies on the line
        on_line = xy + [((a[0] + b[0]) // 2, (a[1] + b[1]) // 2) for a, b in zip(xy, xy[1:], strict=False)]
        points += on_line
        want += [list(pv.RUN_COLORS[k])] * len(on_line)
    got = _pixels(page, og["og:image"], points)
    assert (got["w"], got["h"]) == (1200, 630)
    assert got["px"] == want
    # The pass rate climbs: its line goes from the panel's bottom (step 0) to its top (step 15).
    x0, y0, x1, y1 = rects[0]
    first, last = pv.run_points(rects[0], panels[0][2])[0], pv.run_points(rects[0], panels[0][2])[-1]
    assert first[1] > last[1] and first[0] < last[0]
    assert y1 - first[1] <= pv.RUN_LINE_W and last[1] - y0 <= pv.RUN_LINE_W
    # Off the lines the panel is white.
    blank = _pixels(page, og["og:image"], [(x0 + 2 * pv.RUN_LINE_W + 1, y0 + 2 * pv.RUN_LINE_W + 1)])
    assert blank["px"] == [list(pv.WHITE)]


def test_run_preview_is_cached_and_follows_new_steps(server, run):
    a = httpx.get(server + urls.run_preview(run))
    assert a.status_code == 200 and a.headers["content-type"] == "image/png"
    b = httpx.get(server + urls.run_preview(run), headers={"if-none-match": a.headers["etag"]})
    assert b.status_code == 304
    assert httpx.get(server + urls.run_preview(10**6)).status_code == 404
    empty = httpx.post(f"{server}/api/runs", json={"name": "no steps yet", "config": {}}).json()["id"]
    c = httpx.get(server + urls.run_preview(empty))
    assert c.status_code == 200 and c.headers["etag"] != a.headers["etag"]


def test_run_image_draws_bare_series():
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(pv.draw_run("run 7", {"reward": [0.0, 0.5, 1.0]})))
    assert img.size == (1200, 630)
    ((_, _, pts),) = pv.run_series({"reward": [0.0, 0.5, 1.0]})
    xy = pv.run_points(pv.run_panels(1)[0], pts)
    assert [img.getpixel(p) for p in xy] == [pv.RUN_COLORS[0]] * 3


def test_an_episode_without_critic_values_opens_and_previews_with_no_failed_request(page, server):
    # A GRPO user's upload: rewards and groups, no `values`. Its default view is critic-free
    # (outcome, returns-to-go): the page's first request answers 200 and the preview renders.
    eps = [{**_ep(r, [0.0] * 12), "meta": {"task": "no critic"}} for r in (1.0, 0.0)]
    for e in eps:
        del e["values"]
    slug = upload(server, "no-critic", eps)["episodes"][0]["slug"]
    bad: list[str] = []
    page.on("response", lambda r: bad.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.on("requestfailed", lambda r: bad.append(f"failed {r.url}"))
    page.goto(f"/e/{slug}")
    page.wait_for_selector('#strip[data-ready="1"]')
    assert "scheme=outcome,returns&" in page.url  # the server's default view, written to the URL
    assert page.locator("#error").is_hidden()
    og = _og(page)
    adv = httpx.get(server + urls.api_advantages(slug)).json()
    kinds, rows = adv["kinds"], [s["advantages"] for s in adv["schemes"]]
    assert [s["name"] for s in adv["schemes"]] == ["outcome", "returns"]
    cells = pv.episode_layout(len(kinds), len(rows))
    got = _pixels(page, og["og:image"], [_centre(c) for c in cells])
    assert (got["w"], got["h"]) == (1200, 630)
    scale = pv.max_abs(rows, kinds)
    assert got["px"] == [list(pv.cell_color(kinds[c.i], rows[c.row][c.i], scale)) for c in cells]
    assert bad == []
    assert [m for m in page.probe.console if m.startswith("error")] == [] and page.probe.errors == []
