"""The Dockerfile, cheaply and everywhere: linted, its shape checked, and — where Docker cannot be had —
its install and start steps replayed in a fresh venv, so a COPY that misses a folder, a dependency
missing from pyproject, or a start command that no longer works fails here too.
tests/deploy/test_docker.py builds and runs the image for real wherever it can (as root, with Debian's
docker.io installed or installable): that build runs the same steps in the image itself, so there the
replay (about three minutes of pip) is skipped; ``CREDITLENS_TEST_REPLAY_DOCKERFILE=1`` runs it anyway."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, argument) pairs with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, arg = line.partition(" ")
            out.append((op.upper(), arg.strip()))
    return out


def test_dockerfile_lints_clean():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    res = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_dockerfile_shape():
    ins = _instructions()
    ops = [op for op, _ in ins]
    user = [arg for op, arg in ins if op == "USER"]
    assert user and user[-1] not in ("root", "0"), "the image must run as a non-root user"
    health = [arg for op, arg in ins if op == "HEALTHCHECK"]
    assert health and "/healthz" in health[0]
    assert any(op == "VOLUME" and "/data" in arg for op, arg in ins)
    env = " ".join(arg for op, arg in ins if op == "ENV")
    assert "CREDITLENS_DATABASE_URL=sqlite:////data/" in env, "the SQLite file must live on the volume"
    run = " ".join(arg for op, arg in ins if op == "RUN")
    assert "torch==2.13.0" in run and "/whl/cpu" in " ".join(arg for op, arg in ins if op == "ARG")
    assert ops[0] == "FROM"
    compose = (ROOT / "docker-compose.yml").read_text()
    assert 'profiles: ["postgres"]' in compose and "postgresql+psycopg://" in compose


def docker_builds_here() -> bool:
    """Whether tests/deploy/test_docker.py builds the image here: it is root and Debian's docker.io
    is installed or can be (its setup script's conditions; it skips, exit 77, only otherwise)."""
    if os.geteuid() != 0:
        return False
    if Path("/usr/sbin/dockerd").exists():
        return True
    return subprocess.run(["apt-cache", "show", "docker.io"], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("CREDITLENS_TEST_REPLAY_DOCKERFILE") != "1" and docker_builds_here(),
    reason="tests/deploy/test_docker.py builds and starts the image for real here",
)
def test_dockerfile_install_and_start_replayed(tmp_path):
    ins = _instructions()
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    for op, arg in ins:
        if op == "COPY":
            *srcs, dest = shlex.split(arg)
            for src in srcs:
                s = ROOT / src
                target = (
                    app_dir
                    / (dest if dest not in ("./", ".") else "")
                    / (s.name if dest.endswith("/") else "")
                )
                if dest.startswith("./") and dest != "./":
                    target = app_dir / dest[2:]
                if s.is_dir():
                    shutil.copytree(
                        s, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
                    )
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(s, target if not target.is_dir() else target / s.name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bindir = venv / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREDITLENS_")}
    env["PATH"] = f"{bindir}:{env['PATH']}"
    env["TORCH_PIP_ARGS"] = ""  # torch 2.13.0 CPU comes from this machine's disk instead of the index
    replayed = []
    for op, arg in ins:
        if op != "RUN":
            continue
        for step in arg.split("&&"):
            step = step.strip()
            if step.startswith("pip install"):
                cmd = shlex.split(step.replace("$TORCH_PIP_ARGS", ""))
                res = subprocess.run(
                    [str(bindir / "python"), "-m", *cmd, "-q"],
                    cwd=app_dir,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                assert res.returncode == 0, f"{step!r} failed:\n{res.stderr[-3000:]}"
                replayed.append(step)
            elif step.startswith("python "):  # checks of the installed image (the GAE kernel is built)
                cmd = shlex.split(step)
                res = subprocess.run(
                    [str(bindir / "python"), *cmd[1:]], cwd=app_dir, env=env, capture_output=True, text=True
                )
                assert res.returncode == 0, f"{step!r} failed:\n{res.stderr[-3000:]}"
                replayed.append(step)
    assert len(replayed) >= 3, replayed

    cmd = json.loads(next(arg for op, arg in ins if op == "CMD"))
    port = free_port()
    cmd[cmd.index("--port") + 1] = str(port)
    cmd[cmd.index("--host") + 1] = "127.0.0.1"
    for op, arg in ins:  # the image's ENV, with /app and /data mapped into tmp_path
        if op == "ENV":
            for pair in shlex.split(arg):
                key, _, value = pair.partition("=")
                env[key] = value.replace("/app", str(app_dir)).replace("/data", str(tmp_path / "data"))
    (tmp_path / "data").mkdir(exist_ok=True)
    assert "CREDITLENS_HOME" not in env  # the installed package finds its own files
    proc = subprocess.Popen(
        [str(bindir / cmd[0]), *cmd[1:]],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            proc.kill()
            pytest.fail(
                "the image's start command never answered /healthz:\n" + proc.stdout.read().decode()[-3000:]
            )
        # The image's own HEALTHCHECK command, pointed at this port.
        health = json.loads(next(arg for op, arg in ins if op == "HEALTHCHECK").split("CMD", 1)[1])
        probe = [str(bindir / "python") if health[0] == "python" else health[0], *health[1:]]
        probe = [p.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for p in probe]
        assert subprocess.run(probe, timeout=10).returncode == 0
        # --demo loaded the fixtures, and the pages render from the installed copy (templates, static).
        batches = httpx.get(base + "/api/batches", timeout=10).json()
        names = json.dumps(batches)
        assert "handbuilt" in names
        assert httpx.get(base + "/", timeout=10).status_code == 200
        assert httpx.get(base + "/static/app.css", timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)


# --- The image built and run on a real engine -------------------------------------------------------
