"""The ``openrlhf:*`` dialects against OpenRLHF 0.11.2's own code: ``RemoteExperienceMaker.
compute_advantages_and_returns`` (``openrlhf/trainer/ppo_utils/experience_maker.py``, the installed
file) run on ``Experience`` objects built from our batches, with tool spans, an all-equal group,
truncated rows and rewards on tool tokens; plus hand-computed cases.

OpenRLHF writes the shaped reward into its KL tensor, float32 in the trainer, and whitens with
float32 statistics: returns and raw GAE are compared to 1e-12 (float64 values), whitened
advantages to float32 precision."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch

from estimators import EstimatorInput, available, compute
from tests.estimators.trainer_refs import (
    F64,
    agent_rows,
    close,
    close_f32,
    openrlhf_experience,
    openrlhf_experience_maker,
    truncated_last_value,
)


def openrlhf(
    estimator: str,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    values: torch.Tensor,
    n: int,
    gamma: float = 1.0,
    lam: float = 1.0,
    no_std_norm: bool = False,
    kl_dtype: torch.dtype = torch.float32,
    rows_per_experience: int = 2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) [B, T] from OpenRLHF 0.11.2's ``compute_advantages_and_returns``: each
    sample's reward is its row's total (what its agent loop adds up), KL coefficient 0."""
    mod = openrlhf_experience_maker()
    Experience = openrlhf_experience().Experience
    args = NS(
        algo=NS(advantage=NS(estimator=estimator, gamma=gamma, lambd=lam, no_std_norm=no_std_norm)),
        rollout=NS(n_samples_per_prompt=n),
        reward=NS(clip_range=(-10, 10), overlong_buffer_len=None, stop_properly_penalty_coef=None),
    )
    maker = mod.RemoteExperienceMaker.__new__(mod.RemoteExperienceMaker)
    maker.strategy, maker.args, maker.advantage_estimator = NS(args=args), args, estimator
    maker.kl_ctl = NS(value=0.0)
    B, T = mask.shape
    exps = []
    for s in range(0, B, rows_per_experience):
        rows = slice(s, s + rows_per_experience)
        exps.append(
            Experience(
                action_mask=mask[rows].bool(),
                values=values[rows].clone(),
                rewards=rewards[rows].sum(-1),
                kl=torch.zeros(mask[rows].shape, dtype=kl_dtype),
                index=list(range(B))[rows],
                info={},
            )
        )
    exps = maker.compute_advantages_and_returns(exps)
    return torch.cat([e.advantages for e in exps]), torch.cat([e.returns for e in exps])


def _inp(rewards, values, mask, groups, gamma=1.0, lam=1.0):
    return EstimatorInput(
        rewards=rewards,
        mask=mask,
        values=values,
        groups=groups,
        gamma=gamma,
        lam=lam,
        last_value=truncated_last_value(mask.shape[0]),
    )


def test_the_seven_names_are_registered_with_trainer_and_version():
    names = {n for n, s in available().items() if s.trainer == "openrlhf"}
    assert names == {
        f"openrlhf:{x}"
        for x in (
            "gae",
            "group_norm",
            "rloo",
            "reinforce_baseline",
            "dr_grpo",
            "reinforce",
            "flash_reinforce",
        )
    }
    assert {available()[n].version for n in names} == {"0.11.2"}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (1.0, 0.0)])
@pytest.mark.parametrize("no_std_norm", [False, True])
def test_gae_against_openrlhf(seed, gamma, lam, no_std_norm):
    rewards, values, mask, groups = agent_rows(seed=seed)
    adv, ret = openrlhf("gae", rewards, mask, values, 4, gamma, lam, no_std_norm)
    ours = compute("openrlhf:gae", _inp(rewards, values, mask, groups, gamma, lam), no_std_norm=no_std_norm)
    close(ours.value_targets, ret, mask)  # returns = raw GAE + V: float64 all the way
    close_f32(ours.advantages, adv, mask)  # whitened with float32 statistics
    assert ours.advantages[mask == 0].abs().max().item() == 0.0


