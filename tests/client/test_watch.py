"""``creditlens watch`` as a real subprocess against a real server process: a test writes step
files into a dump folder while it runs (one of them in two halves, the second written only once
watch said it saw the first), restarts watch in the middle, stops and restarts the server; every
step lands exactly once, in order, in one run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from creditlens import Client
from creditlens.watch import default_state_path, incomplete_reason
from tests.client.servers import HTTPServer
from tests.live_server import ROOT, Server, free_port

DEADLINE_S = 90.0


class Watch:
    """``python -m app.cli watch ...`` with its output lines collected as they come."""

    def __init__(self, folder: Path, server: str, run: str, *extra: str) -> None:
        cmd = [sys.executable, "-m", "app.cli", "watch", str(folder), "--server", server, "--run", run]
        cmd += ["--interval", "0.2", "--max-backoff", "1", *extra]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CREDITLENS_")}
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = DEADLINE_S) -> str:
        """The first output line matching ``pattern``; fails after ``timeout`` seconds."""
        rx = re.compile(pattern)

        def hit() -> str | None:
            return next((ln for ln in self.lines if rx.search(ln)), None)

        with self._cond:
            ok = self._cond.wait_for(lambda: hit() is not None or self.proc.poll() is not None, timeout)
            found = hit()
        assert found is not None, f"no line matching {pattern!r} (ok={ok}); output:\n" + "\n".join(self.lines)
        return found

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        return rc

    def sent(self) -> list[int]:
        return [int(m.group(1)) for ln in self.lines if (m := re.match(r"sent step (\d+) ", ln))]


def verl_lines(step: int, n: int) -> list[str]:
    """``n`` verl rollout_data_dir records of ``step`` (the first passes, the others fail)."""
    return [
        json.dumps(
            {"input": f"q{step} {i // 2}", "output": f"answer {i}", "score": float(i == 0), "step": step}
        )
        + "\n"
        for i in range(n)
    ]


def write_step(folder: Path, step: int, n: int) -> None:
    (folder / f"{step}.jsonl").write_text("".join(verl_lines(step, n)))


def n_of(step: int) -> int:
    return 2 + step % 3  # episodes per step differ, so a step's count names its file


def run_of(base: str, name: str) -> dict:
    runs = httpx.get(f"{base}/api/runs", params={"name": name}).json()
    assert len(runs) == 1, runs  # one run, resumed by name, never a second one
    return httpx.get(f"{base}/api/runs/{runs[0]['id']}").json()


@pytest.fixture()
def server(tmp_path):
    with Server(tmp_path / "creditlens.db", tmp_path / "server.log") as srv:
        yield srv


@pytest.mark.slow
def test_follows_the_folder_waits_for_half_written_files_and_resumes(server, tmp_path):
    dumps = tmp_path / "rollout_data"
    dumps.mkdir()
    for s in (0, 1):
        write_step(dumps, s, n_of(s))
    w1 = Watch(dumps, server.base, "verl-watch")
    try:
        w1.wait_for(r"^sent step 1 ")
        # Step 2 in two halves: the first ends inside a record; step 3 is complete meanwhile and
        # must still wait for step 2 (steps go in order).
        lines = verl_lines(2, n_of(2))
        text = "".join(lines)
        cut = len(lines[0]) + len(lines[1]) // 2
        with open(dumps / "2.jsonl", "w") as f:
            f.write(text[:cut])
        write_step(dumps, 3, n_of(3))
        w1.wait_for(r"^waiting for step 2 \(2\.jsonl.*line 2 is not complete JSON")
        assert 3 not in w1.sent()
        with open(dumps / "2.jsonl", "a") as f:
            f.write(text[cut:])
        w1.wait_for(r"^sent step 3 ")
    finally:
        w1.stop()
    assert w1.sent() == [0, 1, 2, 3]
    state = json.loads(default_state_path(dumps, "verl-watch").read_text())
    assert sorted(state["steps"], key=int) == ["0", "1", "2", "3"]
    assert state["steps"]["2"]["size"] == len(text.encode())

    # Restarted watch: goes on with the new steps, sends none of the old ones again.
    for s in (4, 5):
        write_step(dumps, s, n_of(s))
    w2 = Watch(dumps, server.base, "verl-watch")
    try:
        w2.wait_for(r"4 step\(s\) already sent")
        w2.wait_for(r"^sent step 5 ")
    finally:
        w2.stop()
    assert w2.sent() == [4, 5]
    assert not [ln for ln in w1.lines + w2.lines if ln.startswith(("exists", "refused"))]

    run = run_of(server.base, "verl-watch")
    assert [s["step"] for s in run["steps"]] == [0, 1, 2, 3, 4, 5]
    assert [s["n_episodes"] for s in run["steps"]] == [n_of(s) for s in range(6)]
    # One pass per step: the pass rate is 1/n, computed by the server from the file it got.
    assert [s["metrics"]["pass_rate"] for s in run["steps"]] == pytest.approx([1 / n_of(s) for s in range(6)])
    for ln in w1.lines:
        if m := re.match(r"sent step (\d+) .*: (\d+) episode\(s\)", ln):
            assert int(m.group(2)) == n_of(int(m.group(1)))


@pytest.mark.slow
def test_catches_up_when_the_server_comes_back(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    dumps = tmp_path / "nemo"
    dumps.mkdir()

    def write(step: int) -> None:
        rec = {"token_ids": [1, 2, 3, 4], "token_loss_mask": [0, 0, 1, 1], "rewards": float(step % 2)}
        (dumps / f"train_data_step{step}.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps(rec) + "\n")

    write(0)
    # watch starts before the server exists.
    w = Watch(dumps, base, "nemo-watch", "--format", "nemo_rl")
    srv = Server(tmp_path / "creditlens.db", tmp_path / "server.log", port=port)
    try:
        w.wait_for(r"^server .* is not answering; step 0")
        srv.start()
        w.wait_for(r"^sent step 0 ")
        srv.stop()  # down for a while: two steps are written meanwhile
        write(1)
        write(2)
        w.wait_for(r"^server .* is not answering; step 1")
        srv = Server(tmp_path / "creditlens.db", tmp_path / "server2.log", port=port).start()
        w.wait_for(r"^sent step 2 ")
        w.wait_for(r"answering again")
        run = run_of(base, "nemo-watch")
    finally:
        w.stop()
        srv.stop()
    assert w.sent() == [0, 1, 2]
    assert [s["step"] for s in run["steps"]] == [0, 1, 2]
    assert [s["metrics"]["pass_rate"] for s in run["steps"]] == [0.0, 1.0, 0.0]


def trl_parquet(step: int) -> bytes:
    pa = pytest.importorskip("pyarrow")
    import io

    import pyarrow.parquet as pq

    table = pa.table(
        {
            "step": [str(step)] * 2,
            "prompt": ["2+2=", "2+2="],
            "completion": ["4", "5"],
            "accuracy_reward": [1.0, 0.0],
            "advantage": [0.7, -0.7],
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def test_once_uploads_trl_completions_and_exits(server, tmp_path):
    out = tmp_path / "trl-out"
    (out / "completions").mkdir(parents=True)
    for s in (0, 1):
        (out / "completions" / f"completions_{s:05d}.parquet").write_bytes(trl_parquet(s))
    state = tmp_path / "state.json"
    w = Watch(out, server.base, "trl-watch", "--once", "--state", str(state))
    assert w.proc.wait(timeout=DEADLINE_S) == 0, "\n".join(w.lines)
    w.stop()
    assert w.sent() == [0, 1]
    run = run_of(server.base, "trl-watch")
    assert [(s["step"], s["n_episodes"], s["metrics"]["pass_rate"]) for s in run["steps"]] == [
        (0, 2, 0.5),
        (1, 2, 0.5),
    ]
    assert json.loads(state.read_text())["run_id"] == run["id"]
    # Once more: nothing new, nothing sent.
    again = Watch(out, server.base, "trl-watch", "--once", "--state", str(state))
    assert again.proc.wait(timeout=DEADLINE_S) == 0
    again.stop()
    assert again.sent() == [] and "2 step(s) already sent" in "\n".join(again.lines)
    # A second run of that name appears: the state's steps went to the first, so watch stops.
    httpx.post(f"{server.base}/api/runs", json={"name": "trl-watch", "config": {}})
    other = Watch(out, server.base, "trl-watch", "--once", "--state", str(state))
    assert other.proc.wait(timeout=DEADLINE_S) == 2
    other.stop()
    assert f"records steps sent to run {run['id']}" in "\n".join(other.lines) and other.sent() == []


def test_once_uploads_slime_rollout_dumps(server, tmp_path):
    """slime --dump-details DIR writes DIR/rollout_data/{rollout_id}.pt; DIR is enough."""
    dump = tmp_path / "slime-dump"
    (dump / "rollout_data").mkdir(parents=True)
    fixture = (ROOT / "fixtures" / "formats" / "slime_rollout.pt").read_bytes()
    for s in (0, 1):
        (dump / "rollout_data" / f"{s}.pt").write_bytes(fixture)
    w = Watch(dump, server.base, "slime-watch", "--once")
    assert w.proc.wait(timeout=DEADLINE_S) == 0, "\n".join(w.lines)
    w.stop()
    assert w.sent() == [0, 1]
    run = run_of(server.base, "slime-watch")
    assert [(s["step"], s["n_episodes"]) for s in run["steps"]] == [(0, 4), (1, 4)]


def test_a_refused_step_is_reported_and_watch_goes_on(server, tmp_path):
    dumps = tmp_path / "d"
    dumps.mkdir()
    write_step(dumps, 0, 2)
    (dumps / "1.jsonl").write_text(json.dumps({"input": "q", "output": 3, "score": 1}) + "\n")
    write_step(dumps, 2, 2)
    w = Watch(dumps, server.base, "bad-step", "--once")
    assert w.proc.wait(timeout=DEADLINE_S) == 1
    w.stop()
    refused = w.wait_for(r"^refused step 1 ")
    assert "HTTP 422" in refused and "output" in refused
    assert w.sent() == [0, 2]
    assert [s["step"] for s in run_of(server.base, "bad-step")["steps"]] == [0, 2]


def test_incomplete_files_are_told_apart():
    jsonl = b'{"a": 1}\n{"b": 2}\n'
    assert incomplete_reason(jsonl, "jsonl") is None
    assert incomplete_reason(jsonl[:-4], "jsonl") == "line 2 is not complete JSON"
    assert incomplete_reason(b"", "jsonl") == "empty"
    pq = trl_parquet(0)
    assert incomplete_reason(pq, "parquet") is None
    assert incomplete_reason(pq[:-1], "parquet") == "no parquet footer yet"
    assert incomplete_reason(pq[:4] + pq[-8:], "parquet") is not None  # footer longer than the file
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", b"x" * 100)
    pt = buf.getvalue()
    assert incomplete_reason(pt, "zip") is None
    assert incomplete_reason(pt[: len(pt) // 2], "zip").startswith("not a whole zip archive")


def test_run_send_returns_what_became_of_the_step():
    """Run.send (what watch posts with): the answer for 201, 409 and a 4xx (not retried); None
    once the retries for a 503 run out."""
    srv = HTTPServer()
    try:
        with Client(srv.url, backoff=0.001, max_backoff=0.002, max_retries=2) as c:
            run = c.run("send")
            assert run.send(3, b"first", "native").status_code == 201
            assert run.send(3, b"second", "native").status_code == 409
        assert srv.steps == {(run.id, 3): ("native", b"first")}
    finally:
        srv.close()
    for status, want, n_step_posts in ((422, 422, 1), (503, None, 3)):
        srv = HTTPServer(step_status=status)
        try:
            with Client(srv.url, backoff=0.001, max_backoff=0.002, max_retries=2) as c:
                with pytest.warns(RuntimeWarning):
                    r = c.run("send").send(0, b"x", "native")
            assert (r.status_code if r is not None else None) == want
            assert sum("/steps/" in q[1] for q in srv.requests) == n_step_posts
        finally:
            srv.close()
