"""What an estimator reads is declared at ``register`` (``reads``, ``may_read``) and holds.

1. Honest declarations: on a batch where every input is given (turn ids that split a run of policy
   tokens, so that reading them shows), each registered estimator gives the same output when every
   input it does not declare is taken away (set to None).
2. ``compute`` refuses an input without a declared read, naming it; ``register`` refuses unknown
   input names.
3. Per-episode summaries: an outcome estimator that reads only scores/groups/lengths gives on [B, 1]
   rows of scores with ``lengths`` the numbers it gives on the padded [B, T] batch.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from estimators import EstimatorInput, EstimatorOutput, available, compute, register
from estimators import token as TK
from estimators.registry import INPUTS, SUMMARY_INPUTS, unregister

B, T = 6, 12


def full_batch() -> EstimatorInput:
    """Every EstimatorInput field given: prompt, two policy runs around a tool span per row."""
    g = torch.Generator().manual_seed(7)
    mask = torch.zeros(B, T)
    for b in range(B):
        mask[b, 2 : 5 + b % 3] = 1  # first run
        mask[b, 7 : 9 + b % 2] = 1  # second run, after a tool span
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64) * mask
    # Turn ids splitting the first run in two: an estimator reading them gives other numbers.
    turn_ids = torch.zeros(B, T, dtype=torch.long)
    turn_ids[:, 3:] = 1
    turn_ids[:, 6:] = 2
    K = int(TK.turn_spans(mask, turn_ids).max()) + 1
    return EstimatorInput(
        rewards=rewards,
        mask=mask,
        values=torch.randn(B, T, generator=g, dtype=torch.float64),
        groups=torch.tensor([0, 0, 0, 1, 1, 1]),
        turn_ids=turn_ids,
        last_value=torch.tensor(
            [0.5, float("nan"), 0.2, float("nan"), 1.0, float("nan")], dtype=torch.float64
        ),
        gamma=0.9,
        lam=0.8,
        logprobs=-torch.rand(B, T, generator=g, dtype=torch.float64),
        sum_pi_squared=torch.rand(B, T, generator=g, dtype=torch.float64),
        reward_baselines=torch.randn(B, generator=g, dtype=torch.float64),
        turn_states=torch.randint(0, 2, (B, K), generator=g),
        turn_values=torch.randn(B, K, generator=g, dtype=torch.float64),
        lengths=(mask != 0).sum(1),
    )


FIELDS = [f.name for f in dataclasses.fields(EstimatorInput) if f.name in INPUTS]


@pytest.mark.parametrize("name", list(available()))
def test_an_estimator_reads_nothing_it_does_not_declare(name):
    spec = available()[name]
    full = full_batch()
    declared = {*spec.reads, *spec.may_read}
    bare = dataclasses.replace(full, **{f: None for f in FIELDS if f not in declared and f != "rewards"})
    want = compute(name, full).advantages
    got = compute(name, bare).advantages
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_compute_refuses_a_missing_declared_input_naming_it():
    inp = dataclasses.replace(full_batch(), values=None)
    with pytest.raises(ValueError, match="token_gae.*reads values"):
        compute("token_gae", inp)
    with pytest.raises(ValueError, match="logprobs"):
        compute("optimal_token_baseline", dataclasses.replace(full_batch(), logprobs=None))


def test_register_refuses_an_unknown_input():
    with pytest.raises(ValueError, match="critic_values"):
        register("test_unknown_input", label="x", description="x", kind="token", reads=("critic_values",))
    assert "test_unknown_input" not in available()


def test_a_registered_estimator_is_called_only_with_what_it_reads():
    seen = []

    def fn(inp: EstimatorInput) -> EstimatorOutput:
        seen.append(inp.values)
        return EstimatorOutput(advantages=torch.where(inp.mask != 0, inp.values + 1, 0))

    register("test_reads_values", label="v + 1", description="values + 1", kind="token", reads=("values",))(
        fn
    )
    try:
        assert available()["test_reads_values"].needs_values
        with pytest.raises(ValueError, match="reads values"):
            compute("test_reads_values", dataclasses.replace(full_batch(), values=None))
        assert seen == []  # refused before the call
        out = compute("test_reads_values", full_batch()).advantages
        assert bool((out[full_batch().mask != 0] != 0).all())
    finally:
        unregister("test_reads_values")
    assert "test_reads_values" not in available()


@pytest.mark.parametrize("name", [n for n, s in available().items() if s.from_summaries])
def test_summary_rows_give_the_padded_batch_numbers(name):
    full = full_batch()
    assert set(available()[name].reads) <= SUMMARY_INPUTS
    padded = dataclasses.replace(full, lengths=None)
    want = compute(name, padded).advantages
    s = full.scores[:, None]
    rows = EstimatorInput(rewards=s, mask=torch.ones_like(s), groups=full.groups, lengths=full.lengths)
    got = compute(name, rows).advantages[:, 0]
    m = full.mask != 0
    torch.testing.assert_close(got[:, None].expand(B, T)[m], want[m], rtol=1e-12, atol=1e-12)
