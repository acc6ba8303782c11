"""The Docker image for real where we are root (CI): a local Docker engine with stand-in base images
made from Debian packages (tests/deploy/docker/setup.sh), the image built with the CPU torch wheel
from this machine's disk, then run as a user would: health, an upload kept across a restart, the
settings honoured, the compose file's services. (tests/deploy/test_dockerfile.py lints the
Dockerfile and replays its install and start steps in a venv, everywhere.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SETUP = ROOT / "tests" / "deploy" / "docker" / "setup.sh"
CACHE = Path(os.environ.get("CREDITLENS_DOCKER_CACHE", "/var/cache/creditlens-docker"))
DOCKER = "/usr/bin/docker"  # Debian's client, the daemon's own version (setup.sh installs both)
IMAGE = "creditlens"  # the compose file's `image:`
IN_CI = os.environ.get("CI", "").lower() == "true"
# The wheelhouse is served on a fixed loopback port when it is free: the port is part of the build
# argument, and a stable argument lets a rerun reuse the build cache.
WHEEL_PORT = 28765
MAX_IMAGE_BYTES = 2_000_000_000  # CPU torch: ~1.3 GB; a CUDA build of torch makes it ~5 GB


def docker(*args: str, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run the docker client; on failure the assertion shows what it printed."""
    res = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check:
        assert res.returncode == 0, f"docker {' '.join(args)} -> {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res


def _unavailable(reason: str) -> None:
    """Skip where Docker cannot be had (not root, no docker.io package); in CI it must run."""
    if IN_CI:
        pytest.fail(f"CI must build and run the Docker image, but: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def engine() -> None:
    """A running dockerd with the stand-in base images (setup.sh: idempotent, seconds when done)."""
    if os.geteuid() != 0:
        _unavailable("not root: cannot install or start a Docker engine")
    res = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=1800)
    out = res.stdout + res.stderr
    if res.returncode == 77:
        _unavailable(f"Docker cannot be installed here:\n{out[-2000:]}")
    assert res.returncode == 0, f"tests/deploy/docker/setup.sh failed ({res.returncode}):\n{out[-4000:]}"


def _wait_http(
    url: str, *, seconds: float = 120, container: str | None = None, logs: Callable[[], str] | None = None
) -> httpx.Response:
    """Poll ``url`` until it answers 200 (a bounded wait for a server starting in a container)."""
    deadline = time.monotonic() + seconds
    last: object = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url, timeout=3)
            if r.status_code == 200:
                return r
            last = r.status_code
        except httpx.HTTPError as e:
            last = e
        if container and docker("inspect", "-f", "{{.State.Running}}", container).stdout.strip() != "true":
            break
        time.sleep(0.5)
    shown = logs() if logs else ""
    if container:
        res = docker("logs", container, check=False)
        shown = res.stdout + res.stderr
    pytest.fail(f"{url} never answered 200 (last: {last!r})\n{shown[-3000:]}")


@pytest.fixture(scope="module")
def image(engine) -> str:  # noqa: ARG001 (the engine fixture must be up first)
    """The project's image, built as the README says, with torch from the local wheelhouse."""
    port = WHEEL_PORT
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            "-d",
            str(CACHE / "wheelhouse"),
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/", seconds=30)
        build = docker(
            "build",
            "--network=host",
            "--build-arg",
            f"TORCH_PIP_ARGS=--find-links http://127.0.0.1:{port}/",
            "-t",
            IMAGE,
            str(ROOT),
            timeout=1800,
            check=False,
        )
        assert build.returncode == 0, f"docker build failed:\n{build.stdout[-4000:]}\n{build.stderr[-4000:]}"
    finally:
        server.terminate()
        server.wait(timeout=10)
    return IMAGE


@pytest.fixture
def container(image):
    """Start containers of the image (published on a loopback port); removed, with their volumes, after."""
    names: list[str] = []
    volumes: list[str] = []

    def start(*args: str, volume: str | None = None) -> tuple[str, str]:
        name = f"creditlens-test-{os.getpid()}-{len(names)}"
        names.append(name)
        extra = ["-v", f"{volume}:/data"] if volume else []
        if volume and "/" not in volume:
            volumes.append(volume)
        docker("run", "-d", "--name", name, "-p", "127.0.0.1::8000", *extra, *args, image)
        return name, _base(name)

    yield start
    for name in names:
        docker("rm", "-f", "-v", name, check=False)
    for v in set(volumes):
        docker("volume", "rm", v, check=False)


