"""A whole run at real size with ``keep=64``: ingest time per step, stored size extrapolated to
1,000 steps, and the run's pages (run, prompt history, episode search, comparison).

1. **Real steps.** A real server on SQLite and the real client: a run created with ``keep=64``,
   then ``STEPS`` steps of 512 episodes × 8,192 tokens (1,024 prompt tokens, 7,168 response
   tokens with two tool spans; groups of 8; 64 prompts a step from a pool of 256) carrying every
   signal a verl step has as float32 tensors with full mantissas (the hardest case for the packing):
   token ids, rewards, values, logprobs, ref and rollout logprobs, entropy, advantages. Each step is
   built in the safetensors wire format by the client (``creditlens._batch``) and posted with
   ``Run.send``; the time is the server's answer time (parse, validate, metrics, audit, search
   fields, prompt history, retention, packing, write). Sizes: the SQLite file after the steps
   (its growth per step, extrapolated to 1,000), and the kept arrays' stored bytes against their
   raw float32/int32 bytes.
2. **A 1,000-step run.** The real steps' rows of the read side (step batches with their metrics,
   the kept episodes' search rows, prompt history) repeated to 1,000 steps with SQL (the episodes'
   arrays are not copied: no page reads them). Timed over HTTP, median of 5 after one warm-up: the
   run page and its API answer, the search (sorted by an indexed field and by one without an index,
   with filters), the prompt list, one prompt's page and answer, and the comparison of the two runs.

Goals (issue "A real run, whole"): ≤ 25 GB for 1,000 steps, ≤ 5 s per step, pages < 1 s, the
search < 100 ms. ``python -m bench --quick`` (and ``python -m bench.retention --quick``) runs
3 small steps repeated to 30 (a smoke run: its figures are no measurement).
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "client"))

from tests.live_server import Server  # noqa: E402

STEPS = 20  # real steps
B = 512  # episodes per step
P = 1024  # prompt tokens
R = 7168  # response tokens
KEEP = 64
TARGET_STEPS = 1_000
GROUP = 8
POOL = 256  # distinct prompts the run draws from
REPEATS = 5
QUICK = {"STEPS": 3, "B": 64, "P": 128, "R": 896, "KEEP": 16, "TARGET_STEPS": 30, "REPEATS": 1}


def _step(rng: np.random.Generator, step: int, B: int, P: int, R: int) -> dict:
    """One step's [B, T] tensors (see the module docstring)."""
    T = P + R
    prompts = rng.integers(0, POOL, B // GROUP)
    ids = rng.integers(0, 151_000, (B, T), dtype=np.int32)
    for g, p in enumerate(prompts):  # the group's prompt: the same tokens every time it is drawn
        ids[g * GROUP : (g + 1) * GROUP, :P] = np.random.default_rng(int(p)).integers(0, 151_000, P)
    kinds = np.zeros((B, T), dtype=np.uint8)
    kinds[:, P:] = 1
    kinds[:, P + R // 3 : P + R // 3 + 256] = 2  # two tool observations
    kinds[:, P + 2 * R // 3 : P + 2 * R // 3 + 256] = 2
    reward = (rng.random(B) < 0.4 + 0.2 * np.sin(step)).astype(np.float32)
    rewards = np.zeros((B, T), dtype=np.float32)
    rewards[:, -1] = reward
    logp = -rng.exponential(0.6, (B, T)).astype(np.float32)
    adv = rng.normal(0, 1, (B, T)).astype(np.float32)
    adv[kinds != 1] = 0.0
    return {
        "token_ids": ids,
        "kinds": kinds,
        "reward": reward,
        "rewards": rewards,
        "values": rng.normal(0, 1, (B, T)).astype(np.float32),
        "logprobs": logp,
        "ref_logprobs": logp + rng.normal(0, 0.02, (B, T)).astype(np.float32),
        "rollout_logprobs": logp + rng.normal(0, 0.01, (B, T)).astype(np.float32),
        "entropy": rng.exponential(1.0, (B, T)).astype(np.float32),
        "advantages": adv,
        "groups": np.repeat(np.arange(B // GROUP), GROUP) + step * 1000,
    }


def _median_s(http: httpx.Client, url: str, **kw) -> float:
    assert http.get(url, **kw).status_code == 200, url  # warm-up
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        r = http.get(url, **kw)
        times.append(time.perf_counter() - t0)
        assert r.status_code == 200, (url, r.text[:300])
    return statistics.median(times)


def _repeat_to(db: Path, run_id: int, steps: int, target: int) -> int:
    """A second run: the real run's read-side rows repeated to ``target`` steps; returns its id."""
    con = sqlite3.connect(db)
    try:
        cur = con.cursor()
        cur.execute(
            "INSERT INTO run (name, config_json, created_at, visibility, slug, keep) "
            "SELECT name || ' x1000', config_json, created_at, 'public', slug || 'x', keep FROM run WHERE id = ?",
            (run_id,),
        )
        new = cur.lastrowid
        real = cur.execute("SELECT id, step FROM batch WHERE run_id = ? ORDER BY step", (run_id,)).fetchall()
        next_ep = 10**9
        for k in range(target):
            src_batch, src_step = real[k % steps]
            cur.execute(
                "INSERT INTO batch (name, source, created_at, n_episodes, meta_json, run_id, step, metrics_json, "
                "visibility, slug, n_episodes_seen, stored_bytes) SELECT name, source, created_at, n_episodes, "
                "meta_json, ?, ?, metrics_json, 'public', NULL, n_episodes_seen, stored_bytes FROM batch WHERE id = ?",
                (new, k, src_batch),
            )
            bid = cur.lastrowid
            cur.execute(
                'INSERT INTO episode_search SELECT episode_id + ?, ?, ?, position, ?, slug || ?, "group", reward, '
                "passed, n_tokens, n_tool_tokens, max_abs_adv, nonpolicy_abs_adv_share, max_ratio, mean_entropy, "
                "n_findings, finding_codes FROM episode_search WHERE batch_id = ?",
                (next_ep, new, k, bid, f"-{k}", src_batch),
            )
            next_ep += 10**6
            cur.execute(
                "INSERT INTO prompt_step SELECT ?, key, ?, ?, n, n_passed, sum_abs_adv, n_adv_tokens, n_kept, "
                '"group" FROM prompt_step WHERE batch_id = ?',
                (new, k, bid, src_batch),
            )
        cur.execute(
            "INSERT INTO run_prompt SELECT ?, key, prompt, n_tokens, first_step FROM run_prompt WHERE run_id = ?",
            (new, run_id),
        )
        con.commit()
        return int(new)
    finally:
        con.close()


def run() -> dict:
    from creditlens import Client, _batch

    steps, keep = STEPS, KEEP
    cfg = {"steps": steps, "B": B, "P": P, "R": R, "keep": keep}
    tmp = Path(tempfile.mkdtemp(prefix="creditlens-bench-retention-"))
    db = tmp / "bench.db"
    out: dict = {"steps_x_episodes_x_tokens": f"{steps} x {B} x {P + R}", "keep": keep}
    rng = np.random.default_rng(0)
    with Server(db, tmp / "server.log") as srv, httpx.Client(base_url=srv.base, timeout=600) as http:
        with Client(srv.base, strict=True, timeout=httpx.Timeout(600, connect=10)) as client:
            r = client.run("bench-keep", config=cfg, keep=keep)
            times, sizes = [], []
            for step in range(steps):
                body = _batch.build(_batch.snapshot(**_step(rng, step, B, P, R)))
                t0 = time.perf_counter()
                answer = r.send(step, body, "safetensors")
                times.append(time.perf_counter() - t0)
                assert answer is not None and answer.status_code == 201, answer and answer.text[:300]
                assert answer.json()["n_episodes_kept"] <= keep
                sizes.append(db.stat().st_size + _wal(db))
            run_id = r.id
        got = http.get(f"/api/runs/{run_id}").json()
        kept_tokens = sum(s["n_episodes_kept"] for s in got["steps"]) * (P + R)
        raw = kept_tokens * (4 + 4 * 8 + 1)  # int32 ids; 8 float32 signals; uint8 kinds
        arrays = got["stored_bytes"]
        per_step = (sizes[-1] - sizes[0]) / max(steps - 1, 1) if steps > 1 else sizes[0]
        out["ingest_per_step_median_s"] = round(statistics.median(times), 2)
        out["ingest_per_step_max_s"] = round(max(times), 2)
        out["stored_bytes_per_step_MB"] = round(arrays / steps / 1e6, 1)
        out["stored_vs_raw_float32_int32"] = round(arrays / raw, 3)
        out["sqlite_file_after_steps_GB"] = round(sizes[-1] / 1e9, 3)
        out["sqlite_file_per_step_MB"] = round(per_step / 1e6, 1)
        out["extrapolated_1000_steps_GB"] = round((sizes[0] + per_step * (TARGET_STEPS - 1)) / 1e9, 1)
        out["goal_1000_steps_under_25GB"] = out["extrapolated_1000_steps_GB"] <= 25
        out["goal_ingest_under_5s_per_step"] = out["ingest_per_step_median_s"] <= 5
        big = _repeat_to(db, run_id, steps, TARGET_STEPS)
        key = http.get(f"/api/runs/{big}/prompts", params={"limit": 1}).json()[0]["key"]
        html = {"accept": "text/html"}
        figures = {
            "run_page_html_plus_api_s": _median_s(http, f"/r/{big}", headers=html)
            + _median_s(http, f"/api/runs/{big}"),
            "search_sorted_indexed_s": _median_s(
                http, f"/api/runs/{big}/episodes", params={"sort": "-max_abs_adv", "reward__gt": "0"}
            ),
            "search_sorted_unindexed_filtered_s": _median_s(
                http,
                f"/api/runs/{big}/episodes",
                params={"sort": "-max_ratio", "mean_entropy__gt": "0.9", "n_tool_tokens__gt": "0"},
            ),
            "search_deep_page_s": _median_s(
                http,
                f"/api/runs/{big}/episodes",
                params={"sort": "step", "offset": str(TARGET_STEPS * keep * 15 // 16)},
            ),
            "prompts_first_page_s": _median_s(http, f"/api/runs/{big}/prompts"),
            "prompt_page_html_plus_api_s": _median_s(http, f"/r/{big}/prompts/{key}", headers=html)
            + _median_s(http, f"/api/runs/{big}/prompts/{key}"),
            "compare_page_html_plus_api_s": _median_s(
                http, "/r/compare", params={"runs": f"{run_id},{big}"}, headers=html
            )
            + _median_s(http, "/api/runs/compare", params={"runs": f"{run_id},{big}"}),
        }
        n = http.get(f"/api/runs/{big}/episodes", params={"limit": 1}).headers["X-Total-Count"]
        out[f"run_{TARGET_STEPS}_steps_kept_episodes_searched"] = int(n)
        for k, v in figures.items():
            out[f"{TARGET_STEPS}_steps_{k}"] = round(v, 4)
        out["goal_search_under_100ms"] = max(v for k, v in figures.items() if k.startswith("search")) < 0.1
        out["goal_pages_under_1s"] = max(figures.values()) < 1.0
    import os
    import shutil

    if os.environ.get("CREDITLENS_BENCH_KEEP"):  # to look at the database afterwards
        out["database"] = str(db)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _wal(db: Path) -> int:
    wal = db.with_name(db.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


if __name__ == "__main__":
    if "--quick" in sys.argv:
        globals().update(QUICK)
    for k, v in run().items():
        print(f"{k:<55} {v}")
