"""Load: concurrent uploaders and readers against a real server process (`make bench`).

``run()`` starts ``uvicorn app.main:create_app`` on 127.0.0.1 with a fresh temp SQLite file, then
for ``duration`` seconds runs ``uploaders`` threads that each POST small batches (8 episodes of
~200 tokens, native JSONL) and ``readers`` threads that GET what has been stored (the advantages
API of a random episode, its batch with diagnostics, its group, and its HTML page), each thread
with its own httpx client, looping until the deadline. Afterwards every episode of every 201 is
read back (a "lost upload" is a 201 whose episodes are not all there with the right tokens), and
the server log is searched for "database is locked" and tracebacks.

Figures: requests done, p50/p99 latency (seconds) of uploads and reads, errors (any non-2xx,
connection error, "database is locked"), lost uploads. Errors and lost uploads must be 0.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from live_server import Server  # noqa: E402

EPISODES_PER_UPLOAD = 8
TOKENS = 200


def upload_body(rng: random.Random, tag: str) -> tuple[bytes, list[list[str]]]:
    """A native JSONL batch of EPISODES_PER_UPLOAD episodes (2 groups) and its token lists."""
    lines, tokens = [], []
    for k in range(EPISODES_PER_UPLOAD):
        n_prompt = 20
        toks = [f"{tag}-{k}-{i}" for i in range(TOKENS)]
        kinds = ["prompt"] * n_prompt + ["policy"] * (TOKENS - n_prompt)
        values = [round(rng.random(), 3) for _ in range(TOKENS)]
        ep = {"tokens": toks, "kinds": kinds, "reward": float(rng.random() < 0.5), "values": values}
        ep["group"] = f"task-{k % 2}"
        lines.append(json.dumps(ep))
        tokens.append(toks)
    return ("\n".join(lines) + "\n").encode(), tokens


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    upload_lat: list[float] = field(default_factory=list)
    read_lat: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    created: list[tuple[int, list[str], list[list[str]]]] = field(default_factory=list)
    slugs: list[tuple[int, str, str]] = field(default_factory=list)  # (batch id, slug, group)


def _record_error(stats: Stats, what: str) -> None:
    with stats.lock:
        if len(stats.errors) < 1000:
            stats.errors.append(what)


def uploader(base: str, stats: Stats, deadline: float, seed: int, headers: dict) -> None:
    rng = random.Random(seed)
    n = 0
    with httpx.Client(base_url=base, timeout=120, headers=headers) as client:
        while time.monotonic() < deadline:
            body, tokens = upload_body(rng, f"u{seed}n{n}")
            n += 1
            t = time.perf_counter()
            try:
                r = client.post(
                    "/api/uploads",
                    content=body,
                    params={"name": f"load {seed}/{n}", "format": "native"},
                    headers={"content-type": "application/octet-stream"},
                )
            except httpx.HTTPError as e:
                _record_error(stats, f"upload: {type(e).__name__}: {e}")
                continue
            dt = time.perf_counter() - t
            if r.status_code != 201:
                _record_error(stats, f"upload: {r.status_code} {r.text[:200]}")
                continue
            out = r.json()
            slugs = [e["slug"] for e in out["episodes"]]
            with stats.lock:
                stats.upload_lat.append(dt)
                stats.created.append((out["batch_id"], slugs, tokens))
                stats.slugs.extend((out["batch_id"], s, f"task-{k % 2}") for k, s in enumerate(slugs))


def reader(base: str, stats: Stats, deadline: float, seed: int) -> None:
    rng = random.Random(10_000 + seed)
    with httpx.Client(base_url=base, timeout=120) as client:
        while time.monotonic() < deadline:
            with stats.lock:
                pick = rng.choice(stats.slugs) if stats.slugs else None
            if pick is None:
                time.sleep(0.05)
                continue
            batch_id, slug, group = pick
            url = rng.choice(
                [
                    f"/api/episodes/{slug}/advantages?scheme=outcome,token_gae,turn_gae",
                    f"/api/episodes/{slug}",
                    f"/api/batches/{batch_id}",
                    f"/api/batches/{batch_id}/groups/{group}",
                    f"/e/{slug}",
                ]
            )
            t = time.perf_counter()
            try:
                r = client.get(url)
            except httpx.HTTPError as e:
                _record_error(stats, f"read {url}: {type(e).__name__}: {e}")
                continue
            dt = time.perf_counter() - t
            if r.status_code != 200:
                _record_error(stats, f"read {url}: {r.status_code} {r.text[:200]}")
                continue
            with stats.lock:
                stats.read_lat.append(dt)


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 4)


def lost_uploads(base: str, stats: Stats, threads: int = 8) -> int:
    """201s whose episodes are not all readable with exactly the uploaded tokens."""
    from concurrent.futures import ThreadPoolExecutor

    local = threading.local()

    def lost(item: tuple[int, list[str], list[list[str]]]) -> bool:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=base, timeout=120)
        client = local.client
        batch_id, slugs, tokens = item
        b = client.get(f"/api/batches/{batch_id}")
        if b.status_code != 200 or [e["slug"] for e in b.json()["episodes"]] != slugs:
            return True
        for slug, toks in zip(slugs, tokens, strict=True):
            r = client.get(f"/api/episodes/{slug}")
            if r.status_code != 200 or r.json()["tokens"] != toks or r.json()["batch_id"] != batch_id:
                return True
        return False

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(lost, stats.created))


def run(duration: float = 60.0, uploaders: int = 20, readers: int = 50, workers: int = 1) -> dict:
    """Load the server for ``duration`` seconds; figures as a dict (latencies in seconds)."""
    tmp = Path(tempfile.mkdtemp(prefix="creditlens-load-"))
    token = "load-test-write-token"
    env = {"CREDITLENS_WRITE_TOKEN": token}
    srv = Server(tmp / "load.db", tmp / "server.log", **env)
    if workers > 1:
        srv.extra_args = ["--workers", str(workers)]
    stats = Stats()
    try:
        srv.start()
        deadline = time.monotonic() + duration
        headers = {"Authorization": f"Bearer {token}"}
        threads = [
            threading.Thread(target=uploader, args=(srv.base, stats, deadline, i, headers), daemon=True)
            for i in range(uploaders)
        ] + [
            threading.Thread(target=reader, args=(srv.base, stats, deadline, i), daemon=True)
            for i in range(readers)
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(duration + 300)
        elapsed = time.monotonic() - t0
        lost = lost_uploads(srv.base, stats)
    finally:
        srv.stop()
        log = srv.log()  # after the shutdown, so errors while stopping count too
        shutil.rmtree(tmp, ignore_errors=True)
    locked = log.lower().count("database is locked") + sum("database is locked" in e for e in stats.errors)
    tracebacks = log.count("Traceback")
    n_up, n_read = len(stats.upload_lat), len(stats.read_lat)
    out = {
        "duration_s": round(elapsed, 1),
        "uploaders": uploaders,
        "readers": readers,
        "uploads_done": n_up,
        "episodes_uploaded": n_up * EPISODES_PER_UPLOAD,
        "reads_done": n_read,
        "requests_per_s": round((n_up + n_read) / elapsed, 1),
        "upload_p50_s": _pct(stats.upload_lat, 0.50),
        "upload_p99_s": _pct(stats.upload_lat, 0.99),
        "read_p50_s": _pct(stats.read_lat, 0.50),
        "read_p99_s": _pct(stats.read_lat, 0.99),
        "errors": len(stats.errors),
        "database_is_locked": locked,
        "server_tracebacks": tracebacks,
        "lost_uploads": lost,
        "first_errors": stats.errors[:5],
    }
    return out


if __name__ == "__main__":
    print(json.dumps(run(*(float(a) for a in sys.argv[1:2])), indent=2))
