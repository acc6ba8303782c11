"""Cold and warm page opens in headless Chromium, timed by the page's own clock (shared by
bench/pages.py and bench/runs.py).

A page is *open* when its ``page:open`` mark is set (static/util.js ``markOpen``: one frame after
its first screen is drawn, so it is on screen); the figure is that mark's time since the
navigation started (``performance.timeOrigin``). A cold open is a fresh browser each time (nothing
cached, Plotly parsed and compiled from scratch); a warm open reuses the last one.
"""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPEN_MARK = "page:open"


def chromium() -> tuple[str, list[str]]:
    """(executable, flags) the test suite drives (tests/conftest.py, loaded by file: the name
    ``conftest`` alone would find tests/browser/conftest.py)."""
    spec = importlib.util.spec_from_file_location("creditlens_tests_conftest", ROOT / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CHROMIUM, module.CHROMIUM_ARGS


def open_seconds(page, url: str, timeout_ms: float = 60_000) -> float:
    """Navigate to ``url`` and return the page's ``page:open`` time in seconds; raises when the
    page never opens (an error shown instead, or a page that sets no mark)."""
    page.goto(url, wait_until="commit")
    page.wait_for_function(
        f"() => performance.getEntriesByName('{OPEN_MARK}').length > 0", timeout=timeout_ms
    )
    return page.evaluate(f"performance.getEntriesByName('{OPEN_MARK}')[0].startTime") / 1000


def _watch_failures(page, failed: list[str]) -> None:
    """Append to ``failed`` every answer >= 400 and every failed request of ``page``."""
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.on("requestfailed", lambda r: failed.append(f"failed {r.url}"))


def cold_and_warm(
    base: str, urls: dict[str, str], browsers: int, warm: int, fresh: bool = True
) -> dict[str, dict[str, float]]:
    """name -> {"cold_median", "cold_max", "warm_median", "failed_requests"} for each page in
    ``urls`` (paths under ``base``): ``browsers`` cold opens per page, then ``warm`` opens in the
    last page. ``fresh``: each cold open in a fresh browser; else in a fresh context of one browser
    (its own empty cache; quicker, for ``--quick``). ``failed_requests`` counts answers >= 400 and
    failed requests over every open."""
    from playwright.sync_api import sync_playwright

    exe, args = chromium()
    out: dict[str, dict[str, float]] = {}
    with sync_playwright() as p:
        shared = None if fresh else p.chromium.launch(executable_path=exe, headless=True, args=args)
        try:
            for name, path in urls.items():
                cold: list[float] = []
                warm_times: list[float] = []
                failed: list[str] = []
                for i in range(browsers):
                    browser = shared or p.chromium.launch(executable_path=exe, headless=True, args=args)
                    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
                    try:
                        page = ctx.new_page()
                        _watch_failures(page, failed)
                        page.goto(f"{base}/healthz")  # the browser is up; its cache holds nothing of ours
                        cold.append(open_seconds(page, f"{base}{path}"))
                        if i == browsers - 1:
                            warm_times = [open_seconds(page, f"{base}{path}") for _ in range(warm)]
                    finally:
                        ctx.close()
                        if browser is not shared:
                            browser.close()
                out[name] = {
                    "cold_median": round(statistics.median(cold), 3),
                    "cold_max": round(max(cold), 3),
                    "warm_median": round(statistics.median(warm_times), 3) if warm_times else float("nan"),
                    "failed_requests": len(failed),
                }
        finally:
            if shared is not None:
                shared.close()
    return out
