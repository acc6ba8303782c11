"""The episode page draws token-in/token-out drift: a NeMo Gym rollout whose second prompt
re-renders the first call's ids (hand-written as in tests/app/ingest/test_fmt_nemo_gym.py) is
uploaded for real and opened in Chromium; the drift section shows the sampled span over the
prompt's re-render, marks the sampled token without a counterpart, shows ids on hover and moves
the strip's cursor when clicked."""

from __future__ import annotations

import json

import httpx
import pytest
from playwright.sync_api import expect

from tests.app.ingest.test_fmt_nemo_gym import _drifting_turns, _rollout, _two_turns
from tests.browser.browser_util import shot, url_has, wait_ready

pytestmark = pytest.mark.browser


def _upload(server: str, rows: list[dict]) -> list[dict]:
    data = "".join(json.dumps(r) + "\n" for r in rows)
    r = httpx.post(f"{server}/api/uploads", files={"file": ("rollouts.jsonl", data)}, timeout=120)
    assert r.status_code == 201, r.text
    return r.json()["episodes"]


def test_the_re_rendered_span_under_the_sampled_one(page, server):
    drifting, clean = _upload(
        server, [_rollout(1, 0, 1.0, _drifting_turns()), _rollout(1, 1, 0.0, _two_turns())]
    )
    page.goto(f"/e/{drifting['slug']}")
    wait_ready(page)
    box = page.locator("#drift-box")
    expect(box).to_be_visible()
    turn = box.locator(".drift-turn")
    expect(turn).to_have_count(1)
    expect(turn.locator(".drift-jump")).to_contain_text("call 1: 1 of 2 sampled tokens")
    # Sampled (stored positions 5, 6: ids 21, 22) over the re-render (99, 22).
    expect(turn.locator(".drift-sampled .drift-tok")).to_have_text(["⟨21⟩", "⟨22⟩"])
    expect(turn.locator(".drift-sampled .drift-diff")).to_have_text(["⟨21⟩"])
    rer = turn.locator(".drift-rerendered .drift-tok")
    expect(rer).to_have_text(["⟨99⟩", "⟨22⟩"])
    assert rer.first.get_attribute("title") == "id 99"
    turn.locator(".drift-jump").click()
    page.wait_for_function("window.__strip.cursor === 5")  # the sampled span's first token
    url_has(page, "tok=5")
    shot(page, "episode-drift")
    assert not page.probe.errors
    # An episode without drift has no such section.
    page.goto(f"/e/{clean['slug']}")
    wait_ready(page)
    expect(page.locator("#drift-box")).to_be_hidden()


def test_a_run_that_retokenizes_shows_it_in_its_steps(page, server):
    run = httpx.post(f"{server}/api/runs", json={"name": "tito-run"}, timeout=60).json()
    data = "".join(
        json.dumps(r) + "\n"
        for r in [_rollout(1, 0, 1.0, _drifting_turns()), _rollout(1, 1, 0.0, _two_turns())]
    )
    r = httpx.post(f"{server}/api/runs/{run['id']}/steps/0", files={"file": ("s.jsonl", data)}, timeout=120)
    assert r.status_code == 201, r.text
    page.goto(f"/r/{run['id']}")
    steps = page.locator("#steps")
    expect(steps.locator("th")).to_contain_text(["policy tokens with drift"])
    # 1 re-rendered sampled token of 8 + 6 policy tokens = 7.14 %: shown to 0 decimals.
    expect(steps.locator("tbody tr").first.locator("td").nth(7)).to_have_text("7%")
    assert not page.probe.errors
