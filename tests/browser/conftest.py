"""Browser tests: a real uvicorn server on a free 127.0.0.1 port with a temp SQLite file, driven
by Playwright (sync API) through Debian's /usr/bin/chromium, headless."""

from __future__ import annotations

import pytest

from tests.browser import browser_data as data
from tests.browser.browser_util import upload
from tests.live_server import Server
from tests.page_probe import PageProbe


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> str:
    """Base URL of a real server process (uvicorn, app.main:create_app) on a fresh database."""
    tmp = tmp_path_factory.mktemp("server")
    with Server(tmp / "creditlens.db", tmp / "server.log") as srv:
        yield srv.base


@pytest.fixture(scope="session")
def demo(server) -> dict:
    """The demo batches talk mode looks up by name, uploaded for real: name -> upload body."""
    return {
        "handbuilt": upload(server, "handbuilt", [data.handbuilt()]),
        "bugfix": upload(server, "bugfix", data.bugfix_batch()),
    }


@pytest.fixture(scope="session")
def browser(chromium):
    return chromium


@pytest.fixture
def page(browser, server):
    """A fresh page (own context, clipboard allowed) with a probe at ``page.probe``."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900}, base_url=server)
    ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
    ctx.set_default_timeout(60_000)  # the machine is shared; waits are for events, not speed
    pg = ctx.new_page()
    pg.probe = PageProbe(pg)
    yield pg
    ctx.close()
