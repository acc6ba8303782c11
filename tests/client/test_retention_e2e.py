"""Retention end to end: a real server process, the real client's ``log_tensors`` and GRPO
advantages from verl 0.9.1's ``compute_grpo_outcome_advantage``. A run with ``keep`` stores whole
groups, the flagged one first, while its metrics count every episode; ``keep_every`` thins older
steps; bad ``keep`` values are 422s naming the field."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from creditlens import Client
from tests.live_server import Server

torch = pytest.importorskip("torch")

G, N, P, R = 6, 8, 4, 12  # 6 prompts x 8 samples, 4 prompt and 12 response tokens


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("retention-e2e")
    with Server(tmp / "creditlens.db", tmp / "server.log") as srv:
        yield srv.base


def grpo_step(seed: int, bug_group: int | None = None) -> dict:
    """[B, T] tensors of one step; ``bug_group``'s advantages also sit on its prompt tokens."""
    from verl.trainer.ppo import core_algos

    rng = np.random.default_rng(seed)
    B, T = G * N, P + R
    ids = rng.integers(5, 1000, (B, T))
    for g in range(G):  # the same prompt for the group's 8 samples
        ids[g * N : (g + 1) * N, :P] = ids[g * N, :P]
    scores = (rng.random(B) < 0.5).astype(np.float32)
    rmask = torch.ones(B, R)
    rewards = torch.zeros(B, R)
    rewards[:, -1] = torch.from_numpy(scores)
    uid = np.array([f"u{b // N}" for b in range(B)], dtype=object)
    adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, rmask, uid)
    advantages = np.zeros((B, T), dtype=np.float32)
    advantages[:, P:] = adv.numpy()
    if bug_group is not None:
        rows = slice(bug_group * N, (bug_group + 1) * N)
        advantages[rows, :P] = advantages[rows, P : P + 1]  # the credit bug: the prompt is credited
    policy = np.zeros((B, T), dtype=bool)
    policy[:, P:] = True
    return {
        "token_ids": ids,
        "policy_mask": policy,
        "reward": scores,
        "advantages": advantages,
        "logprobs": -rng.exponential(0.5, (B, T)).astype(np.float32),
        "entropy": rng.exponential(1.0, (B, T)).astype(np.float32),
        "groups": [f"u{b // N}" for b in range(B)],
    }


def test_keep_stores_whole_groups_flagged_first_and_counts_every_episode(server):
    data = grpo_step(0, bug_group=4)
    with Client(server, strict=True) as c:
        run = c.run("keep-16", keep=16)
        run.log_tensors(0, **data)
        assert run.flush(timeout=60) and run.sent == 1
    got = httpx.get(f"{server}/api/runs/{run.id}").json()
    assert got["keep"] == 16 and got["stored_bytes"] > 0
    (s,) = got["steps"]
    assert (s["n_episodes_seen"], s["n_episodes_kept"], s["n_episodes"]) == (48, 16, 16)
    m = s["metrics"]
    # Every episode counts: the pass rate of all 48, the |A| of all 48 x 12 response tokens.
    assert m["pass_rate"] == pytest.approx(float(data["reward"].mean()))
    adv = data["advantages"].astype(np.float64)
    assert m["mean_abs_advantage"] == pytest.approx(float(np.abs(adv[:, P:]).mean()))
    # The bug group's prompt credit, over the whole step's |A|.
    off = np.abs(adv[4 * N : 5 * N, :P]).sum()
    assert m["nonpolicy_advantage_share"] == pytest.approx(float(off / np.abs(adv).sum()))
    batch = httpx.get(f"{server}/api/batches/{s['batch_id']}").json()
    groups = [e["group"] for e in batch["episodes"]]
    assert len(groups) == 16 and sorted(set(groups)) == sorted({"u4", *groups})
    assert all(groups.count(g) == N for g in set(groups))  # whole groups
    assert "u4" in groups  # the flagged group is kept
    # The kept episodes read back exactly (their advantages are the uploaded float32 values).
    ep = next(e for e in batch["episodes"] if e["group"] == "u4")
    full = httpx.get(f"{server}/api/episodes/{ep['slug']}").json()
    assert len(full["tokens"]) == P + R and full["advantages"][:P] == [full["advantages"][P]] * P


def test_keep_every_thins_older_steps_and_keeps_their_metrics(server):
    r = httpx.post(f"{server}/api/runs", json={"name": "thin", "keep": 8, "keep_every": 2})
    assert r.status_code == 201, r.text
    ref = r.json()["ref"]
    with Client(server, strict=True) as c:
        run = c.run("thin", resume=True)
        for step in range(4):
            run.log_tensors(step, **grpo_step(step + 1))
        assert run.flush(timeout=120) and run.sent == 4
    assert run.id == r.json()["id"]
    steps = httpx.get(f"{server}/api/runs/{ref}").json()["steps"]
    # Step 3 is the newest (kept); 1 was thinned when 2 came; 0 and 2 are multiples of 2.
    assert [(s["step"], s["n_episodes_seen"], s["n_episodes_kept"]) for s in steps] == [
        (0, 48, 8),
        (1, 48, 0),
        (2, 48, 8),
        (3, 48, 8),
    ]
    thinned = steps[1]
    assert thinned["stored_bytes"] == 0 and thinned["metrics"]["pass_rate"] is not None
    # Its batch still answers (no episodes) and its page opens.
    assert httpx.get(f"{server}/api/batches/{thinned['batch_id']}").status_code == 200
    page = httpx.get(f"{server}{thinned['url']}", headers={"accept": "text/html"})
    assert page.status_code == 200


@pytest.mark.parametrize("body", [{"keep": 0}, {"keep": -3}, {"keep": "all"}, {"keep_every": 0}])
def test_bad_keep_is_a_422_naming_the_field(server, body):
    r = httpx.post(f"{server}/api/runs", json={"name": "bad", **body})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["field"] == next(iter(body)) and next(iter(body)) in err["message"]


def test_creditlens_du_adds_up_the_runs(server, capsys):
    from app.cli import human_bytes, main

    # One run of its own (the module's other runs are there too when they ran first).
    assert httpx.post(f"{server}/api/runs", json={"name": "du"}).status_code == 201
    runs = httpx.get(f"{server}/api/runs").json()
    assert runs and all(r["stored_bytes"] >= 0 for r in runs)
    assert main(["du", "--server", server, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_ref = {r["ref"]: r for r in rows}
    for r in runs:
        full = httpx.get(f"{server}/api/runs/{r['ref']}").json()
        row = by_ref[r["ref"]]
        assert row["stored_bytes"] == r["stored_bytes"] == sum(s["stored_bytes"] for s in full["steps"])
        assert row["episodes_seen"] == sum(s["n_episodes_seen"] for s in full["steps"])
    assert main(["du", "--server", server, str(runs[0]["ref"])]) == 0
    out = capsys.readouterr().out
    assert human_bytes(runs[0]["stored_bytes"]) in out and "total of 1 run(s)" in out
    assert main(["du", "--server", server, "999999"]) == 1
    assert (human_bytes(999), human_bytes(1500), human_bytes(2_500_000)) == ("999 B", "1.5 kB", "2.5 MB")
