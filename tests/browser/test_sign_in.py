"""A private server (CREDITLENS_READ_TOKEN) in Chromium: a page redirects to the sign-in form, a
wrong token shows an error, the right one returns to the page, which then loads its data with the
HttpOnly, SameSite=Strict cookie; an unlisted batch's links (drawn by the scripts) carry its slug."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.browser import browser_data as data
from tests.browser.browser_util import shot
from tests.live_server import Server

pytestmark = pytest.mark.browser

READ = "browser-read-token"


@pytest.fixture(scope="module")
def private(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("private-browser")
    with Server(tmp / "db.sqlite", tmp / "server.log", CREDITLENS_READ_TOKEN=READ) as srv:
        auth = {"authorization": f"Bearer {READ}"}
        eps = [{**data.handbuilt(), "reward": float(i), "group": "pair"} for i in range(2)]
        out = {"base": srv.base}
        for vis, name in (("public", "open-batch"), ("unlisted", "quiet-batch")):
            r = httpx.post(
                f"{srv.base}/api/uploads",
                content=data.jsonl(eps),
                params={"format": "native", "name": name, "visibility": vis},
                headers=auth,
                timeout=120,
            )
            assert r.status_code == 201, r.text
            out[vis] = r.json()
        yield out


@pytest.fixture
def ctx(browser, private):
    c = browser.new_context(viewport={"width": 1200, "height": 800}, base_url=private["base"])
    c.set_default_timeout(60_000)
    yield c
    c.close()


def test_sign_in_flow(ctx, private):
    page = ctx.new_page()
    target = f"/b/{private['public']['batch_id']}"
    page.goto(target)
    # Redirected to the sign-in form, which remembers where to go back to.
    assert page.url.startswith(f"{private['base']}/sign-in?next=")
    assert page.is_visible("#token") and "open-batch" not in page.content()

    # A wrong token: an error, no cookie, still on the form.
    page.fill("#token", "not-the-token")
    page.click("#sign-in-submit")
    page.wait_for_selector("#sign-in-error")
    assert "not this server's read token" in page.text_content("#sign-in-error")
    assert ctx.cookies() == []
    shot(page, "sign-in-wrong-token")

    # The right token: back on the page, whose script loads the batch with the cookie.
    page.fill("#token", READ)
    page.click("#sign-in-submit")
    page.wait_for_url(f"{private['base']}{target}")
    page.wait_for_selector('body[data-ready="1"]')
    assert page.text_content("#b-name") == "open-batch"
    (cookie,) = ctx.cookies()
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and READ not in cookie["value"]
    assert page.evaluate("document.cookie") == ""  # scripts cannot read it
    shot(page, "sign-in-done")


def test_unlisted_links_carry_the_slug(ctx, private):
    page = ctx.new_page()
    page.goto(f"/sign-in?next=/b/{private['unlisted']['url'].removeprefix('/b/')}")
    page.fill("#token", READ)
    page.click("#sign-in-submit")
    slug = private["unlisted"]["url"].removeprefix("/b/")
    page.wait_for_url(f"{private['base']}/b/{slug}")
    page.wait_for_selector('body[data-ready="1"]')
    assert page.text_content("#b-name") == "quiet-batch"
    hrefs = page.eval_on_selector_all("a[href*='/g/']", "els => els.map(e => e.getAttribute('href'))")
    assert hrefs and all(h.startswith(f"/b/{slug}/g/") for h in hrefs), hrefs
    # Its id is a 404 in the browser too; the home page does not list it.
    assert page.goto(f"/b/{private['unlisted']['batch_id']}").status == 404
    page.goto("/")
    page.wait_for_selector('body[data-ready="1"]')
    assert "quiet-batch" not in page.content() and "open-batch" in page.content()
    # The episode page links back to the batch by its slug.
    page.goto(private["unlisted"]["episodes"][0]["url"])
    page.wait_for_selector(f"#ep-meta a[href='/b/{slug}']")


@pytest.mark.usefixtures("private")
def test_upload_form_takes_visibility(ctx, tmp_path):
    """Signed in, an upload from the home page's form as unlisted links to the batch by its slug."""
    page = ctx.new_page()
    page.goto("/sign-in")
    page.fill("#token", READ)
    page.click("#sign-in-submit")
    page.wait_for_selector('body[data-ready="1"]')
    f = tmp_path / "mine.jsonl"
    f.write_text(data.jsonl([data.handbuilt()]))
    page.select_option("#up-visibility", "unlisted")
    page.fill("#up-name", "form-unlisted")
    page.set_input_files("#file", str(f))
    page.click("#upload-btn")
    link = page.locator(".file-item.good .file-ok a").first
    link.wait_for()
    href = link.get_attribute("href")
    assert re.fullmatch(r"/b/[A-Za-z0-9_-]{24}", href), href
    link.click()
    page.wait_for_selector('body[data-ready="1"]')
    assert page.text_content("#b-name") == "form-unlisted"


def test_url_builders_agree_for_ids_and_slugs(ctx):
    """static/util.js builds the same batch and run URLs as app/core/urls.py, by id and by slug."""
    from app.core import urls as py

    page = ctx.new_page()
    page.goto("/healthz")  # open without the token; /static/util.js is too
    refs = [12, "Ab-_9xYz01234567890abcde"]
    js = page.evaluate(
        """async (refs) => {
          const { urls } = await import('/static/util.js');
          return refs.map((r) => [urls.batch(r), urls.group(r, 'a/b c'), urls.run(r), urls.apiBatch(r),
            urls.apiAudit(r), urls.apiGroup(r, 'a/b c'), urls.apiRun(r), urls.apiRunMetrics(r),
            urls.apiRunStep(r, 3)]);
        }""",
        refs,
    )
    want = [
        [
            py.batch(r),
            py.group(r, "a/b c"),
            py.run(r),
            py.api_batch(r),
            py.api_audit(r),
            py.api_group(r, "a/b c"),
            py.api_run(r),
            py.api_run_metrics(r),
            py.api_run_step(r, 3),
        ]
        for r in refs
    ]
    assert js == want
    assert want[0][0] == "/b/12" and want[1][2] == f"/r/{refs[1]}"
