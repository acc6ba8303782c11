"""The batch page at 1,000+ episodes and without uploaded advantages, in a real browser: every
figure's tick labels are readable (no two overlap on screen), the page loads only Plotly's basic
bundle, and it makes no request it expects to fail (no audit request when the batch API says
there is nothing to audit)."""

from __future__ import annotations

import pytest

from tests.browser.browser_util import SHOTS, shot, upload


def _episode(i: int, advantages: bool = False) -> dict:
    ep = {
        "tokens": ["p0", "p1", "a0", "a1", "a2"],
        "kinds": ["prompt", "prompt", "policy", "policy", "policy"],
        "reward": float(i % 3 == 0),
        "group": f"task-{i // 8:03d}",
    }
    if advantages:
        ep["advantages"] = [0.0, 0.0, 0.5, 0.5, 0.5]
    return ep


@pytest.fixture(scope="module")
def big_batch(server) -> dict:
    """1,024 episodes in 128 groups of 8, without advantages."""
    return upload(server, "big batch", [_episode(i) for i in range(1024)])


def _tick_boxes(page, fig: str) -> list[dict]:
    """Screen boxes of a figure's x tick labels, left to right."""
    return page.evaluate(
        """(id) => [...document.querySelectorAll(`#${id} .xtick text`)]
            .filter((t) => t.textContent.trim())
            .map((t) => { const r = t.getBoundingClientRect(); return { l: r.left, r: r.right, text: t.textContent }; })
            .sort((a, b) => a.l - b.l)""",
        fig,
    )


def test_a_1024_episode_batch_has_readable_labels(page, big_batch):
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(f"/b/{big_batch['batch_id']}")
    page.wait_for_selector('body[data-ready="1"]')
    page.wait_for_selector('#audit-box[data-ready="1"]')
    for fig in ("fig-whiten", "fig-groups", "fig-hist"):
        boxes = _tick_boxes(page, fig)
        assert len(boxes) >= 2, (fig, boxes)
        for a, b in zip(boxes, boxes[1:], strict=False):
            assert b["l"] >= a["r"] - 0.5, (fig, a, b)  # no two labels overlap
    # The per-episode chart keeps every episode of the page (500) as a bar; its hover names it.
    bars = page.evaluate("document.getElementById('fig-whiten').data[0]")
    assert len(bars["x"]) == 500 and len(set(bars["customdata"])) == 500
    assert "%{customdata}" in bars["hovertemplate"]
    ticks = _tick_boxes(page, "fig-whiten")
    assert all(t["text"].startswith("task-") for t in ticks) and len(ticks) < 63  # 63 groups on the page
    # Only the basic Plotly bundle (1.2 MB, not the 4.8 MB one) is loaded.
    assert any(u.endswith("/vendor/plotly-basic.min.js") for u in requests)
    assert not any(u.endswith("/vendor/plotly.min.js") for u in requests)
    shot(page, "batch-1024-episodes")
    page.locator(".figs").screenshot(path=str(SHOTS / "batch-1024-episodes-figures.png"))
    assert not page.probe.errors


def test_no_failed_request_on_a_batch_without_advantages(page, big_batch):
    failed: list[str] = []
    audits: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.on("requestfailed", lambda r: failed.append(f"failed {r.url}"))
    page.on("request", lambda r: audits.append(r.url) if r.url.endswith("/audit") else None)
    page.goto(f"/b/{big_batch['batch_id']}")
    page.wait_for_selector('#audit-box[data-ready="1"]')
    text = page.text_content("#audit-best")
    assert text.startswith("Nothing to audit:") and "`advantages`" in text
    assert audits == [] and failed == []
    assert not [m for m in page.probe.console if m.startswith("error")]
    shot(page, "batch-without-advantages")


def test_a_batch_with_advantages_is_audited(page, server):
    body = upload(server, "audited", [_episode(i, advantages=True) for i in range(16)])
    audits: list[int] = []
    page.on("response", lambda r: audits.append(r.status) if r.url.endswith("/audit") else None)
    page.goto(f"/b/{body['batch_id']}")
    page.wait_for_selector('#audit-box[data-ready="1"]')
    assert audits == [200]
    assert "Nothing to audit" not in page.text_content("#audit-best")
