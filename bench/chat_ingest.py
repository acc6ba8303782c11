"""Chat-trajectory uploads against native JSONL, against a real server process.

* a file of agent conversations as chat messages (tau-bench records: ``task_id``, ``trial``,
  ``reward``, ``traj`` with tool calls and tool results) of about 100 MB, uploaded until stored and
  computable (the last episode's advantages answer 200), and the same episodes as native JSONL
  (what the service made of them, read back through ``app.ingest.parse_upload``): the ratio —
  goal chat ≤ 2× native;
* format detection on the 100 MB file, as JSONL and as one JSON array: it reads the first record
  only (milliseconds, not the parse of the whole file);
* the structural reader (format ``transcript``, app/ingest/_structure.py: messages found by shape)
  on the same file against the dedicated tau_bench importer, parsing alone: goal ≤ 1.2×.

``CREDITLENS_BENCH_QUICK=1`` (or ``python -m bench chat_ingest --quick`` via the env) makes the file
10 MB. The server is ``uvicorn app.main:create_app`` on a temp SQLite file (tests/live_server.py),
with the upload limits raised for the native twin, which is larger than the chat file.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent

from tests.live_server import Server  # noqa: E402

WORDS = "the file test edit read line value error patch return call user order flight".split()


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _record(rng: random.Random, i: int) -> dict:
    """One tau-bench-shaped record (~10 KB): 3 tool calls, their results, user turns."""
    traj = [{"role": "system", "content": _text(rng, 60)}, {"role": "user", "content": _text(rng, 30)}]
    for k in range(3):
        args = json.dumps({"query": _text(rng, 6), "n": k})
        traj.append(
            {
                "role": "assistant",
                "content": _text(rng, 40),
                "tool_calls": [
                    {"id": f"c{k}", "type": "function", "function": {"name": "search", "arguments": args}}
                ],
            }
        )
        traj.append({"role": "tool", "tool_call_id": f"c{k}", "name": "search", "content": _text(rng, 260)})
        traj.append({"role": "user", "content": _text(rng, 20)})
    traj.append({"role": "assistant", "content": _text(rng, 60)})
    return {"task_id": i // 4, "trial": i % 4, "reward": float(rng.random() < 0.5), "info": {}, "traj": traj}


def _until_computable(c: httpx.Client, name: str, body: bytes) -> float:
    t0 = time.perf_counter()
    r = c.post("/api/uploads", files={"file": (name, body)})
    r.raise_for_status()
    c.get(
        f"/api/episodes/{r.json()['episodes'][-1]['slug']}/advantages", params={"critic": "zero"}
    ).raise_for_status()
    return time.perf_counter() - t0


def _parse_seconds(chat: bytes, iter_upload: Any, fmt: str) -> float:
    """Seconds to read every episode of ``chat`` as format ``fmt`` (parsing alone, no storage)."""
    t0 = time.perf_counter()
    n = sum(1 for _ in iter_upload(chat, fmt=fmt)[1])
    assert n == chat.count(b"\n")
    return time.perf_counter() - t0


def _structural_vs_dedicated(chat: bytes, iter_upload: Any, repeats: int = 2) -> dict:
    """The structural reader (format ``transcript``: messages found by shape) against the
    dedicated tau_bench importer on the same file, best of ``repeats`` each: goal ≤ 1.2×."""
    dedicated = min(_parse_seconds(chat, iter_upload, "tau_bench") for _ in range(repeats))
    structural = min(_parse_seconds(chat, iter_upload, "transcript") for _ in range(repeats))
    return {
        "parse_dedicated_seconds": round(dedicated, 2),
        "parse_structural_seconds": round(structural, 2),
        "ratio_structural_over_dedicated": round(structural / dedicated, 2),
    }


def run() -> dict:
    from app.ingest import detect, iter_upload, parse_upload

    quick = os.environ.get("CREDITLENS_BENCH_QUICK") == "1" or "--quick" in sys.argv
    target = (10 if quick else 100) * 1_000_000
    rng = random.Random(0)
    lines = []
    size = 0
    while size < target:
        line = json.dumps(_record(rng, len(lines))) + "\n"
        lines.append(line)
        size += len(line)
    chat = "".join(lines).encode()
    array = ("[" + ",".join(s.rstrip("\n") for s in lines) + "]").encode()
    del lines
    out: dict = {"chat_mb": round(len(chat) / 1e6, 1), "episodes": chat.count(b"\n")}

    # app.ingest imported every format module above: the figure is detection alone
    t0 = time.perf_counter()
    assert detect(chat) == "tau_bench"
    out["detect_jsonl_ms"] = round((time.perf_counter() - t0) * 1000, 2)
    t0 = time.perf_counter()
    assert detect(array) == "tau_bench"
    out["detect_json_array_ms"] = round((time.perf_counter() - t0) * 1000, 2)
    del array

    out.update(_structural_vs_dedicated(chat, iter_upload, repeats=1 if quick else 2))

    parsed = parse_upload(chat)
    native = "".join(ep.model_dump_json(exclude_none=True) + "\n" for ep in parsed.episodes).encode()
    del parsed
    out["native_mb"] = round(len(native) / 1e6, 1)

    tmp = Path(tempfile.mkdtemp(prefix="creditlens-bench-chat-"))
    env = {
        "CREDITLENS_MAX_UPLOAD_BYTES": str(4 * len(native)),
        "CREDITLENS_MAX_EPISODES_PER_UPLOAD": "100000",
    }
    with (
        Server(tmp / "bench.db", tmp / "server.log", **env) as srv,
        httpx.Client(base_url=srv.base, timeout=900) as c,
    ):
        _until_computable(c, "warm.jsonl", chat[: chat.index(b"\n", 200_000) + 1])  # imports, first compile
        t_native = _until_computable(c, "native.jsonl", native)
        t_chat = _until_computable(c, "chat.jsonl", chat)
    out["native_jsonl_seconds"] = round(t_native, 2)
    out["chat_jsonl_seconds"] = round(t_chat, 2)
    out["ratio_chat_over_native"] = round(t_chat / t_native, 2)
    return out


if __name__ == "__main__":
    print(run())
