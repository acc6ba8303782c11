"""The /sample page in a real browser: fill the form, watch the progress bar, follow the batch link.

A real uvicorn server on a free 127.0.0.1 port with a temp SQLite file; Debian's chromium, headless.
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("simserver")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "CREDITLENS_DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite'}", "CREDITLENS_DEMO": "0"}
    env.pop("CREDITLENS_WRITE_TOKEN", None)
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "app.main:create_app",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
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
            raise RuntimeError((tmp / "server.log").read_text()[-3000:])
        time.sleep(0.25)
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def page():
    if not Path(CHROMIUM).exists():
        pytest.skip("no /usr/bin/chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        pg = browser.new_page()
        errors = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.errors = errors
        yield pg
        browser.close()


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
