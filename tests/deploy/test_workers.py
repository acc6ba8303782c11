"""`creditlens serve --workers 2` on one SQLite file: migrated and demo-loaded once, both workers
serve (each response names its process in X-Creditlens-Worker), and writes from either are visible
to the other."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def test_serve_with_two_workers(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREDITLENS_")}
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--workers", "2", "--demo"]
    cmd += ["--db", str(tmp_path / "w.db")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-3000:]
            time.sleep(0.3)
        got = httpx.get(base + "/api/batches", params={"limit": 1000}, timeout=10).json()
        names = sorted(b["name"] for b in got)
        # Loaded once, not once per worker: the two demo batches and the demo runs' 2 x 40 steps.
        assert [n for n in names if not n.startswith("demo: ")] == ["bugfix", "handbuilt"]
        assert len(names) == 2 + 2 * 40
        assert len(httpx.get(base + "/api/runs", timeout=10).json()) == 2
        ep = {"tokens": ["q", "a"], "kinds": ["prompt", "policy"], "reward": 1.0}
        # Each request is a new connection, which the OS hands to either worker's accept(); keep
        # writing until both workers have stored something (or give up after 200 uploads).
        written: dict[str, list[str]] = {}  # worker pid -> slugs it stored
        for _ in range(200):
            r = httpx.post(base + "/api/uploads?format=native", content=json.dumps(ep), timeout=30)
            assert r.status_code == 201, r.text
            written.setdefault(r.headers["x-creditlens-worker"], []).append(r.json()["episodes"][0]["slug"])
            if len(written) == 2:
                break
        assert len(written) == 2, f"only worker(s) {sorted(written)} answered 200 uploads"
        assert str(proc.pid) not in written  # the workers, not the supervising parent
        # Every write is readable from both workers.
        for slug in [s for slugs in written.values() for s in slugs]:
            readers: set[str] = set()
            for _ in range(200):
                r = httpx.get(f"{base}/api/episodes/{slug}", timeout=10)
                assert r.status_code == 200, (slug, r.text)
                readers.add(r.headers["x-creditlens-worker"])
                if readers == set(written):
                    break
            assert readers == set(written), (slug, readers)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