@pytest.mark.parametrize(
    "estimator", ["rloo", "reinforce_baseline", "group_norm", "dr_grpo", "flash_reinforce"]
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outcome_estimators_against_openrlhf(estimator, seed):
    rewards, values, mask, groups = agent_rows(seed=seed)
    adv, ret = openrlhf(estimator, rewards, mask, values, 4)
    ours = compute(f"openrlhf:{estimator}", _inp(rewards, values, mask, groups))
    # The shaped reward runs through the same reductions and the same float32 cast: equal.
    close(ours.value_targets, ret, mask)
    if estimator == "reinforce_baseline":
        close_f32(ours.advantages, adv, mask)
    else:
        close(ours.advantages, adv, mask)
    # A reward on a tool token counts: it is part of the sample's reward.
    eq = groups == 1  # the all-equal group (0.75 each): exactly 0 in both
    if estimator not in ("flash_reinforce", "reinforce_baseline"):  # (whitening moves it)
        assert adv[eq].abs().max().item() == 0.0 and ours.advantages[eq].abs().max().item() == 0.0


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_against_openrlhf(gamma):
    rewards, values, mask, groups = agent_rows(seed=3)
    adv, ret = openrlhf("reinforce", rewards, mask, values, 4, gamma=gamma)
    ours = compute("openrlhf:reinforce", _inp(rewards, values, mask, groups, gamma=gamma))
    # OpenRLHF discounts by repeated float32 multiplication: float32 precision.
    close_f32(ours.value_targets, ret, mask)
    close_f32(ours.advantages, adv, mask)


def test_float32_batches_against_openrlhf():
    rewards, values, mask, groups = agent_rows(seed=4, dtype=torch.float32)
    for est in ("gae", "group_norm", "rloo"):
        adv, ret = openrlhf(est, rewards, mask, values, 4, 0.99, 0.95)
        ours = compute(f"openrlhf:{est}", _inp(rewards, values, mask, groups, 0.99, 0.95))
        assert ours.advantages.dtype == torch.float32
        close_f32(ours.advantages, adv, mask)


def test_interleaved_groups_match_openrlhf_on_the_reordered_batch():
    """OpenRLHF assumes contiguous groups; our groups may interleave: the dialect gives each row
    what OpenRLHF gives it once the batch is put in group order."""
    rewards, values, mask, groups = agent_rows(seed=5)
    perm = torch.randperm(len(groups), generator=torch.Generator().manual_seed(0))
    adv, _ = openrlhf("group_norm", rewards, mask, values, 4)
    ours = compute("openrlhf:group_norm", _inp(rewards[perm], values[perm], mask[perm], groups[perm]))
    close(ours.advantages, adv[perm], mask[perm], atol=1e-6)  # float32 cast of float64 statistics


def test_a_group_of_one_is_refused_as_openrlhf_does():
    rewards, values, mask, groups = agent_rows(seed=0)
    groups = groups.clone()
    groups[0] = 99
    for est in ("rloo", "group_norm", "reinforce_baseline", "dr_grpo"):
        with pytest.raises(ValueError, match="n_samples_per_prompt > 1"):
            compute(f"openrlhf:{est}", _inp(rewards, values, mask, groups))


def _span_row(lam: float):
    """[A, tool, tool, tool, B]: V(A) = 0.304, V(B) = 0.5, V = 9 on the tool tokens (OpenRLHF zeroes
    them), the outcome 1 on B."""
    mask = torch.tensor([[1, 0, 0, 0, 1]])
    values = torch.tensor([[0.304, 9.0, 9.0, 9.0, 0.5]], dtype=F64)
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]], dtype=F64)
    return EstimatorInput(rewards=rewards, mask=mask, values=values, gamma=1.0, lam=lam)


def test_gae_steps_through_tool_tokens_hand_computed():
    """gamma = 1, lambda = 0.95, three tool tokens between A and B.
    OpenRLHF: A_B = 1 - 0.5 = 0.5; last tool token: delta = 0 + V'(B) - 0 = 0.5, A = 0.5 + 0.95*0.5
    = 0.975; the two before: delta = 0, A = 0.95*0.975 = 0.92625, then 0.8799375;
    A_A = (0 + 0 - 0.304) + 0.95*0.8799375 = -0.304 + 0.835940625 = 0.531940625 (0.532).
    Skipping the span (token_gae): A_A = (0.5 - 0.304) + 0.95*0.5 = 0.196 + 0.475 = 0.671.
    At lambda = 0: OpenRLHF A_A = 0 + V'(tool) - 0.304 = -0.304; skipping: 0.5 - 0.304 = +0.196."""
    inp = _span_row(0.95)
    raw = compute("openrlhf:gae", inp).value_targets - inp.values  # raw GAE on policy tokens
    assert raw[0, 0].item() == pytest.approx(0.531940625, abs=1e-12)
    assert compute("token_gae", inp).advantages[0, 0].item() == pytest.approx(0.671, abs=1e-12)
    inp0 = _span_row(0.0)
    raw0 = compute("openrlhf:gae", inp0).value_targets - inp0.values
    assert raw0[0, 0].item() == pytest.approx(-0.304, abs=1e-12)
    assert compute("token_gae", inp0).advantages[0, 0].item() == pytest.approx(0.196, abs=1e-12)
    # OpenRLHF's own function gives the same.
    maker = openrlhf_experience_maker().RemoteExperienceMaker.__new__(
        openrlhf_experience_maker().RemoteExperienceMaker
    )
    for lam, want in ((0.95, 0.531940625), (0.0, -0.304)):
        a, _ = maker.get_advantages_and_returns(inp.values, inp.rewards, inp.mask.bool(), 1.0, lam)
        assert a[0, 0].item() == pytest.approx(want, abs=1e-12)


def test_outcome_estimators_hand_computed():
    """One group of 4 rows with rewards 1, 0, 0.5, 0.5 (one policy token each, a tool token after
    it holding 0.25 of the first row's reward: it counts, so the row's reward is 1.25).
    mean = 2.25/4 = 0.5625; rloo: 1.25 - (2.25 - 1.25)/3 = 1.25 - 0.3333 = 0.916667;
    dr_grpo: 1.25 - 0.5625 = 0.6875; group_norm: std (n-1) = sqrt((0.6875^2 + 0.5625^2 + 2*0.0625^2)/3)
    = sqrt(0.796875/3) = 0.515388, so 0.6875/(0.515388 + 1e-9) = 1.333948."""
    mask = torch.tensor([[1, 0, 1], [1, 0, 1], [1, 0, 1], [1, 0, 1]])
    rewards = torch.tensor([[0.0, 0.25, 1.0], [0, 0, 0], [0, 0, 0.5], [0, 0, 0.5]], dtype=F64)
    inp = EstimatorInput(rewards=rewards, mask=mask, groups=torch.zeros(4, dtype=torch.long))
    a = {e: compute(f"openrlhf:{e}", inp).advantages[0, 0].item() for e in ("rloo", "dr_grpo", "group_norm")}
    assert a["rloo"] == pytest.approx(1.25 - 1.0 / 3, abs=1e-6)
    assert a["dr_grpo"] == pytest.approx(0.6875, abs=1e-7)
    assert a["group_norm"] == pytest.approx(0.6875 / (0.796875 / 3) ** 0.5, abs=1e-6)
