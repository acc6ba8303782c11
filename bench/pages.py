"""How fast every page opens cold, in headless Chromium against a real server: home, batch (1,024
episodes in 128 groups), group, episode (a sampled BugFix agent episode), run (200 steps) and a
lab figure (its result already cached by the server, so the figure is the page's own cost).

Each page is opened in ``COLD_BROWSERS`` fresh browsers (nothing cached: the HTML, the scripts, the
Plotly bundle, its compilation) and timed by the page's own clock until its ``page:open`` mark
(static/util.js ``markOpen``: one frame after the first screen is drawn); then ``WARM`` opens in
the last browser. Goal: every page opens cold in under 1 s, and makes no request that fails
(``failed_requests``: answers >= 400 and failed requests over all its opens).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent

from bench._browser import chromium, cold_and_warm  # noqa: E402
from bench._server import server  # noqa: E402
from tests.browser import browser_data as data  # noqa: E402

COLD_BROWSERS = 3
WARM = 3
BATCH_EPISODES = 1024
RUN_STEPS = 200
LAB_QUERY = ""  # the lab figure's default parameters

# `python -m bench --quick`: the same pages, small.
FRESH_BROWSERS = True  # each cold open in a fresh browser (quick: a fresh context of one)
QUICK = {
    "COLD_BROWSERS": 1,
    "WARM": 1,
    "BATCH_EPISODES": 32,
    "RUN_STEPS": 5,
    "LAB_QUERY": "?episodes=200",
    "FRESH_BROWSERS": False,
}


def _episode(i: int) -> dict:
    return {
        "tokens": ["p0", "p1", "a0", "a1", "a2"],
        "kinds": ["prompt", "prompt", "policy", "policy", "policy"],
        "reward": float(i % 3 == 0),
        "group": f"task-{i // 8:03d}",
    }


def _setup(c: httpx.Client) -> dict[str, str]:
    """The pages' paths, after uploading what they show."""
    batch = c.post(
        "/api/uploads",
        files={"file": ("big.jsonl", data.jsonl([_episode(i) for i in range(BATCH_EPISODES)]))},
    ).json()
    demo = c.post("/api/uploads", files={"file": ("bugfix.jsonl", data.jsonl(data.bugfix_batch()))}).json()
    run = c.post("/api/runs", json={"name": "bench pages", "config": {}}).json()
    for step in range(RUN_STEPS):
        eps = [dict(_episode(i), reward=float((i + step) % 3 == 0)) for i in range(16)]
        r = c.post(f"/api/runs/{run['id']}/steps/{step}", content=data.jsonl(eps))
        r.raise_for_status()
    c.get(f"/api/lab/lambda{LAB_QUERY}").raise_for_status()  # the server's lab cache holds it
    return {
        "home": "/",
        "batch": f"/b/{batch['batch_id']}",
        "group": f"/b/{batch['batch_id']}/g/task-000",
        "episode": f"/e/{demo['episodes'][0]['slug']}",
        "run": f"/r/{run['id']}",
        "lab": f"/lab/lambda{LAB_QUERY}",
    }


def run() -> dict:
    exe, _ = chromium()
    if not Path(exe).exists():
        return {"skipped": f"{exe} is not installed"}
    tmp = Path(tempfile.mkdtemp(prefix="creditlens-bench-pages-"))
    out: dict = {}
    try:
        with (
            server(tmp, "bench") as srv,
            httpx.Client(base_url=srv.base, timeout=300) as c,
        ):
            pages = _setup(c)
            figures = cold_and_warm(srv.base, pages, COLD_BROWSERS, WARM, fresh=FRESH_BROWSERS)
        for name, f in figures.items():
            out[f"{name}: cold open, median of {COLD_BROWSERS} fresh browsers (s)"] = f["cold_median"]
            out[f"{name}: cold open, slowest (s)"] = f["cold_max"]
            out[f"{name}: warm open, median (s)"] = f["warm_median"]
            out[f"{name}: failed requests"] = f["failed_requests"]
        out["load_average_1min"] = round(os.getloadavg()[0], 2)
        out["goal_every_page_cold_under_1s"] = all(f["cold_median"] < 1.0 for f in figures.values())
        out["goal_no_failed_request"] = all(f["failed_requests"] == 0 for f in figures.values())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    for k, v in run().items():
        print(f"{k:<60} {v}")
