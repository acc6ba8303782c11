"""The ``verl:*`` dialects against verl 0.9.1's own functions (``verl.trainer.ppo.core_algos``,
installed with --no-deps), called as its trainer calls them: uuid-string group labels, the int64
``response_mask`` (our policy mask), default arguments where the trainer passes none. Batches with
tool spans, an all-equal group, a group of one, truncated rows and rewards on tool tokens. verl
computes in the rewards' dtype (float64 here, compared to 1e-12) except where it casts to float32
itself, which the dialects do too. Plus hand-computed cases (rloo's 0.7 against
rloo_vectorized's 0)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from estimators import EstimatorInput, available, compute
from tests.estimators.trainer_refs import F64, agent_rows, close, truncated_last_value

pytestmark = pytest.mark.verl

NAMES = (
    "gae, grpo, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, rloo, opo, grpo_passk, gpg, "
    "rloo_vectorized, grpo_vectorized, optimal_token_baseline, tir_optimal_token_baseline, gdpo"
).split(", ")


@pytest.fixture(scope="module")
def verl():
    return pytest.importorskip("verl.trainer.ppo.core_algos")


def _uids(groups: torch.Tensor) -> np.ndarray:
    return np.array([f"uid-{int(g)}" for g in groups], dtype=object)


def _config(**kw):
    from omegaconf import OmegaConf

    return OmegaConf.create({"gamma": 1.0, "norm_adv_by_std_in_grpo": True, **kw})


def batch(seed: int, singleton: bool = False, dtype=F64):
    """agent_rows plus logprobs; ``singleton``: row 0 alone in its group."""
    rewards, values, mask, groups = agent_rows(seed=seed, dtype=dtype)
    if singleton:
        groups = groups.clone()
        groups[0] = 99
    g = torch.Generator().manual_seed(seed + 7)
    logp = -torch.rand(rewards.shape, generator=g, dtype=F64) * 3
    spp = torch.exp(2 * logp) + torch.rand(rewards.shape, generator=g, dtype=F64) * 0.2
    inp = EstimatorInput(
        rewards=rewards,
        mask=mask,
        values=values,
        groups=groups,
        logprobs=logp,
        sum_pi_squared=spp,
        last_value=truncated_last_value(mask.shape[0]),
    )
    return inp


def test_every_name_of_verls_registry_is_a_dialect(verl):
    assert set(verl.ADV_ESTIMATOR_REGISTRY) >= set(NAMES)
    ours = {n for n, s in available().items() if s.trainer == "verl"}
    assert ours == {f"verl:{x}" for x in NAMES}
    assert all(available()[f"verl:{x}"].version == "0.9.1" for x in NAMES)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae(verl, seed, gamma, lam):
    inp = batch(seed)
    a, ret = verl.compute_gae_advantage_return(inp.rewards, inp.values, inp.mask, gamma, lam)
    inp.gamma, inp.lam = gamma, lam
    ours = compute("verl:gae", inp)
    close(ours.advantages, a, inp.mask)
    close(ours.value_targets, ret, inp.mask)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus(verl, seed, gamma):
    inp = batch(seed)
    inp.gamma = gamma
    a, ret = verl.compute_reinforce_plus_plus_outcome_advantage(
        inp.rewards, inp.mask, config=_config(gamma=gamma)
    )
    ours = compute("verl:reinforce_plus_plus", inp)
    close(ours.advantages, a, inp.mask)
    close(ours.value_targets, ret, inp.mask)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("singleton", [False, True])
def test_outcome_estimators(verl, seed, singleton):
    inp = batch(seed, singleton)
    r, m, uid = inp.rewards, inp.mask, _uids(inp.groups)
    cases = {
        "grpo": verl.compute_grpo_outcome_advantage(r, m, uid)[0],
        "rloo": verl.compute_rloo_outcome_advantage(r, m, uid)[0],
        "rloo_vectorized": verl.compute_rloo_vectorized_outcome_advantage(r, m, uid)[0],
        "grpo_vectorized": verl.compute_grpo_vectorized_outcome_advantage(r, m, uid)[0],
        "reinforce_plus_plus_baseline": verl.compute_reinforce_plus_plus_baseline_outcome_advantage(
            r, m, uid
        )[0],
        "opo": verl.compute_opo_outcome_advantage(r, m, uid)[0],
        "gpg": verl.compute_gpg_outcome_advantage(r, m, uid)[0],
        "gdpo": verl.compute_gdpo_outcome_advantage(r, m, uid)[0],
    }
    for name, theirs in cases.items():
        ours = compute(f"verl:{name}", inp).advantages
        close(ours, theirs, m)
        assert ours[m == 0].abs().max().item() == 0.0, name
    v, _ = verl.compute_grpo_outcome_advantage(r, m, uid, norm_adv_by_std_in_grpo=False)
    close(compute("verl:grpo", inp, norm_adv_by_std_in_grpo=False).advantages, v, m)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk(verl, norm):
    inp = batch(0)
    v, _ = verl.compute_grpo_passk_outcome_advantage(
        inp.rewards, inp.mask, _uids(inp.groups), config=_config(norm_adv_by_std_in_grpo=norm)
    )
    close(compute("verl:grpo_passk", inp, norm_adv_by_std_in_grpo=norm).advantages, v, inp.mask)
    with pytest.raises(ValueError):
        compute("verl:grpo_passk", batch(0, singleton=True))


def test_remax_and_optimal_token_baselines(verl):
    inp = batch(1)
    b = torch.randn(inp.rewards.shape[0], generator=torch.Generator().manual_seed(3), dtype=F64)
    a, _ = verl.compute_remax_outcome_advantage(inp.rewards, b, inp.mask)
    inp.reward_baselines = b
    close(compute("verl:remax", inp).advantages, a, inp.mask)
    uid = _uids(inp.groups)
    for name, fn in (
        ("optimal_token_baseline", verl.compute_optimal_token_baseline_advantage),
        ("tir_optimal_token_baseline", verl.compute_multi_turn_optimal_token_baseline_advantage),
    ):
        a, _ = fn(inp.rewards, inp.mask, uid, inp.logprobs, inp.sum_pi_squared)
        close(compute(f"verl:{name}", inp).advantages, a, inp.mask)


def test_float32_batches(verl):
    inp = batch(2, dtype=torch.float32)
    r, m, uid = inp.rewards, inp.mask, _uids(inp.groups)
    for name, fn in (
        ("grpo", verl.compute_grpo_outcome_advantage),
        ("grpo_vectorized", verl.compute_grpo_vectorized_outcome_advantage),
        ("rloo_vectorized", verl.compute_rloo_vectorized_outcome_advantage),
    ):
        ours = compute(f"verl:{name}", inp).advantages
        assert ours.dtype == torch.float32
        close(ours, fn(r, m, uid)[0], m, atol=1e-6)


def test_grpo_vectorized_float32_statistics_on_an_all_equal_float64_group(verl):
    """Scores 0.1 + 0.2 (= 0.30000000000000004 in float64) three times: verl's grpo (float64) gives 0;
    grpo_vectorized averages them in float32, so s - mean is the float64-float32 gap (~1.2e-8) over
    a std of 0 + 1e-6: ~0.012, not 0. The dialects give each what verl gives."""
    rewards = torch.zeros(3, 2, dtype=F64)
    rewards[:, 0], rewards[:, 1] = 0.1, 0.2
    mask = torch.ones(3, 2, dtype=torch.long)
    inp = EstimatorInput(rewards=rewards, mask=mask, groups=torch.zeros(3, dtype=torch.long))
    uid = _uids(inp.groups)
    v, _ = verl.compute_grpo_vectorized_outcome_advantage(rewards, mask, uid)
    ours = compute("verl:grpo_vectorized", inp).advantages
    close(ours, v)
    assert abs(ours[0, 0].item()) > 1e-3
    assert compute("verl:grpo", inp).advantages.abs().max().item() == 0.0


def test_rloo_keeps_a_singletons_score_rloo_vectorized_gives_it_zero(verl):
    """Rows 0-1 a group (scores 1 and 0: rloo 1 - 0 = 1 and -1), row 2 alone with score 0.7:
    rloo -> 0.7, rloo_vectorized -> (1 * 0.7 - 0.7) / max(0, 1) * [c > 1] = 0."""
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 1, 1], [1, 1, 1, 0]])
    rewards = torch.zeros(3, 4, dtype=F64)
    rewards[0, 3], rewards[2, 2] = 1.0, 0.7
    inp = EstimatorInput(rewards=rewards, mask=mask, groups=torch.tensor([0, 0, 1]))
    a = compute("verl:rloo", inp).advantages
    b = compute("verl:rloo_vectorized", inp).advantages
    assert a[2, 0].item() == pytest.approx(0.7) and b[2].abs().max().item() == 0.0
    assert a[0, 0].item() == pytest.approx(1.0) and a[1, 0].item() == pytest.approx(-1.0)
    uid = _uids(inp.groups)
    close(a, verl.compute_rloo_outcome_advantage(rewards, mask, uid)[0], mask)
    close(b, verl.compute_rloo_vectorized_outcome_advantage(rewards, mask, uid)[0], mask)


def test_a_reward_on_a_masked_position_counts_for_grpo_not_for_gae(verl):
    """A reward of 0.5 moved onto a tool token: verl's GAE and REINFORCE++ give bit-identical
    output with and without it; its GRPO and RLOO sum the whole row and count it."""
    inp = batch(0)
    tool = ((inp.mask[0] == 0) & (torch.arange(inp.mask.shape[1]) < 10)).nonzero()[0].item()
    stray = inp.rewards.clone()
    stray[0, tool] += 0.5
    with_stray = EstimatorInput(
        rewards=stray, mask=inp.mask, values=inp.values, groups=inp.groups, gamma=0.99, lam=0.95
    )
    inp.gamma, inp.lam = 0.99, 0.95
    for name in ("verl:gae", "verl:reinforce_plus_plus"):
        assert torch.equal(compute(name, inp).advantages, compute(name, with_stray).advantages)
    for name in ("verl:grpo", "verl:rloo"):
        assert not torch.equal(compute(name, inp).advantages, compute(name, with_stray).advantages)
    uid = _uids(inp.groups)
    close(
        compute("verl:grpo", with_stray).advantages,
        verl.compute_grpo_outcome_advantage(stray, inp.mask, uid)[0],
        inp.mask,
    )
    a, _ = verl.compute_gae_advantage_return(stray, inp.values, inp.mask, 0.99, 0.95)
    close(compute("verl:gae", with_stray).advantages, a, inp.mask)
