"""The malformed-upload corpus (fixtures/malformed/, see its make_corpus.py and manifest.json).

Every file is uploaded twice, as a multipart file and as the raw request body, to the real app on
a temp SQLite file that already holds data. Each must answer the expected 4xx in the one error
shape, naming the problem (code, line, episode, field, words of the message), and leave every
table's rows exactly as they were (row counts and a hash of all rows in primary-key order).
The malicious pickles must be refused by torch.load(weights_only=True) without running.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.main import create_app
from tests.adversarial.adv_helpers import ROOT, db_fingerprint

CORPUS = ROOT / "fixtures" / "malformed"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
FORMATS = ROOT / "fixtures" / "formats"
ERROR_KEYS = {"status", "code", "message", "line", "episode", "field"}

_EP = {"tokens": ["q", " fix", " it"], "kinds": ["prompt", "policy", "policy"], "group": "t"}
SEED = {
    "seed.jsonl": "".join(
        json.dumps({**_EP, "reward": r, "values": [0, 0.5, r]}) + "\n" for r in (0, 1, 1)
    ).encode(),
    "chat.json": json.dumps(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}], "reward": 1}
    ).encode(),
}


def test_corpus_is_complete():
    """At least 40 cases, every file present, every file listed once."""
    names = [e["file"] for e in MANIFEST]
    assert len(names) >= 40
    assert len(set(names)) == len(names)
    on_disk = {p.name for p in CORPUS.iterdir()} - {"manifest.json", "make_corpus.py"}
    assert on_disk == set(names)
    assert all(400 <= e["status"] < 500 for e in MANIFEST)


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    """settings overrides (as JSON) -> a TestClient on a fresh database holding two batches."""
    made: dict[str, TestClient] = {}

    def get(overrides: dict) -> TestClient:
        key = json.dumps(overrides, sort_keys=True)
        if key not in made:
            folder = tmp_path_factory.mktemp("malformed")
            app = create_app(Settings(database_url=f"sqlite:///{folder / 'db.sqlite'}", **overrides))
            client = TestClient(app).__enter__()
            # Existing content the failed uploads must not disturb (small enough for every limit).
            for name, data in SEED.items():
                r = client.post("/api/uploads", files={"file": (name, data)})
                assert r.status_code == 201, r.text
            made[key] = client
        return made[key]

    yield get
    for client in made.values():
        client.__exit__(None, None, None)


def _post(client: TestClient, case: dict, how: str):
    data = (CORPUS / case["file"]).read_bytes()
    params = {"format": case["format"]} if "format" in case else {}
    if how == "multipart":
        return client.post("/api/uploads", files={"file": (case["file"], data)}, params=params)
    return client.post(
        "/api/uploads",
        content=data,
        params={**params, "name": case["file"]},
        headers={"content-type": "application/octet-stream"},
    )


@pytest.mark.parametrize("how", ["multipart", "raw"])
@pytest.mark.parametrize("case", MANIFEST, ids=[e["file"] for e in MANIFEST])
def test_malformed_upload_is_rejected_and_changes_nothing(case, how, clients, tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("CREDITLENS_PWNED_MARKER", str(marker))
    client = clients(case.get("settings", {}))
    engine = client.app.state.engine
    before = db_fingerprint(engine)

    r = _post(client, case, how)

    assert r.status_code == case["status"], f"{case['why']}: {r.status_code} {r.text[:500]}"
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == ERROR_KEYS
    assert err["status"] == case["status"]
    assert err["code"] == case["code"], err
    for key in ("line", "episode", "field"):
        if key in case:
            assert err[key] == case[key], f"{key}: {err}"
    for words in case["message"]:
        assert words.lower() in err["message"].lower(), err["message"]
    assert db_fingerprint(engine) == before
    assert not marker.exists(), "a pickle payload ran on the server"


def test_fingerprint_sees_a_valid_upload(clients):
    """The unchanged-database check can fail: a valid upload changes the fingerprint."""
    client = clients({})
    engine = client.app.state.engine
    before = db_fingerprint(engine)
    r = client.post("/api/uploads", files={"file": ("ok.jsonl", (FORMATS / "native.jsonl").read_bytes())})
    assert r.status_code == 201
    after = db_fingerprint(engine)
    assert after["episode"][0] > before["episode"][0]
    assert after["batch"][0] == before["batch"][0] + 1
    assert after != before


@pytest.mark.parametrize("name", ["evil_pickle.pt", "evil_torch_zip.pt"])
def test_evil_pickles_would_run_without_weights_only(name, tmp_path, monkeypatch):
    """The corpus' pickles really are malicious: loaded naively, they write the marker."""
    import io

    import torch

    marker = tmp_path / "pwned"
    monkeypatch.setenv("CREDITLENS_PWNED_MARKER", str(marker))
    try:
        torch.load(io.BytesIO((CORPUS / name).read_bytes()), weights_only=False)
    except RuntimeError:  # the legacy file runs the payload, then fails the magic-number check
        pass
    assert marker.read_text() == "pwned"


