"""The /sample page in a real browser: fill the form, watch the progress bar, follow the batch link.

A real uvicorn server on a free 127.0.0.1 port with a temp SQLite file; Debian's chromium, headless.
"""

import httpx
import pytest

from tests.live_server import Server

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    with Server(tmp / "db.sqlite", tmp / "server.log") as srv:
        yield srv.base


@pytest.fixture(scope="module")
def page(chromium):
    pg = chromium.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.errors = errors
    yield pg
    pg.close()


def test_sample_form_shows_progress_and_links_the_batch(server, page):
    page.goto(f"{server}/sample")
    page.fill("#n_tasks", "5")
    page.fill("#n_per_task", "4")
    page.fill("#seed", "3")
    page.check("#critic")
    page.click("#sample-go")
    # The bar appears while the background job runs...
    page.wait_for_selector("#sample-progress:not([hidden])", timeout=10_000)
    # ...and the result links the stored batch.
    link = page.wait_for_selector("#batch-link", timeout=120_000)
    href = link.get_attribute("href")
    assert href.startswith("/b/")
    assert float(page.eval_on_selector("#sample-progress", "p => p.value")) == 1.0
    text = page.inner_text("#sample-result")
    assert "critic explained variance, fresh episodes" in text and "zero-variance share" in text
    batch = httpx.get(f"{server}/api/batches/{href.rsplit('/', 1)[1]}").json()
    assert batch["n_episodes"] == 20 and batch["source"] == "sample:bugfix"
    assert page.errors == []


def test_bad_knob_shows_the_api_message(server, page):
    page.goto(f"{server}/sample")
    page.fill("#knob-temperature", "0")
    page.click("#sample-go")
    err = page.wait_for_selector("#sample-error .error", timeout=10_000)
    assert "temperature" in err.inner_text()


def test_sample_form_unlisted_links_the_batch_by_slug(server, page):
    page.goto(f"{server}/sample")
    page.fill("#n_tasks", "1")
    page.fill("#n_per_task", "2")
    page.select_option("#visibility", "unlisted")
    page.click("#sample-go")
    href = page.wait_for_selector("#batch-link", timeout=120_000).get_attribute("href")
    slug = href.rsplit("/", 1)[1]
    assert not slug.isdigit() and len(slug) == 24, href
    batch = httpx.get(f"{server}/api/batches/{slug}").json()
    assert batch["visibility"] == "unlisted" and batch["n_episodes"] == 2
    assert batch["id"] not in {b["id"] for b in httpx.get(f"{server}/api/batches").json()}
    assert page.errors == []
