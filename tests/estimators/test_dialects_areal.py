"""The AReaL dialects (``areal:grpo``, ``areal:gae``) against AReaL 1.0.4's own code, as installed from
PyPI (``areal==1.0.4``, ``areal/trainer/ppo/actor.py`` ``PPOActor._compute_advantages`` and
``areal/utils/data.py`` ``Normalization``; imported by ``tests/estimators/areal_ref.py``).

Our rows are mapped onto AReaL's layout: the attention mask covers a row up to its last policy
token, the loss mask is our policy mask (AReaL rolls it by one itself), AReaL's values are in its
rolled coordinates (its ``values[:, t]`` is our value at ``t + 1``; the last column holds the
bootstrap of a row with no EOS, which fills the padded width), and AReaL's advantage for our token
``j`` is its column ``j - 1``. Tolerances: 1e-12 where AReaL computes in float64 (a float64 critic),
float32 rounding where it computes in float32 (no critic; both normalisations return float32).
"""

from __future__ import annotations

import math

import pytest
import torch

from estimators import EstimatorInput, compute, get
from estimators.dialects import areal as D
from tests.estimators import areal_ref

F64 = torch.float64


@pytest.fixture(scope="module")
def areal():
    try:
        return areal_ref.areal_modules()
    except ImportError as e:  # pragma: no cover - the Makefile installs areal
        pytest.skip(str(e))


def _batch(seed: int, B: int = 8, T: int = 12, full_row: int | None = None):
    """Random float64 rows: a prompt of 1-2 tokens, policy tokens with tool spans (holes), padding.
    ``full_row`` fills the whole width (AReaL's "no EOS" row)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        start = 1 + int(torch.randint(0, 2, (1,), generator=g))
        end = T if b == full_row else int(torch.randint(start + 2, T, (1,), generator=g))
        row = (torch.rand(end - start, generator=g) < 0.7).long()
        row[-1] = 1  # the row ends at its last policy token
        row[0] = 1
        mask[b, start:end] = row
    rewards = torch.randn(B, T, generator=g, dtype=F64) * (mask != 0)
    values = torch.randn(B, T, generator=g, dtype=F64)
    return rewards, mask, values


def _areal_layout(mask: torch.Tensor, values: torch.Tensor | None, last_value: torch.Tensor | None):
    """(loss_mask, attention_mask, rolled values) in AReaL's layout for our rows."""
    B, T = mask.shape
    idx = torch.arange(T).expand(B, T)
    ends = torch.where(mask != 0, idx, -1).amax(1) + 1
    attn = (idx < ends[:, None]).long()
    rolled = None
    if values is not None:
        rolled = torch.zeros(B, T, dtype=values.dtype)
        rolled[:, :-1] = values[:, 1:]
        if last_value is not None:
            rolled[:, -1] = torch.nan_to_num(last_value, nan=0.0)
    return mask.to(torch.float32), attn, rolled


def _theirs_on_our_tokens(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """AReaL's column j-1 is our token j; 0 off the policy mask."""
    ours = torch.zeros(adv.shape, dtype=adv.dtype)
    ours[:, 1:] = adv[:, :-1]
    return torch.where(mask != 0, ours, 0)


def test_registered_with_trainer_and_version():
    for name in ("areal:grpo", "areal:gae"):
        spec = get(name)
        assert (spec.trainer, spec.version) == ("areal", "1.0.4")
    assert get("areal:grpo").params["mean_level"] == "group"
    assert get("areal:gae").params["adv_norm"] is None


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95)])
@pytest.mark.parametrize("adv_norm", [None, "batch", "group"])
@pytest.mark.usefixtures("areal")
def test_grpo_matches_areal(gamma, lam, adv_norm):
    """No critic: float32 all the way, reward_norm group/group over contiguous groups of 4 (the
    second group all equal), adv_norm over tokens."""
    rewards, mask, _ = _batch(1)
    rewards[4:8] = 0.0
    rewards[4:8, :] = 0.0
    for b in range(4, 8):  # an all-equal group: every row scores 0.3
        last = int((mask[b] != 0).nonzero()[-1])
        rewards[b, last] = 0.3
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    inp = EstimatorInput(rewards=rewards, mask=mask, groups=groups, gamma=gamma, lam=lam)
    ours = compute("areal:grpo", inp, adv_norm=adv_norm).advantages

    lm, attn, _ = _areal_layout(mask, None, None)
    norm = {"mean_level": "group", "std_level": "group", "group_size": 4}
    out = areal_ref.compute_advantages(
        rewards=rewards.sum(-1),
        loss_mask=lm,
        attention_mask=attn,
        values=None,
        discount=gamma,
        gae_lambda=lam,
        reward_norm=norm,
        adv_norm=None
        if adv_norm is None
        else {"mean_level": adv_norm, "std_level": adv_norm, "group_size": 4},
    )
    assert out["advantages"].dtype == torch.float32
    theirs = _theirs_on_our_tokens(out["advantages"], mask).to(F64)
    torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=2e-6)
    if adv_norm is None:  # the all-equal group's reward_norm gives exactly 0
        assert torch.all(ours[4:8] == 0)


