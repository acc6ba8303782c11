"""The run page draws the trainer's own logged metrics (POST /api/runs/{id}/logged-metrics) beside
ours, labelled as the trainer's; a run without a log shows no such section. And the upload page
shows what a metrics log uploaded as episodes is, naming the way to attach it."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.browser import browser_data as data
from tests.browser.browser_util import shot

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def run(server) -> dict:
    """A run of 4 steps (pass rate 0, 1/4, 1/2, 3/4) with a verl-style file logger log of 4 steps."""
    steps = {
        step: [{**data.handbuilt(), "reward": float(i < step), "group": f"t{i // 2}"} for i in range(4)]
        for step in range(4)
    }
    run = data.post_run(server, "logged-demo", steps)
    lines = "".join(
        json.dumps({"step": s, "data": {"actor/entropy": 2.0 - s / 4, "critic/score/mean": s / 4 + 0.125}})
        + "\n"
        for s in range(4)
    )
    r = httpx.post(f"{server}/api/runs/{run['ref']}/logged-metrics", files={"file": ("exp.jsonl", lines)})
    assert r.status_code == 201, r.text
    return run


def test_logged_metrics_are_drawn_as_the_trainers_beside_ours(page, run):
    page.goto(f"/r/{run['id']}")
    page.wait_for_selector('#logged[data-ready="1"]')
    assert page.is_visible("#logged")
    assert page.text_content("#logged-h") == "Logged by the trainer"
    source = page.text_content("#logged-source")
    assert "creditlens did not compute them" in source and "4 steps from verl file logger" in source
    # A score is shown first; the options are the log's metrics.
    assert page.input_value("#logged-metric") == "critic/score/mean"
    assert page.eval_on_selector_all("#logged-metric option", "os => os.map(o => o.value)") == [
        "actor/entropy",
        "critic/score/mean",
    ]
    traces = page.evaluate(
        "document.getElementById('logged-plot').data.map(t => ({name: t.name, x: t.x, y: t.y}))"
    )
    assert traces == [
        {
            "name": "critic/score/mean (logged by the trainer)",
            "x": [0, 1, 2, 3],
            "y": [0.125, 0.375, 0.625, 0.875],
        }
    ]
    # One of ours beside it, on its own axis.
    page.select_option("#logged-ours", "pass_rate")
    page.wait_for_selector('#logged[data-ready="1"]')
    traces = page.evaluate(
        "document.getElementById('logged-plot').data.map(t => ({name: t.name, y: t.y, axis: t.yaxis}))"
    )
    assert traces[1] == {
        "name": "pass rate (creditlens, from the episodes)",
        "y": [0, 0.25, 0.5, 0.75],
        "axis": "y2",
    }
    page.select_option("#logged-metric", "actor/entropy")
    page.wait_for_selector('#logged[data-ready="1"]')  # the change handler sets it to "0" first
    assert page.evaluate("document.getElementById('logged-plot').data[0].y") == [2.0, 1.75, 1.5, 1.25]
    page.locator("#logged").scroll_into_view_if_needed()
    shot(page, "run-logged-metrics")
    assert not page.probe.errors


def test_a_run_without_a_log_shows_no_section(page, server):
    run = data.post_run(server, "no-log", {0: [data.handbuilt()]})
    page.goto(f"/r/{run['id']}")
    page.wait_for_selector('#logged[data-ready="none"]', state="attached")
    assert not page.is_visible("#logged")
    assert not page.probe.errors


def test_the_upload_page_says_a_metrics_log_is_one_and_how_to_attach_it(page, tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(
            json.dumps({"step": s, "data": {"actor/entropy": 0.5, "critic/score/mean": 0.1}}) + "\n"
            for s in range(3)
        )
    )
    page.goto("/")
    page.set_input_files("#file", str(path))
    page.click("#upload-btn")
    err = page.locator(".file-error").first
    err.wait_for(state="visible")
    text = err.text_content()
    assert "This looks like a training metrics log (metric names as verl logs them)" in text
    assert "POST /api/runs/{id}/logged-metrics" in text and "creditlens log-metrics RUN FILE" in text
    shot(page, "upload-metrics-log")
