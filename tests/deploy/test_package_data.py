"""A built server wheel carries templates, static files, migrations and the demo fixtures, and the app
finds them inside the installed package (app/core/resources.py), whatever the working directory. The
client is not in it: it is its own wheel (client/), which the server's wheel depends on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
from fastapi.testclient import TestClient
from app.core import resources
from app.main import create_app
from app.core.settings import Settings
assert resources.data_root() == resources.Path(sys.argv[1]) / "app" / "_data", resources.data_root()
with TestClient(create_app(Settings(database_url="sqlite:///x.db", demo=True))) as c:
    names = sorted(b["name"] for b in c.get("/api/batches").json())
    # The demo runs' steps (app/sim/demo_runs.py) are batches too.
    assert [n for n in names if not n.startswith("demo: ")] == ["bugfix", "handbuilt"], names
    assert c.get("/").status_code == 200 and "creditlens" in c.get("/").text
    assert c.get("/static/util.js").status_code == 200
print("ok")
"""


@pytest.mark.slow
def test_wheel_ships_the_data_folders_and_the_app_finds_them(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREDITLENS_")}
    src = tmp_path / "src"  # a copy: an in-tree build would leave build/ in the checkout
    for name in ("app", "estimators", "client", "templates", "static", "migrations", "fixtures"):
        shutil.copytree(
            ROOT / name,
            src / name,
            ignore=shutil.ignore_patterns("__pycache__", "*.so", ".venv", "build", "*.egg-info"),
        )
    for name in ("pyproject.toml", "setup.py", "README.md", "alembic.ini"):
        shutil.copy2(ROOT / name, src / name)
    for project in (src, src / "client"):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                str(project),
                "-w",
                "w",
            ],
            cwd=tmp_path,
            env={**env, "PIP_NO_INDEX": "1"},
            check=True,
            capture_output=True,
        )
    (wheel,) = (tmp_path / "w").glob("creditlens_server-*.whl")
    (client_wheel,) = (tmp_path / "w").glob("creditlens-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("creditlens/")], "the client belongs in its own wheel"
    assert {n.split("/")[0] for n in zipfile.ZipFile(client_wheel).namelist() if "dist-info" not in n} == {
        "creditlens"
    }
    for want in (
        "app/_data/templates/base.html",
        "app/_data/static/util.js",
        "app/_data/alembic.ini",
        "app/_data/migrations/env.py",
        "app/_data/migrations/versions/0002_episode_advantages.py",
        "app/_data/fixtures/demo/handbuilt.jsonl",
    ):
        assert want in names, want
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    zipfile.ZipFile(client_wheel).extractall(site)
    run = tmp_path / "elsewhere"
    run.mkdir()
    env["PYTHONPATH"] = str(site)
    res = subprocess.run(
        [sys.executable, "-c", "import sys\n" + PROBE, str(site)],
        cwd=run,
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]
