"""Format detection and chat-message ingest speed (issue: every file a user already has opens).

* detection reads only the first record(s): ``app.ingest.detect`` on a ~100 MB chat-messages
  JSONL, on the same episodes as one JSON array, and on the first line alone (the times should
  be alike: nothing beyond the first record is parsed) — goal < 50 ms each;
* a ~100 MB chat-messages file (OpenAI ``messages`` with tool calls and tool results, the shape
  agent frameworks write) against the same episodes as native JSONL (parsed once by the service
  and written back as ``tokens``/``kinds``/``turn_ids``), each uploaded to a real server until
  stored and computable — goal chat ≤ 2× native.

``CREDITLENS_BENCH_FORMATS_MB`` sets the size (default 100).
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from live_server import Server  # noqa: E402

WORDS = [
    "the",
    "file",
    "edit",
    "read",
    "line",
    "error",
    "test",
    "passes",
    "def",
    "return",
    "x",
    "=",
    "1",
    "\n",
]


def _chat_episode(rng: random.Random, i: int) -> dict:
    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    msgs = [{"role": "system", "content": text(60)}, {"role": "user", "content": text(80)}]
    for t in range(6):
        call = {
            "id": f"c{t}",
            "type": "function",
            "function": {"name": "run", "arguments": json.dumps({"cmd": text(8)})},
        }
        msgs.append({"role": "assistant", "content": text(40), "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"c{t}", "content": text(120)})
    msgs.append({"role": "assistant", "content": text(30)})
    return {"messages": msgs, "reward": float(rng.random() < 0.4), "group": f"task{i // 8}"}


def _files(mb: float) -> tuple[bytes, bytes, bytes]:
    """(chat JSONL, the same as a JSON array, the same episodes as native JSONL)."""
    from app.ingest import parse_upload

    rng = random.Random(0)
    lines, size, i = [], 0, 0
    while size < mb * 1e6:
        line = json.dumps(_chat_episode(rng, i))
        lines.append(line)
        size += len(line) + 1
        i += 1
    chat = ("\n".join(lines) + "\n").encode()
    array = ("[" + ",\n".join(lines) + "]").encode()
    parsed = parse_upload(chat, "openai_chat")
    native = "".join(
        json.dumps(
            {
                "tokens": e.tokens,
                "kinds": e.kinds,
                "turn_ids": e.turn_ids,
                "reward": e.reward,
                "group": e.group,
                "meta": e.meta,
            }
        )
        + "\n"
        for e in parsed.episodes
    ).encode()
    return chat, array, native


def _detect_ms(data: bytes, repeat: int = 5) -> float:
    from app.ingest import detect

    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        detect(data)
        best = min(best, time.perf_counter() - t)
    return round(best * 1000, 2)


def _until_computable(c: httpx.Client, name: str, body: bytes) -> float:
    t0 = time.perf_counter()
    r = c.post("/api/uploads", files={"file": (name, body)})
    r.raise_for_status()
    slug = r.json()["episodes"][-1]["slug"]
    c.get(f"/api/episodes/{slug}/advantages", params={"critic": "zero"}).raise_for_status()
    return time.perf_counter() - t0


def run() -> dict:
    mb = float(os.environ.get("CREDITLENS_BENCH_FORMATS_MB", "100"))
    chat, array, native = _files(mb)
    out: dict = {
        "chat_mb": round(len(chat) / 1e6, 1),
        "native_mb": round(len(native) / 1e6, 1),
        "episodes": chat.count(b"\n"),
        "detect_chat_jsonl_ms": _detect_ms(chat),
        "detect_chat_json_array_ms": _detect_ms(array),
        "detect_first_line_only_ms": _detect_ms(chat[: chat.index(b"\n") + 1]),
    }
    del array
    tmp = Path(tempfile.mkdtemp(prefix="creditlens-bench-formats-"))
    with (
        Server(tmp / "bench.db", tmp / "server.log") as srv,
        httpx.Client(base_url=srv.base, timeout=1800) as c,
    ):
        t_native = _until_computable(c, "native.jsonl", native)
        t_chat = _until_computable(c, "chat.jsonl", chat)
    out["native_upload_seconds"] = round(t_native, 2)
    out["chat_upload_seconds"] = round(t_chat, 2)
    out["ratio_chat_over_native"] = round(t_chat / t_native, 2)
    out["load_average_1min"] = os.getloadavg()[0]
    out["goal_detect_under_50ms"] = max(out["detect_chat_jsonl_ms"], out["detect_chat_json_array_ms"]) < 50
    out["goal_chat_within_2x_native"] = out["ratio_chat_over_native"] <= 2
    return out


if __name__ == "__main__":
    for k, v in run().items():
        print(f"{k:<40} {v}")
