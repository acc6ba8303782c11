"""`creditlens serve --workers 2` on one SQLite file: migrated and demo-loaded once, both workers
serve, and writes from either are visible to the other."""

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
        names = sorted(b["name"] for b in httpx.get(base + "/api/batches", timeout=10).json())
        assert names == ["bugfix", "handbuilt"]  # loaded once, not once per worker
        ep = {"tokens": ["q", "a"], "kinds": ["prompt", "policy"], "reward": 1.0}
        slugs = []
        for _ in range(6):  # new connections land on either worker
            r = httpx.post(base + "/api/uploads?format=native", content=json.dumps(ep), timeout=30)
            assert r.status_code == 201, r.text
            slugs.append(r.json()["episodes"][0]["slug"])
        for slug in slugs:
            assert httpx.get(f"{base}/api/episodes/{slug}", timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
