"""Ingest and compute speed of the service, against a real server process.

* upload 1,000 episodes of 2,000 tokens as JSONL (multipart, like the browser) until stored and
  computable (the last episode's advantages answer 200) — goal < 5 s;
* the same batch of token ids (kinds, ids, values, logprobs, reward, groups) as safetensors and as
  native JSONL (tokens written ⟨id⟩), each until stored and computable, and the ratio — goal
  safetensors ≥ 5× faster;
* the advantages API for one 32k-token episode (default schemes, critic from the upload) — p50 and
  p99 over repeated calls, goal p50 < 50 ms;
* the server's peak RSS (VmHWM from /proc/<pid>/status) after each phase.

The server is ``uvicorn app.main:create_app`` in a subprocess on a temp SQLite file on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent

from bench._server import server  # noqa: E402
from tests.live_server import cpu_seconds  # noqa: E402


def _episode(rng: random.Random, n: int, group: str, reward: float) -> dict:
    """A multi-turn episode of n tokens: prompt, then alternating policy calls and tool outputs."""
    kinds = ["prompt"] * 100
    while len(kinds) < n:
        kinds += ["policy"] * min(60, n - len(kinds))
        kinds += ["tool"] * min(140, n - len(kinds))
    kinds = kinds[:n]
    if kinds[-1] != "policy":
        kinds[-1] = "policy"
    words = [" the", " edit", " read", "(", ")", " x", " =", " 1", "\n", " def", " return"]
    return {
        "tokens": [rng.choice(words) for _ in range(n)],
        "kinds": kinds,
        "reward": reward,
        "values": [round(rng.random(), 4) for _ in range(n)],
        "logprobs": [round(-rng.random(), 4) for _ in range(n)],
        "group": group,
        "meta": {"task": group},
    }


def _id_batch(n_eps: int = 1000, n_tok: int = 2000) -> tuple[bytes, bytes]:
    """One batch of token ids as (safetensors, native JSONL): the same episodes, numbers and groups;
    JSONL has no ids, so its tokens are the ⟨id⟩ strings the service shows for them."""
    from safetensors.numpy import save

    rng = np.random.default_rng(0)
    kinds = np.zeros((n_eps, n_tok), dtype=np.uint8)
    kinds[:, 100:] = 1
    kinds[:, 700:900] = 2
    ids = rng.integers(0, 50_000, (n_eps, n_tok), dtype=np.int32)
    values = rng.random((n_eps, n_tok), dtype=np.float32)
    logprobs = -rng.random((n_eps, n_tok), dtype=np.float32)
    reward = (rng.random(n_eps) < 0.4).astype(np.float64)
    groups = np.arange(n_eps) // 8
    st = save(
        {
            "kinds": kinds,
            "token_ids": ids,
            "values": values,
            "logprobs": logprobs,
            "reward": reward,
            "groups": groups,
        }
    )
    names = np.array(["prompt", "policy", "tool"])
    lines = (
        json.dumps(
            {
                "tokens": [f"⟨{i}⟩" for i in ids[b].tolist()],
                "kinds": names[kinds[b]].tolist(),
                "reward": float(reward[b]),
                "values": values[b].tolist(),
                "logprobs": logprobs[b].tolist(),
                "group": str(groups[b]),
            }
        )
        for b in range(n_eps)
    )
    return st, ("\n".join(lines) + "\n").encode()


def _until_computable(c: httpx.Client, name: str, body: bytes) -> float:
    """Seconds to POST /api/uploads (multipart) until the last episode's advantages answer 200."""
    t0 = time.perf_counter()
    r = c.post("/api/uploads", files={"file": (name, body)})
    r.raise_for_status()
    c.get(f"/api/episodes/{r.json()['episodes'][-1]['slug']}/advantages").raise_for_status()
    return time.perf_counter() - t0


def _hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# Sizes: the batch (episodes x tokens), the long episode, the timed advantages calls.
EPISODES, TOKENS, LONG, CALLS = 1000, 2000, 32_768, 60
QUICK = {"EPISODES": 16, "TOKENS": 400, "LONG": 2048, "CALLS": 3}


