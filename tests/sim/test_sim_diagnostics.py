"""sim_diagnostics on a hand-built batch, numbers computed by hand in the comments."""

import pytest

from app.core import domain
from app.core.arrays import arrays_from_native
from app.core.schemas import EpisodeIn
from app.sim.diagnostics import sim_diagnostics


def oracle_turn_advantages(ep: EpisodeIn) -> list[float]:
    a = arrays_from_native(ep)
    tv = a.meta["turn_values"]
    kw = {"truncated": a.truncated, "bootstrap_value": a.bootstrap_value}
    return domain.oracle_turn_advantages(a.turn_ids, a.policy, a.rewards, tv, **kw).tolist()


def _ep(group, reward, calls, turn_values=None):
    tokens, kinds, meta_calls = ["<task>", "fix", "</task>"], ["prompt"] * 3, []
    for k, (action, effect) in enumerate(calls):
        toks = ["<call>", *action.split(), "</call>"]
        tokens += toks
        kinds += ["policy"] * len(toks)
        meta_calls.append({"turn": k, "action": action, "effect": effect})
        if action != "submit":
            tokens += ["<obs>", "ok", "</obs>"]
            kinds += ["tool"] * 3
    meta = {"task": group, "calls": meta_calls}
    if turn_values is not None:
        meta["turn_values"] = turn_values
    return EpisodeIn(tokens=tokens, kinds=kinds, reward=reward, group=group, meta=meta)


def test_hand_built_batch():
    win = [("read", "read"), ("edit swap_minmax", "decisive_edit"), ("submit", "submit")]
    lose = [("edit off_by_one", "wrong_edit"), ("submit", "submit")]
    eps = [
        _ep("a", 1.0, win, turn_values=[0.5, 0.5, 1.0]),
        _ep("a", 0.0, lose, turn_values=[0.5, 0.2]),
        _ep("b", 0.0, lose),
        _ep("b", 0.0, lose),
    ]
    d = sim_diagnostics(eps)
    # Group b (2 of 4 episodes) is all-fail.
    assert d["zero_variance_share"] == 0.5
    assert d["zero_variance_groups"] == [{"group": "b", "n": 2, "all": "fail"}]
    assert d["pass_rate"] == 0.25
    # RLOO in group a: success 1 - 0 = +1, failure 0 - 1 = -1. The success's calls have 3 (read),
    # 4 (edit) and 3 (submit) policy tokens: positive credit 3 + 4 + 3 = 10, useless 3 -> 0.3.
    assert d["useless_credit_share"] == pytest.approx(0.3)
    cbe = d["credit_by_effect"]
    # The batch diagnostics' shape (app/core/metrics.py credit_by_effect): edit 4 of the 10.
    assert cbe["decisive_edit"]["share"] == pytest.approx(0.4)
    assert cbe["decisive_edit"]["credit"] == 4.0 and cbe["decisive_edit"]["tokens"] == 4
    # wrong_edit: -1 in group a, 0 and 0 in group b -> mean -1/3.
    assert cbe["wrong_edit"]["calls"] == 3 and cbe["wrong_edit"]["credit"] == 0.0
    assert cbe["wrong_edit"]["mean_outcome_advantage"] == pytest.approx(-1 / 3)
    # Oracle: success turns 0 + 0.5 - 0.5 = 0 (read), 0 + 1 - 0.5 = 0.5 (edit), 1 + 0 - 1 = 0 (submit).
    assert oracle_turn_advantages(eps[0]) == pytest.approx([0.0, 0.5, 0.0])
    assert cbe["decisive_edit"]["mean_oracle_advantage"] == pytest.approx(0.5)
    # The failure: 0 + 0.2 - 0.5 = -0.3 (wrong edit), 0 + 0 - 0.2 = -0.2 (submit).
    assert oracle_turn_advantages(eps[1]) == pytest.approx([-0.3, -0.2])
    assert cbe["wrong_edit"]["mean_oracle_advantage"] == pytest.approx(-0.3)  # only episode 1 has values


def test_truncated_episode_bootstraps_in_the_oracle():
    ep = _ep("a", 0.0, [("read", "read")], turn_values=[0.4]).model_copy(
        update={"truncated": True, "bootstrap_value": 0.7}
    )
    assert oracle_turn_advantages(ep) == pytest.approx([0.3])


def test_episodes_without_calls_get_no_credit_breakdown():
    ep = EpisodeIn(tokens=["a", "b"], kinds=["prompt", "policy"], reward=1.0)
    d = sim_diagnostics([ep, ep])
    assert d["useless_credit_share"] is None and d["credit_by_effect"] is None
    # No group labels: each episode is its own group of one, which is not a zero-variance group.
    assert d["zero_variance_share"] == 0.0 and d["n_groups"] == 2
