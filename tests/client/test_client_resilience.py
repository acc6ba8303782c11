"""The client never breaks or stalls a training loop and loses no step short of its disk budget:
against a server that is down, one that accepts and never answers, one answering 503 or 500, and
one refusing steps with 4xx."""

from __future__ import annotations

import warnings

import httpx
import numpy as np
import pytest

from app.ingest import parse_upload
from creditlens import Client, _batch
from tests.client.servers import HoldingServer, HTTPServer, closed_port

B, T = 4, 16


def batch(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    attn = np.ones((B, T), dtype=np.int64)
    attn[1, -3:] = 0
    return {
        "token_ids": rng.integers(0, 1000, (B, T)),
        "attention_mask": attn,
        "policy_mask": np.r_[[0] * 6, [1] * 10][None].repeat(B, 0),
        "reward": rng.random(B),
        "advantages": rng.standard_normal((B, T)).astype(np.float32),
        "groups": np.array([0, 0, 1, 1]),
    }


def client(url: str, **kw) -> Client:
    opts = dict(max_queue=3, max_retries=2, backoff=30.0, create_timeout=0.5, timeout=httpx.Timeout(60.0))
    opts.update(kw)
    return Client(url, **opts)


def spooled(run) -> list[str]:
    return sorted(p.name for p in run.spool_folder.iterdir() if p.name != ".lock")


def drop_warnings(record: list) -> list:
    return [w for w in record if "dropping step" in str(w.message)]


def test_down_server_costs_nothing_and_every_step_waits_on_disk(tmp_path):
    c = client(f"http://127.0.0.1:{closed_port()}", spool_dir=tmp_path)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        run = c.run("down")
        for step in range(5):
            run.log_tensors(step, **batch(step))
        assert run.sync(timeout=60)
        # max_queue is 3, yet nothing is dropped: what does not fit in memory waits on disk.
        assert (run.dropped, run.pending, run.id) == (0, 5, None)
        assert spooled(run) == [f"{i:010d}-{i}.safetensors" for i in range(5)]
        folder = run.spool_folder
        run.close(timeout=0)
    assert not drop_warnings(rec)
    assert sum("kept in" in str(w.message) for w in rec) == 1
    assert run.sent == 0
    # Closed, the steps stay on disk for a later client.run("down", resume=True).
    assert sorted(p.name for p in folder.iterdir() if p.name != ".lock") == [
        f"{i:010d}-{i}.safetensors" for i in range(5)
    ]


def test_never_answering_server_does_not_block_the_caller(tmp_path):
    srv = HoldingServer()
    try:
        c = client(srv.url, spool_dir=tmp_path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = c.run("hold")  # gives up waiting after create_timeout; creation moves to the sender
            assert srv.got_request.is_set()
            for step in range(6):
                run.log_tensors(step, **batch(step))
            assert run.sync(timeout=60)
            # Every call returned while the server still holds its connections.
            assert not srv.released.is_set()
            assert (run.dropped, run.pending) == (0, 6)
    finally:
        srv.release()
    run.close(timeout=0)
    assert run.sent == 0


def test_503_is_retried_until_the_server_answers(tmp_path):
    srv = HTTPServer(unavailable=7)  # more 503s than max_retries allows: "not now" is never given up
    try:
        c = client(srv.url, backoff=0.001, max_backoff=0.002, spool_dir=tmp_path)
        with c.run("busy") as run:
            for step in range(3):
                run.log_tensors(step, **batch(step))
            assert run.flush(timeout=60)
            assert (run.sent, run.failed, run.dropped) == (3, 0, 0)
        steps = [r for r in srv.requests if "/steps/" in r[1]]
        assert len(steps) == 7 + 3
        assert sorted(srv.steps) == [(1, 0), (1, 1), (1, 2)]
        assert not run.spool_folder.exists()  # all sent: the folder is gone
    finally:
        srv.close()


def test_500_is_retried_with_backoff_then_given_up(tmp_path):
    srv = HTTPServer(status=500)
    try:
        c = client(srv.url, backoff=0.001, max_backoff=0.002, spool_dir=tmp_path)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            run = c.run("broken")
            for step in range(3):
                run.log_tensors(step, **batch(step))
            assert run.flush(timeout=60)
        assert (run.sent, run.failed, run.dropped) == (0, 3, 0)
        # One attempt at creation by client.run, then 3 attempts (1 + max_retries) per step, each
        # stopping at the run creation the server keeps refusing.
        assert len(srv.requests) == 1 + 3 * 3
        assert sum("gave up" in str(w.message) for w in rec) == 1
        run.close()
    finally:
        srv.close()


def test_4xx_is_not_retried_and_warned_once(tmp_path):
    srv = HTTPServer(step_status=422)
    try:
        c = client(srv.url, backoff=0.001, max_queue=8, spool_dir=tmp_path)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            with c.run("refused") as run:
                for step in range(4):
                    run.log_tensors(step, **batch(step))
                assert run.flush(timeout=60)
        steps = [r for r in srv.requests if "/steps/" in r[1]]
        assert len(steps) == 4  # one request per batch: never retried
        assert (run.sent, run.failed, run.dropped) == (0, 4, 0)
        assert sum("refused step" in str(w.message) for w in rec) == 1
    finally:
        srv.close()


def test_steps_arrive_in_the_wire_format_and_409_counts_as_sent():
    srv = HTTPServer()
    try:
        with client(srv.url, max_queue=8) as c:
            run = c.run("ok", config={"lr": 1e-6})
            assert run.id == 1 and run.url == f"{srv.url}/r/1"
            data = batch(0)
            run.log_tensors(3, **data)
            data["advantages"][:] = 99.0  # the trainer reuses its buffer: what was logged stays
            run.log_tensors(3, **batch(1))  # the same step again: the server answers 409
            run.log(4, [{"tokens": ["a", "b"], "kinds": ["prompt", "policy"], "reward": 1.0}])
            assert run.flush(timeout=60)
            assert (run.sent, run.failed, run.dropped) == (2 + 1, 0, 0)
            again = c.run("ok", resume=True)
            assert again.id == 1
        fmt, body = srv.steps[(1, 3)]
        assert fmt == "safetensors"
        eps = parse_upload(body, fmt).episodes
        want = batch(0)
        assert [len(e.tokens) for e in eps] == [16, 13, 16, 16]
        assert eps[0].kinds == ["prompt"] * 6 + ["policy"] * 10
        np.testing.assert_allclose(eps[2].advantages, want["advantages"][2], rtol=1e-6)
        assert [e.group for e in eps] == ["0", "0", "1", "1"]
        assert eps[1].reward == pytest.approx(want["reward"][1])
        fmt, body = srv.steps[(1, 4)]
        assert fmt == "native"
        assert parse_upload(body, fmt).episodes[0].tokens == ["a", "b"]
    finally:
        srv.close()


def test_only_beyond_the_disk_budget_are_steps_dropped(tmp_path):
    one = len(_batch.build(_batch.snapshot(**batch())))  # one step's file on disk
    c = client(f"http://127.0.0.1:{closed_port()}", max_spool_bytes=2 * one + one // 2, spool_dir=tmp_path)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        run = c.run("bytes")
        try:
            for step in range(5):
                run.log_tensors(step, **batch(step))
            assert run.sync(timeout=60)
            assert (run.pending, run.dropped) == (2, 3)
            assert spooled(run) == ["0000000000-0.safetensors", "0000000001-1.safetensors"]
        finally:
            run.close(timeout=0)
    assert len(drop_warnings(rec)) == 1  # one warning, not one per drop
    assert "max_spool_bytes" in str(drop_warnings(rec)[0].message)


def test_wrong_arguments_warn_unless_strict():
    srv = HTTPServer()
    try:
        bad = batch()
        bad["advantages"] = bad["advantages"][:, :5]
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            with client(srv.url) as c:
                run = c.run("lenient")
                run.log_tensors(0, **bad)
                assert run.failed == 1
        assert any("`advantages` has shape (4, 5)" in str(w.message) for w in rec)
        with client(srv.url, strict=True) as c:
            run = c.run("strict")
            with pytest.raises(ValueError, match="advantages"):
                run.log_tensors(0, **bad)
    finally:
        srv.close()
