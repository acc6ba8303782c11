"""Fixtures shared by every suite.

``chromium``: one Playwright (sync API) session and one headless Debian Chromium for the whole run.
Playwright's sync API runs an event loop; a second ``sync_playwright()`` opened while another is
alive fails ("using Playwright Sync API inside the asyncio loop"), so every browser test takes
this one fixture instead of starting its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def chromium():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
