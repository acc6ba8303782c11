"""Outcome schemes from [B] per-episode summaries: the same numbers as the registry estimator on
the padded [B, T_max] batch, and the batch summaries read once per batch state."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from app.compute.batch import summary_advantages
from app.core import domain
from estimators import EstimatorInput, available
from estimators import compute as registry_compute
from tests.app.svc_helpers import episode, upload


def _padded(rng: np.random.Generator, B: int, labels: list) -> tuple[EstimatorInput, np.ndarray, np.ndarray]:
    lengths = rng.integers(0, 40, size=B)
    T = int(lengths.max()) + 3
    rew = np.zeros((B, T))
    mask = np.zeros((B, T))
    for b, n in enumerate(lengths):
        start = int(rng.integers(0, 3))
        mask[b, start : start + n] = 1
        rew[b, : start + n] = rng.normal(size=start + n) * (rng.random() < 0.7)
    gids = domain.group_ids(labels)
    inp = EstimatorInput(
        rewards=torch.from_numpy(rew), mask=torch.from_numpy(mask), groups=torch.from_numpy(gids)
    )
    return inp, lengths, gids


@pytest.mark.parametrize("seed", range(6))
def test_every_outcome_scheme_from_summaries_equals_the_padded_estimator(seed):
    rng = np.random.default_rng(seed)
    B = int(rng.integers(2, 30))
    labels = [None if rng.random() < 0.2 else f"g{rng.integers(0, 4)}" for _ in range(B)]
    inp, lengths, gids = _padded(rng, B, labels)
    scores = inp.scores.numpy()
    # (a trainer's dialect reads the whole row, as its trainer sums it: not from summaries)
    outcome = [n for n, s in available().items() if s.kind == "outcome" and s.trainer is None]
    # no reference outcome scheme reads more than per-episode summaries (scores, groups, lengths)
    assert all(available()[n].from_summaries for n in outcome)
    for name in outcome:
        try:
            want = registry_compute(name, inp).advantages
        except ValueError:  # grpo_passk refuses groups of one; the service answers 422 for it
            continue
        got = summary_advantages(name, scores, gids, lengths)
        m = inp.mask.bool()
        rows = torch.from_numpy(got)[:, None].expand_as(want)
        assert torch.allclose(want[m], rows[m], rtol=1e-12, atol=1e-12), name
        assert bool((want[~m] == 0).all())


def test_outcome_answers_through_the_api_match_the_padded_estimator(client):
    # Episodes of different lengths in two groups: opo and REINFORCE++ weigh them by length.
    eps = [
        episode(reward=r, group=g, n_policy=n)
        for r, g, n in [(1.0, "a", 3), (0.0, "a", 7), (0.5, "a", 1), (1.0, "b", 12), (0.2, "b", 2)]
    ]
    body = upload(client, eps).json()
    for name in ("opo", "gpg", "reinforce_plus_plus_baseline", "rloo"):
        got = []
        for e in body["episodes"]:
            a = client.get(f"/api/episodes/{e['slug']}/advantages", params={"scheme": name}).json()
            vals = [
                v for v, k in zip(a["schemes"][0]["advantages"], a["kinds"], strict=True) if k == "policy"
            ]
            assert len(set(vals)) == 1
            got.append(vals[0])
        # The registry estimator on the padded [B, T_max] batch (2 prompt tokens, then policy;
        # the outcome reward on the last policy token).
        lengths, rewards = [3, 7, 1, 12, 2], [1.0, 0.0, 0.5, 1.0, 0.2]
        rew, mask = torch.zeros(5, 14, dtype=torch.float64), torch.zeros(5, 14, dtype=torch.float64)
        for b, (n, r) in enumerate(zip(lengths, rewards, strict=True)):
            mask[b, 2 : 2 + n] = 1
            rew[b, 1 + n] = r
        padded = EstimatorInput(rewards=rew, mask=mask, groups=torch.tensor([0, 0, 0, 1, 1]))
        want = registry_compute(name, padded).advantages
        assert got == pytest.approx([float(want[b, 2]) for b in range(5)], abs=1e-12), name


def test_beyond_the_work_budget_is_a_413_saying_what_to_reduce(db_url):
    from tests.app.svc_helpers import make_client

    # 5 tokens x (7 per scheme + 4) (app/compute/advantages.py ROW_NUMBERS): one scheme needs
    # 5 x 11 = 55 numbers, three need 5 x 25 = 125; the budget is 60.
    with make_client(db_url, max_compute_cells=60) as c:
        slug = upload(c, [episode(reward=1.0)]).json()["episodes"][0]["slug"]
        ok = c.get(f"/api/episodes/{slug}/advantages", params={"scheme": "outcome"})
        assert ok.status_code == 200
        r = c.get(f"/api/episodes/{slug}/advantages", params={"scheme": "outcome,returns,rloo"})
        assert r.status_code == 413
        err = r.json()["error"]
        assert err["code"] == "work_budget" and "CREDITLENS_MAX_COMPUTE_CELLS" in err["message"]
        assert "fewer schemes" in err["message"] and "125" in err["message"]


def test_diagnostics_are_stored_at_ingest_and_follow_deletes(client):
    from sqlalchemy import text

    body = upload(client, [episode(reward=float(i < 2), group="t") for i in range(4)]).json()
    bid, token = body["batch_id"], body["delete_token"]
    with client.app.state.engine.connect() as conn:
        n, stored = conn.execute(
            text("SELECT n_episodes, diagnostics_json FROM batch_stats WHERE batch_id = :b"), {"b": bid}
        ).one()
    api = client.get(f"/api/batches/{bid}").json()["diagnostics"]
    assert n == 4 and api["pass_rate"] == 0.5 and json.loads(stored)["pass_rate"] == 0.5
    # Delete a passing episode: the stored diagnostics describe the new state (1 of 3 passed).
    r = client.delete(f"/api/episodes/{body['episodes'][0]['slug']}", headers={"X-Delete-Token": token})
    assert r.status_code == 204
    with client.app.state.engine.connect() as conn:
        n = conn.execute(
            text("SELECT n_episodes FROM batch_stats WHERE batch_id = :b"), {"b": bid}
        ).scalar_one()
    assert n == 3
    assert client.get(f"/api/batches/{bid}").json()["diagnostics"]["pass_rate"] == pytest.approx(1 / 3)
    assert client.delete(f"/api/batches/{bid}", headers={"X-Delete-Token": token}).status_code == 204
    with client.app.state.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM batch_stats")).scalar_one() == 0


def test_histogram_of_overflowing_scores_never_fails_the_upload():
    from app.compute.diagnostics import histogram

    assert histogram(np.array([np.inf])) == {"edges": [], "counts": []}
    assert histogram(np.array([np.inf, 1.0, 1.0])) == {"edges": [1.0, 1.0], "counts": [2]}
    wide = histogram(np.array([-1.7e308, 1.7e308]))
    assert sum(wide["counts"]) == 2
