"""/trainers against the real server: every trainer's dialects drawn as token strips on the
canonical episodes, reached from the top bar, and each cell's numbers the API's."""

from __future__ import annotations

import httpx
import pytest

from estimators import available
from estimators.registry import TRAINERS

pytestmark = pytest.mark.browser


def test_trainers_page_draws_every_dialect_on_every_case(page, server):
    page.goto("/")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Trainers").click()
    page.wait_for_selector('#t-table[data-ready="1"]')
    assert page.title() == "Trainers' credit, side by side · creditlens"
    sections = page.locator("section.trainer h2").all_inner_texts()
    assert sections == [f"{name} {version}" for name, version in TRAINERS.values()]
    dialects = [n for n, s in available().items() if s.trainer is not None]
    assert page.locator("tr[id^=d-]").count() == len(dialects)
    # verl's rloo on the group of one: its score 0.7 on each of the 4 policy tokens (the API's).
    api = httpx.get(f"{server}/api/trainers").json()
    cell = page.locator("#d-verl_rloo td").nth(2)  # the third case: a group of one
    boxes = cell.locator(".mini-strip").first.locator(".tok")
    assert boxes.count() == len(api["cases"][2]["kinds"])
    assert boxes.nth(3).get_attribute("title") == "policy: 0.7000"
    assert boxes.nth(0).get_attribute("title") == "prompt"
    assert page.probe.errors == [] and page.probe.csp_violations() == []
    assert not [m for m in page.probe.console if m.startswith("error")]


def test_the_upload_form_names_the_trainer(page, tmp_path):
    """Upload through the form with a trainer chosen: the episode opens on the upload, that
    trainer's estimator and its reference (real clicks, the real server)."""
    import json

    kinds = ["prompt", "policy", "policy", "tool", "tool", "policy"]
    eps = [
        {
            "tokens": ["Fix", "read", "()", "ok", ".", "submit"],
            "kinds": kinds,
            "reward": r,
            "advantages": [0.0, a, a, 0.0, 0.0, a],
            "group": "task-1",
        }
        for r, a in ((1.0, 0.7), (0.0, -0.7))
    ]
    f = tmp_path / "trl-step.jsonl"
    f.write_text("\n".join(json.dumps(e) for e in eps))
    page.goto("/")
    page.set_input_files("#file", str(f))
    page.select_option("#up-trainer", "trl")
    page.click("#upload-btn")
    page.wait_for_selector(".file-item.good a.episode-link")
    page.click(".file-item.good a.episode-link >> nth=0")
    page.wait_for_function("() => performance.getEntriesByName('page:open').length > 0")
    state = page.evaluate("JSON.parse(document.getElementById('initial-state').textContent)")
    assert state["view"]["schemes"] == ["uploaded", "trl:grpo", "grpo", "audit_diff"]
    assert page.probe.errors == []


def test_the_upload_form_sends_the_trainers_config_file(page, tmp_path):
    """A verl user picks the run's ``.hydra/config.yaml`` (verl 0.9.1's composed configuration,
    from the installed wheel, with RLOO chosen) and no trainer: the file says verl and RLOO."""
    import json
    from pathlib import Path

    import verl

    composed = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    config = tmp_path / "config.yaml"
    config.write_text(composed.read_text().replace("adv_estimator: gae", "adv_estimator: rloo"))
    eps = [
        {"tokens": ["Q", "a", "b"], "kinds": ["prompt", "policy", "policy"], "reward": r, "group": "g"}
        for r in (1.0, 0.0)
    ]
    f = tmp_path / "step.jsonl"
    f.write_text("\n".join(json.dumps(e) for e in eps))
    page.goto("/")
    page.set_input_files("#file", str(f))
    page.set_input_files("#up-config", str(config))
    page.click("#upload-btn")
    page.wait_for_selector(".file-item.good a.episode-link")
    page.click(".file-item.good a.episode-link >> nth=0")
    page.wait_for_function("() => performance.getEntriesByName('page:open').length > 0")
    state = page.evaluate("JSON.parse(document.getElementById('initial-state').textContent)")
    assert state["view"]["schemes"] == ["verl:rloo", "rloo"]
    assert page.probe.errors == []
