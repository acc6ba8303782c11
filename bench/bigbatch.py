"""Big batches and memory, against a real server.

* One episode's outcome-family answer (outcome, grpo, opo, gpg) in a 5,000-episode batch vs a
  16-episode one: the batch's [B] summaries and each scheme's [B] advantages are computed once per
  batch state and reused, so the ratio should stay near 1 (median of repeats, after a warm-up).
* GET /api/batches/{id} of the 5,000-episode batch: one page (500 episodes) and its size.
* Peak RSS growth (VmHWM) of the server over the adversarial batch of tests/adversarial/
  test_adv_memory.py (499 one-token episodes + one 131,000-token episode), every scheme. A scheme
  whose inputs the batch lacks (e.g. ``monte_carlo`` without rollouts) answers 422 in the one
  error shape, naming what is missing: counted and listed, not a failure; anything but 200, 413
  or such a 422 is.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent

from bench._server import Server, server  # noqa: E402

REPEATS = 15
SCHEMES = ("outcome", "grpo", "opo", "gpg")
BIG = 5000
ADVERSARIAL = True  # the adversarial batch on its own server (quick mode: every scheme on the small batch)

QUICK = {"REPEATS": 2, "BIG": 64, "ADVERSARIAL": False}


def _batch(n: int, tokens: int = 50) -> bytes:
    eps = [
        {
            "tokens": ["p"] * 5 + ["a"] * tokens,
            "kinds": ["prompt"] * 5 + ["policy"] * tokens,
            "reward": float(i % 3 == 0),
            "group": f"task-{i // 8}",
        }
        for i in range(n)
    ]
    return "".join(json.dumps(e) + "\n" for e in eps).encode()


def _median_ms(c: httpx.Client, url: str, params: dict) -> float:
    c.get(url, params=params).raise_for_status()  # warm-up: the first use computes the summaries
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        c.get(url, params=params).raise_for_status()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run() -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="creditlens-bench-bigbatch-"))
    out: dict = {}
    with (
        server(tmp, "bench") as srv,
        httpx.Client(base_url=srv.base, timeout=300) as c,
    ):
        small = c.post("/api/uploads", files={"file": ("s.jsonl", _batch(16))}).json()
        big = c.post("/api/uploads", files={"file": ("b.jsonl", _batch(BIG))}).json()
        for scheme in SCHEMES:
            params = {"scheme": scheme, "critic": "zero"}
            t_small = _median_ms(c, f"/api/episodes/{small['episodes'][3]['slug']}/advantages", params)
            t_big = _median_ms(c, f"/api/episodes/{big['episodes'][BIG // 2]['slug']}/advantages", params)
            out[f"{scheme}: one episode, 16-episode batch (ms)"] = round(t_small, 2)
            out[f"{scheme}: one episode, {BIG:,}-episode batch (ms)"] = round(t_big, 2)
            out[f"{scheme}: ratio {BIG:,} / 16 (goal ~1)"] = round(t_big / t_small, 2)
        url = f"/api/batches/{big['batch_id']}"
        out[f"GET /api/batches/{{id}}, {BIG:,} episodes, first page (ms)"] = round(_median_ms(c, url, {}), 2)
        out["  its size (bytes)"] = len(c.get(url).content)
        if not ADVERSARIAL:
            slugs = [e["slug"] for e in small["episodes"]]
            worst, lacking = _every_scheme(c, [slugs[-1], slugs[0]])
            out["every scheme on the 16-episode batch: slowest answer (s)"] = round(worst, 2)
            out["  schemes needing inputs it lacks (422)"] = ", ".join(lacking) or "none"
            return out

    # The adversarial batch, on a fresh server.
    from tests.adversarial.test_adv_memory import LONG, adversarial_batch  # noqa: PLC0415

    # A fresh server of its own: its peak RSS is the figure.
    with Server(tmp / "adv.db", tmp / "adv.log") as srv, httpx.Client(base_url=srv.base, timeout=300) as c:
        before = _peak_mb(srv.pid)
        slugs = [
            e["slug"]
            for e in c.post("/api/uploads", files={"file": ("a.jsonl", adversarial_batch())}).json()[
                "episodes"
            ]
        ]
        worst, lacking = _every_scheme(c, [slugs[-1], slugs[0]])
        out[f"adversarial batch ({LONG:,}-token episode): peak RSS growth (MB, goal < 300)"] = round(
            _peak_mb(srv.pid) - before, 1
        )
        out["  slowest answer (s)"] = round(worst, 2)
        out["  schemes needing inputs it lacks (422)"] = ", ".join(lacking) or "none"
    return out


def _every_scheme(c: httpx.Client, slugs: list[str]) -> tuple[float, list[str]]:
    """(slowest answer in s, schemes answering 422) of every scheme on each of ``slugs``. A 422
    must be the one error shape naming the field at fault; any other answer but 200 / 413 fails."""
    from estimators import available

    worst, lacking = 0.0, []
    for scheme in ["outcome", *available()]:
        for slug in slugs:
            t0 = time.perf_counter()
            r = c.get(f"/api/episodes/{slug}/advantages", params={"scheme": scheme, "critic": "zero"})
            worst = max(worst, time.perf_counter() - t0)
            if r.status_code == 422:
                err = r.json()["error"]
                assert err["status"] == 422 and err["code"] and err["message"], r.text[:300]
                if scheme not in lacking:
                    lacking.append(scheme)
                continue
            assert r.status_code in (200, 413), r.text[:200]
    return worst, lacking