def test_corpus_is_reproducible():
    """make_corpus.py regenerates exactly the committed bytes (so the corpus cannot drift)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_corpus", CORPUS / "make_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, data, _exp in mod.cases():
        assert (CORPUS / name).read_bytes() == data, name


@pytest.mark.parametrize("how", ["multipart", "raw"])
def test_utf8_bom_is_accepted(clients, how):
    """A UTF-8 byte-order mark (Windows editors write one) is skipped, JSONL and JSON alike."""
    client = clients({})
    for body in (SEED["seed.jsonl"], SEED["chat.json"]):
        data = b"\xef\xbb\xbf" + body
        if how == "multipart":
            r = client.post("/api/uploads", files={"file": ("bom.jsonl", data)})
        else:
            r = client.post(
                "/api/uploads", content=data, headers={"content-type": "application/octet-stream"}
            )
        assert r.status_code == 201, r.text


def _chunks(total: int, size: int = 1 << 16):
    sent = 0
    while sent < total:
        yield b" " * min(size, total - sent)
        sent += size


def test_oversize_streamed_without_content_length(clients):
    """Chunked bodies (no Content-Length to check up front) are cut off at the limit: 413."""
    client = clients({"max_upload_bytes": 2000})
    before = db_fingerprint(client.app.state.engine)
    r = client.post(
        "/api/uploads", content=_chunks(1 << 20), headers={"content-type": "application/octet-stream"}
    )
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "too_large"
    boundary = "xyzzy"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'.encode()
    )

    def multipart():
        yield head
        yield from _chunks(1 << 20)
        yield f"\r\n--{boundary}--\r\n".encode()

    r = client.post(
        "/api/uploads",
        content=multipart(),
        headers={"content-type": f"multipart/form-data; boundary={boundary}"},
    )
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "too_large"
    assert db_fingerprint(client.app.state.engine) == before


@pytest.mark.slow
@pytest.mark.parametrize("how", ["multipart", "raw"])
def test_chunked_oversize_is_never_spooled_by_a_real_server(how, tmp_path):
    """A real server refuses a chunked 200 MB upload (limit 100 kB) without buffering it: the temp
    files it holds open (the form parser spools file parts beyond 1 MB) never grow past a few MB."""
    import threading

    from tests.adversarial.adv_helpers import Server

    spool = tmp_path / "spool"
    spool.mkdir()
    total = 200 << 20

    def body():
        if how == "multipart":
            yield b'--xyzzy\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
        for _ in range(total >> 16):
            yield b" " * (1 << 16)
        if how == "multipart":
            yield b"\r\n--xyzzy--\r\n"

    peak = 0
    done = threading.Event()

    def watch(pid: int):
        # Spooled temp files are unlinked at once: find them among the server's open files.
        nonlocal peak
        while not done.is_set():
            size = 0
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    if os.readlink(fd).startswith(str(spool)):
                        size += os.stat(fd).st_size
                except OSError:  # closed while we looked
                    continue
            peak = max(peak, size)
            time.sleep(0.01)

    ctype = "multipart/form-data; boundary=xyzzy" if how == "multipart" else "application/octet-stream"
    env = {"CREDITLENS_MAX_UPLOAD_BYTES": "100000", "TMPDIR": str(spool)}
    with Server(tmp_path / "db.sqlite", tmp_path / "server.log", **env) as srv:
        watcher = threading.Thread(target=watch, args=(srv.pid,), daemon=True)
        watcher.start()
        try:
            r = httpx.post(
                f"{srv.base}/api/uploads", content=body(), headers={"content-type": ctype}, timeout=120
            )
            status = r.status_code
        except httpx.HTTPError:  # the server answered and closed while we were still sending
            status = None
        done.set()
        watcher.join(5)
        assert status in (413, None)
        assert peak < 4 << 20, f"the server spooled {peak >> 20} MB of a refused upload"
        assert httpx.get(f"{srv.base}/api/batches", timeout=30).json() == []
