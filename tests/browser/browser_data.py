"""Episodes the browser tests upload (native format, one JSON object per line).

The hand-built row (docs/conventions.md): three calls of two, two and one tokens, tool spans of
three and two tokens, a cost of 0.1 on the last token of each call, an outcome of 1, and critic
values that are deliberately 9 at the tool positions.
"""

from __future__ import annotations

import json
import random

XSS_TOKENS = ["<script>alert(1)</script>", '"onmouseover=alert(1)', "<img src=x onerror=alert(1)>"]


def handbuilt() -> dict:
    """Positions: 0-1 call, 2-4 tool, 5-6 call, 7-8 tool, 9 call."""
    return {
        "tokens": ["read", "</call>", "def", " f", "():", "edit", "</call>", "ok", "\n", "submit"],
        "kinds": ["policy", "policy", "tool", "tool", "tool", "policy", "policy", "tool", "tool", "policy"],
        "rewards": [0.0, -0.1, 0.0, 0.0, 0.0, 0.0, -0.1, 0.0, 0.0, -0.1],
        "reward": 1.0,
        "values": [0.5, 0.4, 9.0, 9.0, 9.0, 0.6, 0.7, 9.0, 9.0, 0.8],
        "meta": {"task": "hand-built row", "source": "demo"},
    }


def bugfix_episode(rng: random.Random, task: str, group: str, success: bool, n_calls: int) -> dict:
    """A BugFix-shaped episode: prompt, calls separated by tool observations, outcome on the end."""
    tokens = ["<system>", " Fix", " the", " bug", " in", f" {task}", ".", "\n"]
    kinds = ["prompt"] * len(tokens)
    values = [0.0] * len(tokens)
    calls = []
    turn_values = []
    effects = ["read", "test", "decisive_edit" if success else "wrong_edit", "exploit", "submit"]
    for k in range(n_calls):
        effect = effects[k] if k < n_calls - 1 else "submit"
        op = {
            "read": "read",
            "test": "run_tests",
            "decisive_edit": "edit swap_minmax",
            "wrong_edit": "edit off_by_one",
            "exploit": "edit hardcode_tests",
            "submit": "submit",
        }[effect]
        call = ["<call>", *[f" {w}" for w in op.split()], " </call>"]
        v = round(0.2 + 0.5 * rng.random(), 3)
        turn_values.append(v)
        tokens += call
        kinds += ["policy"] * len(call)
        values += [round(v + 0.02 * rng.random(), 3) for _ in call]
        calls.append({"turn": k, "action": op, "effect": effect})
        if k < n_calls - 1:
            obs = ["<tool>", *[f" line{j}" for j in range(rng.randint(3, 9))], "\n", "</tool>"]
            tokens += obs
            kinds += ["tool"] * len(obs)
            values += [round(5 * rng.random(), 3) for _ in obs]
    return {
        "tokens": tokens,
        "kinds": kinds,
        "reward": 1.0 if success else 0.0,
        "values": values,
        "group": group,
        "meta": {"task": task, "calls": calls, "turn_values": turn_values, "source": "demo"},
    }


def bugfix_batch(seed: int = 0) -> list[dict]:
    """4 tasks x 8 attempts: one never solved (zero variance), one solved once, two mixed."""
    rng = random.Random(seed)
    plan = {"limit": 0, "parse_date": 1, "merge_lists": 4, "clamp": 6}
    eps = []
    for task, n_success in plan.items():
        for a in range(8):
            eps.append(bugfix_episode(rng, task, task, a < n_success, n_calls=rng.randint(3, 5)))
    return eps


def xss_episode() -> dict:
    tokens = ["<|user|>", " hi", *XSS_TOKENS, " done"]
    return {
        "tokens": tokens,
        "kinds": ["prompt", "prompt", "policy", "policy", "tool", "policy"],
        "reward": 1.0,
        "values": [0.0, 0.0, 0.2, 0.3, 0.0, 0.4],
        "meta": {"task": "<b>bold</b><script>alert(2)</script>", "source": "demo"},
    }


def long_episode(n_tokens: int = 32_768, seed: int = 0) -> dict:
    """A 32k-token episode: policy runs of 40-200 tokens separated by tool spans of 20-400."""
    rng = random.Random(seed)
    kinds: list[str] = ["prompt"] * 64
    while len(kinds) < n_tokens:
        kinds += ["policy"] * rng.randint(40, 200)
        kinds += ["tool"] * rng.randint(20, 400)
    kinds = kinds[:n_tokens]
    kinds[-1] = "policy"
    words = [" the", " x", " =", " self", ".", "(", ")", "\n", " return", " if", " for", " in", "_id", " 0"]
    tokens = [rng.choice(words) for _ in range(n_tokens)]
    values = [round(rng.random(), 3) for _ in range(n_tokens)]
    return {"tokens": tokens, "kinds": kinds, "reward": 1.0, "values": values, "meta": {"task": "long"}}


def jsonl(episodes: list[dict]) -> str:
    return "".join(json.dumps(e) + "\n" for e in episodes)


def post_run(server: str, name: str, steps: dict[int, list[dict]], **body) -> dict:
    """A run created and logged step by step through the real API: the run's answer plus
    ``batches`` (step -> batch id). ``body``: more fields of the run (e.g. visibility)."""
    import httpx

    r = httpx.post(f"{server}/api/runs", json={"name": name, "config": {"lr": 1e-6}, **body})
    assert r.status_code == 201, r.text
    run = {**r.json(), "batches": {}}
    with httpx.Client(base_url=server, timeout=60) as http:
        for step, episodes in steps.items():
            s = http.post(
                f"/api/runs/{run['ref']}/steps/{step}", content=jsonl(episodes), params={"format": "native"}
            )
            assert s.status_code == 201, s.text
            run["batches"][step] = s.json()["batch_id"]
    return run
