"""The client installs next to any trainer: its wheel, installed alone in a fresh venv, brings httpx
(and what httpx needs), numpy and safetensors, nothing else; neither the server's packages (app,
estimators) nor torch are importable there; and from that venv a run's step reaches a real server
(started from the server's environment), as does ``python -m creditlens upload``.

The venv's interpreter is ``$CREDITLENS_TEST_CLIENT_PYTHON`` when set (e.g. a Python 3.10, the
oldest the client supports), else the one running the tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement

from tests.live_server import Server

ROOT = Path(__file__).resolve().parents[2]


def _name(n: str) -> str:
    return re.sub(r"[-_.]+", "-", n).lower()


def closure(report: dict, start: str, env: dict[str, str]) -> set[str]:
    """The packages ``start`` pulls in, by the requirements in pip's install report (extras and
    requirements whose markers do not hold in ``env`` left out), ``start`` included."""
    meta = {_name(i["metadata"]["name"]): i["metadata"] for i in report["install"]}
    env = {**env, "extra": ""}
    seen, todo = set(), [_name(start)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for spec in meta[name].get("requires_dist", []):
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(_name(req.name))
    return seen


@pytest.mark.slow
def test_the_client_wheel_alone_brings_httpx_numpy_safetensors_and_logs_to_a_real_server(tmp_path):
    src = tmp_path / "client"  # a copy: an in-tree build would leave build/ in the checkout
    shutil.copytree(ROOT / "client", src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREDITLENS_") and k != "PYTHONPATH"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(src),
            "-w",
            "w",
        ],
        cwd=tmp_path,
        env={**env, "PIP_NO_INDEX": "1"},
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "w").glob("creditlens-*.whl")
    venv = tmp_path / "venv"
    base = os.environ.get("CREDITLENS_TEST_CLIENT_PYTHON") or sys.executable
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # The markers of the venv's interpreter (pip's own copy of packaging: nothing else is there yet).
    markers = json.loads(
        subprocess.run(
            [
                py,
                "-c",
                "import json; from pip._vendor.packaging.markers import default_environment as d; print(json.dumps(d()))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )

    def pip(*args: str) -> subprocess.CompletedProcess:
        res = subprocess.run([py, "-m", "pip", *args], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-3000:]
        return res

    pip("install", "-q", "--dry-run", "--report", str(tmp_path / "report.json"), str(wheel))
    report = json.loads((tmp_path / "report.json").read_text())
    names = {_name(i["metadata"]["name"]) for i in report["install"]}
    assert closure(report, "creditlens", markers) == names
    assert names - closure(report, "httpx", markers) == {"creditlens", "numpy", "safetensors"}, sorted(names)
    assert "torch" not in names and "creditlens-server" not in names
    pip("install", "-q", str(wheel))

    def run_py(code: str, *args: str) -> subprocess.CompletedProcess:
        # From an empty folder: the checkout must not be importable through the working directory.
        cwd = tmp_path / "elsewhere"
        cwd.mkdir(exist_ok=True)
        return subprocess.run([py, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True)

    for module in ("app", "estimators", "torch"):
        res = run_py(f"import {module}")
        assert res.returncode == 1 and "ModuleNotFoundError" in res.stderr, (module, res.stderr[-500:])
    res = run_py("import creditlens, creditlens.adapters.verl, creditlens.adapters.trl, creditlens.watch")
    assert res.returncode == 0, res.stderr[-3000:]

    with Server(tmp_path / "server.db", tmp_path / "server.log") as srv:
        code = (
            "import sys, json, numpy as np\n"
            "from creditlens import Client\n"
            "with Client(sys.argv[1], spool_dir=sys.argv[2], strict=True) as c:\n"
            "    run = c.run('wheel-run', config={'from': 'wheel'})\n"
            "    run.log_tensors(0, token_ids=np.array([[5, 6, 7, 8]]), policy_mask=np.array([[0, 0, 1, 1]]),\n"
            "                    reward=np.array([1.0]), advantages=np.array([[0, 0, 0.5, 0.5]], dtype=np.float32))\n"
            "    assert run.flush(timeout=120)\n"
            "print(json.dumps({'id': run.id, 'sent': run.sent, 'failed': run.failed}))\n"
        )
        res = run_py(code, srv.base, str(tmp_path / "spool"))
        assert res.returncode == 0, res.stderr[-3000:]
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert (out["sent"], out["failed"]) == (1, 0)
        got = httpx.get(f"{srv.base}/api/runs/{out['id']}", timeout=30).json()
        assert got["name"] == "wheel-run" and got["config"] == {"from": "wheel"}
        assert [(s["step"], s["n_episodes"]) for s in got["steps"]] == [(0, 1)]
        batch = httpx.get(f"{srv.base}/api/batches/{got['steps'][0]['batch_id']}", timeout=30).json()
        ep = httpx.get(f"{srv.base}/api/episodes/{batch['episodes'][0]['slug']}", timeout=30).json()
        assert ep["kinds"] == ["prompt", "prompt", "policy", "policy"] and ep["reward"] == 1.0
        # The client's own upload command, without the server installed.
        upload = subprocess.run(
            [
                py,
                "-m",
                "creditlens",
                "upload",
                str(ROOT / "fixtures" / "demo" / "handbuilt.jsonl"),
                "--server",
                srv.base,
            ],
            cwd=tmp_path / "elsewhere",
            env=env,
            capture_output=True,
            text=True,
        )
        assert upload.returncode == 0, upload.stderr[-3000:]
        assert re.search(r"stored batch \d+ with \d+ episode\(s\)", upload.stdout), upload.stdout