def _base(name: str) -> str:
    """The URL of the container's published port 8000 (empty once the container has stopped)."""
    res = docker("port", name, "8000", check=False)
    return f"http://127.0.0.1:{res.stdout.split(':')[-1].strip()}" if res.returncode == 0 else ""


def _health(name: str, seconds: float = 90) -> str:
    """The container's health status once it leaves `starting` (or after ``seconds``)."""
    deadline = time.monotonic() + seconds
    status = ""
    while time.monotonic() < deadline:
        status = docker("inspect", "-f", "{{.State.Health.Status}}", name).stdout.strip()
        if status != "starting":
            break
        time.sleep(0.5)
    return status


def _upload(base: str) -> dict:
    data = (ROOT / "fixtures" / "formats" / "native.jsonl").read_bytes()
    r = httpx.post(
        base + "/api/uploads",
        content=data,
        params={"name": "docker-test"},
        headers={"Content-Type": "application/octet-stream"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return r.json()


@pytest.mark.slow
def test_image_is_cpu_only_small_and_clean(image):
    probe = (
        "import importlib.metadata as md, json, os, pathlib, torch;"
        "print(json.dumps({'cuda': torch.version.cuda, 'torch': torch.__version__, 'uid': os.getuid(),"
        "'nvidia': [d.metadata['Name'] for d in md.distributions() if 'nvidia' in d.metadata['Name'].lower()],"
        "'leftovers': sorted(p.name for p in pathlib.Path('/app').iterdir()"
        " if p.name == 'build' or p.name.endswith('.egg-info'))}))"
    )
    got = json.loads(docker("run", "--rm", "--entrypoint", "python", image, "-c", probe).stdout)
    assert got["cuda"] is None and got["torch"].startswith("2.13.0"), got
    assert got["nvidia"] == [] and got["leftovers"] == [], got
    assert got["uid"] == 10001
    size = int(docker("image", "inspect", "-f", "{{.Size}}", image).stdout)
    assert size < MAX_IMAGE_BYTES, f"image is {size / 1e9:.2f} GB"


@pytest.mark.slow
def test_container_turns_healthy_and_keeps_uploads_across_a_restart(container):
    volume = f"creditlens-test-data-{os.getpid()}"
    name, base = container(volume=volume)
    _wait_http(base + "/healthz", container=name)
    assert _health(name) == "healthy"
    assert docker("exec", name, "id", "-u").stdout.strip() == "10001"
    assert "handbuilt" in json.dumps(
        httpx.get(base + "/api/batches", timeout=10).json()
    )  # demo on by default
    stored = _upload(base)
    before = httpx.get(f"{base}/api/batches/{stored['batch_id']}", timeout=10)
    assert before.status_code == 200

    docker("restart", name, timeout=60)
    base = _base(name)  # a restart may publish on another port
    _wait_http(base + "/healthz", container=name)
    after = httpx.get(f"{base}/api/batches/{stored['batch_id']}", timeout=10)
    assert after.status_code == 200 and after.json() == before.json()
    assert httpx.get(base + stored["episodes"][0]["url"], timeout=10).status_code == 200
    logs = docker("logs", name).stdout
    assert "database: sqlite:////data/creditlens.db" in logs


@pytest.mark.slow
def test_demo_false_is_honoured(container):
    name, base = container("-e", "CREDITLENS_DEMO=false")
    _wait_http(base + "/healthz", container=name)
    batches = httpx.get(base + "/api/batches", timeout=10).json()
    assert "handbuilt" not in json.dumps(batches) and "bugfix" not in json.dumps(batches), batches
    assert "demo data: off" in docker("logs", name).stdout


@pytest.mark.slow
def test_unwritable_data_folder_says_what_to_do(container, tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)  # root's, as a folder made on the host before `docker run -v` usually is
    name, _ = container(volume=str(data))
    assert docker("wait", name, timeout=60).stdout.strip() == "2"
    err = docker("logs", name).stderr
    assert "chown -R 10001" in err and "/data" in err, err
    assert "Traceback" not in err, err
    # The advice works.
    os.chown(data, 10001, 10001)
    name, base = container(volume=str(data))
    _wait_http(base + "/healthz", container=name)
    assert (data / "creditlens.db").exists()


def _compose_cmd() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return [DOCKER, "compose"]


@pytest.mark.slow
@pytest.mark.usefixtures("image")
def test_compose_default_and_postgres_services():
    password = "pw" + os.urandom(8).hex()
    project = f"creditlens-test-{os.getpid()}"
    env = {
        **os.environ,
        "COMPOSE_PROJECT_NAME": project,
        "CREDITLENS_PORT": str(free_port()),
        "CREDITLENS_PG_PORT": str(free_port()),
        "CREDITLENS_PG_PASSWORD": password,
    }
    base_cmd = [*_compose_cmd(), "-f", str(ROOT / "docker-compose.yml")]

    def compose(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        res = subprocess.run(
            [*base_cmd, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
        )
        assert res.returncode == 0, f"compose {' '.join(args)}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        return res

    def logs() -> str:
        return compose("--profile", "postgres", "logs", "--no-color").stdout

    config = compose("--profile", "postgres", "config").stdout
    assert config.count("image: creditlens\n") == 2 and "TORCH_PIP_ARGS" in config
    try:
        # The default services: the app alone, on SQLite.
        compose("up", "-d", "--no-build")
        running = compose("ps", "--services", "--filter", "status=running").stdout.split()
        assert running == ["app"], running
        app = f"http://127.0.0.1:{env['CREDITLENS_PORT']}"
        _wait_http(app + "/healthz", logs=logs)
        assert "handbuilt" in json.dumps(httpx.get(app + "/api/batches", timeout=10).json())

        # The PostgreSQL profile: the database, then the app on it with two workers.
        compose("--profile", "postgres", "up", "-d", "--no-build", timeout=600)
        running = compose("--profile", "postgres", "ps", "--services", "--filter", "status=running").stdout
        assert sorted(running.split()) == ["app", "app-pg", "db"], running
        pg = f"http://127.0.0.1:{env['CREDITLENS_PG_PORT']}"
        _wait_http(pg + "/healthz", logs=logs)
        stored = _upload(pg)
        for _ in range(4):  # answered by either worker, from the database
            assert httpx.get(f"{pg}/api/batches/{stored['batch_id']}", timeout=10).status_code == 200
        assert "handbuilt" in json.dumps(httpx.get(pg + "/api/batches", timeout=10).json())
        shown = logs()
        assert "postgresql+psycopg://creditlens:***@db:5432/creditlens" in shown, shown[-3000:]
        assert password not in shown
    finally:
        subprocess.run(
            [*base_cmd, "--profile", "postgres", "down", "-v", "--remove-orphans"],
            capture_output=True,
            env=env,
            cwd=ROOT,
            timeout=300,
        )


def test_serve_never_prints_the_database_password():
    """Start-up output (the container's logs) shows the database URL with the password masked, also
    when the settings are invalid or the server cannot reach the database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREDITLENS_")}
    for url in (
        "postgresql+psycopg://creditlens:s3cret-pw@127.0.0.1:1/creditlens",  # nothing listens there
        "mysql://creditlens:s3cret-pw@127.0.0.1/creditlens",  # an invalid setting
    ):
        env["CREDITLENS_DATABASE_URL"] = url
        res = subprocess.run(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(free_port())],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=120,
        )
        out = res.stdout + res.stderr
        assert res.returncode != 0, out
        assert "s3cret-pw" not in out, out
    assert "CREDITLENS_DATABASE_URL" in out  # the invalid setting is still named


CAP_DAC_READ_SEARCH = 2  # linux/capability.h


def as_uid_10001() -> list[str]:
    """A command prefix that runs a program as uid 10001 (the image's user), with no groups.

    The checkout and its venv may sit in a private folder (a 0700 home, a 0700 clone) that uid 10001
    cannot enter. So, when root may grant it (it is in the bounding set), the program also gets
    CAP_DAC_READ_SEARCH: it may read any file and enter any folder, and still write none that uid
    10001 may not (that is CAP_DAC_OVERRIDE, which it does not get). access(2), which the server's
    check uses, ignores capabilities for a non-root user, as it would for plain uid 10001."""
    cmd = ["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups"]
    status = Path("/proc/self/status").read_text()
    bounding = int(re.search(r"^CapBnd:\s*([0-9a-f]+)", status, re.M).group(1), 16)
    if bounding >> CAP_DAC_READ_SEARCH & 1:
        cmd += ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return cmd


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the server as another user")
def test_serve_explains_an_unwritable_data_folder():
    top = Path(tempfile.mkdtemp(prefix="creditlens-ro-"))  # pytest's own tmp folders are root-only
    top.chmod(0o755)
    data = top / "data"
    data.mkdir(mode=0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREDITLENS_")}
    env["CREDITLENS_DATABASE_URL"] = f"sqlite:///{data / 'creditlens.db'}"
    res = subprocess.run(
        [*as_uid_10001(), sys.executable, "-m", "app.cli", "serve", "--port", str(free_port())],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    shutil.rmtree(top)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"cannot write the database folder {data}" in res.stderr
    assert "chown -R 10001" in res.stderr and "Traceback" not in res.stderr