def run() -> dict:
    rng = random.Random(0)
    tmp = Path(tempfile.mkdtemp(prefix="creditlens-bench-"))
    n_eps, n_tok = EPISODES, TOKENS
    body = "".join(
        json.dumps(_episode(rng, n_tok, f"task{i // 8}", float(rng.random() < 0.4))) + "\n"
        for i in range(n_eps)
    ).encode()
    big = (json.dumps(_episode(rng, LONG, "big", 1.0)) + "\n").encode()

    stack = contextlib.ExitStack()
    srv = stack.enter_context(server(tmp, "bench"))
    proc = srv.proc
    url = srv.base
    out: dict = {}
    try:
        with httpx.Client(base_url=url, timeout=300) as c:
            for _ in range(600):
                try:
                    if c.get("/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            out["server_rss_idle_mb"] = round(_hwm_mb(proc.pid), 1)

            cpu0 = cpu_seconds(proc.pid)
            t0 = time.perf_counter()
            r = c.post("/api/uploads", files={"file": ("bench.jsonl", body)})
            r.raise_for_status()
            last = r.json()["episodes"][-1]["slug"]
            a = c.get(f"/api/episodes/{last}/advantages")
            a.raise_for_status()
            out["upload_1000x2000_seconds"] = round(time.perf_counter() - t0, 3)
            out["upload_1000x2000_server_cpu_seconds"] = round(cpu_seconds(proc.pid) - cpu0, 2)
            out["upload_1000x2000_mb"] = round(len(body) / 1e6, 1)
            out["server_peak_rss_after_upload_mb"] = round(_hwm_mb(proc.pid), 1)

            st, ids_jsonl = _id_batch(n_eps, n_tok)
            t_st = _until_computable(c, "ids.safetensors", st)
            t_js = _until_computable(c, "ids.jsonl", ids_jsonl)
            out["ids_1000x2000_safetensors_seconds"] = round(t_st, 3)
            out["ids_1000x2000_jsonl_seconds"] = round(t_js, 3)
            out["ids_1000x2000_mb_safetensors_jsonl"] = f"{len(st) / 1e6:.1f} / {len(ids_jsonl) / 1e6:.1f}"
            out["ingest_ratio_jsonl_over_safetensors"] = round(t_js / t_st, 1)
            del st, ids_jsonl

            r = c.post("/api/uploads", files={"file": ("big.jsonl", big)})
            r.raise_for_status()
            slug = r.json()["episodes"][0]["slug"]
            times = []
            for _ in range(5):  # warm-up
                c.get(f"/api/episodes/{slug}/advantages").raise_for_status()
            cpu0 = cpu_seconds(proc.pid)
            for _ in range(CALLS):
                t = time.perf_counter()
                c.get(f"/api/episodes/{slug}/advantages").raise_for_status()
                times.append(time.perf_counter() - t)
            out["advantages_32k_server_cpu_ms_per_call"] = round(
                (cpu_seconds(proc.pid) - cpu0) / CALLS * 1000, 1
            )
            times.sort()
            out["advantages_32k_p50_ms"] = round(statistics.median(times) * 1000, 1)
            out["advantages_32k_p99_ms"] = round(times[int(0.99 * (len(times) - 1))] * 1000, 1)
            out["server_peak_rss_mb"] = round(_hwm_mb(proc.pid), 1)
    finally:
        stack.close()
    out["load_average_1min"] = os.getloadavg()[0]
    out["goal_upload_under_5s"] = out.get("upload_1000x2000_seconds", 1e9) < 5
    out["goal_p50_under_50ms"] = out.get("advantages_32k_p50_ms", 1e9) < 50
    out["goal_safetensors_5x_faster"] = out.get("ingest_ratio_jsonl_over_safetensors", 0) >= 5
    return out


if __name__ == "__main__":
    for k, v in run().items():
        print(f"{k:<40} {v}")
