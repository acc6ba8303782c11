"""``estimators.loss_weights(loss="trl:<loss_type>")`` against TRL 1.16.0's own loss: for every
``loss_type`` and ``importance_sampling_level``, a real ``GRPOTrainer`` (a 1-layer random Llama, a
byte-level tokenizer trained here, CPU, nothing downloaded) runs its ``_compute_loss`` on a batch
of completions with tool spans (``tool_mask``), right padding and per-token advantages; ``-d loss
/ d per_token_logps`` from ``backward()`` (the log-probs the model itself computed, read through
TRL's own ``_get_per_token_logps_and_entropies``, in float64) must equal our closed form to
1e-12. ``old_per_token_logps`` are the model's log-probs plus noise, so clipping bites."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch

import estimators as E
from estimators.losses import TokenState

trl = pytest.importorskip("trl")
F64 = torch.float64
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
B, P, T = 6, 3, 12  # rows, prompt tokens, completion tokens


@cache
def trainer(loss_type: str, level: str, **config: Any) -> Any:
    """A GRPOTrainer built by TRL from a GRPOConfig (its own checks and defaults)."""
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    from tests.client.trainers import byte_level_tokenizer, tiny_llama

    hf_tok, model = tiny_llama(
        byte_level_tokenizer(["call the tool: search(x) and read what it says\n"] * 20, vocab_size=280)
    )
    args = GRPOConfig(
        output_dir="/tmp/creditlens-trl-loss",  # nothing is written: no training step runs
        use_cpu=True,
        bf16=False,
        report_to="none",
        num_generations=2,
        max_completion_length=T,
        per_device_train_batch_size=2,
        save_strategy="no",
        loss_type=loss_type,
        importance_sampling_level=level,
        **config,
    )
    t = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": ["call the tool"] * 4}),
        processing_class=hf_tok,
    )
    t.model.train()
    t.current_gradient_accumulation_steps = 1  # the Trainer sets it per step: one step, no accumulation
    return t


def batch(seed: int) -> dict[str, torch.Tensor]:
    """Completions of varying length (right padding), two tool spans each, per-token advantages."""
    g = torch.Generator().manual_seed(seed)
    completion_mask = torch.zeros(B, T, dtype=torch.long)
    tool_mask = torch.ones(B, T, dtype=torch.long)
    for b in range(B):
        L = int(torch.randint(4, T + 1, (1,), generator=g))
        completion_mask[b, :L] = 1
        for _ in range(2):
            s = int(torch.randint(1, L, (1,), generator=g))
            tool_mask[b, s : s + int(torch.randint(1, 3, (1,), generator=g))] = 0
    tool_mask[B - 1, :] = 0  # a row whose completion is all tool output: no loss tokens
    adv = torch.randn(B, T, generator=g, dtype=F64)
    adv[0] = 0.7  # outcome-style rows
    adv[1] = -1.1
    return {
        "prompt_ids": torch.randint(2, 200, (B, P), generator=g),
        "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": torch.randint(2, 200, (B, T), generator=g),
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": adv,
        "noise": torch.randn(B, T, generator=g, dtype=F64),
    }


def trl_weights(t: Any, x: dict[str, torch.Tensor], spread: float) -> tuple[torch.Tensor, ...]:
    """(-dL/d per_token_logps, per_token_logps, old_per_token_logps, loss mask) of TRL's own loss.

    ``_get_per_token_logps_and_entropies`` is TRL's own, called as TRL calls it; we only keep a
    handle on the log-probs it returns (``retain_grad``) to read their gradient."""
    own = type(t)._get_per_token_logps_and_entropies
    seen: list[torch.Tensor] = []

    def keep(self: Any, *args: Any, **kwargs: Any) -> Any:
        logps, *rest = own(self, *args, **kwargs)
        # TRL's fused LM head gives float32 log-probs whatever the model's dtype; the loss then runs
        # in float64 on their float64 copy (old_per_token_logps are float64), so its gradient with
        # respect to that copy is exact to float64.
        logps = logps.to(F64)
        if logps.requires_grad:
            logps.retain_grad()
        seen.append(logps)
        return (logps, *rest)

    t._get_per_token_logps_and_entropies = keep.__get__(t)
    try:
        inputs = {k: v for k, v in x.items() if k != "noise"}
        with torch.no_grad():  # the model's log-probs, to set old ones near them
            inputs["old_per_token_logps"] = torch.zeros(B, T, dtype=F64)
            inputs["num_items_in_batch"] = (x["completion_mask"] * x["tool_mask"]).sum().to(F64)
            t._compute_loss(t.model, inputs)
        lp0 = seen.pop().detach()
        inputs["old_per_token_logps"] = lp0 + spread * x["noise"]
        t.model.zero_grad()
        loss = t._compute_loss(t.model, inputs)
        loss.backward()
        lp = seen.pop()
        assert lp.dtype == F64
        return -lp.grad, lp.detach(), inputs["old_per_token_logps"], x["completion_mask"] * x["tool_mask"]
    finally:
        del t._get_per_token_logps_and_entropies


def ours(loss_type, level, lp, old, mask, adv, **params):
    return E.loss_weights_and_states(
        adv, lp, old, mask, loss=f"trl:{loss_type}", importance_sampling_level=level, **params
    )


@pytest.mark.slow
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_against_grpo_trainer(loss_type, level):
    t = trainer(loss_type, level)
    for seed, spread in ((0, 0.3), (1, 0.05)):
        x = batch(seed)
        theirs, lp, old, mask = trl_weights(t, x, spread)
        # The trainer's max_completion_length is T (Dr. GRPO's constant; TRL's default is 512).
        extra = {"max_completion_length": T} if loss_type == "dr_grpo" else {}
        w, states = ours(loss_type, level, lp, old, mask, x["advantages"], **extra)
        torch.testing.assert_close(w, theirs, rtol=1e-12, atol=1e-12)
        assert w[mask == 0].abs().max() == 0 and w[B - 1].abs().max() == 0
        assert theirs.abs().max() > 0
        if loss_type in ("grpo", "dapo", "bnpo", "dr_grpo", "luspo") and seed == 0 and level == "token":
            clipped = (states & (TokenState.CLIPPED_HIGH | TokenState.CLIPPED_LOW)) != 0
            assert clipped.any() and theirs[clipped].abs().max() == 0  # clipping bites, and gives 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss_type,config",
    [
        ("dapo", {"epsilon": 0.1, "epsilon_high": 0.28, "delta": 1.5}),  # asymmetric and two-sided clip
        ("grpo", {"delta": 1.25, "epsilon_high": 0.3}),  # delta below 1 + epsilon_high: its own branch
        ("cispo", {"epsilon_high": 1.1}),  # ScaleRL's epsilon_max: ratios above 1.1 are capped
        ("dr_grpo", {"max_completion_length": 40}),
        ("sapo", {"sapo_temperature_pos": 2.0, "sapo_temperature_neg": 0.5}),
        ("vespo", {"vespo_k_pos": 1.5, "vespo_lambda_pos": 2.0, "vespo_k_neg": 2.5, "vespo_lambda_neg": 1.0}),
    ],
)
def test_settings(loss_type, config):
    # The trainer's config keys are our parameter names; max_completion_length also sets T in TRL.
    t = trainer(loss_type, "token", **{k: v for k, v in config.items() if k != "max_completion_length"})
    if "max_completion_length" in config:
        t.max_completion_length = config["max_completion_length"]  # Dr. GRPO's constant only
    x = batch(2)
    theirs, lp, old, mask = trl_weights(t, x, 0.4)
    w, states = ours(loss_type, "token", lp, old, mask, x["advantages"], **config)
    torch.testing.assert_close(w, theirs, rtol=1e-12, atol=1e-12)
    if "delta" in config and config["delta"] > 1.3:
        dual = (states & TokenState.DUAL_CLIPPED) != 0
        assert dual.any() and theirs[dual].abs().max() == 0


def test_by_hand():
    """One row of 4 loss tokens, A = (1, 1, -1, -1), ratios (1, 1.5, 1.5, 0.5), clip 0.2:
    dapo's token mean gives A r / 4 where unclipped: (0.25, 0 (A > 0, r > 1.2), -0.375, 0 (A < 0,
    r < 0.8)); grpo the same here (one row: 1 / (B L) = 1 / 4); dr_grpo 1 / (1 x 512)."""
    r = torch.tensor([[1.0, 1.5, 1.5, 0.5]], dtype=F64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=F64)
    old = torch.full_like(r, -1.0)
    lp, mask = old + torch.log(r), torch.ones_like(r)
    expected = torch.tensor([[0.25, 0.0, -0.375, 0.0]], dtype=F64)
    for name in ("trl:dapo", "trl:grpo", "trl:bnpo"):
        torch.testing.assert_close(E.loss_weights(adv, lp, old, mask, loss=name), expected)
    torch.testing.assert_close(E.loss_weights(adv, lp, old, mask, loss="trl:dr_grpo"), expected * 4 / 512)
    # cispo with TRL's default epsilon_high (= epsilon = 0.2): every ratio weight is capped at 0.2.
    w = E.loss_weights(adv, lp, old, mask, loss="trl:cispo")
    torch.testing.assert_close(w, adv * 0.2 / 4)


def test_unknown_parameter_lists_the_known_ones():
    z = torch.zeros(1, 3, dtype=F64)
    with pytest.raises(TypeError, match="takes no parameter.*agg.*importance_sampling_level"):
        E.loss_weights(z, z, z, z + 1, loss="trl:dapo", agg="token-mean")
    with pytest.raises(ValueError, match="unknown importance_sampling_level"):
        E.loss_weights(z, z, z, z + 1, loss="trl:grpo", importance_sampling_level="row")
