"""XSS in the real browser: payloads in tokens, group and task names, metadata, batch names and
upload file names stay inert text on every page.

A real server process (uvicorn, temp SQLite) and headless Chromium through Playwright. Every page
is opened with listeners for dialogs (alert/confirm/prompt), uncaught page errors and CSP
violations (a violation would mean some payload reached a place where it tried to run and only
the policy stopped it); none may occur. The payloads must also show up as visible text where the
page displays those names, so the test cannot pass by showing nothing.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest

from tests.adversarial.adv_helpers import Server
from tests.adversarial.test_adv_security import EVIL, IMG, SCRIPT, TEMPLATE, evil_episode
from tests.page_probe import PageProbe

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FILE_NAME = f"{IMG} {SCRIPT.replace('/', '')} {TEMPLATE}.jsonl"  # no "/" in a file name


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("xss")
    with Server(tmp / "db.sqlite", tmp / "server.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def evil(server):
    body = "".join(json.dumps(evil_episode(k)) + "\n" for k in range(4))
    r = httpx.post(
        f"{server.base}/api/uploads",
        files={"file": (FILE_NAME, body)},
        params={"name": EVIL},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture(scope="module")
def browser(chromium):
    return chromium


@pytest.fixture
def page(browser, server):
    ctx = browser.new_context(base_url=server.base, viewport={"width": 1300, "height": 900})
    ctx.set_default_timeout(60_000)
    pg = ctx.new_page()
    pg.probe = PageProbe(pg)
    yield pg
    ctx.close()


def visit(page, url: str) -> str:
    """Open ``url``, let its fetches finish, move the mouse over it; the body's visible text."""
    page.goto(url, wait_until="networkidle")
    for y in (150, 300, 450, 600):
        for x in (100, 400, 700, 1000):
            page.mouse.move(x, y)
    # Hover handlers ran during the moves; wait until the browser has painted the frames after them.
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    return page.inner_text("body")


def assert_inert(page, url: str) -> None:
    p = page.probe
    assert p.dialogs == [], (url, p.dialogs)
    assert p.csp_violations() == [], (url, p.csp_violations())
    assert p.errors == [], (url, p.errors)  # any uncaught error, not only a payload that ran
    assert page.evaluate("document.querySelectorAll('img[src=x], svg[onload]').length") == 0, url
    assert page.evaluate("document.querySelectorAll('a[href^=\"javascript:\" i]').length") == 0, url


def test_episode_page(page, evil):
    slug = evil["episodes"][0]["slug"]
    for url in (f"/e/{slug}", f"/e/{slug}?scheme={quote(EVIL)}&baseline={quote(EVIL)}&open=0&tok=3"):
        text = visit(page, url)
        # The strip is a canvas; focus it and walk the tokens so tooltips render every payload.
        page.wait_for_selector('#strip[data-ready="1"]')
        before = page.evaluate("window.__strip.cursor")
        page.locator("#strip canvas.strip-canvas").focus()  # the focusable part of the strip
        for _ in range(20):
            page.keyboard.press("ArrowRight")
        after = page.evaluate("window.__strip.cursor")
        assert after is not None and after != before, (url, before, after)
        assert page.locator("#strip .hover-panel").is_visible(), url
        assert_inert(page, url)
        assert "x49x" not in text


def test_batch_group_and_home_pages(page, evil):
    b = evil["batch_id"]
    pages = {
        "/": True,
        f"/?q={quote(SCRIPT)}": True,
        f"/b/{b}": True,
        f"/b/{b}/g/{quote(EVIL, safe='')}": True,
    }
    for url, shows_payload in pages.items():
        text = visit(page, url)
        assert_inert(page, url)
        assert "x49x" not in text, url
        if shows_payload:
            assert SCRIPT in text, (url, text[:500])


@pytest.mark.usefixtures("evil")
def test_other_pages(page):
    q = quote(EVIL, safe="")
    img = quote(IMG + TEMPLATE, safe="")  # no "/": the episode page's own 404
    pages = (
        "/talk/1",
        "/talk/2",
        "/talk/3",
        "/lab",
        f"/lab/lambda?gamma={q}",
        "/sample",
        f"/b/{q}",
        f"/e/{img}",
    )
    for url in pages:
        text = visit(page, url)
        assert_inert(page, url)
        assert "x49x" not in text, url


@pytest.mark.usefixtures("server")
def test_upload_form_with_evil_file_and_batch_name(page, tmp_path):
    """Upload through the home page's form: the evil file name and batch name come back as text."""
    f = tmp_path / FILE_NAME
    f.write_text("".join(json.dumps(evil_episode(k)) + "\n" for k in range(2)))
    page.goto("/", wait_until="networkidle")
    page.set_input_files("#file", str(f))
    page.fill("#up-name", EVIL)
    with page.expect_response(lambda r: "/api/uploads" in r.url) as resp:
        page.click("#upload-btn")
    assert resp.value.status == 201
    page.wait_for_load_state("networkidle")
    assert_inert(page, "/ (after upload)")
    text = visit(page, "/")
    assert_inert(page, "/ (listing)")
    assert SCRIPT in text
