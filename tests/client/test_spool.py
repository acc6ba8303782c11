"""No logged step is lost when the server is slower than the loop or the logging process dies:
30 steps in a tight loop through a slow proxy to a real server are all stored; a process killed
(SIGKILL) with steps still in its spool leaves them for the next ``client.run(name, resume=True)``,
which sends each exactly once; a live process's spool is never taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest

from creditlens import Client
from tests.client.servers import SlowProxy, closed_port
from tests.live_server import Server

ROOT = Path(__file__).resolve().parents[2]
B, T = 4, 16


def batch(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "token_ids": rng.integers(0, 1000, (B, T)),
        "policy_mask": np.r_[[0] * 6, [1] * 10][None].repeat(B, 0),
        "reward": rng.random(B),
        "advantages": rng.standard_normal((B, T)).astype(np.float32),
        "groups": np.array([0, 0, 1, 1]),
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spool")
    with Server(tmp / "creditlens.db", tmp / "server.log") as srv:
        yield srv.base


def stored_steps(base: str, run_id: int) -> list[int]:
    return [s["step"] for s in httpx.get(f"{base}/api/runs/{run_id}", timeout=30).json()["steps"]]


@pytest.mark.slow
def test_thirty_steps_in_a_tight_loop_against_a_slow_server_are_all_stored(server, tmp_path):
    # Every request waits 0.3 s in the proxy: the 30 steps take the server at least 9 s, the loop
    # far less. The in-memory queue holds 16; before the spool, 14 of these were dropped.
    proxy = SlowProxy(server, delay=0.3)
    try:
        with Client(proxy.url, spool_dir=tmp_path, create_timeout=30.0) as c:
            run = c.run("tight-loop")
            for step in range(30):
                run.log_tensors(step, **batch(step))
            assert run.dropped == 0
            assert run.flush(timeout=300)
            assert (run.sent, run.failed, run.dropped) == (30, 0, 0)
    finally:
        proxy.close()
    assert stored_steps(server, run.id) == list(range(30))
    assert not any(tmp_path.rglob("*.safetensors"))  # every file removed once the server took it


CHILD = r"""
import json, sys, time
import numpy as np
from creditlens import Client

url, spool, first, last, resume = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
B, T = 4, 16
client = Client(url, spool_dir=spool, create_timeout=30.0, max_backoff=0.5)
run = client.run("crash-me", resume=resume)
for step in range(first, last):
    rng = np.random.default_rng(step)
    run.log_tensors(step, token_ids=rng.integers(0, 1000, (B, T)), reward=rng.random(B),
                    policy_mask=np.r_[[0] * 6, [1] * 10][None].repeat(B, 0))
assert run.sync(timeout=120)  # every step is on disk: from here a crash loses none
print(json.dumps({"id": run.id, "pending": run.pending}), flush=True)
if sys.argv[6] == "wait":
    time.sleep(600)  # killed here, with steps still unsent
run.flush(timeout=300)
print(json.dumps({"id": run.id, "sent": run.sent, "failed": run.failed, "dropped": run.dropped, "pending": run.pending}), flush=True)
run.close()
"""


def child(*args: object, wait: bool) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "client"), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *map(str, args), "wait" if wait else "go"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
def test_a_killed_process_leaves_its_steps_for_resume_and_each_is_stored_once(server, tmp_path):
    spool = tmp_path / "spool"
    # The first process logs 20 steps through a slow proxy and is killed once they are all on disk:
    # the server has at most a few of them. (The spool is per server URL and run name: both
    # processes talk to the proxy's URL; for the second it no longer delays.)
    proxy = SlowProxy(server, delay=0.5)
    try:
        first = child(proxy.url, spool, 0, 20, 0, wait=True)
        line = json.loads(first.stdout.readline() or "{}")
        assert line.get("pending", 0) > 0, first.stderr.read() if first.poll() is not None else line
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        run_id = line["id"]
        assert run_id is not None
        left = sorted(p.name for p in spool.rglob("*.safetensors"))
        assert left, "the killed process left nothing in its spool"
        before = stored_steps(server, run_id)
        assert len(before) < 20 and len(before) + len(left) >= 20
        # A new process resumes the run: the leftovers first (a step the server already had comes
        # back as 409 and counts as sent), then its own 10 steps.
        proxy.delay = 0.0
        second = child(proxy.url, spool, 20, 30, 1, wait=False)
        out, err = second.communicate(timeout=300)
    finally:
        proxy.close()
    assert second.returncode == 0, err[-3000:]
    done = json.loads(out.strip().splitlines()[-1])
    assert done["id"] == run_id
    assert (done["sent"], done["failed"], done["dropped"], done["pending"]) == (len(left) + 10, 0, 0, 0)
    assert stored_steps(server, run_id) == list(range(30))
    assert not any(spool.rglob("*.safetensors"))


def test_a_live_process_keeps_its_spool_and_a_closed_one_is_resumed(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = Client(url, spool_dir=tmp_path, create_timeout=0.2, backoff=30.0)
        alive = c.run("shared")
        for step in range(3):
            alive.log_tensors(step, **batch(step))
        assert alive.sync(timeout=60)
        # Its folder is locked while it runs: another run of the name resumes nothing of it.
        other = c.run("shared", resume=True)
        assert other.pending == 0
        other.close(timeout=0)
        alive.close(timeout=0)  # unsent: kept on disk, unlocked
        later = c.run("shared", resume=True)
        try:
            assert later.pending == 3
            assert sorted(e.step for e in later._outbox) == [0, 1, 2]
        finally:
            later.close(timeout=0)
