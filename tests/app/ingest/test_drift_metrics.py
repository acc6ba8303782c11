"""Token-in/token-out drift reported where a user sees it first: the batch diagnostics and a run
step's metrics (``drift_episode_share``, ``drift_token_share``), on NeMo Gym rollouts with per-turn
ids uploaded through the real API (hand-written in the shape of NeMo Gym's vLLM model server
items, as in test_fmt_nemo_gym.py)."""

from __future__ import annotations

import json

import pytest

from tests.app.ingest.test_fmt_nemo_gym import _drifting_turns, _rollout, _two_turns


def _file() -> str:
    # Episode 0 drifts (1 sampled id re-rendered as another, of 8 policy ids: 3 + 3 + 2);
    # episode 1 does not (6 policy ids: 3 + 3).
    rows = [_rollout(1, 0, 1.0, _drifting_turns()), _rollout(1, 1, 0.0, _two_turns())]
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_batch_diagnostics_report_the_drift(client):
    r = client.post("/api/uploads", files={"file": ("r.jsonl", _file())})
    assert r.status_code == 201, r.text
    diag = client.get(f"/api/batches/{r.json()['batch_id']}").json()["diagnostics"]
    assert diag["drift_episode_share"] == pytest.approx(1 / 2)
    assert diag["drift_token_share"] == pytest.approx(1 / 14)  # 1 of 8 + 6 policy tokens


def test_a_run_step_reports_the_drift(client):
    run = client.post("/api/runs", json={"name": "tito"}).json()
    r = client.post(f"/api/runs/{run['id']}/steps/0", files={"file": ("r.jsonl", _file())})
    assert r.status_code == 201, r.text
    series = client.get(f"/api/runs/{run['id']}/metrics").json()
    assert series["drift_episode_share"] == [[0, pytest.approx(0.5)]]
    assert series["drift_token_share"] == [[0, pytest.approx(1 / 14)]]
    page = client.get(f"/r/{run['id']}").text
    assert "drift_token_share" in page  # the run page's figures and step table name it


def test_no_drift_is_zero(client):
    row = _rollout(1, 0, 1.0, _two_turns())
    r = client.post("/api/uploads", files={"file": ("r.jsonl", json.dumps(row))})
    diag = client.get(f"/api/batches/{r.json()['batch_id']}").json()["diagnostics"]
    assert diag["drift_episode_share"] == 0.0 and diag["drift_token_share"] == 0.0
