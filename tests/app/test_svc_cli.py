"""The real CLI, as subprocesses: compute offline, serve on 127.0.0.1, upload to it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from svc_helpers import FORMATS

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "app.cli"]


def run(*args, **kw):
    return subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, **kw)


def test_compute_offline_writes_advantages(tmp_path):
    out = tmp_path / "adv.jsonl"
    r = run(
        "compute",
        str(FORMATS / "native.jsonl"),
        "--scheme",
        "outcome",
        "--scheme",
        "token_gae",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(s) for s in out.read_text().splitlines()]
    assert len(rows) == 4 and [s["name"] for s in rows[0]["schemes"]] == ["outcome", "token_gae"]
    # Groups in the file: limit = [1, 0] -> RLOO +1 / -1; parse_date = [0, 0] -> 0.
    firsts = [next(a for a in row["schemes"][0]["advantages"] if a is not None) for row in rows]
    assert firsts == [1.0, -1.0, 0.0, 0.0]


def test_compute_prints_to_stdout_and_reports_errors(tmp_path):
    r = run(
        "compute", str(FORMATS / "verl_rollout.jsonl"), "--scheme", "outcome,returns", "--baseline", "grpo"
    )
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 4
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": ["a", "b"], "kinds": ["prompt"]}\n')
    r = run("compute", str(bad))
    assert r.returncode == 1 and "`kinds` has 1 entries but `tokens` has 2" in r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    port = _free_port()
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", str(port), "--db", str(tmp_path / "cli.db"), "--log-level", "warning"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise AssertionError("server did not start")
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_serve_and_upload(server):
    url, proc = server
    assert httpx.get(url + "/healthz").json() == {"status": "ok"}
    r = run("upload", str(FORMATS / "openai_chat.jsonl"), "--server", url, "--json")
    assert r.returncode == 0, r.stderr
    assert "stored batch 1 with 3 episode(s)" in r.stdout and "delete token" in r.stdout
    body = json.loads(r.stdout.strip().splitlines()[-1])
    batches = httpx.get(url + "/api/batches").json()
    assert [b["name"] for b in batches] == ["openai_chat.jsonl"] and batches[0][
        "source"
    ] == "upload:openai_chat"
    slug = body["episodes"][0]["slug"]
    assert httpx.get(f"{url}/api/episodes/{slug}").json()["reward"] == 1.0
    # A server-side validation error comes back as the CLI's message and exit code.
    r = run("upload", str(FORMATS / "native.jsonl"), "--server", url, "--format", "nemo_rl")
    assert r.returncode == 1 and "token_ids" in r.stderr
    proc.terminate()
    out, _ = proc.communicate(timeout=20)
    assert f"serving on {url}/" in out