@pytest.mark.parametrize("no_eos_zero", [False, True])
@pytest.mark.usefixtures("areal")
def test_gae_matches_areal_in_float64(no_eos_zero):
    """A float64 critic: AReaL's recursion runs in float64 (its rewards are float32). Row 2 fills the
    padded width and has a bootstrap value: AReaL's no-EOS row."""
    rewards, mask, values = _batch(2, full_row=2)
    last_value = torch.full((8,), math.nan, dtype=F64)
    last_value[2] = 0.75
    inp = EstimatorInput(
        rewards=rewards, mask=mask, values=values, last_value=last_value, gamma=0.95, lam=0.9
    )
    out_ours = compute("areal:gae", inp, mask_no_eos_with_zero=no_eos_zero)
    lm, attn, rolled = _areal_layout(mask, values, last_value)
    out = areal_ref.compute_advantages(
        rewards=rewards.sum(-1),
        loss_mask=lm,
        attention_mask=attn,
        values=rolled,
        discount=0.95,
        gae_lambda=0.9,
        mask_no_eos_with_zero=no_eos_zero,
    )
    assert out["advantages"].dtype == F64
    theirs = _theirs_on_our_tokens(out["advantages"], mask)
    torch.testing.assert_close(out_ours.advantages, theirs, rtol=0, atol=1e-12)
    returns = _theirs_on_our_tokens(out["returns"], mask)
    assert out_ours.value_targets is not None
    torch.testing.assert_close(torch.where(mask != 0, out_ours.value_targets, 0), returns, rtol=0, atol=1e-12)
    # The no-EOS row bootstraps (or, masked, loses its reward); the others do not.
    assert bool(out_ours.extras["no_eos"][2]) and int(out_ours.extras["no_eos"].sum()) == 1


@pytest.mark.usefixtures("areal")
def test_gae_skips_tool_spans_and_values_there():
    """Carry-forward masking: values on tool tokens never reach an advantage (AReaL's own output
    is unchanged too), unlike a recursion that steps through the span."""
    rewards, mask, values = _batch(3)
    inp = EstimatorInput(rewards=rewards, mask=mask, values=values, gamma=1.0, lam=0.95)
    a = compute("areal:gae", inp).advantages
    poked = torch.where(mask == 0, values + 100.0, values)
    b = compute("areal:gae", EstimatorInput(rewards=rewards, mask=mask, values=poked, lam=0.95)).advantages
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    lm, attn, rolled = _areal_layout(mask, poked, None)
    out = areal_ref.compute_advantages(
        rewards=rewards.sum(-1),
        loss_mask=lm,
        attention_mask=attn,
        values=rolled,
        discount=1.0,
        gae_lambda=0.95,
    )
    torch.testing.assert_close(b, _theirs_on_our_tokens(out["advantages"], mask), rtol=0, atol=1e-12)


