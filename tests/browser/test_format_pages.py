"""Episode pages of the ecosystem formats (NeMo Gym, Atropos, verifiers, verl actor micro-batch)
in headless Chromium against the real server: each fixture uploaded as a user would (multipart,
no format named), the page drawn without errors, the rows the format offers on the strip and its
tool spans collapsed. Screenshots go to test-artifacts/screenshots/ (look at them)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.browser.browser_util import shot, wait_ready

pytestmark = pytest.mark.browser

FORMATS = Path(__file__).resolve().parents[2] / "fixtures" / "formats"


def _upload(base: str, files: dict) -> list[dict]:
    r = httpx.post(f"{base}/api/uploads", files=files, timeout=120)
    assert r.status_code == 201, r.text
    return [httpx.get(f"{base}/api/episodes/{e['slug']}").json() for e in r.json()["episodes"]]


CASES = {
    "nemo_gym": (
        lambda: {
            "file": ("rollouts.jsonl", (FORMATS / "nemo_gym/tau2_synth_example_rollouts.jsonl").read_bytes())
        },
        0,
        "",
        ["outcome", "returns"],
    ),
    "atropos": (
        lambda: {
            "file": ("groups.jsonl", (FORMATS / "atropos/groups.jsonl").read_bytes()),
            "tokenizer": ("tokenizer.json", (FORMATS / "atropos/tokenizer.json").read_bytes()),
        },
        3,
        "?signal=logprob,kl,token_scores,token_weights",
        ["outcome", "returns", "logprob", "kl", "token_scores", "token_weights"],
    ),
    "verifiers": (
        lambda: {"file": ("results.jsonl", (FORMATS / "verifiers/math_python_results.jsonl").read_bytes())},
        0,
        "",
        ["outcome", "returns"],
    ),
    "verl_actor": (
        lambda: {"file": ("micro_batch_0.pt", (FORMATS / "verl_actor/micro_batch_0.pt").read_bytes())},
        1,
        "?scheme=uploaded,outcome&signal=logprob",
        ["uploaded", "outcome", "logprob"],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_format_episode_page(page, server, name):
    files, idx, query, rows = CASES[name]
    ep = _upload(server, files())[idx]
    page.goto(f"/e/{ep['slug']}{query}")
    wait_ready(page)
    names = page.evaluate("window.__strip.rows.map(r => r.name)")
    assert [n.split(":")[0] for n in names] == rows, names
    # Every tool span starts collapsed: one "(tool: N tokens)" item per span, N its length.
    spans, i, kinds = [], 0, ep["kinds"]
    while i < len(kinds):
        if kinds[i] == "tool":
            j = i
            while j < len(kinds) and kinds[j] == "tool":
                j += 1
            spans.append(j - i)
            i = j
        else:
            i += 1
    assert spans, name
    drawn = page.evaluate("window.__strip.items.filter(it => it.type === 'span').map(it => it.end - it.i)")
    assert drawn == spans, name
    assert not page.probe.errors and not page.probe.csp_violations()
    shot(page, f"format-{name}")
