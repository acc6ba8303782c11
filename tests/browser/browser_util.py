"""Helpers shared by the browser tests (imported by name: tests/browser is on sys.path)."""

from __future__ import annotations

from pathlib import Path

import httpx
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.browser import browser_data as data

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-artifacts" / "screenshots"


def upload(base: str, name: str, episodes: list[dict]) -> dict:
    """A real upload through the JSON API (multipart, native JSONL) -> the 201 body."""
    r = httpx.post(
        f"{base}/api/uploads",
        files={"file": (f"{name}.jsonl", data.jsonl(episodes), "application/x-ndjson")},
        data={"name": name},
        timeout=120,
    )
    assert r.status_code == 201, r.text
    return r.json()


def shot(page, name: str) -> Path:
    """Save a screenshot under test-artifacts/screenshots/ (look at them)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def wait_ready(page, selector: str = "#strip", timeout: float = 15_000) -> None:
    page.wait_for_selector(f'{selector}[data-ready="1"]', timeout=timeout)


def url_has(page, *parts: str, timeout: float = 5_000) -> None:
    """Assert that the page's address holds every one of ``parts``, read in the page itself
    (``location.href``, which ``history.replaceState`` changes at once; Playwright's ``page.url``
    learns of it from an event a moment later, so reading it right after a key press races)."""
    try:
        page.wait_for_function(
            "parts => parts.every(p => location.href.includes(p))", arg=list(parts), timeout=timeout
        )
    except PlaywrightTimeout:
        raise AssertionError(f"{list(parts)} not all in {page.evaluate('location.href')}") from None
