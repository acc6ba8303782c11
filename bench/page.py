"""How fast the episode page opens a 32k-token episode in headless Chromium, against a real server.

Navigation to ``data-ready`` (the strip has its numbers and has drawn), measured after a warm-up
on a small episode so the browser's module cache and the server's compute path are warm — goal
< 2 s. Also the median of a few repeats. Needs ``/usr/bin/chromium`` and Playwright for Python; if
Chromium is missing the figures say so instead of failing the whole ``make bench``.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from bench._browser import chromium  # noqa: E402
from bench._server import server  # noqa: E402
from tests.browser import browser_data as data  # noqa: E402
from tests.browser.browser_util import upload  # noqa: E402

CHROMIUM, CHROMIUM_ARGS = chromium()

REPEATS = 5
LONG = 32_768  # tokens of the long episode
AGENT_CALLS, AGENT_TOKENS = 400, 120_000  # the agent episode
QUICK = {"REPEATS": 1, "LONG": 1024, "AGENT_CALLS": 10, "AGENT_TOKENS": 2000}
AGENT_QUERY = "?scheme=outcome,token_gae,turn_gae,uploaded&signal=logprob,entropy,kl,ratio"


def agent_episode(n_calls: int | None = None, n_tokens: int | None = None, seed: int = 0) -> dict:
    """A 120k-token agent episode of 400 calls (policy then tool output, in random shares) with
    the trainer's advantages and every signal (logprobs, ref/rollout log-probs, entropy)."""
    import random

    rng = random.Random(seed)
    n_calls = AGENT_CALLS if n_calls is None else n_calls
    n_tokens = AGENT_TOKENS if n_tokens is None else n_tokens
    per = n_tokens // n_calls
    kinds: list[str] = []
    for _ in range(n_calls):
        p = rng.randint(per // 4, per // 2)
        kinds += ["policy"] * p + ["tool"] * (per - p)
    n = len(kinds)
    words = [" the", " x", " =", " self", ".", "(", ")", "\n", " return", " if"]
    lp = [-round(rng.random() * 3, 3) for _ in range(n)]
    return {
        "tokens": [rng.choice(words) for _ in range(n)],
        "kinds": kinds,
        "reward": 1.0,
        "values": [round(rng.random(), 3) for _ in range(n)],
        "logprobs": lp,
        "ref_logprobs": [x + round(rng.gauss(0, 0.1), 3) for x in lp],
        "rollout_logprobs": [x + round(rng.gauss(0, 0.02), 3) for x in lp],
        "entropy": [round(rng.random() * 2, 3) for _ in range(n)],
        "advantages": [round(rng.gauss(0, 1), 3) if k == "policy" else 0.0 for k in kinds],
        "meta": {"task": "agent"},
    }


def run() -> dict:
    if not Path(CHROMIUM).exists():
        return {"skipped": f"{CHROMIUM} is not installed"}
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="creditlens-bench-page-"))
    stack = contextlib.ExitStack()
    srv = stack.enter_context(server(tmp, "bench"))
    out: dict = {}
    try:
        slug = upload(srv.base, "long", [data.long_episode(LONG)])["episodes"][0]["slug"]
        small = upload(srv.base, "warm-up", [data.handbuilt()])["episodes"][0]["slug"]
        agent = upload(srv.base, "agent", [agent_episode()])["episodes"][0]["slug"]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            times = []
            for _ in range(REPEATS):
                page.goto(f"{srv.base}/e/{small}")
                page.wait_for_selector('#strip[data-ready="1"]', timeout=30_000)
                t0 = time.perf_counter()
                page.goto(f"{srv.base}/e/{slug}")
                page.wait_for_selector('#strip[data-ready="1"]', timeout=60_000)
                times.append(time.perf_counter() - t0)
            # The 120k-token, 400-call agent episode with four advantage rows, four signal rows
            # and the overview (one column per call): navigation to data-ready, after a warm-up.
            agent_times: dict[str, list[float]] = {"": [], AGENT_QUERY: []}
            for _ in range(2):
                for q, ts in agent_times.items():
                    page.goto(f"{srv.base}/e/{small}")
                    page.wait_for_selector('#strip[data-ready="1"]', timeout=30_000)
                    t0 = time.perf_counter()
                    page.goto(f"{srv.base}/e/{agent}{q}")
                    page.wait_for_selector('#strip[data-ready="1"]', timeout=120_000)
                    ts.append(time.perf_counter() - t0)
            overview_ms = page.evaluate(
                "() => { const t = performance.now(); window.__overview.setData(window.__strip.data,"
                " window.__strip.rows, window.__strip); return performance.now() - t; }"
            )
            browser.close()
        out["episode_page_120k_400calls_default_s"] = round(min(agent_times[""]), 3)
        out["episode_page_120k_400calls_signals_s"] = round(min(agent_times[AGENT_QUERY]), 3)
        out["episode_overview_120k_setdata_ms"] = round(overview_ms, 1)
        out["episode_page_32k_first_s"] = round(times[0], 3)
        out["episode_page_32k_median_s"] = round(statistics.median(times), 3)
        out["goal_episode_page_32k_under_2s"] = times[0] < 2.0
    finally:
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    for k, v in run().items():
        print(f"{k:<40} {v}")