def test_reward_on_a_tool_token_counts():
    """AReaL's reward is one number per sequence: a reward uploaded on a tool token is part of it."""
    mask = torch.tensor([[0, 1, 1, 0, 0, 1], [0, 1, 1, 1, 1, 1]])
    rewards = torch.zeros(2, 6, dtype=F64)
    rewards[0, 3] = 1.0  # on a tool token
    rewards[1, 5] = 0.25
    inp = EstimatorInput(rewards=rewards, mask=mask, groups=[0, 0], gamma=1.0, lam=1.0)
    adv = compute("areal:grpo", inp, adv_norm=None).advantages
    # reward_norm over the 2 rows: mean 0.625, unbiased std |1 - 0.25| / sqrt(2) = 0.53033;
    # (1 - 0.625) / (0.53033 + 1e-5) = 0.70709, broadcast over row 0's policy tokens (gamma = lam = 1).
    expected = 0.375 / (0.75 / math.sqrt(2) + 1e-5)
    torch.testing.assert_close(adv[0, [1, 2, 5]], torch.full((3,), expected, dtype=F64), rtol=2e-6, atol=0)
    assert adv[0, 3] == 0 and adv[0, 4] == 0  # ours stay 0 off the policy mask


@pytest.mark.parametrize(
    "cfg",
    [
        {"mean_level": "batch", "std_level": "batch"},
        {"mean_level": "group", "std_level": "group"},
        {"mean_level": "group", "std_level": None},
        {"mean_level": None, "std_level": "group"},
        {"mean_level": "group", "std_level": "batch", "mean_leave1out": True},
        {"mean_level": "batch", "std_level": "group", "std_unbiased": False},
        {"mean_level": "group", "std_level": "group", "mean_leave1out": True, "group_size": 1},
        {"mean_level": "group", "std_level": "group", "group_size": 1},
    ],
)
@pytest.mark.parametrize("tokens", [False, True])
def test_normalize_matches_areal_normalization(areal, cfg, tokens):
    """``normalize`` is AReaL's ``Normalization`` for scores [B] (no mask) and token advantages
    [B, T] (loss mask): token-weighted means, per-token leave-one-out, std 1 for one element."""
    _, data, cli = areal
    cfg = {"group_size": 3, **cfg}
    rewards, mask, values = _batch(4, B=9)
    x = values.to(torch.float32) if tokens else rewards.sum(-1)
    m = mask.to(torch.float32) if tokens else None
    theirs = data.Normalization(cli.NormConfig(**cfg))(x, m)
    size = cfg["group_size"]
    inv = torch.arange(9) // size
    kw = {k: v for k, v in cfg.items() if k != "group_size"}
    ours = D.normalize(x, m, inv, int(inv.max()) + 1, **kw)
    assert ours.dtype == theirs.dtype == torch.float32
    if m is not None:
        theirs = theirs * (m != 0)
        ours = ours * (m != 0)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


def test_groups_need_not_be_contiguous():
    """AReaL slices contiguous groups; our labels may interleave: the same rows in another order
    get the same advantages."""
    rewards, mask, _ = _batch(5)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    perm = torch.tensor([4, 0, 5, 1, 6, 2, 7, 3])
    a = compute("areal:grpo", EstimatorInput(rewards=rewards, mask=mask, groups=groups)).advantages
    b = compute(
        "areal:grpo", EstimatorInput(rewards=rewards[perm], mask=mask[perm], groups=groups[perm])
    ).advantages
    torch.testing.assert_close(b, a[perm], rtol=1e-6, atol=1e-6)


def test_unknown_level_refused():
    rewards, mask, _ = _batch(6)
    with pytest.raises(ValueError, match="mean_level"):
        compute("areal:grpo", EstimatorInput(rewards=rewards, mask=mask), mean_level="row")


@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_empty_batch(shape):
    """No rows, or rows without tokens: empty advantages of the input's shape, no error."""
    inp = EstimatorInput(
        rewards=torch.zeros(shape, dtype=F64), mask=torch.zeros(shape), values=torch.zeros(shape)
    )
    for name in ("areal:grpo", "areal:gae"):
        assert compute(name, inp).advantages.shape == shape
