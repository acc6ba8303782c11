"""The page scripts: one module of page helpers (one `$`, one `plot`, one `clip`), page scripts that
no module imports as a library, and an episode URL written from the server's own list of query keys
(EpisodeView.QUERY_KEYS), checked in a real browser against the server's JSON twin."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.browser import browser_data as data
from tests.browser.browser_util import ROOT, upload, wait_ready

pytestmark = pytest.mark.browser

STATIC = ROOT / "static"
IMPORT = re.compile(r'^import .* from "\./([a-z_]+\.js)";', re.M)


def page_scripts() -> set[str]:
    """The scripts a template loads as its page's module (<script type="module" src=...>)."""
    out = set()
    for t in (ROOT / "templates").rglob("*.html"):
        out |= set(re.findall(r"urls\.static\('([a-z_]+\.js)'\)\)?\s*\}\}\"></script>", t.read_text()))
    return out


def test_one_dollar_one_plot_one_clip_and_no_page_script_imported_as_a_library():
    sources = {p.name: p.read_text() for p in STATIC.glob("*.js")}
    declares = lambda pattern: sorted(n for n, s in sources.items() if re.search(pattern, s, re.M))  # noqa: E731
    assert declares(r"^(export )?const \$ = ") == ["page.js"]
    assert declares(r"^(export )?function plot\(") == ["page.js"]
    assert declares(r"^(export )?function clip\(") == ["page.js"]
    pages = page_scripts()
    assert {"batch.js", "group.js", "talk.js", "episode.js", "home.js", "run.js"} <= pages
    imported = {m for s in sources.values() for m in IMPORT.findall(s)}
    assert not imported & pages, "a page script is imported as a library"
    # Page code runs unguarded: no `if ($("x"))` checks for being on its own page.
    for name in ("batch.js", "group.js"):
        assert '$("b-name") &&' not in sources[name] and '$("g-name") &&' not in sources[name]


def test_the_episode_url_is_the_servers_canonical_query(page, server):
    slug = upload(server, "page-scripts", [data.handbuilt()])["episodes"][0]["slug"]
    asked = "scheme=loss_weights,token_gae&lam=0.5&rollout_is_threshold=0.5_2&agg=token-sum&signal=&tok=3&open=7,2&chart=0"
    twin = httpx.get(f"{server}/e/{slug}?{asked}&format=json", timeout=30).json()
    page.goto(f"/e/{slug}?{asked}")
    wait_ready(page)
    assert page.evaluate("document.getElementById('strip').dataset.query") == twin["query"]
    # The loss row's keys come only with that row; open is sorted; page-only keys stay off the API.
    assert twin["query"] == (
        "scheme=loss_weights,token_gae&gamma=1&lam=0.5&baseline=rloo&critic=upload&loss=vanilla"
        "&agg=token-sum&rollout_is=none&rollout_is_threshold=0.5_2&open=2,7&tok=3"
    )
    # A real key press on a row box: the page's new URL is again what the server writes for it.
    page.click("#schemes-box > summary")
    page.focus('input[name="scheme"][value="loss_weights"]')
    page.keyboard.press("Space")
    page.wait_for_function("() => !location.search.includes('loss=')")
    wait_ready(page)
    query = page.evaluate("location.search.slice(1)")
    again = httpx.get(f"{server}/e/{slug}?{query}&format=json", timeout=30).json()
    assert (
        query
        == again["query"]
        == "scheme=token_gae&gamma=1&lam=0.5&baseline=rloo&critic=upload&open=2,7&tok=3"
    )
    assert page.probe.errors == [] and page.probe.csp_violations() == []
