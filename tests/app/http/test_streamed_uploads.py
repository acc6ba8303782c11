"""Raw upload bodies longer than one segment (CREDITLENS_UPLOAD_SEGMENT_BYTES), received in pieces
by a real server (uvicorn) from a client that sends the file in small chunks, as a network does:
a JSONL file in a format read line by line (a prime-rl rank file) is read while it arrives, with
lines cut across segments; any other body is joined and read as before. Either way the upload is
stored whole or not at all, and an error names its line.

The rank files are written from prime-rl's exporter schema (see
tests/app/ingest/test_fmt_prime_rl_tokens.py: no public export file exists)."""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.app.ingest.fmt_helpers import STORED_FIELDS
from tests.app.svc_helpers import episode, jsonl
from tests.live_server import Server

SEGMENT = 16384  # the server's segment: holds a first line; every test file below spans several


def _rank_file(n: int, tokens: int = 48, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        mask = [False] * 10 + [True] * (tokens - 10)
        tlp = (-rng.random(tokens)).round(6).tolist()
        ilp = (-rng.random(tokens)).round(6).tolist()
        rows.append(
            {
                "schema_version": 2,
                "step": 3,
                "rank": 0,
                "micro_sequence_idx": i,
                "sample_id": f"ex{i // 4}-{i % 4}",
                "env_name": "calc",
                "token_ids": [int(x) for x in rng.integers(0, 150_000, tokens)],
                "loss_mask": mask,
                "advantages": rng.standard_normal(tokens).tolist(),
                "rewards": [float(i % 2)] * tokens,
                "inference_logprobs": ilp,
                "trainer_logprobs": tlp,
                "entropy": rng.random(tokens).tolist(),
                "importance_ratio": np.exp(np.array(tlp) - np.array(ilp)).tolist(),
                "is_masked": [bool(x) for x in rng.random(tokens) < 0.1],
            }
        )
    return rows


def _text(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _chunks(data: bytes, size: int = 1000) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _post(c: httpx.Client, data: bytes, path: str = "/api/uploads", **params: str) -> httpx.Response:
    return c.post(
        path,
        content=_chunks(data),
        params={"name": "rank_0.jsonl", **params},
        headers={"Content-Type": "application/octet-stream"},
    )


def _episodes(c: httpx.Client, body: dict) -> list[dict]:
    out = []
    for e in body["episodes"]:
        ep = c.get(f"/api/episodes/{e['slug']}").json()
        adv = c.get(f"/api/episodes/{e['slug']}/advantages", params={"scheme": "uploaded"}).json()
        out.append({k: ep[k] for k in STORED_FIELDS} | {"uploaded": adv["schemes"][0]["advantages"]})
    return out


def _count(c: httpx.Client) -> int:
    return len(c.get("/api/batches").json())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("streamed")
    with Server(
        folder / "db.sqlite",
        folder / "server.log",
        CREDITLENS_UPLOAD_SEGMENT_BYTES=str(SEGMENT),
        CREDITLENS_MAX_UPLOAD_BYTES=str(400_000),
    ) as srv:
        yield srv


@pytest.fixture()
def c(server):
    with httpx.Client(base_url=server.base, timeout=60) as client:
        yield client


def test_a_rank_file_read_as_it_arrives_is_stored_as_a_whole_one(c):
    rows = _rank_file(24)
    data = _text(rows)
    assert 7 * SEGMENT < len(data) < 400_000 and len(data.split(b"\n")[0]) < SEGMENT
    r = _post(c, data)
    assert r.status_code == 201, r.text
    streamed = _episodes(c, r.json())
    # The same file as a multipart upload: read whole (no segments).
    r = c.post("/api/uploads", files={"file": ("rank_0.jsonl", data)})
    assert r.status_code == 201, r.text
    whole = _episodes(c, r.json())
    assert streamed == whole and len(streamed) == 24
    first = streamed[0]
    assert first["token_ids"] == rows[0]["token_ids"] and first["uploaded"] == rows[0]["advantages"]
    assert first["meta"]["token_signals"]["is_masked"] == rows[0]["is_masked"]
    assert first["meta"]["sample_id"] == "ex0-0" and first["kinds"].count("prompt") == 10


def test_a_bad_line_late_in_the_stream_stores_nothing(c):
    rows = _rank_file(24, seed=1)
    rows[20]["entropy"][7] = "high"
    before = _count(c)
    r = _post(c, _text(rows))
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert (err["code"], err["line"], err["field"]) == ("wrong_type", 21, "entropy")
    assert "entry 7" in err["message"]
    assert _count(c) == before
    # The connection is still good: the next upload goes through.
    assert _post(c, _text(_rank_file(3))).status_code == 201


def test_a_line_cut_by_the_end_of_the_upload(c):
    data = _text(_rank_file(12, seed=2))
    r = _post(c, data[: len(data) - 500])  # the last line is cut
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_json"
    assert r.json()["error"]["line"] == 12


def test_over_the_limit_midway_answers_413_and_stores_nothing(c):
    data = _text(_rank_file(80, seed=3))
    assert len(data) > 400_000
    before = _count(c)
    r = _post(c, data)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    assert _count(c) == before


@pytest.mark.parametrize(
    "what",
    ["native", "gzip", "long_first_line"],
)
def test_other_bodies_longer_than_a_segment_are_read_whole(c, what):
    if what == "native":  # a format that is not read line by line
        data = jsonl([episode(n_prompt=20, n_policy=60) for _ in range(40)]).encode()
        n = 40
    elif what == "gzip":
        data, n = gzip.compress(_text(_rank_file(10, seed=4))), 10
    else:  # a first record longer than the segment: detection needs all of it
        data, n = _text(_rank_file(3, tokens=300, seed=5)), 3
    assert len(data) > SEGMENT
    r = _post(c, data)
    assert r.status_code == 201, r.text
    assert len(r.json()["episodes"]) == n


def test_a_run_step_read_as_it_arrives(c):
    run = c.post("/api/runs", json={"name": "streamed", "trainer": "prime_rl"})
    assert run.status_code == 201, run.text
    rid = run.json()["id"]
    rows = _rank_file(16, seed=6)
    r = _post(c, _text(rows), path=f"/api/runs/{rid}/steps/3")
    assert r.status_code == 201, r.text
    assert [s["step"] for s in c.get(f"/api/runs/{rid}").json()["steps"]] == [3]
    # A bad trainer name is answered once the body is in, and stores nothing.
    r = _post(c, _text(rows), path=f"/api/runs/{rid}/steps/4", trainer="nope")
    assert r.status_code == 422 and r.json()["error"]["field"] == "trainer"
    assert [s["step"] for s in c.get(f"/api/runs/{rid}").json()["steps"]] == [3]


def test_a_client_gone_midway_stores_nothing(c, server):
    # Headers and half the body, then the connection closes: the reading, already under way, must
    # end without a batch (a clean end of the body would have stored the lines it had).
    data = _text(_rank_file(24, seed=7))
    before = _count(c)
    host, port = server.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        head = (
            f"POST /api/uploads?name=gone.jsonl HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        # Cut after a whole line: read as a clean end, those lines would make a valid upload.
        cut = data.index(b"\n", len(data) // 2) + 1
        s.sendall(head.encode() + data[:cut])
    # Uploads are read one at a time (CREDITLENS_INGEST_THREADS=1): once the next one is stored,
    # the one cut short has finished.
    r = _post(c, _text(_rank_file(3, seed=8)))
    assert r.status_code == 201, r.text
    assert _count(c) == before + 1
