"""Browser tests: a real uvicorn server on a free 127.0.0.1 port with a temp SQLite file, driven
by Playwright (sync API) through Debian's /usr/bin/chromium, headless."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import browser_data as data
import httpx
import pytest
from browser_util import upload

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> str:
    """Base URL of a real server process (uvicorn, app.main:create_app) on a fresh database."""
    tmp = tmp_path_factory.mktemp("server")
    port = _free_port()
    env = {
        **os.environ,
        "CREDITLENS_DATABASE_URL": f"sqlite:///{tmp / 'creditlens.db'}",
        "CREDITLENS_DEMO": "0",
    }
    env.pop("CREDITLENS_WRITE_TOKEN", None)
    log = open(tmp / "server.log", "wb")
    cmd = [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--host", "127.0.0.1"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"server did not start: {(tmp / 'server.log').read_text()[-3000:]}")
        time.sleep(0.25)
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="session")
def demo(server) -> dict:
    """The demo batches talk mode looks up by name, uploaded for real: name -> upload body."""
    return {
        "handbuilt": upload(server, "handbuilt", [data.handbuilt()]),
        "bugfix": upload(server, "bugfix", data.bugfix_batch()),
    }


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


class PageProbe:
    """Everything a page did that a test may assert on: dialogs, page errors, CSP violations."""

    def __init__(self, page):
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.console: list[str] = []
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))

    def _dialog(self, dialog):
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def csp_violations(self) -> list[str]:
        return [m for m in self.console if "Content Security Policy" in m]


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
