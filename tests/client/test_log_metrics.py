"""``run.log_metrics_file`` and ``creditlens log-metrics``: a trainer's own metrics log attached to a
run on a real server. The TRL log is the ``trainer_state.json`` a real TRL ``GRPOTrainer`` run
writes (tests/client/trainers.py: a tiny random Llama on CPU); the stored numbers are checked
against the trainer's own ``state.log_history``."""

from __future__ import annotations

import json

import httpx
import pytest

from creditlens import Client
from creditlens.__main__ import main as client_main
from tests.client.trainers import trl_trainer
from tests.live_server import Server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("log-metrics")
    with Server(tmp / "creditlens.db", tmp / "server.log", CREDITLENS_WRITE_TOKEN="w-tok") as srv:
        yield srv.base


@pytest.mark.slow
def test_a_trl_runs_trainer_state_is_attached_as_its_logged_metrics(server, tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    trainer = trl_trainer(str(tmp_path), max_steps=2)
    trainer.train()
    path = tmp_path / "trainer_state.json"
    trainer.state.save_to_json(str(path))
    history = trainer.state.log_history
    with Client(server, token="w-tok", strict=True) as c:
        run = c.run("trl-logged")
        out = run.log_metrics_file(path)
    assert out is not None and out["trainer"] == "TRL / transformers" and out["n_steps"] == 2
    got = httpx.get(f"{server}/api/runs/{run.id}/logged-metrics").json()
    # Every number of every log_history entry under its step; the entries of one step (the last
    # train log and TRL's end-of-training summary) merged, a later value winning.
    merged: dict[int, dict[str, float]] = {}
    for entry in history:
        for k, v in entry.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                merged.setdefault(entry["step"], {})[k] = float(v)
    expected: dict[str, list[list[float]]] = {}
    for step in sorted(merged):
        for k, v in merged[step].items():
            expected.setdefault(k, []).append([step, v])
    assert got["metrics"] == expected and "train_runtime" in expected
    assert [p[0] for p in got["metrics"]["reward"]] == [1, 2]
    # TRL's reward function gives 0 then 1 in each group of 2: its logged mean reward is 0.5.
    assert [p[1] for p in got["metrics"]["reward"]] == [0.5, 0.5]


def test_refused_file_warns_and_returns_none_strict_raises(server, tmp_path):
    bad = tmp_path / "metrics.jsonl"
    bad.write_text('{"step": 1, "loss": 0.5}\nnot json\n')
    with Client(server, token="w-tok") as c:
        run = c.run("refused-log")
        with pytest.warns(RuntimeWarning, match="bad_json|line 2"):
            assert run.log_metrics_file(bad) is None
    with Client(server, token="w-tok", strict=True) as c:
        run = c.run("refused-log-strict")
        with pytest.raises(ValueError, match="HTTP 422"):
            run.log_metrics_file(bad)
        assert httpx.get(f"{server}/api/runs/{run.id}/logged-metrics").json()["n_steps"] == 0


def test_the_cli_attaches_by_run_name_and_reports(server, tmp_path, capsys):
    with Client(server, token="w-tok", strict=True) as c:
        run = c.run("cli-logged")
    path = tmp_path / "exp.jsonl"  # verl's file logger lines
    path.write_text(
        "".join(
            json.dumps({"step": s, "data": {"critic/score/mean": s / 2, "tag": "x"}}) + "\n" for s in range(3)
        )
    )
    argv = ["log-metrics", "cli-logged", str(path), "--server", server, "--token", "w-tok"]
    assert client_main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("attached 3 steps × 1 metrics (verl file logger")
    assert "3 values that are not numbers skipped" in out and f"/r/{run.id}" in out
    got = httpx.get(f"{server}/api/runs/{run.id}/logged-metrics").json()
    assert got["metrics"]["critic/score/mean"] == [[0, 0.0], [1, 0.5], [2, 1.0]]
    assert client_main(["log-metrics", "no-such-run", str(path), "--server", server]) == 2
    assert client_main(["log-metrics", str(run.id), str(path), "--server", server]) == 1  # no write token
    assert "unauthorized" in capsys.readouterr().err
