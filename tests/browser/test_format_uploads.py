"""Files from other projects in the browser: the mapping form on the upload page, and an episode
page of each chat-trajectory format (screenshots under test-artifacts/screenshots/, looked at).

The files are the public examples under fixtures/formats/ (each README names its repository and
path); the mapping case is a hand-written file of a shape no format knows."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.browser_util import ROOT, shot, wait_ready

pytestmark = pytest.mark.browser

FORMATS = ROOT / "fixtures" / "formats"


def test_mapping_form_filled_from_the_fields_seen(page, tmp_path):
    # Two texts under keys that name nothing: no reader finds a transcript in it.
    rows = [{"q": "weather in Paris?", "a": "It is 20C.", "eval": {"passed": 1.0}, "prompt_uid": "p1"}]
    f = tmp_path / "odd.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    page.goto("/")
    page.set_input_files("#file", str(f))
    page.click("#upload-btn")
    form = page.locator(".mapping-form")
    expect(form).to_be_visible()
    expect(page.locator(".file-error").first).to_contain_text("eval.passed: number")
    # Filled from the first record: the numeric reward is guessed; the texts are chosen.
    assert form.locator('[name="reward"]').input_value() == "eval.passed"
    form.locator('[name="prompt"]').select_option("q")
    form.locator('[name="response"]').select_option("a")
    options = form.locator('[name="group"] option').all_text_contents()
    assert "prompt_uid (string)" in options
    form.locator('[name="group"]').select_option("prompt_uid")
    form.locator(".map-upload").click()
    ok = page.locator(".file-ok")
    expect(ok).to_contain_text("Stored 1 episode")
    ok.locator("a.episode-link").first.click()
    wait_ready(page)
    expect(page.locator("#ep-meta")).to_contain_text("group p1")
    expect(page.locator("#ep-meta")).to_contain_text("reward 1")
    shot(page, "format-mapped-episode")
    assert not page.probe.errors


CASES = [
    ("tau_bench", "tau_bench/gpt-4o-airline_task0.json", True),
    ("swe_agent", "swe_agent/function_calling.traj", False),
    ("openhands", "openhands/basic.json", False),
    ("agentbench", "agentbench/runs.jsonl", False),
    ("verl_rollout", "verl_rollout_multiturn/dump.jsonl", True),
    ("agent_lightning", "agent_lightning/store.jsonl", True),
]


@pytest.mark.parametrize(("fmt", "path", "rewarded"), CASES, ids=[c[0] for c in CASES])
def test_episode_page_of_each_format(page, server, fmt, path, rewarded):
    file = FORMATS / path
    files = {"file": (Path(path).name, file.read_bytes())}
    if (file.parent / "tokenizer.json").is_file():  # token ids: shown through the model's tokenizer
        files["tokenizer"] = ("tokenizer.json", (file.parent / "tokenizer.json").read_bytes())
    r = httpx.post(f"{server}/api/uploads", files=files, timeout=120)
    assert r.status_code == 201, r.text
    body = r.json()
    slug = body["episodes"][2 if fmt == "verl_rollout" else 0]["slug"]  # verl: a sample with two tool calls
    page.goto(f"/e/{slug}?critic=zero")
    wait_ready(page)
    meta = page.locator("#ep-meta")
    notice = page.locator("#no-reward")
    if rewarded:
        expect(notice).to_be_hidden()
        expect(meta).to_contain_text("reward ")
    else:
        expect(notice).to_be_visible()
        expect(meta).to_contain_text("no reward")
        # No advantage anywhere on the strip: every computed row is empty.
        vals = page.evaluate("window.__strip.rows.map(r => r.advantages.filter(v => v !== null).length)")
        assert vals and all(v == 0 for v in vals)
    n_tool = page.evaluate("window.__strip.data.kinds.filter(k => k === 'tool').length")
    assert (n_tool > 0) == (fmt != "agentbench")
    shot(page, f"format-{fmt}-episode")
    assert not page.probe.errors
