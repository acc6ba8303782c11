"""TRL: log every generation step of a ``GRPOTrainer`` (tested with trl 1.16.0, transformers 5.10).

    from creditlens.adapters.trl import track
    trainer = GRPOTrainer(model=..., reward_funcs=..., args=..., train_dataset=...)
    track(trainer, run)
    trainer.train()

TRL's callbacks never see the batch tensors, so :func:`track` wraps two methods on this one
trainer instance (the class is untouched):

* ``_calculate_rewards`` returns the per-function rewards ``[B, n_funcs]`` (gathered over
  processes); the wrapper keeps them, and the sequence reward is their weighted ``nansum`` with
  ``reward_weights``, as TRL computes it;
* ``_generate_and_score_completions`` returns ``prompt_ids``/``prompt_mask`` (left-padded),
  ``completion_ids``/``completion_mask`` (right-padded), per-sequence ``advantages`` [B], and when
  computed ``old_per_token_logps``, ``ref_per_token_logps``, ``sampling_per_token_logps`` and
  ``tool_mask`` (1 = model token, 0 = tool output). The wrapper logs them as one step:
  ``trainer.state.global_step`` at generation time.

Prompt tokens are prompt, completion tokens policy (tool where ``tool_mask`` is 0), padding is
dropped. The sequence advantage is sent on every policy token (0 elsewhere), the reward as the
outcome reward, and rows ``i`` share group ``i // num_generations`` (TRL repeats each prompt
``num_generations`` times in a row). With several processes, the main process logs its share.
Evaluation batches are not logged.
"""

from __future__ import annotations

from typing import Any

from creditlens.keys import TRL, first_key

__all__ = ["track"]


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    """The JSON-safe settings of a config dict (numbers, text, booleans, None, lists of those)."""
    ok = (str, int, float, bool, type(None))
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, ok) and not (isinstance(v, float) and v != v):
            out[k] = v
        elif isinstance(v, list | tuple) and all(isinstance(x, ok) for x in v):
            out[k] = list(v)
    return out


def track(trainer: Any, run: Any, tokenizer: Any = None) -> Any:
    """Wrap ``trainer`` (a TRL ``GRPOTrainer``) so each generation step is logged to ``run``;
    returns the trainer. ``tokenizer`` defaults to the trainer's own. The run's steps say they are
    TRL's (``run.trainer``), and the run's configuration gets the trainer's ``GRPOConfig``
    (``loss_type``, ``scale_rewards``, ...), which the server reads for TRL's estimator and loss."""
    import torch

    # The run is TRL's, and its GRPOConfig says how TRL computed the advantages and the loss
    # (loss_type, scale_rewards, num_generations, ...): sent once, as JSON-safe values.
    if getattr(run, "trainer", None) is None:
        run.trainer = "trl"
    args: Any = getattr(trainer, "args", None)
    if hasattr(args, "to_dict") and hasattr(run, "update_config"):
        run.update_config(_plain(args.to_dict()), trainer=run.trainer)

    state: dict[str, Any] = {"rewards_per_func": None}
    tok = (
        tokenizer
        if tokenizer is not None
        else getattr(trainer, "_tokenizer", None) or trainer.processing_class
    )
    calculate_rewards = trainer._calculate_rewards
    generate_and_score = trainer._generate_and_score_completions

    def _calculate_rewards(*args: Any, **kwargs: Any) -> Any:
        out = calculate_rewards(*args, **kwargs)
        state["rewards_per_func"] = out
        return out

    def _generate_and_score_completions(*args: Any, **kwargs: Any) -> Any:
        state["rewards_per_func"] = None
        out = generate_and_score(*args, **kwargs)
        try:
            if trainer.model.training and trainer.accelerator.is_main_process:
                _log(trainer, run, out, state["rewards_per_func"], tok, torch)
        except Exception as e:  # noqa: BLE001 - never break training; the run counts and warns
            run._bad_argument(ValueError(f"creditlens TRL adapter: {e!r}"))
        return out

    trainer._calculate_rewards = _calculate_rewards
    trainer._generate_and_score_completions = _generate_and_score_completions
    return trainer


def _get(out: dict[str, Any], field: str) -> Any:
    """The tensor of ``field`` (a name of creditlens.keys.TRL) in TRL's batch, or None."""
    key = first_key(TRL, field, out)
    return None if key is None else out[key]


def _log(trainer: Any, run: Any, out: dict[str, Any], rewards_per_func: Any, tok: Any, torch: Any) -> None:
    prompt_ids, prompt_mask = _get(out, "prompt_ids"), _get(out, "prompt_mask")
    completion_ids, completion_mask = _get(out, "completion_ids"), _get(out, "completion_mask")
    B, P = prompt_ids.shape
    C = completion_ids.shape[1]
    policy = completion_mask.bool()
    tool_mask = _get(out, "tool_mask")
    # Codes of creditlens.wire: 0 prompt, 1 policy, 2 tool, 255 padding.
    comp_kinds = torch.full((B, C), 255, dtype=torch.uint8, device=completion_ids.device)
    comp_kinds[policy] = 1
    if tool_mask is not None:
        comp_kinds[policy & ~tool_mask.bool()] = 2
    prompt_kinds = torch.where(prompt_mask.bool(), 0, 255).to(torch.uint8)
    kinds = torch.cat([prompt_kinds, comp_kinds], dim=1)
    token_ids = torch.cat([prompt_ids, completion_ids], dim=1)

    def per_token(t: Any) -> Any:
        return None if t is None else torch.cat([t.new_zeros((B, P)), t.detach().float()], dim=1)

    rollout = _get(out, "rollout_logprobs")
    if rollout is not None and torch.isnan(rollout[policy]).any():
        rollout = None  # vLLM could not score some token: no rollout log-probs rather than a refused step
    adv = _get(out, "advantages").detach().float()
    advantages = torch.cat([adv.new_zeros((B, P)), (comp_kinds == 1).float() * adv.unsqueeze(1)], dim=1)
    reward = None
    offset = trainer.accelerator.process_index * B
    if rewards_per_func is not None:
        w = trainer.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        reward = (rewards_per_func * w).nansum(dim=1)[offset : offset + B]
        reward = torch.nan_to_num(reward, nan=0.0)  # an unscorable completion (every func None)
    G = trainer.num_generations
    groups = torch.div(torch.arange(offset, offset + B), G, rounding_mode="floor")
    run.log_tensors(
        int(trainer.state.global_step),
        token_ids=token_ids,
        kinds=kinds,
        reward=reward,
        advantages=advantages,
        logprobs=per_token(_get(out, "logprobs")),
        ref_logprobs=per_token(_get(out, "ref_logprobs")),
        rollout_logprobs=per_token(rollout),
        groups=groups,
        tokenizer=tok,
    )
