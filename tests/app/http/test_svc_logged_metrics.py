"""POST/GET /api/runs/{id}/logged-metrics: a trainer's own metrics log attached to a run, through
the real app on SQLite and PostgreSQL. The verl log is written by verl's own FileLogger."""

from __future__ import annotations

import gzip
import json

import pytest
from sqlalchemy import text

from tests.app.svc_helpers import episode, jsonl, make_client


def _run(c, name="r", **body) -> dict:
    r = c.post("/api/runs", json={"name": name, **body})
    assert r.status_code == 201
    return r.json()


def _lines(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _stored(c) -> int:
    with c.app.state.engine.connect() as conn:
        return conn.execute(text("SELECT COUNT(*) FROM run_logged_metrics")).scalar_one()


def _verl_log(tmp_path, monkeypatch, steps: dict[int, dict[str, float]]) -> bytes:
    tracking = pytest.importorskip("verl.utils.tracking")
    path = tmp_path / "verl_metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = tracking.FileLogger("proj", "exp")
    for step, data in steps.items():
        logger.log(data, step=step)
    logger.finish()
    return path.read_bytes()


def test_attach_a_verl_log_and_read_it_back_as_series(client, tmp_path, monkeypatch):
    run = _run(client)
    data = _verl_log(
        tmp_path,
        monkeypatch,
        {s: {"critic/score/mean": s / 4, "actor/entropy": 2.0 - s / 8, "note": "x"} for s in range(1, 4)},
    )
    r = client.post(f"/api/runs/{run['id']}/logged-metrics", files={"file": ("verl_metrics.jsonl", data)})
    assert r.status_code == 201, r.text
    out = r.json()
    assert out["source"] == "verl file logger (one {step, data} line per step) · verl_metrics.jsonl"
    assert (out["trainer"], out["n_steps"], out["first_step"], out["last_step"]) == ("verl", 3, 1, 3)
    assert out["metrics"] == ["critic/score/mean", "actor/entropy"]
    # FileLogger writes the text value too: skipped, counted once a step.
    assert (out["n_skipped"], out["skipped"]) == (3, {"note": 3})
    assert (out["replaced_steps"], out["n_steps_stored"]) == (0, 3)
    got = client.get(f"/api/runs/{run['id']}/logged-metrics").json()
    assert got["names"] == ["critic/score/mean", "actor/entropy"] and got["n_steps"] == 3
    assert got["metrics"]["critic/score/mean"] == [[1, 0.25], [2, 0.5], [3, 0.75]]
    assert got["metrics"]["actor/entropy"] == [[1, 1.875], [2, 1.75], [3, 1.625]]
    assert got["sources"] == [out["source"]]
    only = client.get(f"/api/runs/{run['id']}/logged-metrics", params={"names": "actor/entropy"}).json()
    assert list(only["metrics"]) == ["actor/entropy"] and len(only["names"]) == 2
    names_only = client.get(f"/api/runs/{run['id']}/logged-metrics", params={"names": ""}).json()
    assert names_only["metrics"] == {} and names_only["names"] == got["names"]
    # The run's own answer says it has them (the run page asks for them only then).
    assert client.get(f"/api/runs/{run['id']}").json()["n_logged_steps"] == 3
    assert client.get(f"/api/runs/{_run(client)['id']}").json()["n_logged_steps"] == 0


def test_reattaching_merges_by_step_and_replace_drops_the_rest(client):
    run = _run(client)
    url = f"/api/runs/{run['id']}/logged-metrics"
    first = _lines([{"step": s, "loss": 1.0 / (s + 1), "lr": 1e-6} for s in range(4)])
    assert client.post(url, content=first).status_code == 201
    # A resumed trainer's log from step 2 on: steps 2 and 3 are replaced whole, 0 and 1 stay.
    second = _lines([{"step": s, "loss": 0.0} for s in range(2, 6)])
    out = client.post(url, content=second).json()
    assert (out["n_steps"], out["replaced_steps"], out["n_steps_stored"]) == (4, 2, 6)
    got = client.get(url).json()["metrics"]
    assert got["loss"] == [[0, 1.0], [1, 0.5], [2, 0.0], [3, 0.0], [4, 0.0], [5, 0.0]]
    assert got["lr"] == [[0, 1e-6], [1, 1e-6]]  # steps 2 and 3 came again without it
    out = client.post(url, params={"replace": "true"}, content=gzip.compress(first)).json()
    assert (out["replaced_steps"], out["n_steps_stored"]) == (0, 4)
    assert client.get(url).json()["metrics"]["loss"][-1] == [3, 0.25]


def test_bad_input_stores_nothing(client):
    run = _run(client)
    url = f"/api/runs/{run['id']}/logged-metrics"
    assert client.post(url, content=_lines([{"step": 0, "loss": 0.5}])).status_code == 201
    bad = b'{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\nstep 3 loss 0.3\n'
    r = client.post(url, content=bad)
    assert r.status_code == 422
    err = r.json()["error"]
    assert (err["code"], err["line"]) == ("bad_json", 3) and err["message"].startswith("line 3: ")
    r = client.post(url, files={"file": ("rollouts.jsonl", jsonl([episode()]))})
    assert r.status_code == 422 and r.json()["error"]["code"] == "not_a_metrics_log"
    assert client.post(url, content=b"").json()["error"]["code"] == "empty_upload"
    assert _stored(client) == 1  # the first file's one step, nothing of the refused ones
    assert (
        client.post("/api/runs/999/logged-metrics", content=_lines([{"step": 0, "x": 1}])).status_code == 404
    )


def test_the_metrics_go_with_their_run_and_are_apart_from_ours(client):
    run = _run(client)
    assert (
        client.post(
            f"/api/runs/{run['id']}/steps/0", content=jsonl([episode(), episode(reward=0.0)])
        ).status_code
        == 201
    )
    client.post(f"/api/runs/{run['id']}/logged-metrics", content=_lines([{"step": 0, "pass_rate": 0.9}]))
    # Our own metrics answer is unchanged: the trainer's numbers never mix with what we compute.
    assert client.get(f"/api/runs/{run['id']}/metrics").json()["pass_rate"] == [[0, 0.5]]
    assert client.get(f"/api/runs/{run['id']}/logged-metrics").json()["metrics"]["pass_rate"] == [[0, 0.9]]
    r = client.delete(f"/api/runs/{run['id']}", params={"token": run["delete_token"]})
    assert r.status_code == 204 and _stored(client) == 0


def test_an_unlisted_run_takes_them_by_its_slug_only(client):
    run = _run(client, visibility="unlisted")
    body = _lines([{"step": 0, "loss": 0.5}])
    assert client.post(f"/api/runs/{run['id']}/logged-metrics", content=body).status_code == 404
    r = client.post(f"/api/runs/{run['ref']}/logged-metrics", content=body)
    assert r.status_code == 201 and r.json()["url"] == f"/api/runs/{run['ref']}/logged-metrics"


def test_the_write_token_protects_it_as_it_protects_steps(db_url):
    with make_client(db_url, write_token="s3cret") as c:
        auth = {"authorization": "Bearer s3cret"}
        run = c.post("/api/runs", json={"name": "w"}, headers=auth).json()
        body = _lines([{"step": 0, "loss": 0.5}])
        r = c.post(f"/api/runs/{run['id']}/logged-metrics", content=body)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        r = c.post(
            f"/api/runs/{run['id']}/logged-metrics", content=body, headers={"authorization": "Bearer no"}
        )
        assert r.status_code == 403
        assert c.post(f"/api/runs/{run['id']}/logged-metrics", content=body, headers=auth).status_code == 201
        assert c.get(f"/api/runs/{run['id']}/logged-metrics").json()["n_steps"] == 1
