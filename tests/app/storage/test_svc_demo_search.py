"""Demo loading carries each batch's meta file; search finds batches by their episodes' task and
group; `creditlens migrate` brings a fresh database to the newest schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, inspect

from tests.app.svc_helpers import episode, jsonl, make_client

ROOT = Path(__file__).resolve().parents[3]


def test_demo_batches_carry_their_meta_file(db_url):
    with make_client(db_url, demo=True) as client:
        batches = {b["name"]: b for b in client.get("/api/batches", params={"limit": 500}).json()}
        # The demo runs' steps are batches too (app/sim/demo_runs.py).
        batches = {n: b for n, b in batches.items() if not n.startswith("demo: ")}
        assert set(batches) == {"bugfix", "handbuilt"}
        full = client.get(f"/api/batches/{batches['bugfix']['id']}").json()
    meta_file = json.loads((ROOT / "fixtures" / "demo" / "bugfix.meta.json").read_text())
    # Every key of the meta file reaches the stored batch (e.g. the sampler's diagnostics).
    stored_meta = full.get("meta") or {}
    for key in meta_file:
        assert key in stored_meta, key
    assert full["n_episodes"] == 160


def test_search_matches_task_and_group_of_episodes(db_url):
    with make_client(db_url) as client:
        a = [episode(group="fizzbuzz-7", meta={"task": "fizzbuzz"}) for _ in range(2)]
        r = client.post("/api/uploads?name=alpha&format=native", content=jsonl(a))
        assert r.status_code == 201, r.text
        r = client.post("/api/uploads?name=beta&format=native", content=jsonl([episode(group="other")]))
        assert r.status_code == 201, r.text
        names = lambda q: {b["name"] for b in client.get("/api/batches", params={"q": q}).json()}  # noqa: E731
        assert names("FIZZ") == {"alpha"}  # by task/group, case-insensitive
        assert names("beta") == {"beta"}  # by batch name
        assert names("no-such-thing") == set()


def test_migrate_command_creates_schema(tmp_path):
    db = tmp_path / "m.db"
    res = subprocess.run(
        [sys.executable, "-m", "app.cli", "migrate", "--db", str(db)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    tables = set(inspect(create_engine(f"sqlite:///{db}")).get_table_names())
    assert {"batch", "episode", "lab_result", "alembic_version"} <= tables
