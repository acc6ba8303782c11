"""GET /api/runs/{id}/episodes: a run's kept episodes searched and sorted over fields stored at
ingest. The real app on a real SQLite file; the expected answers are computed here in plain Python
from the uploaded numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.app.svc_helpers import jsonl


def make_episode(rng, step: int, i: int) -> dict:
    n_p, n_r = 3, int(rng.integers(4, 9))
    n_tool = int(rng.integers(0, 3))
    kinds = ["prompt"] * n_p + ["policy"] * 2 + ["tool"] * n_tool + ["policy"] * (n_r - 2)
    n = len(kinds)
    adv = rng.normal(size=n).round(3)
    if i % 5:  # most episodes credit only generated tokens
        adv[[k for k, kind in enumerate(kinds) if kind != "policy"]] = 0.0
    return {
        "tokens": [f"t{k}" for k in range(n)],
        "kinds": kinds,
        "reward": float(rng.integers(0, 2)),
        "group": f"s{step}-g{i // 4}",
        "advantages": adv.tolist(),
        "logprobs": (-rng.exponential(size=n)).round(3).tolist(),
        "rollout_logprobs": (-rng.exponential(size=n)).round(3).tolist(),
        "entropy": rng.exponential(size=n).round(3).tolist(),
    }


def expected_fields(ep: dict, step: int) -> dict:
    pol = [k == "policy" for k in ep["kinds"]]
    a = [abs(x) for x in ep["advantages"]]
    d = [lp - r for lp, r, p in zip(ep["logprobs"], ep["rollout_logprobs"], pol, strict=True) if p]
    ent = [e for e, p in zip(ep["entropy"], pol, strict=True) if p]
    return {
        "step": step,
        "group": ep["group"],
        "reward": ep["reward"],
        "passed": ep["reward"] > 0,
        "n_tokens": len(ep["kinds"]),
        "n_tool_tokens": ep["kinds"].count("tool"),
        "max_abs_adv": max(x for x, p in zip(a, pol, strict=True) if p),
        "nonpolicy_abs_adv_share": sum(x for x, p in zip(a, pol, strict=True) if not p) / sum(a),
        "max_ratio": math.exp(max(d)),
        "mean_entropy": sum(ent) / len(ent),
    }


@pytest.fixture
def run(client):
    rng = np.random.default_rng(7)
    run = client.post("/api/runs", json={"name": "search"}).json()
    truth = {}
    for step in range(3):
        eps = [make_episode(rng, step, i) for i in range(12)]
        r = client.post(
            f"/api/runs/{run['id']}/steps/{step}", content=jsonl(eps), params={"format": "native"}
        )
        assert r.status_code == 201, r.text
        for created, ep in zip(r.json()["episodes"], eps, strict=True):
            truth[created["slug"]] = expected_fields(ep, step)
    return run, truth


def get(client, run, **params):
    r = client.get(f"/api/runs/{run['ref']}/episodes", params=params)
    assert r.status_code == 200, r.text
    return r.json(), int(r.headers["X-Total-Count"])


def test_fields_are_the_hand_computed_ones(client, run):
    run, truth = run
    rows, total = get(client, run, limit=500)
    assert total == len(rows) == 36
    for row in rows:
        want = truth[row["slug"]]
        for k, v in want.items():
            assert row[k] == (v if isinstance(v, str | bool) else pytest.approx(v, rel=1e-12)), k
        assert row["url"] == f"/e/{row['slug']}"
    # Default order: step, then upload order.
    assert [r["step"] for r in rows] == sorted(r["step"] for r in rows)


def test_sort_filter_and_page(client, run):
    run, truth = run
    rows, total = get(client, run, sort="-max_abs_adv", reward__gt="0", limit=5, offset=2)
    passing = sorted((v["max_abs_adv"] for v in truth.values() if v["reward"] > 0), reverse=True)
    assert total == len(passing)
    assert [r["max_abs_adv"] for r in rows] == pytest.approx(passing[2:7])
    rows, total = get(client, run, step="1", nonpolicy_abs_adv_share__gt="0", limit=500)
    want = {s for s, v in truth.items() if v["step"] == 1 and v["nonpolicy_abs_adv_share"] > 0}
    assert {r["slug"] for r in rows} == want and total == len(want) > 0
    rows, _ = get(client, run, group__contains="S2-G1", limit=500)  # case-insensitive
    assert {r["group"] for r in rows} == {"s2-g1"} and len(rows) == 4
    rows, _ = get(client, run, passed="false", n_tool_tokens__lt="1", sort="mean_entropy", limit=500)
    want = sorted(v["mean_entropy"] for v in truth.values() if not v["passed"] and v["n_tool_tokens"] < 1)
    assert [r["mean_entropy"] for r in rows] == pytest.approx(want)
    rows, _ = get(client, run, group__ne="s0-g0", limit=500)
    assert len(rows) == 32
    rows, total = get(client, run, findings__gt="-1", sort="-findings", limit=500)
    assert total == 36  # every episode was audited (advantages on all): a count, never NULL


@pytest.mark.parametrize(
    "params,field",
    [
        ({"colour": "red"}, "colour"),
        ({"reward__between": "1"}, "reward__between"),
        ({"group__gt": "a"}, "group__gt"),
        ({"passed__contains": "t"}, "passed__contains"),
        ({"reward__gt": "lots"}, "reward__gt"),
        ({"reward__gt": "nan"}, "reward__gt"),
        ({"step": "1.5"}, "step"),
        ({"passed": "maybe"}, "passed"),
        ({"sort": "-colour"}, "sort"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"offset": "-1"}, "offset"),
    ],
)
def test_bad_search_parameters_are_422s_naming_them(client, run, params, field):
    run, _ = run
    r = client.get(f"/api/runs/{run['ref']}/episodes", params=params)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["field"] == field and f"`{field}`" in err["message"]


def test_unknown_run_is_404(client):
    r = client.get("/api/runs/424242/episodes")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
